"""Softmax and log-softmax over one axis, forward and backward (PyTorch semantics).

``softmax(x, axis)`` normalises over any axis of an array of any ndim >= 1
(negative axes count from the end); the backward functions take the forward
output ``y``, not ``x``.  NumPy arrays run :mod:`dnnprims.reference.softmaxes`;
CuPy arrays run ``kernels/softmax.cu``, which views the array as
(outer, n, inner) around the reduced axis: contiguous rows (inner == 1) are
held in registers by a warp or a block per row (one read, one write, 16-byte
accesses when aligned), other axes (such as the channel axis of NCHW) are held
by tiles of the whole axis by 8-256 consecutive inner positions, in registers
(16-byte packs of inner positions when inner allows, axis <= 512; 16-bit forward, axis
<= 1024) or shared memory; rows or axes too long for these fall back to two reads.
"""
import math

import numpy as np

from . import _dtypes, _kernels, _validate
from .reference import softmaxes as _reference

# Launch configuration (kernels/softmax.cu explains each mapping).
_ROW_PACKS = 8               # ROW_PACKS in softmax.cu: packs each thread holds per row
_MAX_ROW_THREADS = 256       # threads per row in the register kernels (their launch bound)
_WARP_ROWS_PER_BLOCK = 4     # rows per block when a warp owns a row
# Few rows (a classifier's 256 x 1000): the fewest threads a row leave most of
# the GPU idle and each thread a long serial chain (ROW_PACKS loads, exps and
# adds), so while the whole grid stays under _FILL_THREADS (an H100's resident
# threads, 132 SMs x 2048) a row gets more threads, down to SHORT_ROW_PACKS
# packs a thread, one row a block (notes/smallops.md).
SHORT_ROW_PACKS = 2
_FILL_THREADS = 132 * 2048
_ROW_BLOCK = 512             # threads per block in the block-per-row (long row) kernels
_COLUMN_BLOCK = 256          # threads per block in the column kernels
_CHANNEL_THREADS = 256       # CHANNEL_THREADS in softmax.cu: tile width x rows of threads
_TILE_BYTES = 46 * 1024      # dynamic shared memory per channel tile (48 KB less the scratch)
_CHANNEL_VALUES = 32         # CHANNEL_VALUES in softmax.cu: axis values a thread holds in registers
_MIN_PACK_WIDTH = 4          # threads along inner in *_channels_packs: >= 64 bytes a row access
_MAX_BLOCKS = 1 << 20        # grids are capped; kernels loop with a grid stride
# index_t must also hold an index plus one grid stride (the last loop step).
_STRIDE_SLACK = _MAX_BLOCKS * _ROW_BLOCK

_INDEX_TYPES = ("int", "long long")


