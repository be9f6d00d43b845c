"""Row normalizations, forward and backward (PyTorch semantics): layer norm, RMS
norm, group norm, instance norm.

They differ from batch norm (``normalization.py``) in what shares a mean and a
variance: a *row* of one sample -- the trailing ``normalized_shape`` axes
(layer norm, RMS norm), or one group of channels with all their positions
(group norm; instance norm is group norm with one channel per group).  NumPy
arrays run ``dnnprims.reference.row_normalization``; CuPy arrays run
``kernels/row_normalization.cu`` (one block per row, the row kept in shared
memory when it fits).

gamma/beta have x's dtype, or float32 when x is float16/bfloat16 (the cuDNN
rule); saved statistics (``return_stats=True``) are ``mean`` and ``rstd`` =
1 / sqrt(var + eps) per row, in the accumulation dtype.  Backward functions
return gradients for every parameter (dtype of gamma, x's when gamma is None).
"""
import numpy as np

from . import _dtypes, _validate
from ._kernels import KernelFamily, ceil_div, index_type
from .reference import row_normalization as reference

LAYOUTS = ("NCHW", "NHWC")

_REGISTER_ITEMS = (4, 8)  # vectors of x and of dy a thread of gn_rows_backward_registers holds, at most
_TYPE_PAIRS = (("half_t", "half_t"), ("half_t", "float"), ("bfloat16_t", "bfloat16_t"),
               ("bfloat16_t", "float"), ("float", "float"), ("double", "double"))
_X_TYPES = ("half_t", "bfloat16_t", "float", "double")
_INDEX_TYPES = ("int", "long long")
_VECTOR = {"half_t": 8, "bfloat16_t": 8, "float": 4, "double": 2}  # values per 16 bytes
_ACC = {"half_t": "float", "bfloat16_t": "float", "float": "float", "double": "double"}
_CLUSTER_SIZES = (1, 2, 4, 8)  # blocks per cluster of gn_rows_backward_cluster (8: the portable limit)
_REGS_ROWS = (1, 2)  # rows a block of norm_rows_forward_regs (LAYER_FORWARD_ROWS)
_ODD_ITEMS = (4, 8, 16)  # values a thread of norm_rows_forward_odd holds, at most
_ODD_BLOCK = 512  # the largest block norm_rows_forward_odd is given while a larger I fits

FAMILY = KernelFamily("row_normalization.cu", [
    *(f"norm_rows_{d}<{t}, {p}, {i}, {v}>" for d in ("forward", "backward")
      for t, p in _TYPE_PAIRS for i in _INDEX_TYPES for v in sorted({1, _VECTOR[t]})),
    *(f"norm_param_grads_{k}<{t}, {i}>" for k in ("columns", "planes")
      for t in _X_TYPES for i in _INDEX_TYPES),
    *sorted({f"norm_param_grads_finish<{_ACC[t]}, {p}>" for t, p in _TYPE_PAIRS}),
    *(f"norm_rows_backward_fused<{t}, {p}, {i}, {v}>"
      for t, p in _TYPE_PAIRS for i in _INDEX_TYPES for v in sorted({1, _VECTOR[t]})),
    *sorted({f"norm_param_grads_finish_wide<{_ACC[t]}, {p}>" for t, p in _TYPE_PAIRS}),
    *(f"norm_rows_{d}_pipelined<{t}, {p}, {i}, {_VECTOR[t]}>" for d in ("forward", "backward_fused")
      for t, p in _TYPE_PAIRS for i in _INDEX_TYPES),
    *(f"gn_rows_forward_pipelined<{t}, {p}, {i}, {_VECTOR[t]}>" for t, p in _TYPE_PAIRS for i in _INDEX_TYPES),
    *(f"gn_rows_backward_pipelined<{t}, {p}, {i}, {_VECTOR[t]}>" for t, p in _TYPE_PAIRS for i in _INDEX_TYPES),
    *(f"gn_rows_backward<{t}, {p}, {i}, {v}>"
      for t, p in _TYPE_PAIRS for i in _INDEX_TYPES for v in sorted({1, _VECTOR[t]})),
    *(f"gn_rows_backward_registers<{t}, {p}, {i}, {cl}, {n}>"
      for t, p in _TYPE_PAIRS for i in _INDEX_TYPES for cl in _CLUSTER_SIZES for n in _REGISTER_ITEMS),
    *(f"gn_rows_backward_cluster<{t}, {p}, {i}, {cl}>"
      for t, p in _TYPE_PAIRS for i in _INDEX_TYPES for cl in _CLUSTER_SIZES),
    *(f"gn_rows_forward_cluster<{t}, {p}, {i}, {cl}>"
      for t, p in _TYPE_PAIRS for i in _INDEX_TYPES for cl in _CLUSTER_SIZES),
    *(f"norm_rows_forward_regs<{t}, {p}, {i}, {_VECTOR[t]}, {r}>"
      for t, p in _TYPE_PAIRS for i in _INDEX_TYPES for r in _REGS_ROWS),
    *(f"norm_rows_{d}_odd<{t}, {p}, {i}, {n}>" for d in ("forward", "backward")
      for t, p in _TYPE_PAIRS for i in _INDEX_TYPES for n in _ODD_ITEMS),
])

