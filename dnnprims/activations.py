"""Pointwise activations, forward and backward (PyTorch semantics).

``activation(x, mode, alpha=None, approximate="none")``; ``mode`` is one of
:data:`ACTIVATION_MODES`.  ``alpha`` is the mode's parameter and may only be
given for the modes that have one:

* ``elu``: the scale of the negative branch, default 1.0 (PyTorch's ``alpha``);
* ``leaky_relu``: the negative slope, default 0.01 (PyTorch's ``negative_slope``);
* ``clipped_relu``: the ceiling, ``min(max(x, 0), alpha)`` (cuDNN's
  CUDNN_ACTIVATION_CLIPPED_RELU; PyTorch's ``hardtanh(x, 0, alpha)``), default
  6.0 (ReLU6); it must be positive.

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

# ActivationMode in kernels/activation.cu; "gelu_tanh" is gelu with approximate="tanh".
_KERNEL_MODE = {"relu": 0, "sigmoid": 1, "tanh": 2, "elu": 3, "gelu": 4, "gelu_tanh": 5,
                "silu": 6, "leaky_relu": 7, "clipped_relu": 8}

_BLOCK = 256
_MAX_BLOCKS = 65536  # grid cap; kernels loop with a grid stride
_STRIDE_SLACK = _BLOCK * _MAX_BLOCKS

FAMILY = _kernels.KernelFamily("activation.cu", [
    f"activation_{direction}<{t}, {i}, {m}>"
    for direction in ("forward", "backward")
    for t in _dtypes.CUDA_TYPES
    for i in ("int", "long long")
    for m in sorted(set(_KERNEL_MODE.values()))
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
    alpha = float(alpha)
    if not math.isfinite(alpha):
        raise ValueError(f"alpha must be finite, got {alpha!r}")
    if mode == "clipped_relu" and alpha <= 0:
        raise ValueError(f"alpha (the ceiling of clipped_relu) must be positive, got {alpha!r}")
    return alpha


def _launch(direction, mode, approximate, alpha, arrays, n, dtype):
    if n == 0:
        return
    kernel_mode = _KERNEL_MODE["gelu_tanh" if approximate == "tanh" else mode]
    index_t = _kernels.index_type(n + _STRIDE_SLACK)
    itype = np.int32 if index_t == "int" else np.int64
    atype = np.float64 if np.dtype(dtype) == _dtypes.FLOAT64 else np.float32
    grid = min(_kernels.ceil_div(n, _BLOCK), _MAX_BLOCKS)
    FAMILY.launch(f"activation_{direction}<{_dtypes.cuda_type(dtype)}, {index_t}, {kernel_mode}>",
                  (grid,), (_BLOCK,), (*arrays, itype(n), atype(alpha if alpha is not None else 0.0)))


def activation(x, mode, *, alpha=None, approximate="none"):
    """Apply the activation ``mode`` elementwise."""
    xp = _validate.array_module(x=x)
    _validate.check_float_dtype("x", x)
    alpha = _check_options(mode, alpha, approximate)
    if xp is np:
        return _reference.activation(x, mode, alpha, approximate)
    x = _validate.contiguous(xp, x)
    y = xp.empty(x.shape, x.dtype)
    _launch("forward", mode, approximate, alpha, (x, y), x.size, x.dtype)
    return y


def activation_backward(dy, x, mode, *, alpha=None, approximate="none"):
    """Gradient of :func:`activation` with respect to its input ``x``."""
    xp = _validate.array_module(dy=dy, x=x)
    _validate.check_float_dtype("x", x)
    alpha = _check_options(mode, alpha, approximate)
    if dy is None:  # a zero output gradient
        return xp.zeros(x.shape, x.dtype)
    _validate.check_same_dtype(dy=dy, x=x)
    _validate.check_shape("dy", dy, x.shape, "the shape of x")
    if xp is np:
        return _reference.activation_backward(dy, x, mode, alpha, approximate)
    dy, x = _validate.contiguous(xp, dy), _validate.contiguous(xp, x)
    dx = xp.empty(x.shape, x.dtype)
    _launch("backward", mode, approximate, alpha, (dy, x, dx), x.size, x.dtype)
    return dx
