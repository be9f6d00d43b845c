"""2-D max and average pooling, forward and backward (PyTorch semantics).

NumPy arrays run ``dnnprims.reference.pooling``; CuPy arrays run
``kernels/pooling.cu``.  See the reference module for the exact rules (the
max tie and NaN rule, the average divisor).
"""
from dataclasses import dataclass

import numpy as np

from . import _dtypes, _validate
from ._kernels import KernelFamily, ceil_div, index_type
from .reference import pooling as reference

MODES = ("max", "avg")
LAYOUTS = ("NCHW", "NHWC")

FAMILY = KernelFamily("pooling.cu", [
    f"pool_{mode}_{direction}<{t}, {i}, {'true' if nhwc else 'false'}>"
    for mode in MODES for direction in ("forward", "backward")
    for t in _dtypes.CUDA_TYPES for i in ("int", "long long") for nhwc in (False, True)])

_BLOCK = 256
_MAX_BLOCKS = 8192  # grid-stride loops beyond this many blocks


@dataclass(frozen=True)
class PoolProblem:
    """One pooling problem: the key for kernels, caches and benchmarks."""
    n: int
    c: int
    h: int
    w: int
    window: tuple
    stride: tuple
    padding: tuple
    mode: str
    count_include_pad: bool
    layout: str
    dtype: np.dtype

    @property
    def out_hw(self):
        return tuple(reference.output_size(s, k, st, p) for s, k, st, p in
                     zip((self.h, self.w), self.window, self.stride, self.padding))

    @property
    def x_shape(self):
        return (self.n, self.c, self.h, self.w) if self.layout == "NCHW" else (self.n, self.h, self.w, self.c)

    @property
    def y_shape(self):
        ho, wo = self.out_hw
        return (self.n, self.c, ho, wo) if self.layout == "NCHW" else (self.n, ho, wo, self.c)


def _problem(x, window, mode, stride, padding, count_include_pad, layout):
    """Check every option and the input's shape and dtype; describe the problem."""
    _validate.check_choice("mode", mode, MODES)
    _validate.check_layout(layout, LAYOUTS)
    if not isinstance(count_include_pad, (bool, np.bool_)):
        raise TypeError(f"count_include_pad must be a bool, got {count_include_pad!r}")
    window = _validate.int_pair("window", window, 1)
    stride = window if stride is None else _validate.int_pair("stride", stride, 1)
    padding = _validate.int_pair("padding", padding, 0)
    for k, p in zip(window, padding):
        if p > k // 2:
            raise ValueError(f"padding must be at most half the window, got padding={padding} "
                             f"for window={window}")
    _validate.check_float_dtype("x", x)
    _validate.check_ndim("x", x, 4, f"{'(N, C, H, W)' if layout == 'NCHW' else '(N, H, W, C)'}")
    if layout == "NCHW":
        n, c, h, w = x.shape
    else:
        n, h, w, c = x.shape
    for size, k, p, axis in zip((h, w), window, padding, ("height", "width")):
        if size + 2 * p < k:
            raise ValueError(f"window {window} is larger than the padded input "
                             f"({axis} {size} + 2 * padding {p})")
    return PoolProblem(n, c, h, w, window, stride, padding, mode, bool(count_include_pad),
                       layout, np.dtype(x.dtype))


def pool(x, window, *, mode="max", stride=None, padding=0, count_include_pad=True, layout="NCHW"):
    """Max or average pooling of a 4-D tensor; ``stride=None`` means the window."""
    xp = _validate.array_module(x=x)
    problem = _problem(x, window, mode, stride, padding, count_include_pad, layout)
    if xp is np:
        return reference.pool(x, problem.window, problem.stride, problem.padding, mode,
                              problem.count_include_pad, layout)
    x = _validate.contiguous(xp, x)
    y = xp.empty(problem.y_shape, dtype=x.dtype)
    if y.size:
        _launch(problem, "forward", y.size, x.size, (x, y))
    return y


def pool_backward(dy, x, y, window, *, mode="max", stride=None, padding=0, count_include_pad=True,
                  layout="NCHW"):
    """Gradient of :func:`pool` with respect to ``x``.

    ``y`` (the forward output) may be None; it is checked but not needed: max
    pooling recomputes each window's argmax from ``x``.  ``dy=None`` means a
    zero gradient."""
    xp = _validate.array_module(dy=dy, x=x, y=y)
    problem = _problem(x, window, mode, stride, padding, count_include_pad, layout)
    _validate.check_same_dtype(x=x, dy=dy, y=y)
    for name, a in (("dy", dy), ("y", y)):
        if a is not None:
            _validate.check_shape(name, a, problem.y_shape, "the pooling output's shape")
    if dy is None:
        return xp.zeros(x.shape, dtype=x.dtype)
    if xp is np:
        return reference.pool_backward(dy, x, problem.window, problem.stride, problem.padding, mode,
                                       problem.count_include_pad, layout)
    x = _validate.contiguous(xp, x)
    dy = _validate.contiguous(xp, dy)
    dx = xp.empty(x.shape, dtype=x.dtype)
    if dx.size:
        _launch(problem, "backward", dx.size, dy.size, (x, dy, dx))
    return dx


def _launch(problem, direction, threads, other_size, arrays):
    """One thread per output element (forward) or per input element (backward)."""
    blocks = min(ceil_div(threads, _BLOCK), _MAX_BLOCKS)
    # The grid-stride loop index reaches threads + blocks * _BLOCK before it stops.
    index_t = index_type(threads + blocks * _BLOCK, other_size)
    it = np.int32 if index_t == "int" else np.int64
    nhwc = "true" if problem.layout == "NHWC" else "false"
    expr = (f"pool_{problem.mode}_{direction}<{_dtypes.cuda_type(problem.dtype)}, {index_t}, "
            f"{nhwc}>")
    ho, wo = problem.out_hw
    scalars = (problem.n, problem.c, problem.h, problem.w, ho, wo, *problem.window,
               *problem.stride, *problem.padding)
    args = (*arrays, *(it(v) for v in scalars))
    if problem.mode == "avg":
        args += (np.int32(problem.count_include_pad),)
    FAMILY.launch(expr, (blocks,), (_BLOCK,), args)
