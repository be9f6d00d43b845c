"""Winograd for 5x5 filters, every variant (notes/wino5b.md): alex_conv2_5x5 at batch 32
and 1, forward / backward data (F(2x2, 5x5), F(3x3, 5x5), F(4x4, 5x5)) and backward
filter (F(5x5, 2x2), F(5x5, 3x3), F(5x5, 4x4)) against cuDNN (PyTorch, benchmark mode,
TF32 off) in the same process, each one's error against PyTorch float64 on the same
N(0, 1) inputs (bench_wino5.compare: the bench's Backend.measure).  Then the forward /
backward-data GEMMs alone (alpha^2 strided-batched cuBLAS SGEMMs of depth C) in five
operand arrangements, to see whether another layout of U, V or M makes cuBLAS faster.

    python notes/bench_wino5b.py [--repeat N] [--json PATH]
"""
import argparse
import json
import sys

import numpy as np

from bench_wino5 import ALEX, DIRECTIONS, _problem, compare
from dnnprims import _cublas
from dnnprims.bench.__main__ import Backend

FORWARD = ["winograd_f2x2_5x5", "winograd_f3x3_5x5", "winograd_f4x4_5x5"]
WGRAD = ["winograd_wgrad_f5x5_2x2", "winograd_wgrad_f5x5_3x3", "winograd_wgrad_f5x5_4x4"]
NAMES = {"forward": FORWARD, "backward_data": FORWARD, "backward_filter": WGRAD}

# Row-major M = U @ V over alpha^2 batch entries, (Kout x tiles) = (Kout x Cin)(Cin x tiles),
# with each operand stored one way or the other: (label, U stored transposed, V stored
# transposed, M stored transposed).  "U V M" is the NCHW path today, "U Vt Mt" the NHWC one.
ARRANGEMENTS = [("U V M (NCHW now)", False, False, False), ("Ut V M", True, False, False),
                ("U Vt M", False, True, False), ("U Vt Mt (NHWC now)", False, True, True),
                ("U V Mt", False, False, True)]


def gemm_layouts(cp, N=32, H=27, repeat=20):
    """Median ms of the alpha^2 GEMMs alone per (m, direction, arrangement)."""
    rows = []
    for m in (2, 3, 4):
        alpha2 = (m + 4) ** 2
        tiles = N * (-(-H // m)) ** 2
        for direction, cin, kout in (("forward", 64, 192), ("backward_data", 192, 64)):
            for label, ut, vt, mt in ARRANGEMENTS:
                u = cp.random.standard_normal((alpha2, cin, kout) if ut else (alpha2, kout, cin), dtype=cp.float32)
                v = cp.random.standard_normal((alpha2, tiles, cin) if vt else (alpha2, cin, tiles), dtype=cp.float32)
                out = cp.empty((alpha2, tiles, kout) if mt else (alpha2, kout, tiles), dtype=cp.float32)
                if mt:   # M^T = V^T U^T
                    call = lambda: _cublas.gemm(cp, v, u, out, trans_a=not vt, trans_b=not ut)
                else:
                    call = lambda: _cublas.gemm(cp, u, v, out, trans_a=ut, trans_b=vt)
                for _ in range(3):
                    call()
                events = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(repeat)]
                for e0, e1 in events:
                    e0.record()
                    call()
                    e1.record()
                e1.synchronize()
                ms = float(np.median([cp.cuda.get_elapsed_time(a, b) for a, b in events]))
                flops = 2 * alpha2 * kout * cin * tiles
                rows.append(dict(m=m, direction=direction, arrangement=label, ms=ms, tflops=flops / ms / 1e9,
                                 m_mb=alpha2 * kout * tiles * 4 / 1e6))
                print(json.dumps(rows[-1]), flush=True)
                del u, v, out
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    be = Backend()
    print(be.describe(), flush=True)
    rows = []
    for N in (32, 1):
        compare(be, _problem(ALEX, N), "alex_conv2_5x5", DIRECTIONS, NAMES.get, args.repeat, rows)
        be.free()
    gemms = gemm_layouts(be.xp)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": be.describe(), "rows": rows, "gemms": gemms}, f, indent=1)
    print("\nGEMMs alone, alex batch 32 (ms, TFLOP/s):")
    for g in gemms:
        print(f"  F({g['m']}x{g['m']}, 5x5) {g['direction']:13s} {g['arrangement']:20s} {g['ms']:.4f} "
              f"{g['tflops']:5.1f}  M {g['m_mb']:.0f} MB")
    print("\n| N | direction | cuDNN ms (err) | " + " | ".join(f"F{i}" for i in (2, 3, 4)) +
          " | best | cuDNN/best | auto |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ours = {k: v for k, v in r["ms"].items() if k != "cudnn"}
        if "cudnn" not in r["ms"] or not ours:
            print(r)
            continue
        best = min(ours, key=ours.get)
        cells = " | ".join(f"{r['ms'][k]:.3f} ({r['err'][k]:.1e})" if k in r["ms"] else "-"
                           for k in NAMES[r["direction"]])
        print(f"| {r['N']} | {r['direction']} | {r['ms']['cudnn']:.3f} ({r['err']['cudnn']:.1e}) | {cells} | "
              f"{best} | {r['ms']['cudnn'] / ours[best]:.2f} | {r['auto']} |"
              + (f" FAILED {r['failed']}" if "failed" in r else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
