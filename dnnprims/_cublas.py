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
import ctypes
import os
import sys
import threading

import numpy as np

_OP_N, _OP_T = 0, 1    # CUBLAS_OP_N, CUBLAS_OP_T
_DEFAULT_MATH = 0      # CUBLAS_DEFAULT_MATH
_RUN = {np.dtype(np.float32): "sgemmStridedBatched", np.dtype(np.float64): "dgemmStridedBatched",
        np.dtype(np.complex64): "cgemmStridedBatched", np.dtype(np.complex128): "zgemmStridedBatched"}
_SCALARS = {}          # (dtype, value) -> one-element host array (cuBLAS reads a host pointer)


def _scalar(dtype, value):
    key = (dtype, value)
    a = _SCALARS.get(key)
    if a is None:
        # setdefault, not a store: callers keep only the address, which must stay the
        # kept array's when two threads make the same scalar at once.
        a = _SCALARS.setdefault(key, np.full(1, value, dtype))
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


# --- the raw call without CuPy's per-call stream dance, and its graph --------------
#
# CuPy's cuBLAS wrappers (``cupy_backends.cuda.libs.cublas``) call
# ``cublasSetStream`` before every routine, after ``cudaStreamIsCapturing`` on
# the stream: two API calls per GEMM, and cublasSetStream also resets the
# handle's workspace.  On a cached batch-1 Winograd call the raw GEMM measured
# 8-15 us of host time (notes/winohost.md; notes/hostwino.md).  The
# capture check also refuses any cuBLAS call inside a CUDA graph capture
# (NotImplementedError), which is why session 5's captures all failed.
# :class:`StridedBatched` calls cuBLAS through ctypes on a handle of our own
# (one per thread and device, default math mode: no TF32), setting its stream only when
# the current stream differs from the last one it ran on, and can capture
# fixed-pointer GEMMs into a CUDA graph (:meth:`StridedBatched.capture`).
# Without the library (a CPU-only install, a missing symbol) or with
# ``DNNPRIMS_CUBLAS_DIRECT=0`` it is CuPy's wrapper on CuPy's handle.

DIRECT = os.environ.get("DNNPRIMS_CUBLAS_DIRECT", "1") != "0"
# Bytes of the cuBLAS workspace set on the handle for a capture (cuBLAS then needs
# no allocation inside it).  Graphs replayed on one stream run one after another,
# so they share one per (device, stream); past GRAPH_WORKSPACE_STREAMS streams
# each graph gets its own.
GRAPH_WORKSPACE_BYTES = 4 << 20
GRAPH_WORKSPACE_STREAMS = 16
_GRAPH_WORKSPACES = {}
CAPTURE_FAILURES = []   # reasons (repr) of failed captures; one failure stops further tries
#                         (a capture that failed, not one that could not get its memory)
# What capture / capture_work return while the current stream is being captured (a
# user capturing our call into a graph of theirs): falsy like a failure, but nothing
# is recorded and the caller may try again on a later call.
NOT_NOW = ()
captures = 0            # graphs captured so far (tests check that the graph path ran)
_LIB = None             # the ctypes library, False when it cannot be loaded
_LOAD_ERROR = None
_HANDLES = threading.local()


def _find_library_path():
    """Absolute path of the libcublas CuPy loaded (pathfinder first, else the process's maps)."""
    from cupy_backends.cuda.libs import cublas  # noqa: F401  (loads the library)
    try:
        from cuda import pathfinder
        path = pathfinder.load_nvidia_dynamic_lib("cublas").abs_path
        if path:
            return path
    except Exception:  # an older CuPy, or a system library pathfinder does not know
        pass
    with open("/proc/self/maps") as maps:
        for line in maps:
            name = line.rsplit(None, 1)[-1]
            if "/libcublas.so" in name:
                return name
    return "libcublas.so"


