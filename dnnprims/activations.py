"""Pointwise activations, forward and backward (PyTorch semantics).

``activation(x, mode, *, alpha=None, approximate="none")``; ``mode`` is one of
:data:`ACTIVATION_MODES`.  ``alpha`` is the mode's parameter and may only be
given for the modes that have one:

* ``elu``: the scale of the negative branch, default 1.0 (PyTorch's ``alpha``);
* ``leaky_relu``: the negative slope, default 0.01 (PyTorch's ``negative_slope``);
* ``clipped_relu``: the ceiling, ``min(max(x, 0), alpha)`` (cuDNN's
  CUDNN_ACTIVATION_CLIPPED_RELU; PyTorch's ``hardtanh(x, 0, alpha)``), default
  6.0 (ReLU6); it must be positive.

A zero ``alpha`` runs as 0.0 whatever its sign (``-0.0`` gives the same bits).

``approximate="tanh"`` selects the tanh approximation of ``gelu`` (PyTorch's
``gelu(x, approximate="tanh")``); the default is the exact erf form.
Backward takes the forward *input* ``x``; ``dy=None`` stands for a zero output
gradient.  NumPy arrays run :mod:`dnnprims.reference.activations`; CuPy arrays
run ``kernels/activation.cu``.
"""
import math

import numpy as np

from . import _dtypes, _kernels, _validate
from .reference import activations as _reference

ACTIVATION_MODES = ("relu", "sigmoid", "tanh", "elu", "gelu", "silu", "leaky_relu", "clipped_relu")
APPROXIMATIONS = ("none", "tanh")

# Default alpha of each mode that has one; other modes take no alpha.
DEFAULT_ALPHA = {"elu": 1.0, "leaky_relu": 0.01, "clipped_relu": 6.0}

# ActivationMode in kernels/activation.cu; "gelu_tanh" is gelu with approximate="tanh";
# "gelu_one_exp" the same erf GELU from one exponential (forward on 16-bit storage).
_KERNEL_MODE = {"relu": 0, "sigmoid": 1, "tanh": 2, "elu": 3, "gelu": 4, "gelu_tanh": 5,
                "silu": 6, "leaky_relu": 7, "clipped_relu": 8, "gelu_one_exp": 9}

_BLOCK = 256
_UNROLL = 4          # UNROLL in activation.cu: bias_activation_forward's packs per thread per step
_MAX_BLOCKS = 65536  # grid cap; kernels loop with a grid stride
_STRIDE_SLACK = 4 * _BLOCK * _UNROLL * _MAX_BLOCKS  # index + one stride, in elements (VEC <= 8)
_PLANE_CHUNK = 8192  # elements per block in the NCHW bias backward (a multiple of every VEC)
_ROW_CHUNK = 8       # least rows per block in the NHWC bias backward (blockDim.y)
_NHWC_BLOCKS = 2048  # blocks the NHWC bias backward aims at (a few waves of 132 SMs x 8)
NHWC_PACKED = True   # NHWC bias backward with 16-byte packs of channels when C % VEC == 0
LAYOUTS = ("NCHW", "NHWC")

# Switches (session 10, notes/biasact.md; they key the plans, so an A/B flips them
# in one process).  The session 9 behaviour: 4 / False / False / ().  H100 A/B, 64x256x56x56:
# Packs a thread of the 16-bit elementwise forward (1 or 4: the declared specialisations):
# 1 (gelu fp16 0.0738 -> 0.0709 ms with gelu_one_exp, relu 0.0715 -> 0.0711).
FORWARD_UNROLL_16BIT = 1
# 16-bit gelu forward (erf) through gelu_one_exp (activation_math.cuh) instead of erff
# (within one unit in the last place of float64's x Phi(x); fp16 / bf16 +2 %, with one
# pack a thread +4 %).
GELU_ONE_EXP_16BIT = True
# Bias backward, packed cases: NCHW through bias_activation_backward_plane_packs (one trip
# to memory a block; fp32 gelu 0.2220 -> 0.2084 ms, fp16 gelu +6 %, relu +0.6 %) and NHWC
# through bias_activation_backward_rows_sweep (a resident grid sweeping slabs of rows) for
# the storage types listed (fp32 gelu 0.2359 -> 0.2270, relu +0.3 %; fp16 gelu -2 %: not
# for 16-bit) instead of *_planes / *_rows_packed.
PLANE_PACKS = True
NHWC_SWEEP = ("float",)
_SWEEP_UNROLL = 4  # SWEEP_UNROLL in activation.cu

