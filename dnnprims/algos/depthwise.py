"""The "depthwise" algorithm: kernels/conv_depthwise.cu.

Depthwise convolution (groups == C, K = C * multiplier, any multiplier),
forward (with bias and every activation fused in the epilogue), backward data
and backward filter; NCHW and NHWC; every stride, padding, dilation and dtype
(float32 accumulation for the half types).  Memory-bound: so each tensor
crosses DRAM about once, the NCHW stride-1 3x3 / 5x5 "same" layers (MobileNet)
run dw_same_* (each lane a register window of 4 columns x a band of rows, 16-byte
row loads, halo columns by warp shuffles, the filter in registers; backward data
is the same kernel with the filter rotated), and 3x3 planes of at most 64 columns
dw_small_nchw (several bands of a plane per warp: halo rows by shuffles between
them too, so each input is loaded once); other NCHW problems stage the input
tile and its halo in shared memory; NHWC reads channel vectors.  Backward filter reduces
deterministically in two passes (per-block partials in a workspace, then a
fixed-order sum): no atomics.

Launch geometry (tiles, shared memory, grid) depends only on the problem, so
it is computed once per (device, problem, direction, pointer alignment) and
cached: a cached call is a dict lookup and one or two launches.
"""
import numpy as np

from .. import _dtypes
from .._kernels import ARRAY0, ARRAY1, ARRAY2, ARRAY3, KernelFamily, ceil_div, index_type
from ..activations import ACTIVATION_MODES
from . import ConvAlgorithm, register
from .implicit_gemm import activation_arguments

V = 4                      # DW_V: outputs per thread along a row (NCHW) / channels per thread (NHWC)
_THREADS = 256
SHARED_LIMIT = 48 * 1024   # bytes of dynamic shared memory without opting in
_MAX_GRID = 2**31 - 1
_MAX_GRID_Y = 65535
_TARGET_BLOCKS = 132 * 8   # enough resident blocks for an H100 (132 SMs)
_PLAN_CACHE_SIZE = 4096
_NHWC_TARGET_BLOCKS = 132 * 16  # NHWC forward / backward data: position runs per channel chunk

# (rows per lane, MINB) specialisations of the dw_same_* kernels: 2 and 4 rows
# for every dtype and size; 8 rows and the 80-register cap (MINB 3) for float32
# 3x3 only (the measured choices, notes/depthwise.md).
SAME_VARIANTS = ((2, 1), (4, 1), (8, 1), (2, 3), (4, 3))
# dw_small_nchw: 3x3 "same" planes of one row segment (W <= 64: >= 2 slots per
# warp) in forward and multiplier-1 backward data; its (rows per lane, MINB)
# specialisations, each with vector (VEC) and scalar loads for every dtype;
# the MINB > 1 ones (register caps) for float with vector loads only.
SMALL_VARIANTS = ((4, 1), (7, 1), (8, 1), (4, 4), (7, 2), (7, 3), (7, 4), (8, 3))
_SMALL_ROWS = (4, 7, 8)
SMALL_PATH = True          # False: those problems take dw_same_nchw (tests)
SMALL_THREADS = 256        # threads per block, halved (to 64) while the grid has < _SMALL_MIN_BLOCKS
SMALL_GRID_CAP = 0         # at most this many blocks (their warps loop over slots); 0: no cap
_SMALL_MIN_BLOCKS = 132 * 2
_SMALL_MAX_SLOTS = 2**30   # int slot arithmetic: base + grid step < 2 * slots + 256 < 2^31

FAMILY = KernelFamily("conv_depthwise.cu", [
    *(f"dw_forward_nchw<{t}>" for t in _dtypes.CUDA_TYPES),
    *(f"dw_backward_data_nchw<{t}, {s}>" for t in _dtypes.CUDA_TYPES for s in ("false", "true")),
    *(f"dw_backward_filter_nchw<{t}>" for t in _dtypes.CUDA_TYPES),
    *(f"dw_backward_filter_reduce<{t}>" for t in _dtypes.CUDA_TYPES),
    *(f"dw_{kernel}_nhwc<{t}, {i}, {v}>" for kernel in ("forward", "backward_data")
      for t in _dtypes.CUDA_TYPES for i in ("int", "long long") for v in (1, V)),
    *(f"dw_backward_filter_nhwc<{t}, {i}>" for t in _dtypes.CUDA_TYPES for i in ("int", "long long")),
    *(f"dw_{kernel}<{t}, {ks}, {rows}, {minb}>" for kernel in ("same_nchw", "same_filter_nchw")
      for t in _dtypes.CUDA_TYPES for ks in (3, 5) for rows, minb in SAME_VARIANTS
      if (rows, minb) in ((2, 1), (4, 1)) or (t == "float" and ks == 3)),
    *(f"dw_small_nchw<{t}, 3, {rows}, {minb}, {vec}>" for t in _dtypes.CUDA_TYPES
      for rows, minb in SMALL_VARIANTS for vec in ("false", "true") if minb == 1 or (t == "float" and vec == "true")),
])