def _library():
    """The ctypes libcublas with the prototypes we call, or None."""
    global _LIB, _LOAD_ERROR
    if _LIB is None:
        try:
            lib = ctypes.CDLL(_find_library_path())
            P, I, L = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
            lib.cublasCreate_v2.argtypes = [ctypes.POINTER(P)]
            lib.cublasDestroy_v2.argtypes = [P]
            lib.cublasSetStream_v2.argtypes = [P, P]
            lib.cublasSetWorkspace_v2.argtypes = [P, P, ctypes.c_size_t]
            lib.cublasSetMathMode.argtypes = [P, I]
            for name in ("cublasSgemmStridedBatched", "cublasDgemmStridedBatched"):
                fn = getattr(lib, name)
                fn.argtypes = [P, I, I, I, I, I, P, P, I, L, P, I, L, P, P, I, L, I]
            for fn in (lib.cublasCreate_v2, lib.cublasDestroy_v2, lib.cublasSetStream_v2,
                       lib.cublasSetWorkspace_v2, lib.cublasSetMathMode,
                       lib.cublasSgemmStridedBatched, lib.cublasDgemmStridedBatched):
                fn.restype = I
            _LIB = lib
        except Exception as e:  # no GPU stack, or a library without these symbols
            _LIB, _LOAD_ERROR = False, repr(e)
    return _LIB or None


class _Handle:
    """A cuBLAS handle of ours and the stream it last ran on (this thread only).

    Destroyed when it is dropped, i.e. when its thread ends (the thread's
    ``_HANDLES`` dies), as CuPy destroys its own per-thread handles
    (``cupy/cuda/device.pyx``, ``Handle.__dealloc__``): a server that makes
    threads would otherwise leak one handle, and its device memory, per thread
    and device.  ``release`` is (cublasDestroy, the handle's device, getDevice,
    setDevice): the handle's device is made current around the destroy (the
    thread may have moved to another one).  Not at interpreter shutdown (the
    driver may be unloaded; the process's end frees the handle)."""

    __slots__ = ("ptr", "stream", "release")

    def __init__(self, ptr, release=None):
        self.ptr = ptr
        self.stream = None
        self.release = release

    def __del__(self, _sys=sys):
        release = self.release
        if release is None or _sys.is_finalizing():
            return
        destroy, device, get_device, set_device = release
        try:
            current = get_device()
            if current != device:
                set_device(device)
            try:
                destroy(self.ptr)
            finally:
                if current != device:
                    set_device(current)
        except Exception:   # nothing to do about it in a destructor
            pass


def _check(status):
    if status:
        from cupy_backends.cuda.libs import cublas
        cublas.check_status(status)


def _own_handle(lib, device):
    handles = getattr(_HANDLES, "by_device", None)
    if handles is None:
        handles = _HANDLES.by_device = {}
    handle = handles.get(device)
    if handle is None:
        from cupy.cuda import runtime
        ptr = ctypes.c_void_p()
        _check(lib.cublasCreate_v2(ctypes.byref(ptr)))
        handle = _Handle(ptr.value, (lib.cublasDestroy_v2, device, runtime.getDevice, runtime.setDevice))
        # Full fp32 products (no TF32): the Winograd error bounds assume them.  Not a
        # copy of CuPy's shared handle's mode: that is whatever code last used it left
        # there (CuPy asks for TF32 per call, through the compute type).
        _check(lib.cublasSetMathMode(handle.ptr, _DEFAULT_MATH))
        handles[device] = handle
    return handle


def _capturing(stream):
    """Whether ``stream`` is being captured into a CUDA graph.  A query CUDA refuses
    (the legacy default stream while another stream captures in global mode)
    counts as capturing."""
    from cupy.cuda import runtime
    try:
        return stream.is_capturing()
    except runtime.CUDARuntimeError:
        return True


def capturing_now():
    """Whether the current CuPy stream is being captured (a user's graph capture).
    A graph of ours cannot be replayed into it: CUDA refuses ``cudaGraphLaunch`` on a
    capturing stream and the refusal invalidates the user's capture."""
    import cupy
    return _capturing(cupy.cuda.get_current_stream())


