"""Host vs GPU time of the small public problems that lose to PyTorch.

cupyx.profiler.benchmark reports the host time of each call and the GPU time
between CUDA events around it separately: a call whose GPU time is far below
its host time is host-bound.  Run on the GPU machine:  python notes/probe_small_ops.py
"""
import cupy as cp
from cupyx.profiler import benchmark

import dnnprims as dp

f32 = cp.float32
x = cp.random.random((32, 2048, 7, 7), dtype=f32)
g, b = cp.ones(2048, f32), cp.zeros(2048, f32)
rm, rv = cp.zeros(2048, f32), cp.ones(2048, f32)
dy = cp.random.random(x.shape, dtype=f32)
_, mean, invstd = dp.batchnorm(x, g, b, training=True, return_stats=True)
rows = cp.random.random((256, 1000), dtype=f32)
cases = {
    "bn_r50_late train fwd": lambda: dp.batchnorm(x, g, b, rm, rv, training=True),
    "bn_r50_late infer fwd": lambda: dp.batchnorm(x, g, b, rm, rv, training=False),
    "bn_r50_late backward": lambda: dp.batchnorm_backward(dy, x, g, mean=mean, invstd=invstd),
    "global_avg_r50 forward": lambda: dp.pool(x, 7, mode="avg", stride=1),
    "classifier softmax": lambda: dp.softmax(rows, axis=1),
}
print(f"{'case':26s} {'host us':>9s} {'gpu us':>9s}")
for name, fn in cases.items():
    r = benchmark(fn, n_repeat=200, n_warmup=20)
    print(f"{name:26s} {r.cpu_times.mean() * 1e6:9.1f} {r.gpu_times.mean() * 1e6:9.1f}")
