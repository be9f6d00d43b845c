"""NumPy reference for batch normalization (PyTorch semantics).

``x`` has its channel axis at 1 ("NCHW", also (N, C) and (N, C, L)) or last
("NHWC"); statistics are per channel over every other axis.  Everything is
computed in the accumulation dtype (float32 for half inputs).  ``gamma`` and
``beta`` may be None (PyTorch's ``affine=False``).

Training normalizes with the biased batch variance and updates the running
statistics in place: ``running = (1 - momentum) * running + momentum * batch``,
with the *unbiased* batch variance (times n / (n - 1)).
"""
import numpy as np

from .. import _dtypes


def channel_axis(ndim, layout):
    return 1 if layout == "NCHW" else ndim - 1


def _reduce_axes(ndim, layout):
    axis = channel_axis(ndim, layout)
    return tuple(a for a in range(ndim) if a != axis)


def _per_channel(v, ndim, layout, acc):
    """A (C,) vector shaped to broadcast against x."""
    shape = [1] * ndim
    shape[channel_axis(ndim, layout)] = -1
    return np.asarray(v).astype(acc).reshape(shape)


def batch_statistics(x, eps, layout):
    """Per-channel mean, biased variance and 1/sqrt(var + eps), in the accumulation dtype."""
    acc = _dtypes.accumulate_dtype(x.dtype)
    xa = np.asarray(x).astype(acc)
    axes = _reduce_axes(x.ndim, layout)
    mean = xa.mean(axis=axes)
    centered = xa - _per_channel(mean, x.ndim, layout, acc)
    var = (centered * centered).mean(axis=axes)
    invstd = (1 / np.sqrt(var + acc.type(eps))).astype(acc)
    return mean.astype(acc), var.astype(acc), invstd


def batchnorm(x, gamma, beta, running_mean, running_var, training, momentum, eps, layout):
    """Returns (y, mean, invstd); mean/invstd are the statistics used to normalize."""
    acc = _dtypes.accumulate_dtype(x.dtype)
    channels = x.shape[channel_axis(x.ndim, layout)]
    if x.size == 0:
        nan = np.full(channels, np.nan, dtype=acc)
        return np.empty(x.shape, x.dtype), nan, nan.copy()
    if training:
        mean, var, invstd = batch_statistics(x, eps, layout)
        if running_mean is not None:
            n = x.size // channels
            m = acc.type(momentum)
            unbiased = var * acc.type(n / (n - 1))
            new_mean = (1 - m) * running_mean.astype(acc) + m * mean
            new_var = (1 - m) * running_var.astype(acc) + m * unbiased
            running_mean[...] = new_mean.astype(running_mean.dtype)
            running_var[...] = new_var.astype(running_var.dtype)
    else:
        mean = running_mean.astype(acc)
        invstd = (1 / np.sqrt(running_var.astype(acc) + acc.type(eps))).astype(acc)
    y = (np.asarray(x).astype(acc) - _per_channel(mean, x.ndim, layout, acc)) \
        * _per_channel(invstd, x.ndim, layout, acc)
    if gamma is not None:
        y = y * _per_channel(gamma, x.ndim, layout, acc)
    if beta is not None:
        y = y + _per_channel(beta, x.ndim, layout, acc)
    return y.astype(x.dtype), mean, invstd


def batchnorm_backward(dy, x, gamma, mean, invstd, eps, layout, param_dtype):
    """Training-mode gradients (dx, dgamma, dbeta); mean/invstd None = recompute from x.

    dx = gamma * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)),
    dgamma = sum(dy * xhat), dbeta = sum(dy), over every axis but the channel's."""
    acc = _dtypes.accumulate_dtype(x.dtype)
    channels = x.shape[channel_axis(x.ndim, layout)]
    if x.size == 0:
        zeros = np.zeros(channels, dtype=param_dtype)
        return np.empty(x.shape, x.dtype), zeros, zeros.copy()
    if mean is None:
        mean, _, invstd = batch_statistics(x, eps, layout)
    axes = _reduce_axes(x.ndim, layout)
    n = x.size // channels
    xhat = (np.asarray(x).astype(acc) - _per_channel(mean, x.ndim, layout, acc)) \
        * _per_channel(invstd, x.ndim, layout, acc)
    dya = np.asarray(dy).astype(acc)
    dbeta = dya.sum(axis=axes)
    dgamma = (dya * xhat).sum(axis=axes)
    scale = _per_channel(invstd, x.ndim, layout, acc)
    if gamma is not None:
        scale = scale * _per_channel(gamma, x.ndim, layout, acc)
    dx = scale * (dya - _per_channel(dbeta / n, x.ndim, layout, acc)
                  - xhat * _per_channel(dgamma / n, x.ndim, layout, acc))
    dx = dx.astype(x.dtype)
    return dx, dgamma.astype(param_dtype), dbeta.astype(param_dtype)
