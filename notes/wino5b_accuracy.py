"""F(3x3, 5x5) (alpha 7) and F(4x4, 5x5) (alpha 8): float32 error of the NumPy
emulation of the GPU stages (dnnprims.algos.winograd.emulate) against the float64
reference, N(0, 1) data, channels up to 512, forward and backward data; and, for
alpha 7, every candidate point set (notes/wino5b.md).

    PYTHONPATH=$PWD python notes/wino5b_accuracy.py [--points]
"""
import sys
from fractions import Fraction

import numpy as np

from dnnprims.algos import winograd
from dnnprims.conv import conv2d_backward_data, conv2d_forward
from dnnprims.testing.tolerances import relative_error

H = Fraction(1, 2)
CANDIDATES_7 = {
    "0 +-1 +-2 1/2 inf": (0, 1, -1, 2, -2, H, None),
    "0 +-1 +-2 -1/2 inf": (0, 1, -1, 2, -2, -H, None),
    "0 +-1 +-1/2 2 inf": (0, 1, -1, H, -H, 2, None),
    "0 +-1 +-1/2 -2 inf": (0, 1, -1, H, -H, -2, None),
    "0 +-1 +-2 3 inf": (0, 1, -1, 2, -2, 3, None),
}
SHAPES = ((2, 64, 192, 27), (1, 256, 256, 16), (1, 512, 512, 12))


def errors(m, shapes=SHAPES, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for n, c, k, h in shapes:
        x, w = rng.standard_normal((n, c, h, h)), rng.standard_normal((k, c, 5, 5))
        y = conv2d_forward(x, w, padding=2)
        e_f = relative_error(winograd.emulate(x, w, m, (2, 2), np.float32), y)
        dy = rng.standard_normal(y.shape)
        dx = conv2d_backward_data(dy, w, x.shape, padding=2)
        e_d = relative_error(winograd.emulate(dy, w, m, (2, 2), np.float32, "backward_data"), dx)
        out.append((f"N{n} C{c} K{k} {h}x{h}", e_f, e_d))
    return out


if "--points" in sys.argv:
    saved = winograd.POINTS[7]
    for label, points in CANDIDATES_7.items():
        winograd.POINTS[7] = points
        winograd.matrices.__globals__  # noqa: B018 (matrices() reads POINTS each call)
        worst = max(max(f, d) for _, f, d in errors(3, SHAPES[1:2]))
        print(f"F(3x3, 5x5) points {label:22s}: worst {worst:.2e} (C = K = 256)")
    winograd.POINTS[7] = saved
for m in (2, 3, 4):
    for label, e_f, e_d in errors(m):
        print(f"F({m}x{m}, 5x5) {label}: forward {e_f:.2e}  backward data {e_d:.2e}")
# Backward filter F(5x5, m x m), alex_conv2_5x5's channels, batch 8 (1568 / 648 / 392
# tiles a sum for m = 2 / 3 / 4): NumPy's blocked float32 GEMM over all tiles.
rng = np.random.default_rng(1)
x, dy = rng.standard_normal((8, 64, 27, 27)), rng.standard_normal((8, 192, 27, 27))
from dnnprims.conv import conv2d_backward_filter  # noqa: E402
dw = conv2d_backward_filter(x, dy, (192, 64, 5, 5), padding=2)
for m in (2, 3, 4):
    e_w = relative_error(winograd.emulate_wgrad(x, dy, m, (2, 2), np.float32), dw)
    print(f"F(5x5, {m}x{m}) backward filter N8 C64 K192 27x27: {e_w:.2e}")