# Dynamic shared memory a row block may hold (the single-read path): two blocks
# of this size still fit one H100 SM (228 KB).
CACHE_BYTES = 112 * 1024
_SM_TARGET = 132 * 8  # blocks for the parameter-gradient column reduction
# Layer / RMS norm backward: dx and the dgamma/dbeta partials in one kernel
# (norm_rows_backward_fused) when a row is at most 2 vectors a thread of a block
# the kernel's registers allow.  False: the row kernel + the column kernel.
FUSED_BACKWARD = True
_FUSED_ITEMS = 2  # NORM_FUSED_ITEMS in kernels/row_normalization.cu
# The fused backward on 16-byte rows through norm_rows_backward_fused_pipelined:
# each thread's vectors of the block's next NORM_STAGES - 1 rows are copied
# (cp.async) into its own shared-memory slots while this row is reduced and dx
# written, and the partials are added by 32 split lanes a block instead of 8.
# False: norm_rows_backward_fused (each row's loads issued only after the
# previous row's stores: H100 65536 x 1024 fp32 0.86 of copy, fp16 0.65).
LAYER_BACKWARD_PIPELINED = True
_FUSED_STAGES = 3  # NORM_STAGES in kernels/row_normalization.cu
# Layer / RMS norm forward (and group norm with one group and S == 1) on 16-byte
# rows of at most 2 vectors a thread: norm_rows_forward_pipelined (persistent
# blocks, thread t owns the same vectors of every row, the next rows' copies in
# flight in its own shared-memory slots), for the storage types listed; the others
# take norm_rows_forward (one block per row).  H100 A/B, 65536 x 1024 (session 10,
# notes/rownorm.md): float16 layer norm 0.137 -> 0.111 ms (0.65 -> 0.80 of copy), but
# float32 layer 0.197 -> 0.203 and RMS 0.184 -> 0.200 ms: 16-bit only.
LAYER_FORWARD_PIPELINED = ("half_t", "bfloat16_t")
# Layer / RMS norm forward (G == 1, S == 1, NCHW) on 16-byte rows of at most 2
# vectors a thread, for the storage types listed (checked after
# LAYER_FORWARD_PIPELINED): norm_rows_forward_regs, LAYER_FORWARD_ROWS (1 or 2)
# rows a block, the row in registers (no shared-memory copy), statistics with
# one block barrier a row (warp-exact two-pass, warps merged by the exact
# within / between split), mean written by the kernel for RMS (no fill launch).
# Against norm_rows_forward on 65536 x 1024 float32 (NVRTC 13.0, sm_90): 30
# registers instead of 38 (16 blocks of 128 threads an SM instead of 12: 64 KB
# of loads in flight an SM instead of 48), 1 barrier a row instead of 4 (layer)
# or 2 (RMS).  () / False: norm_rows_forward.  notes/rowbwd.md.
LAYER_FORWARD_REGISTERS = ("float",)
LAYER_FORWARD_ROWS = 1
# Layer / RMS norm forward (G == 1, S == 1, NCHW) on rows that are not 16-byte
# vectors (length not a multiple of 16 bytes, or a misaligned view; 8192 x 4097
# float32), for the storage types listed: norm_rows_forward_odd (one block of at
# most _ODD_BLOCK threads a row, I = 4, 8 or 16 scalar coalesced loads a thread in
# flight, the row in registers, norm_rows_forward_regs' one-barrier statistics)
# instead of norm_rows_forward (one 1024-thread block a row, the row copied to
# shared memory, two block sums).  Rows of more than 16 x 1024 values keep
# norm_rows_forward.  () / False: norm_rows_forward.  notes/lnodd.md.
# H100 A/B (session 11, call 9), device ms old -> new (PyTorch): layer 8192x4097 fp32
# 0.2413 -> 0.1034 (0.2218), RMS 0.2021 -> 0.0964 (0.2217), layer 4096x1001 0.0435 ->
# 0.0163, fp16 layer 0.1872 -> 0.1062 (0.1805); aligned 65536x1024 unchanged.
LAYER_FORWARD_ODD = ("half_t", "bfloat16_t", "float")
# Layer / RMS norm backward on rows that are not 16-byte vectors and too long for
# norm_rows_backward_fused (more than 2 values a thread of 1024: 8192 x 4097 float32),
# for the storage types listed: norm_rows_backward_odd (norm_rows_backward_fused with
# _odd_shape's I scalar values a thread: dx and the dgamma / dbeta partials from one
# read of x and dy, a persistent grid) instead of norm_rows_backward (one 1024-thread
# block a row) + norm_param_grads_columns (x and dy read again).  () / False: those.
# Same A/B: layer 8192x4097 fp32 backward 0.4400 -> 0.1831 (PyTorch 0.3556), RMS 0.4326 ->
# 0.1777 (0.3545), fp16 layer 0.4988 -> 0.1653 (0.1677).
LAYER_BACKWARD_ODD = ("half_t", "bfloat16_t", "float")
# Group norm backward, NCHW: the per-(sample, channel) dgamma/dbeta partials come
# from the row kernel's own read of x and dy (norm_rows_backward `plane_sums`)
# instead of norm_param_grads_planes reading both again.  Needs S >= 32 vectors
# (a warp's vectors span at most two planes) and warp slices of at most
# _PLANE_SUMS_BYTES.  False: the separate planes kernel.  H100, 64x256x56x56 /
# 32 groups: 0.300 ms with BIG_CACHE, 0.312 without, 0.420 with neither.
PLANE_SUMS = True
_PLANE_SUMS_BYTES = 16 * 1024
# Group norm backward rows whose x and dy exceed CACHE_BYTES but fit the
# device's per-block shared-memory opt-in (227 KB on the H100; 64x256x56x56 with
# 32 groups: 2 x 100 KB) are cached anyway, one block per SM, so x and dy are
# read from DRAM once.  False: such rows re-read global memory in pass 2.
BIG_CACHE = True
_OPTIN = {}  # device -> the largest dynamic shared memory a block may opt in to
# Group / instance norm forward, NCHW, 16-byte rows: gn_rows_forward_pipelined
# (persistent blocks, two row buffers, the next row's cp.async copies in flight
# while this row is reduced and stored) when two rows fit the per-block opt-in.
# False: norm_rows_forward (one block per row).  H100, 64x256x56x56 / 32 groups:
# 0.1557 ms (0.89 of copy) vs 0.1699 ms (0.82).
PIPELINED_FORWARD = True
_PIPELINE_GRID_CAP = None
# Group / instance norm forward, NCHW with 16-byte planes (S * itemsize % 16 ==
# 0) and 16-byte aligned x, y, sm_90+: gn_rows_forward_cluster (a cluster of CL
# blocks per row, block `rank` holding channels rank * K / CL .. of the row,
# bulk-copied into its shared memory: x read once; the blocks' (sum, sum of
# squared deviations) merged through distributed shared memory).  Checked
# before PIPELINED_FORWARD.  CL: the smallest of _CLUSTER_SIZES dividing K whose
# x share (K / CL * S * itemsize) is at most CLUSTER_FORWARD_BYTES, else the
# largest dividing K.  Block: the next power of two >= the share's 16-byte
# vectors / CLUSTER_FORWARD_ITEMS, in [64, 512].  Why (notes/gnorm.md): the
# persistent pipelined kernel (one 1024-thread block per SM at 100 KB rows)
# loses ~3 % to its static wave tail (2048 rows / 132 SMs) and more to its
# per-row bursts; many small blocks an SM stream like an elementwise kernel.
# False: the pipelined / row kernels (main before issue 5's gnorm); a tuple of
# storage types ("float", "half_t", ...): those only.
# Rows (M * itemsize) under CLUSTER_FORWARD_MIN_ROW_BYTES stay on the other paths.
# H100 A/B (session 11, notes/gnorm.md): a 32 KB share beat 16 KB and 8 KB on every
# row (64x256x56x56 / 32 fp32 0.1556 -> 0.1503 ms, fp16 0.0842 -> 0.0790, bf16 equal;
# 32x640x40x40 / 32 fp32 0.1137 -> 0.0956; instance norm 0.1660 -> 0.1604), while
# 4 KB rows (1024x128x16x16 / 32) lost 0.112 -> 0.171 ms and 12.5 KB rows (instance
# norm above) won: rows under 8 KB keep the persistent kernels.
CLUSTER_FORWARD = True
CLUSTER_FORWARD_BYTES = 32 * 1024
CLUSTER_FORWARD_ITEMS = 8
CLUSTER_FORWARD_MIN_ROW_BYTES = 8 * 1024
# Group / instance norm backward, NCHW: gn_rows_backward (contiguous warp ranges,
# plane sums in registers).  "x": x cached, dy re-read (mostly L2), blocks of at
# most 512 threads and rows within CACHE_BYTES, so two blocks share an SM;
# "both": x and dy cached up to the per-block opt-in (one block per SM for
# 100 KB rows).  None: norm_rows_backward (PLANE_SUMS / BIG_CACHE below it).
# H100, 64x256x56x56 / 32 groups: "x" 0.3084 ms, "both" 0.3374, None 0.3008 --
# the warp-contiguous ranges lose to the block-contiguous mapping, so None.
GN_BACKWARD = None
GN_BACKWARD_MODES = ("x", "both", None)
# Group / instance norm backward, NCHW, 16-byte rows with S / VEC >= 32:
# gn_rows_backward_pipelined (persistent blocks; the next row's x, and with
# "both" its dy, copied by cp.async into a second buffer while this row runs).
# "x": x double-buffered, dy read twice (pass 2 from L2); "xl2": the same, and
# the next row's dy prefetched into L2; "both": x and dy double-buffered when
# four rows fit the per-block opt-in (half types at 8x56x56), else as "x".
# None: norm_rows_backward.  Checked before GN_BACKWARD.  H100, 64x256x56x56 /
# 32 groups (notes/gnbwd.md), ms / of copy: fp32 old 0.3006 / 0.689, "x" 0.2755 /
# 0.752, "xl2" 0.3272; fp16 old 0.2615 / 0.396, "x" 0.1825, "both" 0.1633 / 0.634;
# bf16 old 0.2637, "both" 0.1585 / 0.654 (PyTorch 0.427 / 0.366 / 0.369).
PIPELINED_BACKWARD = "both"
PIPELINED_BACKWARD_MODES = ("x", "xl2", "both", None)
# gn_rows_backward_pipelined options: LATE issues the next row's copies after
# pass 1 (so this row's dy reads from DRAM do not queue behind them); BULK
# brings the rows in with Hopper bulk copies (cp.async.bulk: thread 0 asks
# the copy engine for 32 KB pieces, completion on an mbarrier) instead of
# 16-byte cp.async from every thread (sm_90+, ignored below).  H100, 64x256x56x56
# / 32 groups, one process (notes/mem5.md), ms: fp32 cp.async 0.2776-0.2781, bulk
# 0.2754-0.2767 (0.746 of copy, 1.54x PyTorch), late 0.299, late bulk 0.283; fp16
# 0.1774-0.1791 -> bulk 0.1610-0.1624 (0.638, 2.25x), late 0.186; bf16 0.1793 ->
# bulk 0.1614-0.1632 (0.636, 2.25x).  Results bitwise the same.  So BULK on, LATE off.
PIPELINED_BACKWARD_LATE = False
PIPELINED_BACKWARD_BULK = True
# Group / instance norm backward, NCHW with 16-byte planes (S * itemsize % 16 ==
# 0) and 16-byte aligned dy, x, dx, sm_90+: gn_rows_backward_cluster (a cluster
# of CL blocks per row, block `rank` holding channels rank * K / CL .. of the
# row, their x and dy bulk-copied into its shared memory, so both are read from
# DRAM once; the row sums are exchanged through distributed shared memory).
# Checked before PIPELINED_BACKWARD.  CL is the smallest of _CLUSTER_SIZES that
# divides K and gives each block x and dy shares (2 K / CL * S * itemsize) of at
# most CLUSTER_BLOCK_BYTES and within the device's opt-in.  Rows of x and dy
# under CLUSTER_MIN_ROW_BYTES (2 M itemsize) stay on the other paths.  False:
# the pipelined / row kernels.  H100 (notes/gncluster.md, session 8), 64x256x56x56
# / 32 groups, ms against the pipelined kernel: fp32 0.234 vs 0.276 (0.88 of copy,
# 1.83x PyTorch), fp16 / bf16 0.130 vs 0.162; budgets 112 / 56 / 28 KB gave fp32
# 0.238 / 0.235 / 0.234 and fp16 0.141 / 0.138 / 0.130: smaller blocks (more of
# them a cluster and an SM) hide a block's load-compute-store better.
CLUSTER_BACKWARD = True
CLUSTER_BLOCK_BYTES = 28 * 1024
CLUSTER_MIN_ROW_BYTES = 0
_CLUSTER_THREADS = 512  # NORM_CLUSTER_THREADS in kernels/row_normalization.cu
_CLUSTER_STATIC_BYTES = 1024  # the kernel's static shared memory (mbarrier, shares), rounded up generously
# CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, CUDA_ERROR_INVALID_CLUSTER_SIZE: the driver
# cannot place a cluster; that launch then takes the other kernels from then on.
_CLUSTER_REFUSALS = frozenset((701, 912))
_CLUSTER_REFUSED = set()  # (device, expression, block, shared) refused once
cluster_refusals = 0  # launches refused so far
# Group / instance norm backward, NCHW with 16-byte planes of at least 32
# vectors, 16-byte aligned dy, x, dx, sm_90+: gn_rows_backward_registers (the
# cluster split above with each block's x and dy in registers, loaded by every
# thread, no dynamic shared memory; notes/gnbwd2.md).  Tried first by
# _cluster_backward (so CLUSTER_BACKWARD = False turns both off).  CL: the
# smallest of _CLUSTER_SIZES dividing K whose x and dy shares (2 K / CL * S *
# itemsize) fit REGISTER_BACKWARD_BYTES, else the largest; then the next
# larger one while the block (K / CL planes x tpp threads) exceeds
# _CLUSTER_THREADS.  tpp: whole warps, each thread at most
# REGISTER_BACKWARD_ITEMS (4 or 8) vectors of each tensor; where no cluster
# size gives blocks of at most _CLUSTER_THREADS, the other ITEMS; 4 where a
# plane has <= 128 vectors.  Rows whose x and dy (2 M itemsize) are under
# REGISTER_BACKWARD_MIN_ROW_BYTES stay on the other paths.  The parameter
# gradients' partials are added by norm_param_grads_finish_wide (8 split
# lanes, 32 over 256 samples) when REGISTER_BACKWARD_WIDE_FINISH, else by
# norm_param_grads_finish (one thread a channel, the samples in a serial
# chain).  False: the shared-memory cluster kernel (main before gnbwd2); a
# tuple of storage types ("float", "half_t", ...): those only.
# H100 A/B (session 11, notes/gnbwd2.md "Result"), device ms old -> register kernel
# (56 KB budget): 64x256x56x56 / 32 fp32 0.2331 -> 0.2153 (0.88 -> 0.955 of copy), fp16
# 0.1284 -> 0.1125, bf16 0.1298 -> 0.1129; 32x640x40x40 / 32 fp16 0.0858 -> 0.0781 but
# fp32 0.1531 -> 0.1645 (every budget / items); instance norm fp32 0.2304 -> 0.2124;
# 4 KB rows 0.4103 -> 0.1584.  float32 sweep (call 4, notes/gnbwd2_sweep_ab.py, x old):
# 32x512x40x40 1.09, 32x640x40x40 0.935 (K 20: the one loss), 32x320x64x64 1.00,
# 16x256x80x80 1.05, 64x64x56x56 1.23, 32x960x28x28 1.11, 8x512x64x64 1.08, 64x256x56x56
# 1.08 (ITEMS 8: +0-2 % more in float32, -1.5 % in 16-bit: one setting for all).
REGISTER_BACKWARD = True
REGISTER_BACKWARD_BYTES = 56 * 1024
REGISTER_BACKWARD_ITEMS = 4
REGISTER_BACKWARD_MIN_ROW_BYTES = 8 * 1024
REGISTER_BACKWARD_WIDE_FINISH = True


