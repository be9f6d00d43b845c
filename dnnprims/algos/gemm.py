"""The "gemm" algorithm: explicit im2col into a workspace, then cuBLAS (what Chainer
did), for all three directions: ungrouped layers through ``_cublas.gemm`` (strided
batched, on our own handle), grouped ones through ``xp.matmul``.

The column matrix (kernels/conv_im2col.cu) has one row per filter tap (c, r, s)
and one column per output position (n, p, q), arranged per direction so that
each GEMM reads it without a copy:

    NCHW forward, backward data   (N, C*R*S, P*Q)    y[n, g]  = w[g] @ col[n, g]
    NCHW backward filter          (C*R*S, N, P*Q)    dw[g]    = dy[g] @ col[g].T
    NHWC (all)                    (N*P*Q, C*R*S)     y[:, g]  = col[:, g] @ w[g].T

Groups are a batch dimension of one batched matmul.  Backward data computes
the column gradient with one GEMM and folds it back with col2im (a gather,
deterministic).  A 1x1 filter with stride 1 and no padding is a plain batched
GEMM on x itself: no im2col, no workspace.

float32 and float64 only: the GEMMs run in the storage type, so half types
would lose the float32 accumulation the library promises.
"""
from dataclasses import replace

import numpy as np

from .. import _dtypes
from .._cublas import gemm
from .._kernels import KernelFamily, ceil_div, index_type
from .._validate import INT32_LIMIT
from . import ConvAlgorithm, register

FAMILY = KernelFamily("conv_im2col.cu", [
    f"{kernel}<{t}, {i}, {nhwc}>"
    for kernel in ("conv_im2col", "conv_col2im")
    for t in ("float", "double")
    for i in ("int", "long long")
    for nhwc in ("false", "true")
])

SUPPORTED_DTYPES = ("float32", "float64")
_THREADS = 256
_MAX_BLOCKS = 65535 * 8


# Backward filter processes the batch in chunks whose column matrix stays
# under this many bytes, so its workspace is bounded whatever the batch size.
FILTER_CHUNK_BYTES = 128 * 2**20