# "Same" NCHW path (dw_same_nchw / dw_same_filter_nchw): stride 1, dilation 1,
# KS x KS filter with KS in SAME_SIZES and padding KS // 2.
SAME_SIZES = (3, 5)
SAME_THREADS = 256
# At most this many blocks for dw_same_nchw (their warps loop over bands); 0:
# one band per warp; None: one resident wave for 8 rows per lane (measured on
# the H100: mbv2_dw_112 forward 0.182 -> 0.155 ms, the warps fall out of phase
# so loads of some overlap the math and stores of others), uncapped otherwise.
SAME_GRID_CAP = None
_SAME_TARGET_WARPS = 132 * 32   # fewer warps than this: fewer rows per lane (batch 1)
_SAME_LARGE_WARPS = 132 * 64    # float32 3x3 launches at least this large take 8 rows per lane
_SAME_FILTER_TARGET_BLOCKS = 132 * 16


def is_depthwise(p):
    """groups == C: one input channel per group, K = C * multiplier filters."""
    return p.groups == p.C and p.C >= 1


def is_same_nchw(p):
    """NCHW, stride 1, dilation 1, an odd KS x KS filter of SAME_SIZES with
    padding KS // 2: every plane keeps its size (the dw_same_* kernels)."""
    return (p.layout == "NCHW" and p.stride == (1, 1) and p.dilation == (1, 1) and p.R == p.S
            and p.R in SAME_SIZES and p.padding == (p.R // 2, p.S // 2))


def same_geometry(p, rows):
    """(G, Gs, segs, spw, bands) of the dw_same_* kernels: G column groups of 4
    per row, in segs segments of at most Gs <= 32 groups (lanes), spw = 32 // Gs
    slots per warp, bands of `rows` rows per plane."""
    groups = ceil_div(p.W, 4)
    segs = ceil_div(groups, 32)
    gs = ceil_div(groups, segs)
    return groups, gs, segs, 32 // gs, ceil_div(p.H, rows)


def _same_warps(p, direction, rows):
    groups, gs, segs, spw, bands = same_geometry(p, rows)
    planes = p.N * (p.C if direction == "backward_data" else p.K)
    return ceil_div(planes * segs * bands, spw)


def is_small_nchw(p, direction):
    """Whether a "same" problem takes dw_small_nchw: 3x3, rows of at most 16
    column groups (one segment, >= 2 slots per warp), one input plane per
    output plane (forward, or backward data with multiplier 1)."""
    return (SMALL_PATH and is_same_nchw(p) and p.R == 3 and ceil_div(p.W, 4) <= 16
            and (direction == "forward" or (direction == "backward_data" and p.K == p.C))
            and p.N * p.K * p.H < _SMALL_MAX_SLOTS)


def small_variant(p, direction, vec):
    """(rows per lane, MINB) of dw_small_nchw: the rows of _SMALL_ROWS that pad
    the plane's height least (ties: more rows; 28 -> 7: a warp = one 28 x 28
    plane), float32 with vector loads under an 80-register cap (MINB 3, no
    spill with ptxas for sm_90) for 7 and 8 rows."""
    rows = min(_SMALL_ROWS, key=lambda r: (ceil_div(p.H, r) * r, -r))
    minb = 3 if p.dtype == "float32" and vec and rows in (7, 8) else 1
    return rows, minb


def same_variant(p, direction):
    """(rows per lane, MINB) of the dw_same_* launch, as measured on the H100
    (notes/depthwise.md, mbv2_dw_112 / mbv2_dw_28): float32 3x3 forward and
    backward data take 8 rows (ROWS + 2 row loads in flight per lane) on large
    launches, else 2 rows under an 80-register cap (MINB 3: 24 warps per SM);
    backward filter and the other dtypes 4 rows, halved while the launch has
    fewer than _SAME_TARGET_WARPS warps."""
    if direction != "backward_filter" and p.dtype == "float32" and p.R == 3:
        return (8, 1) if _same_warps(p, direction, 8) >= _SAME_LARGE_WARPS else (2, 3)
    rows = 4
    while rows > 2 and _same_warps(p, direction, rows) < _SAME_TARGET_WARPS:
        rows //= 2
    return rows, 1


def _one_wave_blocks(expression, threads):
    """Blocks of `threads` threads of one kernel resident on the current device
    at once, from its register count (64K registers per SM, allocated per warp
    in multiples of 8 per thread; at most 2048 threads and 32 blocks per SM)."""
    import cupy

    regs = ceil_div(min(max(getattr(FAMILY.function(expression), "num_regs", 0) or 255, 1), 255), 8) * 8
    per_sm = max(1, min(65536 // (regs * threads), 2048 // threads, 32))
    return cupy.cuda.Device().attributes["MultiProcessorCount"] * per_sm


def _pow2_at_least(n):
    v = 1
    while v < n:
        v *= 2
    return v


def _acc_size(dtype):
    return 8 if dtype == "float64" else 4


def _nchw_tile(p, direction, acc):
    """(TQT, TP, in_rows, in_cols, pitch, shared bytes, group_taps) for an NCHW
    launch, or None if no tile fits shared memory.  The tile is TP output rows
    by TQT * V columns of the plane being written (y, or dx)."""
    out_rows, out_cols = (p.H, p.W) if direction == "backward_data" else (p.P, p.Q)
    (sh, sw), (dh, dw) = p.stride, p.dilation
    mult = p.K // p.C
    tqt = min(32, _pow2_at_least(ceil_div(out_cols, V)))
    tp = min(_THREADS // tqt, max(_pow2_at_least(out_rows), 32 // tqt))
    while True:
        tq = tqt * V
        if direction == "backward_data":
            in_rows = (tp - 1 + (p.R - 1) * dh + sh - 1) // sh + 1
            in_cols = (tq - 1 + (p.S - 1) * dw + sw - 1) // sw + 1
            head = ceil_div(mult * p.R * p.S, 4) * 4
        else:
            in_rows = (tp - 1) * sh + (p.R - 1) * dh + 1
            in_cols = (tq - 1) * sw + (p.S - 1) * dw + 1
            head = ceil_div(p.R * p.S, 4) * 4
        pitch = in_cols
        if tqt < 32 and sh == 1 and direction != "backward_data":
            pitch += (tqt - in_cols) % 32    # rows of a warp start tqt banks apart
        group_taps = 0
        if direction == "backward_filter":
            tile_values = in_rows * pitch
            room = SHARED_LIMIT // acc - tile_values
            group_taps = min(p.R * p.S, room // (tqt * tp)) if room > 0 else 0
            shared = (group_taps * tqt * tp + tile_values) * acc
            fits = group_taps >= 1
        else:
            shared = (head + in_rows * pitch) * acc
            fits = shared <= SHARED_LIMIT
        if fits:
            return tqt, tp, in_rows, in_cols, pitch, shared, group_taps
        # Shrink: rows first, then the row width; threads stay a multiple of 32
        # (the filter-gradient reduction is warp per tap).
        if tp * tqt > 32:
            tp //= 2
        elif tqt > 1:
            tqt //= 2
            tp = 32 // tqt
        else:
            return None


def _nhwc_block(p, direction, vec, acc):
    """(KB, PB, shared bytes, group_taps) for an NHWC launch, or None."""
    mult = p.K // p.C
    channels = p.C if direction == "backward_data" else p.K
    if direction == "backward_filter":
        kb = min(p.K, 32)
        pb = _THREADS // kb
        group_taps = min(p.R * p.S, SHARED_LIMIT // (acc * kb * pb))
        return (kb, pb, group_taps * kb * pb * acc, group_taps) if group_taps >= 1 else None
    kb = min(ceil_div(channels, vec), 64)
    while kb >= 1:
        per_block = kb * vec * (mult if direction == "backward_data" else 1)
        shared = p.R * p.S * per_block * acc
        if shared <= SHARED_LIMIT:
            return kb, max(1, _THREADS // kb), shared, 0
        kb //= 2
    return None


def _aligned(arrays, vec, itemsize):
    return all(a.data.ptr % (vec * itemsize) == 0 for a in arrays)


class DepthwiseConvolution(ConvAlgorithm):
    """Dedicated depthwise kernels (see the module and kernel headers)."""

    name = "depthwise"
    fused_activations = frozenset(ACTIVATION_MODES)

    def __init__(self):
        self._plans = {}
        self._supported = {}   # (problem, direction) -> (ok, reason): on every call's path

    def supports(self, problem, direction):
        key = (problem, direction)
        answer = self._supported.get(key)
        if answer is None:
            answer = self._supports(problem, direction)
            if len(self._supported) >= _PLAN_CACHE_SIZE:
                self._supported.clear()
            self._supported[key] = answer
        return answer

    def _supports(self, problem, direction):
        ok, reason = super().supports(problem, direction)
        if not ok:
            return ok, reason
        p = problem
        if not is_depthwise(p):
            return False, f"it is for depthwise problems (groups == C), not groups={p.groups} with C={p.C}"
        if max(p.H * p.W, p.P * p.Q) >= 2**31:
            return False, "it indexes inside one image plane with 32-bit ints"
        acc = _acc_size(p.dtype)
        if p.layout == "NCHW":
            if _nchw_tile(p, direction, acc) is None:
                return False, "no tile of its input with halo fits 48 KiB of shared memory"
        elif _nhwc_block(p, direction, 1, acc) is None:
            return False, "its filter slice does not fit 48 KiB of shared memory"
        return True, ""

    def workspace_bytes(self, problem, direction):
        if direction != "backward_filter" or not is_depthwise(problem):
            return 0
        return problem.K * problem.R * problem.S * self._chunks(problem) * _acc_size(problem.dtype)

    def _chunks(self, p):
        """Blocks per output channel in backward filter pass 1 (= partials per filter tap)."""
        acc = _acc_size(p.dtype)
        if is_same_nchw(p):
            groups, gs, segs, spw, bands = same_geometry(p, same_variant(p, "backward_filter")[0])
            warp_rounds = ceil_div(p.N * segs * bands, spw * (SAME_THREADS // 32))
            return max(1, min(warp_rounds, ceil_div(_SAME_FILTER_TARGET_BLOCKS, p.K), _MAX_GRID_Y))
        if p.layout == "NCHW":
            tqt, tp = _nchw_tile(p, "backward_filter", acc)[:2]
            items = p.N * ceil_div(p.P, tp) * ceil_div(p.Q, tqt * V)
            channel_blocks = p.K
        else:
            kb, pb = _nhwc_block(p, "backward_filter", 1, acc)[:2]
            items = ceil_div(p.N * p.P * p.Q, pb)
            channel_blocks = ceil_div(p.K, kb)
        return max(1, min(items, ceil_div(_TARGET_BLOCKS, channel_blocks), _MAX_GRID_Y))

    @staticmethod
    def _vector_ok(p, arrays):
        """Whether the 16-byte paths may run: a property of the problem and of
        the arrays' alignment (a view may start anywhere), so checked per call."""
        itemsize = np.dtype(p.dtype).itemsize
        if is_same_nchw(p):
            return p.W % 4 == 0 and _aligned(arrays, 4, itemsize)
        return (p.layout == "NHWC" and p.K == p.C and p.C % V == 0
                and _aligned(arrays, V, itemsize))

    def _plan(self, p, direction, arrays):
        return self._plan_for(p, direction, self._vector_ok(p, arrays))

    def _plan_for(self, p, direction, vec_ok):
        import cupy

        key = (cupy.cuda.runtime.getDevice(), p, direction, vec_ok)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._make_plan(p, direction, vec_ok)
            if len(self._plans) >= _PLAN_CACHE_SIZE:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    def _make_plan(self, p, direction, vec_ok):
        """(launches, workspace values): launches are (expression, grid, block,
        shared bytes, scalars), the arrays are added at run time."""
        t = _dtypes.cuda_type(p.dtype)
        acc = _acc_size(p.dtype)
        i32, i64 = np.int32, np.int64
        mult = p.K // p.C
        geometry = (i32(p.C), i32(p.H), i32(p.W), i32(p.K), i32(p.R), i32(p.S), i32(p.P), i32(p.Q),
                    i32(p.stride[0]), i32(p.stride[1]), i32(p.padding[0]), i32(p.padding[1]),
                    i32(p.dilation[0]), i32(p.dilation[1]), i32(mult))
        filter_total = p.K * p.R * p.S
        if is_same_nchw(p):
            return self._same_plan(p, direction, vec_ok, t)
        if p.layout == "NCHW":
            tqt, tp, in_rows, in_cols, pitch, shared, group_taps = _nchw_tile(p, direction, acc)
            out_rows, out_cols = (p.H, p.W) if direction == "backward_data" else (p.P, p.Q)
            tiles_c = ceil_div(out_cols, tqt * V)
            tiles = ceil_div(out_rows, tp) * tiles_c
            tile_args = (i32(tiles_c), i32(tiles), i32(in_rows), i32(in_cols), i32(pitch))
            if direction == "backward_filter":
                chunks = self._chunks(p)
                launches = [(f"dw_backward_filter_nchw<{t}>", (p.K, chunks), (tqt, tp), shared,
                             (i32(p.N), *geometry, *tile_args, i32(group_taps)))]
                return launches + [self._reduce(t, filter_total, chunks)], filter_total * chunks
            planes = p.N * (p.C if direction == "backward_data" else p.K)
            grid = (min(planes * tiles, _MAX_GRID),)
            if direction == "forward":
                expr = f"dw_forward_nchw<{t}>"
            else:
                expr = f"dw_backward_data_nchw<{t}, {'true' if p.stride != (1, 1) else 'false'}>"
            return [(expr, grid, (tqt, tp), shared, (*geometry, i64(planes), *tile_args))], 0
        # NHWC: vector loads where the filter slice of V channels a lane fits the
        # shared memory too (supports() only checked one channel a lane)
        vec = V if vec_ok and _nhwc_block(p, direction, V, acc) is not None else 1
        # Headroom: a position loop index may step up to 256 * 65535 past the last position.
        slack = _THREADS * _MAX_GRID_Y
        index_t = index_type(p.N * p.H * p.W * p.C + slack, p.N * p.P * p.Q * p.K + slack)
        itype = i32 if index_t == "int" else i64
        kb, pb, shared, group_taps = _nhwc_block(p, direction, vec, acc)
        if direction == "backward_filter":
            positions = p.N * p.P * p.Q
            chunks = self._chunks(p)
            launches = [(f"dw_backward_filter_nhwc<{t}, {index_t}>", (ceil_div(p.K, kb), chunks), (kb, pb),
                         shared, (*geometry, itype(positions), i32(group_taps)))]
            return launches + [self._reduce(t, filter_total, chunks)], filter_total * chunks
        positions = p.N * (p.H * p.W if direction == "backward_data" else p.P * p.Q)
        channels = p.C if direction == "backward_data" else p.K
        per_block = pb * ceil_div(positions, pb * _NHWC_TARGET_BLOCKS)
        grid = (ceil_div(positions, per_block), ceil_div(channels, kb * vec))
        return [(f"dw_{direction}_nhwc<{t}, {index_t}, {vec}>", grid, (kb, pb), shared,
                 (*geometry, itype(positions), itype(per_block)))], 0

    def _same_plan(self, p, direction, vec_ok, t):
        i32 = np.int32
        rows, minb = same_variant(p, direction)
        groups, gs, segs, spw, bands = same_geometry(p, rows)
        mult = p.K // p.C
        tail = (i32(groups), i32(gs), i32(segs), i32(bands))
        if direction == "backward_filter":
            chunks = self._chunks(p)
            slots = p.N * segs * bands
            filter_total = p.K * p.R * p.S
            launches = [(f"dw_same_filter_nchw<{t}, {p.R}, {rows}, {minb}>", (p.K, chunks), (SAME_THREADS,), 0,
                         (i32(p.C), i32(p.K), i32(p.H), i32(p.W), i32(mult), *tail, np.int64(slots),
                          i32(vec_ok)))]
            return launches + [self._reduce(t, filter_total, chunks)], filter_total * chunks
        if direction == "forward":   # out plane (n, k) <- in plane (n, k // mult), filter k
            cin, cout, terms, div, flip = p.C, p.K, 1, mult, 0
        else:                        # dx plane (n, c) <- dy planes (n, c * mult + j), filters rotated
            cin, cout, terms, div, flip = p.K, p.C, mult, 1, 1
        if is_small_nchw(p, direction):
            return self._small_plan(p, direction, vec_ok, t, cin, cout, div, flip)
        slots = p.N * cout * segs * bands
        warps = SAME_THREADS // 32
        expr = f"dw_same_nchw<{t}, {p.R}, {rows}, {minb}>"
        cap = SAME_GRID_CAP
        if cap is None:
            cap = _one_wave_blocks(expr, SAME_THREADS) if rows == 8 else 0
        grid = (min(ceil_div(slots, spw * warps), cap or _MAX_GRID, _MAX_GRID),)
        return [(expr, grid, (SAME_THREADS,), 0,
                 (i32(cin), i32(cout), i32(p.H), i32(p.W), i32(terms), i32(div), i32(flip), *tail,
                  np.int64(slots), i32(vec_ok)))], 0

    @staticmethod
    def _small_plan(p, direction, vec_ok, t, cin, cout, div, flip):
        i32 = np.int32
        rows, minb = small_variant(p, direction, vec_ok)
        groups, bands = ceil_div(p.W, 4), ceil_div(p.H, rows)
        spw = 32 // groups
        slots = p.N * cout * bands
        warps = ceil_div(slots, spw)
        threads = SMALL_THREADS
        while threads > 64 and ceil_div(warps * 32, threads) < _SMALL_MIN_BLOCKS:
            threads //= 2
        grid = (min(ceil_div(warps * 32, threads), SMALL_GRID_CAP or _MAX_GRID, _MAX_GRID),)
        expr = f"dw_small_nchw<{t}, 3, {rows}, {minb}, {'true' if vec_ok else 'false'}>"
        return [(expr, grid, (threads,), 0,
                 (i32(cin), i32(cout), i32(p.H), i32(p.W), i32(div), i32(flip), i32(groups), i32(bands),
                  i32(slots)))], 0

    @staticmethod
    def _reduce(t, filter_total, chunks):
        grid = (min(ceil_div(filter_total, _THREADS), 65535 * 8),)
        return (f"dw_backward_filter_reduce<{t}>", grid, (_THREADS,), 0,
                (np.int64(filter_total), np.int32(chunks)))

    def _prepare_launches(self, p, direction, vec_ok, has_bias, activation):
        """The plan's launches as prepared launches, and the partials' length.

        The call's arrays: ARRAY0 = a, ARRAY1 = b, ARRAY2 = out, ARRAY3 = bias
        (forward; b stands in for an absent bias, which the kernel does not
        read) or the backward filter's per-chunk partials."""
        launches, workspace = self._plan_for(p, direction, vec_ok)
        alpha_type = np.float64 if p.dtype == "float64" else np.float32
        expr, grid, block, shared, scalars = launches[0]
        if direction == "forward":
            act_mode, act_alpha = activation_arguments(activation, alpha_type)
            args = (ARRAY0, ARRAY1, ARRAY3 if has_bias else ARRAY1, np.int32(has_bias),
                    act_mode, act_alpha, ARRAY2, *scalars)
        elif direction == "backward_data":
            if is_same_nchw(p):   # the shared kernel with the filter rotated, no epilogue
                args = (ARRAY0, ARRAY1, ARRAY1, np.int32(0), np.int32(-1), alpha_type(0.0), ARRAY2, *scalars)
            else:
                args = (ARRAY0, ARRAY1, ARRAY2, *scalars)
        else:
            args = (ARRAY0, ARRAY1, ARRAY3, *scalars)
        prepared = [FAMILY.prepare(expr, grid, block, args, shared)]
        if direction == "backward_filter":
            expr, grid, block, shared, scalars = launches[1]
            prepared.append(FAMILY.prepare(expr, grid, block, (ARRAY3, ARRAY2, *scalars), shared))
        return prepared, workspace

    def prepare(self, problem, direction, has_bias=False, activation=None):
        import cupy

        p = problem
        by_alignment = {}
        partial_dtype = np.float64 if p.dtype == "float64" else np.float32
        # _vector_ok with its per-problem part worked out once: the 16-byte paths
        # need every pointer aligned to `unit` bytes (a power of two)
        itemsize = np.dtype(p.dtype).itemsize
        if is_same_nchw(p):
            possible, unit = p.W % 4 == 0, 4 * itemsize
        else:
            possible, unit = p.layout == "NHWC" and p.K == p.C and p.C % V == 0, V * itemsize
        misaligned = unit - 1

        def run(a, b, out, bias=None):
            vec_ok = possible and not ((a.data.ptr | b.data.ptr | out.data.ptr) & misaligned)
            entry = by_alignment.get(vec_ok)
            if entry is None:
                entry = by_alignment[vec_ok] = self._prepare_launches(p, direction, vec_ok, has_bias, activation)
            launches, workspace = entry
            if direction == "backward_filter":
                bias = cupy.empty(workspace, dtype=partial_dtype)
            for launch in launches:
                launch(a, b, out, bias)
            return out
        return run

    def run(self, problem, direction, a, b, out, bias=None, activation=None):
        return self.prepared(problem, direction, bias is not None, activation)(a, b, out, bias)


DEPTHWISE = register(DepthwiseConvolution())
