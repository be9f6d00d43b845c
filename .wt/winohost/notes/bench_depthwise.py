"""Depthwise timings (helper `depthwise`, issue 3), on the GPU machine.

    python notes/bench_depthwise.py [OUTDIR]

Per public depthwise problem (mbv2_dw_112, mbv2_dw_28; batch 32 and 1) and
direction: cuDNN (PyTorch, benchmark mode, TF32 off), the previous kernels
(shared-memory tile; the "same" path switched off), the dw_same_* kernels alone
at 2 / 4 / 8 rows per lane, and the public call with the default choice.
Floor bytes: read x (or dy) and w, write y (or dx); backward filter reads x
and dy and writes dw.  "of copy" = floor bytes / time / measured copy bandwidth.
Inputs rotate among several copies when they would sit in L2 (as the bench).
"""
import json
import os
import sys

import cupy
import numpy as np
import torch

import dnnprims as dp
from dnnprims.algos import REGISTRY
from dnnprims.algos import depthwise as dwa
from dnnprims.bench import timing
from dnnprims.conv import _describe

torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = False


# label -> (rows per lane, MINB, threads per block, grid cap); "old" = the
# shared-memory tile kernels; "auto" = the library's choice (same_variant).
# Caps of one resident wave: 183 registers (8 rows) -> 1 block of 256 or 5 of
# 64 threads per SM; 128 registers (4 rows) -> 4 blocks of 128.
VARIANTS = {"old": None, "auto": "auto", "r8t64": (8, 1, 64, 0), "r8c132": (8, 1, 256, 132),
            "r8t64c660": (8, 1, 64, 660), "r4t128c528": (4, 1, 128, 528), "r2m3t128": (2, 3, 128, 0)}
PROBLEMS = (("mbv2_dw_112", 32, 96, 112), ("mbv2_dw_28", 32, 192, 28))


def rand(shape):
    a = cupy.random.random(shape, dtype=cupy.float32)
    a -= 0.5
    return a


def t(fn, inputs=None, repeat=40):
    return timing.measure(fn, inputs, xp=cupy, warmup=3, repeat=repeat).median_ms


def copy_gbs():
    n = 2**28
    src = cupy.random.random(n, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    ms = t(lambda: dst.__setitem__(Ellipsis, src), repeat=20)
    return 2 * src.nbytes / (ms * 1e-3) / 1e9


def main(outdir):
    dw = REGISTRY["depthwise"]
    saved = {k: getattr(dwa, k) for k in ("same_variant", "is_same_nchw", "SAME_THREADS", "SAME_GRID_CAP")}
    bw = copy_gbs()
    rows_out = []
    for name, N, C, H in PROBLEMS:
        p = _describe((N, C, H, H), (C, 1, 3, 3), 1, 1, 1, C, "NCHW", np.float32)
        x, w, dy = rand(p.x_shape), rand(p.w_shape), rand(p.y_shape)
        opts = dict(stride=1, padding=1, groups=C)
        out = {"forward": cupy.empty(p.y_shape, np.float32), "backward_data": cupy.empty(p.x_shape, np.float32),
               "backward_filter": cupy.empty(p.w_shape, np.float32)}
        for direction, a, b in (("forward", x, w), ("backward_data", dy, w), ("backward_filter", x, dy)):
            floor = x.nbytes + dy.nbytes + w.nbytes
            sets = timing.rotation_count(a.nbytes + b.nbytes)
            inputs = [(a, b)] + [(a.copy(), b.copy()) for _ in range(sets - 1)]
            ta = [tuple(torch.from_dlpack(v) for v in s) for s in inputs]
            F = torch.nn.functional
            theirs = {"forward": lambda u, v: F.conv2d(u, v, **opts),
                      "backward_data": lambda u, v: torch.nn.grad.conv2d_input(p.x_shape, v, u, **opts),
                      "backward_filter": lambda u, v: torch.nn.grad.conv2d_weight(u, p.w_shape, v, **opts)}[direction]
            public = {"forward": lambda u, v: dp.conv2d_forward(u, v, **opts),
                      "backward_data": lambda u, v: dp.conv2d_backward_data(u, v, p.x_shape, **opts),
                      "backward_filter": lambda u, v: dp.conv2d_backward_filter(u, v, p.w_shape, **opts)}[direction]
            want = cupy.from_dlpack(theirs(*ta[0]))
            row = {"name": name, "N": N, "direction": direction, "floor_bytes": floor,
                   "cudnn_ms": t(theirs, ta)}
            for label, v in VARIANTS.items():
                dw._plans.clear()
                if v is None:
                    dwa.is_same_nchw = lambda q: False
                elif v != "auto":
                    dwa.same_variant = lambda q, d, v=v: v[:2]
                    dwa.SAME_THREADS, dwa.SAME_GRID_CAP = v[2], v[3]
                try:
                    kernel = lambda u, v: dw.run(p, direction, u, v, out[direction])  # noqa: E731
                    kernel(a, b)
                    got = out[direction]
                    row[f"{label}_err"] = float(cupy.linalg.norm(got - want) / cupy.linalg.norm(want))
                    row[f"{label}_ms"] = t(kernel, inputs)
                    row[f"{label}_public_ms"] = t(public, inputs)
                except Exception as e:  # report, go on
                    row[f"{label}_ms"] = row[f"{label}_public_ms"] = float("nan")
                    row[f"{label}_error"] = f"{type(e).__name__}: {e}"[:200]
                finally:
                    for k, val in saved.items():
                        setattr(dwa, k, val)
                    dw._plans.clear()
            got = public(a, b)
            row["public_err"] = float(cupy.linalg.norm(got - want) / cupy.linalg.norm(want))
            row["public_ms"] = t(public, inputs)
            row["auto_variant"] = dwa.same_variant(p, direction)
            rows_out.append(row)
            print(json.dumps(row), flush=True)
            del inputs, ta
        del x, w, dy
        cupy.get_default_memory_pool().free_all_blocks()
    result = {"copy_GBps": bw, "rows": rows_out}
    if outdir:
        os.makedirs(outdir, exist_ok=True)
        with open(os.path.join(outdir, "bench_depthwise.json"), "w") as f:
            json.dump(result, f, indent=1)
    print(f"\ncopy bandwidth {bw:.0f} GB/s; ratio = cuDNN / ours; 'of copy' = floor bytes / time / copy")
    print("kernel alone (DEPTHWISE.run) ms, then the public call ms; x = cuDNN / ours")
    print(f"{'problem':12} {'N':>2} {'direction':15} {'cuDNN':>7} " + " ".join(f"{k:>9}" for k in VARIANTS))
    for r in rows_out:
        for what in ("", "_public"):
            print(f"{r['name']:12} {r['N']:>2} {r['direction'] + what:15} {r['cudnn_ms']:7.4f} "
                  + " ".join(f"{r[k + what + '_ms']:9.4f}" for k in VARIANTS))
        print(f"{'':12} {'':>2} {'x cuDNN public':15} {'':7} "
              + " ".join(f"{r['cudnn_ms'] / r[k + '_public_ms']:9.2f}" for k in VARIANTS))
        floor_us = r["floor_bytes"] / (bw * 1e9) * 1e6
        print(f"{'':12} {'':>2} {'of copy kernel':15} {floor_us:7.1f} "
              + " ".join(f"{floor_us * 1e-3 / r[k + '_ms']:9.2f}" for k in VARIANTS))
    for r in rows_out:
        for k in VARIANTS:
            if f"{k}_error" in r:
                print("ERROR", r["name"], r["N"], r["direction"], k, r[f"{k}_error"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT"))
