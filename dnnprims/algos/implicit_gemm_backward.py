"""Implicit-GEMM backward passes: kernels/conv_implicit_gemm_backward.cu.

"implicit_gemm_wgrad": backward filter as a GEMM over the output positions
(M = K/groups, N = C/groups*R*S, depth N*P*Q), the x operand gathered through
the forward tap table, split-K over N*P*Q so that small filters still fill the
GPU.  Splits write float partial tiles to a workspace and a second kernel adds
them in split order: the same bits on every run.  "implicit_gemm_wgrad_atomic"
is the same GEMM with the splits atomically added into one float buffer
(``deterministic = False``: ``deterministic=True`` excludes it).

"implicit_gemm_subpixel": backward data for any stride, by sub-pixel (phase)
decomposition: each of the stride_h*stride_w phases of dx is a stride-1
implicit GEMM over only the taps that reach it (no work on inserted zeros),
one launch with the phases on blockIdx.z.

float32, float16 and bfloat16 storage, float32 accumulation.  Plans (tables,
grid, scalars) are cached per (device, problem, direction).
"""
import numpy as np

from .. import _dtypes
from .._kernels import ARRAY0, ARRAY1, ARRAY2, ARRAY3, KernelFamily, OutputSlot, ceil_div
from .._validate import INT32_LIMIT
from . import ConvAlgorithm, register
from .implicit_gemm import TAP_TABLE_MULTIPLE, TILES, _OUTSIDE, coordinate_reach, tap_table

SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")

# Backward-filter tiles, name: (BM, BN, BK, TM, TN).  BK = 16: the depth is
# long, and each thread decodes one output position per k-step, so a deeper
# step halves that cost per FMA.
WGRAD_TILES = {
    "128x128": (128, 128, 16, 8, 8),
    "64x64": (64, 64, 16, 8, 4),
}
WGRAD_TABLE_MULTIPLE = 128   # the widest BN: a block never reads past the table
WGRAD_MIN_CHUNK_STEPS = 16   # a split reduces at least this many k-steps
# Resident blocks per SM (registers: 96 a thread for 64x64 at 128 threads, 128 for
# 128x128 at 256): split-K aims at one full wave.
WGRAD_BLOCKS_PER_SM = {"64x64": 5, "128x128": 2}
WGRAD_WORKSPACE_LIMIT = 256 * 2**20
MAX_GRID_Z = 65535
_SMS_H100 = 132
_PLAN_CACHE_SIZE = 4096
_MODE_DIRECT, _MODE_SPLITS, _MODE_ATOMIC = 0, 1, 2


def _wgrad_expression(dtype, nhwc, tile):
    bm, bn, bk, tm, tn = WGRAD_TILES[tile]
    return (f"conv_wgrad_implicit_gemm<{_dtypes.cuda_type(dtype)}, {'true' if nhwc else 'false'}, "
            f"{bm}, {bn}, {bk}, {tm}, {tn}>")


def _subpixel_expression(dtype, nhwc, tile):
    bm, bn, bk, tm, tn = TILES[tile]
    return (f"conv_dgrad_subpixel<{_dtypes.cuda_type(dtype)}, {'true' if nhwc else 'false'}, "
            f"{bm}, {bn}, {bk}, {tm}, {tn}>")


def _sum_expression(dtype):
    return f"conv_wgrad_split_sum<{_dtypes.cuda_type(dtype)}>"


FAMILY = KernelFamily("conv_implicit_gemm_backward.cu", [
    *(_wgrad_expression(d, nhwc, t) for d in SUPPORTED_DTYPES for nhwc in (False, True) for t in WGRAD_TILES),
    *(_subpixel_expression(d, nhwc, t) for d in SUPPORTED_DTYPES for nhwc in (False, True) for t in TILES),
    *(_sum_expression(d) for d in SUPPORTED_DTYPES),
])


