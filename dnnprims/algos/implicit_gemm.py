"""The "implicit_gemm" algorithms: kernels/conv_implicit_gemm.cu.

Forward, and backward data with stride 1 (a forward convolution over dy with
the filter rotated by 180 degrees and the roles of C and K swapped; no
workspace, the rotation is folded into the tap table).  float32, float16 and
bfloat16 storage, float32 accumulation.

One registry entry per block tile ("implicit_gemm_128x128", ...) so that
``algo="find"`` and the tuner can time each, plus "implicit_gemm", which picks
the tile by the rule in :func:`pick_tile`.

Per problem and direction, the host builds the tap table once (one int4 per
GEMM k: offset in x, dh, dw, offset in w; see the kernel's header) and keeps
it, with the launch arguments, in a small per-device cache: a cached call does
one dict lookup and one launch.

Split-K ("implicit_gemm_splitk"; notes/splitk.md): ``find`` and the tuner
time it, ``auto`` takes it where the measured table ranks it first (the rule
never names it).  ``ImplicitGemmConvolution(split_k="auto" | n)`` also
splits the GEMM's k range (C/groups * R * S taps) over blockIdx.z when
M * Ngemm gives too few blocks for the GPU (batch 1, late layers): each
split writes its float tile to a workspace at y's layout and a second kernel
adds the splits in a fixed order, then the bias and the activation
(:func:`split_k_plan`; same bits on every run).  One split is the
single-pass kernel.
"""
import numpy as np

from .. import _dtypes
from .._kernels import ARRAY0, ARRAY1, ARRAY2, ARRAY3, ARRAY4, KernelFamily, OutputSlot, ceil_div
from .._validate import INT32_LIMIT
from ..activations import ACTIVATION_MODES, _KERNEL_MODE
from . import ConvAlgorithm, register

# name: (BM, BN, BK, TM, TN); threads = (BM / TM) * (BN / TN).
TILES = {
    "128x128": (128, 128, 8, 8, 8),   # large layers: 64 FMAs per 4 shared-memory float4 reads
    "128x64": (128, 64, 8, 8, 4),     # K = 64 layers (half of a 128-wide tile would idle)
    "64x64": (64, 64, 8, 8, 4),       # small N*P*Q or K: more blocks to fill the SMs
}
SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")
TAP_TABLE_MULTIPLE = 16   # the table is padded so a k-step never reads past it
_OUTSIDE = -(1 << 29)     # IMPLICIT_GEMM_OUTSIDE in the kernel
_SMS_H100 = 132
_PLAN_CACHE_SIZE = 4096

# Split-K (work in progress): aim for SPLITK_WAVES blocks per SM; a split
# reduces at least SPLITK_MIN_CHUNK_STEPS k-steps (its prologue and epilogue,
# and the partial tile's round trip, against BK-tap steps of FMAs); at most
# SPLITK_MAX_SPLITS splits (the sum kernel reads each partial once per output);
# the partials within SPLITK_WORKSPACE_LIMIT, groups * splits within the grid's z
# limit (MAX_GRID_YZ), and splits * (elements of y) within 32-bit indexing.
SPLITK_WAVES = 2
SPLITK_MIN_CHUNK_STEPS = 4
SPLITK_MAX_SPLITS = 16
SPLITK_WORKSPACE_LIMIT = 256 * 2**20
SPLIT_SUM_THREADS = 256


def _expression(dtype, nhwc, tile, split_k=False):
    bm, bn, bk, tm, tn = TILES[tile]
    return (f"conv_implicit_gemm<{_dtypes.cuda_type(dtype)}, {'true' if nhwc else 'false'}, "
            f"{bm}, {bn}, {bk}, {tm}, {tn}, {'true' if split_k else 'false'}>")


def _sum_expression(dtype):
    return f"conv_implicit_gemm_split_sum<{_dtypes.cuda_type(dtype)}>"


FAMILY = KernelFamily("conv_implicit_gemm.cu", [
    *(_expression(dtype, nhwc, tile, split_k)
      for split_k in (False, True) for dtype in SUPPORTED_DTYPES for nhwc in (False, True) for tile in TILES),
    *(_sum_expression(dtype) for dtype in SUPPORTED_DTYPES),
])


def gemm_shape(p, direction):
    """(M, N, K) of the GEMM, per group."""
    if direction == "forward":
        return p.N * p.P * p.Q, p.K // p.groups, (p.C // p.groups) * p.R * p.S
    return p.N * p.H * p.W, p.C // p.groups, (p.K // p.groups) * p.R * p.S


