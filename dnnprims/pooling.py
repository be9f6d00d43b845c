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

_BOOL = ("false", "true")
FAMILY = KernelFamily("pooling.cu", [
    *(f"pool_{mode}_{direction}<{t}, {i}, {nhwc}>"
      for mode in MODES for direction in ("forward", "backward")
      for t in _dtypes.CUDA_TYPES for i in ("int", "long long") for nhwc in _BOOL),
    # NCHW fast paths: template <T, index_t, bool MAX>
    *(f"pool_{kind}_{direction}<{t}, {i}, {is_max}>"
      for kind, direction in (("forward", "nchw_tiled"), ("backward", "nchw_tiled"),
                              ("global", "forward"), ("global", "backward"))
      for t in _dtypes.CUDA_TYPES for i in ("int", "long long") for is_max in _BOOL)])

_BLOCK = 256
_MAX_BLOCKS = 8192  # grid-stride loops beyond this many blocks (general kernels)
_MAX_ITEMS_BLOCKS = 1 << 20  # the same for the tiled and global kernels
# Shared memory a tiled block may stage: 24 KB leaves 8 blocks of 256 threads
# resident per SM (228 KB), the thread limit.
_SMEM_BUDGET = 24 * 1024
_FILL_ITEMS = 2 * 132  # split planes into more tiles until about this many blocks


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
        _run(problem, "forward", (x, y))
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
        _run(problem, "backward", (x, dy, dx))
    return dx


def _run(problem, direction, arrays):
    """Pick the path: whole-plane windows, NCHW row tiles, or the general kernels."""
    x = arrays[0]
    if problem.layout == "NCHW" and problem.h * problem.w < 2**31:
        if (problem.window == (problem.h, problem.w) and problem.padding == (0, 0)):
            return _launch_global(problem, direction, arrays)
        tiling = _tiling(problem, direction)
        if tiling is not None:
            return _launch_tiled(problem, direction, arrays, *tiling)
    if direction == "forward":
        _launch(problem, direction, arrays[-1].size, x.size, arrays)
    else:
        _launch(problem, direction, x.size, arrays[1].size, arrays)


def _tiling(problem, direction):
    """(tile rows, shared bytes, x rows, windows) for the tiled kernels, or None
    when not even one row tile fits the shared-memory budget.  Forward tiles are
    output rows, backward tiles input rows (kernels/pooling.cu)."""
    (kh, kw), (sh, _), (ho, wo) = problem.window, problem.stride, problem.out_hw
    acc = _dtypes.accumulate_dtype(problem.dtype).itemsize
    is_max = problem.mode == "max"
    h, w = problem.h, problem.w

    def need(rows):
        if direction == "forward":
            x_rows = min((rows - 1) * sh + kh, h)
            return x_rows * w * acc, x_rows, 0
        windows = min(ho, (rows + kh - 2) // sh + 1) * wo
        x_rows = min(h, (windows // wo - 1) * sh + kh) if is_max else 0
        # x rows, dy per window, argmax per window, then (8-byte aligned) the covering
        # output ranges per tile row and per column
        staged = x_rows * w * acc + windows * (acc + (4 if is_max else 0))
        return ceil_div(staged, 8) * 8 + 8 * (rows + w), x_rows, windows

    total = ho if direction == "forward" else h
    if need(1)[0] > _SMEM_BUDGET:
        return None
    lo, hi = 1, total  # the largest tile that fits: need() grows with the rows
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if need(mid)[0] <= _SMEM_BUDGET else (lo, mid - 1)
    planes = problem.n * problem.c
    tiles = max(ceil_div(total, lo), min(total, ceil_div(_FILL_ITEMS, planes)))
    rows = ceil_div(total, tiles)  # balanced tiles
    return (rows, *need(rows))


def _launch_tiled(problem, direction, arrays, rows, shared, x_rows, windows):
    ho, wo = problem.out_hw
    tiles = ceil_div(ho if direction == "forward" else problem.h, rows)
    items = problem.n * problem.c * tiles
    blocks = min(items, _MAX_ITEMS_BLOCKS)
    index_t = index_type(arrays[0].size, arrays[-1].size, 2 * items)
    it = np.int32 if index_t == "int" else np.int64
    expr = (f"pool_{direction}_nchw_tiled<{_dtypes.cuda_type(problem.dtype)}, {index_t}, "
            f"{_BOOL[problem.mode == 'max']}>")
    args = (*arrays, *(it(v) for v in _scalars(problem)), np.int32(problem.count_include_pad),
            np.int32(rows), np.int32(tiles), it(items))
    if direction == "backward":
        args += (np.int32(x_rows), np.int32(windows))
    FAMILY.launch(expr, (blocks,), (_BLOCK,), args, shared_mem=shared)


def _launch_global(problem, direction, arrays):
    """Window = the whole plane: one warp per plane."""
    planes = problem.n * problem.c
    blocks = min(ceil_div(planes, _BLOCK // 32), _MAX_ITEMS_BLOCKS)
    index_t = index_type(arrays[0].size, 2 * planes + _BLOCK)
    it = np.int32 if index_t == "int" else np.int64
    expr = (f"pool_global_{direction}<{_dtypes.cuda_type(problem.dtype)}, {index_t}, "
            f"{_BOOL[problem.mode == 'max']}>")
    FAMILY.launch(expr, (blocks,), (_BLOCK,), (*arrays, it(planes), np.int32(problem.h * problem.w)))


def _scalars(problem):
    ho, wo = problem.out_hw
    return (problem.n, problem.c, problem.h, problem.w, ho, wo, *problem.window,
            *problem.stride, *problem.padding)


def _launch(problem, direction, threads, other_size, arrays):
    """One thread per output element (forward) or per input element (backward)."""
    blocks = min(ceil_div(threads, _BLOCK), _MAX_BLOCKS)
    # The grid-stride loop index reaches threads + blocks * _BLOCK before it stops.
    index_t = index_type(threads + blocks * _BLOCK, other_size)
    it = np.int32 if index_t == "int" else np.int64
    nhwc = "true" if problem.layout == "NHWC" else "false"
    expr = (f"pool_{problem.mode}_{direction}<{_dtypes.cuda_type(problem.dtype)}, {index_t}, "
            f"{nhwc}>")
    args = (*arrays, *(it(v) for v in _scalars(problem)))
    if problem.mode == "avg":
        args += (np.int32(problem.count_include_pad),)
    FAMILY.launch(expr, (blocks,), (_BLOCK,), args)