# ---------------------------------------------------------------------- validation

def _check_params(shape, what, **params):
    for name, v in params.items():
        if v is not None:
            _validate.check_shape(name, v, shape, what)


def _check_stats(x_dtype, shape, **stats):
    acc = _dtypes.accumulate_dtype(x_dtype)
    for name, v in stats.items():
        if v is None:
            continue
        if v.dtype != acc:
            raise TypeError(f"{name} must have dtype {acc} (the accumulation dtype of x's "
                            f"{x_dtype}), got {v.dtype}")
        _validate.check_shape(name, v, shape, "one value per normalized row")


def _check_dy(dy, x):
    _validate.check_same_dtype(x=x, dy=dy)
    if dy is not None:  # None: a zero output gradient
        _validate.check_shape("dy", dy, x.shape, "x's shape")


def _normalized_shape(x, normalized_shape):
    """PyTorch's rule: an int or a tuple of ints equal to x's trailing axes."""
    if isinstance(normalized_shape, (int, np.integer)) and not isinstance(normalized_shape, bool):
        shape = (int(normalized_shape),)
    else:
        try:
            shape = tuple(normalized_shape)
        except TypeError:
            raise TypeError(f"normalized_shape must be an int or a tuple of ints, "
                            f"got {normalized_shape!r}") from None
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in shape):
            raise TypeError(f"normalized_shape must be an int or a tuple of ints, got {normalized_shape!r}")
        shape = tuple(int(v) for v in shape)
    if not shape or len(shape) > x.ndim or tuple(x.shape[x.ndim - len(shape):]) != shape:
        raise ValueError(f"normalized_shape must be a non-empty tuple equal to x's trailing axes, "
                         f"got {normalized_shape!r} for x of shape {tuple(x.shape)}")
    if int(np.prod(shape)) == 0:
        raise ValueError(f"normalized_shape must have no zero-sized axis, got {shape}")
    return shape


def _row_problem(x, normalized_shape):
    """(normalized shape, batch shape): x is (*batch, *normalized shape)."""
    _validate.check_float_dtype("x", x)
    shape = _normalized_shape(x, normalized_shape)
    batch = tuple(x.shape[:x.ndim - len(shape)])
    return shape, batch


def _group_problem(x, num_groups, layout):
    _validate.check_layout(layout, LAYOUTS)
    _validate.check_float_dtype("x", x)
    if not 2 <= x.ndim <= 5:
        raise ValueError(f"x must be 2-D to 5-D ((N, C), (N, C, L), (N, C, H, W) or (N, C, D, H, W), "
                         f"channel-last for NHWC), got shape {tuple(x.shape)}")
    channels = x.shape[1 if layout == "NCHW" else -1]
    if isinstance(num_groups, bool) or not isinstance(num_groups, (int, np.integer)):
        raise TypeError(f"num_groups must be an int, got {num_groups!r}")
    if num_groups < 1 or channels % num_groups:
        raise ValueError(f"num_groups must be positive and divide the {channels} channels, got {num_groups}")
    return channels, int(num_groups)


# ---------------------------------------------------------------------- layer norm

def layer_norm(x, normalized_shape, gamma=None, beta=None, eps=1e-5, return_stats=False):
    """Normalize over the trailing ``normalized_shape`` axes (``F.layer_norm``).
    gamma/beta have ``normalized_shape``; ``return_stats=True`` returns
    ``(y, mean, rstd)`` with the batch (leading) shape."""
    xp = _validate.array_module(x=x, gamma=gamma, beta=beta)
    shape, batch = _row_problem(x, normalized_shape)
    eps = _validate.real_number("eps", eps, 0.0)
    _validate.parameter_dtype(x.dtype, gamma=gamma, beta=beta)
    _check_params(shape, "normalized_shape", gamma=gamma, beta=beta)
    return_stats = _validate.check_bool("return_stats", return_stats)
    y, mean, rstd = _rows_forward(xp, x.reshape(-1, int(np.prod(shape))),
                                  1, _flat(gamma), _flat(beta), eps, "NCHW", False)
    y = y.reshape(x.shape)
    return (y, mean.reshape(batch), rstd.reshape(batch)) if return_stats else y


def layer_norm_backward(dy, x, normalized_shape, gamma=None, *, eps=1e-5, mean=None, rstd=None):
    """``(dx, dgamma, dbeta)``; ``mean``/``rstd`` are the saved statistics (None:
    recomputed from x).  dgamma/dbeta have ``normalized_shape``.  ``dy=None`` is a zero gradient."""
    xp = _validate.array_module(dy=dy, x=x, gamma=gamma, mean=mean, rstd=rstd)
    shape, batch = _row_problem(x, normalized_shape)
    eps = _validate.real_number("eps", eps, 0.0)
    _check_dy(dy, x)
    pdtype = _validate.parameter_dtype(x.dtype, gamma=gamma)
    _check_params(shape, "normalized_shape", gamma=gamma)
    _validate.check_pair("mean", mean, "rstd", rstd)
    _check_stats(x.dtype, batch, mean=mean, rstd=rstd)
    L = int(np.prod(shape))
    dx, dgamma, dbeta = _rows_backward(xp, _rows(dy, L), x.reshape(-1, L), 1, _flat(gamma),
                                       _flat(mean), _flat(rstd), eps, "NCHW", pdtype, False)
    return dx.reshape(x.shape), dgamma.reshape(shape), dbeta.reshape(shape)


def _default_rms_eps(dtype, eps):
    """PyTorch's default: the machine epsilon of the type it computes in -- float32 for
    float16/bfloat16 x (checked against torch 2.11 on the H100: 1.19e-7, not 9.8e-4)."""
    if eps is None:
        return float(np.finfo(_dtypes.accumulate_dtype(dtype)).eps)
    return _validate.real_number("eps", eps, 0.0)


def rms_norm(x, normalized_shape, gamma=None, eps=None, return_stats=False):
    """``x / sqrt(mean(x^2) + eps) * gamma`` over the trailing ``normalized_shape``
    axes (``F.rms_norm``; eps None = the machine epsilon of the accumulation
    dtype, float32's for half x, as PyTorch).
    ``return_stats=True`` returns ``(y, rstd)``."""
    xp = _validate.array_module(x=x, gamma=gamma)
    shape, batch = _row_problem(x, normalized_shape)
    eps = _default_rms_eps(x.dtype, eps)
    _validate.parameter_dtype(x.dtype, gamma=gamma)
    _check_params(shape, "normalized_shape", gamma=gamma)
    return_stats = _validate.check_bool("return_stats", return_stats)
    y, _, rstd = _rows_forward(xp, x.reshape(-1, int(np.prod(shape))),
                               1, _flat(gamma), None, eps, "NCHW", True)
    y = y.reshape(x.shape)
    return (y, rstd.reshape(batch)) if return_stats else y


