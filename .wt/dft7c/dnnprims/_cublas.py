"""Row-major (strided-batched) GEMM on cuBLAS with little host overhead.

``cupy.matmul`` costs tens of microseconds of Python per call (broadcasting,
output checks, a handle and stream dance); the convolution algorithms call
GEMMs whose shapes they already know, on the hot path of small problems.
:func:`gemm` goes straight to ``cublas<S|D>gemmStridedBatched`` for float32 /
float64 operands laid out as row-major matrices (unit stride along rows) and
and ``cublas<C|Z>gemmStridedBatched`` for complex64 / complex128 (the FFT
convolution's per-frequency products), and
falls back to ``matmul`` for anything else, and on NumPy arrays (so the
algorithms' bookkeeping stays testable without a GPU).

cuBLAS is column-major: a row-major (r x c) matrix with leading dimension ld
is the column-major (c x r) matrix, its transpose.  So C = op(A) @ op(B) in
row-major terms is C^T = op(B)^T @ op(A)^T in cuBLAS's: B's storage is
cuBLAS's first operand, A's the second, with m = N, n = M.
"""
import numpy as np

_OP_N, _OP_T = 0, 1    # CUBLAS_OP_N, CUBLAS_OP_T
_RUN = {np.dtype(np.float32): "sgemmStridedBatched", np.dtype(np.float64): "dgemmStridedBatched",
        np.dtype(np.complex64): "cgemmStridedBatched", np.dtype(np.complex128): "zgemmStridedBatched"}
_SCALARS = {}          # (dtype, value) -> one-element host array (cuBLAS reads a host pointer)


def _scalar(dtype, value):
    key = (dtype, value)
    a = _SCALARS.get(key)
    if a is None:
        a = _SCALARS[key] = np.full(1, value, dtype)
    return a


def _layout(a):
    """(leading dimension, batch stride) in elements of a row-major 2-D/3-D operand,
    or None when its rows are not unit-stride."""
    itemsize = a.itemsize
    rows, cols = a.shape[-2], a.shape[-1]
    if cols > 1 and a.strides[-1] != itemsize:
        return None
    ld = a.strides[-2] // itemsize if rows > 1 else cols
    if ld < max(1, cols) or a.strides[-2] % itemsize:
        return None
    stride = a.strides[0] // itemsize if a.ndim == 3 else 0
    return ld, stride


def gemm(xp, a, b, c, trans_a=False, trans_b=False, beta=0.0):
    """c = op(a) @ op(b) + beta * c, in place; returns c.

    ``c`` is (M, N) or (batch, M, N); ``a`` is (M, K) or (K, M) with
    ``trans_a`` (2-D: shared by every batch entry, or 3-D with the batch
    first), likewise ``b``."""
    op_a = a.swapaxes(-1, -2) if trans_a else a
    op_b = b.swapaxes(-1, -2) if trans_b else b
    if xp is np or c.dtype not in _RUN or not c.flags.c_contiguous:
        return _matmul(xp, op_a, op_b, c, beta)
    la, lb = _layout(a), _layout(b)
    if la is None or lb is None:
        return _matmul(xp, op_a, op_b, c, beta)
    M, N = c.shape[-2], c.shape[-1]
    K = op_a.shape[-1]
    batch = c.shape[0] if c.ndim == 3 else 1
    if M == 0 or N == 0 or batch == 0:
        return c
    from cupy.cuda import device
    from cupy_backends.cuda.libs import cublas
    run = getattr(cublas, _RUN[c.dtype])
    one, zero_or_beta = _scalar(c.dtype, 1.0), _scalar(c.dtype, beta)
    if K == 0:  # an empty sum: C = beta * C
        c *= beta
        return c
    run(device.get_cublas_handle(), _OP_T if trans_b else _OP_N, _OP_T if trans_a else _OP_N,
        N, M, K, one.ctypes.data,
        b.data.ptr, lb[0], lb[1],
        a.data.ptr, la[0], la[1],
        zero_or_beta.ctypes.data,
        c.data.ptr, N, M * N if batch > 1 else 0, batch)
    return c


def _matmul(xp, op_a, op_b, c, beta):
    if beta == 0.0:
        xp.matmul(op_a, op_b, out=c)
    else:
        c *= beta
        c += xp.matmul(op_a, op_b)
    return c


def prepare(dtype, M, N, K, batch=1, a_batched=True, b_batched=True):
    """The cuBLAS call of :func:`gemm` for C-contiguous row-major operands, fixed
    but for the three pointers: returns ``call(handle, a_ptr, b_ptr, c_ptr)``.

    ``c`` is (batch, M, N), ``a`` (M, K) and ``b`` (K, N), each batched (entries
    M K / K N elements apart) or, with ``a_batched`` / ``b_batched`` False, one
    matrix shared by every entry.  For a caller whose shapes are fixed per
    problem and whose buffers are regions of one workspace: no array views, no
    layout checks per call (the prepared "dft" path, notes/dft7c.md)."""
    from cupy_backends.cuda.libs import cublas
    dtype = np.dtype(dtype)
    run = getattr(cublas, _RUN[dtype])
    many = batch > 1
    head = (_OP_N, _OP_N, N, M, K, _scalar(dtype, 1.0).ctypes.data)
    mid = (N, K * N if many and b_batched else 0)
    tail = (K, M * K if many and a_batched else 0, _scalar(dtype, 0.0).ctypes.data)
    last = (N, M * N if many else 0, batch)

    def call(handle, a_ptr, b_ptr, c_ptr):
        run(handle, *head, b_ptr, *mid, a_ptr, *tail, c_ptr, *last)
    return call