class StridedBatched:
    """``cublas<S|D>gemmStridedBatched`` for one dtype: ``call(transa, transb, m,
    n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC,
    batch)`` (column-major, cuBLAS's argument order, host scalar pointers) on
    the current device and stream."""

    def __init__(self, dtype):
        dtype = np.dtype(dtype)
        self.dtype = dtype
        # ctypes prototypes for the real ones (S/D); C/Z through CuPy's wrapper.
        lib = _library() if DIRECT and dtype.kind == "f" else None
        self._lib = lib
        if lib is None:
            from cupy.cuda import device
            from cupy_backends.cuda.libs import cublas
            run, handle = getattr(cublas, _RUN[dtype]), device.get_cublas_handle
            self.call = lambda *args: run(handle(), *args)
            return
        import cupy
        fn = getattr(lib, "cublas" + _RUN[dtype][0].upper() + _RUN[dtype][1:])
        get_device, current_stream = cupy.cuda.runtime.getDevice, cupy.cuda.get_current_stream
        set_stream = lib.cublasSetStream_v2

        def call(*args):
            handle = _own_handle(lib, get_device())
            stream = current_stream().ptr
            if handle.stream != stream:
                _check(set_stream(handle.ptr, stream))
                handle.stream = stream
            status = fn(handle.ptr, *args)
            if status:
                _check(status)
        self.call = call
        self._fn = fn

    def __call__(self, *args):
        return self.call(*args)

    @staticmethod
    def capturing():
        """:func:`capturing_now`: whether a graph of ours may not be launched now."""
        return capturing_now()

    def capture(self, calls, stream_key=None):
        """A CUDA graph of these GEMMs (each an argument tuple of ``call``; every
        pointer fixed for the graph's life), to be replayed on the current
        stream only (``stream_key``: its key, ``_kernels.stream_key``):
        ``(graph, keep)``, where ``graph.launch()`` runs them and ``keep`` (the
        cuBLAS workspace the graph uses) must live as long as the graph.  None
        when it cannot be captured: the caller stops asking (for that workspace
        or prepared call).  A failure of the capture itself also goes to
        :data:`CAPTURE_FAILURES`, and no later capture is tried in the process;
        memory or a stream that cannot be made for it (a full GPU) is not
        recorded.  :data:`NOT_NOW` (falsy) while the current
        stream is itself being captured: the caller runs the GEMMs directly (into
        that capture) and may try again on a later call."""
        def gemms():
            for args in calls:
                self.call(*args)
        return self.capture_work(gemms, stream_key)

    def capture_work(self, work, stream_key=None):
        """:meth:`capture` of whatever ``work()`` issues on the current CuPy stream
        (kernel launches, and GEMMs through this object's ``call``): it runs
        with a side stream current, which is being captured."""
        global captures
        lib = self._lib
        if lib is None or CAPTURE_FAILURES:
            return None
        import cupy
        if _capturing(cupy.cuda.get_current_stream()):
            # A user capturing our call into their graph: a capture of ours would allocate,
            # begin a second capture and upload on their stream (CUDA refuses the upload,
            # which invalidates their capture).  Not a failure of ours: nothing recorded.
            return NOT_NOW
        device = cupy.cuda.runtime.getDevice()
        handle = _own_handle(lib, device)
        try:
            keep = _GRAPH_WORKSPACES.get((device, stream_key)) if stream_key is not None else None
            if keep is None:
                keep = cupy.empty(GRAPH_WORKSPACE_BYTES, dtype=np.uint8)
                if stream_key is not None and len(_GRAPH_WORKSPACES) < GRAPH_WORKSPACE_STREAMS:
                    _GRAPH_WORKSPACES[device, stream_key] = keep
            side = cupy.cuda.Stream(non_blocking=True)
        except Exception:   # a full GPU: this caller runs directly; not a failure of captures
            return None
        graph = None
        try:
            with side:
                _check(lib.cublasSetStream_v2(handle.ptr, side.ptr))
                handle.stream = side.ptr   # call() inside the capture keeps it (and the workspace)
                _check(lib.cublasSetWorkspace_v2(handle.ptr, keep.data.ptr, keep.nbytes))
                side.begin_capture()
                try:
                    work()
                finally:
                    graph = side.end_capture()
            graph.upload(cupy.cuda.get_current_stream())
            captures += 1
        except Exception as e:  # recorded, and no later capture is tried: the caller runs the work directly
            CAPTURE_FAILURES.append(repr(e))
            graph = None
        finally:
            # Back to the default workspace pool (cublasSetStream resets it) on no stream of ours.
            lib.cublasSetStream_v2(handle.ptr, None)
            handle.stream = None
        return None if graph is None else (graph, keep)
