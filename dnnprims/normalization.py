"""Batch normalization, forward (training and inference) and backward (PyTorch semantics).

NumPy arrays run ``dnnprims.reference.normalization``; CuPy arrays run
``kernels/batchnorm.cu``.  ``x`` is (N, C), (N, C, L), (N, C, H, W) or
(N, C, D, H, W) with ``layout="NCHW"`` (channel axis 1), or channel-last with
``layout="NHWC"``.  Parameters (gamma, beta, running statistics) have x's
dtype, or float32 when x is float16/bfloat16 (the cuDNN rule); the saved
``mean``/``invstd`` are in the accumulation dtype (float32 for half x).
"""
import math

import numpy as np

from . import _dtypes, _kernels, _validate
from ._kernels import KernelFamily, ceil_div, index_type
from .reference import normalization as reference

LAYOUTS = ("NCHW", "NHWC")

# (storage type of x, storage type of the parameters)
_TYPE_PAIRS = (("half_t", "half_t"), ("half_t", "float"), ("bfloat16_t", "bfloat16_t"),
               ("bfloat16_t", "float"), ("float", "float"), ("double", "double"))
_X_TYPES = ("half_t", "bfloat16_t", "float", "double")
_INDEX_TYPES = ("int", "long long")
# Values per 16-byte vector access, by storage type (kernels/batchnorm.cu: VEC).
_VECTOR = {"half_t": 8, "bfloat16_t": 8, "float": 4, "double": 2}
_CHUNK = 4096  # values of one channel per block: BN_CHUNK in kernels/batchnorm.cu
_CLUSTER_SIZES = (1, 2, 4, 8)  # blocks per cluster of batchnorm_train_cluster (8: the portable limit)
_BOOL = ("false", "true")
# batchnorm_infer_packs<T, P, index_t, VEC, U, SPLIT> specialisations per storage
# type: (VEC, U, SPLIT) -- the 16-byte packs with one or four a thread, split or
# whole planes, and the 1-value fallback of misaligned tensors.
_PACKS_VARIANTS = {t: ((1, 1, "false"), *((_VECTOR[t], u, s) for u in (1, 4) for s in _BOOL))
                   for t in ("half_t", "bfloat16_t", "float", "double")}

FAMILY = KernelFamily("batchnorm.cu", [
    *(f"batchnorm_statistics<{t}, {p}, {i}, {v}, {f}>"
      for t, p in _TYPE_PAIRS for i in _INDEX_TYPES for v in (1, _VECTOR[t]) for f in _BOOL),
    *(f"batchnorm_backward_reduce<{t}, {p}, {i}, {v}>"
      for t, p in _TYPE_PAIRS for i in _INDEX_TYPES for v in (1, _VECTOR[t])),
    *(f"batchnorm_normalize<{t}, {p}, {i}, {v}, {m}>"
      for t, p in _TYPE_PAIRS for i in _INDEX_TYPES for v in (1, _VECTOR[t]) for m in _BOOL),
    *(f"batchnorm_backward_data<{t}, {p}, {i}, {v}>"
      for t, p in _TYPE_PAIRS for i in _INDEX_TYPES for v in (1, _VECTOR[t])),
    *(f"batchnorm_infer_flat<{t}, {p}, {i}, {v}>"
      for t, p in _TYPE_PAIRS for i in _INDEX_TYPES for v in (1, _VECTOR[t])),
    *(f"batchnorm_infer_packs<{t}, {p}, {i}, {v}, {u}, {s}>"
      for t, p in _TYPE_PAIRS for i in _INDEX_TYPES for v, u, s in _PACKS_VARIANTS[t]),
    *(f"batchnorm_infer_rows_packs<{t}, {p}, {i}, {v}, {u}>"
      for t, p in _TYPE_PAIRS for i in _INDEX_TYPES for v, u, s in _PACKS_VARIANTS[t] if s == "false"),
    *(f"batchnorm_train_fused<{t}, {p}, {i}, {v}, {f}>"
      for t, p in _TYPE_PAIRS for i in _INDEX_TYPES for v in (1, _VECTOR[t]) for f in _BOOL),
    *(f"batchnorm_backward_fused<{t}, {p}, {i}, {v}>"
      for t, p in _TYPE_PAIRS for i in _INDEX_TYPES for v in (1, _VECTOR[t])),
    *(f"batchnorm_{k}_cluster<{t}, {p}, {i}, {cl}>" for k in ("train", "backward")
      for t, p in _TYPE_PAIRS for i in _INDEX_TYPES for cl in _CLUSTER_SIZES),
    *(f"batchnorm_{k}_grouped<{t}, {p}, {i}, {_VECTOR[t]}, {g}>" for k in ("train", "backward")
      for t, p in _TYPE_PAIRS for i in _INDEX_TYPES for g in (2, 4, 8) if g <= _VECTOR[t]),
    *(f"batchnorm_{k}_strided<{t}, {p}, {i}, {_VECTOR[t]}, {g}>" for k in ("train", "backward")
      for t, p in _TYPE_PAIRS for i in _INDEX_TYPES for g in (2, 4, 8) if g <= _VECTOR[t]),
    # channel-last (inner == 1) paths
    *(f"batchnorm_rows_{k}<{t}, {i}, {v}>" for k in ("statistics", "backward_reduce")
      for t in _X_TYPES for i in _INDEX_TYPES for v in (1, _VECTOR[t])),
    *(f"batchnorm_rows_{k}<{t}, {p}>" for k in ("merge_statistics", "backward_merge")
      for t, p in _TYPE_PAIRS),
    *(f"batchnorm_rows_normalize<{t}, {p}, {i}, {v}, {m}>"
      for t, p in _TYPE_PAIRS for i in _INDEX_TYPES for v in (1, _VECTOR[t]) for m in _BOOL),
    *(f"batchnorm_rows_backward_data<{t}, {p}, {i}, {v}>"
      for t, p in _TYPE_PAIRS for i in _INDEX_TYPES for v in (1, _VECTOR[t])),
    *(f"batchnorm_rows_{k}_fused<{t}, {p}, {i}, {v}>" for k in ("train", "backward")
      for t, p in _TYPE_PAIRS for i in _INDEX_TYPES for v in (1, _VECTOR[t])),
    *(f"batchnorm_rows_{k}_resident<{t}, {p}, {i}, {v}>" for k in ("train", "backward")
      for t, p in _TYPE_PAIRS for i in _INDEX_TYPES for v in (1, _VECTOR[t])),
    *(f"batchnorm_rows_train_resident<{t}, {p}, {i}, {v}, true>"
      for t, p in _TYPE_PAIRS if t != "double" for i in _INDEX_TYPES for v in (1, _VECTOR[t])),
    *(f"batchnorm_rows_train_resident<{t}, {p}, {i}, 8, {one}, true>"
      for t, p in _TYPE_PAIRS if _VECTOR[t] == 8 for i in _INDEX_TYPES for one in _BOOL),
    *(f"batchnorm_rows_backward_resident<{t}, {p}, {i}, 8, true>"
      for t, p in _TYPE_PAIRS if _VECTOR[t] == 8 for i in _INDEX_TYPES),
    # 16-bit channel-last at 4 channels a thread (ROWS_16BIT_NARROW)
    *(f"batchnorm_rows_train_narrow<{t}, {p}, {i}, {one}>"
      for t, p in _TYPE_PAIRS if _VECTOR[t] == 8 for i in _INDEX_TYPES for one in _BOOL),
    *(f"batchnorm_rows_backward_narrow<{t}, {p}, {i}>"
      for t, p in _TYPE_PAIRS if _VECTOR[t] == 8 for i in _INDEX_TYPES),
])

_BLOCK = 256  # BN_THREADS in kernels/batchnorm.cu


# Validated GPU calls: (parameter dtype, channels, outer, inner) per kind of call.
# _MEMO.fast: the fast path's table (CallMemo.fast): the key of a call whose arrays
# are C-contiguous CuPy arrays (x, dy 16-byte aligned) -> _Fast (the prepared
# launches of its _Plan); made by the validated path, so a call that differs in
# anything validated (an option's value or exact type, a vector's shape, dtype
# or device, a view) misses and is validated as before.
_MEMO = _validate.CallMemo()
_NDARRAY = _validate.NDARRAY
_current_device = _validate.current_device


def _shape(x, layout):
    """(channels, outer, inner): x viewed as (outer, C, inner)."""
    _validate.check_layout(layout, LAYOUTS)
    _validate.check_float_dtype("x", x)
    if not 2 <= x.ndim <= 5:
        raise ValueError(f"x must be 2-D to 5-D ((N, C), (N, C, L), (N, C, H, W) or (N, C, D, H, W), "
                         f"channel-last for NHWC), got shape {tuple(x.shape)}")
    axis = reference.channel_axis(x.ndim, layout)
    channels = x.shape[axis]
    outer = int(np.prod(x.shape[:axis], dtype=np.int64))
    inner = int(np.prod(x.shape[axis + 1:], dtype=np.int64))
    return channels, outer, inner


def _check_vectors(channels, **vectors):
    for name, v in vectors.items():
        if v is not None:
            _validate.check_shape(name, v, (channels,), "one value per channel")


def _vector_key(v):
    """A parameter vector's part of a fast key: None, (shape, dtype, device) of a
    C-contiguous CuPy array, else False (no entry has it: the validated path)."""
    if v is None:
        return None
    if type(v) is _NDARRAY and v._c_contiguous:
        return (v.shape, v.dtype, v.data.device_id)
    return False


def _forward_key(x, gamma, beta, running_mean, running_var, training, momentum, eps, layout):
    """The fast table's key of a forward call, or None when x is not a
    C-contiguous 16-byte-aligned CuPy array.  Options with their exact types
    (``1`` is not ``1.0`` nor ``True``), the switches, the current device and
    stream (the fused kernels' workspace is per stream)."""
    if type(x) is not _NDARRAY or not x._c_contiguous:
        return None
    data = x.data
    if data.ptr & 15:
        return None
    return (x.shape, x.dtype, data.device_id, _vector_key(gamma), _vector_key(beta),
            _vector_key(running_mean), _vector_key(running_var), type(training), training,
            type(momentum), momentum, type(eps), eps, layout, FUSED, FUSED_PREFETCH,
            FUSED_FORWARD_MIN_BYTES, FLAT_INFERENCE, PACKED_INFERENCE, PACKED_INFERENCE_ROWS,
            PACKED_UNROLL, PACKED_ROWS_UNROLL, GROUPED, ROWS_FUSED, ROWS_FUSED_MIN_ROWS, ROWS_RESIDENT,
            ROWS_CACHE_BYTES, ROWS_L2_WINDOW, ROWS_TRAIN_ONE_COUNT, ROWS_16BIT_WORDS, ROWS_16BIT_NARROW,
            ROWS_16BIT_LAUNCHES, ROWS_16BIT_LAUNCHES_MIN_BYTES, CLUSTER,
            CLUSTER_BLOCK_BYTES, CLUSTER_MIN_BYTES,
            CLUSTER_MIN_PLANE_BYTES, STRIDED, STRIDED_TYPES,
            _current_device(), _kernels.stream_key(_current_stream().ptr))


