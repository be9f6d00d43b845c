"""Helper dft7b (notes/dft7b.md): big_7x7_s1 and big_11x11_s1 at batch 32, "dft" against
cuDNN (PyTorch, benchmark mode, TF32 off): the shipped flags in three directions, then
forward / backward data with the W-axis row kernels of before (dft7: dft_rows_forward one
image row a block, dft_rows_inverse 32 b a block) and each new kernel alone; stage
profiles (CUDA events around each launch).  Reuses notes/bench_wino5.py (median of
CUDA-event-timed public calls, inputs rotated past L2) and notes/bench_large2.py.
The short table is printed last (and written to --table).

    PYTHONPATH=$PWD python notes/bench_dft7b.py [--repeat N] [--json PATH] [--table PATH] [--shipped-only]
"""
import argparse
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_large2 as L2  # noqa: E402
import bench_wino5 as W5  # noqa: E402

from dnnprims.algos import dft  # noqa: E402
from dnnprims.bench.__main__ import Backend  # noqa: E402

PROBLEMS = {"big_7x7_s1": dict(N=32, C=64, H=56, K=64, R=7, pad=3),
            "big_11x11_s1": dict(N=32, C=32, H=64, K=32, R=11, pad=5)}
# (label, ROWS_FORWARD, INVERSE_B64)
CONFIGS = [("dft7 rows kernels", 1, False), ("fwd 2 rows only", 2, False), ("inverse64 only", 1, True)]


def with_config(rows, b64, fn):
    saved = dft.ROWS_FORWARD, dft.INVERSE_B64
    dft.ROWS_FORWARD, dft.INVERSE_B64 = rows, b64
    try:
        return fn()
    finally:
        dft.ROWS_FORWARD, dft.INVERSE_B64 = saved


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--json", default=None)
    ap.add_argument("--table", default=None)
    ap.add_argument("--shipped-only", action="store_true")
    args = ap.parse_args(argv)
    be = Backend()
    print(be.describe(), "| shipped: ROWS_FORWARD", dft.ROWS_FORWARD, "INVERSE_B64", dft.INVERSE_B64,
          "FUSED_FILTER_MIN_TAPS", dft.FUSED_FILTER_MIN_TAPS, flush=True)
    rows, profiles = [], []
    for name, spec in PROBLEMS.items():
        p = W5._problem(spec)
        try:
            inp = W5.compare(be, p, name, W5.DIRECTIONS, lambda d: ["dft"], args.repeat, rows)   # shipped flags
            for label, r, b64 in ([] if args.shipped_only else CONFIGS):
                sub = []
                with_config(r, b64, lambda: W5.compare(be, p, name, ("forward", "backward_data"),
                                                       lambda d: ["dft"], args.repeat, sub))
                for row in sub:
                    row["config"] = label
                rows.extend(sub)
            todo = [("shipped", dft.ROWS_FORWARD, dft.INVERSE_B64, "forward"),
                    ("shipped", dft.ROWS_FORWARD, dft.INVERSE_B64, "backward_data")]
            if not args.shipped_only:
                todo.append(("dft7 rows kernels", 1, False, "forward"))
            for label, r, b64, direction in todo:
                try:
                    prof = with_config(r, b64, lambda: L2.dft_profile(be, p, inp, direction))
                    profiles.append((f"{name} {direction} [{label}]", prof))
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
