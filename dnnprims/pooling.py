"""2-D max and average pooling, forward and backward (PyTorch semantics).

NumPy arrays run ``dnnprims.reference.pooling``; CuPy arrays run
``kernels/pooling.cu``.  See the reference module for the exact rules (the
max tie and NaN rule, the average divisor).
"""
from dataclasses import dataclass

import numpy as np

from . import _dtypes, _kernels, _validate
from ._kernels import KernelFamily, ceil_div, index_type
from .reference import pooling as reference

MODES = ("max", "avg")
LAYOUTS = ("NCHW", "NHWC")

_BOOL = ("false", "true")
_ITEMSIZE = {"half_t": 2, "bfloat16_t": 2, "float": 4, "double": 8}
# Output rows per forward thread and input row pairs per backward thread, by
# element size: as many as keep the unrolled tile in registers.
# Measured on the H100 (notes/pool.md): forward R = 1 / 2 / 4 took 0.0665 / 0.0710 /
# 0.0930 ms on max3x3s2_big_f16, 0.0527 / 0.0461 / 0.0468 on r50_maxpool (float32);
# backward R = 1 / 2: 0.232 / 0.311 (float16), 0.104 / 0.0997 (r50, float32).  The float16
# forward on packed pairs (notes/pool3.md): R = 1 / 2 / 4 0.0460 / 0.0469 / 0.0475 ms.
# The 16-bit backward runs on packed pairs for R = 1 only (k3s2_max_backward_pairs:
# 0.126 ms on max3x3s2_big_f16, notes/pool4.md, 0.107 at 3 blocks per SM, notes/pool5.md;
# R = 2 keeps the scalar argmax).
_K3S2_FORWARD_ROWS = {2: 1, 4: 2, 8: 2}
_K3S2_BACKWARD_ROWS = {2: 1, 4: 2, 8: 2}
_K3S2_FORWARD_ROWS_CHOICES = (1, 2, 4)
_K3S2_BACKWARD_ROWS_CHOICES = (1, 2)
_K2S2_ROWS = 4  # output rows per thread of pool_k2s2_avg_backward
# NHWC 3x3 / 2 / 1 (pool_nhwc_k3s2_*): output rows per forward thread and input
# row pairs per backward thread, by element size, and output columns per thread
# by direction (a thread walks `cols` columns; a segment seam re-loads one column).
# Measured on the H100 (notes/pool3.md, 64x56x56x256): forward R = 1 / 2 0.094 /
# 0.097 ms float32, 0.054 / 0.064 float16 (cols 4; 4 .. 28 within 3 % in float32);
# backward R = 1 / 2 0.194 / 0.248 (float32), 0.232 / 0.317 (float16), and cols
# 4 / 8 / 14 / 28 0.208 / 0.208 / 0.201 / 0.194 (float32, R = 1): one segment per row.
# The 16-bit backward with R = 1 runs on packed pairs (nhwc_k3s2_backward_pairs):
# 0.137 ms float16 / bfloat16 (notes/pool4.md), 0.089 with two blocks per SM
# (_NHWC_K3S2_BACKWARD_BLOCKS); cols 7 / 14 / 32 then 0.098 / 0.094 / 0.089 (16-bit),
# 0.202 / 0.200 / 0.194 (float32; notes/pool5.md).
_NHWC_K3S2_FORWARD_ROWS = {2: 1, 4: 1, 8: 1}
_NHWC_K3S2_BACKWARD_ROWS = {2: 1, 4: 1, 8: 1}
_NHWC_K3S2_ROWS_CHOICES = (1, 2)
_NHWC_K3S2_COLS = {"forward": 4, "backward": 32}  # a key (direction, size) overrides by element size
# Minimum resident blocks of 256 threads per SM (__launch_bounds__' second
# argument: caps the registers at 65536 / (256 * blocks)) of the R = 1 max
# backward kernels, by element size (R = 2 keeps 1: it would spill); every
# choice is compiled so the tables can be re-measured (notes/pool5.md).
# Measured on the H100 (notes/pool5.md, 64x256x56x56 / 64x56x56x256, ms for
# MINB = 1 / 2 / 3): NCHW float16 0.127 / 0.127 / 0.107 (109 / 105 / 80 registers,
# 104 bytes of spill at 3); NHWC float16 (cols 32) 0.136 / 0.089 / 0.175, float32
# 0.269 / 0.194 / 0.480 (MINB = 1 lets ptxas take 139-161 registers: one block per SM).
# bfloat16 as float16.  float64 NHWC: 2 keeps it at 128 registers (2 blocks), as
# before the tables (not timed); NCHW float32 / float64 run R = 2 (MINB 1).
_K3S2_BACKWARD_BLOCKS = {2: 3, 4: 1, 8: 1}
_NHWC_K3S2_BACKWARD_BLOCKS = {2: 2, 4: 2, 8: 2}
_BACKWARD_BLOCKS_CHOICES = (1, 2, 3)
# NCHW float16 / bfloat16 max 3x3 / 2 / 1 backward rolling down the plane
# (pool_k3s2_backward_rolled <T, index_t, S, MINB>, sm_90+: packed compares):
# S steps of two window rows a thread, MINB blocks of 256 per SM.
# ROLLED_BACKWARD = False keeps pool_k3s2_backward (tests, benchmarks).
# Measured on the H100 (notes/poolbwd.md, 64x256x56x56 float16, ms for MINB =
# 1 / 2 / 3; 99 registers, 80 with 20 bytes of spill at 3): S = 2 0.0967 / 0.0967 /
# 0.1100, S = 4 0.0990 / 0.0998 / 0.1323, S = 7 0.1053 / 0.1056 / 0.1352 (dropped);
# bfloat16 S = 2 0.0964 / 0.0961 / 0.0984; pool_k3s2_backward 0.1065 (MINB 3).
# Those figures are before the tail step lost its own load phase (notes/maxpool16.md:
# S = 1 added, 117 registers at MINB 2; the A/B there picks the table).
ROLLED_BACKWARD = True
_ROLLED_STEPS = 2
_ROLLED_BLOCKS = 2
_ROLLED_STEPS_CHOICES = (1, 2, 4)
_ROLLED_BLOCKS_CHOICES = (2, 3)  # 1 = 2 since the tail change: 117-123 registers, two blocks
# _ROLLED_HINT: the x rows loaded with the L2 prefetch-size hint .L2::256B (compiled
# for MINB = _ROLLED_HINT_BLOCKS only).  notes/maxpool16.md.
_ROLLED_HINT = False
_ROLLED_HINT_BLOCKS = 2
# _ROLLED_WAVES: None, one thread an item; else a grid of at most max(1, int(waves x SMs
# x MINB)) blocks (that many waves of resident blocks; the kernel strides over the other
# items).  The A/B of notes/maxpool16.md times 1 / 2 / 4 waves against None.
_ROLLED_WAVES = None
# ROLLED_SHARES_HALF / ROLLED_SHARES_BFLOAT16: the kernel's SHARES by type (kernels/pooling.cu):
# 0 = main's fast path (a branch a window), 1 = pairwise first-max shares and one branch a
# step, 2 = 1 with bfloat16's high halves converted on the FMA pipe (bfloat16 only).  1 and 2
# are compiled for MINB = 2 without the hint and S in _ROLLED_SHARES_STEPS; other settings
# run 0.  ROLLED_BFLOAT16: None, or (steps, waves) overriding _ROLLED_STEPS / _ROLLED_WAVES
# for bfloat16.  All are in the call keys (the A/B times them in one process).  The same dx
# bit for bit.  SASS and the H100 A/B: notes/poolbf16.md.
ROLLED_SHARES_HALF = 0
ROLLED_SHARES_BFLOAT16 = 1
ROLLED_BFLOAT16 = None
_ROLLED_SHARES_CHOICES = {"half_t": (0, 1), "bfloat16_t": (0, 1, 2)}
_ROLLED_SHARES_STEPS = (1, 2)  # S compiled with SHARES 1 and 2
# NHWC float32 max 3x3 / 2 / 1 backward with window rows exchanged by warp
# shuffles (pool_nhwc_k3s2_backward_shfl <T, index_t, SLOTS, MINB>): SLOTS
# vertically adjacent bands a warp (SLOTS - 1 own dx rows), MINB blocks per SM.
# SHUFFLE_BACKWARD = False keeps pool_nhwc_k3s2_backward (tests, benchmarks).
# Measured on the H100 (notes/poolbwd.md, 64x56x56x256 float32, cols 32, ms for
# MINB = 1 / 2 / 3): SLOTS = 8 0.1899 / 0.1776 / 0.2489 (93 / 92 / 80 registers),
# SLOTS = 4 0.2083 / 0.1987 / 0.1975; pool_nhwc_k3s2_backward 0.1952 (MINB 2).
SHUFFLE_BACKWARD = True
_SHFL_SLOTS = 8
_SHFL_BLOCKS = 2
_SHFL_SLOTS_CHOICES = (4, 8)
_SHFL_BLOCKS_CHOICES = (1, 2, 3)
# NCHW float32 max 3x3 / 2 / 1 backward walking down the plane one window row a step
# (pool_k3s2_backward_walk <T, index_t, S, MINB, PF>, kernels/pooling.cu): S window rows a
# thread, MINB blocks of 256 per SM, PF = the next step's loads issued before this step's
# arithmetic.  Registers (NVRTC 13.0, sm_90, S 4): PF 64 at MINB 4 / 71 at 3, no PF 56 / 60,
# no spill (the R = 2 tile: 99, two blocks).  WALK_BACKWARD = False keeps pool_k3s2_backward
# (tests, the A/B); it is in the call keys.  dx bitwise pool_k3s2_backward's.  notes/mpbwd.md.
# H100 A/B (session 11), device ms old -> S 2 / S 4 (MINB 4, PF): 64x256x56x56 0.1722 ->
# 0.1617 / 0.1708 (0.946 of copy), 32x64x112x112 0.0882 -> 0.0842 / 0.0873, 32x96x57x60
# 0.0400 -> 0.0401 / 0.0402; S 8, MINB 3 and no PF slower.  (The NHWC shfl kernel with a
# step of loads ahead or 2 channels a lane measured 1.00x / 0.76-0.91x: not kept.)
WALK_BACKWARD = True
_WALK_STEPS = 2
_WALK_BLOCKS = 4
_WALK_PREFETCH = True
_WALK_STEPS_CHOICES = (2, 4, 8)
_WALK_BLOCKS_CHOICES = (3, 4)
# NHWC float32 max 3x3 / 2 / 1 backward walking down the image one window row a step
# (pool_nhwc_k3s2_backward_walk <T, index_t, SLOTS, S, MINB, PF>, kernels/pooling.cu): a
# warp is SLOTS window columns x 32 / SLOTS channel vectors, the right neighbour's window
# by shuffles (SLOTS 8: 64 bytes of a pixel a slot, 7 owned; 4: 128 bytes, whole lines, 3
# owned); S window rows a thread, MINB blocks of 256 per SM, PF = the next step's loads
# issued before this step's arithmetic.  Registers (NVRTC 13.0, sm_90, S 2): no PF 64 at
# MINB 4 / 72 at 3, PF 96 at MINB 2, no spill (PF at MINB 3 / 4 spills: not compiled); the
# shfl kernel: 92, two blocks.  Taken when SHUFFLE_BACKWARD and NHWC_WALK_BACKWARD (C a
# multiple of 128 / SLOTS); False keeps pool_nhwc_k3s2_backward_shfl (tests, the A/B); in
# the call keys.  dx bitwise the shfl kernel's.  notes/mpnhwc.md.  H100 A/B (session 11,
# call 7), device ms shfl -> walk (SLOTS 8, S 2, MINB 4): 64x56x56x256 0.1788 -> 0.1720
# (0.90 of copy), 32x57x45x96 0.0441 -> 0.0351, 32x112x112x64 0.0938 -> 0.0897; S 1 / 4,
# MINB 3, PF and SLOTS 4 slower on the bench row.
NHWC_WALK_BACKWARD = True
_NHWC_WALK_SLOTS = 8
_NHWC_WALK_STEPS = 2
_NHWC_WALK_BLOCKS = 4
_NHWC_WALK_PREFETCH = False
_NHWC_WALK_SLOTS_CHOICES = (4, 8)
_NHWC_WALK_STEPS_CHOICES = (1, 2, 4)
_NHWC_WALK_COMPILED = ((4, False), (3, False), (2, True))  # (MINB, PF) compiled for every SLOTS and S
# (kernels pool_k3s2_*)
FAMILY = KernelFamily("pooling.cu", [
    *(f"pool_{mode}_{direction}<{t}, {i}, {nhwc}>"
      for mode in MODES for direction in ("forward", "backward")
      for t in _dtypes.CUDA_TYPES for i in ("int", "long long") for nhwc in _BOOL),
    # NCHW fast paths: template <T, index_t, bool MAX>
    *(f"pool_{kind}_{direction}<{t}, {i}, {is_max}>"
      for kind, direction in (("backward", "nchw_tiled"),
                              ("global", "forward"), ("global", "backward"))
      for t in _dtypes.CUDA_TYPES for i in ("int", "long long") for is_max in _BOOL),
    *(f"pool_global_avg_forward_small<{t}, {i}>"
      for t in ("half_t", "bfloat16_t", "float") for i in ("int", "long long")),
    # Direct paths (v3): NCHW rows <T, MAX, CASE>, NHWC <T, index_t, MAX, VEC>
    *(f"pool_rows_{direction}<{t}, {is_max}, {case}>"
      for direction in ("forward", "backward") for t in _dtypes.CUDA_TYPES for is_max in _BOOL
      for case in (0, 1, 2)),
    *(f"pool_nhwc_{direction}<{t}, {i}, {is_max}, {v}>"
      for direction in ("forward", "backward") for t in _dtypes.CUDA_TYPES
      for i in ("int", "long long") for is_max in _BOOL for v in sorted({1, 16 // _ITEMSIZE[t]})),
    # NCHW 3x3 / 2 / 1, vectorised: forward <T, index_t, MAX, R>, backward (max) <T, index_t, R, MINB>
    # (every R of _K3S2_*_ROWS_CHOICES, so the tables can be re-measured)
    *(f"pool_k3s2_forward<{t}, {i}, {is_max}, {r}>"
      for t in _dtypes.CUDA_TYPES for i in ("int", "long long") for is_max in _BOOL
      for r in _K3S2_FORWARD_ROWS_CHOICES),
    *(f"pool_k3s2_backward<{t}, {i}, {r}, {b}>"
      for t in _dtypes.CUDA_TYPES for i in ("int", "long long") for r in _K3S2_BACKWARD_ROWS_CHOICES
      for b in (_BACKWARD_BLOCKS_CHOICES if r == 1 else (1,))),
    *(f"pool_k3s2_backward_rolled<{t}, {i}, {s}, {b}, {h}, 0>"
      for t in ("half_t", "bfloat16_t") for i in ("int", "long long") for s in _ROLLED_STEPS_CHOICES
      for b in _ROLLED_BLOCKS_CHOICES for h in (("false", "true") if b == _ROLLED_HINT_BLOCKS else ("false",))),
    *(f"pool_k3s2_backward_rolled<{t}, {i}, {s}, {_ROLLED_HINT_BLOCKS}, false, {k}>"
      for t, ks in _ROLLED_SHARES_CHOICES.items() for i in ("int", "long long") for s in _ROLLED_SHARES_STEPS
      for k in ks if k > 0),
    *(f"pool_k3s2_backward_walk<float, {i}, {s}, {b}, {pf}>"
      for i in ("int", "long long") for s in _WALK_STEPS_CHOICES for b in _WALK_BLOCKS_CHOICES for pf in _BOOL),
    *(f"pool_k2s2_avg_backward<{t}, {i}, {_K2S2_ROWS}>"
      for t in _dtypes.CUDA_TYPES for i in ("int", "long long")),
    # NHWC 3x3 / 2 / 1, column-rolling: forward <T, index_t, MAX, R>, backward (max) <T, index_t, R, MINB>
    *(f"pool_nhwc_k3s2_forward<{t}, {i}, {is_max}, {r}>"
      for t in _dtypes.CUDA_TYPES for i in ("int", "long long") for is_max in _BOOL
      for r in _NHWC_K3S2_ROWS_CHOICES),
    *(f"pool_nhwc_k3s2_backward<{t}, {i}, {r}, {b}>"
      for t in _dtypes.CUDA_TYPES for i in ("int", "long long") for r in _NHWC_K3S2_ROWS_CHOICES
      for b in (_BACKWARD_BLOCKS_CHOICES if r == 1 else (1,))),
    *(f"pool_nhwc_k3s2_backward_shfl<float, {i}, {s}, {b}>"
      for i in ("int", "long long") for s in _SHFL_SLOTS_CHOICES for b in _SHFL_BLOCKS_CHOICES),
    *(f"pool_nhwc_k3s2_backward_walk<float, {i}, {k}, {s}, {b}, {_BOOL[pf]}>"
      for i in ("int", "long long") for k in _NHWC_WALK_SLOTS_CHOICES for s in _NHWC_WALK_STEPS_CHOICES
      for b, pf in _NHWC_WALK_COMPILED),
    *(f"pool_global_avg_backward_flat<{t}, {i}>"
      for t in _dtypes.CUDA_TYPES for i in ("int", "long long"))])

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


def _check_problem(x, window, mode, stride, padding, count_include_pad, layout):
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
    if h == 0 or w == 0:  # (windows of padding only: PyTorch refuses them too)
        raise ValueError(f"x must have a non-zero height and width, got shape {tuple(x.shape)} ({layout})")
    for size, k, p, axis in zip((h, w), window, padding, ("height", "width")):
        if size + 2 * p < k:
            raise ValueError(f"window {window} is larger than the padded input "
                             f"({axis} {size} + 2 * padding {p})")
    return PoolProblem(n, c, h, w, window, stride, padding, mode, bool(count_include_pad),
                       layout, np.dtype(x.dtype))


# Validated GPU calls (see _validate.CallMemo): the problem and its launches,
# so a repeated call is a key, a look-up, the output allocation and the launch.
# _MEMO.fast: the fast path's table (CallMemo.fast), checked first: (x's shape,
# dtype, device, [dy's, y's,] the current device, the options) of a call whose
# options are plain ints / pairs of ints / None and whose arrays are
# C-contiguous and 16-byte aligned -> (output slot, prepared launch) forward,
# (prepared launch, output slot) backward.  Made by
# the validated path, so anything that differs misses and is validated.
_MEMO = _validate.CallMemo()
_NDARRAY = _validate.NDARRAY
_current_device = _validate.current_device


def _options(window, mode, stride, padding, count_include_pad, layout):
    """The memo's option values; a tuple option also records its items' types
    (so a cached (2, 1) never admits (2, True), which validation refuses)."""
    options = (window, mode, stride, padding, count_include_pad, layout)
    if type(window) is tuple or type(stride) is tuple or type(padding) is tuple:
        options += tuple(tuple(map(type, v)) if type(v) is tuple else None
                         for v in (window, stride, padding))
    return options


def _plain(v):
    """An option the fast key may hold as itself: None, an int, a pair of ints
    (exact types: ``True``, ``2.0`` or ``(2, True)`` would equal an int key)."""
    t = type(v)
    return t is int or v is None or (t is tuple and len(v) == 2 and type(v[0]) is int
                                     and type(v[1]) is int)


def _fast_key(x, window, mode, stride, padding, count_include_pad, layout, *others):
    """The fast table's key, or None when the call cannot take the fast path
    (``others``: dy's and y's parts of a backward key)."""
    if (type(x) is not _NDARRAY or not x._c_contiguous or type(count_include_pad) is not bool
            or not (_plain(window) and _plain(stride) and _plain(padding))):
        return None
    data = x.data
    if data.ptr & 15:
        return None
    return (x.shape, x.dtype, data.device_id, *others, _current_device(), window, mode, stride, padding,
            count_include_pad, layout, ROLLED_SHARES_HALF, ROLLED_SHARES_BFLOAT16, ROLLED_BFLOAT16,
            WALK_BACKWARD, _WALK_STEPS, _WALK_BLOCKS, _WALK_PREFETCH, NHWC_WALK_BACKWARD, _NHWC_WALK_SLOTS,
            _NHWC_WALK_STEPS, _NHWC_WALK_BLOCKS, _NHWC_WALK_PREFETCH)


class _Call:
    """One validated kind of GPU call: the problem, the output shape, whether
    there is any work, and per (direction, 16-byte alignment of the arrays) its
    launch (a callable of the arrays: x, y forward; x, dy, dx backward)."""
    __slots__ = ("problem", "y_shape", "empty", "launches")

    def __init__(self, problem):
        self.problem = problem
        self.y_shape = problem.y_shape
        self.empty = 0 in problem.x_shape or 0 in self.y_shape
        self.launches = {}

    def launch(self, direction, aligned):
        key = (direction, aligned)
        launch = self.launches.get(key)
        if launch is None:
            plan = _make_plan(self.problem, direction, aligned)
            launch = self.launches[key] = _resolve(plan, direction)
        return launch

    def run(self, direction, arrays):
        """Run on these arrays; the launch when it may enter the fast table
        (one prepared launch, arrays aligned), else None."""
        ptr = 0
        for a in arrays:
            ptr |= a.data.ptr
        launch = self.launch(direction, not ptr & 15)
        launch(*arrays)
        return launch if not ptr & 15 and isinstance(launch, _kernels.PreparedLaunch) else None


def pool(x, window, *, mode="max", stride=None, padding=0, count_include_pad=True, layout="NCHW"):
    """Max or average pooling of a 4-D tensor; ``stride=None`` means the window."""
    try:
        fast_key = _fast_key(x, window, mode, stride, padding, count_include_pad, layout)
        fast = _MEMO.fast.get(fast_key) if fast_key is not None else None
    except TypeError:  # an unhashable option: validation says what is wrong with it
        fast_key = fast = None
    if fast is not None:
        y = fast[0]()
        if not y.data.ptr & 15:
            fast[1](x, y)
            return y
    key = _MEMO.key("pool", (x,), _options(window, mode, stride, padding, count_include_pad, layout))
    call = _MEMO.get(key)
    if call is None:
        xp = _validate.array_module(x=x)
        problem = _check_problem(x, window, mode, stride, padding, count_include_pad, layout)
        if xp is np:
            return reference.pool(x, problem.window, problem.stride, problem.padding, mode,
                                  problem.count_include_pad, layout)
        call = _MEMO.put(key, _Call(problem))
    cupy = _validate._cupy
    if not x._c_contiguous:
        x = _validate.contiguous(cupy, x)
    y = cupy.empty(call.y_shape, dtype=x.dtype)
    if not call.empty:
        launch = call.run("forward", (x, y))
        if launch is not None and fast_key is not None:
            _MEMO.put_fast(fast_key, (_kernels.OutputSlot(call.y_shape, x.dtype), launch))
    return y


def _array_key(a):
    """dy's / y's part of a backward fast key (y needs no particular layout)."""
    if a is None:
        return None
    if type(a) is _NDARRAY:
        return (a.shape, a.dtype, a.data.device_id)
    return False


def pool_backward(dy, x, y, window, *, mode="max", stride=None, padding=0, count_include_pad=True,
                  layout="NCHW"):
    """Gradient of :func:`pool` with respect to ``x``.

    ``y`` (the forward output) may be None; it is checked but not needed: max
    pooling recomputes each window's argmax from ``x``.  ``dy=None`` means a
    zero gradient."""
    fast_key = None
    if type(dy) is _NDARRAY and dy._c_contiguous and not dy.data.ptr & 15:
        try:
            fast_key = _fast_key(x, window, mode, stride, padding, count_include_pad, layout,
                                 _array_key(dy), _array_key(y))
            fast = _MEMO.fast.get(fast_key) if fast_key is not None else None
        except TypeError:
            fast_key = fast = None
        if fast is not None:
            dx = fast[1]()
            if not dx.data.ptr & 15:
                fast[0](x, dy, dx)
                return dx
    key = _MEMO.key("pool_backward", (dy, x, y),
                    _options(window, mode, stride, padding, count_include_pad, layout)
                    + (ROLLED_SHARES_HALF, ROLLED_SHARES_BFLOAT16, ROLLED_BFLOAT16, WALK_BACKWARD, _WALK_STEPS,
                       _WALK_BLOCKS, _WALK_PREFETCH, NHWC_WALK_BACKWARD, _NHWC_WALK_SLOTS, _NHWC_WALK_STEPS,
                       _NHWC_WALK_BLOCKS, _NHWC_WALK_PREFETCH))
    call = _MEMO.get(key) if dy is not None else None
    if call is None:
        xp = _validate.array_module(dy=dy, x=x, y=y)
        problem = _check_problem(x, window, mode, stride, padding, count_include_pad, layout)
        _validate.check_same_dtype(x=x, dy=dy, y=y)
        for name, a in (("dy", dy), ("y", y)):
            if a is not None:
                _validate.check_shape(name, a, problem.y_shape, "the pooling output's shape")
        if dy is None:
            return xp.zeros(x.shape, dtype=x.dtype)
        if xp is np:
            return reference.pool_backward(dy, x, problem.window, problem.stride, problem.padding,
                                           mode, problem.count_include_pad, layout)
        call = _MEMO.put(key, _Call(problem))
    cupy = _validate._cupy
    if not x._c_contiguous:
        x = _validate.contiguous(cupy, x)
    if not dy._c_contiguous:
        dy = _validate.contiguous(cupy, dy)
    dx = cupy.empty(x.shape, dtype=x.dtype)
    if not call.empty:
        launch = call.run("backward", (x, dy, dx))
        # (no entry for a y whose key part is False: a subclass of cupy.ndarray,
        # whose shape and dtype the key does not hold)
        if launch is not None and fast_key is not None and _array_key(y) is not False:
            _MEMO.put_fast(fast_key, (launch, _kernels.OutputSlot(x.shape, x.dtype)))
    return dx


def _resolve(plan, direction):
    """A callable of the arrays that runs a plan (``_make_plan``): prepared
    launches, on the current device (the memo key holds the device)."""
    A = _kernels
    kind = plan[0]
    block = (_BLOCK,)
    if kind == "launch":
        _, expr, grid, args, shared = plan
        arrays = (A.ARRAY0, A.ARRAY1) if direction == "forward" else (A.ARRAY0, A.ARRAY1, A.ARRAY2)
        return FAMILY.prepare(expr, grid, block, (*arrays, *args), shared_mem=shared)
    # "two": max backward with overlapping windows: argmax bytes, then the gather
    _, (fexpr, fgrid, fargs), (bexpr, bgrid, bargs), arg_size = plan
    forward = FAMILY.prepare(fexpr, fgrid, block, (A.ARRAY0, _NULL, A.ARRAY3, *fargs[1:]))
    backward = FAMILY.prepare(bexpr, bgrid, block, (A.ARRAY0, A.ARRAY1, A.ARRAY2, A.ARRAY3, *bargs[1:]))

    def two(x, dy, dx):
        arg = _validate._cupy.empty(arg_size, dtype=np.uint8)
        forward(x, None, None, arg)
        backward(x, dy, dx, arg)
    return two


# A null pointer argument (8 bytes of zero): "no y" / "no argmax bytes".
_NULL = np.uint64(0)


def _overlap(problem):
    return any(s < k for s, k in zip(problem.stride, problem.window))


# NCHW backward: the row-tiled kernel (measured faster on the H100: max 3x3/2
# 0.37 ms vs 0.58 for the argmax bytes + gather on max3x3s2_big) unless its tile
# does not fit shared memory; ROWS_BACKWARD = True forces the direct kernels.
ROWS_BACKWARD = False


# NCHW rows of whole 16-byte vectors: the vectorised kernels (3x3 / stride 2 /
# padding 1: pool_k3s2_* forward max and avg, backward max; 2x2 / 2 / 0:
# pool_k2s2_avg_backward).  False forces the other paths (tests, benchmarks).
VECTOR_KERNELS = True


def _make_plan(problem, direction, aligned):
    """("launch", expr, grid, scalar args, shared bytes) or ("two", forward
    (expr, grid, args), backward (expr, grid, args), argmax bytes)."""
    is_max = problem.mode == "max"
    kh, kw = problem.window
    nchw = problem.layout == "NCHW" and problem.h * problem.w < 2**31
    two = direction == "backward" and is_max and _overlap(problem)
    if problem.layout == "NCHW" and not nchw:
        return _general_plan(problem, direction)  # planes of 2^31 elements or more
    if nchw and problem.window == (problem.h, problem.w) and problem.padding == (0, 0):
        return ("launch", *_global_launch(problem, direction, aligned), 0)
    vector = (_vector_launch if nchw else _nhwc_k3s2_launch)(problem, direction, aligned)
    if vector is not None:
        return ("launch", *vector, 0)
    if nchw and direction == "backward" and (not ROWS_BACKWARD or (two and kh * kw > 256)):
        tiling = _tiling(problem, direction)
        if tiling is not None:
            return ("launch", *_tiled_launch(problem, direction, *tiling))
    if two and kh * kw > 256:  # the argmax byte cannot hold the position
        return _general_plan(problem, direction)
    make = _rows_launch if nchw else _nhwc_launch
    if two:
        return ("two", make(problem, "forward", aligned),
                make(problem, "backward", aligned), problem.n * problem.c * _prod(problem.out_hw))
    return ("launch", *make(problem, direction, aligned), 0)


def _vector_launch(problem, direction, aligned):
    """(expr, grid, scalar args) of the vectorised NCHW kernels -- pool_k3s2_*
    (3x3 / 2 / 1, backward max only) and pool_k2s2_avg_backward (2x2 / 2 / 0)
    -- or None when the problem is neither, W is not a multiple of a 16-byte
    vector, or an array is not 16-byte aligned."""
    t = _dtypes.cuda_type(problem.dtype)
    size = _ITEMSIZE[t]
    if not VECTOR_KERNELS or not aligned or problem.w % (16 // size) or problem.stride != (2, 2):
        return None
    ho, _ = problem.out_hw
    waves = None
    if (problem.window == (3, 3) and problem.padding == (1, 1) and direction == "backward"
            and problem.mode == "max" and size == 2 and ROLLED_BACKWARD and _packed_compares()):
        steps, waves, shares = _rolled_settings(t)
        bands = ceil_div(ho, 2 * steps)  # segments of 2 * steps window rows
        expr = (f"pool_k3s2_backward_rolled<{t}, {{}}, {steps}, {_ROLLED_BLOCKS}, "
                f"{_BOOL[_ROLLED_HINT]}, {shares}>")
    elif (problem.window == (3, 3) and problem.padding == (1, 1) and direction == "backward"
          and problem.mode == "max" and t == "float" and WALK_BACKWARD):
        bands = ceil_div(ho, _WALK_STEPS)  # segments of _WALK_STEPS window rows
        expr = (f"pool_k3s2_backward_walk<float, {{}}, {_WALK_STEPS}, {_WALK_BLOCKS}, "
                f"{_BOOL[_WALK_PREFETCH]}>")
    elif problem.window == (3, 3) and problem.padding == (1, 1):
        kernel = _k3s2_kernel(problem, direction, "pool_k3s2", _K3S2_FORWARD_ROWS, _K3S2_BACKWARD_ROWS,
                              _K3S2_BACKWARD_BLOCKS)
        if kernel is None:
            return None
        expr, bands = kernel
    elif (problem.window == (2, 2) and problem.padding == (0, 0) and direction == "backward"
          and problem.mode == "avg"):
        bands = ceil_div(problem.h, 2 * _K2S2_ROWS)
        expr = f"pool_k2s2_avg_backward<{t}, {{}}, {_K2S2_ROWS}>"
    else:
        return None
    items = problem.n * problem.c * bands * (problem.w * size // 16)
    blocks = min(ceil_div(items, _BLOCK), _MAX_ITEMS_BLOCKS)
    if expr.startswith("pool_k3s2_backward_rolled") and waves is not None:
        blocks = min(blocks, max(1, int(waves * _sm_count() * _ROLLED_BLOCKS)))
    index_t = index_type(items + blocks * _BLOCK)
    it = np.int32 if index_t == "int" else np.int64
    args = (it(items), np.int32(problem.h), np.int32(problem.w), np.int32(ho), np.int32(bands))
    if expr.startswith("pool_k3s2_forward"):
        args += (np.int32(problem.count_include_pad),)
    return expr.format(index_t), (blocks,), args


def _rolled_settings(t):
    """(steps, waves, SHARES) of pool_k3s2_backward_rolled for CUDA type t (the tables above)."""
    steps, waves = _ROLLED_STEPS, _ROLLED_WAVES
    if t == "bfloat16_t" and ROLLED_BFLOAT16 is not None:
        steps, waves = ROLLED_BFLOAT16
    shares = ROLLED_SHARES_BFLOAT16 if t == "bfloat16_t" else ROLLED_SHARES_HALF
    if (shares not in _ROLLED_SHARES_CHOICES[t] or _ROLLED_BLOCKS != _ROLLED_HINT_BLOCKS or _ROLLED_HINT
            or steps not in _ROLLED_SHARES_STEPS):
        shares = 0  # compiled for two blocks per SM without the hint, S in _ROLLED_SHARES_STEPS
    return steps, waves, shares


_PACKED_COMPARES = {}
_SM_COUNTS = {}


def _sm_count():
    """Multiprocessors of the current GPU (132 without one: the H100's, for plans made on the CPU)."""
    try:
        device = _current_device()
        count = _SM_COUNTS.get(device)
        if count is None:
            count = _SM_COUNTS[device] = int(
                _validate._cupy.cuda.Device(device).attributes["MultiProcessorCount"])
        return count
    except Exception:
        return 132


def _packed_compares():
    """Whether the current GPU has the packed 16-bit compares of
    pool_k3s2_backward_rolled (sm_90+); False without a GPU."""
    try:
        device = _current_device()
        have = _PACKED_COMPARES.get(device)
        if have is None:
            cc = _validate._cupy.cuda.Device(device).compute_capability
            have = _PACKED_COMPARES[device] = int(cc) >= 90
        return have
    except Exception:
        return False


def _k3s2_kernel(problem, direction, prefix, forward_rows, backward_rows, backward_blocks):
    """(expression with "{}" for index_t, bands) of a 3x3 / 2 / 1 kernel pair
    `prefix`_forward <T, index_t, MAX, R> (R output rows a band) and
    `prefix`_backward <T, index_t, R, MINB> (max only; 2R input rows a band);
    R and (R = 1) MINB from the tables by element size.  None for average backward."""
    t = _dtypes.cuda_type(problem.dtype)
    if direction == "forward":
        rows = forward_rows[_ITEMSIZE[t]]
        return (f"{prefix}_forward<{t}, {{}}, {_BOOL[problem.mode == 'max']}, {rows}>",
                ceil_div(problem.out_hw[0], rows))
    if problem.mode == "max":
        rows = backward_rows[_ITEMSIZE[t]]
        blocks = backward_blocks[_ITEMSIZE[t]] if rows == 1 else 1
        return f"{prefix}_backward<{t}, {{}}, {rows}, {blocks}>", ceil_div(problem.h, 2 * rows)
    return None


def _nhwc_k3s2_launch(problem, direction, aligned):
    """(expr, grid, scalar args) of the column-rolling NHWC kernels pool_nhwc_k3s2_*
    (3x3 / 2 / 1; backward max only), or None when the problem is not one of
    theirs, C is not a multiple of a 16-byte vector, or an array is not aligned."""
    t = _dtypes.cuda_type(problem.dtype)
    size = _ITEMSIZE[t]
    vec = 16 // size
    if (not VECTOR_KERNELS or not aligned or problem.c % vec or problem.window != (3, 3)
            or problem.stride != (2, 2) or problem.padding != (1, 1)):
        return None
    ho, wo = problem.out_hw
    if (direction == "backward" and problem.mode == "max" and size == 4 and SHUFFLE_BACKWARD
            and NHWC_WALK_BACKWARD and problem.c % (32 // _NHWC_WALK_SLOTS * vec) == 0):
        return _nhwc_walk_launch(problem)
    lanes_per_slot = 32 // _SHFL_SLOTS  # channel vectors a warp takes per band
    if (direction == "backward" and problem.mode == "max" and size == 4 and SHUFFLE_BACKWARD
            and (problem.c // vec) % lanes_per_slot == 0):
        cols = _NHWC_K3S2_COLS.get((direction, size), _NHWC_K3S2_COLS[direction])
        segments = ceil_div(wo, cols)
        groups = ceil_div(ho, _SHFL_SLOTS - 1)
        items = problem.n * segments * groups * (problem.c // (vec * lanes_per_slot)) * 32
        blocks = min(ceil_div(items, _BLOCK), _MAX_ITEMS_BLOCKS)
        index_t = index_type(items + blocks * _BLOCK, problem.n * problem.c * max(problem.h * problem.w, ho * wo))
        it = np.int32 if index_t == "int" else np.int64
        expr = f"pool_nhwc_k3s2_backward_shfl<{t}, {index_t}, {_SHFL_SLOTS}, {_SHFL_BLOCKS}>"
        args = (it(items), *(np.int32(v) for v in (problem.c, problem.h, problem.w, ho, wo, groups, segments,
                                                    cols)))
        return expr, (blocks,), args
    kernel = _k3s2_kernel(problem, direction, "pool_nhwc_k3s2", _NHWC_K3S2_FORWARD_ROWS,
                          _NHWC_K3S2_BACKWARD_ROWS, _NHWC_K3S2_BACKWARD_BLOCKS)
    if kernel is None:
        return None
    expr, bands = kernel
    cols = _NHWC_K3S2_COLS.get((direction, size), _NHWC_K3S2_COLS[direction])
    segments = ceil_div(wo, cols)
    items = problem.n * segments * bands * (problem.c // vec)
    blocks = min(ceil_div(items, _BLOCK), _MAX_ITEMS_BLOCKS)
    index_t = index_type(items + blocks * _BLOCK, problem.n * problem.c * max(problem.h * problem.w, ho * wo))
    it = np.int32 if index_t == "int" else np.int64
    args = (it(items), *(np.int32(v) for v in (problem.c, problem.h, problem.w, ho, wo, bands, segments, cols)))
    if direction == "forward":
        args += (np.int32(problem.count_include_pad),)
    return expr.format(index_t), (blocks,), args


def _nhwc_walk_launch(problem):
    """(expr, grid, scalar args) of pool_nhwc_k3s2_backward_walk (float32, C a multiple of
    4 * 32 / SLOTS): a warp = SLOTS window columns (SLOTS - 1 owned) x 32 / SLOTS channel
    vectors, walking _NHWC_WALK_STEPS window rows."""
    ho, wo = problem.out_hw
    slots = _NHWC_WALK_SLOTS
    segments = ceil_div(ho, _NHWC_WALK_STEPS)  # segments of window rows
    groups = ceil_div(wo, slots - 1)  # groups of SLOTS - 1 owned window columns
    items = problem.n * segments * groups * (problem.c // (4 * 32 // slots)) * 32
    blocks = min(ceil_div(items, _BLOCK), _MAX_ITEMS_BLOCKS)
    index_t = index_type(items + blocks * _BLOCK, problem.n * problem.c * max(problem.h * problem.w, ho * wo))
    it = np.int32 if index_t == "int" else np.int64
    expr = (f"pool_nhwc_k3s2_backward_walk<float, {index_t}, {slots}, {_NHWC_WALK_STEPS}, "
            f"{_NHWC_WALK_BLOCKS}, {_BOOL[_NHWC_WALK_PREFETCH]}>")
    args = (it(items), *(np.int32(v) for v in (problem.c, problem.h, problem.w, ho, wo, groups, segments)))
    return expr, (blocks,), args


def _prod(pair):
    return pair[0] * pair[1]


def _geometry(problem):
    ho, wo = problem.out_hw
    return tuple(np.int32(v) for v in (problem.h, problem.w, ho, wo, *problem.window,
                                        *problem.stride, *problem.padding))


def _rows_launch(problem, direction, aligned):
    """(expr, grid, scalar args) of pool_rows_{direction}: a group of S lanes per
    row, S the smallest power of two >= the row's width (forward: half of it,
    two outputs per lane step), at most 32."""
    ho, wo = problem.out_hw
    forward = direction == "forward"
    rows = problem.n * problem.c * (ho if forward else problem.h)
    width = ceil_div(wo, 2) if forward else problem.w
    log2 = min(5, max(0, (width - 1).bit_length()))
    warps = ceil_div(rows, 32 >> log2)
    grid = (min(ceil_div(warps, _BLOCK // 32), _MAX_ITEMS_BLOCKS),)
    case = {((3, 3), (2, 2)): 1, ((2, 2), (2, 2)): 2}.get((problem.window, problem.stride), 0)
    expr = (f"pool_rows_{direction}<{_dtypes.cuda_type(problem.dtype)}, "
            f"{_BOOL[problem.mode == 'max']}, {case}>")
    # the first argument after the arrays: the argmax pointer, null unless the plan has two launches
    return expr, grid, (_NULL, np.int64(rows), *_geometry(problem),
                        np.int32(problem.count_include_pad), np.int32(log2))


def _nhwc_launch(problem, direction, aligned):
    """(expr, grid, scalar args) of pool_nhwc_{direction}: a thread per (pixel,
    VEC channels), VEC = 16 bytes when C allows it and the pointers are aligned."""
    t = _dtypes.cuda_type(problem.dtype)
    vec = 16 // _ITEMSIZE[t]
    if problem.c % vec or not aligned:
        vec = 1
    ho, wo = problem.out_hw
    pixels = problem.n * (ho * wo if direction == "forward" else problem.h * problem.w)
    total = pixels * (problem.c // vec)
    blocks = min(ceil_div(total, _BLOCK), _MAX_ITEMS_BLOCKS)
    size = problem.n * problem.c * max(problem.h * problem.w, ho * wo)
    index_t = index_type(total + blocks * _BLOCK, size)
    it = np.int32 if index_t == "int" else np.int64
    expr = f"pool_nhwc_{direction}<{t}, {index_t}, {_BOOL[problem.mode == 'max']}, {vec}>"
    return expr, (blocks,), (_NULL, it(total), np.int32(problem.c), *_geometry(problem),
                             np.int32(problem.count_include_pad))


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


def _tiled_launch(problem, direction, rows, shared, x_rows, windows):
    """(expr, grid, scalar args, shared bytes) of the row-tiled NCHW kernel."""
    ho, wo = problem.out_hw
    tiles = ceil_div(ho if direction == "forward" else problem.h, rows)
    items = problem.n * problem.c * tiles
    blocks = min(items, _MAX_ITEMS_BLOCKS)
    size = problem.n * problem.c * max(problem.h * problem.w, ho * wo)
    index_t = index_type(size, 2 * items)
    it = np.int32 if index_t == "int" else np.int64
    expr = (f"pool_{direction}_nchw_tiled<{_dtypes.cuda_type(problem.dtype)}, {index_t}, "
            f"{_BOOL[problem.mode == 'max']}>")
    args = (*(it(v) for v in _scalars(problem)), np.int32(problem.count_include_pad),
            np.int32(rows), np.int32(tiles), it(items))
    if direction == "backward":
        args += (np.int32(x_rows), np.int32(windows))
    return expr, (blocks,), args, shared


# Whole-plane average forward of planes up to this many values (and not
# float64) stages many planes per block: GLOBAL_SMALL_COUNT / _PLANES in
# kernels/pooling.cu.
GLOBAL_SMALL_COUNT = 64
GLOBAL_SMALL_PLANES = 128


def _global_launch(problem, direction, aligned):
    """(expr, grid, scalar args) of the whole-plane kernels: one warp per plane,
    a block per GLOBAL_SMALL_PLANES small planes for average forward, a thread
    per 16 bytes of dx for average backward (aligned arrays)."""
    planes = problem.n * problem.c
    count = problem.h * problem.w
    index_t = index_type(planes * count + _BLOCK * 16, 2 * planes + _BLOCK,
                         planes + _MAX_ITEMS_BLOCKS * GLOBAL_SMALL_PLANES)
    it = np.int32 if index_t == "int" else np.int64
    if direction == "backward" and problem.mode == "avg" and aligned and VECTOR_KERNELS:
        t = _dtypes.cuda_type(problem.dtype)
        total = planes * count
        vectors = ceil_div(total, 16 // _ITEMSIZE[t])
        blocks = min(ceil_div(vectors, _BLOCK), _MAX_ITEMS_BLOCKS)
        index_t = index_type(total + blocks * _BLOCK * 16)
        it = np.int32 if index_t == "int" else np.int64
        return (f"pool_global_avg_backward_flat<{t}, {index_t}>", (blocks,),
                (it(vectors), it(total), np.int32(count)))
    if (direction == "forward" and problem.mode == "avg" and count <= GLOBAL_SMALL_COUNT
            and np.dtype(problem.dtype) != np.float64):
        blocks = min(ceil_div(planes, GLOBAL_SMALL_PLANES), _MAX_ITEMS_BLOCKS)
        expr = f"pool_global_avg_forward_small<{_dtypes.cuda_type(problem.dtype)}, {index_t}>"
        return expr, (blocks,), (it(planes), np.int32(count))
    blocks = min(ceil_div(planes, _BLOCK // 32), _MAX_ITEMS_BLOCKS)
    expr = (f"pool_global_{direction}<{_dtypes.cuda_type(problem.dtype)}, {index_t}, "
            f"{_BOOL[problem.mode == 'max']}>")
    return expr, (blocks,), (it(planes), np.int32(problem.h * problem.w))


def _scalars(problem):
    ho, wo = problem.out_hw
    return (problem.n, problem.c, problem.h, problem.w, ho, wo, *problem.window,
            *problem.stride, *problem.padding)


def _general_plan(problem, direction):
    """The one-thread-per-element kernels: one thread per output element
    (forward) or per input element (backward)."""
    x_size = problem.n * problem.c * problem.h * problem.w
    y_size = problem.n * problem.c * _prod(problem.out_hw)
    threads, other_size = (y_size, x_size) if direction == "forward" else (x_size, y_size)
    blocks = min(ceil_div(threads, _BLOCK), _MAX_BLOCKS)
    # The grid-stride loop index reaches threads + blocks * _BLOCK before it stops.
    index_t = index_type(threads + blocks * _BLOCK, other_size)
    it = np.int32 if index_t == "int" else np.int64
    nhwc = "true" if problem.layout == "NHWC" else "false"
    expr = (f"pool_{problem.mode}_{direction}<{_dtypes.cuda_type(problem.dtype)}, {index_t}, "
            f"{nhwc}>")
    args = tuple(it(v) for v in _scalars(problem))
    if problem.mode == "avg":
        args += (np.int32(problem.count_include_pad),)
    return ("launch", expr, (blocks,), args, 0)
