"""NumPy reference for the pointwise activations, forward and backward.

Modes and their parameter ``alpha`` (resolved by :mod:`dnnprims.activations`):

=============  ========================================  =========================
mode           forward                                   alpha
=============  ========================================  =========================
relu           max(x, 0)                                 --
sigmoid        1 / (1 + exp(-x))                         --
tanh           tanh(x)                                   --
elu            x if x > 0 else alpha * (exp(x) - 1)      alpha (1.0)
gelu           x * Phi(x) (erf); tanh approximation      --
silu           x * sigmoid(x)                            --
leaky_relu     x if x > 0 else alpha * x                 negative slope (0.01)
clipped_relu   min(max(x, 0), alpha)                     ceiling (6.0)
=============  ========================================  =========================

Backward takes the forward *input* x.  At the kinks the derivative is PyTorch's:
relu and clipped_relu pass no gradient at x == 0 (nor at x == alpha for
clipped_relu, PyTorch's hardtanh), leaky_relu passes alpha * dy at 0, elu
alpha * dy.  A NaN x passes dy through relu (PyTorch's threshold_backward
tests ``x <= 0``) and alpha * dy through leaky_relu; clipped_relu passes
nothing (PyTorch's hardtanh_backward gives 0 or dy there depending on its
vectorisation).
"""
import math

import numpy as np

from .. import _dtypes

SQRT_HALF = math.sqrt(0.5)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
GELU_TANH_CUBIC = 0.044715

_erf_elementwise = np.frompyfunc(math.erf, 1, 1)


def _erf(a):
    """erf elementwise through math.erf (correctly rounded to ~1 ulp in float64);
    NumPy has no erf and SciPy is not a dependency."""
    return np.asarray(_erf_elementwise(a.astype(np.float64)), np.float64).astype(a.dtype)


def _sigmoid(a):
    # exp(-|a|) never overflows; both branches are exact rearrangements.
    e = np.exp(-np.abs(a))
    return np.where(a >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(a.dtype)


def _gelu_tanh_inner(a):
    return np.tanh(a.dtype.type(SQRT_2_OVER_PI) * (a + a.dtype.type(GELU_TANH_CUBIC) * a * a * a))


def _forward(a, mode, alpha, approximate):
    if mode == "relu":
        return np.maximum(a, 0)
    if mode == "sigmoid":
        return _sigmoid(a)
    if mode == "tanh":
        return np.tanh(a)
    if mode == "elu":
        return np.where(a > 0, a, alpha * np.expm1(np.minimum(a, 0)))
    if mode == "gelu" and approximate == "tanh":
        return 0.5 * a * (1 + _gelu_tanh_inner(a))
    if mode == "gelu":
        return 0.5 * a * (1 + _erf(a * a.dtype.type(SQRT_HALF)))
    if mode == "silu":
        return a * _sigmoid(a)
    if mode == "leaky_relu":
        return np.where(a > 0, a, alpha * a)
    if mode == "clipped_relu":
        return np.minimum(np.maximum(a, 0), alpha)
    raise ValueError(f"unknown activation mode {mode!r}")


def _derivative(a, mode, alpha, approximate):
    """d activation / dx at a."""
    if mode == "relu":  # "not <= 0" rather than "> 0": a NaN x passes dy, as in PyTorch
        return (~(a <= 0)).astype(a.dtype)
    # sigmoid' = s (1 - s) and tanh' = 1 - t^2 cancel badly where s or |t| is
    # near 1; the exp(-|x|) forms below are accurate everywhere and never overflow.
    if mode == "sigmoid":
        e = np.exp(-np.abs(a))
        return e / ((1 + e) * (1 + e))
    if mode == "tanh":
        e = np.exp(-2 * np.abs(a))
        return 4 * e / ((1 + e) * (1 + e))
    if mode == "elu":
        return np.where(a > 0, 1, alpha * np.exp(np.minimum(a, 0)))
    if mode == "gelu" and approximate == "tanh":
        t = _gelu_tanh_inner(a)
        k = a.dtype.type(SQRT_2_OVER_PI)
        return 0.5 * (1 + t) + 0.5 * a * (1 - t * t) * k * (1 + 3 * a.dtype.type(GELU_TANH_CUBIC) * a * a)
    if mode == "gelu":
        cdf = 0.5 * (1 + _erf(a * a.dtype.type(SQRT_HALF)))
        return cdf + a * a.dtype.type(INV_SQRT_2PI) * np.exp(-0.5 * a * a)
    if mode == "silu":
        s = _sigmoid(a)
        return s * (1 + a * (1 - s))
    if mode == "leaky_relu":
        return np.where(a > 0, 1, alpha).astype(a.dtype)
    if mode == "clipped_relu":
        return ((a > 0) & (a < alpha)).astype(a.dtype)
    raise ValueError(f"unknown activation mode {mode!r}")


def activation(x, mode, alpha=None, approximate="none"):
    a = np.asarray(x).astype(_dtypes.accumulate_dtype(x.dtype))
    with np.errstate(invalid="ignore"):
        return np.asarray(_forward(a, mode, alpha, approximate)).astype(x.dtype)


def activation_backward(dy, x, mode, alpha=None, approximate="none"):
    acc = _dtypes.accumulate_dtype(x.dtype)
    a = np.asarray(x).astype(acc)
    with np.errstate(invalid="ignore"):
        d = np.asarray(_derivative(a, mode, alpha, approximate)).astype(acc)
    return (np.asarray(dy).astype(acc) * d).astype(x.dtype)


def _channel_shape(x, layout):
    """The shape bias broadcasts to: C on axis 1 (NCHW) or on the last axis (NHWC)."""
    shape = [1] * x.ndim
    shape[1 if layout == "NCHW" else x.ndim - 1] = x.shape[1 if layout == "NCHW" else x.ndim - 1]
    return tuple(shape)


def bias_activation(x, bias, mode, alpha=None, approximate="none", layout="NCHW"):
    """act(x + bias[c]); the sum is formed in the accumulation type, not rounded to x's dtype."""
    acc = _dtypes.accumulate_dtype(x.dtype)
    a = np.asarray(x).astype(acc) + np.asarray(bias).astype(acc).reshape(_channel_shape(x, layout))
    with np.errstate(invalid="ignore"):
        return np.asarray(_forward(a, mode, alpha, approximate)).astype(x.dtype)


def bias_activation_backward(dy, x, bias, mode, alpha=None, approximate="none", layout="NCHW"):
    """(dx, dbias): dx = dy * act'(x + bias[c]); dbias[c] = sum of dx over all axes but the channel's."""
    acc = _dtypes.accumulate_dtype(x.dtype)
    a = np.asarray(x).astype(acc) + np.asarray(bias).astype(acc).reshape(_channel_shape(x, layout))
    with np.errstate(invalid="ignore"):
        d = np.asarray(_derivative(a, mode, alpha, approximate)).astype(acc)
    dx = np.asarray(dy).astype(acc) * d
    axis = 1 if layout == "NCHW" else x.ndim - 1
    dbias = dx.sum(axis=tuple(i for i in range(x.ndim) if i != axis))
    return dx.astype(x.dtype), np.asarray(dbias).astype(bias.dtype)
