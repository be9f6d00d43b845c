"""Where the host time of the small memory-bound calls goes (issue 5's 1-13 MB rows:
global average pooling, bn_r50_late, classifier softmax): per-call wall time of 2000
back-to-back calls (host time where the host is slower than the GPU; the launch queue
fills otherwise), a CuPy elementwise copy of the same bytes for
reference, and a cProfile of 20000 calls of each (top entries by own time).
    PYTHONPATH=. python notes/hostprof_gpu.py      (GPU machine, ~30 s)"""
import cProfile
import io
import pstats
import time

import cupy as cp
import numpy as np

import dnnprims as dp

rng = np.random.default_rng(0)
f32 = np.float32
x_pool = cp.asarray(rng.standard_normal((32, 2048, 7, 7)).astype(f32))
g, b = cp.ones(2048, f32), cp.zeros(2048, f32)
rm, rv = cp.zeros(2048, f32), cp.ones(2048, f32)
logits = cp.asarray(rng.standard_normal((256, 1000)).astype(f32))
y_soft = dp.log_softmax(logits, axis=1)
dy_soft = cp.asarray(rng.standard_normal((256, 1000)).astype(f32))
_, mean, invstd = dp.batchnorm(x_pool, g, b, return_stats=True)
dy_pool = cp.asarray(rng.standard_normal((32, 2048, 7, 7)).astype(f32))
copy_dst = cp.empty_like(x_pool)

CALLS = {
    "global avg pool": lambda: dp.pool(x_pool, 7, mode="avg", stride=1),
    "batchnorm train 32x2048x7x7": lambda: dp.batchnorm(x_pool, g, b, rm, rv, training=True),
    "batchnorm infer 32x2048x7x7": lambda: dp.batchnorm(x_pool, g, b, rm, rv, training=False),
    "batchnorm backward 32x2048x7x7": lambda: dp.batchnorm_backward(dy_pool, x_pool, g, mean=mean, invstd=invstd),
    "softmax 256x1000": lambda: dp.softmax(logits, axis=1),
    "log_softmax backward 256x1000": lambda: dp.log_softmax_backward(dy_soft, y_soft, axis=1),
    "cupy copy 12.8 MB (reference)": lambda: copy_dst.__setitem__(Ellipsis, x_pool),
    "cupy elementwise add (reference)": lambda: x_pool + x_pool,
}


def host_us(fn, n=2000):
    for _ in range(50):
        fn()
    cp.cuda.Device().synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    cp.cuda.Device().synchronize()
    return host


print(f"{'call':34s} {'host us/call':>12s}")
for name, fn in CALLS.items():
    print(f"{name:34s} {host_us(fn):12.2f}", flush=True)
for name, fn in CALLS.items():
    if "reference" in name:
        continue
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(20000):
        fn()
    prof.disable()
    cp.cuda.Device().synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
    print(f"\n===== {name}: top 12 by own time (20000 calls)")
    print("\n".join(out.getvalue().splitlines()[4:24]))
