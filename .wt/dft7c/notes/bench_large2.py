"""Helper large2 (notes/large2.md): alex_conv2_5x5 backward filter, F(5x5, 4x4) against
F(5x5, 2x2) (with the new output kernel) and cuDNN, a split sweep of both, their stage
profiles; then big_7x7_s1 "dft" (FUSED_ROWS, new dft_rows_inverse) in three directions
with a stage profile of forward.  Reuses notes/bench_wino5.py (the bench's Backend.measure:
median of CUDA-event-timed public calls, inputs rotated past L2, N(0,1) data; error =
normwise vs PyTorch float64 on the same inputs).

    PYTHONPATH=$PWD python notes/bench_large2.py [--repeat N] [--json PATH]
"""
import argparse
import json
import os
import sys
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_wino5 as W5  # noqa: E402

from dnnprims import _cublas  # noqa: E402
from dnnprims.algos import dft, fft, winograd  # noqa: E402
from dnnprims.bench.__main__ import Backend, _conv_call, _conv_operands  # noqa: E402

WGRAD_NAMES = ["winograd_wgrad_f5x5_4x4", "winograd_wgrad_f5x5_2x2", "dft"]
SWEEP = [  # (WGRAD_TARGET_BLOCKS, WGRAD_MIN_SPLIT_DEPTH, WGRAD_MAX_SPLIT_DEPTH)
    (264, 512, 1024), (1, 512, 1024), (132, 512, 1024), (528, 256, 1024), (1056, 128, 1024), (1, 512, 2048)]


def sweep(be, p, inp, repeat):
    out = []
    saved = winograd.WGRAD_TARGET_BLOCKS, winograd.WGRAD_MIN_SPLIT_DEPTH, winograd.WGRAD_MAX_SPLIT_DEPTH
    try:
        for name in WGRAD_NAMES[:2]:
            m = int(name[-1])
            for t, lo, hi in SWEEP:
                winograd.WGRAD_TARGET_BLOCKS, winograd.WGRAD_MIN_SPLIT_DEPTH, winograd.WGRAD_MAX_SPLIT_DEPTH = t, lo, hi
                _, _, splits, st = winograd.wgrad_sizes(p, m)
                call = lambda x, w, dy, name=name: _conv_call("backward_filter", p,
                                                              *_conv_operands("backward_filter", x, w, dy), name)
                ms = be.measure(call, inp.sets, repeat)
                out.append((name, t, lo, hi, splits, st, ms))
                print(json.dumps(out[-1]), flush=True)
    finally:
        winograd.WGRAD_TARGET_BLOCKS, winograd.WGRAD_MIN_SPLIT_DEPTH, winograd.WGRAD_MAX_SPLIT_DEPTH = saved
    return out


def dft_profile(be, p, inp, direction, repeat=10):
    """Median ms of each launch / cuBLAS call of one "dft" call (CUDA events around each)."""
    cp = be.xp
    log = []
    real = (dft.FAMILY.launch, fft.FAMILY.launch, _cublas.gemm)

    def wrap(fn, label_of):
        def inner(*a, **k):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record()
            r = fn(*a, **k)
            e1.record()
            log.append((label_of(a), e0, e1))
            return r
        return inner

    dft.FAMILY.launch = wrap(real[0], lambda a: a[0].split("<")[0])
    fft.FAMILY.launch = wrap(real[1], lambda a: a[0].split("<")[0])
    _cublas.gemm = wrap(real[2], lambda a: "gemm -> " + "x".join(str(s) for s in a[3].shape))
    stages = {}
    try:
        for _ in range(repeat + 2):
            log.clear()
            _conv_call(direction, p, *_conv_operands(direction, inp.x, inp.w, inp.dy), "dft")
            cp.cuda.Device().synchronize()
            for i, (label, e0, e1) in enumerate(log):
                stages.setdefault((i, label), []).append(cp.cuda.get_elapsed_time(e0, e1))
    finally:
        dft.FAMILY.launch, fft.FAMILY.launch, _cublas.gemm = real
    return [(label, float(np.median(ts[2:]))) for (i, label), ts in sorted(stages.items())]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    be = Backend()
    print(be.describe(), flush=True)
    rows, profiles, sweeps = [], [], []
    p = W5._problem(W5.ALEX)
    try:
        inp = W5.compare(be, p, "alex_conv2_5x5", ("backward_filter",), lambda d: WGRAD_NAMES, args.repeat, rows)
        for name in WGRAD_NAMES[:2]:
            try:
                profiles.append(("alex backward_filter", name, W5.stage_profile(be, p, inp, "backward_filter", name)))
            except Exception:
                traceback.print_exc()
        sweeps = sweep(be, p, inp, max(10, args.repeat // 2))
        del inp
    except Exception:
        traceback.print_exc()
    be.free()
    p7 = W5._problem(W5.BIG7)
    try:
        inp = W5.compare(be, p7, "big_7x7_s1", W5.DIRECTIONS, lambda d: ["dft"], args.repeat, rows)
        for direction in ("forward", "backward_data"):
            try:
                profiles.append((f"big_7x7_s1 {direction}", "dft", dft_profile(be, p7, inp, direction)))
            except Exception:
                traceback.print_exc()
    except Exception:
        traceback.print_exc()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": be.describe(), "rows": rows, "sweep": sweeps,
                       "profiles": [{"what": w, "name": n, "stages": s} for w, n, s in profiles]}, f, indent=1)
    for what, name, stages in profiles:
        print(f"\nstages of {name}, {what}, batch 32 (ms):")
        for label, ms in stages:
            print(f"   {label:40s} {ms:.4f}")
        print(f"   {'sum':40s} {sum(ms for _, ms in stages):.4f}")
    print("\nsplit sweep, alex backward filter (name, target, min, max, splits, split tiles, ms):")
    for s in sweeps:
        print("  ", s[0], *s[1:6], f"{s[6]:.4f}")
    print("\n| problem | direction | cuDNN ms (err) | ours ms (err) | best | cuDNN/best |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ours = {k: v for k, v in r["ms"].items() if k != "cudnn"}
        if "cudnn" not in r["ms"] or not ours:
            print(r)
            continue
        best = min(ours, key=ours.get)
        cells = ", ".join(f"{k} {v:.3f} ({r['err'].get(k, float('nan')):.1e})" for k, v in ours.items())
        print(f"| {r['problem']} | {r['direction']} | {r['ms']['cudnn']:.3f} ({r['err']['cudnn']:.1e}) | {cells} "
              f"| {best} | {r['ms']['cudnn'] / ours[best]:.2f} |" + (f" FAILED {r['failed']}" if "failed" in r else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
