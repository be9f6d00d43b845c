"""GPU check after tuning (notes/conv_tune.md): with the freshly measured table,
algo="auto" runs and matches the float64 reference in every direction, and the
per-call host time of a cached small problem (auto vs a named algorithm).

    python notes/conv_tune_gpu_check.py PATH/TO/conv_table.json
"""
import sys
import time

import cupy as cp
import numpy as np

import dnnprims as dp
from dnnprims import algos
from dnnprims.algos import table
from dnnprims.testing import relative_error

table.use(sys.argv[1])
rng = np.random.default_rng(0)
CASES = [  # x shape, w shape, stride, padding, groups
    ((1, 64, 14, 14), (64, 64, 3, 3), 1, 1, 1),
    ((8, 128, 28, 28), (256, 128, 1, 1), 1, 0, 1),
    ((32, 32, 56, 56), (64, 32, 3, 3), 2, 1, 1),
    ((4, 64, 14, 14), (64, 1, 3, 3), 1, 1, 64),
    ((2, 48, 20, 20), (40, 48, 5, 5), 1, 2, 1),
]
worst = 0.0
for x_shape, w_shape, stride, padding, groups in CASES:
    for dtype in ("float32", "float16"):
        x = rng.standard_normal(x_shape).astype(dtype)
        w = (rng.standard_normal(w_shape) * 0.2).astype(dtype)
        kw = dict(stride=stride, padding=padding, groups=groups)
        y64 = dp.conv2d_forward(x.astype(np.float64), w.astype(np.float64), **kw)
        dy = rng.standard_normal(y64.shape).astype(dtype)
        got = {"forward": (dp.conv2d_forward(cp.asarray(x), cp.asarray(w), **kw), y64),
               "backward_data": (dp.conv2d_backward_data(cp.asarray(dy), cp.asarray(w), x_shape, **kw),
                                 dp.conv2d_backward_data(dy.astype(np.float64), w.astype(np.float64),
                                                         x_shape, **kw)),
               "backward_filter": (dp.conv2d_backward_filter(cp.asarray(x), cp.asarray(dy), w_shape, **kw),
                                   dp.conv2d_backward_filter(x.astype(np.float64), dy.astype(np.float64),
                                                             w_shape, **kw))}
        for direction, (ours, ref) in got.items():
            err = relative_error(cp.asnumpy(ours).astype(np.float64), ref)
            if dtype == "float32":
                worst = max(worst, err)
            name, reason = dp.conv2d_choose(x_shape, w_shape, dtype=dtype, direction=direction, **kw)
            print(f"{str(x_shape):18} {str(w_shape):16} s{stride} g{groups} {dtype:8} {direction:15} "
                  f"err {err:.1e}  {name:22} {reason[:110]}")
print(f"worst float32 relative error: {worst:.2e}")
assert worst < 1e-4, worst

# Per-call wall time of a cached small problem: the GPU work (~10 us) is shorter
# than the host path, so calls queue no faster than the host issues them.
x = cp.asarray(rng.standard_normal((1, 64, 14, 14)).astype("float32"))
w = cp.asarray(rng.standard_normal((64, 64, 3, 3)).astype("float32"))
name = dp.conv2d_choose(x.shape, w.shape, padding=1)[0]
rows = []
for algo in ("auto", name):
    for _ in range(50):
        dp.conv2d_forward(x, w, padding=1, algo=algo)
    cp.cuda.Device().synchronize()
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        dp.conv2d_forward(x, w, padding=1, algo=algo)
    cp.cuda.Device().synchronize()
    rows.append((algo, (time.perf_counter() - t0) / n * 1e6))
problem = dp.conv._describe(x.shape, w.shape, 1, 1, 1, 1, "NCHW", np.float32)
n = 20000
t0 = time.perf_counter()
for _ in range(n):
    algos.choose(problem, "forward", "auto")
choose_us = (time.perf_counter() - t0) / n * 1e6
print("\nper-call host time, conv2d_forward (1,64,14,14) * (64,64,3,3), cached:")
for algo, us in rows:
    print(f"  algo={algo!r:24} {us:6.1f} us per call")
print(f"  algos.choose(problem, 'forward', 'auto') alone: {choose_us:.2f} us")