_ITEMSIZE = {"float": 4, "double": 8, "half_t": 2, "bfloat16_t": 2}
# The channel axis in registers runs for the forward of these types only: on the
# H100 it was faster than the shared-memory tile there and slower for float and
# for backward (notes/mem_softmax.md, v2).
_REGISTER_CHANNEL_TYPES = ("half_t", "bfloat16_t")
# 16-bit channel softmax with inner even and aligned pointers: the tile kernels
# with two inner positions (one 4-byte access) per thread, by direction.
CHANNEL_PAIRS = {"forward": True, "backward": True}
# Strided axis in registers as 16-byte packs of inner positions (*_channels_packs):
# (direction, log) -> CUDA type -> (K packs a thread holds, threads a block[, MINB:
# forward only, a pair of _FORWARD_PACK_BOUNDS, 256 threads when > 1]); a type
# not listed keeps the other strided-axis kernels.  The fastest of (8|4, 256|512)
# on the H100, 64x256x56x56 (notes/softmax3.md); double is not measured: (8, 256).
# 16-bit log-softmax forward: the bounded kernels, 0.078 ms against 0.082 for (4,
# 256) and 0.088 for (8, 256) unbounded (notes/bw16.md); the softmax forward stays
# unbounded (0.0777 against 0.081 bounded), float gains nothing (0.1432-0.1437).
# 16-bit forward where the packs apply: True = softmax_forward_channels_words with the
# CHANNEL_WORDS shape (packed max, base-2 exp against a per-column offset, one FFMA + one
# ex2 a value, outputs converted in pairs; with persistent True the next tile's packs are
# copied to shared memory while this tile computes, on a grid of blocks-an-SM x SMs;
# notes/chsoft16.md);
# a (K, 256, MINB[, persistent]) tuple = that kernel with this shape (A/B, tests;
# persistent False: one tile a block, so nothing is prefetched); False =
# softmax_forward_channels_packs with CHANNEL_PACKS.  Keys the plans and the fast table.
PACKED16_FORWARD = True
# log -> CUDA type -> (K, threads (256 only), MINB[, persistent]); ptxas sm_90: (8, 3) 80
# registers without spills (MINB 4: 64 with 16-128 spilled bytes), 40 KB shared memory a
# block.  H100 A/B, 64x256x56x56 (session 10, notes/chsoft16.md): one tile a block
# (persistent False, no prefetch) 0.0737-0.0740 ms for all four 16-bit forwards against
# 0.0764-0.0770 for the packs kernel (0.91 of copy against 0.88); the persistent,
# prefetching grid 0.087-0.088 ms, (8, 4) 0.092, (4, 5) 0.095-0.102: slower.
CHANNEL_WORDS = {False: {"half_t": (8, 256, 3, False), "bfloat16_t": (8, 256, 3, False)},
                 True: {"half_t": (8, 256, 3, False), "bfloat16_t": (8, 256, 3, False)}}
_WORDS_BOUNDS = ((4, 5), (8, 3), (8, 4))  # the (K, MINB) the family declares
# float forward where the packs apply: True = softmax_forward_channels_floats with the
# CHANNEL_FLOATS shape: the packs kernel's tiles with the compute between a tile's loads
# and its stores cut from ~1380 to ~570-660 SASS instructions a thread (rows not held are
# -inf instead of a branch a slot, reductions over a constant 8 warps; with exp2 True also
# exp(x - m) = ex2.approx((x - m) log2 e) and 1 / s by rcp.approx + a Newton step -- no
# faster, so not shipped), registers capped for
# MINB blocks an SM (notes/chsoftf32.md); a (K, 256, MINB, exp2, stream) tuple = that
# kernel with these settings (A/B, tests; exp2 False: expf and the IEEE 1 / s, bitwise
# the packs kernel's results; stream True: stores with .cs, evict first); False =
# softmax_forward_channels_packs with CHANNEL_PACKS.  Keys the plans and the fast table.
FLOAT_FORWARD = True
# log -> (K, threads (256 only), MINB, exp2, stream).  ptxas sm_90 (NVRTC 13.0): MINB 3
# 78 registers, no spills (MINB 4: 64 with 36-48 spilled bytes); the packs kernel: 62
# (softmax, 4 blocks an SM) and 99 (log-softmax, 2).  H100 A/B (session 11,
# notes/chsoftf32.md), device ms old -> exp2 False (expf, bitwise the packs kernel's
# results) / exp2 True: 64x256x56x56 softmax 0.1425 -> 0.1416 / 0.1416, log-softmax
# 0.1429 -> 0.1416 / 0.1416; 64x192x28x28 softmax 0.0305 -> 0.0304 / 0.0299,
# log-softmax 0.0333 -> 0.0304 / 0.0300: the gain is the instruction cut, not the
# approximate exp, so the shipped setting keeps the exact one.
CHANNEL_FLOATS = {False: (8, 256, 3, False, False), True: (8, 256, 3, False, False)}
# The declared (K, MINB, exp2, stream); (16, 2): 16 packs a thread, so 16 rows of threads
# cover 256 channels and a tile is 16 threads (256 bytes a row) wide, 64 KB (110 / 126
# registers, 2 blocks an SM).
_FLOATS_VARIANTS = ((8, 3, True, False), (8, 4, True, False), (8, 3, False, False), (8, 3, True, True),
                    (16, 2, True, False))