def _backward_key(dy, x, gamma, mean, invstd, eps, layout):
    """The fast table's key of a backward call, or None (see _forward_key)."""
    if type(x) is not _NDARRAY or type(dy) is not _NDARRAY or not (x._c_contiguous and dy._c_contiguous):
        return None
    x_data, dy_data = x.data, dy.data
    if (x_data.ptr | dy_data.ptr) & 15:
        return None
    return ("backward", dy.shape, dy.dtype, dy_data.device_id, x.shape, x.dtype, x_data.device_id,
            _vector_key(gamma), _vector_key(mean), _vector_key(invstd), type(eps), eps, layout, FUSED,
            FUSED_BACKWARD_16BIT_SPLITS, GROUPED, ROWS_FUSED, ROWS_FUSED_MIN_ROWS, ROWS_RESIDENT, ROWS_CACHE_BYTES,
            ROWS_L2_WINDOW, ROWS_16BIT_WORDS, ROWS_16BIT_NARROW, ROWS_16BIT_LAUNCHES,
            ROWS_16BIT_LAUNCHES_MIN_BYTES, CLUSTER, CLUSTER_BACKWARD,
            CLUSTER_BLOCK_BYTES, CLUSTER_MIN_BYTES, CLUSTER_MIN_PLANE_BYTES, STRIDED, STRIDED_TYPES,
            _current_device(), _kernels.stream_key(_current_stream().ptr))


def batchnorm(x, gamma, beta, running_mean=None, running_var=None, *, training=True, momentum=0.1,
              eps=1e-5, layout="NCHW", return_stats=False):
    """Batch normalization.  ``training=True`` normalizes with batch statistics and,
    when given, updates ``running_mean``/``running_var`` in place; ``training=False``
    uses them (then required).  ``return_stats=True`` returns ``(y, mean, invstd)``."""
    if return_stats is not False and return_stats is not True:  # (the fast path reads it as a bool)
        _validate.check_bool("return_stats", return_stats)
    try:
        fast_key = _forward_key(x, gamma, beta, running_mean, running_var, training, momentum, eps,
                                layout)
        fast = _MEMO.fast.get(fast_key) if fast_key is not None else None
    except TypeError:  # an unhashable option: validation says what is wrong with it
        fast_key = fast = None
    if fast is not None:
        y = fast.output()
        if not y.data.ptr & 15:
            plan = fast.plan
            if return_stats:
                mean, invstd = fast.first(), fast.second()
                plan.run(x, y, mean, invstd, running_mean, running_var, gamma, beta)
                return y, mean, invstd
            plan.run(x, y, *plan.stats, running_mean, running_var, gamma, beta)
            return y
    key = _MEMO.key("batchnorm", (x, gamma, beta, running_mean, running_var),
                    (training, momentum, eps, layout))
    checked = _MEMO.get(key)
    if checked is None:
        xp = _validate.array_module(x=x, gamma=gamma, beta=beta, running_mean=running_mean,
                                    running_var=running_var)
        channels, outer, inner = _shape(x, layout)
        if not isinstance(training, (bool, np.bool_)):
            raise TypeError(f"training must be a bool, got {training!r}")
        _validate.real_number("momentum", momentum, 0.0, 1.0)
        _validate.real_number("eps", eps, 0.0)
        pdtype = _validate.parameter_dtype(x.dtype, gamma=gamma, beta=beta, running_mean=running_mean,
                                           running_var=running_var)
        _check_vectors(channels, gamma=gamma, beta=beta, running_mean=running_mean,
                       running_var=running_var)
        _validate.check_pair("running_mean", running_mean, "running_var", running_var)
        if training:
            _validate.check_writeable(running_mean=running_mean, running_var=running_var)
        n = outer * inner
        if not training and running_mean is None:
            raise ValueError("running_mean and running_var are required when training=False")
        if training and n == 1:
            raise ValueError(f"x must have more than 1 value per channel when training, got shape "
                             f"{tuple(x.shape)}")
        if xp is np:
            y, mean, invstd = reference.batchnorm(x, gamma, beta, running_mean, running_var,
                                                  bool(training), float(momentum), float(eps), layout)
            return (y, mean, invstd) if return_stats else y
        checked = _MEMO.put(key, (pdtype, channels, outer, inner))
    y, mean, invstd, plan = _batchnorm_gpu(_validate._cupy, x, gamma, beta, running_mean, running_var,
                                           bool(training), momentum, eps, return_stats, *checked)
    if fast_key is not None and plan is not None and plan.aligned and all(
            _vector_key(v) is not False for v in (gamma, beta, running_mean, running_var)):
        _MEMO.put_fast(fast_key, _Fast(plan, checked[1], _dtypes.accumulate_dtype(x.dtype), x))
    return (y, mean, invstd) if return_stats else y


def batchnorm_backward(dy, x, gamma, *, eps=1e-5, mean=None, invstd=None, layout="NCHW"):
    """Training-mode gradients ``(dx, dgamma, dbeta)``.  ``mean``/``invstd`` are the
    saved statistics (``batchnorm(..., return_stats=True)``); None recomputes them
    from ``x``.  ``dy=None`` is a zero gradient.  dgamma/dbeta have gamma's dtype
    (x's when gamma is None)."""
    try:
        fast_key = _backward_key(dy, x, gamma, mean, invstd, eps, layout)
        fast = _MEMO.fast.get(fast_key) if fast_key is not None else None
    except TypeError:
        fast_key = fast = None
    if fast is not None:
        dx = fast.output()
        if not dx.data.ptr & 15:
            dgamma, dbeta = fast.first(), fast.second()
            fast.plan.run(x, dy, mean, invstd, gamma, dx, dgamma, dbeta)
            return dx, dgamma, dbeta
    key = _MEMO.key("batchnorm_backward", (dy, x, gamma, mean, invstd), (eps, layout))
    checked = _MEMO.get(key) if dy is not None else None
    if checked is None:
        xp = _validate.array_module(dy=dy, x=x, gamma=gamma, mean=mean, invstd=invstd)
        channels, outer, inner = _shape(x, layout)
        _validate.real_number("eps", eps, 0.0)
        _validate.check_same_dtype(x=x, dy=dy)
        if dy is not None:
            _validate.check_shape("dy", dy, x.shape, "x's shape")
        pdtype = _validate.parameter_dtype(x.dtype, gamma=gamma)
        _check_vectors(channels, gamma=gamma, mean=mean, invstd=invstd)
        _validate.check_pair("mean", mean, "invstd", invstd)
        acc = _dtypes.accumulate_dtype(x.dtype)
        for name, v in (("mean", mean), ("invstd", invstd)):
            if v is not None and v.dtype != acc:
                raise TypeError(f"{name} must have dtype {acc} (the accumulation dtype of x's "
                                f"{x.dtype}), got {v.dtype}")
        if dy is None:
            return (xp.zeros(x.shape, x.dtype), xp.zeros(channels, pdtype), xp.zeros(channels, pdtype))
        if xp is np:
            return reference.batchnorm_backward(dy, x, gamma, mean, invstd, float(eps), layout, pdtype)
        checked = _MEMO.put(key, (pdtype, channels, outer, inner))
    dx, dgamma, dbeta, plan = _batchnorm_backward_gpu(_validate._cupy, dy, x, gamma, mean, invstd, eps,
                                                      *checked)
    if fast_key is not None and plan is not None and plan.aligned and all(
            _vector_key(v) is not False for v in (gamma, mean, invstd)):
        _MEMO.put_fast(fast_key, _Fast(plan, checked[1], checked[0], x))
    return dx, dgamma, dbeta


# ---------------------------------------------------------------------- GPU path
# kernels/batchnorm.cu: one block per chunk of _CHUNK values of one channel;
# training forward = statistics + normalize (2 launches, every normalize block
# merges its channel's partials), backward = reduce + data (2, or 3 when the
# statistics must be recomputed); the backward's pass 1 finishes its channels'
# sums (and recomputed statistics) in the channel's last block, through the
# stream workspace's arrival counters (_counters).

def _scalar(acc):
    return np.float32 if acc == np.float32 else np.float64


_LAUNCHES = {}  # (shape, dtype, channels, inner, 16-byte aligned) -> _Launch


def _launch_of(x, channels, outer, inner, arrays):
    """The _Launch of one call, built once per kind of call (specs memoised inside)."""
    aligned = all(a.data.ptr % 16 == 0 for a in arrays)
    key = (x.shape, x.dtype, channels, inner, aligned)
    launch = _LAUNCHES.get(key)
    if launch is None:
        if len(_LAUNCHES) >= 4096:
            _LAUNCHES.clear()
        launch = _LAUNCHES[key] = _Launch(x, channels, outer, inner, arrays)
    return launch


class _Launch:
    """Grid, index type and vector width shared by every kernel of one call."""

    def __init__(self, x, channels, outer, inner, arrays):
        t = _dtypes.cuda_type(x.dtype)
        self.t = t
        self.splits = ceil_div(outer * inner, _CHUNK)
        self.grid = (channels * self.splits,)
        # +_CHUNK: a chunk's last thread forms indices up to a chunk past n.
        self.index_t = index_type(x.size + _CHUNK)
        self.it = np.int32 if self.index_t == "int" else np.int64
        vec = _VECTOR[t]
        aligned = all(a.data.ptr % 16 == 0 for a in arrays)
        self.vec = vec if inner % vec == 0 and aligned else 1
        self.shape = (self.it(outer), self.it(channels), self.it(inner), np.int32(self.splits))
        self._specs = {}

    def spec(self, kernel, param_type=None, flag=None):
        """`kernel<T, [P,] index_t, VEC[, flag]>`."""
        key = (kernel, param_type, flag)
        spec = self._specs.get(key)
        if spec is None:
            args = [self.t, param_type, self.index_t, str(self.vec), flag]
            spec = self._specs[key] = f"{kernel}<{', '.join(a for a in args if a is not None)}>"
        return spec