def pick_tile(p, direction, sms=_SMS_H100):
    """128x128 when the GEMM's N (output channels per group) exceeds 64 and its
    blocks still give two per SM; 64x64 otherwise.  Measured on the H100
    (notes/convolution.md, v1): 64x64 (128 threads, many blocks per SM) won 36
    of 53 batch-32 cases, 128x128 the large-K, large-N*P*Q ones; 128x64 never
    won by a margin, so the rule skips it (``algo="find"`` still times it)."""
    M, N, _ = gemm_shape(p, direction)
    if N > 64 and ceil_div(M, 128) * ceil_div(N, 128) * p.groups >= 2 * sms:
        return "128x128"
    return "64x64"


MAX_GRID_YZ = 65535   # CUDA's limit on grid y and z


def coordinate_reach(p):
    """A bound on |h0|, |w0| (an output row's first input row / column, either
    gathered tensor) and on a tap's dh, dw: the kernels' bounds tests add these to
    _OUTSIDE, which must stay negative, i.e. outside (notes/review6h.md item 4)."""
    extent = max(p.dilation[0] * (p.R - 1), p.dilation[1] * (p.S - 1))
    return max(p.H, p.W, p.P, p.Q) + 2 * max(p.padding) + 2 * extent


def launch_grid(p, direction, tile, splits=1):
    """(blocks along M, along the group's output channels, groups * splits): the
    kernel's grid (split-K: blockIdx.z = group * splits + split)."""
    bm, bn = TILES[tile][:2]
    M, n, _ = gemm_shape(p, direction)
    return ceil_div(M, bm), ceil_div(n, bn), p.groups * splits


