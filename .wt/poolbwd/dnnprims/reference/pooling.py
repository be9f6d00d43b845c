"""NumPy reference for 2-D max and average pooling (PyTorch semantics).

Arguments arrive normalised by ``dnnprims.pooling``: ``window``, ``stride`` and
``padding`` are pairs, ``layout`` is "NCHW" or "NHWC".  NHWC is computed by
transposing to NCHW and back.

Max pooling scans each window's *real* input elements in row-major order and
keeps the first maximum, except that a NaN always wins (so the last NaN is
kept) -- PyTorch's rule ``if (v > max || isnan(v))``.  The backward pass sends
each output gradient to that element.  Padding never takes part in a maximum.

Average pooling divides by PyTorch's divisor: with ``count_include_pad`` the
window clipped to the padded bounds, otherwise the number of real elements.
"""
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .. import _dtypes


def output_size(size, window, stride, padding):
    return (size + 2 * padding - window) // stride + 1


def _to_nchw(a, layout):
    return a if layout == "NCHW" else a.transpose(0, 3, 1, 2)


def _from_nchw(a, layout):
    return a if layout == "NCHW" else a.transpose(0, 2, 3, 1)


def _windows(xa, window, stride, padding, fill):
    """Padded input and its windows as (N, C, Ho, Wo, kh*kw)."""
    (kh, kw), (sh, sw), (ph, pw) = window, stride, padding
    padded = np.pad(xa, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=fill)
    win = sliding_window_view(padded, (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw]
    return padded, win.reshape(win.shape[:4] + (kh * kw,))


def _valid_mask(shape_hw, window, stride, padding):
    """(Ho, Wo, kh*kw) mask of window taps that fall on real input."""
    ones = np.ones((1, 1) + tuple(shape_hw), dtype=bool)
    return _windows(ones, window, stride, padding, False)[1][0, 0]


def _divisor(shape_hw, window, stride, padding, count_include_pad):
    """(Ho, Wo) divisors of average pooling, as PyTorch computes them."""
    divisors = []
    for size, k, s, p in zip(shape_hw, window, stride, padding):
        start = np.arange(output_size(size, k, s, p)) * s - p
        end = np.minimum(start + k, size + p)
        if count_include_pad:
            divisors.append(end - start)
        else:
            divisors.append(np.minimum(end, size) - np.maximum(start, 0))
    return np.multiply.outer(divisors[0], divisors[1])


def max_positions(xa, window, stride, padding):
    """Index (0 .. kh*kw-1) of the selected element in each window, (N, C, Ho, Wo)."""
    _, win = _windows(xa, window, stride, padding, -np.inf)
    valid = _valid_mask(xa.shape[2:], window, stride, padding)
    with np.errstate(invalid="ignore"):
        top = win.max(axis=-1, keepdims=True)
        first_max = np.argmax((win == top) & valid, axis=-1)
    nan = np.isnan(win)
    last_nan = win.shape[-1] - 1 - np.argmax(nan[..., ::-1], axis=-1)
    return np.where(nan.any(axis=-1), last_nan, first_max)


def pool(x, window, stride, padding, mode, count_include_pad, layout):
    acc = _dtypes.accumulate_dtype(x.dtype)
    xa = _to_nchw(np.asarray(x), layout).astype(acc)
    if mode == "max":
        _, win = _windows(xa, window, stride, padding, -np.inf)
        y = win.max(axis=-1)
    else:
        _, win = _windows(xa, window, stride, padding, 0)
        y = win.sum(axis=-1) / _divisor(xa.shape[2:], window, stride, padding, count_include_pad)
    return np.ascontiguousarray(_from_nchw(y.astype(x.dtype), layout))


def pool_backward(dy, x, window, stride, padding, mode, count_include_pad, layout):
    acc = _dtypes.accumulate_dtype(x.dtype)
    xa = _to_nchw(np.asarray(x), layout).astype(acc)
    dya = _to_nchw(np.asarray(dy), layout).astype(acc)
    (kh, kw), (sh, sw), (ph, pw) = window, stride, padding
    n, c, h, w = xa.shape
    ho, wo = dya.shape[2:]
    if mode == "max":
        chosen = max_positions(xa, window, stride, padding)
    else:
        share = dya / _divisor((h, w), window, stride, padding, count_include_pad)
    dx = np.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=acc)
    for i in range(kh):
        for j in range(kw):
            target = dx[:, :, i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw]
            if mode == "max":
                target += np.where(chosen == i * kw + j, dya, 0)
            else:
                target += share
    dx = dx[:, :, ph:ph + h, pw:pw + w]
    return np.ascontiguousarray(_from_nchw(dx.astype(x.dtype), layout))