# Single-read kernels (batchnorm_*_fused): a persistent grid of at most the
# blocks resident at once, rounds of whole channels, a per-channel barrier in
# global memory (kernels/batchnorm.cu).  Every kernel with a grid barrier (these
# and batchnorm_rows_*_fused) is launched cooperatively (_kernels: all blocks
# resident at once, or the driver refuses and the call takes the multi-launch
# path, never a barrier that waits for a block that cannot run).  FUSED = False
# forces the two-pass path.
FUSED = True
# Training forward: measured on the H100 (notes/mem_poolbn.md), the fused
# kernel LOSES to the two-pass path wherever a channel spans several chunks
# (bn_big 0.238 vs 0.218 ms, bn_big float16 0.207 vs 0.123, bn_r50_early 0.151
# vs 0.114): the per-round barrier latency costs more than the second read,
# which the two-pass path partly takes from L2.  So the forward uses it only
# where a channel is one chunk (no barrier; one launch instead of two), unless
# x is at least FUSED_FORWARD_MIN_BYTES (tests set 0 to reach the kernel).
# The backward's fused kernel wins in float32 (bn_big 0.269-0.275 vs 0.346 ms)
# and is used when the saved statistics are given -- except for 16-bit x whose
# channels span several chunks, unless FUSED_BACKWARD_16BIT_SPLITS: a 16-bit
# chunk is half the bytes of a float32 one, so the fused kernel's per-round
# latency (load, block sums, barrier, merge) weighs twice as much; H100
# (notes/bnf16.md), bn_big float16 0.208 fused vs 0.190 ms two-pass, bfloat16
# 0.206-0.213 vs 0.191.  One chunk a channel (no barrier) stays fused.
FUSED_BACKWARD_16BIT_SPLITS = False
FUSED_FORWARD_MIN_BYTES = 1 << 62
FUSED_PREFETCH = True  # the variant that loads the next round's chunk during the barrier
# Training forward and backward (saved statistics) of small channels whose
# inner size is not a multiple of the vector width (a 7x7 plane):
# batchnorm_{train,backward}_grouped, G = VEC / gcd(inner, VEC) channels per
# block so that each sample's G channels are whole 16-byte vectors, one launch
# that reads x (and dy) once (instead of the fused kernels' 4-byte accesses).
# Used when C % G == 0, the tensors are 16-byte aligned and a block's G * N *
# inner values fit its registers (_GROUP_VALUES).  False: the fused / two-pass
# paths.  H100, 32x2048x7x7 fp32: training 0.020 ms against 0.036 for the fused
# one-chunk kernel (notes/norms3.md); backward: notes/bnorm.md.
GROUPED = True
# Training forward, NCHW with 16-byte planes, sm_90+: batchnorm_train_cluster
# (kernels/batchnorm.cu), one cluster of up to 8 blocks per channel holding the
# channel in their shared memory, so x is read from DRAM once (floor: 2 passes
# over x, not 3).  Used when each block's planes fit CLUSTER_BLOCK_BYTES (and
# the device's per-block opt-in, 227 KB on the H100) and x is at least
# CLUSTER_MIN_BYTES (None: the device's L2 size -- below it the two-pass path
# reads x the second time from L2 and wins).  False: the grouped / fused /
# two-pass paths.  H100, training forward against the two-pass path
# (notes/cluster.md; two boards, the same code): bn_big 64x256x56x56 fp32
# 0.169-0.183 vs 0.218 ms (1.34-1.45x PyTorch), fp16 / bf16 0.091-0.099 vs 0.123,
# bn_r50_early 32x64x112x112 fp32 0.097-0.110 vs 0.114 (227 KB blocks); 25.7 MB
# tensors 0.030-0.035 vs 0.030-0.031 (no gain: x is in L2).  Backward (saved
# statistics): bn_big fp32 0.251 vs 0.276, fp16 0.132 vs 0.188.
CLUSTER = True
# The backward with saved statistics likewise (batchnorm_backward_cluster: x and
# dy in shared memory, read once; planes of both within the block budget).
CLUSTER_BACKWARD = True
CLUSTER_BLOCK_BYTES = 1 << 30
CLUSTER_MIN_BYTES = None
# Planes smaller than this stay on the other paths: one thread issues a block's
# bulk copies, one per plane, so many tiny planes would serialise there.
CLUSTER_MIN_PLANE_BYTES = 512
_CLUSTER_STATIC_BYTES = 512  # the kernel's static shared memory (mbarrier, slots, scratch), rounded up
_DEVICE = {}  # device -> (compute capability, per-block shared memory opt-in, L2 bytes)


def _device_facts(cp, device):
    facts = _DEVICE.get(device)
    if facts is None:
        d = cp.cuda.Device(device)
        try:
            optin = int(d.attributes["MaxSharedMemoryPerBlockOptin"])
            l2 = int(d.attributes["L2CacheSize"])
        except Exception:  # attributes unknown: the default limit, no L2 assumed
            optin, l2 = 48 * 1024, 0
        facts = _DEVICE[device] = (int(d.compute_capability), optin, l2)
    return facts


def _opt_in(spec, shared):
    """Let cluster kernel ``spec`` launch with ``shared`` bytes of dynamic shared
    memory: opt in where the default (48 KB for static and dynamic together)
    does not cover them, and never lower a limit that another plan of the same
    kernel (another shape: more planes a block) was built against and still
    launches with (review8a)."""
    if shared + _CLUSTER_STATIC_BYTES > 48 * 1024:
        kernel = FAMILY.function(spec)
        if getattr(kernel, "max_dynamic_shared_size_bytes", 0) < shared:
            kernel.max_dynamic_shared_size_bytes = shared


