"""NumPy reference for cuDNN's tensor operations: scaled broadcast add, scale,
layout transform, reduction.  Arithmetic in the accumulation dtype (float32
for half inputs); results in x's dtype."""
import numpy as np

from .. import _dtypes


def _acc(a):
    return np.asarray(a).astype(_dtypes.accumulate_dtype(a.dtype))


def add_tensor(a, c, alpha, beta):
    acc = _dtypes.accumulate_dtype(a.dtype)
    out = acc.type(alpha) * _acc(a) + acc.type(beta) * _acc(c)
    return np.broadcast_to(out, a.shape).astype(a.dtype)


def scale_tensor(x, alpha):
    acc = _dtypes.accumulate_dtype(x.dtype)
    return (acc.type(alpha) * _acc(x)).astype(x.dtype)


def transform_layout(x, src, dst):
    if src == dst:
        return x.copy()
    if src == "NCHW":  # channel axis 1 -> last
        return np.ascontiguousarray(np.moveaxis(x, 1, -1))
    return np.ascontiguousarray(np.moveaxis(x, -1, 1))


def reduce_tensor(x, axes, op, keepdims):
    xa = _acc(x)
    if op == "sum":
        out = xa.sum(axis=axes, keepdims=keepdims)
    elif op == "mean":  # sum / count: an empty reduction is NaN without NumPy's warning
        count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
        with np.errstate(invalid="ignore"):
            out = xa.sum(axis=axes, keepdims=keepdims) / xa.dtype.type(count)
    elif op == "max":
        out = xa.max(axis=axes, keepdims=keepdims)
    elif op == "min":
        out = xa.min(axis=axes, keepdims=keepdims)
    elif op == "amax":
        out = np.abs(xa).max(axis=axes, keepdims=keepdims)
    elif op == "norm1":
        out = np.abs(xa).sum(axis=axes, keepdims=keepdims)
    else:  # norm2
        out = np.sqrt((xa * xa).sum(axis=axes, keepdims=keepdims))
    return np.asarray(out).astype(x.dtype)