def rms_norm_backward(dy, x, normalized_shape, gamma=None, *, eps=None, rstd=None):
    """``(dx, dgamma)``; ``rstd`` is the saved statistic (None: recomputed).  ``dy=None``
    is a zero gradient."""
    xp = _validate.array_module(dy=dy, x=x, gamma=gamma, rstd=rstd)
    shape, batch = _row_problem(x, normalized_shape)
    eps = _default_rms_eps(x.dtype, eps)
    _check_dy(dy, x)
    pdtype = _validate.parameter_dtype(x.dtype, gamma=gamma)
    _check_params(shape, "normalized_shape", gamma=gamma)
    _check_stats(x.dtype, batch, rstd=rstd)
    L = int(np.prod(shape))
    dx, dgamma, _ = _rows_backward(xp, _rows(dy, L), x.reshape(-1, L), 1, _flat(gamma), None,
                                   _flat(rstd), eps, "NCHW", pdtype, True)
    return dx.reshape(x.shape), dgamma.reshape(shape)


# ---------------------------------------------------------------------- group and instance norm

def group_norm(x, num_groups, gamma=None, beta=None, eps=1e-5, layout="NCHW", return_stats=False):
    """Normalize each group of ``C / num_groups`` channels of each sample over the
    group's channels and positions (``F.group_norm``); gamma/beta per channel.
    ``return_stats=True`` returns ``(y, mean, rstd)`` of shape (N, num_groups)."""
    xp = _validate.array_module(x=x, gamma=gamma, beta=beta)
    channels, groups = _group_problem(x, num_groups, layout)
    eps = _validate.real_number("eps", eps, 0.0)
    _validate.parameter_dtype(x.dtype, gamma=gamma, beta=beta)
    _check_params((channels,), "one value per channel", gamma=gamma, beta=beta)
    return_stats = _validate.check_bool("return_stats", return_stats)
    y, mean, rstd = _rows_forward(xp, x, groups, gamma, beta, eps, layout, False)
    return (y, mean, rstd) if return_stats else y


def group_norm_backward(dy, x, num_groups, gamma=None, *, eps=1e-5, mean=None, rstd=None, layout="NCHW"):
    """``(dx, dgamma, dbeta)``; ``mean``/``rstd`` (N, num_groups) saved, or None.  ``dy=None``
    is a zero gradient."""
    xp = _validate.array_module(dy=dy, x=x, gamma=gamma, mean=mean, rstd=rstd)
    channels, groups = _group_problem(x, num_groups, layout)
    eps = _validate.real_number("eps", eps, 0.0)
    _check_dy(dy, x)
    pdtype = _validate.parameter_dtype(x.dtype, gamma=gamma)
    _check_params((channels,), "one value per channel", gamma=gamma)
    _validate.check_pair("mean", mean, "rstd", rstd)
    _check_stats(x.dtype, (x.shape[0], groups), mean=mean, rstd=rstd)
    return _rows_backward(xp, dy, x, groups, gamma, mean, rstd, eps, layout, pdtype, False)


def _instance_problem(x, layout):
    _validate.check_layout(layout, LAYOUTS)
    _validate.check_float_dtype("x", x)
    if not 3 <= x.ndim <= 5:
        raise ValueError(f"x must be 3-D to 5-D ((N, C, L), (N, C, H, W) or (N, C, D, H, W), "
                         f"channel-last for NHWC), got shape {tuple(x.shape)}")
    return x.shape[1 if layout == "NCHW" else -1]


def instance_norm(x, gamma=None, beta=None, running_mean=None, running_var=None, use_input_stats=True,
                  momentum=0.1, eps=1e-5, layout="NCHW", return_stats=False):
    """``F.instance_norm``: each (sample, channel) normalized over its positions.
    With ``use_input_stats`` the running statistics (when given) are updated in
    place with the batch average of the per-instance mean and unbiased variance;
    without it they normalize (then required; this is batch-norm inference).
    ``return_stats=True`` returns ``(y, mean, rstd)``, (N, C) with input
    statistics, (C,) from the running ones."""
    xp = _validate.array_module(x=x, gamma=gamma, beta=beta, running_mean=running_mean,
                                running_var=running_var)
    channels = _instance_problem(x, layout)
    if not isinstance(use_input_stats, (bool, np.bool_)):
        raise TypeError(f"use_input_stats must be a bool, got {use_input_stats!r}")
    momentum = _validate.real_number("momentum", momentum, 0.0, 1.0)
    eps = _validate.real_number("eps", eps, 0.0)
    _validate.parameter_dtype(x.dtype, gamma=gamma, beta=beta, running_mean=running_mean, running_var=running_var)
    _check_params((channels,), "one value per channel", gamma=gamma, beta=beta,
                  running_mean=running_mean, running_var=running_var)
    _validate.check_pair("running_mean", running_mean, "running_var", running_var)
    return_stats = _validate.check_bool("return_stats", return_stats)
    if use_input_stats:
        _validate.check_writeable(running_mean=running_mean, running_var=running_var)
    spatial = x.size // max(1, x.shape[0] * channels)
    if not use_input_stats:
        if running_mean is None:
            raise ValueError("running_mean and running_var are required when use_input_stats=False")
        from .normalization import batchnorm
        return batchnorm(x, gamma, beta, running_mean, running_var, training=False, eps=eps,
                         layout=layout, return_stats=return_stats)
    if running_mean is not None and x.size and spatial <= 1:  # (an empty x updates nothing)
        raise ValueError(f"x must have more than 1 spatial value per channel to update the running "
                         f"statistics, got shape {tuple(x.shape)}")
    y, mean, rstd = _rows_forward(xp, x, channels, gamma, beta, eps, layout, False)
    if running_mean is not None and x.size:
        acc = mean.dtype
        var = 1 / (rstd * rstd) - acc.type(eps)  # the biased per-instance variance
        unbiased = var * acc.type(spatial / (spatial - 1))
        m = acc.type(momentum)
        running_mean[...] = ((1 - m) * running_mean.astype(acc) + m * mean.mean(axis=0)).astype(running_mean.dtype)
        running_var[...] = ((1 - m) * running_var.astype(acc) + m * unbiased.mean(axis=0)).astype(running_var.dtype)
    return (y, mean, rstd) if return_stats else y


def instance_norm_backward(dy, x, gamma=None, *, running_mean=None, running_var=None, use_input_stats=True,
                           eps=1e-5, mean=None, rstd=None, layout="NCHW"):
    """``(dx, dgamma, dbeta)``.  With input statistics this is group norm's backward
    with one channel per group (``mean``/``rstd`` (N, C) saved, or None);
    without, the running statistics are constants: dx = dy * gamma / sqrt(running_var + eps).
    ``dy=None`` is a zero gradient."""
    xp = _validate.array_module(dy=dy, x=x, gamma=gamma, running_mean=running_mean, running_var=running_var,
                                mean=mean, rstd=rstd)
    channels = _instance_problem(x, layout)
    use_input_stats = _validate.check_bool("use_input_stats", use_input_stats)
    eps = _validate.real_number("eps", eps, 0.0)
    _check_dy(dy, x)
    pdtype = _validate.parameter_dtype(x.dtype, gamma=gamma)
    # the running statistics are checked as the forward checks them, used or not
    _validate.parameter_dtype(x.dtype, gamma=gamma, running_mean=running_mean, running_var=running_var)
    _check_params((channels,), "one value per channel", gamma=gamma, running_mean=running_mean,
                  running_var=running_var)
    _validate.check_pair("running_mean", running_mean, "running_var", running_var)
    if use_input_stats:
        _validate.check_pair("mean", mean, "rstd", rstd)
        _check_stats(x.dtype, (x.shape[0], channels), mean=mean, rstd=rstd)
        return _rows_backward(xp, dy, x, channels, gamma, mean, rstd, eps, layout, pdtype, False)
    if running_mean is None:
        raise ValueError("running_mean and running_var are required when use_input_stats=False")
    return _constant_stats_backward(xp, dy, x, gamma, running_mean, running_var, eps, layout, pdtype)


def _constant_stats_backward(xp, dy, x, gamma, running_mean, running_var, eps, layout, pdtype):
    """Gradients of y = (x - rm) / sqrt(rv + eps) * gamma + beta (the statistics are
    constants): an elementwise formula and two per-channel sums, in array code."""
    if dy is None:  # a zero output gradient
        channels = x.shape[1 if layout == "NCHW" else -1]
        return xp.zeros(x.shape, x.dtype), xp.zeros(channels, pdtype), xp.zeros(channels, pdtype)
    acc = _dtypes.accumulate_dtype(x.dtype)
    shape = [1] * x.ndim
    shape[1 if layout == "NCHW" else -1] = -1
    axes = tuple(a for a in range(x.ndim) if a != (1 if layout == "NCHW" else x.ndim - 1))
    invstd = (1 / xp.sqrt(running_var.astype(acc) + acc.type(eps))).reshape(shape)
    d = dy.astype(acc)
    xhat = (x.astype(acc) - running_mean.astype(acc).reshape(shape)) * invstd
    scale = invstd if gamma is None else invstd * gamma.astype(acc).reshape(shape)
    return ((d * scale).astype(x.dtype), (d * xhat).sum(axis=axes).astype(pdtype),
            d.sum(axis=axes).astype(pdtype))


def _flat(a):
    return None if a is None else a.reshape(-1)


def _rows(a, L):
    """a as (rows, L); None stays None (a zero output gradient)."""
    return None if a is None else a.reshape(-1, L)


# ---------------------------------------------------------------------- dispatch
# `x` is (N, ...) with rows (n, g); layer norm passes x as 2-D (rows, L) with one group.

