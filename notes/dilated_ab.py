"""Why dilated_3x3_d2 at batch 1 (C=K=256, 28x28, 3x3, dilation 2, padding 2) runs
0.10-0.16 ms with `auto` (gemm) against cuDNN's 0.06 (session 9 conv bench): every
registered algorithm that runs the problem, each direction, timed like the bench
(dnnprims.bench.timing.measure, median of 30), PyTorch side by side; and the GEMM
alone (M=256, N=784, K=2304: what gemm's forward does after im2col) through
cublasSgemmStridedBatched with batch 1 (our _cublas.gemm) against cupy.matmul.
    PYTHONPATH=. python notes/dilated_ab.py     (GPU machine, ~40 s)"""
import cupy as cp
import numpy as np
import torch

import dnnprims as dp
from dnnprims import _cublas
from dnnprims.algos import REGISTRY
from dnnprims.bench.timing import measure

torch.backends.cudnn.benchmark = True
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
rng = np.random.default_rng(0)
f32 = np.float32
def compare(N, C, H, K, R, d, pad, directions):
    x = cp.asarray(rng.standard_normal((N, C, H, H)).astype(f32))
    w = cp.asarray(rng.standard_normal((K, C, R, R)).astype(f32) * 0.05)
    y = dp.conv2d_forward(x, w, padding=pad, dilation=d)
    dy = cp.asarray(rng.standard_normal(y.shape).astype(f32))
    tx, tw, tdy = (torch.from_dlpack(a) for a in (x, w, dy))
    F = torch.nn.functional
    opts = dict(padding=pad, dilation=d)
    calls = {
        "forward": (lambda algo: dp.conv2d_forward(x, w, algo=algo, **opts),
                    lambda: F.conv2d(tx, tw, padding=pad, dilation=d)),
        "backward_data": (lambda algo: dp.conv2d_backward_data(dy, w, x.shape, algo=algo, **opts),
                          lambda: torch.nn.grad.conv2d_input(tx.shape, tw, tdy, padding=pad, dilation=d)),
        "backward_filter": (lambda algo: dp.conv2d_backward_filter(x, dy, w.shape, algo=algo, **opts),
                            lambda: torch.nn.grad.conv2d_weight(tx, tw.shape, tdy, padding=pad, dilation=d)),
    }
    for direction in directions:
        ours, theirs = calls[direction]
        t_torch = measure(theirs, xp=cp, warmup=5, repeat=30).median_ms
        rows = []
        for name in sorted(REGISTRY):
            try:
                ours(name)
            except Exception:  # not supported by this algorithm: its refusal names why
                continue
            cp.cuda.Device().synchronize()
            rows.append((measure(lambda: ours(name), xp=cp, warmup=5, repeat=30).median_ms, name))
        t_auto = measure(lambda: ours("auto"), xp=cp, warmup=5, repeat=30).median_ms
        print(f"== N={N} C={C} H={H} K={K} {R}x{R} dilation {d} {direction}: torch {t_torch:.4f} ms; "
              f"auto {t_auto:.4f} ms")
        for t, name in sorted(rows):
            print(f"   {name:28s} {t:.4f} ms  {t_torch / t:5.2f}x torch")


compare(1, 256, 28, 256, 3, 2, 2, ("forward", "backward_data", "backward_filter"))   # dilated_3x3_d2 N1
compare(32, 512, 7, 2048, 1, 1, 0, ("backward_filter",))                            # r50_5_1x1_up N32

M, Nn, Kk = 256, 784, 2304
a = cp.asarray(rng.standard_normal((M, Kk)).astype(f32))
b = cp.asarray(rng.standard_normal((Kk, Nn)).astype(f32))
c = cp.empty((M, Nn), f32)
c3 = c.reshape(1, M, Nn)
b3 = b.reshape(1, Kk, Nn)
print("== GEMM 256 x 784 x 2304 fp32 (0.925 GFLOP)")
for label, fn in (("_cublas.gemm 2-D (strided-batched, batch 1)", lambda: _cublas.gemm(cp, a, b, c)),
                  ("_cublas.gemm 3-D batch 1", lambda: _cublas.gemm(cp, a, b3, c3)),
                  ("cupy.matmul", lambda: cp.matmul(a, b, out=c)),
                  ("torch.mm", lambda: torch.mm(torch.from_dlpack(a), torch.from_dlpack(b)))):
    t = measure(fn, xp=cp, warmup=5, repeat=30).median_ms
    print(f"   {label:44s} {t:.4f} ms  {2 * M * Nn * Kk / t / 1e9:6.1f} TFLOP/s")
