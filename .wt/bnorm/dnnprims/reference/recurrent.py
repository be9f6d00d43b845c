"""NumPy reference for one step of an LSTM cell and a GRU cell (PyTorch's nn.LSTMCell /
nn.GRUCell: weight layout, gate order and equations).

Shapes: x (B, I), h and c (B, H), w_ih (G*H, I), w_hh (G*H, H), biases (G*H,)
with G = 4 gates for LSTM (i, f, g, o) and 3 for GRU (r, z, n).  Biases may be
None (no bias); backward returns None for their gradients then.  Output
gradients may be None (zero).
"""
import numpy as np

from .. import _dtypes


def _acc(a, acc):
    return None if a is None else np.asarray(a).astype(acc)


def _sigmoid(a):
    e = np.exp(-np.abs(a))
    return np.where(a >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(a.dtype)


def _bias_sum(b_ih, b_hh, gates, acc):
    total = np.zeros(gates, acc)
    for b in (b_ih, b_hh):
        if b is not None:
            total = total + b
    return total


def _lstm_gates(x, h, w_ih, w_hh, b_ih, b_hh):
    pre = x @ w_ih.T + h @ w_hh.T + _bias_sum(b_ih, b_hh, w_ih.shape[0], x.dtype)
    i, f, g, o = np.split(pre, 4, axis=1)
    return _sigmoid(i), _sigmoid(f), np.tanh(g), _sigmoid(o)


def lstm_cell(x, h, c, w_ih, w_hh, b_ih=None, b_hh=None):
    dtype = x.dtype
    acc = _dtypes.accumulate_dtype(dtype)
    x, h, c, w_ih, w_hh, b_ih, b_hh = (_acc(a, acc) for a in (x, h, c, w_ih, w_hh, b_ih, b_hh))
    i, f, g, o = _lstm_gates(x, h, w_ih, w_hh, b_ih, b_hh)
    c1 = f * c + i * g
    h1 = o * np.tanh(c1)
    return h1.astype(dtype), c1.astype(dtype)


def lstm_cell_backward(dh1, dc1, x, h, c, w_ih, w_hh, b_ih=None, b_hh=None):
    dtype = x.dtype
    acc = _dtypes.accumulate_dtype(dtype)
    x, h, c, w_ih, w_hh, b_ih, b_hh = (_acc(a, acc) for a in (x, h, c, w_ih, w_hh, b_ih, b_hh))
    shape = (x.shape[0], w_hh.shape[1])
    dh1 = np.zeros(shape, acc) if dh1 is None else _acc(dh1, acc)
    dc1 = np.zeros(shape, acc) if dc1 is None else _acc(dc1, acc)
    i, f, g, o = _lstm_gates(x, h, w_ih, w_hh, b_ih, b_hh)
    tc = np.tanh(f * c + i * g)
    dct = dc1 + dh1 * o * (1 - tc * tc)
    dgates = np.concatenate([dct * g * i * (1 - i), dct * c * f * (1 - f),
                             dct * i * (1 - g * g), dh1 * tc * o * (1 - o)], axis=1)
    dx = dgates @ w_ih
    dh = dgates @ w_hh
    dw_ih, dw_hh = dgates.T @ x, dgates.T @ h
    db = dgates.sum(axis=0)
    out = [dx, dh, dct * f, dw_ih, dw_hh,
           None if b_ih is None else db, None if b_hh is None else db]
    return tuple(None if a is None else a.astype(dtype) for a in out)


def _gru_parts(x, h, w_ih, w_hh, b_ih, b_hh):
    gx = x @ w_ih.T + (0 if b_ih is None else b_ih)
    gh = h @ w_hh.T + (0 if b_hh is None else b_hh)
    xr, xz, xn = np.split(gx, 3, axis=1)
    hr, hz, hn = np.split(gh, 3, axis=1)
    r, z = _sigmoid(xr + hr), _sigmoid(xz + hz)
    n = np.tanh(xn + r * hn)
    return r, z, n, hn


def gru_cell(x, h, w_ih, w_hh, b_ih=None, b_hh=None):
    dtype = x.dtype
    acc = _dtypes.accumulate_dtype(dtype)
    x, h, w_ih, w_hh, b_ih, b_hh = (_acc(a, acc) for a in (x, h, w_ih, w_hh, b_ih, b_hh))
    r, z, n, _ = _gru_parts(x, h, w_ih, w_hh, b_ih, b_hh)
    return ((1 - z) * n + z * h).astype(dtype)


def gru_cell_backward(dh1, x, h, w_ih, w_hh, b_ih=None, b_hh=None):
    dtype = x.dtype
    acc = _dtypes.accumulate_dtype(dtype)
    x, h, w_ih, w_hh, b_ih, b_hh = (_acc(a, acc) for a in (x, h, w_ih, w_hh, b_ih, b_hh))
    dh1 = np.zeros((x.shape[0], w_hh.shape[1]), acc) if dh1 is None else _acc(dh1, acc)
    r, z, n, hn = _gru_parts(x, h, w_ih, w_hh, b_ih, b_hh)
    dn = dh1 * (1 - z) * (1 - n * n)
    dr = dn * hn * r * (1 - r)
    dz = dh1 * (h - n) * z * (1 - z)
    dgx = np.concatenate([dr, dz, dn], axis=1)
    dgh = np.concatenate([dr, dz, dn * r], axis=1)
    out = [dgx @ w_ih, dh1 * z + dgh @ w_hh, dgx.T @ x, dgh.T @ h,
           None if b_ih is None else dgx.sum(axis=0), None if b_hh is None else dgh.sum(axis=0)]
    return tuple(None if a is None else a.astype(dtype) for a in out)