_MODE_VALUES = sorted(set(_KERNEL_MODE.values()) - {_KERNEL_MODE["gelu_one_exp"]})
_HALF_TYPES = tuple(t for t in _dtypes.CUDA_TYPES if t in ("half_t", "bfloat16_t"))
_INDEX_TYPES = ("int", "long long")
FAMILY = _kernels.KernelFamily("activation.cu", [
    # activation_forward<T, index, mode, packs a thread>: 16-bit takes gelu_one_exp and 1 or 4.
    *(f"activation_forward<{t}, {i}, {m}, {u}>"
      for t in _dtypes.CUDA_TYPES
      for i in _INDEX_TYPES
      for m in (_MODE_VALUES + [_KERNEL_MODE["gelu_one_exp"]] if t in _HALF_TYPES else _MODE_VALUES)
      for u in ((1, 4) if t in _HALF_TYPES else (1,))),
    *(f"bias_activation_forward<{t}, {i}, {m}>"
      for t in _dtypes.CUDA_TYPES
      for i in _INDEX_TYPES
      for m in (_MODE_VALUES + [_KERNEL_MODE["gelu_one_exp"]] if t in _HALF_TYPES else _MODE_VALUES)),
    *(f"{kernel}<{t}, {i}, {m}>"
      for kernel in ("activation_backward", "bias_activation_backward_planes", "bias_activation_backward_rows",
                     "bias_activation_backward_rows_packed", "bias_activation_backward_plane_packs",
                     "bias_activation_backward_rows_sweep")
      for t in _dtypes.CUDA_TYPES
      for i in _INDEX_TYPES
      for m in _MODE_VALUES),
    *(f"bias_grad_reduce<{t}, {i}>" for t in _dtypes.CUDA_TYPES for i in _INDEX_TYPES),
])


def _check_options(mode, alpha, approximate):
    """Validate mode/alpha/approximate; return the resolved alpha (None where unused)."""
    if not isinstance(mode, str):
        raise TypeError(f"mode must be a string, one of {', '.join(map(repr, ACTIVATION_MODES))}; "
                        f"got {mode!r}")
    _validate.check_choice("mode", mode, ACTIVATION_MODES)
    _validate.check_choice("approximate", approximate, APPROXIMATIONS)
    if approximate != "none" and mode != "gelu":
        raise ValueError(f"approximate={approximate!r} applies only to mode 'gelu', not {mode!r}")
    if mode not in DEFAULT_ALPHA:
        if alpha is not None:
            raise ValueError(f"alpha is not used by mode {mode!r} (only by "
                             f"{', '.join(map(repr, DEFAULT_ALPHA))}); got alpha={alpha!r}")
        return None
    if alpha is None:
        return DEFAULT_ALPHA[mode]
    if isinstance(alpha, (bool, np.bool_)) or not isinstance(alpha, (int, float, np.integer, np.floating)):
        raise TypeError(f"alpha must be a real number, got {alpha!r}")
    # + 0.0 turns -0.0 into 0.0: the caches key alpha by value, and -0.0 == 0.0, so
    # a cached call would run with whichever sign came first (leaky_relu and elu
    # give zeros of alpha's sign times x's); one sign keeps every path alike.
    alpha = float(alpha) + 0.0
    if not math.isfinite(alpha):
        raise ValueError(f"alpha must be finite, got {alpha!r}")
    if mode == "clipped_relu" and alpha <= 0:
        raise ValueError(f"alpha (the ceiling of clipped_relu) must be positive, got {alpha!r}")
    return alpha


def _packs(n, dtype, arrays):
    """16-byte packs the kernels may move: all of n's whole packs when every pointer is aligned."""
    vec = 16 // np.dtype(dtype).itemsize
    return n // vec if all(a.data.ptr % 16 == 0 for a in arrays) else 0


