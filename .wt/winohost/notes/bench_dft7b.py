"""Helper dft7b (notes/dft7b.md): big_7x7_s1 and big_11x11_s1 at batch 32, "dft" against
cuDNN (PyTorch, benchmark mode, TF32 off): the shipped flags in three directions, then
forward / backward data under each setting of the W-axis row kernels (CONFIGS; "dft7":
dft_rows_forward one image row a block, matrix staged, dft_rows_inverse 32 b a block),
measured in turn with cuDNN ROUNDS times (median of the rounds; errors are in the shipped
rows); stage profiles (CUDA events around each launch).  Reuses notes/bench_wino5.py (median of
CUDA-event-timed public calls, inputs rotated past L2) and notes/bench_large2.py.
The short table is printed last (and written to --table).

    PYTHONPATH=$PWD python notes/bench_dft7b.py [--repeat N] [--json PATH] [--table PATH] [--shipped-only]
"""
import argparse
import json
import os
import sys
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_large2 as L2  # noqa: E402
import bench_wino5 as W5  # noqa: E402

from dnnprims.algos import dft  # noqa: E402
from dnnprims.bench.__main__ import Backend  # noqa: E402

PROBLEMS = {"big_7x7_s1": dict(N=32, C=64, H=56, K=64, R=7, pad=3),
            "big_11x11_s1": dict(N=32, C=32, H=64, K=32, R=11, pad=5)}
# (label, ROWS_FORWARD, ROWS_FORWARD_L1, INVERSE_B64); "dft7" is the session before.
CONFIGS = [("dft7 rows kernels", 1, False, False), ("R1 staged + inv64", 1, False, True),
           ("R1 L1 + inv64", 1, True, True), ("R2 L1 + inv64", 2, True, True)]
ROUNDS = 3   # configs measured in turn, cuDNN among them, ROUNDS times: median of the rounds


def with_config(cfg, fn):
    saved = dft.ROWS_FORWARD, dft.ROWS_FORWARD_L1, dft.INVERSE_B64
    dft.ROWS_FORWARD, dft.ROWS_FORWARD_L1, dft.INVERSE_B64 = cfg
    try:
        return fn()
    finally:
        dft.ROWS_FORWARD, dft.ROWS_FORWARD_L1, dft.INVERSE_B64 = saved


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--table", default=None)
    ap.add_argument("--shipped-only", action="store_true")
    args = ap.parse_args(argv)
    be = Backend()
    shipped = (dft.ROWS_FORWARD, dft.ROWS_FORWARD_L1, dft.INVERSE_B64)
    print(be.describe(), "| shipped: ROWS_FORWARD, _L1, INVERSE_B64 =", shipped,
          "FUSED_FILTER_MIN_TAPS", dft.FUSED_FILTER_MIN_TAPS, flush=True)
    rows, profiles = [], []
    for name, spec in PROBLEMS.items():
        p = W5._problem(spec)
        try:
            inp = W5.compare(be, p, name, W5.DIRECTIONS, lambda d: ["dft"], args.repeat, rows)   # shipped flags
            for direction in ([] if args.shipped_only else ("forward", "backward_data")):
                ops = lambda x, w, dy: W5._conv_operands(direction, x, w, dy)
                ours = lambda x, w, dy: W5._conv_call(direction, p, *ops(x, w, dy), "dft")
                theirs = lambda x, w, dy: W5._torch_conv_call(be.torch, direction, p, *ops(x, w, dy))
                times = {}
                for _ in range(ROUNDS):
                    times.setdefault("cudnn", []).append(be.measure(theirs, inp.t_sets, args.repeat))
                    for label, *cfg in CONFIGS:
                        ms = with_config(tuple(cfg), lambda: be.measure(ours, inp.sets, args.repeat))
                        times.setdefault(label, []).append(ms)
                cud = float(np.median(times["cudnn"]))
                for label, *cfg in CONFIGS:
                    ms = float(np.median(times[label]))
                    rows.append({"problem": name, "direction": direction, "config": label, "rounds": times[label],
                                 "ms": {"cudnn": cud, "dft": ms}, "err": {"cudnn": float("nan"),
                                                                          "dft": float("nan")}})
                    print(json.dumps(rows[-1]), flush=True)
            todo = [("shipped", shipped)] + ([] if args.shipped_only else [("dft7 rows kernels", CONFIGS[0][1:])])
            for label, cfg in todo:
                try:
                    prof = with_config(tuple(cfg), lambda: L2.dft_profile(be, p, inp, "forward"))
                    profiles.append((f"{name} forward [{label}]", prof))
                except Exception:
                    traceback.print_exc()
            inp = None
        except Exception:
            traceback.print_exc()
        be.free()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": be.describe(), "rows": rows,
                       "profiles": [{"what": w, "stages": s} for w, s in profiles]}, f, indent=1)
    for what, stages in profiles:
        print(f"\nstages, {what}, batch 32 (ms; events around each launch):")
        for label, ms in stages:
            print(f"   {label:40s} {ms:.4f}")
        print(f"   {'sum':40s} {sum(ms for _, ms in stages):.4f}")
    lines = ["| problem | direction | config | cuDNN ms (err) | dft ms (err) | cuDNN / dft |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if "cudnn" not in r["ms"] or "dft" not in r["ms"]:
            lines.append(f"| {r['problem']} | {r['direction']} | {r.get('config', 'shipped')} | failed: "
                         f"{r.get('failed')} |")
            continue
        lines.append(f"| {r['problem']} | {r['direction']} | {r.get('config', 'shipped')} | {r['ms']['cudnn']:.3f} "
                     f"({r['err']['cudnn']:.1e}) | {r['ms']['dft']:.3f} ({r['err']['dft']:.1e}) | "
                     f"{r['ms']['cudnn'] / r['ms']['dft']:.2f} |")
    lines.append("")
    lines.append("| stage profile | dft_rows_forward ms | dft_rows_inverse* ms | sum of stages |")
    lines.append("|---|---|---|---|")
    for what, stages in profiles:
        fw = " + ".join(f"{ms:.4f}" for label, ms in stages if label == "dft_rows_forward")
        inv = " + ".join(f"{ms:.4f}" for label, ms in stages if label.startswith("dft_rows_inverse"))
        lines.append(f"| {what} | {fw} | {inv} | {sum(ms for _, ms in stages):.4f} |")
    table = "\n".join(lines)
    print("\n" + table)
    if args.table:
        with open(args.table, "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
