"""NumPy reference for 2-D convolution (PyTorch conv2d semantics: cross-correlation).

Vectorised as a loop over the R*S filter taps: for tap (r, s) the input pixels
it meets form one strided slice of the zero-padded input, and the tap's
contribution is a contraction over the channels of each group (einsum with the
group as a batch index).  Backward data is the transpose of that (scatter-add
of each tap's contribution into the padded gradient), backward filter a
per-tap contraction over batch and output positions.

Arguments are already validated (dnnprims/conv.py): stride, padding and
dilation are pairs, x/y/dx/dy are in ``layout``, filters are KCRS.  Computation
is in the accumulation dtype; results come back in the storage dtype.
"""
import numpy as np

from .._dtypes import accumulate_dtype


def output_size(size, kernel, stride, padding, dilation):
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def _to_nchw(a, layout, dtype):
    """A C-contiguous NCHW copy in ``dtype`` (contiguous so that the summation
    order, and so the result bits, do not depend on the input's strides)."""
    return np.ascontiguousarray(a if layout == "NCHW" else a.transpose(0, 3, 1, 2), dtype=dtype)


def _from_nchw(a, layout):
    return np.ascontiguousarray(a if layout == "NCHW" else a.transpose(0, 2, 3, 1))


def _tap_slices(r, s, P, Q, stride, dilation):
    """The (rows, cols) slices of the padded input that filter tap (r, s) meets."""
    h0, w0 = r * dilation[0], s * dilation[1]
    return (slice(h0, h0 + stride[0] * (P - 1) + 1, stride[0]),
            slice(w0, w0 + stride[1] * (Q - 1) + 1, stride[1]))


def conv2d_forward(x, w, bias, stride, padding, dilation, groups, layout):
    acc = accumulate_dtype(x.dtype)
    xc = _to_nchw(x, layout, acc)
    N, C, H, W = xc.shape
    K, Cg, R, S = w.shape
    G, Kg = groups, K // groups
    P = output_size(H, R, stride[0], padding[0], dilation[0])
    Q = output_size(W, S, stride[1], padding[1], dilation[1])
    ph, pw = padding
    xpad = np.pad(xc, ((0, 0), (0, 0), (ph, ph), (pw, pw))).reshape(N, G, Cg, H + 2 * ph, W + 2 * pw)
    wg = np.ascontiguousarray(w, dtype=acc).reshape(G, Kg, Cg, R, S)
    y = np.zeros((N, G, Kg, P, Q), dtype=acc)
    for r in range(R):
        for s in range(S):
            rows, cols = _tap_slices(r, s, P, Q, stride, dilation)
            y += np.einsum("ngcpq,gkc->ngkpq", xpad[:, :, :, rows, cols], wg[:, :, :, r, s])
    y = y.reshape(N, K, P, Q)
    if bias is not None:
        y += bias.astype(acc).reshape(1, K, 1, 1)
    return _from_nchw(y, layout).astype(x.dtype, copy=False)


def conv2d_backward_data(dy, w, x_shape, stride, padding, dilation, groups, layout):
    acc = accumulate_dtype(w.dtype)
    N, C, H, W = x_shape if layout == "NCHW" else (x_shape[0], x_shape[3], x_shape[1], x_shape[2])
    dyc = _to_nchw(dy, layout, acc)
    _, K, P, Q = dyc.shape
    _, Cg, R, S = w.shape
    G, Kg = groups, K // groups
    ph, pw = padding
    dyg = dyc.reshape(N, G, Kg, P, Q)
    wg = np.ascontiguousarray(w, dtype=acc).reshape(G, Kg, Cg, R, S)
    dxpad = np.zeros((N, G, Cg, H + 2 * ph, W + 2 * pw), dtype=acc)
    for r in range(R):
        for s in range(S):
            rows, cols = _tap_slices(r, s, P, Q, stride, dilation)
            dxpad[:, :, :, rows, cols] += np.einsum("ngkpq,gkc->ngcpq", dyg, wg[:, :, :, r, s])
    dx = dxpad.reshape(N, C, H + 2 * ph, W + 2 * pw)[:, :, ph:ph + H, pw:pw + W]
    return _from_nchw(dx, layout).astype(w.dtype, copy=False)


def conv2d_backward_filter(x, dy, w_shape, stride, padding, dilation, groups, layout):
    acc = accumulate_dtype(x.dtype)
    xc = _to_nchw(x, layout, acc)
    dyc = _to_nchw(dy, layout, acc)
    N, C, H, W = xc.shape
    _, K, P, Q = dyc.shape
    _, Cg, R, S = w_shape
    G, Kg = groups, K // groups
    ph, pw = padding
    xpad = np.pad(xc, ((0, 0), (0, 0), (ph, ph), (pw, pw))).reshape(N, G, Cg, H + 2 * ph, W + 2 * pw)
    dyg = dyc.reshape(N, G, Kg, P, Q)
    dw = np.zeros((G, Kg, Cg, R, S), dtype=acc)
    for r in range(R):
        for s in range(S):
            rows, cols = _tap_slices(r, s, P, Q, stride, dilation)
            dw[:, :, :, r, s] = np.einsum("ngkpq,ngcpq->gkc", dyg, xpad[:, :, :, rows, cols])
    return dw.reshape(K, Cg, R, S).astype(x.dtype, copy=False)


def conv2d_backward_bias(dy, layout):
    axes = (0, 2, 3) if layout == "NCHW" else (0, 1, 2)
    total = np.ascontiguousarray(dy, dtype=accumulate_dtype(dy.dtype)).sum(axis=axes)
    return total.astype(dy.dtype, copy=False)