def _kernel_mode(mode, approximate, dtype, forward=False):
    """ActivationMode of a call: gelu_one_exp for a 16-bit gelu forward (GELU_ONE_EXP_16BIT)."""
    if mode == "gelu" and approximate == "tanh":
        return _KERNEL_MODE["gelu_tanh"]
    if forward and mode == "gelu" and GELU_ONE_EXP_16BIT and np.dtype(dtype).itemsize == 2:
        return _KERNEL_MODE["gelu_one_exp"]
    return _KERNEL_MODE[mode]


def _kernel_args(mode, approximate, alpha, n, dtype, forward=False):
    """(template arguments, index type, alpha scalar) of one call."""
    kernel_mode = _kernel_mode(mode, approximate, dtype, forward)
    index_t = _kernels.index_type(n + _STRIDE_SLACK)
    atype = np.float64 if np.dtype(dtype) == _dtypes.FLOAT64 else np.float32
    template = f"<{_dtypes.cuda_type(dtype)}, {index_t}, {kernel_mode}>"
    return template, (np.int32 if index_t == "int" else np.int64), atype(alpha if alpha is not None else 0.0)


def _unroll(direction, dtype, mode):
    """Packs per thread per step of activation_<direction> (U in activation.cu): 1 but
    for 16-bit forward, FORWARD_UNROLL_16BIT."""
    if direction != "forward" or np.dtype(dtype).itemsize != 2:
        return 1
    return FORWARD_UNROLL_16BIT


def _grid(n, packs, vec, unroll=_UNROLL):
    """Blocks for the pack loop (``unroll`` packs a thread) and the scalar tail,
    capped (the kernels grid-stride)."""
    blocks = max(_kernels.ceil_div(packs, _BLOCK * unroll), _kernels.ceil_div(n - packs * vec, _BLOCK))
    return min(max(blocks, 1), _MAX_BLOCKS)


_PLANS = {}  # (direction, mode, approximate, alpha, n, dtype, aligned, switches) -> (expression, grid, scalars)


def _switches():
    """The switches a plan of the elementwise kernels depends on (part of its keys)."""
    return FORWARD_UNROLL_16BIT, GELU_ONE_EXP_16BIT