def _rows_forward(xp, x, groups, gamma, beta, eps, layout, rms):
    if xp is np:
        if x.size == 0:
            return _empty_forward(np, x, groups, rms)
        y, mean, rstd = reference.normalize_rows(x, groups, gamma, beta, eps, layout, rms)
        return y, (np.zeros_like(rstd) if rms else mean), rstd
    if x.size == 0:
        return _empty_forward(xp, x, groups, rms)
    return _forward_gpu(xp, x, groups, gamma, beta, eps, layout, rms)


def _empty_forward(xp, x, groups, rms):
    acc = _dtypes.accumulate_dtype(x.dtype)
    nan = xp.full((x.shape[0], groups), np.nan, dtype=acc)
    return xp.empty(x.shape, x.dtype), nan, nan.copy()


def _rows_backward(xp, dy, x, groups, gamma, mean, rstd, eps, layout, pdtype, rms):
    channels = x.shape[1 if layout == "NCHW" else -1]
    if x.size == 0 or dy is None:  # nothing to compute, or a zero output gradient
        zeros = xp.zeros(channels, pdtype)
        return xp.zeros(x.shape, x.dtype), zeros, zeros.copy()
    if xp is np:
        return reference.normalize_rows_backward(dy, x, groups, gamma, mean, rstd, eps, layout, pdtype, rms)
    return _backward_gpu(xp, dy, x, groups, gamma, mean, rstd, eps, layout, pdtype, rms)


class _Rows:
    """Row geometry, vector width, block size and cache decision for one call."""

    def __init__(self, x, groups, layout, arrays, cached_tensors, cache_limit=CACHE_BYTES):
        self.t = _dtypes.cuda_type(x.dtype)
        self.nhwc = layout == "NHWC"
        n = x.shape[0]
        channels = x.shape[-1] if self.nhwc else x.shape[1]
        self.rows = n * groups
        self.K = channels // groups
        self.S = x.size // (n * channels)
        self.M = self.K * self.S
        self.groups = groups
        vec = _VECTOR[self.t]
        fits = (self.K % vec == 0) if self.nhwc else (self.S == 1 or self.S % vec == 0)
        aligned = all(a.data.ptr % 16 == 0 for a in arrays if a is not None)
        self.vec = vec if fits and self.M % vec == 0 and aligned else 1
        self.index_t = index_type(x.size + self.M)
        self.it = np.int32 if self.index_t == "int" else np.int64
        vectors = self.M // self.vec
        self.block = int(min(1024, max(32, 1 << max(0, (ceil_div(vectors, 2) - 1).bit_length()))))
        cache_bytes = cached_tensors * self.M * x.itemsize
        self.cache = cache_bytes <= cache_limit
        self.shared = cache_bytes if self.cache else 0

    def spec(self, kernel, param_type):
        return f"{kernel}<{self.t}, {param_type}, {self.index_t}, {self.vec}>"

    def geometry(self):
        return (self.it(self.K), self.it(self.S), np.int32(self.groups), np.int32(self.nhwc))


_RAISED = {}  # (device, expression) -> the dynamic shared memory limit set on it
_MAX_BLOCK = {}  # (device, expression) -> the largest block its registers allow


def _launch_rows(expr, rows, args, per_warp_bytes=0):
    """One block per row; `per_warp_bytes` of dynamic shared memory per warp
    after the (16-byte rounded) row cache."""
    import cupy
    kernel = FAMILY.function(expr)
    key = (cupy.cuda.runtime.getDevice(), expr)
    most = _MAX_BLOCK.get(key)
    if most is None:  # a half-type backward at 1024 threads needs more than 64 registers each
        most = _MAX_BLOCK[key] = kernel.max_threads_per_block // 32 * 32
    block = min(rows.block, most)
    shared = rows.shared
    if per_warp_bytes:
        shared = ceil_div(shared, 16) * 16 + block // 32 * per_warp_bytes
    _raise_shared(kernel, key, shared)
    kernel((rows.rows,), (block,), args, shared_mem=shared)


def _cache_limit(cp):
    """Row-cache bytes of the group-norm backward: BIG_CACHE lets a row block
    take what the device allows one block (less the plane sums and static data)."""
    if not BIG_CACHE:
        return CACHE_BYTES
    return max(CACHE_BYTES, _optin(cp) - _PLANE_SUMS_BYTES - 1024)


_NULL = np.uint64(0)  # a null pointer argument


def _param_or_null(cp, a):
    return _NULL if a is None else _validate.contiguous(cp, a)


def _optin(cp):
    device = cp.cuda.runtime.getDevice()
    optin = _OPTIN.get(device)
    if optin is None:
        try:
            optin = int(cp.cuda.Device(device).attributes["MaxSharedMemoryPerBlockOptin"])
        except Exception:  # attribute unknown: the default limit
            optin = 48 * 1024
        _OPTIN[device] = optin
    return optin


_PERSISTENT = {}  # (device, expression, block, shared) -> blocks resident at once, 0 if unknown


def _resident_blocks(cp, kernel, expr, block, shared):
    key = (cp.cuda.runtime.getDevice(), expr, block, shared)
    resident = _PERSISTENT.get(key)
    if resident is None:
        resident = 0
        if block <= kernel.max_threads_per_block:
            try:
                from cupy_backends.cuda.api import driver
                per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, block, shared)
                resident = int(per_sm) * int(cp.cuda.Device().attributes["MultiProcessorCount"])
            except Exception:  # no occupancy API: the one-block-per-row kernel
                resident = 0
        _PERSISTENT[key] = resident
    return resident


def _raise_shared(kernel, key, shared):
    # Opt in above the default: 48 KB for static and dynamic shared memory
    # together, so the kernels' static bytes (at most 1 KB, as every limit here
    # assumes) count too (review8a).
    if shared + 1024 > 48 * 1024 and _RAISED.get(key, 0) < shared:
        kernel.max_dynamic_shared_size_bytes = shared
        _RAISED[key] = shared


