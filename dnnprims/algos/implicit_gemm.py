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
"""
import numpy as np

from .. import _dtypes
from .._kernels import ARRAY0, ARRAY1, ARRAY2, ARRAY3, KernelFamily, ceil_div
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


def _expression(dtype, nhwc, tile):
    bm, bn, bk, tm, tn = TILES[tile]
    return (f"conv_implicit_gemm<{_dtypes.cuda_type(dtype)}, {'true' if nhwc else 'false'}, "
            f"{bm}, {bn}, {bk}, {tm}, {tn}>")


FAMILY = KernelFamily("conv_implicit_gemm.cu", [
    _expression(dtype, nhwc, tile)
    for dtype in SUPPORTED_DTYPES for nhwc in (False, True) for tile in TILES
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


def launch_grid(p, direction, tile):
    """(blocks along M, along the group's output channels, groups): the kernel's grid."""
    bm, bn = TILES[tile][:2]
    M, n, _ = gemm_shape(p, direction)
    return ceil_div(M, bm), ceil_div(n, bn), p.groups


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
    directions = ("forward", "backward_data")
    fused_activations = FUSED_ACTIVATIONS

    def __init__(self, tile=None):
        self.tile = tile
        self.name = "implicit_gemm" if tile is None else f"implicit_gemm_{tile}"
        self._plans = {}   # (device, problem, direction) -> (expression, grid, block, table, scalars)

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

    def _plan(self, p, direction):
        import cupy

        key = (cupy.cuda.runtime.getDevice(), p, direction)
        plan = self._plans.get(key)
        if plan is None:
            table, g = tap_table(p, direction)
            tile = self.tile or pick_tile(p, direction)
            bm, bn, _, tm, tn = TILES[tile]
            M = p.N * int(g["P"]) * int(g["Q"])
            grid = launch_grid(p, direction, tile)
            scalars = (g["H"], g["W"], g["Cx"], g["x_group_channels"], g["P"], g["Q"], g["Ky"],
                       g["Kg"], g["Kgemm"], g["w_n_stride"], g["w_group_stride"],
                       g["sh"], g["sw"], g["ph"], g["pw"], np.int32(M))
            plan = (_expression(p.dtype, p.layout == "NHWC", tile), grid, ((bm // tm) * (bn // tn),),
                    cupy.asarray(table), scalars)
            if len(self._plans) >= _PLAN_CACHE_SIZE:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    def prepare(self, problem, direction, has_bias=False, activation=None):
        # Arrays of the call: ARRAY0 = a, ARRAY1 = b, ARRAY2 = out, ARRAY3 = bias
        # (b stands in for an absent bias: the kernel does not read it).
        expression, grid, block, table, scalars = self._plan(problem, direction)
        return FAMILY.prepare(expression, grid, block,
                              (ARRAY0, ARRAY1, table, ARRAY3 if has_bias else ARRAY1, np.int32(has_bias),
                               *activation_arguments(activation), ARRAY2, *scalars))

    def run(self, problem, direction, a, b, out, bias=None, activation=None):
        self.prepared(problem, direction, bias is not None, activation)(a, b, out, bias)
        return out


IMPLICIT_GEMM = register(ImplicitGemmConvolution())
for _tile in TILES:
    register(ImplicitGemmConvolution(_tile))