def _fits_int32(p):
    return max(p.N * p.C * p.H * p.W, p.N * p.K * p.P * p.Q, p.K * (p.C // p.groups) * p.R * p.S) <= INT32_LIMIT


# --- backward filter ------------------------------------------------------------

# At or above this many 64x64 tiles of dw (about 4 per SM) 64x64 beat 128x128.
WGRAD_MANY_TILES = 512


def wgrad_tile(p):
    """128x128 when the output channels per group are a multiple of 128, the
    taps per group fill a tile, and dw has fewer than WGRAD_MANY_TILES 64x64
    tiles; else 64x64.  Fitted to the H100 batch-32 measurements
    (notes/conv_bwd.md): 128x128 won r50_3/4 and vgg_2/3 (36-144 tiles) by
    5-30 %, 64x64 won the 576-tile layers (r50_5_3x3, vgg_4/5) by 8-10 % and
    alex_conv2 (K=192: a 128-row tile is a quarter empty) by 15 %."""
    Kg, taps = p.K // p.groups, (p.C // p.groups) * p.R * p.S
    tiles = ceil_div(Kg, 64) * ceil_div(taps, 64) * p.groups
    if Kg >= 128 and Kg % 128 == 0 and taps >= 128 and tiles < WGRAD_MANY_TILES:
        return "128x128"
    return "64x64"


def wgrad_splits(p, tile, sms=_SMS_H100):
    """(splits, chunk): split the depth L = N*P*Q into chunks of whole k-steps so
    that one wave of WGRAD_BLOCKS_PER_SM blocks per SM runs, each chunk at least
    WGRAD_MIN_CHUNK_STEPS k-steps, the float partials within
    WGRAD_WORKSPACE_LIMIT and groups * splits within the grid's z limit."""
    bm, bn, bk, _, _ = WGRAD_TILES[tile]
    L = p.N * p.P * p.Q
    Kg, taps = p.K // p.groups, (p.C // p.groups) * p.R * p.S
    blocks = ceil_div(Kg, bm) * ceil_div(taps, bn) * p.groups
    target = WGRAD_BLOCKS_PER_SM[tile] * sms
    splits = max(1, min(ceil_div(target, blocks), ceil_div(L, bk * WGRAD_MIN_CHUNK_STEPS),
                        WGRAD_WORKSPACE_LIMIT // (4 * p.K * taps), MAX_GRID_Z // p.groups))
    chunk = max(bk, ceil_div(ceil_div(L, splits), bk) * bk)   # an empty batch (L = 0): one k-step
    return max(1, ceil_div(L, chunk)), chunk


def wgrad_table(p):
    """The forward tap table (x offset, r*dh, s*dw, offset in dw) padded to
    WGRAD_TABLE_MULTIPLE rows; padded rows gather zeros."""
    table, _ = tap_table(p, "forward")
    ntaps = (p.C // p.groups) * p.R * p.S
    padded = np.zeros((ceil_div(ntaps, WGRAD_TABLE_MULTIPLE) * WGRAD_TABLE_MULTIPLE, 4), np.int32)
    padded[:, 1] = _OUTSIDE
    padded[:ntaps] = table[:ntaps]
    return padded


def _tile_support(problem):
    """(ok, reason) for what both backward implicit GEMMs need: a dtype whose
    tiles accumulate in float32, and tensors that 32-bit indices reach."""
    if problem.dtype not in SUPPORTED_DTYPES:
        return False, (f"it accumulates float32 tiles: float32, float16 and bfloat16 only, "
                       f"not {problem.dtype}")
    if not _fits_int32(problem):
        return False, "it indexes with 32-bit ints; a tensor here has 2^31 elements or more"
    if coordinate_reach(problem) >= -_OUTSIDE:   # CONV_BACKWARD_OUTSIDE in the kernels
        return False, "its bounds test's out-of-range marker (-2^29) needs padded sizes below 2^29"
    return True, ""


class ImplicitGemmBackwardFilter(ConvAlgorithm):
    directions = ("backward_filter",)

    def __init__(self, atomic=False, tile=None):
        self.atomic = atomic
        self.deterministic = not atomic
        self.tile = tile
        self.name = "implicit_gemm_wgrad" + ("_atomic" if atomic else "") + (f"_{tile}" if tile else "")
        self._plans = {}

    def supports(self, problem, direction):
        ok, reason = super().supports(problem, direction)
        if not ok:
            return ok, reason
        ok, reason = _tile_support(problem)
        if not ok:
            return ok, reason
        if problem.groups > MAX_GRID_Z:
            return False, f"its grid holds at most {MAX_GRID_Z} groups"
        grid = self.launch_grid(problem)
        if max(grid[1:]) > MAX_GRID_Z:
            return False, f"its grid (tap tiles {grid[1]}, groups * splits {grid[2]}) is over CUDA's {MAX_GRID_Z} in y or z"
        return True, ""

    def launch_grid(self, p):
        """(tiles along K/groups, along the taps C/groups*R*S, groups * splits)."""
        tile, _, splits, _ = self.mode_and_splits(p)
        bm, bn = WGRAD_TILES[tile][:2]
        return ceil_div(p.K // p.groups, bm), ceil_div((p.C // p.groups) * p.R * p.S, bn), p.groups * splits

    def mode_and_splits(self, p):
        tile = self.tile or wgrad_tile(p)
        splits, chunk = wgrad_splits(p, tile)
        if self.atomic:
            return tile, _MODE_ATOMIC, splits, chunk
        return tile, (_MODE_DIRECT if splits == 1 else _MODE_SPLITS), splits, chunk

    def workspace_bytes(self, problem, direction):
        _, mode, splits, _ = self.mode_and_splits(problem)
        total = problem.K * (problem.C // problem.groups) * problem.R * problem.S
        if mode == _MODE_SPLITS:
            return 4 * splits * total
        if mode == _MODE_ATOMIC and problem.dtype != "float32":
            return 4 * total
        return 0

    def _plan(self, p):
        import cupy

        key = (cupy.cuda.runtime.getDevice(), p)
        plan = self._plans.get(key)
        if plan is None:
            tile, mode, splits, chunk = self.mode_and_splits(p)
            bm, bn, _, tm, tn = WGRAD_TILES[tile]
            Kg, ntaps = p.K // p.groups, (p.C // p.groups) * p.R * p.S
            grid = self.launch_grid(p)
            i32 = np.int32
            scalars = tuple(i32(v) for v in (
                p.H, p.W, p.C, p.C // p.groups, p.P, p.Q, p.K, Kg, ntaps, p.stride[0], p.stride[1],
                p.padding[0], p.padding[1], p.N * p.P * p.Q, chunk, splits))
            plan = (_wgrad_expression(p.dtype, p.layout == "NHWC", tile), grid, ((bm // tm) * (bn // tn),),
                    cupy.asarray(wgrad_table(p)), mode, splits, scalars)
            if len(self._plans) >= _PLAN_CACHE_SIZE:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    def prepare(self, problem, direction, has_bias=False, activation=None):
        # Arrays of the call: ARRAY0 = x, ARRAY1 = dy, ARRAY2 = dw (out); the
        # GEMM kernel's ARRAY3 is its float accumulator (dw itself when the
        # splits need none, or float32 dw for atomics).
        import cupy

        expression, grid, block, table, mode, splits, scalars = self._plan(problem)
        p = problem
        total = p.K * (p.C // p.groups) * p.R * p.S
        float_out = p.dtype == "float32"
        separate = mode == _MODE_SPLITS or (mode == _MODE_ATOMIC and not float_out)
        gemm = FAMILY.prepare(expression, grid, block,
                              (ARRAY0, ARRAY1, table, ARRAY3 if separate else ARRAY2, ARRAY2, np.int32(mode),
                               *scalars))
        if mode == _MODE_DIRECT:
            return gemm
        memset, stream = cupy.cuda.runtime.memsetAsync, cupy.cuda.get_current_stream
        if not separate:  # atomics straight into float32 dw, zeroed first
            nbytes = 4 * total

            def run_atomic(a, b, out, bias=None):
                memset(out.data.ptr, 0, nbytes, stream().ptr)
                gemm(a, b, out)
            return run_atomic
        add = FAMILY.prepare(_sum_expression(p.dtype), (ceil_div(total, 256),), (256,),
                             (ARRAY0, ARRAY1, np.int32(total), np.int32(splits if mode == _MODE_SPLITS else 1)))
        size = splits * total if mode == _MODE_SPLITS else total
        # The float partials: a scratch array nobody else holds after the call, so
        # the slot hands the same one back each call (stream order keeps calls apart).
        scratch = OutputSlot((size,), np.float32)

        def run_with_partials(a, b, out, bias=None):
            partial = scratch()
            if mode == _MODE_ATOMIC:
                memset(partial.data.ptr, 0, 4 * size, stream().ptr)
            gemm(a, b, out, partial)
            add(partial, out)
        return run_with_partials

    def run(self, problem, direction, a, b, out, bias=None, activation=None):
        self.prepared(problem, direction)(a, b, out)
        return out


# --- backward data by phases ------------------------------------------------------

def subpixel_tables(p):
    """(table, phase_depth, taps_per_phase): per phase (a, b) = (h mod sh,
    w mod sw), the taps (k, r, s) with (a + ph - r*dh) and (b + pw - s*dw)
    divisible by the strides, as int4 rows (offset in one image of dy, off_r,
    off_s, offset in w), k order (k, r, s) for NCHW and (r, s, k) for NHWC;
    phases are concatenated, each padded to taps_per_phase rows."""
    (sh, sw), (ph, pw), (dh, dw) = p.stride, p.padding, p.dilation
    Kg, Cg, R, S = p.K // p.groups, p.C // p.groups, p.R, p.S
    nhwc = p.layout == "NHWC"
    per_phase = []
    for a in range(sh):
        for b in range(sw):
            rows = [(r, (a + ph - r * dh) // sh) for r in range(R) if (a + ph - r * dh) % sh == 0]
            cols = [(s, (b + pw - s * dw) // sw) for s in range(S) if (b + pw - s * dw) % sw == 0]
            taps = []
            if nhwc:
                for r, off_r in rows:
                    for s, off_s in cols:
                        for k in range(Kg):
                            taps.append(((off_r * p.Q + off_s) * p.K + k, off_r, off_s, k * Cg * R * S + r * S + s))
            else:
                for k in range(Kg):
                    for r, off_r in rows:
                        for s, off_s in cols:
                            taps.append((k * p.P * p.Q + off_r * p.Q + off_s, off_r, off_s,
                                         k * Cg * R * S + r * S + s))
            per_phase.append(taps)
    depth = np.array([len(t) for t in per_phase], np.int32)
    taps_per_phase = max(1, ceil_div(int(depth.max()), TAP_TABLE_MULTIPLE)) * TAP_TABLE_MULTIPLE
    table = np.zeros((len(per_phase), taps_per_phase, 4), np.int32)
    table[:, :, 1] = _OUTSIDE
    table[:, :, 3] = -1
    for i, taps in enumerate(per_phase):
        if taps:
            table[i, :len(taps)] = np.array(taps, np.int32)
    return table.reshape(-1, 4), depth, taps_per_phase


def subpixel_pays(p):
    """Whether the sub-pixel GEMMs are efficient here: at least 64 input
    channels per group (the GEMM's N; r50_conv1 with 3 ran 8x slower than
    im2col + cuBLAS on the H100) and every phase has taps (with a 1x1 stride-2
    filter three of four phases are empty and the one GEMM left ran at 10
    TFLOP/s, 0.58x of im2col + cuBLAS: notes/conv_bwd.md)."""
    if p.C // p.groups < 64:
        return False
    for stride, pad, dil, taps in ((p.stride[0], p.padding[0], p.dilation[0], p.R),
                                   (p.stride[1], p.padding[1], p.dilation[1], p.S)):
        if len({(pad - t * dil) % stride for t in range(taps)}) < stride:
            return False
    return True


def subpixel_tile(p):
    """The forward kernel's rule on the largest phase's GEMM."""
    Cg = p.C // p.groups
    M = p.N * ceil_div(p.H, p.stride[0]) * ceil_div(p.W, p.stride[1])
    blocks = ceil_div(M, 128) * ceil_div(Cg, 128) * p.groups * p.stride[0] * p.stride[1]
    return "128x128" if Cg > 64 and blocks >= 2 * _SMS_H100 else "64x64"


class SubpixelBackwardData(ConvAlgorithm):
    directions = ("backward_data",)

    def __init__(self, tile=None):
        self.tile = tile
        self.name = "implicit_gemm_subpixel" + (f"_{tile}" if tile else "")
        self._plans = {}

    def supports(self, problem, direction):
        ok, reason = super().supports(problem, direction)
        if not ok:
            return ok, reason
        ok, reason = _tile_support(problem)
        if not ok:
            return ok, reason
        if problem.groups * problem.stride[0] * problem.stride[1] > MAX_GRID_Z:
            return False, f"groups * stride_h * stride_w exceeds the grid limit {MAX_GRID_Z}"
        grid_y = self.launch_grid(problem)[1]
        if grid_y > MAX_GRID_Z:
            return False, f"its grid's {grid_y} channel tiles are over CUDA's {MAX_GRID_Z} in y"
        return True, ""

    def launch_grid(self, p):
        """(tiles along the largest phase's M, along C/groups, groups * phases)."""
        bm, bn = TILES[self.tile or subpixel_tile(p)][:2]
        sh, sw = p.stride
        M = p.N * ceil_div(p.H, sh) * ceil_div(p.W, sw)    # the largest phase, (a, b) = (0, 0)
        return ceil_div(M, bm), ceil_div(p.C // p.groups, bn), p.groups * sh * sw

    def _plan(self, p):
        import cupy

        key = (cupy.cuda.runtime.getDevice(), p)
        plan = self._plans.get(key)
        if plan is None:
            table, depth, taps_per_phase = subpixel_tables(p)
            tile = self.tile or subpixel_tile(p)
            bm, bn, _, tm, tn = TILES[tile]
            sh, sw = p.stride
            grid = self.launch_grid(p)
            Kg, Cg = p.K // p.groups, p.C // p.groups
            i32 = np.int32
            scalars = tuple(i32(v) for v in (
                p.H, p.W, p.C, Cg, p.P, p.Q, p.K, Kg, taps_per_phase, p.R * p.S, Kg * Cg * p.R * p.S,
                sh, sw, p.N))
            plan = (_subpixel_expression(p.dtype, p.layout == "NHWC", tile), grid, ((bm // tm) * (bn // tn),),
                    cupy.asarray(table), cupy.asarray(depth), scalars)
            if len(self._plans) >= _PLAN_CACHE_SIZE:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    def prepare(self, problem, direction, has_bias=False, activation=None):
        # Arrays of the call: ARRAY0 = dy, ARRAY1 = w, ARRAY2 = dx.
        expression, grid, block, table, depth, scalars = self._plan(problem)
        return FAMILY.prepare(expression, grid, block, (ARRAY0, ARRAY1, table, depth, ARRAY2, *scalars))

    def run(self, problem, direction, a, b, out, bias=None, activation=None):
        self.prepared(problem, direction)(a, b, out)
        return out


IMPLICIT_GEMM_WGRAD = register(ImplicitGemmBackwardFilter())
IMPLICIT_GEMM_WGRAD_ATOMIC = register(ImplicitGemmBackwardFilter(atomic=True))
IMPLICIT_GEMM_SUBPIXEL = register(SubpixelBackwardData())