def filter_chunk(p):
    """Samples per chunk of the backward-filter GEMM (at least 1): the chunk's
    buffers (:meth:`GemmConvolution.workspace_bytes`) fit FILTER_CHUNK_BYTES."""
    per_sample = p.C * p.R * p.S * p.P * p.Q if not is_pointwise(p) else p.C * p.H * p.W
    if p.layout == "NCHW":
        per_sample += p.K * p.P * p.Q     # dy's transposed copy
    return max(1, min(p.N, FILTER_CHUNK_BYTES // max(1, per_sample * np.dtype(p.dtype).itemsize)))


def _gemm_dimensions(p, direction):
    """The sizes the GEMMs of ``run`` pass to cuBLAS as m, n, k or a leading
    dimension (32-bit ints there): K, C/groups*R*S, P*Q; N*P*Q where NHWC stacks
    the batch into the rows; a backward-filter chunk's depth."""
    dims = [p.K, (p.C // p.groups) * p.R * p.S, p.P * p.Q]
    if direction == "backward_filter":
        dims.append(filter_chunk(p) * max(p.P * p.Q, p.H * p.W if is_pointwise(p) else 0))
    elif p.layout == "NHWC":
        dims.append(p.N * p.P * p.Q)
    return dims


def is_pointwise(p):
    """A 1x1 filter, stride 1, no padding: x itself is the column matrix."""
    return (p.R, p.S) == (1, 1) and p.stride == (1, 1) and p.padding == (0, 0)


def column_strides(p, order):
    """Element strides (n, tap row j, output position pq) of the column matrix.

    order "sample": (N, C*R*S, P*Q); "channel": (C*R*S, N, P*Q); NHWC: (N*P*Q, C*R*S)."""
    crs, pq = p.C * p.R * p.S, p.P * p.Q
    if p.layout == "NHWC":
        return (pq * crs, 1, crs)
    if order == "sample":
        return (crs * pq, pq, 1)
    return (pq, p.N * pq, 1)


def _launch(kernel, p, src, dst, strides, total):
    index_t = index_type(*(size + _MAX_BLOCKS * _THREADS
                           for size in (src.size, dst.size, p.N * p.C * p.R * p.S * p.P * p.Q)))
    cast = np.int32 if index_t == "int" else np.int64
    i32 = np.int32
    expr = f"{kernel}<{_dtypes.cuda_type(dst.dtype)}, {index_t}, {'true' if p.layout == 'NHWC' else 'false'}>"
    FAMILY.launch(expr, (min(ceil_div(total, _THREADS), _MAX_BLOCKS),), (_THREADS,), (
        src, dst, i32(p.C), i32(p.H), i32(p.W), i32(p.R), i32(p.S), i32(p.P), i32(p.Q),
        i32(p.stride[0]), i32(p.stride[1]), i32(p.padding[0]), i32(p.padding[1]),
        i32(p.dilation[0]), i32(p.dilation[1]), *(cast(s) for s in strides), cast(total)))


def im2col(p, x, col, strides):
    """Fill ``col`` (flat, N*C*R*S*P*Q elements) from x."""
    _launch("conv_im2col", p, x, col, strides, col.size)


def col2im(p, col, dx, strides):
    """dx = the sum of the column gradient's entries over the taps that read each pixel."""
    _launch("conv_col2im", p, col, dx, strides, dx.size)


def _columns(xp, p, x, order):
    """The column matrix of x, shaped (N, C*R*S, P*Q), (C*R*S, N*P*Q) or (N*P*Q, C*R*S)."""
    N, C, RS, PQ = p.N, p.C, p.R * p.S, p.P * p.Q
    if p.layout == "NHWC":
        shape = (N * PQ, C * RS)
    else:
        shape = (N, C * RS, PQ) if order == "sample" else (C * RS, N * PQ)
    if is_pointwise(p):
        if p.layout == "NHWC" or order == "sample":
            return x.reshape(shape)
        return x.reshape(N, C, PQ).transpose(1, 0, 2).reshape(shape)  # copies
    col = xp.empty(shape, dtype=x.dtype)
    im2col(p, x, col, column_strides(p, order))
    return col


class GemmConvolution(ConvAlgorithm):
    name = "gemm"

    def supports(self, problem, direction):
        ok, reason = super().supports(problem, direction)
        if ok and problem.dtype not in SUPPORTED_DTYPES:
            return False, (f"it runs cuBLAS in the storage type, float32 and float64 only, "
                           f"not {problem.dtype}")
        if ok and max(_gemm_dimensions(problem, direction)) > INT32_LIMIT:
            return False, ("a dimension of its cuBLAS GEMM (rows N*P*Q in NHWC, columns P*Q, "
                           "depth C/groups*R*S or K) is over 2^31 - 1, cuBLAS's int limit")
        return ok, reason

    def workspace_bytes(self, problem, direction):
        p = problem
        if direction == "backward_filter":
            p = replace(p, N=filter_chunk(p))
        itemsize = np.dtype(p.dtype).itemsize
        columns = 0 if is_pointwise(p) else p.N * p.C * p.R * p.S * p.P * p.Q
        if is_pointwise(p) and direction == "backward_filter" and p.layout == "NCHW":
            columns = p.N * p.C * p.H * p.W  # the transposed copy of x
        # Copies and GEMM results alive with the columns (notes/review6h.md item 1):
        copies = 0
        if direction == "backward_filter" and p.layout == "NCHW":
            copies = p.N * p.K * p.P * p.Q               # dy_t, dy transposed to (G, Kg, N*P*Q)
        elif p.layout == "NHWC" and p.groups > 1:
            if direction == "forward":
                copies = p.N * p.P * p.Q * p.K   # per_group (G, N*P*Q, Kg), pointwise too
            elif direction == "backward_data":
                copies = p.N * p.P * p.Q * p.C * p.R * p.S   # per_group (G, N*P*Q, J)
            elif p.N < problem.N:
                copies = p.K * (p.C // p.groups) * p.R * p.S  # a later chunk's matmul result
        return (columns + copies) * itemsize

    def run(self, problem, direction, a, b, out, bias=None, activation=None):
        import cupy as xp
        return getattr(self, "_" + direction)(xp, problem, a, b, out, bias)

    # Each direction is written against ``xp`` so that the GEMM bookkeeping can
    # be tested on NumPy (tests/test_conv.py) with im2col/col2im emulated.
    @staticmethod
    def _forward(xp, p, x, w, y, bias):
        G, Kg, J, PQ = p.groups, p.K // p.groups, (p.C // p.groups) * p.R * p.S, p.P * p.Q
        w3 = w.reshape(G, Kg, J)
        col = _columns(xp, p, x, "sample")
        if p.layout == "NCHW":
            if G == 1:   # y[n] = w @ col[n], w shared by the batch
                gemm(xp, w.reshape(p.K, J), col.reshape(p.N, J, PQ), y.reshape(p.N, p.K, PQ))
            else:
                xp.matmul(w3, col.reshape(p.N, G, J, PQ), out=y.reshape(p.N, G, Kg, PQ))
        else:
            if G == 1:
                gemm(xp, col.reshape(p.N * PQ, J), w.reshape(p.K, J), y.reshape(p.N * PQ, p.K),
                     trans_b=True)
            else:
                per_group = xp.matmul(col.reshape(p.N * PQ, G, J).transpose(1, 0, 2),
                                      w3.transpose(0, 2, 1))              # (G, N*P*Q, Kg)
                y.reshape(p.N * PQ, G, Kg)[...] = per_group.transpose(1, 0, 2)
        if bias is not None:
            y += bias.reshape((1, p.K, 1, 1) if p.layout == "NCHW" else (1, 1, 1, p.K))
        return y

    @staticmethod
    def _backward_data(xp, p, dy, w, dx, bias=None):
        G, Kg, J, PQ = p.groups, p.K // p.groups, (p.C // p.groups) * p.R * p.S, p.P * p.Q
        w3 = w.reshape(G, Kg, J)
        pointwise = is_pointwise(p)
        if p.layout == "NCHW":
            dcol = dx if pointwise else xp.empty((p.N, p.C * p.R * p.S, PQ), dtype=dx.dtype)
            if G == 1:   # dcol[n] = w^T @ dy[n]
                gemm(xp, w.reshape(p.K, J), dy.reshape(p.N, p.K, PQ), dcol.reshape(p.N, J, PQ),
                     trans_a=True)
            else:
                xp.matmul(w3.transpose(0, 2, 1), dy.reshape(p.N, G, Kg, PQ),
                          out=dcol.reshape(p.N, G, J, PQ))
        else:
            dcol = dx if pointwise else xp.empty((p.N * PQ, p.C * p.R * p.S), dtype=dx.dtype)
            if G == 1:
                gemm(xp, dy.reshape(p.N * PQ, p.K), w.reshape(p.K, J), dcol.reshape(p.N * PQ, J))
            else:
                per_group = xp.matmul(dy.reshape(p.N * PQ, G, Kg).transpose(1, 0, 2), w3)  # (G, NPQ, J)
                dcol.reshape(p.N * PQ, G, J)[...] = per_group.transpose(1, 0, 2)
        if not pointwise:
            col2im(p, dcol, dx, column_strides(p, "sample"))
        return dx

    @staticmethod
    def _backward_filter(xp, p, x, dy, dw, bias=None):
        """dw sums over the batch, so the batch is cut into chunks whose column
        matrix fits FILTER_CHUNK_BYTES; each chunk's GEMM adds into dw in order
        (deterministic for a given problem)."""
        chunk = filter_chunk(p)
        for n0 in range(0, p.N, chunk):
            n1 = min(p.N, n0 + chunk)
            GemmConvolution._backward_filter_chunk(xp, replace(p, N=n1 - n0), x[n0:n1], dy[n0:n1],
                                                   dw, accumulate=n0 > 0)
        return dw

    @staticmethod
    def _backward_filter_chunk(xp, p, x, dy, dw, accumulate=False):
        """dw (+)= this chunk's gradient: ``accumulate`` adds into dw (GEMM beta = 1)."""
        G, Kg, J, PQ = p.groups, p.K // p.groups, (p.C // p.groups) * p.R * p.S, p.P * p.Q
        beta = 1.0 if accumulate else 0.0
        dw3 = dw.reshape(G, Kg, J)
        if p.layout == "NCHW":
            col = _columns(xp, p, x, "channel").reshape(G, J, p.N * PQ)
            dy_t = dy.reshape(p.N, G, Kg, PQ).transpose(1, 2, 0, 3).reshape(G, Kg, p.N * PQ)  # copies
            if G == 1:
                gemm(xp, dy_t.reshape(Kg, p.N * PQ), col.reshape(J, p.N * PQ), dw.reshape(p.K, J),
                     trans_b=True, beta=beta)
            else:
                gemm(xp, dy_t, col, dw3, trans_b=True, beta=beta)
        else:
            col = _columns(xp, p, x, "sample")
            dy2 = dy.reshape(p.N * PQ, p.K)
            if G == 1:
                gemm(xp, dy2, col.reshape(p.N * PQ, J), dw.reshape(p.K, J), trans_a=True, beta=beta)
            elif accumulate:
                dw3 += xp.matmul(dy2.reshape(p.N * PQ, G, Kg).transpose(1, 2, 0),
                                 col.reshape(p.N * PQ, G, J).transpose(1, 0, 2))
            else:
                xp.matmul(dy2.reshape(p.N * PQ, G, Kg).transpose(1, 2, 0),
                          col.reshape(p.N * PQ, G, J).transpose(1, 0, 2), out=dw3)
        return dw


GEMM = register(GemmConvolution())
