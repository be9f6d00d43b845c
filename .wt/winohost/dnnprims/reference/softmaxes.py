"""NumPy reference for softmax and log-softmax over one axis (PyTorch semantics).

The maximum along the axis is subtracted before exponentiating, so no finite
input overflows.  A slice that is entirely -inf gives NaN, as in PyTorch.
Backward functions take the forward *output* ``y``, as cuDNN and PyTorch do.
"""
import numpy as np

from .. import _dtypes


def _acc(a):
    return np.asarray(a).astype(_dtypes.accumulate_dtype(a.dtype), copy=False)


def softmax(x, axis=-1):
    xa = _acc(x)
    if xa.size == 0:
        return np.empty(x.shape, x.dtype)
    with np.errstate(invalid="ignore"):  # an all -inf slice: -inf - -inf = NaN, as in PyTorch
        e = np.exp(xa - xa.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype)


def log_softmax(x, axis=-1):
    xa = _acc(x)
    if xa.size == 0:
        return np.empty(x.shape, x.dtype)
    with np.errstate(invalid="ignore"):  # an all -inf slice gives NaN, as in PyTorch
        shifted = xa - xa.max(axis=axis, keepdims=True)
        return (shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))).astype(x.dtype)


def softmax_backward(dy, y, axis=-1):
    """dx = y * (dy - sum(dy * y)): the Jacobian of softmax is diag(y) - y y^T."""
    dya, ya = _acc(dy), _acc(y)
    return (ya * (dya - (dya * ya).sum(axis=axis, keepdims=True))).astype(y.dtype)


def log_softmax_backward(dy, y, axis=-1):
    """dx = dy - exp(y) * sum(dy), with y = log_softmax(x)."""
    dya, ya = _acc(dy), _acc(y)
    return (dya - np.exp(ya) * dya.sum(axis=axis, keepdims=True)).astype(y.dtype)