def _cached_plan(direction, mode, approximate, alpha, n, dtype, aligned):
    key = (direction, mode, approximate, alpha, n, dtype, aligned, _switches())
    plan = _PLANS.get(key)
    if plan is None:
        forward = direction == "forward"
        template, itype, a = _kernel_args(mode, approximate, alpha, n, dtype, forward)
        unroll = _unroll(direction, dtype, mode)
        if forward:
            template = f"{template[:-1]}, {unroll}>"
        packs = n // (16 // np.dtype(dtype).itemsize) if aligned else 0
        grid = _grid(n, packs, 16 // np.dtype(dtype).itemsize, unroll)
        if len(_PLANS) >= 4096:
            _PLANS.clear()
        plan = _PLANS[key] = (f"activation_{direction}{template}", (grid,), (itype(n), itype(packs), a))
    return plan


def _launch(direction, mode, approximate, alpha, arrays, n, dtype):
    if n == 0:
        return
    aligned = all(a.data.ptr % 16 == 0 for a in arrays)
    expr, grid, scalars = _cached_plan(direction, mode, approximate, alpha, n, dtype, aligned)
    FAMILY.launch(expr, grid, (_BLOCK,), (*arrays, *scalars))


def _no_launch(*arrays):
    """The prepared launch of an empty array."""


def _prepare(direction, mode, approximate, alpha, n, dtype):
    """The prepared launch for 16-byte-aligned arrays on the current device."""
    if n == 0:
        return _no_launch
    expr, grid, scalars = _cached_plan(direction, mode, approximate, alpha, n, dtype, True)
    arrays = (_kernels.ARRAY0, _kernels.ARRAY1) if direction == "forward" else \
        (_kernels.ARRAY0, _kernels.ARRAY1, _kernels.ARRAY2)
    return FAMILY.prepare(expr, grid, (_BLOCK,), (*arrays, *scalars))


# Validated GPU calls: the resolved alpha per kind of call (see _validate.CallMemo);
# _FAST: the fast path's table, (shapes, dtypes, devices, current device, mode,
# alpha and its type, approximate) of C-contiguous 16-byte-aligned arrays ->
# (prepared launch, output slot).
_MEMO = _validate.CallMemo()
_FAST = _MEMO.fast
_NDARRAY = _validate.NDARRAY
_current_device = _validate.current_device


def activation(x, mode, *, alpha=None, approximate="none"):
    """Apply the activation ``mode`` elementwise."""
    if type(x) is _NDARRAY and x._c_contiguous:
        data = x.data
        try:
            fast = _FAST.get((x.shape, x.dtype, data.device_id, _current_device(), mode, alpha,
                              type(alpha), approximate, _switches()))
        except TypeError:  # an unhashable option: the slow path says what is wrong
            fast = None
        if fast is not None and not data.ptr & 15:
            y = fast[1]()
            if not y.data.ptr & 15:
                fast[0](x, y)
                return y
    key = _MEMO.key("forward", (x,), (mode, alpha, approximate))
    checked = _MEMO.get(key)
    if checked is None:
        xp = _validate.array_module(x=x)
        _validate.check_float_dtype("x", x)
        resolved = _check_options(mode, alpha, approximate)
        if xp is np:
            return _reference.activation(x, mode, resolved, approximate)
        checked = _MEMO.put(key, (resolved,))
    xp, (resolved,) = _validate._cupy, checked
    if x._c_contiguous:
        fast_key = (x.shape, x.dtype, x.data.device_id, _current_device(), mode, alpha, type(alpha),
                    approximate, _switches())
        launch, output = _FAST.get(fast_key) or _MEMO.put_fast(
            fast_key, (_prepare("forward", mode, approximate, resolved, x.size, x.dtype),
                       _kernels.OutputSlot(x.shape, x.dtype)))
        y = output()
        if not (x.data.ptr | y.data.ptr) & 15:
            launch(x, y)
            return y
    x = _validate.contiguous(xp, x)
    y = xp.empty(x.shape, x.dtype)
    _launch("forward", mode, approximate, resolved, (x, y), x.size, x.dtype)
    return y


def activation_backward(dy, x, mode, *, alpha=None, approximate="none"):
    """Gradient of :func:`activation` with respect to its input ``x``."""
    if type(dy) is _NDARRAY and type(x) is _NDARRAY and dy._c_contiguous and x._c_contiguous:
        dy_data, x_data = dy.data, x.data
        try:
            fast = _FAST.get((dy.shape, dy.dtype, dy_data.device_id, x.shape, x.dtype, x_data.device_id,
                              _current_device(), mode, alpha, type(alpha), approximate))
        except TypeError:
            fast = None
        if fast is not None and not (dy_data.ptr | x_data.ptr) & 15:
            dx = fast[1]()
            if not dx.data.ptr & 15:
                fast[0](dy, x, dx)
                return dx
    key = _MEMO.key("backward", (dy, x), (mode, alpha, approximate))
    checked = _MEMO.get(key) if dy is not None else None
    if checked is None:
        xp = _validate.array_module(dy=dy, x=x)
        _validate.check_float_dtype("x", x)
        resolved = _check_options(mode, alpha, approximate)
        if dy is None:  # a zero output gradient
            return xp.zeros(x.shape, x.dtype)
        _validate.check_same_dtype(dy=dy, x=x)
        _validate.check_shape("dy", dy, x.shape, "the shape of x")
        if xp is np:
            return _reference.activation_backward(dy, x, mode, resolved, approximate)
        checked = _MEMO.put(key, (resolved,))
    xp, (resolved,) = _validate._cupy, checked
    if dy._c_contiguous and x._c_contiguous:
        fast_key = (dy.shape, dy.dtype, dy.data.device_id, x.shape, x.dtype, x.data.device_id,
                    _current_device(), mode, alpha, type(alpha), approximate)
        launch, output = _FAST.get(fast_key) or _MEMO.put_fast(
            fast_key, (_prepare("backward", mode, approximate, resolved, x.size, x.dtype),
                       _kernels.OutputSlot(x.shape, x.dtype)))
        dx = output()
        if not (dy.data.ptr | x.data.ptr | dx.data.ptr) & 15:
            launch(dy, x, dx)
            return dx
    dy, x = _validate.contiguous(xp, dy), _validate.contiguous(xp, x)
    dx = xp.empty(x.shape, x.dtype)
    _launch("backward", mode, approximate, resolved, (dy, x, dx), x.size, x.dtype)
    return dx


# ---- bias + activation -----------------------------------------------------------

def _bias_view(x, bias, layout):
    """(outer, channels, inner) of x around its channel axis; checks bias against it."""
    _validate.check_layout(layout, LAYOUTS)
    if x.ndim < 2:
        raise ValueError(f"x must have at least 2 dimensions (batch and channels), got shape {tuple(x.shape)}")
    axis = 1 if layout == "NCHW" else x.ndim - 1
    channels = int(x.shape[axis])
    _validate.check_shape("bias", bias, (channels,), f"the channels of x in {layout}")
    outer = math.prod(x.shape[:axis])
    inner = math.prod(x.shape[axis + 1:])
    return outer, channels, inner


_RESIDENT = {}  # (device, expression) -> blocks of 256 threads the device holds at once


def _resident_blocks(expression):
    """Blocks of 256 threads of one kernel that the current device runs at once (the
    occupancy API times the SM count; 4 a SM if the API fails)."""
    import cupy
    device = cupy.cuda.runtime.getDevice()
    blocks = _RESIDENT.get((device, expression))
    if blocks is None:
        sms = int(cupy.cuda.Device(device).attributes["MultiProcessorCount"])
        try:
            from cupy_backends.cuda.api import driver
            per_sm = int(driver.occupancyMaxActiveBlocksPerMultiprocessor(FAMILY.function(expression).ptr, 256, 0))
        except Exception:  # noqa: BLE001 -- no occupancy API: a guess that still fills the device
            per_sm = 4
        blocks = _RESIDENT[(device, expression)] = max(per_sm, 1) * sms
    return blocks


def bias_activation(x, bias, mode, *, alpha=None, approximate="none", layout="NCHW"):
    """``activation(x + bias[c], mode)`` in one pass, ``c`` the channel of each element.

    x is (N, C, ...) in NCHW (channels on axis 1) or (N, ..., C) in NHWC
    (channels last); bias is (C,).  The sum x + bias is kept in the
    accumulation type (not rounded to x's dtype) before the activation."""
    xp = _validate.array_module(x=x, bias=bias)
    _validate.check_float_dtype("x", x)
    _validate.check_float_dtype("bias", bias)
    _validate.check_same_dtype(x=x, bias=bias)
    alpha = _check_options(mode, alpha, approximate)
    outer, channels, inner = _bias_view(x, bias, layout)
    if xp is np:
        return _reference.bias_activation(x, bias, mode, alpha, approximate, layout)
    x, bias = _validate.contiguous(xp, x), _validate.contiguous(xp, bias)
    y = xp.empty(x.shape, x.dtype)
    n = x.size
    if n == 0:
        return y
    template, itype, a = _kernel_args(mode, approximate, alpha, n, x.dtype, forward=True)
    vec = 16 // x.dtype.itemsize
    # A pack holds one channel (NCHW, inner % vec == 0) or vec consecutive ones (C % vec == 0).
    packable = inner % vec == 0 if inner > 1 else channels % vec == 0
    packs = _packs(n, x.dtype, (x, y)) if packable else 0
    FAMILY.launch(f"bias_activation_forward{template}", (_grid(n, packs, vec),), (_BLOCK,),
                  (x, bias, y, itype(n), itype(packs), itype(inner), itype(channels), a))
    return y


def bias_activation_backward(dy, x, bias, mode, *, alpha=None, approximate="none", layout="NCHW"):
    """Gradients of :func:`bias_activation`: ``(dx, dbias)`` with
    ``dx = dy * act'(x + bias[c])`` and ``dbias[c]`` the sum of dx over every
    axis but the channel axis.  ``dy=None`` stands for a zero output gradient."""
    xp = _validate.array_module(dy=dy, x=x, bias=bias)
    _validate.check_float_dtype("x", x)
    _validate.check_float_dtype("bias", bias)
    _validate.check_same_dtype(x=x, bias=bias, dy=dy)
    alpha = _check_options(mode, alpha, approximate)
    outer, channels, inner = _bias_view(x, bias, layout)
    if dy is None:
        return xp.zeros(x.shape, x.dtype), xp.zeros(bias.shape, bias.dtype)
    _validate.check_shape("dy", dy, x.shape, "the shape of x")
    if xp is np:
        return _reference.bias_activation_backward(dy, x, bias, mode, alpha, approximate, layout)
    dy, x, bias = (_validate.contiguous(xp, a) for a in (dy, x, bias))
    dx = xp.empty(x.shape, x.dtype)
    dbias = xp.empty(bias.shape, bias.dtype)
    n = x.size
    if n == 0:
        dbias.fill(0)
        return dx, dbias
    template, itype, a = _kernel_args(mode, approximate, alpha, n, x.dtype)
    acc = _dtypes.accumulate_dtype(x.dtype)
    vec = 16 // x.dtype.itemsize
    aligned = all(v.data.ptr % 16 == 0 for v in (dy, x, dx))
    planes = outer * channels
    if inner > 1 and PLANE_PACKS and inner % vec == 0 and aligned:  # NCHW: one trip a block
        chunks = _kernels.ceil_div(inner // vec, _BLOCK * _SWEEP_UNROLL)
        groups = outer * chunks
        partial = xp.empty((groups, channels), acc)
        FAMILY.launch(f"bias_activation_backward_plane_packs{template}", (min(planes * chunks, _MAX_BLOCKS),),
                      (_BLOCK,), (dy, x, bias, dx, partial, itype(planes), itype(channels), itype(inner),
                                  itype(chunks), a))
    elif inner > 1:  # NCHW: chunks of (n, c) planes
        chunks = _kernels.ceil_div(inner, _PLANE_CHUNK)
        vector = int(inner % vec == 0 and aligned)
        groups = outer * chunks
        partial = xp.empty((groups, channels), acc)
        FAMILY.launch(f"bias_activation_backward_planes{template}", (min(planes * chunks, _MAX_BLOCKS),),
                      (_BLOCK,), (dy, x, bias, dx, partial, itype(planes), itype(channels), itype(inner),
                                  itype(chunks), itype(_PLANE_CHUNK), np.int32(vector), a))
    elif _dtypes.cuda_type(x.dtype) in NHWC_SWEEP and NHWC_PACKED and channels % vec == 0 and aligned:  # channels last: a resident grid sweeps
        kernel = f"bias_activation_backward_rows_sweep{template}"
        lanes = _kernels.ceil_div(channels // vec, 32)
        groups = min(max(_resident_blocks(kernel) // lanes, 1), 65535,
                     _kernels.ceil_div(outer, 8 * _SWEEP_UNROLL))
        partial = xp.empty((groups, channels), acc)
        FAMILY.launch(kernel, (lanes, groups), (32, 8),
                      (dy, x, bias, dx, partial, itype(outer), itype(channels), a))
    else:  # channels last (or no spatial axes): 32 channels (or packs of them) x rows per block
        if NHWC_PACKED and channels % vec == 0 and aligned:
            kernel, lanes = "bias_activation_backward_rows_packed", _kernels.ceil_div(channels // vec, 32)
        else:
            kernel, lanes = "bias_activation_backward_rows", _kernels.ceil_div(channels, 32)
        # Chunks of rows so that lanes x groups is about _NHWC_BLOCKS blocks (grid.y <= 65535).
        groups = min(max(_NHWC_BLOCKS // lanes, 1), 65535, _kernels.ceil_div(outer, _ROW_CHUNK))
        rows_per_chunk = _kernels.ceil_div(_kernels.ceil_div(outer, groups), _ROW_CHUNK) * _ROW_CHUNK
        groups = _kernels.ceil_div(outer, rows_per_chunk)
        partial = xp.empty((groups, channels), acc)
        FAMILY.launch(f"{kernel}{template}", (lanes, groups), (32, 8),
                      (dy, x, bias, dx, partial, itype(outer), itype(channels), itype(rows_per_chunk), a))
    index_t = template.split(", ")[1]
    FAMILY.launch(f"bias_grad_reduce<{_dtypes.cuda_type(x.dtype)}, {index_t}>",
                  (min(_kernels.ceil_div(channels, 32), _MAX_BLOCKS),), (32, 32),
                  (partial, dbias, itype(groups), itype(channels)))
    return dx, dbias
