"""Helper dft7 (notes/dft7.md): big_7x7_s1 and big_11x11_s1 at batch 32, "dft" against
cuDNN (PyTorch, benchmark mode, TF32 off) in all three directions, with the filter
spectrum made the old way (fft's conversion kernel + 2 cuBLAS GEMMs) and by the new
dft_filter_spectrum, whole or in chunks of rows u (dft.FILTER_CHUNK_BYTES); a
per-launch stage profile of each; each one's error against PyTorch float64 on the
same N(0, 1) inputs.  Reuses notes/bench_wino5.py (median of CUDA-event-timed
public calls, inputs rotated past L2) and notes/bench_large2.py (stage profile).
The short table is printed last (and written to --table).

    PYTHONPATH=$PWD python notes/bench_dft7.py [--repeat N] [--json PATH] [--table PATH]
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
# (label, FUSED_FILTER, FILTER_CHUNK_BYTES); the first is the session-3 path.
CONFIGS = [("old filter", False, 0), ("fused", True, 0), ("fused+chunk16M", True, 16 << 20),
           ("fused+chunk32M", True, 32 << 20), ("fused+chunk8M", True, 8 << 20)]


def with_config(fused, chunk, fn):
    saved = dft.FUSED_FILTER, dft.FILTER_CHUNK_BYTES
    dft.FUSED_FILTER, dft.FILTER_CHUNK_BYTES = fused, chunk
    try:
        return fn()
    finally:
        dft.FUSED_FILTER, dft.FILTER_CHUNK_BYTES = saved


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--json", default=None)
    ap.add_argument("--table", default=None)
    ap.add_argument("--shipped-only", action="store_true",
                    help="the shipped flags and the old filter path only; stage profile of the shipped flags")
    args = ap.parse_args(argv)
    be = Backend()
    print(be.describe(), "| shipped: FUSED_ROWS", dft.FUSED_ROWS, "FUSED_FILTER", dft.FUSED_FILTER,
          "FILTER_CHUNK_BYTES", dft.FILTER_CHUNK_BYTES, flush=True)
    rows, profiles = [], []
    for name, spec in PROBLEMS.items():
        p = W5._problem(spec)
        try:
            inp = W5.compare(be, p, name, W5.DIRECTIONS, lambda d: ["dft"], args.repeat, rows)   # shipped flags
            for label, fused, chunk in (CONFIGS[:1] if args.shipped_only else CONFIGS):
                sub = []
                with_config(fused, chunk, lambda: W5.compare(be, p, name, ("forward", "backward_data"),
                                                             lambda d: ["dft"], args.repeat, sub))
                for r in sub:
                    r["config"] = label
                rows.extend(sub)
            shipped = [("shipped", dft.FUSED_FILTER, dft.FILTER_CHUNK_BYTES)]
            for label, fused, chunk in (shipped if args.shipped_only else CONFIGS[:3]):
                for direction in ("forward", "backward_data"):
                    try:
                        prof = with_config(fused, chunk, lambda: L2.dft_profile(be, p, inp, direction))
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
    table = "\n".join(lines)
    print("\n" + table)
    if args.table:
        with open(args.table, "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