_H100_SMS = 132  # the grid of a plan made without a device (CPU tests; never launched)
_SMS = {}
_PACKS_PER_THREAD = (4, 8)   # the K the family declares
# Forward (K, MINB): MINB > 1 = __launch_bounds__(256, MINB), registers capped so
# MINB blocks of 256 threads share an SM (8 packs: 64 registers, 4 blocks instead
# of the 78 registers / 3 blocks the compiler picks unbounded; 4 packs: 48, 5).
_FORWARD_PACK_BOUNDS = ((4, 1), (4, 5), (8, 1), (8, 4))
CHANNEL_PACKS = {
    ("forward", False): {"float": (8, 256), "double": (8, 256), "half_t": (8, 256), "bfloat16_t": (8, 256)},
    ("forward", True): {"float": (8, 256), "double": (8, 256), "half_t": (8, 256, 4), "bfloat16_t": (4, 256, 5)},
    ("backward", False): {"float": (8, 512), "double": (8, 256), "half_t": (8, 256), "bfloat16_t": (8, 256)},
    ("backward", True): {"float": (8, 512), "double": (8, 256), "half_t": (8, 256), "bfloat16_t": (8, 256)},
}

_DIRECTIONS = ("forward", "backward")


def _names(kernels, types, extras=lambda t: ("",)):
    """`kernel<type, index, log{extra}>` for every kernel, type, index type, log flag, extra."""
    return [f"{kernel}<{t}, {i}, {log}{extra}>" for kernel in kernels for t in types for i in _INDEX_TYPES
            for log in ("false", "true") for extra in extras(t)]