def _cluster_shape(cp, x, outer, inner, aligned, tensors=1):
    """(blocks per cluster, dynamic shared bytes per block) of batchnorm_train_cluster
    (``tensors`` = 1: x) or batchnorm_backward_cluster (2: x and dy) for this x, or
    None where it does not apply."""
    plane = inner * x.itemsize
    if not (CLUSTER and aligned and inner > 1 and plane % 16 == 0 and plane >= CLUSTER_MIN_PLANE_BYTES
            and outer >= 1):
        return None
    cc, optin, l2 = _device_facts(cp, cp.cuda.runtime.getDevice())
    if cc < 90 or tensors * x.nbytes < (l2 if CLUSTER_MIN_BYTES is None else CLUSTER_MIN_BYTES):
        return None
    cl = max(size for size in _CLUSTER_SIZES if size <= outer)
    shared = tensors * -(-outer // cl) * inner * x.itemsize
    return (cl, shared) if shared <= min(CLUSTER_BLOCK_BYTES, optin - _CLUSTER_STATIC_BYTES) else None


# BN_THREADS * group_items<T>() * VEC in kernels/batchnorm.cu
_GROUP_VALUES = {"half_t": 8192, "bfloat16_t": 8192, "float": 8192, "double": 4096}
# The grouped kernels' blocks of G channels with each thread's vectors at one
# place of the sample (batchnorm_{train,backward}_strided, kernels/batchnorm.cu):
# SV = G * inner / VEC vectors a sample, M = 256 // SV samples at a time, up to
# _STRIDED_ITEMS vectors a thread, inner > VEC (a vector spans at most two
# channels).  Registers bounded to 64 (the grouped kernels: 96-150, two or one
# resident blocks of 256 threads), so 32x2048x7x7's 512 blocks run in one wave.
# Used for the storage types in STRIDED_TYPES.  ptxas under the bound (sm_90, index
# int): float train 63 / backward 64 registers, no spill; half_t / bfloat16_t train no
# spill, backward 8 bytes; double 36 / 80 bytes of spill, so double stays on the
# grouped kernels.  H100, 32x2048x7x7 (notes/smallcalls.md, session 9; device time of
# one call in a CUDA graph, ms): float train 0.0154 -> 0.0089, backward 0.0179 -> 0.0139;
# half_t (which took the fused cooperative kernels on 2-byte loads) train 0.0419 ->
# 0.0071, backward 0.0255 -> 0.0121 -- PyTorch 0.0237 / 0.0294 (float), 0.0226 / 0.0249.
STRIDED = True
STRIDED_TYPES = ("float", "half_t", "bfloat16_t")
_STRIDED_ITEMS = 8  # BN_STRIDED_ITEMS in kernels/batchnorm.cu


def _group(t, channels, outer, inner, aligned):
    """G of batchnorm_{train,backward}_grouped for this call, or 0 when they do not apply."""
    vec = _VECTOR[t]
    if not (GROUPED and aligned) or inner % vec == 0:
        return 0
    group = vec // math.gcd(inner, vec)
    if channels % group or group * outer * inner > _GROUP_VALUES[t]:
        return 0
    return group


def _strided(t, channels, outer, inner, aligned):
    """(G, SV, M, threads) of batchnorm_{train,backward}_strided for this call, or None."""
    vec = _VECTOR[t]
    if not (STRIDED and GROUPED and aligned and t in STRIDED_TYPES) or inner % vec == 0 or inner <= vec:
        return None
    group = vec // math.gcd(inner, vec)
    sv = group * inner // vec
    if channels % group or sv > _BLOCK:
        return None
    m = _BLOCK // sv
    if ceil_div(outer, m) > _STRIDED_ITEMS:
        return None
    return group, sv, m, 32 * ceil_div(sv * m, 32)


def _prepare_strided(direction, t, pt, x, channels, inner, strided, arguments):
    """The prepared launch of batchnorm_<direction>_strided for a plan of :func:`_strided`;
    ``arguments(it)`` gives the kernel's leading arguments (``it``: the index type's
    scalar); SV (vectors of a group's sample) and M (samples a pass) follow."""
    group, sv, m, threads = strided
    index_t = index_type(x.size + _BLOCK * channels * inner)
    it = np.int32 if index_t == "int" else np.int64
    return FAMILY.prepare(f"batchnorm_{direction}_strided<{t}, {pt}, {index_t}, {_VECTOR[t]}, {group}>",
                          (channels // group,), (threads,), (*arguments(it), np.int32(sv), np.int32(m)))


_RESIDENT = {}  # (device, expression) -> blocks of that kernel resident at once
_WORKSPACES = {}  # (device, stream) -> _Workspace, the oldest dropped beyond MAX_WORKSPACES
# Streams whose workspace is kept (a program that makes a stream per step would
# otherwise keep one per stream for good).  A dropped one lives on in the plans
# that hold its arrays; that stream's next plan gets a new one.
MAX_WORKSPACES = 64


class _Workspace:
    """Barrier counters (zero between launches: the kernels reset them) and the
    partials of one stream; grown, never shrunk."""

    def __init__(self, cp):
        self.arrive = cp.zeros(0, np.uint32)
        self._parts = {}
        self._views = {}

    def partials(self, cp, acc, count, slot=0):
        """Two scratch vectors of ``count`` values, reused by every call on this
        stream (the kernel that reads them runs before the next call's writes);
        ``slot`` 1 is a second pair, for the backward's gradient partials while
        slot 0 holds the statistics partials.  A prepared launch that holds a
        pair keeps it alive when the buffer grows."""
        key = (acc, count, slot)
        views = self._views.get(key)
        if views is None:
            buf = self._parts.get((acc, slot))
            if buf is None or buf.size < 2 * count:
                buf = self._parts[(acc, slot)] = cp.empty(2 * count, acc)
                self._views = {}
            views = self._views[key] = (buf[:count], buf[count:2 * count])
        return views

    def scratch(self, cp, acc, count, slot):
        """One scratch vector of ``count`` values in slot ``slot`` (2: the rows
        kernels' statistics partials, 3: their gradient partials, 4: the chunk
        backward's channel sums), shared and grown like :meth:`partials`."""
        key = ("flat", acc, count, slot)
        view = self._views.get(key)
        if view is None:
            buf = self._parts.get((acc, slot))
            if buf is None or buf.size < count:
                buf = self._parts[(acc, slot)] = cp.empty(max(count, 1), acc)
                self._views = {}
            view = self._views[key] = buf[:count]
        return view


def _fused_grid(cp, launch, spec, channels):
    """(grid, channels per round, workspace) for a fused kernel, or None when a
    channel's chunks do not all fit on the device at once."""
    device = cp.cuda.runtime.getDevice()
    resident = _RESIDENT.get((device, spec))
    if resident is None:
        resident = _RESIDENT[(device, spec)] = _resident_blocks(cp, FAMILY.function(spec))
    if launch.splits > resident:
        return None
    per_round = min(channels, resident // launch.splits)
    work = _stream_workspace(cp)
    _counters(cp, channels, work)   # the counters of the workspace returned
    return (per_round * launch.splits,), per_round, work


def _resident_blocks(cp, kernel):
    """Blocks of `kernel` (BN_THREADS threads, static shared memory only) that
    the device runs at once: the occupancy API times the SM count, the most a
    cooperative launch may have; 0 without the occupancy API or cooperative
    launch (never risk a barrier: the multi-launch paths)."""
    return _kernels.co_resident_blocks(kernel.kernel, _BLOCK)


class _Deferred:
    """A plan's multi-launch path, built on first use from the call's arrays:
    what a cooperative launch runs instead when the driver refuses its grid
    (built lazily: the fused call never compiles kernels it does not use, and
    the plan holds no array of the call that built it)."""

    __slots__ = ("_build", "_run")

    def __init__(self, build):
        self._build, self._run = build, None

    def __call__(self, *arrays):
        if self._run is None:
            self._run = self._build(arrays).run
        self._run(*arrays)


# CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, CUDA_ERROR_INVALID_CLUSTER_SIZE: the driver
# cannot place a cluster (no GPC of a partitioned GPU holds CL such blocks).
_CLUSTER_REFUSALS = frozenset((701, 912))
cluster_refusals = 0  # launches refused so far (tests check that the other kernels ran)


class _ClusterLaunch:
    """A batch-norm cluster kernel's launch.  Where the driver refuses to place its
    clusters, the plan's other kernels (``fallback``, a :class:`_Deferred`) run
    instead, on this and every later call: nothing ran, and the same launch
    would be refused again."""

    __slots__ = ("_launch", "_fallback", "refused")

    def __init__(self, launch, fallback):
        self._launch, self._fallback, self.refused = launch, fallback, False

    def __call__(self, *arrays):
        global cluster_refusals
        if not self.refused:
            try:
                return self._launch(*arrays)
            except Exception as e:  # CuPy's CUDADriverError (status: the CUresult)
                if getattr(e, "status", None) not in _CLUSTER_REFUSALS:
                    raise
                self.refused = True
                cluster_refusals += 1
        return self._fallback(*arrays)


def _cluster_launch(kind, t, pt, x, cluster, channels, others, arguments):
    """The :class:`_ClusterLaunch` of batchnorm_{kind}_cluster (``cluster``: (CL,
    dynamic shared bytes) from :func:`_cluster_shape`; a grid of CL blocks per
    channel), running ``others`` where the driver refuses it; ``arguments(it)``
    gives the kernel's arguments with index_t scalars made by ``it``."""
    cl, shared = cluster
    index_t = index_type(x.size)
    spec = f"batchnorm_{kind}_cluster<{t}, {pt}, {index_t}, {cl}>"
    _opt_in(spec, shared)
    it = np.int32 if index_t == "int" else np.int64
    return _ClusterLaunch(FAMILY.prepare(spec, (channels * cl,), (_BLOCK,), arguments(it), shared_mem=shared),
                          others)


ROWS_REDUCE_PER_SM = 4  # blocks per SM of the rows kernels when the occupancy API is missing


class _Rows:
    """Launch shape of the channel-last kernels (kernels/batchnorm.cu, RowLanes):
    x as M rows of C channels, VEC channels per thread when C and the pointers allow."""

    def __init__(self, cp, x, channels, rows, arrays=(), aligned=None, max_vec=None):
        t = _dtypes.cuda_type(x.dtype)
        vec = _VECTOR[t]
        if aligned is None:
            aligned = all(a.data.ptr % 16 == 0 for a in arrays)
        if channels % vec or not aligned:
            vec = 1
        elif max_vec is not None and vec > max_vec:  # a divisor of the 16-byte VEC: C % max_vec == 0
            vec = max_vec
        vectors = channels // vec
        self.cols = min(vectors, _BLOCK)
        self.block_lanes = _BLOCK // self.cols
        self.groups = ceil_div(vectors, self.cols)
        self.rows = rows
        self.sms = _sm_count(cp)
        # A grid has at most 8 blocks of 256 threads per SM in x (grid()); a lane
        # forms row indices up to one batch of 8 rows past the last one.
        lanes = 8 * self.sms * self.block_lanes
        self.index_t = index_type(x.size + (8 * lanes + 8) * channels)
        it = np.int32 if self.index_t == "int" else np.int64
        self.t, self.vec = t, vec
        self.shape = (it(rows), np.int32(channels), np.int32(self.cols))
        self.merge_grid = (ceil_div(channels, _BLOCK // 32),)

    def grid(self, cp, spec, rows_per_lane):
        """(grid, L) of one rows kernel: no more blocks than are resident at once
        (a grid-stride loop over a grid of 1.3 waves left one block per SM for the
        last third of the rows), fewer when there are few rows; L = row lanes."""
        device = cp.cuda.runtime.getDevice()
        resident = _RESIDENT.get((device, spec))
        if resident is None:
            resident = _RESIDENT[(device, spec)] = _resident_blocks(cp, FAMILY.function(spec))
        cap = resident // self.groups if resident else ROWS_REDUCE_PER_SM * self.sms // self.groups
        cap = min(max(1, cap), 8 * self.sms)
        gx = max(1, min(ceil_div(self.rows, self.block_lanes * rows_per_lane), cap))
        return (gx, self.groups), gx * self.block_lanes

    def spec(self, kernel, *middle, flag=None):
        args = [self.t, *middle, self.index_t, str(self.vec), flag]
        return f"batchnorm_rows_{kernel}<{', '.join(a for a in args if a is not None)}>"


_SMS = {}


def _sm_count(cp):
    device = cp.cuda.runtime.getDevice()
    sms = _SMS.get(device)
    if sms is None:
        sms = _SMS[device] = int(cp.cuda.Device(device).attributes["MultiProcessorCount"])
    return sms


# Channel-last training forward and backward in one launch each
# (batchnorm_rows_{train,backward}_fused: a persistent grid, two grid barriers,
# the last rows each thread read kept in registers and shared memory for the
# second pass).  False: statistics / sums, merge and map launches.  H100,
# 64x56x56x256 fp32 (notes/norms3.md): forward 0.235 vs 0.236 ms, backward 0.352
# vs 0.366 ms.
ROWS_FUSED = True
# Rows a lane of the fused rows kernels owns at least (fewer blocks on a small
# tensor: fewer lane partials C * L to write and merge; 1 = as many lanes as
# rows, the grid of norms3).  Part of the plan and fast keys.  H100 (notes/bnf16.md),
# 32x7x7x256 fp32 train / backward 0.0282 / 0.0212 ms at 8 against 0.0324-0.0336
# / 0.0224-0.0237 at 1 and 0.068 / 0.047 at 32; 32x14x14x256 0.0324 / 0.0248 at 8
# against 0.0351 / 0.0287 at 1.  bn_big_nhwc is resident-bound either way.
ROWS_FUSED_MIN_ROWS = 8


_REFUSED = set()  # (device, expression, grid) of rows fused launches the driver refused


def _rows_fused_grid(cp, rows, spec, channels):
    """(grid, lanes, workspace) of a rows fused kernel, or None when the
    occupancy API cannot say that its whole grid is resident (or the driver
    refused that grid's cooperative launch before)."""
    device = cp.cuda.runtime.getDevice()
    resident = _RESIDENT.get((device, spec))
    if resident is None:
        resident = _RESIDENT[(device, spec)] = _resident_blocks(cp, FAMILY.function(spec))
    gx = min(resident // rows.groups, ceil_div(rows.rows, rows.block_lanes * ROWS_FUSED_MIN_ROWS))
    if gx < 1 or (device, spec, (gx, rows.groups)) in _REFUSED:
        return None
    work = _stream_workspace(cp)
    if work.arrive.size < 4:
        work.arrive = cp.zeros(max(4, 2 * channels), np.uint32)
    return (gx, rows.groups), gx * rows.block_lanes, work


# Channel-last training forward and backward on batchnorm_rows_{train,backward}_resident
# (kernels/batchnorm.cu: the fused rows scheme with the batches between the passes
# in dynamic shared memory sized to what the resident blocks can have, the last
# batch in registers as storage packs, and L2 eviction hints; notes/bnnhwc.md).
# False: batchnorm_rows_*_fused (static 32 KB cache a block).  Both keys.
ROWS_RESIDENT = True
# Most bytes of dynamic shared memory a block of the resident kernels caches rows
# in (None: as much as the resident blocks of an SM leave; 0: none).
ROWS_CACHE_BYTES = None
# Fraction of the L2 that pass 1 fills with normal-priority lines for pass 2
# to re-read (every other access evict-first); None: no hints at all.  One value
# for every call, or (direction, itemsize, fraction) rows (a call with no row: no
# hints).  H100 A/B, bn_big_nhwc (session 10, notes/bnnhwc.md): 0.25 beat 0.5 / 0.8
# in training (fp32 +2.8 % over the fused kernel, fp16 +17 %) and in the fp16
# backward (+21 %); the fp32 backward lost 1.6 % with hints, none +0.2 %.
ROWS_L2_WINDOW = (("train", 2, 0.25), ("train", 4, 0.25), ("backward", 2, 0.25))
# Item sizes whose resident training forward computes a thread's batch statistics
# with one count for its channels (RowsTrainOp ONE_COUNT: 1 division a batch instead
# of 2 a channel; bitwise the same results).  The 16-bit forward ran at 0.65 of copy
# against fp32's 0.90 (notes/bn16nhwc.md: 16 IEEE divisions a batch of 4 rows).
# H100 A/B, 64x56x56x256 (session 10): fp16 0.1583 -> 0.1493 ms, bf16 0.1587 -> 0.1492
# (+6 %); float32 with it (4) +0.6 %, under the rule's 1 %.  Plan and fast keys.
ROWS_TRAIN_ONE_COUNT = (2,)
# 16-bit resident kernels (both directions) carry rows as 32-bit words (RowWords:
# no 16-bit register moves, pairs converted at once; bitwise the same results).
# Off: the same A/B had it 1-1.4 % slower in training and no faster backward
# (fp16 0.2056 off, 0.2064 on).  Plan and fast keys.
ROWS_16BIT_WORDS = False
# Directions ("train", "backward") whose 16-bit channel-last resident launch runs
# batchnorm_rows_{train,backward}_narrow: the same kernel at 4 channels a thread
# (8-byte vectors) -- float32's lanes, batches of 8 / 4 rows, half the lane
# partials of the 16-byte mapping (notes/bn16nhwc3.md).  Not bitwise the 8-channel
# results (other lanes / batches).  Plan and fast keys.  H100 A/B (session 11), device
# ms old -> narrow, 64x56x56x256: fp16 train 0.1500 -> 0.1202 (PyTorch 0.1289), backward
# 0.2059 -> 0.1890 (PyTorch 0.1722); bf16 train 0.1507 -> 0.1204, backward 0.2060 -> 0.1816;
# C 200 fp16 train 0.1291 -> 0.1097, backward 0.1934 -> 0.1786.
ROWS_16BIT_NARROW = ("train", "backward")
# Directions whose 16-bit channel-last calls of x.nbytes >= ROWS_16BIT_LAUNCHES_MIN_BYTES
# skip the one-launch kernels (resident and fused) for the multi-launch path:
# statistics + merge + normalize, backward reduce + merge + data (the path PyTorch's
# kernels take; small tensors keep the one launch).  Plan and fast keys.  Measured
# slower than the resident kernels (same A/B: fp16 train 0.1636, backward 0.2173): off.
ROWS_16BIT_LAUNCHES = ()
ROWS_16BIT_LAUNCHES_MIN_BYTES = 16 << 20
_SHARED_RESERVED = 1024  # the driver's shared memory per block (sm_80+)
_ROWS_STATIC_BYTES = 1024  # the resident kernels' static shared memory (the merge), rounded up


def _rows_l2_window(direction, itemsize):
    """ROWS_L2_WINDOW's fraction for a call (None: no hints)."""
    if ROWS_L2_WINDOW is None or isinstance(ROWS_L2_WINDOW, float):
        return ROWS_L2_WINDOW
    return next((f for d, size, f in ROWS_L2_WINDOW if d == direction and size == itemsize), None)


def _rows_resident_launch(cp, rows, spec, channels, tensors, itemsize):
    """(grid, lanes, workspace, cached batches, L2 window batches, dynamic shared
    bytes) of a resident rows kernel, or None (as _rows_fused_grid).  The cache
    takes what an SM's shared memory leaves for the blocks its registers allow,
    the same grid as without it (the occupancy API is asked with the bytes)."""
    fused = _rows_fused_grid(cp, rows, spec, channels)
    if fused is None:
        return None
    grid, lanes, work = fused
    device = cp.cuda.runtime.getDevice()
    resident = _RESIDENT[(device, spec)]
    batch_rows = _fused_rows_batch(rows.t, rows.vec, tensors)
    lane_batches = ceil_div(rows.rows, lanes * batch_rows)
    per_batch = tensors * batch_rows * _BLOCK * rows.vec * itemsize  # bytes a block caches per batch
    _, optin, l2 = _device_facts(cp, device)
    per_sm = _shared_per_sm(cp, device, optin)
    blocks_per_sm = max(1, resident // rows.sms)
    budget = min(optin, per_sm // blocks_per_sm - _SHARED_RESERVED) - _ROWS_STATIC_BYTES
    if ROWS_CACHE_BYTES is not None:
        budget = min(budget, ROWS_CACHE_BYTES)
    cached = max(0, min(budget // per_batch, lane_batches - 1))
    kernel = FAMILY.function(spec)
    while cached > 0 and _resident_with_shared(kernel, cached * per_batch) < resident:
        cached -= 1
    window = -1
    fraction = _rows_l2_window("train" if tensors == 1 else "backward", itemsize)
    if fraction is not None:
        stretch = lanes * batch_rows * channels * itemsize * tensors  # one batch of every lane
        window = min(int(fraction * l2) // stretch, lane_batches)
    return grid, lanes, work, cached, window, cached * per_batch


def _rows_16bit(x, switch, direction):
    """Whether a 16-bit x's channel-last `direction` call is in `switch`."""
    return x.itemsize == 2 and direction in switch


def _rows_launches(x, direction):
    """Whether ROWS_16BIT_LAUNCHES sends this call to the multi-launch path."""
    return _rows_16bit(x, ROWS_16BIT_LAUNCHES, direction) and x.nbytes >= ROWS_16BIT_LAUNCHES_MIN_BYTES


def _rows_narrow(cp, x, channels, rows_count, aligned, rows, direction):
    """The launch shape of the 4-channel _narrow kernels for a vectorised 16-bit call
    in ROWS_16BIT_NARROW, else None (the _resident kernels at `rows`' VEC)."""
    if rows.vec == 8 and _rows_16bit(x, ROWS_16BIT_NARROW, direction):
        return _Rows(cp, x, channels, rows_count, aligned=aligned, max_vec=4)
    return None


def _rows_resident_flags(rows, one_count=None):
    """The template flags after VEC of a resident kernel's expression (None: the
    defaults): ONE_COUNT (training forward only: one_count not None), WORDS."""
    words = ROWS_16BIT_WORDS and rows.vec == 8
    if one_count is None:
        return "true" if words else None
    if words:
        return f"{_BOOL[one_count]}, true"
    return "true" if one_count else None


def _fused_rows_batch(t, vec, tensors):
    """B of kernels/batchnorm.cu fused_rows_batch<T, VEC, K>: rows per batch."""
    words = vec * (8 if t == "double" else 4) // 4
    batch = 32 // words if words > 0 and 32 // words < 8 else 8
    return max(1, batch // tensors)


def _shared_per_sm(cp, device, optin):
    try:
        return int(cp.cuda.Device(device).attributes["MaxSharedMemoryPerMultiprocessor"])
    except Exception:  # attribute unknown: one block's opt-in
        return optin + _SHARED_RESERVED


def _resident_with_shared(kernel, shared):
    """Blocks of kernel resident at once with ``shared`` dynamic bytes (opting in
    above the 48 KB default); 0 without the occupancy API."""
    if kernel is None:  # CPU tests fake FAMILY.function
        return 0
    if shared + _ROWS_STATIC_BYTES > 48 * 1024 and getattr(kernel, "max_dynamic_shared_size_bytes", 0) < shared:
        kernel.max_dynamic_shared_size_bytes = shared
    return _kernels.co_resident_blocks(kernel.kernel, _BLOCK, shared)


def _stream(cp):
    """The current stream as the key of its workspace and of the plans that hold
    the workspace's pointers (per thread on the per-thread default stream:
    _kernels.stream_key)."""
    return _kernels.stream_key(cp.cuda.get_current_stream().ptr)


def _stream_workspace(cp):
    key = (cp.cuda.runtime.getDevice(), _stream(cp))
    work = _WORKSPACES.get(key)
    if work is None:
        while len(_WORKSPACES) >= MAX_WORKSPACES:
            try:
                del _WORKSPACES[next(iter(_WORKSPACES))]
            except (KeyError, RuntimeError, StopIteration):   # another thread changed it
                break
        work = _WORKSPACES[key] = _Workspace(cp)
    return work


# Inference with an inner size that is not a multiple of the vector width (a
# 7x7 plane) runs batchnorm_infer_flat: x as one flat array of 16-byte vectors,
# instead of the per-channel chunk kernel's 4-byte accesses.  False forces the
# chunk kernel (tests compare both).
FLAT_INFERENCE = True
_FLAT_UNROLL = 4  # BN_FLAT_UNROLL in kernels/batchnorm.cu
_FLAT = {}  # (shape, dtype, channels, param type, aligned) -> (spec, grid, scalars)


def _flat_launch(x, y, channels, inner, pt):
    t = _dtypes.cuda_type(x.dtype)
    aligned = x.data.ptr % 16 == 0 and y.data.ptr % 16 == 0
    key = (x.shape, x.dtype, channels, pt, aligned)
    plan = _FLAT.get(key)
    if plan is None:
        vec = _VECTOR[t] if aligned and x.size % _VECTOR[t] == 0 else 1
        per_block = _FLAT_UNROLL * _BLOCK
        index_t = index_type(x.size + per_block * vec, channels + _BLOCK)
        it = np.int32 if index_t == "int" else np.int64
        grid = (max(ceil_div(x.size // vec, per_block), ceil_div(channels, _BLOCK)),)
        if len(_FLAT) >= 4096:
            _FLAT.clear()
        plan = _FLAT[key] = (f"batchnorm_infer_flat<{t}, {pt}, {index_t}, {vec}>", grid,
                             (it(x.size), it(channels), it(inner)))
    return plan


# Inference of NCHW x whose planes hold at least VEC values (every ResNet plane, 7x7
# included): batchnorm_infer_packs, the activation kernels' launch shape (flat 16-byte
# packs, PACKED_UNROLL a thread, a one-shot grid) with the channel constants from
# the running statistics per pack (planes of whole packs) or per warp (a 7x7 plane:
# packs that cross planes; notes/bninfer.md).  False: the chunk kernel, or
# batchnorm_infer_flat where inner % VEC != 0 (tests compare them).  Smaller planes
# (inner < VEC) always take batchnorm_infer_flat.
PACKED_INFERENCE = True
# Packs a thread (1 or 4: the specialisations declared).  H100 A/B (notes/bninfer.md, session 10): one pack a thread for NCHW in every dtype
# (float16 bn_big 0.947 of copy at 1 against 0.936 at 4; float 4 lost on bn_big and
# bn_r50_early); four for channel-last, whose blocks each refill the channel table
# (bn_big_nhwc 0.978 at 4 against 0.944 at 1).
PACKED_UNROLL = 1
PACKED_ROWS_UNROLL = 4
_PACKS_MAX_BLOCKS = 65536  # the grid cap of kernels/activation.cu; the kernel strides beyond


def _packs_grid(packs, vec, unroll, channels):
    """(grid, index_t) of a flat-packs kernel: a one-shot grid of `unroll` packs a
    thread (capped; the kernel strides beyond), at least one thread a channel for the
    per-block tables."""
    per_block = unroll * _BLOCK
    grid = (max(min(ceil_div(packs, per_block), _PACKS_MAX_BLOCKS), ceil_div(channels, _BLOCK), 1),)
    # The grid stride takes a block's pack index up to one stride past the last pack
    # (values: x VEC) before the loop ends: that must not overflow index_t.
    return grid, index_type((packs + grid[0] * per_block) * vec, channels + _BLOCK)


def _packs_launch(x, aligned, channels, inner, pt):
    """(spec, grid, scalars) of batchnorm_infer_packs for this call (x's planes hold
    at least VEC values)."""
    t = _dtypes.cuda_type(x.dtype)
    vec = _VECTOR[t] if aligned else 1
    unroll = PACKED_UNROLL if vec > 1 else 1
    split = _BOOL[inner % vec != 0]
    packs = x.size // vec
    grid, index_t = _packs_grid(packs, vec, unroll, channels)
    it = np.int32 if index_t == "int" else np.int64
    return (f"batchnorm_infer_packs<{t}, {pt}, {index_t}, {vec}, {unroll}, {split}>", grid,
            (it(x.size), it(packs), it(channels), it(inner)))


# Channel-last inference (inner == 1) with PACKED_INFERENCE: batchnorm_infer_rows_packs
# (the same flat packs, a pack = VEC consecutive channels, the constants a table of
# 3 * C values in each block's shared memory) when the table fits _ROWS_TABLE_BYTES;
# else batchnorm_rows_normalize.  PACKED_INFERENCE_ROWS = False keeps channel-last
# inference on batchnorm_rows_normalize alone (NCHW unaffected).
PACKED_INFERENCE_ROWS = True
_ROWS_TABLE_BYTES = 48 * 1024


def _rows_packs_launch(x, aligned, channels, pt):
    """(spec, grid, scalars, shared bytes) of batchnorm_infer_rows_packs, or None."""
    if not (PACKED_INFERENCE and PACKED_INFERENCE_ROWS):
        return None
    t = _dtypes.cuda_type(x.dtype)
    shared = 3 * channels * np.dtype(_dtypes.accumulate_dtype(x.dtype)).itemsize
    if shared > _ROWS_TABLE_BYTES:
        return None
    vec = _VECTOR[t] if aligned and channels % _VECTOR[t] == 0 else 1
    unroll = PACKED_ROWS_UNROLL if vec > 1 else 1
    packs = x.size // vec
    grid, index_t = _packs_grid(packs, vec, unroll, channels)
    it = np.int32 if index_t == "int" else np.int64
    return (f"batchnorm_infer_rows_packs<{t}, {pt}, {index_t}, {vec}, {unroll}>", grid,
            (it(packs), np.int32(channels)), shared)


_CONSTANTS = {}  # (device, value, channels, dtype) -> a vector the kernels only read


def _constant(cp, value, channels, dtype):
    """gamma = 1 / beta = 0 when not given: one vector per kind, never written."""
    key = (cp.cuda.runtime.getDevice(), value, channels, dtype)
    v = _CONSTANTS.get(key)
    if v is None:
        v = _CONSTANTS[key] = cp.full(channels, value, dtype)
    return v


def _current_stream():
    return _validate._cupy.cuda.get_current_stream()


class _Plan:
    """The prepared launches of one kind of NCHW (inner > 1) GPU call, built once
    per (device, stream, shapes, dtypes, options, alignment, switches): ``run``
    takes the call's eight arrays -- forward ``(x, y, mean, invstd, running_mean,
    running_var, gamma, beta)``, backward ``(x, dy, mean, invstd, gamma, dx,
    dgamma, dbeta)``; an absent vector (None) has a constant or a scratch vector
    fixed in the launch instead.  ``stats``: the forward's scratch mean/invstd
    for a call that does not return them (the plan is per stream: stream order
    keeps two calls' uses apart)."""
    __slots__ = ("launches", "aligned", "stats", "run")

    def __init__(self, launches, aligned, stats=None):
        self.launches, self.aligned, self.stats = tuple(launches), aligned, stats
        if len(self.launches) == 1:
            self.run = self.launches[0]
        else:
            self.run = self._run_all

    def _run_all(self, *arrays):
        for launch in self.launches:
            launch(*arrays)


class _Fast:
    """A fast-table entry: the plan, the small outputs' shape and dtype
    (mean/invstd, or dgamma/dbeta) and the slot of the output shaped like x
    (y, or dx), and of the two small ones."""
    __slots__ = ("plan", "stats_shape", "acc", "output", "first", "second")

    def __init__(self, plan, channels, dtype, x):
        self.plan, self.stats_shape, self.acc = plan, (channels,), np.dtype(dtype)
        self.output = _kernels.OutputSlot(x.shape, x.dtype)
        self.first = _kernels.OutputSlot(self.stats_shape, self.acc)
        self.second = _kernels.OutputSlot(self.stats_shape, self.acc)


_PLANS = {}  # see _Plan; emptied when full


def _cached_plan(key, build):
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= 4096:
            _PLANS.clear()
        plan = _PLANS[key] = build()
    return plan


def _forward_plan(cp, x, y, pdtype, channels, outer, inner, training, update, momentum, eps, no_gamma,
                  no_beta):
    aligned = not (x.data.ptr | y.data.ptr) & 15
    key = (cp.cuda.runtime.getDevice(), _stream(cp), x.shape, x.dtype,
           np.dtype(pdtype), channels, inner, aligned, training, update, float(momentum), float(eps),
           no_gamma, no_beta, FUSED, FUSED_PREFETCH, FUSED_FORWARD_MIN_BYTES, FLAT_INFERENCE,
           PACKED_INFERENCE, PACKED_UNROLL, GROUPED, CLUSTER, CLUSTER_BLOCK_BYTES,
           CLUSTER_MIN_BYTES, CLUSTER_MIN_PLANE_BYTES, STRIDED, STRIDED_TYPES)
    return _cached_plan(key, lambda: _build_forward_plan(
        cp, x, y, pdtype, channels, outer, inner, training, update, float(momentum), float(eps),
        no_gamma, no_beta, aligned))


def _build_forward_plan(cp, x, y, pdtype, channels, outer, inner, training, update, momentum, eps,
                        no_gamma, no_beta, aligned, fused_allowed=True):
    A = _kernels
    acc = _dtypes.accumulate_dtype(x.dtype)
    real = _scalar(acc)
    pt = _dtypes.cuda_type(pdtype)
    n = outer * inner
    X, Y, MEAN, INVSTD = A.ARRAY0, A.ARRAY1, A.ARRAY2, A.ARRAY3
    gamma = _constant(cp, 1, channels, pdtype) if no_gamma else A.ARRAY6
    beta = _constant(cp, 0, channels, pdtype) if no_beta else A.ARRAY7
    rm, rv = (A.ARRAY4, A.ARRAY5) if update or not training else (gamma, gamma)  # unread placeholders
    stats = (cp.empty(channels, acc), cp.empty(channels, acc))
    launches = []
    t = _dtypes.cuda_type(x.dtype)
    group = _group(t, channels, outer, inner, aligned) if training else 0
    strided = _strided(t, channels, outer, inner, aligned) if training else None
    cluster = _cluster_shape(cp, x, outer, inner, aligned) if training and fused_allowed else None
    if cluster:
        others = _Deferred(lambda arrays: _build_forward_plan(
            cp, arrays[0], arrays[1], pdtype, channels, outer, inner, training, update, momentum, eps, no_gamma,
            no_beta, aligned, fused_allowed=False))
        launches.append(_cluster_launch(
            "train", t, pt, x, cluster, channels, others,
            lambda it: (X, Y, MEAN, INVSTD, rm, rv, gamma, beta, it(outer), it(channels), it(inner), real(eps),
                        real(momentum), real(n / (n - 1)), np.int32(update))))
    elif strided:
        launches.append(_prepare_strided(
            "train", t, pt, x, channels, inner, strided,
            lambda it: (X, Y, MEAN, INVSTD, rm, rv, gamma, beta, it(outer), it(channels), it(inner), real(eps),
                        real(momentum), real(n / (n - 1)), np.int32(update))))
    elif group:
        index_t = index_type(x.size + _BLOCK * _GROUP_VALUES[t])
        it = np.int32 if index_t == "int" else np.int64
        launches.append(FAMILY.prepare(
            f"batchnorm_train_grouped<{t}, {pt}, {index_t}, {_VECTOR[t]}, {group}>", (channels // group,),
            (_BLOCK,), (X, Y, MEAN, INVSTD, rm, rv, gamma, beta, it(outer), it(channels), it(inner),
                        real(eps), real(momentum), real(n / (n - 1)), np.int32(update))))
    elif training:
        launch = _launch_of(x, channels, outer, inner, (x, y))
        spec = launch.spec("batchnorm_train_fused", pt, _BOOL[FUSED_PREFETCH])
        use = fused_allowed and FUSED and (launch.splits == 1 or x.nbytes >= FUSED_FORWARD_MIN_BYTES)
        fused = _fused_grid(cp, launch, spec, channels) if use else None
        if fused is not None:
            grid, per_round, work = fused
            part_mean, part_m2 = work.partials(cp, acc, launch.grid[0])
            two_pass = _Deferred(lambda arrays: _build_forward_plan(
                cp, arrays[0], arrays[1], pdtype, channels, outer, inner, training, update, momentum, eps, no_gamma, no_beta,
                aligned, fused_allowed=False))
            launches.append(FAMILY.prepare(
                spec, grid, (_BLOCK,),
                (X, Y, part_mean, part_m2, MEAN, INVSTD, rm, rv, gamma, beta, *launch.shape,
                 np.int32(per_round), work.arrive, real(eps), real(momentum), real(n / (n - 1)),
                 np.int32(update)), cooperative=True, fallback=two_pass))
        else:  # pass 2 merges the partials in every block (faster here than finishing in pass 1)
            part_mean, part_m2 = _stream_workspace(cp).partials(cp, acc, launch.grid[0])
            launches.append(FAMILY.prepare(
                launch.spec("batchnorm_statistics", pt, "false"), launch.grid, (_BLOCK,),
                (X, part_mean, part_m2, MEAN, INVSTD, rm, rv, *launch.shape, real(eps), real(momentum),
                 real(n / (n - 1)), np.int32(update), _counters(cp, channels))))
            launches.append(FAMILY.prepare(
                launch.spec("batchnorm_normalize", pt, "true"), launch.grid, (_BLOCK,),
                (X, Y, part_mean, part_m2, MEAN, INVSTD, rm, rv, gamma, beta, *launch.shape, real(eps),
                 real(momentum), real(n / (n - 1)), np.int32(update), np.int32(1))))
    elif PACKED_INFERENCE and inner >= _VECTOR[t]:
        spec, grid, shape = _packs_launch(x, aligned, channels, inner, pt)
        launches.append(FAMILY.prepare(spec, grid, (_BLOCK,),
                                       (X, Y, MEAN, INVSTD, rm, rv, gamma, beta, *shape, real(eps))))
    elif FLAT_INFERENCE and inner % _VECTOR[t]:
        spec, grid, shape = _flat_launch(x, y, channels, inner, pt)
        launches.append(FAMILY.prepare(spec, grid, (_BLOCK,),
                                       (X, Y, MEAN, INVSTD, rm, rv, gamma, beta, *shape, real(eps))))
    else:
        launch = _launch_of(x, channels, outer, inner, (x, y))
        launches.append(FAMILY.prepare(
            launch.spec("batchnorm_normalize", pt, "false"), launch.grid, (_BLOCK,),
            (X, Y, MEAN, INVSTD, MEAN, INVSTD, rm, rv, gamma, beta, *launch.shape, real(eps), real(0),
             real(1), np.int32(0), np.int32(0))))
    return _Plan(launches, aligned, stats)


def _counters(cp, channels, work=None):
    """The stream's arrival counters (zero between launches), at least 2 * channels."""
    work = _stream_workspace(cp) if work is None else work
    if work.arrive.size < 2 * channels:
        work.arrive = cp.zeros(2 * channels, np.uint32)
    return work.arrive




def _batchnorm_gpu(cp, x, gamma, beta, running_mean, running_var, training, momentum, eps, return_stats,
                   pdtype, channels, outer, inner):
    """(y, mean, invstd, the _Plan run or None) of a validated call."""
    acc = _dtypes.accumulate_dtype(x.dtype)
    y = cp.empty(x.shape, x.dtype)
    if x.size == 0:
        nan = cp.full(channels, np.nan, dtype=acc)
        return y, nan, nan.copy(), None
    x = _validate.contiguous(cp, x)
    gamma = None if gamma is None else _validate.contiguous(cp, gamma)
    beta = None if beta is None else _validate.contiguous(cp, beta)
    update = training and running_mean is not None
    rm = None if running_mean is None else _validate.contiguous(cp, running_mean)
    rv = None if running_var is None else _validate.contiguous(cp, running_var)
    make = _rows_forward_plan if inner == 1 else _forward_plan  # channel-last: the rows kernels
    plan = make(cp, x, y, pdtype, channels, outer, inner, training, update, momentum, eps, gamma is None,
                beta is None)
    if return_stats:
        mean, invstd = cp.empty(channels, acc), cp.empty(channels, acc)
    else:
        mean, invstd = plan.stats
    plan.run(x, y, mean, invstd, rm, rv, gamma, beta)
    if update:  # the kernels updated contiguous copies: write them back
        if rm is not running_mean:
            running_mean[...] = rm
        if rv is not running_var:
            running_var[...] = rv
    return y, mean, invstd, plan


def _backward_plan(cp, x, dy, dx, pdtype, channels, outer, inner, recompute, eps, no_gamma):
    aligned = not (x.data.ptr | dy.data.ptr | dx.data.ptr) & 15
    key = ("backward", cp.cuda.runtime.getDevice(), _stream(cp), x.shape, x.dtype,
           np.dtype(pdtype), channels, inner, aligned, recompute, float(eps), no_gamma, FUSED,
           FUSED_BACKWARD_16BIT_SPLITS, GROUPED, CLUSTER, CLUSTER_BACKWARD, CLUSTER_BLOCK_BYTES,
           CLUSTER_MIN_BYTES, CLUSTER_MIN_PLANE_BYTES,
           STRIDED, STRIDED_TYPES)  # (_cluster_shape reads CLUSTER for both)
    return _cached_plan(key, lambda: _build_backward_plan(
        cp, x, dy, dx, pdtype, channels, outer, inner, recompute, float(eps), no_gamma, aligned))


def _build_backward_plan(cp, x, dy, dx, pdtype, channels, outer, inner, recompute, eps, no_gamma, aligned,
                         fused_allowed=True):
    A = _kernels
    acc = _dtypes.accumulate_dtype(x.dtype)
    X, DY, DX, DGAMMA, DBETA = A.ARRAY0, A.ARRAY1, A.ARRAY5, A.ARRAY6, A.ARRAY7
    gamma = _constant(cp, 1, channels, pdtype) if no_gamma else A.ARRAY4
    pt = _dtypes.cuda_type(pdtype)
    launch = _launch_of(x, channels, outer, inner, (x, dy, dx))
    work = _stream_workspace(cp)
    launches = []
    t = _dtypes.cuda_type(x.dtype)
    cluster = (_cluster_shape(cp, x, outer, inner, aligned, tensors=2)
               if CLUSTER_BACKWARD and not recompute and fused_allowed else None)
    if cluster:
        others = _Deferred(lambda arrays: _build_backward_plan(
            cp, arrays[0], arrays[1], arrays[5], pdtype, channels, outer, inner, recompute, eps, no_gamma, aligned,
            fused_allowed=False))
        launches.append(_cluster_launch(
            "backward", t, pt, x, cluster, channels, others,
            lambda it: (X, DY, A.ARRAY2, A.ARRAY3, gamma, DX, DGAMMA, DBETA, it(outer), it(channels), it(inner))))
        return _Plan(launches, aligned)
    strided = None if recompute else _strided(t, channels, outer, inner, aligned)
    if strided:
        launches.append(_prepare_strided(
            "backward", t, pt, x, channels, inner, strided,
            lambda it: (X, DY, A.ARRAY2, A.ARRAY3, gamma, DX, DGAMMA, DBETA, it(outer), it(channels), it(inner))))
        return _Plan(launches, aligned)
    group = 0 if recompute else _group(t, channels, outer, inner, aligned)
    if group:
        index_t = index_type(x.size + _BLOCK * _GROUP_VALUES[t])
        it = np.int32 if index_t == "int" else np.int64
        launches.append(FAMILY.prepare(
            f"batchnorm_backward_grouped<{t}, {pt}, {index_t}, {_VECTOR[t]}, {group}>", (channels // group,),
            (_BLOCK,), (X, DY, A.ARRAY2, A.ARRAY3, gamma, DX, DGAMMA, DBETA, it(outer), it(channels), it(inner))))
        return _Plan(launches, aligned)
    sixteen = x.dtype.itemsize == 2 and launch.splits > 1 and not FUSED_BACKWARD_16BIT_SPLITS
    if not recompute and FUSED and fused_allowed and not sixteen:
        spec = launch.spec("batchnorm_backward_fused", pt)
        fused = _fused_grid(cp, launch, spec, channels)
        if fused is not None:
            grid, per_round, work = fused
            part_dy, part_dy_xhat = work.partials(cp, acc, launch.grid[0])
            two_pass = _Deferred(lambda arrays: _build_backward_plan(
                cp, arrays[0], arrays[1], arrays[5], pdtype, channels, outer, inner, recompute, eps, no_gamma, aligned,
                fused_allowed=False))
            launches.append(FAMILY.prepare(
                spec, grid, (_BLOCK,),
                (X, DY, A.ARRAY2, A.ARRAY3, gamma, part_dy, part_dy_xhat, DX, DGAMMA, DBETA,
                 *launch.shape, np.int32(per_round), work.arrive), cooperative=True, fallback=two_pass))
            return _Plan(launches, aligned)
    if recompute:  # statistics first, into the plan's own vectors (stream order)
        mean, invstd = cp.empty(channels, acc), cp.empty(channels, acc)
        real = _scalar(acc)
        part_mean, part_m2 = work.partials(cp, acc, launch.grid[0])
        launches.append(FAMILY.prepare(
            launch.spec("batchnorm_statistics", pt, "true"), launch.grid, (_BLOCK,),
            (X, part_mean, part_m2, mean, invstd, mean, mean, *launch.shape, real(eps), real(0), real(1),
             np.int32(0), _counters(cp, channels))))
    else:
        mean, invstd = A.ARRAY2, A.ARRAY3
    part_dy, part_dy_xhat = work.partials(cp, acc, launch.grid[0], slot=1)
    sums = work.scratch(cp, acc, 2 * channels, 4)
    # Alternate the grid's direction from launch to launch (L2 reuse, see the .cu header).
    reverse = 1 if recompute else 0
    launches.append(FAMILY.prepare(
        launch.spec("batchnorm_backward_reduce", pt), launch.grid, (_BLOCK,),
        (X, DY, mean, invstd, part_dy, part_dy_xhat, sums, DGAMMA, DBETA, *launch.shape, np.int32(reverse),
         _counters(cp, channels))))
    launches.append(FAMILY.prepare(
        launch.spec("batchnorm_backward_data", pt), launch.grid, (_BLOCK,),
        (X, DY, mean, invstd, gamma, sums, DX, *launch.shape, np.int32(1 - reverse))))
    return _Plan(launches, aligned)


def _batchnorm_backward_gpu(cp, dy, x, gamma, mean, invstd, eps, pdtype, channels, outer, inner):
    """(dx, dgamma, dbeta, the _Plan run or None) of a validated call."""
    dx = cp.empty(x.shape, x.dtype)
    if x.size == 0:
        return dx, cp.zeros(channels, pdtype), cp.zeros(channels, pdtype), None
    dgamma = cp.empty(channels, pdtype)  # written by the kernels
    dbeta = cp.empty(channels, pdtype)
    x = _validate.contiguous(cp, x)
    dy = _validate.contiguous(cp, dy)
    if mean is not None:
        mean = _validate.contiguous(cp, mean)
        invstd = _validate.contiguous(cp, invstd)
    gamma = None if gamma is None else _validate.contiguous(cp, gamma)
    make = _rows_backward_plan if inner == 1 else _backward_plan  # channel-last: the rows kernels
    plan = make(cp, x, dy, dx, pdtype, channels, outer, inner, mean is None, eps, gamma is None)
    plan.run(x, dy, mean, invstd, gamma, dx, dgamma, dbeta)
    return dx, dgamma, dbeta, plan


# ---------------------------------------------------------------------- channel-last plans
# Channel-last (inner == 1) calls run prepared plans like the NCHW ones (a
# _Plan per device, stream, shapes, dtypes, options, alignment and switch; the
# fast table then skips validation): the single-read rows kernel (a
# CooperativeLaunch whose fallback is the multi-launch plan), or statistics +
# merge + normalize (resp. [statistics + merge +] reduce + merge + data).
# Partials live in the stream's workspace (slots 2 and 3).  Before these
# plans every channel-last call built its launches anew: ~70 us of Python on
# a 2-core host for 32x7x7x256 training (notes/bnf16.md) against ~5 for NCHW.

def _unbias(n):
    return n / (n - 1) if n > 1 else 1.0


def _rows_refused(cp, spec, grid, build):
    """A rows fused launch's fallback: remembers the refused grid (later plans
    of it skip the attempt) and builds the multi-launch plan on first use."""
    def fallback(arrays):
        _REFUSED.add((cp.cuda.runtime.getDevice(), spec, grid))
        return build(arrays)
    return _Deferred(fallback)


def _rows_forward_plan(cp, x, y, pdtype, channels, rows_count, inner, training, update, momentum, eps, no_gamma,
                       no_beta):
    aligned = not (x.data.ptr | y.data.ptr) & 15
    key = ("rows", cp.cuda.runtime.getDevice(), _stream(cp), x.shape, x.dtype,
           np.dtype(pdtype), channels, aligned, training, update, float(momentum), float(eps), no_gamma, no_beta,
           ROWS_FUSED, ROWS_FUSED_MIN_ROWS, PACKED_INFERENCE, PACKED_INFERENCE_ROWS,
           PACKED_ROWS_UNROLL, ROWS_RESIDENT, ROWS_CACHE_BYTES, ROWS_L2_WINDOW, ROWS_TRAIN_ONE_COUNT,
           ROWS_16BIT_WORDS, ROWS_16BIT_NARROW, ROWS_16BIT_LAUNCHES, ROWS_16BIT_LAUNCHES_MIN_BYTES)
    return _cached_plan(key, lambda: _build_rows_forward_plan(
        cp, x, pdtype, channels, rows_count, training, update, float(momentum), float(eps), no_gamma, no_beta,
        aligned))


def _rows_one_launch(cp, rows, pt, direction, resident_spec, channels, tensors, itemsize, fused_allowed,
                     resident_rows=None):
    """The one-launch rows kernel of `direction` ("train" / "backward"): (spec, grid, lanes,
    workspace, the kernel's extra arguments, dynamic shared bytes) of the resident kernel
    `resident_spec` when ROWS_RESIDENT and it fits, else of batchnorm_rows_*_fused; None when
    neither applies (ROWS_FUSED off, fused_allowed False: a refused cooperative launch's
    fallback plan).  `resident_rows`: the resident kernel's launch shape where it is not
    `rows`' (the 16-bit _narrow kernels, ROWS_16BIT_NARROW)."""
    if not (fused_allowed and ROWS_FUSED):
        return None
    if ROWS_RESIDENT:
        launch = _rows_resident_launch(cp, resident_rows or rows, resident_spec, channels, tensors, itemsize)
        if launch is not None:
            grid, lanes, work, cached, window, shared = launch
            return resident_spec, grid, lanes, work, (np.int32(cached), np.int32(window)), shared
    spec = rows.spec(f"{direction}_fused", pt)
    fused = _rows_fused_grid(cp, rows, spec, channels)
    if fused is None:
        return None
    grid, lanes, work = fused
    return spec, grid, lanes, work, (), 0


def _build_rows_forward_plan(cp, x, pdtype, channels, rows_count, training, update, momentum, eps, no_gamma,
                             no_beta, aligned, fused_allowed=True):
    A = _kernels
    acc = _dtypes.accumulate_dtype(x.dtype)
    real = _scalar(acc)
    pt = _dtypes.cuda_type(pdtype)
    X, Y, MEAN, INVSTD = A.ARRAY0, A.ARRAY1, A.ARRAY2, A.ARRAY3
    gamma = _constant(cp, 1, channels, pdtype) if no_gamma else A.ARRAY6
    beta = _constant(cp, 0, channels, pdtype) if no_beta else A.ARRAY7
    rm, rv = (A.ARRAY4, A.ARRAY5) if update or not training else (gamma, gamma)  # unread placeholders
    stats = (cp.empty(channels, acc), cp.empty(channels, acc))
    rows = _Rows(cp, x, channels, rows_count, aligned=aligned)
    unbias = real(_unbias(rows_count))
    work = _stream_workspace(cp)
    launches = []
    packed = None if training else _rows_packs_launch(x, aligned, channels, pt)
    if packed is not None:
        spec, grid, shape, shared = packed
        launches.append(FAMILY.prepare(spec, grid, (_BLOCK,),
                                       (X, Y, MEAN, INVSTD, rm, rv, gamma, beta, *shape, real(eps)),
                                       shared_mem=shared))
        return _Plan(launches, aligned, stats)
    if training:
        fused_allowed = fused_allowed and not _rows_launches(x, "train")
        narrow = _rows_narrow(cp, x, channels, rows_count, aligned, rows, "train")
        one_count = x.itemsize in ROWS_TRAIN_ONE_COUNT and rows.t != "double"
        if narrow:
            resident = f"batchnorm_rows_train_narrow<{narrow.t}, {pt}, {narrow.index_t}, {_BOOL[one_count]}>"
        else:
            resident = rows.spec("train_resident", pt, flag=_rows_resident_flags(rows, one_count))
        one = _rows_one_launch(cp, rows, pt, "train", resident, channels, 1, x.itemsize, fused_allowed, narrow)
        if one is not None:
            spec, grid, lanes, work, extra, shared = one
            shape = (narrow if narrow and spec == resident else rows).shape
            size = channels * lanes
            parts = work.scratch(cp, acc, 3 * size, 2)
            fallback = _rows_refused(cp, spec, grid, lambda arrays: _build_rows_forward_plan(
                cp, arrays[0], pdtype, channels, rows_count, training, update, momentum, eps, no_gamma, no_beta,
                aligned, fused_allowed=False))
            launches.append(FAMILY.prepare(
                spec, grid, (_BLOCK,),
                (X, Y, parts[:size], parts[size:2 * size], parts[2 * size:], MEAN, INVSTD, rm, rv, gamma, beta,
                 *shape, real(eps), real(momentum), unbias, np.int32(update), *extra, work.arrive),
                shared_mem=shared, cooperative=True, fallback=fallback))
            return _Plan(launches, aligned, stats)
        launches.extend(_rows_statistics_launches(cp, rows, acc, pt, channels, X, MEAN, INVSTD, rm, rv, update,
                                                  real(eps), real(momentum), unbias))
    spec = rows.spec("normalize", pt, flag=_BOOL[training])
    launches.append(FAMILY.prepare(spec, rows.grid(cp, spec, 4)[0], (_BLOCK,),
                                   (X, Y, MEAN, INVSTD, rm, rv, gamma, beta, *rows.shape, real(eps))))
    return _Plan(launches, aligned, stats)


def _rows_statistics_launches(cp, rows, acc, pt, channels, x, mean, invstd, rm, rv, update, eps, momentum,
                              unbias):
    """Training statistics of channel-last x: lane partials, then a warp per channel."""
    spec = rows.spec("statistics")
    grid, lanes = rows.grid(cp, spec, 8)
    size = channels * lanes
    parts = _stream_workspace(cp).scratch(cp, acc, 3 * size, 2)
    part_n, part_mean, part_m2 = parts[:size], parts[size:2 * size], parts[2 * size:]
    return (FAMILY.prepare(spec, grid, (_BLOCK,), (x, part_n, part_mean, part_m2, *rows.shape)),
            FAMILY.prepare(f"batchnorm_rows_merge_statistics<{rows.t}, {pt}>", rows.merge_grid, (_BLOCK,),
                           (part_n, part_mean, part_m2, np.int32(lanes), np.int32(channels), mean, invstd,
                            rm, rv, eps, momentum, unbias, np.int32(update))))


def _rows_backward_plan(cp, x, dy, dx, pdtype, channels, rows_count, inner, recompute, eps, no_gamma):
    aligned = not (x.data.ptr | dy.data.ptr | dx.data.ptr) & 15
    key = ("rows backward", cp.cuda.runtime.getDevice(), _stream(cp), x.shape, x.dtype,
           np.dtype(pdtype), channels, aligned, recompute, float(eps), no_gamma, ROWS_FUSED,
           ROWS_FUSED_MIN_ROWS, ROWS_RESIDENT, ROWS_CACHE_BYTES, ROWS_L2_WINDOW, ROWS_16BIT_WORDS,
           ROWS_16BIT_NARROW, ROWS_16BIT_LAUNCHES, ROWS_16BIT_LAUNCHES_MIN_BYTES)
    return _cached_plan(key, lambda: _build_rows_backward_plan(
        cp, x, pdtype, channels, rows_count, recompute, float(eps), no_gamma, aligned))


def _build_rows_backward_plan(cp, x, pdtype, channels, rows_count, recompute, eps, no_gamma, aligned,
                              fused_allowed=True):
    A = _kernels
    acc = _dtypes.accumulate_dtype(x.dtype)
    real = _scalar(acc)
    pt = _dtypes.cuda_type(pdtype)
    X, DY, DX, DGAMMA, DBETA = A.ARRAY0, A.ARRAY1, A.ARRAY5, A.ARRAY6, A.ARRAY7
    gamma = _constant(cp, 1, channels, pdtype) if no_gamma else A.ARRAY4
    rows = _Rows(cp, x, channels, rows_count, aligned=aligned)
    launches = []
    if recompute:  # statistics first, into the plan's own vectors (stream order)
        mean, invstd = cp.empty(channels, acc), cp.empty(channels, acc)
        launches.extend(_rows_statistics_launches(cp, rows, acc, pt, channels, X, mean, invstd, mean, mean, False,
                                                  real(eps), real(0), real(1)))
    else:
        mean, invstd = A.ARRAY2, A.ARRAY3
    fused_allowed = fused_allowed and not _rows_launches(x, "backward")
    narrow = _rows_narrow(cp, x, channels, rows_count, aligned, rows, "backward")
    if narrow:
        resident = f"batchnorm_rows_backward_narrow<{narrow.t}, {pt}, {narrow.index_t}>"
    else:
        resident = rows.spec("backward_resident", pt, flag=_rows_resident_flags(rows))
    one = _rows_one_launch(cp, rows, pt, "backward", resident, channels, 2, x.itemsize, fused_allowed, narrow)
    if one is not None:
        spec, grid, lanes, work, extra, shared = one
        shape = (narrow if narrow and spec == resident else rows).shape
        size = channels * lanes
        parts = work.scratch(cp, acc, 2 * size + 2 * channels, 3)
        fallback = _rows_refused(cp, spec, grid, lambda arrays: _build_rows_backward_plan(
            cp, arrays[0], pdtype, channels, rows_count, recompute, eps, no_gamma, aligned, fused_allowed=False))
        launches.append(FAMILY.prepare(
            spec, grid, (_BLOCK,),
            (X, DY, mean, invstd, gamma, parts[:size], parts[size:2 * size], parts[2 * size:], DX, DGAMMA, DBETA,
             *shape, *extra, work.arrive), shared_mem=shared, cooperative=True, fallback=fallback))
        return _Plan(launches, aligned)
    spec = rows.spec("backward_reduce")
    grid, lanes = rows.grid(cp, spec, 8)
    size = channels * lanes
    parts = _stream_workspace(cp).scratch(cp, acc, 2 * size + 2 * channels, 3)
    part_g, part_gx, sums = parts[:size], parts[size:2 * size], parts[2 * size:]
    launches.append(FAMILY.prepare(spec, grid, (_BLOCK,), (X, DY, mean, part_g, part_gx, *rows.shape)))
    launches.append(FAMILY.prepare(f"batchnorm_rows_backward_merge<{rows.t}, {pt}>", rows.merge_grid, (_BLOCK,),
                                   (part_g, part_gx, np.int32(lanes), np.int32(channels), invstd, sums, DGAMMA,
                                    DBETA)))
    spec = rows.spec("backward_data", pt)
    launches.append(FAMILY.prepare(spec, rows.grid(cp, spec, 4)[0], (_BLOCK,),
                                   (X, DY, mean, invstd, gamma, sums, DX, *rows.shape)))
    return _Plan(launches, aligned)