def split_k_plan(p, direction, tile, splits=None, sms=_SMS_H100):
    """(splits, chunk) of the GEMM's k range (Kgemm taps): split s reduces taps
    [s * chunk, min((s + 1) * chunk, Kgemm)), chunk a whole number of BK-tap
    k-steps, every split non-empty (splits = ceil(Kgemm / chunk)).

    ``splits=None``: the rule -- enough splits for SPLITK_WAVES blocks per SM
    (``sms`` SMs), each split at least SPLITK_MIN_CHUNK_STEPS k-steps, at most
    SPLITK_MAX_SPLITS.  An int: at most that many (tests, timing), whatever
    the chunk length.  Either way within the workspace, grid and 32-bit limits;
    (1, whole k range rounded up to k-steps) when the GEMM is not split."""
    bk = TILES[tile][2]
    M, Ng, kgemm = gemm_shape(p, direction)
    total = M * Ng * p.groups                  # elements of y (dx): one split's partials
    steps = ceil_div(kgemm, bk)
    if splits is None:
        gx, gy, gz = launch_grid(p, direction, tile)
        splits = min(ceil_div(SPLITK_WAVES * sms, max(1, gx * gy * gz)), SPLITK_MAX_SPLITS,
                     steps // SPLITK_MIN_CHUNK_STEPS)
    splits = max(1, min(int(splits), steps, MAX_GRID_YZ // p.groups, INT32_LIMIT // max(total, 1),
                        SPLITK_WORKSPACE_LIMIT // (4 * max(total, 1))))
    chunk = max(bk, ceil_div(steps, splits) * bk)   # no taps (C = 0): one k-step, one split
    return max(1, ceil_div(kgemm, chunk)), chunk


def tap_table(p, direction):
    """The int32 (Kgemm padded, 4) tap table and the kernel's geometry arguments."""
    R, S = p.R, p.S
    dh, dw = p.dilation
    nhwc = p.layout == "NHWC"
    if direction == "forward":
        Cin, Hin, Win = p.C, p.H, p.W            # the gathered tensor: x
        Cg, Kout = p.C // p.groups, p.K          # taps per channel, output channels
        Kg = p.K // p.groups
        r, s = np.arange(R), np.arange(S)
        w_tap = (np.arange(Cg)[:, None, None] * R * S + r[None, :, None] * S + s[None, None, :])
        w_n_stride = Cg * R * S
        P, Q = p.P, p.Q
        pad, stride = p.padding, p.stride
    else:  # backward data, stride 1: dx = conv(dy, rotated w), channels swapped
        Cin, Hin, Win = p.K, p.P, p.Q            # the gathered tensor: dy
        Cg, Kout = p.K // p.groups, p.C
        Kg = p.C // p.groups
        rr, ss = np.arange(R), np.arange(S)      # taps of the rotated filter
        w_tap = (np.arange(Cg)[:, None, None] * (p.C // p.groups) * R * S
                 + (R - 1 - rr)[None, :, None] * S + (S - 1 - ss)[None, None, :])
        w_n_stride = R * S
        P, Q = p.H, p.W
        pad = (dh * (R - 1) - p.padding[0], dw * (S - 1) - p.padding[1])
        stride = (1, 1)
    c = np.arange(Cg)[:, None, None]
    r_off = (np.arange(R) * dh)[None, :, None]
    s_off = (np.arange(S) * dw)[None, None, :]
    if nhwc:
        x_tap = (r_off * Win + s_off) * Cin + c
    else:
        x_tap = c * Hin * Win + r_off * Win + s_off
    shape = (Cg, R, S)
    table = np.stack([np.broadcast_to(x_tap, shape), np.broadcast_to(r_off, shape),
                      np.broadcast_to(s_off, shape), np.broadcast_to(w_tap, shape)], axis=-1)
    if nhwc:  # k order (r, s, c): channels fastest, as in memory
        table = table.transpose(1, 2, 0, 3)
    table = table.reshape(-1, 4)
    kgemm = table.shape[0]
    padded = np.zeros((ceil_div(kgemm, TAP_TABLE_MULTIPLE) * TAP_TABLE_MULTIPLE, 4), np.int32)
    padded[:, 1] = _OUTSIDE
    padded[:kgemm] = table
    i32 = np.int32
    geometry = dict(H=Hin, W=Win, Cx=Cin, x_group_channels=Cg, P=P, Q=Q, Ky=Kout, Kg=Kg,
                    Kgemm=kgemm, w_n_stride=w_n_stride, w_group_stride=Kg * Cg * R * S,
                    sh=stride[0], sw=stride[1], ph=pad[0], pw=pad[1])
    return padded, {k: i32(v) for k, v in geometry.items()}


def activation_arguments(activation, alpha_type=np.float32):
    """The (act_mode, act_alpha) kernel scalars for ``activation`` (None or
    (mode, alpha)): ActivationMode of kernels/activation_math.cuh, or
    ACTIVATION_NONE = -1."""
    if activation is None:
        return np.int32(-1), alpha_type(0.0)
    mode, alpha = activation
    return np.int32(_KERNEL_MODE[mode]), alpha_type(0.0 if alpha is None else alpha)


# Every mode of dnnprims.ACTIVATION_MODES, applied to the register tile in the
# forward epilogue (kernels/activation_math.cuh).
FUSED_ACTIVATIONS = frozenset(ACTIVATION_MODES)


class ImplicitGemmConvolution(ConvAlgorithm):
    """``tile``: a TILES name, or None (:func:`pick_tile`).  ``split_k``: None
    (one pass), "auto" (:func:`split_k_plan`'s rule: "implicit_gemm_splitk") or
    an int (at most that many splits)."""
    directions = ("forward", "backward_data")
    fused_activations = FUSED_ACTIVATIONS

    def __init__(self, tile=None, split_k=None):
        if split_k is not None and split_k != "auto" and not (
                isinstance(split_k, int) and not isinstance(split_k, bool) and split_k >= 1):
            raise ValueError(f"split_k must be None, 'auto' or an int >= 1, got {split_k!r}")
        self.tile = tile
        self.split_k = split_k
        base = "implicit_gemm" if split_k is None else \
            "implicit_gemm_splitk" + ("" if split_k == "auto" else str(split_k))
        self.name = base if tile is None else f"{base}_{tile}"
        self._plans = {}   # (device, problem, direction) -> (expression, grid, block, table, scalars,
        #                                           splits, sum_scalars)

    def supports(self, problem, direction):
        ok, reason = super().supports(problem, direction)
        if not ok:
            return ok, reason
        p = problem
        if p.dtype not in SUPPORTED_DTYPES:
            return False, f"it accumulates float32 tiles: float32, float16 and bfloat16 only, not {p.dtype}"
        if direction == "backward_data" and p.stride != (1, 1):
            return False, "its backward data is a forward convolution over dy, for stride 1 only"
        if max(p.N * p.C * p.H * p.W, p.N * p.K * p.P * p.Q, p.K * (p.C // p.groups) * p.R * p.S) > INT32_LIMIT:
            return False, "it indexes with 32-bit ints; a tensor here has 2^31 elements or more"
        if coordinate_reach(p) >= -_OUTSIDE:
            return False, "its bounds test's out-of-range marker (-2^29) needs padded sizes below 2^29"
        grid = launch_grid(p, direction, self.tile or pick_tile(p, direction))
        if max(grid[1:]) > MAX_GRID_YZ:
            return False, (f"its grid (output-channel tiles {grid[1]}, groups {grid[2]}) is over "
                           f"CUDA's {MAX_GRID_YZ} in y or z")
        return True, ""

    def splits(self, problem, direction):
        """(tile, splits, chunk) this instance runs ``problem`` with."""
        tile = self.tile or pick_tile(problem, direction)
        if self.split_k is None:
            _, _, kgemm = gemm_shape(problem, direction)
            return tile, 1, ceil_div(kgemm, TILES[tile][2]) * TILES[tile][2]
        return (tile, *split_k_plan(problem, direction, tile, None if self.split_k == "auto" else self.split_k))

    def workspace_bytes(self, problem, direction):
        if self.split_k is None:
            return 0
        _, splits, _ = self.splits(problem, direction)
        if splits == 1:
            return 0
        M, Ng, _ = gemm_shape(problem, direction)
        return 4 * splits * M * Ng * problem.groups

    def _plan(self, p, direction):
        import cupy

        key = (cupy.cuda.runtime.getDevice(), p, direction)
        plan = self._plans.get(key)
        if plan is None:
            table, g = tap_table(p, direction)
            tile, splits, chunk = self.splits(p, direction)
            bm, bn, _, tm, tn = TILES[tile]
            M = p.N * int(g["P"]) * int(g["Q"])
            grid = launch_grid(p, direction, tile, splits)
            scalars = (g["H"], g["W"], g["Cx"], g["x_group_channels"], g["P"], g["Q"], g["Ky"],
                       g["Kg"], g["Kgemm"], g["w_n_stride"], g["w_group_stride"],
                       g["sh"], g["sw"], g["ph"], g["pw"], np.int32(M), np.int32(chunk), np.int32(splits))
            # The split sum's (total, splits, channels, inner): one thread per element
            # of out, whose channel is (i / inner) % channels (inner = P*Q for NCHW, 1 for NHWC).
            total = M * int(g["Ky"])
            sum_scalars = tuple(np.int32(v) for v in (total, splits, g["Ky"],
                                                      1 if p.layout == "NHWC" else g["P"] * g["Q"]))
            plan = (_expression(p.dtype, p.layout == "NHWC", tile, splits > 1), grid,
                    ((bm // tm) * (bn // tn),), cupy.asarray(table), scalars, splits, sum_scalars)
            if len(self._plans) >= _PLAN_CACHE_SIZE:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    def prepare(self, problem, direction, has_bias=False, activation=None):
        # Arrays of the call: ARRAY0 = a, ARRAY1 = b, ARRAY2 = out, ARRAY3 = bias
        # (b stands in for an absent bias: the kernel does not read it), ARRAY4 =
        # split-K's float partials (out stands in for them with one split).
        expression, grid, block, table, scalars, splits, sum_scalars = self._plan(problem, direction)
        bias = ARRAY3 if has_bias else ARRAY1
        if splits == 1:
            return FAMILY.prepare(expression, grid, block,
                                  (ARRAY0, ARRAY1, table, bias, np.int32(has_bias),
                                   *activation_arguments(activation), ARRAY2, ARRAY2, *scalars))
        gemm = FAMILY.prepare(expression, grid, block,
                              (ARRAY0, ARRAY1, table, ARRAY1, np.int32(0), *activation_arguments(None),
                               ARRAY2, ARRAY4, *scalars))
        total = int(sum_scalars[0])
        add = FAMILY.prepare(_sum_expression(problem.dtype), (ceil_div(total, SPLIT_SUM_THREADS),),
                             (SPLIT_SUM_THREADS,),
                             (ARRAY4, bias, np.int32(has_bias), *activation_arguments(activation), ARRAY2,
                              *sum_scalars))
        # The partials: a scratch array nobody else holds after the call, so the
        # slot hands the same one back each call (stream order keeps calls apart).
        scratch = OutputSlot((splits * total,), np.float32)

        def run_split_k(a, b, out, bias=None):
            partials = scratch()
            gemm(a, b, out, bias, partials)
            add(a, b, out, bias, partials)
        return run_split_k

    def run(self, problem, direction, a, b, out, bias=None, activation=None):
        self.prepared(problem, direction, bias is not None, activation)(a, b, out, bias)
        return out


IMPLICIT_GEMM = register(ImplicitGemmConvolution())
for _tile in TILES:
    register(ImplicitGemmConvolution(_tile))
# Where the rule gives one split this is the single-pass kernel (same launch, same bits).
IMPLICIT_GEMM_SPLITK = register(ImplicitGemmConvolution(split_k="auto"))