def _pipelined_forward(cp, x, y, gamma, beta, mean, rstd, rows, pt, eps):
    """Launch gn_rows_forward_pipelined and return True, or False when it does not apply."""
    if not (PIPELINED_FORWARD and not rows.nhwc and rows.S > 1 and rows.vec > 1):
        return False
    row_bytes = ceil_div(rows.M * x.itemsize, 16) * 16
    shared = 2 * row_bytes
    if shared > _optin(cp) - 1024:
        return False
    expr = f"gn_rows_forward_pipelined<{rows.t}, {pt}, {rows.index_t}, {rows.vec}>"
    kernel = FAMILY.function(expr)
    key = (cp.cuda.runtime.getDevice(), expr)
    block = min(rows.block, kernel.max_threads_per_block // 32 * 32)
    _raise_shared(kernel, key, shared)
    resident = _resident_blocks(cp, kernel, expr, block, shared)
    if resident <= 0:
        return False
    grid = min(rows.rows, resident, _PIPELINE_GRID_CAP or resident)
    kernel((grid,), (block,),
           (x, y, _param_or_null(cp, gamma), _param_or_null(cp, beta), mean, rstd, rows.it(rows.K),
            rows.it(rows.S), np.int32(rows.groups), rows.it(rows.rows), eps), shared_mem=shared)
    return True


def _cluster_forward_on(t):
    return CLUSTER_FORWARD is True or (isinstance(CLUSTER_FORWARD, tuple) and t in CLUSTER_FORWARD)


def _cluster_forward_shape(rows, itemsize, acc_itemsize, optin):
    """(CL, threads, dynamic shared bytes) of gn_rows_forward_cluster for these rows,
    or None where even the largest cluster's share exceeds the opt-in."""
    plane = rows.S * itemsize
    sizes = [c for c in _CLUSTER_SIZES if rows.K % c == 0]
    cl = next((c for c in sizes if rows.K // c * plane <= CLUSTER_FORWARD_BYTES), sizes[-1])
    kb = rows.K // cl
    vectors = kb * plane // 16
    block = min(_CLUSTER_THREADS, max(64, 1 << max(0, (ceil_div(vectors, CLUSTER_FORWARD_ITEMS) - 1).bit_length())))
    shared = kb * plane + 2 * kb * acc_itemsize
    if shared > optin - _CLUSTER_STATIC_BYTES:
        return None
    return cl, block, shared


def _cluster_forward(cp, x, y, gamma, beta, mean, rstd, rows, pt, eps):
    """Launch gn_rows_forward_cluster and return True, or False when it does not apply
    or the driver refused its clusters (then nothing ran)."""
    global cluster_refusals
    if (rows.nhwc or rows.vec == 1 or rows.S < 2 or (rows.S * x.itemsize) % 16
            or rows.M * x.itemsize < CLUSTER_FORWARD_MIN_ROW_BYTES):
        return False
    cc, optin = _cluster_facts(cp)
    if cc < 90:
        return False
    shape = _cluster_forward_shape(rows, x.itemsize, np.dtype(mean.dtype).itemsize, optin)
    if shape is None or rows.rows * shape[0] >= 2**31:
        return False
    cl, block, shared = shape
    expr = f"gn_rows_forward_cluster<{rows.t}, {pt}, {rows.index_t}, {cl}>"
    device = cp.cuda.runtime.getDevice()
    if (device, expr, block, shared) in _CLUSTER_REFUSED:
        return False
    kernel = FAMILY.function(expr)
    _raise_shared(kernel, (device, expr), shared)
    try:
        kernel((rows.rows * cl,), (block,),
               (x, y, _param_or_null(cp, gamma), _param_or_null(cp, beta), mean, rstd, rows.it(rows.K),
                rows.it(rows.S), np.int32(rows.groups), eps), shared_mem=shared)
    except Exception as e:  # CuPy's CUDADriverError (status: the CUresult)
        if getattr(e, "status", None) not in _CLUSTER_REFUSALS:
            raise
        _CLUSTER_REFUSED.add((device, expr, block, shared))
        cluster_refusals += 1
        return False
    return True


def _pipelined_kernel(cp, name, rows, pt, shared):
    """(kernel, grid) of the pipelined rows kernel `name` with a ring of `shared` bytes a
    block: the persistent grid of the blocks resident at once (capped by the rows and
    _PIPELINE_GRID_CAP); None when the ring does not fit or no block is resident."""
    if shared > _optin(cp) - 1024:
        return None
    expr = f"{name}<{rows.t}, {pt}, {rows.index_t}, {rows.vec}>"
    kernel = FAMILY.function(expr)
    _raise_shared(kernel, (cp.cuda.runtime.getDevice(), expr), shared)
    resident = _resident_blocks(cp, kernel, expr, rows.block, shared)
    if resident <= 0:
        return None
    return kernel, min(rows.rows, resident, _PIPELINE_GRID_CAP or resident)


def _layer_forward_pipelined(cp, x, y, gamma, beta, mean, rstd, rows, pt, eps, rms):
    """Launch norm_rows_forward_pipelined and return True, or False when it does not apply
    (then nothing was launched)."""
    if not (rows.t in LAYER_FORWARD_PIPELINED and not rows.nhwc and rows.S == 1 and rows.groups == 1 and rows.vec > 1
            and rows.block * _FUSED_ITEMS * rows.vec >= rows.M):
        return False
    shared = _FUSED_STAGES * _FUSED_ITEMS * rows.block * 16  # 16-byte slots: stage, item, thread
    ready = _pipelined_kernel(cp, "norm_rows_forward_pipelined", rows, pt, shared)
    if ready is None:
        return False
    kernel, grid = ready
    kernel((grid,), (rows.block,), (x, y, _param_or_null(cp, gamma), _param_or_null(cp, beta), mean, rstd,
                                    rows.it(rows.rows), rows.it(rows.M), eps, np.int32(rms)), shared_mem=shared)
    return True


def _layer_forward_registers(cp, x, y, gamma, beta, mean, rstd, rows, pt, eps, rms):
    """Launch norm_rows_forward_regs and return True, or False when it does not apply
    (then nothing was launched).  Writes mean (0 for RMS) and rstd."""
    if not (LAYER_FORWARD_REGISTERS and rows.t in LAYER_FORWARD_REGISTERS and not rows.nhwc and rows.S == 1
            and rows.groups == 1 and rows.vec > 1 and rows.block * _FUSED_ITEMS * rows.vec >= rows.M):
        return False
    r = LAYER_FORWARD_ROWS
    if r not in _REGS_ROWS:
        raise ValueError(f"LAYER_FORWARD_ROWS must be one of {_REGS_ROWS}, got {r!r}")
    expr = f"norm_rows_forward_regs<{rows.t}, {pt}, {rows.index_t}, {rows.vec}, {r}>"
    kernel = FAMILY.function(expr)
    key = (cp.cuda.runtime.getDevice(), expr)
    most = _MAX_BLOCK.get(key)
    if most is None:
        most = _MAX_BLOCK[key] = kernel.max_threads_per_block // 32 * 32
    if rows.block > most:  # the row would not fit 2 vectors a thread of a block the registers allow
        return False
    kernel((ceil_div(rows.rows, r),), (rows.block,),
           (x, y, _param_or_null(cp, gamma), _param_or_null(cp, beta), mean, rstd,
            rows.it(rows.rows), rows.it(rows.M), eps, np.int32(rms)))
    return True


def _odd_shape(M):
    """(I, threads) of norm_rows_forward_odd for rows of M values, or None when
    the row exceeds 16 values a thread of 1024 threads."""
    for items in _ODD_ITEMS:
        block = ceil_div(ceil_div(M, items), 32) * 32
        if block <= _ODD_BLOCK:
            return items, block
    items = _ODD_ITEMS[-1]
    block = ceil_div(ceil_div(M, items), 32) * 32
    return (items, block) if block <= 1024 else None


def _layer_forward_odd(cp, x, y, gamma, beta, mean, rstd, rows, pt, eps, rms):
    """Launch norm_rows_forward_odd and return True, or False when it does not apply
    (then nothing was launched).  Writes mean (0 for RMS) and rstd."""
    if not (LAYER_FORWARD_ODD and rows.t in LAYER_FORWARD_ODD and not rows.nhwc and rows.S == 1
            and rows.groups == 1 and rows.vec == 1):
        return False
    shape = _odd_shape(rows.M)
    if shape is None:
        return False
    items, block = shape
    expr = f"norm_rows_forward_odd<{rows.t}, {pt}, {rows.index_t}, {items}>"
    kernel = FAMILY.function(expr)
    key = (cp.cuda.runtime.getDevice(), expr)
    most = _MAX_BLOCK.get(key)
    if most is None:
        most = _MAX_BLOCK[key] = kernel.max_threads_per_block // 32 * 32
    if block > most:
        return False
    kernel((rows.rows,), (block,),
           (x, y, _param_or_null(cp, gamma), _param_or_null(cp, beta), mean, rstd, rows.it(rows.M), eps,
            np.int32(rms)))
    return True


def _forward_gpu(cp, x, groups, gamma, beta, eps, layout, rms, write_y=True):
    acc = _dtypes.accumulate_dtype(x.dtype)
    x = _validate.contiguous(cp, x)
    y = cp.empty(x.shape, x.dtype) if write_y else None
    rows = _Rows(x, groups, layout, (x, y), 1)
    mean = cp.empty((x.shape[0], groups), acc)
    rstd = cp.empty((x.shape[0], groups), acc)
    pdtype = next((p.dtype for p in (gamma, beta) if p is not None), x.dtype)
    real = np.float32 if acc == np.float32 else np.float64
    if write_y and not rms and _cluster_forward_on(rows.t) and _cluster_forward(cp, x, y, gamma, beta, mean, rstd, rows,
                                                                    _dtypes.cuda_type(pdtype), real(eps)):
        return y, mean, rstd
    if write_y and not rms and _pipelined_forward(cp, x, y, gamma, beta, mean, rstd, rows,
                                                  _dtypes.cuda_type(pdtype), real(eps)):
        return y, mean, rstd
    if write_y and _layer_forward_pipelined(cp, x, y, gamma, beta, mean, rstd, rows, _dtypes.cuda_type(pdtype),
                                            real(eps), rms):
        if rms:
            mean[...] = 0
        return y, mean, rstd
    if write_y and _layer_forward_registers(cp, x, y, gamma, beta, mean, rstd, rows, _dtypes.cuda_type(pdtype),
                                            real(eps), rms):
        return y, mean, rstd
    if write_y and _layer_forward_odd(cp, x, y, gamma, beta, mean, rstd, rows, _dtypes.cuda_type(pdtype),
                                      real(eps), rms):
        return y, mean, rstd
    _launch_rows(rows.spec("norm_rows_forward", _dtypes.cuda_type(pdtype)), rows,
                 (x, _NULL if y is None else y, _param_or_null(cp, gamma), _param_or_null(cp, beta), mean, rstd,
                  *rows.geometry(), real(eps), np.int32(rms), np.int32(rows.cache), np.int32(write_y)))
    if rms:
        mean[...] = 0
    return y, mean, rstd


def _backward_gpu(cp, dy, x, groups, gamma, mean, rstd, eps, layout, pdtype, rms):
    acc = _dtypes.accumulate_dtype(x.dtype)
    x = _validate.contiguous(cp, x)
    dy = _validate.contiguous(cp, dy)
    if rstd is None:
        _, mean, rstd = _forward_gpu(cp, x, groups, None, None, eps, layout, rms, write_y=False)
    else:
        rstd = _validate.contiguous(cp, rstd)
        mean = rstd if rms else _validate.contiguous(cp, mean)  # unread for RMS
    dx = cp.empty(x.shape, x.dtype)
    planes = not rms and layout != "NHWC" and x.ndim > 2 and x.size // (x.shape[0] * x.shape[1]) > 1
    rows = _Rows(x, groups, layout, (x, dy, dx), 2, _cache_limit(cp) if planes else CACHE_BYTES)
    pt = _dtypes.cuda_type(pdtype)
    if FUSED_BACKWARD and not rows.nhwc and rows.S == 1 and rows.groups == 1:
        fused = _fused_backward(cp, dy, x, gamma, mean, rstd, dx, rows, pt, pdtype, acc, rms)
        if fused is not None:
            return (dx, *fused)
    if planes and CLUSTER_BACKWARD:
        done = _cluster_backward(cp, dy, x, gamma, mean, rstd, dx, rows, pt, pdtype, acc)
        if done is not None:
            return (dx, *done)
    if planes and PIPELINED_BACKWARD is not None:
        done = _pipelined_backward(cp, dy, x, gamma, mean, rstd, dx, rows, pt, pdtype, acc)
        if done is not None:
            return (dx, *done)
    if planes and GN_BACKWARD is not None:
        done = _gn_backward(cp, dy, x, gamma, mean, rstd, dx, rows, pt, pdtype, acc)
        if done is not None:
            return (dx, *done)
    per_warp = 2 * rows.K * np.dtype(acc).itemsize  # plane sums: one slice per warp
    if (PLANE_SUMS and planes and rows.S >= 32 * rows.vec and
            rows.block // 32 * per_warp <= _PLANE_SUMS_BYTES):
        n, channels = x.shape[0], rows.groups * rows.K
        part = cp.empty((2, n, channels), acc)
        _launch_rows(rows.spec("norm_rows_backward", pt), rows,
                     (dy, x, _param_or_null(cp, gamma), mean, rstd, dx, *rows.geometry(), np.int32(rms),
                      np.int32(rows.cache), part[0], part[1], np.int32(1)), per_warp)
        return (dx, *_finish_param_grads(cp, part[0], part[1], n, channels, rows.t, pdtype))
    _launch_rows(rows.spec("norm_rows_backward", pt), rows,
                 (dy, x, _param_or_null(cp, gamma), mean, rstd, dx, *rows.geometry(), np.int32(rms),
                  np.int32(rows.cache), _NULL, _NULL, np.int32(0)))
    dgamma, dbeta = _param_grads(cp, dy, x, mean, rstd, rows, layout, pdtype, acc, rms)
    return dx, dgamma, dbeta


def _pipelined_backward(cp, dy, x, gamma, mean, rstd, dx, rows, pt, pdtype, acc):
    """(dgamma, dbeta) after gn_rows_backward_pipelined wrote dx, or None when it
    does not apply (then nothing was launched)."""
    if rows.nhwc or rows.vec == 1 or rows.S < 32 * rows.vec:
        return None
    expr = rows.spec("gn_rows_backward_pipelined", pt)
    kernel = FAMILY.function(expr)
    block = min(rows.block, kernel.max_threads_per_block // 32 * 32)
    row_bytes = ceil_div(rows.M * x.itemsize, 16) * 16
    tail = (block // 32 * 4 * rows.K + 3 * rows.K) * np.dtype(acc).itemsize  # plane slices, totals
    limit = _optin(cp) - 1024
    dy_smem = PIPELINED_BACKWARD == "both" and 4 * row_bytes + tail <= limit
    shared = (4 if dy_smem else 2) * row_bytes + tail
    if shared > limit:
        return None
    _raise_shared(kernel, (cp.cuda.runtime.getDevice(), expr), shared)
    resident = _resident_blocks(cp, kernel, expr, block, shared)
    if resident <= 0:
        return None
    n, channels = x.shape[0], rows.groups * rows.K
    part = cp.empty((2, n, channels), acc)
    grid = min(rows.rows, resident, _PIPELINE_GRID_CAP or resident)
    kernel((grid,), (block,), (dy, x, _param_or_null(cp, gamma), mean, rstd, dx, rows.it(rows.K), rows.it(rows.S),
                               np.int32(rows.groups), rows.it(rows.rows), part[0], part[1], np.int32(dy_smem),
                               np.int32((PIPELINED_BACKWARD == "xl2") | PIPELINED_BACKWARD_LATE << 1 |
                                        PIPELINED_BACKWARD_BULK << 2)), shared_mem=shared)
    return _finish_param_grads(cp, part[0], part[1], n, channels, rows.t, pdtype)


def _cluster_facts(cp):
    """(compute capability as 90 for sm_90, per-block shared-memory opt-in) of the current device."""
    from .normalization import _device_facts
    cc, optin, _ = _device_facts(cp, cp.cuda.runtime.getDevice())
    return cc, optin


def _cluster_shape(rows, itemsize, acc_itemsize, optin):
    """(CL, threads, dynamic shared bytes) of gn_rows_backward_cluster for these
    rows, or None where even the largest cluster's shares exceed the opt-in.  CL:
    the smallest cluster size (dividing K) whose shares fit CLUSTER_BLOCK_BYTES,
    else the largest (the smallest shares: still x and dy read once, which beat
    the pipelined kernel at every budget measured)."""
    plane = rows.S * itemsize
    sizes = [c for c in _CLUSTER_SIZES if rows.K % c == 0]
    cl = next((c for c in sizes if 2 * rows.K // c * plane <= CLUSTER_BLOCK_BYTES), sizes[-1])
    kb = rows.K // cl
    vectors = kb * plane // 16
    block = min(_CLUSTER_THREADS, max(64, 1 << max(0, (ceil_div(vectors, 8) - 1).bit_length())))
    shared = 2 * kb * plane + (2 * max(kb, block // 32) + kb) * acc_itemsize
    if shared > optin - _CLUSTER_STATIC_BYTES:
        return None
    return cl, block, shared


def _cluster_backward(cp, dy, x, gamma, mean, rstd, dx, rows, pt, pdtype, acc):
    """(dgamma, dbeta) after gn_rows_backward_cluster wrote dx, or None when it
    does not apply or the driver refused its clusters (then nothing ran)."""
    global cluster_refusals
    if _register_backward_on(rows.t):  # the same split with x and dy in registers
        done = _register_backward(cp, dy, x, gamma, mean, rstd, dx, rows, pt, pdtype, acc)
        if done is not None:
            return done
    if (rows.nhwc or rows.vec == 1 or rows.S < 2 or (rows.S * x.itemsize) % 16
            or 2 * rows.M * x.itemsize < CLUSTER_MIN_ROW_BYTES):
        return None
    cc, optin = _cluster_facts(cp)
    if cc < 90:
        return None
    shape = _cluster_shape(rows, x.itemsize, np.dtype(acc).itemsize, optin)
    if shape is None:
        return None
    cl, block, shared = shape
    expr = f"gn_rows_backward_cluster<{rows.t}, {pt}, {rows.index_t}, {cl}>"
    device = cp.cuda.runtime.getDevice()
    if (device, expr, block, shared) in _CLUSTER_REFUSED:
        return None
    kernel = FAMILY.function(expr)
    _raise_shared(kernel, (device, expr), shared)
    n, channels = x.shape[0], rows.groups * rows.K
    part = cp.empty((2, n, channels), acc)
    try:
        kernel((rows.rows * cl,), (block,), (dy, x, _param_or_null(cp, gamma), mean, rstd, dx, rows.it(rows.K),
                                             rows.it(rows.S), np.int32(rows.groups), part[0], part[1]),
               shared_mem=shared)
    except Exception as e:  # CuPy's CUDADriverError (status: the CUresult)
        if getattr(e, "status", None) not in _CLUSTER_REFUSALS:
            raise
        _CLUSTER_REFUSED.add((device, expr, block, shared))
        cluster_refusals += 1
        return None
    return _finish_param_grads(cp, part[0], part[1], n, channels, rows.t, pdtype)


def _register_backward_on(t):
    return REGISTER_BACKWARD is True or (isinstance(REGISTER_BACKWARD, tuple) and t in REGISTER_BACKWARD)


def _register_shape(rows, itemsize):
    """(CL, ITEMS, threads a plane, threads) of gn_rows_backward_registers for these
    rows, or None where it does not apply (planes under 32 vectors, or no cluster
    size dividing K gives blocks of at most _CLUSTER_THREADS)."""
    if REGISTER_BACKWARD_ITEMS not in _REGISTER_ITEMS:
        raise ValueError(f"REGISTER_BACKWARD_ITEMS must be one of {_REGISTER_ITEMS}, got {REGISTER_BACKWARD_ITEMS}")
    plane = rows.S * itemsize
    pv = plane // 16
    if pv < 32:
        return None
    sizes = [c for c in _CLUSTER_SIZES if rows.K % c == 0]
    cl0 = next((c for c in sizes if 2 * rows.K // c * plane <= REGISTER_BACKWARD_BYTES), sizes[-1])
    # ITEMS: the switch's, else (blocks over _CLUSTER_THREADS) the other; 4 where a warp a plane holds it
    order = (4,) if pv <= 4 * 32 else sorted(_REGISTER_ITEMS, key=lambda n: (n < REGISTER_BACKWARD_ITEMS, n))
    for items in order:
        tpp = 32 * ceil_div(ceil_div(pv, items), 32)
        cl = next((c for c in sizes if c >= cl0 and rows.K // c * tpp <= _CLUSTER_THREADS), None)
        if cl is not None:
            return cl, items, tpp, rows.K // cl * tpp
    return None


def _register_backward(cp, dy, x, gamma, mean, rstd, dx, rows, pt, pdtype, acc):
    """(dgamma, dbeta) after gn_rows_backward_registers wrote dx, or None when it
    does not apply or the driver refused its clusters (then nothing ran)."""
    global cluster_refusals
    if (rows.nhwc or rows.vec == 1 or rows.S < 2 or (rows.S * x.itemsize) % 16
            or 2 * rows.M * x.itemsize < REGISTER_BACKWARD_MIN_ROW_BYTES):
        return None
    cc, _ = _cluster_facts(cp)
    if cc < 90:
        return None
    shape = _register_shape(rows, x.itemsize)
    if shape is None:
        return None
    cl, items, tpp, block = shape
    expr = f"gn_rows_backward_registers<{rows.t}, {pt}, {rows.index_t}, {cl}, {items}>"
    device = cp.cuda.runtime.getDevice()
    if (device, expr, block, 0) in _CLUSTER_REFUSED:
        return None
    kernel = FAMILY.function(expr)
    if block > kernel.max_threads_per_block:  # not with its registers
        return None
    n, channels = x.shape[0], rows.groups * rows.K
    part = cp.empty((2, n, channels), acc)
    try:
        kernel((rows.rows * cl,), (block,), (dy, x, _param_or_null(cp, gamma), mean, rstd, dx, rows.it(rows.K),
                                             rows.it(rows.S), np.int32(rows.groups), np.int32(tpp), part[0],
                                             part[1]))
    except Exception as e:  # CuPy's CUDADriverError (status: the CUresult)
        if getattr(e, "status", None) not in _CLUSTER_REFUSALS:
            raise
        _CLUSTER_REFUSED.add((device, expr, block, 0))
        cluster_refusals += 1
        return None
    if REGISTER_BACKWARD_WIDE_FINISH:
        return _finish_wide(cp, part, n, channels, rows, pt, pdtype, 8 if n <= 256 else 32)
    return _finish_param_grads(cp, part[0], part[1], n, channels, rows.t, pdtype)


def _gn_backward(cp, dy, x, gamma, mean, rstd, dx, rows, pt, pdtype, acc):
    """(dgamma, dbeta) after gn_rows_backward wrote dx, or None when no block size
    keeps a warp's range within two planes (then nothing was launched)."""
    expr = rows.spec("gn_rows_backward", pt)
    kernel = FAMILY.function(expr)
    most = kernel.max_threads_per_block // 32 * 32
    if GN_BACKWARD == "x":
        candidates = (min(rows.block, 512, most), min(rows.block, most))
        both_limit, x_limit = CACHE_BYTES, CACHE_BYTES
    else:
        candidates = (min(rows.block, most),)
        both_limit = x_limit = _cache_limit(cp)
    plane_vectors = rows.S // rows.vec
    vectors = rows.M // rows.vec
    block = next((b for b in candidates if ceil_div(vectors, b // 32) <= plane_vectors), None)
    if block is None:
        return None
    row_bytes = ceil_div(rows.M * x.itemsize, 16) * 16
    cache = 2 if 2 * row_bytes <= both_limit else 1 if row_bytes <= x_limit else 0
    shared = cache * row_bytes + (4 * (block // 32) + 2 * rows.K) * np.dtype(acc).itemsize
    _raise_shared(kernel, (cp.cuda.runtime.getDevice(), expr), shared)
    n, channels = x.shape[0], rows.groups * rows.K
    part = cp.empty((2, n, channels), acc)
    kernel((rows.rows,), (block,), (dy, x, _param_or_null(cp, gamma), mean, rstd, dx, rows.it(rows.K),
                                    rows.it(rows.S), np.int32(rows.groups), np.int32(cache), part[0], part[1]),
           shared_mem=shared)
    return _finish_param_grads(cp, part[0], part[1], n, channels, rows.t, pdtype)


_FUSED_GRID = {}  # (device, expression, block) -> blocks resident at once, 0 if unknown


def _fused_backward(cp, dy, x, gamma, mean, rstd, dx, rows, pt, pdtype, acc, rms):
    """(dgamma, dbeta) after norm_rows_backward_fused wrote dx, or None when the
    row does not fit its registers (then nothing was launched)."""
    if rows.block * _FUSED_ITEMS * rows.vec < rows.M:
        if LAYER_BACKWARD_ODD and rows.t in LAYER_BACKWARD_ODD and rows.vec == 1:
            return _odd_backward(cp, dy, x, gamma, mean, rstd, dx, rows, pt, pdtype, acc, rms)
        return None
    if LAYER_BACKWARD_PIPELINED and rows.vec > 1:
        done = _fused_pipelined_backward(cp, dy, x, gamma, mean, rstd, dx, rows, pt, pdtype, acc, rms)
        if done is not None:
            return done
    expr = rows.spec("norm_rows_backward_fused", pt)
    kernel = FAMILY.function(expr)
    key = (cp.cuda.runtime.getDevice(), expr, rows.block)
    resident = _FUSED_GRID.get(key)
    if resident is None:
        resident = 0
        if rows.block <= kernel.max_threads_per_block:
            try:
                from cupy_backends.cuda.api import driver
                per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, rows.block, 0)
                resident = int(per_sm) * int(cp.cuda.Device().attributes["MultiProcessorCount"])
            except Exception:  # no occupancy API: the unfused kernels
                resident = 0
        _FUSED_GRID[key] = resident
    if resident <= 0:
        return None
    grid = min(rows.rows, resident)
    channels = rows.M
    part = cp.empty((2, grid, channels), acc)
    kernel((grid,), (rows.block,), (dy, x, _param_or_null(cp, gamma), mean, rstd, dx, part[0], part[1],
                                    rows.it(rows.rows), rows.it(channels), np.int32(rms)))
    return _finish_wide(cp, part, grid, channels, rows, pt, pdtype, 8)


def _odd_backward(cp, dy, x, gamma, mean, rstd, dx, rows, pt, pdtype, acc, rms):
    """(dgamma, dbeta) after norm_rows_backward_odd wrote dx, or None when the row
    exceeds 16 values a thread of 1024 or no block fits (then nothing was launched)."""
    shape = _odd_shape(rows.M)
    if shape is None:
        return None
    items, block = shape
    expr = f"norm_rows_backward_odd<{rows.t}, {pt}, {rows.index_t}, {items}>"
    kernel = FAMILY.function(expr)
    key = (cp.cuda.runtime.getDevice(), expr, block)
    resident = _FUSED_GRID.get(key)
    if resident is None:
        resident = 0
        if block <= kernel.max_threads_per_block:
            try:
                from cupy_backends.cuda.api import driver
                per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, block, 0)
                resident = int(per_sm) * int(cp.cuda.Device().attributes["MultiProcessorCount"])
            except Exception:  # no occupancy API: the unfused kernels
                resident = 0
        _FUSED_GRID[key] = resident
    if resident <= 0:
        return None
    grid = min(rows.rows, resident)
    channels = rows.M
    part = cp.empty((2, grid, channels), acc)
    kernel((grid,), (block,), (dy, x, _param_or_null(cp, gamma), mean, rstd, dx, part[0], part[1],
                               rows.it(rows.rows), rows.it(channels), np.int32(rms)))
    return _finish_wide(cp, part, grid, channels, rows, pt, pdtype, 8)


def _fused_pipelined_backward(cp, dy, x, gamma, mean, rstd, dx, rows, pt, pdtype, acc, rms):
    """(dgamma, dbeta) after norm_rows_backward_fused_pipelined wrote dx, or None when
    its ring does not fit the shared memory or no block is resident (nothing launched)."""
    shared = _FUSED_STAGES * 2 * _FUSED_ITEMS * rows.block * 16  # 16-byte slots: stage, x / dy, item, thread
    ready = _pipelined_kernel(cp, "norm_rows_backward_fused_pipelined", rows, pt, shared)
    if ready is None:
        return None
    kernel, grid = ready
    channels = rows.M
    part = cp.empty((2, grid, channels), acc)
    kernel((grid,), (rows.block,), (dy, x, _param_or_null(cp, gamma), mean, rstd, dx, part[0], part[1],
                                    rows.it(rows.rows), rows.it(channels), np.int32(rms)), shared_mem=shared)
    return _finish_wide(cp, part, grid, channels, rows, pt, pdtype, 32)


def _finish_wide(cp, part, splits, channels, rows, pt, pdtype, lanes):
    """(dgamma, dbeta) from the (2, splits, channels) partials: norm_param_grads_finish_wide,
    `lanes` split lanes a block of 32 columns."""
    dgamma = cp.empty(channels, pdtype)
    dbeta = cp.empty(channels, pdtype)
    FAMILY.launch(f"norm_param_grads_finish_wide<{_ACC[rows.t]}, {pt}>", (ceil_div(channels, 32),), (32, lanes),
                  (part[0], part[1], dgamma, dbeta, np.int64(splits), np.int64(channels)))
    return dgamma, dbeta


def _param_grads(cp, dy, x, mean, rstd, rows, layout, pdtype, acc, rms):
    """dgamma/dbeta: x as (outer, P, inner) (see the .cu header), partials, then finish."""
    channels = rows.groups * rows.K
    it, t = rows.it, rows.t
    n = x.shape[0]
    if not rows.nhwc and rows.S > 1:  # group norm NCHW: one block per (n, c) plane
        splits = n
        part_g, part_b = cp.empty((splits, channels), acc), cp.empty((splits, channels), acc)
        FAMILY.launch(f"norm_param_grads_planes<{t}, {rows.index_t}>", (n * channels,), (256,),
                      (dy, x, mean, rstd, part_g, part_b, it(channels), it(rows.S), np.int32(rows.groups),
                       it(rows.K)))
    else:
        outer = n * rows.S  # layer norm: S == 1; NHWC: (N * S, C, 1)
        ostep = rows.S if rows.nhwc else 1
        col_blocks = ceil_div(channels, 32)
        splits = max(1, min(ceil_div(_SM_TARGET, col_blocks), ceil_div(outer, 64)))
        per_split = ceil_div(outer, splits)
        splits = ceil_div(outer, per_split)
        part_g, part_b = cp.empty((splits, channels), acc), cp.empty((splits, channels), acc)
        FAMILY.launch(f"norm_param_grads_columns<{t}, {rows.index_t}>", (col_blocks, splits), (32, 8),
                      (dy, x, mean, rstd, part_g, part_b, it(outer), it(channels), it(ostep),
                       np.int32(rows.groups), it(rows.K), it(per_split), np.int32(rms)))
    return _finish_param_grads(cp, part_g, part_b, splits, channels, t, pdtype)


def _finish_param_grads(cp, part_g, part_b, splits, channels, t, pdtype):
    """(dgamma, dbeta): the (splits, channels) partials added in split order."""
    dgamma = cp.empty(channels, pdtype)
    dbeta = cp.empty(channels, pdtype)
    FAMILY.launch(f"norm_param_grads_finish<{_ACC[t]}, {_dtypes.cuda_type(pdtype)}>",
                  (ceil_div(channels, 256),), (256,),
                  (part_g, part_b, dgamma, dbeta, np.int64(splits), np.int64(channels)))
    return dgamma, dbeta