FAMILY = _kernels.KernelFamily("softmax.cu", [
    *_names([f"softmax_{d}_{m}" for d in _DIRECTIONS for m in ("rows_block", "channels", "columns")],
            _dtypes.CUDA_TYPES),
    *_names([f"softmax_{d}_channels_pairs" for d in _DIRECTIONS], _REGISTER_CHANNEL_TYPES),
    *_names(["softmax_forward_channels_packs"], _dtypes.CUDA_TYPES,
            lambda t: tuple(f", {k}, {b}" for k, b in _FORWARD_PACK_BOUNDS)),
    *_names(["softmax_forward_channels_words"], _REGISTER_CHANNEL_TYPES,
            lambda t: tuple(f", {k}, {b}" for k, b in _WORDS_BOUNDS)),
    *_names(["softmax_forward_channels_floats"], ("float",),
            lambda t: tuple(f", {k}, {b}, {str(e).lower()}, {str(c).lower()}" for k, b, e, c in _FLOATS_VARIANTS)),
    *_names(["softmax_backward_channels_packs"], _dtypes.CUDA_TYPES,
            lambda t: tuple(f", {k}" for k in _PACKS_PER_THREAD)),
    *_names(["softmax_forward_channels_registers"], _REGISTER_CHANNEL_TYPES),
    *_names([f"softmax_{d}_rows_registers" for d in _DIRECTIONS], _dtypes.CUDA_TYPES,
            lambda t: tuple(f", {vec}" for vec in sorted({1, 16 // _ITEMSIZE[t]}))),
])


def _sm_count():
    try:
        import cupy
        device = cupy.cuda.runtime.getDevice()
        sms = _SMS.get(device)
        if sms is None:
            sms = _SMS[device] = int(cupy.cuda.Device(device).attributes["MultiProcessorCount"])
        return sms
    except Exception:  # no device: a plan for inspection only
        return _H100_SMS


def _normalize_axis(axis, ndim, name="x"):
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis must be an int, got {axis!r}")
    axis = int(axis)
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for {name} with {ndim} dimension"
                         f"{'' if ndim == 1 else 's'} (expected -{ndim} <= axis < {ndim})")
    return axis % ndim


def _check_at_least_1d(name, a):
    if a.ndim < 1:
        raise ValueError(f"{name} must have at least 1 dimension, got a 0-D array")


def _view(shape, axis):
    """(outer, n, inner) sizes around the reduced axis."""
    outer = math.prod(shape[:axis])
    inner = math.prod(shape[axis + 1:])
    return outer, int(shape[axis]), inner


def _launch(direction, log, arrays, shape, axis, dtype):
    """Run one direction on contiguous CuPy arrays; the last array is the output."""
    aligned = all(a.data.ptr % 16 == 0 for a in arrays)
    plan = _cached_plan(direction, log, shape, axis, dtype, aligned)
    if plan is not None:
        expr, grid, block, scalars, shared = plan
        FAMILY.launch(expr, grid, block, (*arrays, *scalars), shared_mem=shared)


def _cached_plan(direction, log, shape, axis, dtype, aligned):
    key = (direction, log, shape, axis, dtype, aligned, PACKED16_FORWARD, FLOAT_FORWARD)
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= 4096:
            _PLANS.clear()
        plan = _PLANS[key] = _plan(direction, log, shape, axis, dtype, aligned)
    return plan


_PLANS = {}  # (direction, log, shape, axis, dtype, 16-byte aligned, PACKED16_FORWARD, FLOAT_FORWARD) -> launch,
#              or None (empty)


def _no_launch(*arrays):
    """The prepared launch of an empty problem."""


def _prepare(direction, log, shape, axis, dtype):
    """The prepared launch for 16-byte-aligned arrays on the current device."""
    plan = _cached_plan(direction, log, shape, axis, dtype, True)
    if plan is None:
        return _no_launch
    expr, grid, block, scalars, shared = plan
    arrays = (_kernels.ARRAY0, _kernels.ARRAY1) if direction == "forward" else \
        (_kernels.ARRAY0, _kernels.ARRAY1, _kernels.ARRAY2)
    return FAMILY.prepare(expr, grid, block, (*arrays, *scalars), shared_mem=shared)


def _plan(direction, log, shape, axis, dtype, aligned):
    """(expression, grid, block, scalar arguments, shared bytes) of one launch."""
    outer, n, inner = _view(shape, axis)
    size = outer * n * inner
    if size == 0:
        return None
    index_t = _kernels.index_type(size + _STRIDE_SLACK)
    itype = np.int32 if index_t == "int" else np.int64
    ctype = _dtypes.cuda_type(dtype)
    template = f"{ctype}, {index_t}, {'true' if log else 'false'}"
    itemsize = np.dtype(dtype).itemsize
    if inner == 1:
        vec = 16 // itemsize if aligned and n % (16 // itemsize) == 0 else 1
        threads = 32  # per row: the fewest (>= a warp) that hold the row in ROW_PACKS packs each
        while threads * _ROW_PACKS * vec < n and threads < _MAX_ROW_THREADS:
            threads *= 2
        if threads * _ROW_PACKS * vec >= n:
            while (threads < _MAX_ROW_THREADS and threads * SHORT_ROW_PACKS * vec < n
                   and outer * threads * 2 <= _FILL_THREADS):
                threads *= 2
            rows_per_block = _WARP_ROWS_PER_BLOCK if threads == 32 else 1
            grid = min(_kernels.ceil_div(outer, rows_per_block), _MAX_BLOCKS)
            return (f"softmax_{direction}_rows_registers<{template}, {vec}>", (grid,),
                    (threads, rows_per_block), (itype(outer), itype(n)), 0)
        return (f"softmax_{direction}_rows_block<{template}>", (min(outer, _MAX_BLOCKS),),
                (_ROW_BLOCK,), (itype(outer), itype(n)), 0)
    vec = 16 // itemsize
    # An axis of one takes the packs kernel: its softmax is 1 and log-softmax 0 exactly,
    # where the words kernel's base-2 offset (the floats kernel's ex2 / rcp.approx) leaves a
    # unit in the last place.
    words = (direction == "forward" and PACKED16_FORWARD is not False and ctype in _REGISTER_CHANNEL_TYPES
             and n > 1)
    floats = direction == "forward" and FLOAT_FORWARD is not False and ctype == "float" and n > 1
    packs_table = CHANNEL_WORDS[log] if words else {"float": CHANNEL_FLOATS[log]} if floats \
        else CHANNEL_PACKS[(direction, log)]
    if ctype in packs_table and aligned and inner % vec == 0:
        # CY rows of threads (the fewest >= 8 that hold n in K packs each, with
        # TW = threads / CY >= _MIN_PACK_WIDTH threads of VEC positions along
        # inner), TW then narrowed (CY grows) while half the tile covers inner.
        packs, threads, *bound = PACKED16_FORWARD if words and PACKED16_FORWARD is not True else \
            FLOAT_FORWARD if floats and FLOAT_FORWARD is not True else packs_table[ctype]
        blocks_per_sm = bound[0] if bound else 1
        persistent = bound[1] if len(bound) > 1 and not floats else True
        kernel = f"softmax_{direction}_channels_packs"
        if floats:
            if len(bound) != 3 or (packs, *bound) not in _FLOATS_VARIANTS or threads != 256:
                raise ValueError(f"FLOAT_FORWARD / CHANNEL_FLOATS: no kernel ({packs}, {threads}, {bound})")
            kernel = "softmax_forward_channels_floats"
            template_k = f"{packs}, {blocks_per_sm}, {str(bound[1]).lower()}, {str(bound[2]).lower()}"
        elif words:
            if (packs, blocks_per_sm) not in _WORDS_BOUNDS or threads != 256:
                raise ValueError(f"CHANNEL_WORDS: no kernel ({packs}, {threads}, {blocks_per_sm})")
            kernel = "softmax_forward_channels_words"
            template_k = f"{packs}, {blocks_per_sm}"
        elif direction == "forward":
            if (packs, blocks_per_sm) not in _FORWARD_PACK_BOUNDS or (blocks_per_sm > 1 and threads != 256):
                raise ValueError(f"CHANNEL_PACKS: no forward kernel ({packs}, {threads}, {blocks_per_sm})")
            template_k = f"{packs}, {blocks_per_sm}"
        elif blocks_per_sm != 1:
            raise ValueError(f"CHANNEL_PACKS: the backward kernel has no launch bound ({blocks_per_sm})")
        else:
            template_k = f"{packs}"
        rows_of_threads = 8
        while rows_of_threads * packs < n and rows_of_threads * _MIN_PACK_WIDTH < threads:
            rows_of_threads *= 2
        if rows_of_threads * packs >= n:
            width = min(threads // rows_of_threads, 32 * 256 // threads)
            while width > 1 and (width // 2) * vec >= inner:
                width //= 2
            tiles_per_outer = _kernels.ceil_div(inner, width * vec)
            grid = min(outer * tiles_per_outer, _MAX_BLOCKS)
            if words and persistent:  # each block prefetches its next tile
                grid = min(grid, blocks_per_sm * _sm_count())
            return (f"{kernel}<{template}, {template_k}>", (grid,),
                    (width, threads // width),
                    (itype(outer), itype(n), itype(inner), itype(tiles_per_outer)), 0)
    if CHANNEL_PAIRS[direction] and ctype in _REGISTER_CHANNEL_TYPES and inner % 2 == 0 and aligned:
        # 16-bit tile with pairs of inner positions: TW threads cover 2 TW positions.
        tiles_in = 1 if direction == "forward" else 2
        width = 32
        while width > 1 and (width >= inner or 2 * width * n * itemsize * tiles_in > _TILE_BYTES):
            width //= 2
        if 2 * width * n * itemsize * tiles_in <= _TILE_BYTES and width >= min(8, inner // 2):
            tiles_per_outer = _kernels.ceil_div(inner, 2 * width)
            grid = min(outer * tiles_per_outer, _MAX_BLOCKS)
            return (f"softmax_{direction}_channels_pairs<{template}>", (grid,),
                    (width, _CHANNEL_THREADS // width),
                    (itype(outer), itype(n), itype(inner), itype(tiles_per_outer)),
                    2 * width * n * itemsize * tiles_in)
    # Strided axis held in registers (16-bit forward): CY rows of threads hold
    # CHANNEL_VALUES values each (CY the fewest that cover n), TW = 256 / CY inner
    # positions (fewer when inner is smaller).
    rows_of_threads = 8
    while rows_of_threads * _CHANNEL_VALUES < n and rows_of_threads < 32:
        rows_of_threads *= 2
    if (direction == "forward" and ctype in _REGISTER_CHANNEL_TYPES and inner >= 8
            and rows_of_threads * _CHANNEL_VALUES >= n):
        width = _CHANNEL_THREADS // rows_of_threads
        while width > 8 and width >= 2 * inner:
            width //= 2
        tiles_per_outer = _kernels.ceil_div(inner, width)
        grid = min(outer * tiles_per_outer, _MAX_BLOCKS)
        return (f"softmax_{direction}_channels_registers<{template}>", (grid,), (width, rows_of_threads),
                (itype(outer), itype(n), itype(inner), itype(tiles_per_outer)), 0)
    # Otherwise through shared memory: the widest tile (<= 32 inner positions, a
    # power of two) whose n x width values (both inputs' for backward) fit.
    tiles_in = 1 if direction == "forward" else 2
    width = 32
    while width > 1 and (width >= 2 * inner or width * n * itemsize * tiles_in > _TILE_BYTES):
        width //= 2
    if width * n * itemsize * tiles_in <= _TILE_BYTES and width >= min(8, inner):
        tiles_per_outer = _kernels.ceil_div(inner, width)
        grid = min(outer * tiles_per_outer, _MAX_BLOCKS)
        return (f"softmax_{direction}_channels<{template}>", (grid,),
                (width, _CHANNEL_THREADS // width),
                (itype(outer), itype(n), itype(inner), itype(tiles_per_outer)),
                width * n * itemsize * tiles_in)
    grid = min(_kernels.ceil_div(outer * inner, _COLUMN_BLOCK), _MAX_BLOCKS)
    return (f"softmax_{direction}_columns<{template}>", (grid,), (_COLUMN_BLOCK,),
            (itype(outer), itype(n), itype(inner)), 0)


# Validated GPU calls: the normalised axis per kind of call (see _validate.CallMemo);
# _FAST: the fast path's table, (shapes, dtypes, devices, current device, axis,
# log[, PACKED16_FORWARD, FLOAT_FORWARD: forward]) of C-contiguous 16-byte-aligned arrays -> (prepared
# launch, output slot).
_MEMO = _validate.CallMemo()
_FAST = _MEMO.fast
_NDARRAY = _validate.NDARRAY
_current_device = _validate.current_device


def _forward(x, axis, log):
    if type(x) is _NDARRAY and type(axis) is int and x._c_contiguous:
        data = x.data
        fast = _FAST.get((x.shape, x.dtype, data.device_id, _current_device(), axis, log, PACKED16_FORWARD,
                          FLOAT_FORWARD))
        if fast is not None and not data.ptr & 15:
            y = fast[1]()
            if not y.data.ptr & 15:
                fast[0](x, y)
                return y
    key = _MEMO.key("forward", (x,), (axis, log))
    checked = _MEMO.get(key)
    if checked is None:
        xp = _validate.array_module(x=x)
        _validate.check_float_dtype("x", x)
        _check_at_least_1d("x", x)
        axis = _normalize_axis(axis, x.ndim)
        if xp is np:
            return (_reference.log_softmax if log else _reference.softmax)(x, axis)
        checked = _MEMO.put(key, axis)
    xp, normalized = _validate._cupy, checked
    if type(axis) is int and x._c_contiguous:
        fast_key = (x.shape, x.dtype, x.data.device_id, _current_device(), axis, log, PACKED16_FORWARD,
                    FLOAT_FORWARD)
        launch, output = _FAST.get(fast_key) or _MEMO.put_fast(
            fast_key, (_prepare("forward", log, x.shape, normalized, x.dtype),
                       _kernels.OutputSlot(x.shape, x.dtype)))
        y = output()
        if not (x.data.ptr | y.data.ptr) & 15:
            launch(x, y)
            return y
    x = _validate.contiguous(xp, x)
    y = xp.empty(x.shape, x.dtype)
    _launch("forward", log, (x, y), x.shape, normalized, x.dtype)
    return y


def _backward(dy, y, axis, log):
    if (type(dy) is _NDARRAY and type(y) is _NDARRAY and type(axis) is int
            and dy._c_contiguous and y._c_contiguous):
        dy_data, y_data = dy.data, y.data
        fast = _FAST.get((dy.shape, dy.dtype, dy_data.device_id, y.shape, y.dtype, y_data.device_id,
                          _current_device(), axis, log))
        if fast is not None and not (dy_data.ptr | y_data.ptr) & 15:
            dx = fast[1]()
            if not dx.data.ptr & 15:
                fast[0](dy, y, dx)
                return dx
    key = _MEMO.key("backward", (dy, y), (axis, log))
    checked = _MEMO.get(key) if dy is not None else None
    if checked is None:
        xp = _validate.array_module(dy=dy, y=y)
        _validate.check_float_dtype("y", y)
        _check_at_least_1d("y", y)
        axis = _normalize_axis(axis, y.ndim, "y")
        if dy is None:  # a zero output gradient
            return xp.zeros(y.shape, y.dtype)
        _validate.check_same_dtype(dy=dy, y=y)
        _validate.check_shape("dy", dy, y.shape, "the shape of y")
        if xp is np:
            return (_reference.log_softmax_backward if log else _reference.softmax_backward)(dy, y, axis)
        checked = _MEMO.put(key, axis)
    xp, normalized = _validate._cupy, checked
    if type(axis) is int and dy._c_contiguous and y._c_contiguous:
        fast_key = (dy.shape, dy.dtype, dy.data.device_id, y.shape, y.dtype, y.data.device_id,
                    _current_device(), axis, log)
        launch, output = _FAST.get(fast_key) or _MEMO.put_fast(
            fast_key, (_prepare("backward", log, y.shape, normalized, y.dtype),
                       _kernels.OutputSlot(y.shape, y.dtype)))
        dx = output()
        if not (dy.data.ptr | y.data.ptr | dx.data.ptr) & 15:
            launch(dy, y, dx)
            return dx
    dy, y = _validate.contiguous(xp, dy), _validate.contiguous(xp, y)
    dx = xp.empty(y.shape, y.dtype)
    _launch("backward", log, (dy, y, dx), y.shape, normalized, y.dtype)
    return dx


def softmax(x, axis=-1):
    """exp(x) / sum(exp(x)) along ``axis``, computed stably (max subtracted first)."""
    return _forward(x, axis, log=False)


def log_softmax(x, axis=-1):
    """x - logsumexp(x) along ``axis``."""
    return _forward(x, axis, log=True)


def softmax_backward(dy, y, axis=-1):
    """Gradient of :func:`softmax` given its output ``y``: ``y * (dy - sum(dy * y))``.

    ``dy=None`` stands for a zero output gradient."""
    return _backward(dy, y, axis, log=False)


def log_softmax_backward(dy, y, axis=-1):
    """Gradient of :func:`log_softmax` given its output ``y``: ``dy - exp(y) * sum(dy)``.

    ``dy=None`` stands for a zero output gradient."""
    return _backward(dy, y, axis, log=True)
