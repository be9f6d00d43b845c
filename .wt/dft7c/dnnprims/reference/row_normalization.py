"""NumPy reference for the row normalizations: layer norm, RMS norm, group norm
and instance norm (PyTorch semantics).

Every one of them normalizes *rows*: a row is the set of values that share one
mean and one variance.
- layer norm / RMS norm: x is (rows, L) after flattening the normalized
  trailing axes into L; gamma/beta have the normalized shape (one per column).
- group norm: a row is (sample n, group g): the C / G channels of the group and
  every spatial position; gamma/beta have one value per channel.
- instance norm with input statistics = group norm with one channel per group.

Arithmetic is in the accumulation dtype (float32 for half inputs); the
variance is the biased one.  Saved statistics: ``mean`` and ``rstd`` =
1 / sqrt(var + eps) per row (RMS norm: ``rstd`` = 1 / sqrt(mean(x^2) + eps)).
"""
import numpy as np

from .. import _dtypes


def as_rows(x, groups, layout):
    """x as (N, G, K, S) in the accumulation dtype, where a row is (n, g) and
    K is the channel within the group, S the spatial position.  (For layer norm
    call with x already 2-D (rows, L), groups=1, layout "NCHW": K = L, S = 1.)"""
    acc = _dtypes.accumulate_dtype(x.dtype)
    xa = np.asarray(x).astype(acc)
    n = x.shape[0]
    if layout == "NCHW":
        c = x.shape[1]
        return xa.reshape(n, groups, c // groups, -1)
    c = x.shape[-1]
    return np.moveaxis(xa.reshape(n, -1, groups, c // groups), 1, 3)


def from_rows(rows, shape, layout, dtype):
    n = shape[0]
    if layout == "NCHW":
        return rows.reshape(shape).astype(dtype)
    return np.moveaxis(rows, 3, 1).reshape(shape).astype(dtype)


def row_statistics(rows, eps, rms):
    """(mean, rstd) per row over the last two axes of (N, G, K, S); mean is None for RMS."""
    acc = rows.dtype
    if rms:
        ms = (rows * rows).mean(axis=(2, 3))
        return None, (1 / np.sqrt(ms + acc.type(eps))).astype(acc)
    mean = rows.mean(axis=(2, 3))
    centered = rows - mean[:, :, None, None]
    var = (centered * centered).mean(axis=(2, 3))
    return mean.astype(acc), (1 / np.sqrt(var + acc.type(eps))).astype(acc)


def _channel_params(p, groups, acc):
    """A per-channel vector shaped (1, G, K, 1) to broadcast against (N, G, K, S)."""
    return None if p is None else np.asarray(p).astype(acc).reshape(1, groups, -1, 1)


def normalize_rows(x, groups, gamma, beta, eps, layout, rms=False):
    """(y, mean, rstd); mean/rstd are (N, G); gamma/beta per channel (per column for
    a 2-D x with groups=1)."""
    rows = as_rows(x, groups, layout)
    acc = rows.dtype
    mean, rstd = row_statistics(rows, eps, rms)
    xhat = (rows if rms else rows - mean[:, :, None, None]) * rstd[:, :, None, None]
    g, b = _channel_params(gamma, groups, acc), _channel_params(beta, groups, acc)
    y = xhat if g is None else xhat * g
    if b is not None:
        y = y + b
    return from_rows(y, x.shape, layout, x.dtype), mean, rstd


def normalize_rows_backward(dy, x, groups, gamma, mean, rstd, eps, layout, param_dtype, rms=False):
    """(dx, dgamma, dbeta); mean/rstd None = recompute from x.

    With g = gamma per element and a row of M values:
      dx = rstd * (g*dy - mean(g*dy) - xhat * mean(g*dy*xhat))   (layer/group norm)
      dx = rstd * (g*dy - xhat * mean(g*dy*xhat))                 (RMS norm)
      dgamma = sum over rows of dy * xhat, dbeta = sum of dy, per parameter."""
    rows = as_rows(x, groups, layout)
    acc = rows.dtype
    if rstd is None:
        mean, rstd = row_statistics(rows, eps, rms)
    mean = None if rms else np.asarray(mean).astype(acc).reshape(rows.shape[:2])
    rstd = np.asarray(rstd).astype(acc).reshape(rows.shape[:2])
    xhat = (rows if rms else rows - mean[:, :, None, None]) * rstd[:, :, None, None]
    d = as_rows(dy, groups, layout)
    g = _channel_params(gamma, groups, acc)
    gdy = d if g is None else d * g
    sum_gdy_xhat = (gdy * xhat).mean(axis=(2, 3), keepdims=True)
    inner = gdy - xhat * sum_gdy_xhat
    if not rms:
        inner = inner - gdy.mean(axis=(2, 3), keepdims=True)
    dx = from_rows(inner * rstd[:, :, None, None], x.shape, layout, x.dtype)
    dgamma = (d * xhat).sum(axis=(0, 3)).reshape(-1).astype(param_dtype)
    dbeta = d.sum(axis=(0, 3)).reshape(-1).astype(param_dtype)
    return dx, dgamma, dbeta
