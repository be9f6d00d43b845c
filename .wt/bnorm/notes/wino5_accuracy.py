"""F(2x2, 5x5) forward / backward data and F(5x5, 2x2) backward filter: float32
error of the NumPy emulation of the GPU stages (dnnprims.algos.winograd.emulate /
emulate_wgrad) against the float64 reference, N(0, 1) data (notes/wino5.md)."""
import numpy as np

from dnnprims.algos import winograd
from dnnprims.conv import conv2d_backward_data, conv2d_backward_filter, conv2d_forward
from dnnprims.testing.tolerances import relative_error

rng = np.random.default_rng(0)
for n, c, k, h in ((2, 64, 192, 27), (1, 256, 256, 16), (1, 512, 512, 12)):
    x, w = rng.standard_normal((n, c, h, h)), rng.standard_normal((k, c, 5, 5))
    y = conv2d_forward(x, w, padding=2)
    e_f = relative_error(winograd.emulate(x, w, 2, (2, 2), np.float32), y)
    dy = rng.standard_normal(y.shape)
    dx = conv2d_backward_data(dy, w, x.shape, padding=2)
    e_d = relative_error(winograd.emulate(dy, w, 2, (2, 2), np.float32, "backward_data"), dx)
    print(f"N{n} C{c} K{k} {h}x{h}: forward {e_f:.2e}  backward data {e_d:.2e}")
for n, c, k, h in ((8, 64, 192, 27), (32, 64, 64, 27)):
    x, dy = rng.standard_normal((n, c, h, h)), rng.standard_normal((n, k, h, h))
    dw = conv2d_backward_filter(x, dy, (k, c, 5, 5), padding=2)
    # One float32 GEMM over all N * tiles (no splits): an upper bound for the GPU's
    # 1024-tile splits.
    e_w = relative_error(winograd.emulate_wgrad(x, dy, 2, (2, 2), np.float32), dw)
    print(f"N{n} C{c} K{k} {h}x{h}: backward filter {e_w:.2e} (depth {n * 14 * 14} tiles)")
