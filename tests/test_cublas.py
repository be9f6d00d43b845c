"""dnnprims._cublas.gemm: row-major strided-batched GEMM on cuBLAS, against matmul."""
import itertools

import numpy as np
import pytest

from dnnprims._cublas import gemm
from dnnprims.testing import assert_close

from conftest import random_array

# (batch or None, M, N, K): sizes 1, 3, 7, 13 and a shared (2-D) operand.
SHAPES = [(None, 7, 13, 3), (None, 1, 1, 1), (3, 13, 7, 1), (2, 3, 1, 7), (5, 8, 16, 32)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product([False, True], repeat=2)))
@pytest.mark.parametrize("shared", ["a", "b", "none"])
@pytest.mark.parametrize("beta", [0.0, 1.0, -0.5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gemm_matches_matmul(xp, rng, shape, trans_a, trans_b, shared, beta, dtype):
    batch, M, N, K = shape
    lead = () if batch is None else (batch,)
    a_shape = (K, M) if trans_a else (M, K)
    b_shape = (N, K) if trans_b else (K, N)
    a = random_array(rng, a_shape if shared == "a" or batch is None else lead + a_shape, dtype)
    b = random_array(rng, b_shape if shared == "b" or batch is None else lead + b_shape, dtype)
    c0 = random_array(rng, lead + (M, N), dtype)
    op_a = np.swapaxes(a, -1, -2) if trans_a else a
    op_b = np.swapaxes(b, -1, -2) if trans_b else b
    want = op_a.astype(np.float64) @ op_b.astype(np.float64) + beta * c0.astype(np.float64)
    c = xp.asarray(c0)
    got = gemm(xp, xp.asarray(a), xp.asarray(b), c, trans_a=trans_a, trans_b=trans_b, beta=beta)
    assert got is c
    # A (1, 1) result of one product plus beta * c can cancel to ~0: rounding is relative
    # to the terms' magnitudes (the same GEMM on absolute values).
    magnitude = np.abs(op_a).astype(np.float64) @ np.abs(op_b).astype(np.float64) + abs(beta) * np.abs(c0)
    assert_close(got, want, dtype, magnitude=magnitude)


def _column_major_args(gpu, rng, dtype, batch=3, m=13, n=7, k=5):
    """Operands of a strided-batched C = A B (column-major, cuBLAS's order) and
    the argument tuple of StridedBatched.call for them."""
    from dnnprims import _cublas
    a = gpu.asarray(random_array(rng, (batch, k, m), dtype))     # column-major m x k: stored k rows of m
    b = gpu.asarray(random_array(rng, (batch, n, k), dtype))
    c = gpu.empty((batch, n, m), dtype)
    one, zero = (_cublas._scalar(np.dtype(dtype), v).ctypes.data for v in (1.0, 0.0))
    args = (_cublas._OP_N, _cublas._OP_N, m, n, k, one, a.data.ptr, m, m * k, b.data.ptr, k, k * n, zero,
            c.data.ptr, m, m * n, batch)
    return a, b, c, args


def _want(a, b):
    # Column-major C = A B is, in row-major storage, C^T = B^T A^T: c[i] = b[i] @ a[i].
    return np.matmul(b.get().astype(np.float64), a.get().astype(np.float64))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_strided_batched_direct_call_follows_the_current_stream(gpu, rng, dtype):
    """The ctypes call on our own handle sets the handle's stream only when the
    current stream changed: calls alternating between the default stream and a
    side stream, each result read on its own stream, all equal the reference."""
    from dnnprims import _cublas
    run = _cublas.StridedBatched(dtype)
    side = gpu.cuda.Stream(non_blocking=True)
    for stream in (gpu.cuda.Stream.null, side, side, gpu.cuda.Stream.null, side):
        with stream:
            a, b, c, args = _column_major_args(gpu, rng, dtype)
            run(*args)
            assert_close(c, _want(a, b), dtype)
            stream.synchronize()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_strided_batched_graph_replays_on_new_operand_values(gpu, rng, dtype):
    """A captured GEMM graph (pointers fixed) computes with the operands' values
    at each launch, on any stream; nothing runs at capture time."""
    from dnnprims import _cublas
    run = _cublas.StridedBatched(dtype)
    a, b, c, args = _column_major_args(gpu, rng, dtype)
    c.fill(7)
    before = _cublas.captures
    captured = run.capture([args])
    assert captured is not None, _cublas.CAPTURE_FAILURES
    assert _cublas.captures == before + 1
    graph, keep = captured
    gpu.cuda.Device().synchronize()
    assert bool((c == 7).all())                   # capture ran nothing
    side = gpu.cuda.Stream(non_blocking=True)
    for stream in (gpu.cuda.Stream.null, side):
        with stream:
            a[...] = gpu.asarray(random_array(rng, a.shape, dtype))
            b[...] = gpu.asarray(random_array(rng, b.shape, dtype))
            graph.launch()
            assert_close(c, _want(a, b), dtype)
    run(*args)                                    # the direct call still works after a capture
    assert_close(c, _want(a, b), dtype)


# ---- the ctypes path on a faked libcublas (CPU) -----------------------------------------

CUBLAS_DEFAULT_MATH, CUBLAS_TF32_TENSOR_OP_MATH = 0, 3


class _FakeLibrary:
    """The libcublas entry points _cublas calls through ctypes, recorded."""

    def __init__(self):
        self.log = []

    def cublasCreate_v2(self, handle_ref):
        handle_ref._obj.value = 4321
        self.log.append(("create",))
        return 0

    def cublasDestroy_v2(self, handle):
        self.log.append(("destroy", handle))
        return 0

    def cublasSetMathMode(self, handle, mode):
        self.log.append(("math", getattr(handle, "value", handle), mode))   # a c_void_p or its value
        return 0

    def cublasSetStream_v2(self, handle, stream):
        self.log.append(("stream", handle, stream))
        return 0

    def cublasSetWorkspace_v2(self, handle, ptr, size):
        self.log.append(("workspace", handle, ptr, size))
        return 0

    def cublasSgemmStridedBatched(self, handle, *args):
        self.log.append(("sgemm", handle))
        return 0


@pytest.fixture
def fake_cublas(monkeypatch):
    """_cublas on a faked library, device 0 and stream 77; CuPy's own cuBLAS handle
    (99) in TF32 mode, as other code using CuPy's shared handle may leave it."""
    cupy = pytest.importorskip("cupy")
    import threading
    import types

    import cupy_backends.cuda.libs as libs
    from cupy.cuda import device as cuda_device
    from dnnprims import _cublas
    lib = _FakeLibrary()
    cupy_cublas = types.SimpleNamespace(getMathMode=lambda handle: CUBLAS_TF32_TENSOR_OP_MATH,
                                        check_status=lambda status: None)
    monkeypatch.setitem(vars(libs), "cublas", cupy_cublas)   # no getattr: that loads the real library
    monkeypatch.setattr(cuda_device, "get_cublas_handle", lambda: 99)
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 0)
    stream = types.SimpleNamespace(ptr=77, is_capturing=lambda: False)
    monkeypatch.setattr(cupy.cuda, "get_current_stream", lambda: stream)
    monkeypatch.setattr(_cublas, "_library", lambda: lib)
    monkeypatch.setattr(_cublas, "_HANDLES", threading.local())
    monkeypatch.setattr(_cublas, "_GRAPH_WORKSPACES", {})
    monkeypatch.setattr(_cublas, "CAPTURE_FAILURES", [])
    monkeypatch.setattr(_cublas, "DIRECT", True)
    return lib


def _sgemm_args():
    from dnnprims import _cublas
    one = _cublas._scalar(np.dtype(np.float32), 1.0).ctypes.data
    return (_cublas._OP_N, _cublas._OP_N, 4, 4, 4, one, 1 << 20, 4, 16, 2 << 20, 4, 16, one, 3 << 20, 4, 16, 2)


def test_own_handle_computes_in_full_fp32_whatever_mode_cupys_handle_is_in(fake_cublas):
    """Our handle runs the Winograd GEMMs, whose float32 error bounds assume full
    fp32 products: it must be in CUBLAS_DEFAULT_MATH.  It copied the math mode of
    CuPy's shared handle at creation, which is whatever code that last used that
    handle left there (TF32, or the deprecated tensor-op mode, which makes a
    float32 GEMM use fp16 products); CuPy itself asks for TF32 (CUPY_TF32) through
    each call's compute type, never through the handle's mode."""
    from dnnprims import _cublas
    run = _cublas.StridedBatched(np.float32)
    run(*_sgemm_args())
    assert [e for e in fake_cublas.log if e[0] == "math"] == [("math", 4321, CUBLAS_DEFAULT_MATH)]
    assert [e[0] for e in fake_cublas.log] == ["create", "math", "stream", "sgemm"]
    run(*_sgemm_args())                   # the same stream: no cublasSetStream
    assert [e[0] for e in fake_cublas.log][4:] == ["sgemm"]


@pytest.fixture
def fake_capture(fake_cublas, monkeypatch):
    """fake_cublas plus CuPy's side of a capture: cupy.empty (the cuBLAS
    workspace), side streams that become current in a ``with`` block, graphs."""
    cupy = pytest.importorskip("cupy")
    import types
    log = fake_cublas.log

    class UserStream:             # the caller's stream; a test sets ``capturing`` (a bool, or an error to raise)
        ptr = 77
        capturing = False

        def is_capturing(self):
            if isinstance(self.capturing, Exception):
                raise self.capturing
            return self.capturing
    current = [UserStream()]

    class Graph:
        def upload(self, stream):
            log.append(("upload", stream.ptr))

    class SideStream:
        def __init__(self, non_blocking=False):
            self.ptr = 900
            log.append(("side stream",))

        def is_capturing(self):
            return False

        def __enter__(self):
            current.append(self)
            return self

        def __exit__(self, *exc):
            current.pop()

        def begin_capture(self):
            log.append(("begin", self.ptr))

        def end_capture(self):
            log.append(("end", self.ptr))
            return Graph()

    def empty(size, dtype=None):
        log.append(("empty", size))
        return types.SimpleNamespace(data=types.SimpleNamespace(ptr=5 << 20), nbytes=size)
    monkeypatch.setattr(cupy.cuda, "get_current_stream", lambda: current[-1])
    monkeypatch.setattr(cupy.cuda, "Stream", SideStream)
    monkeypatch.setattr(cupy, "empty", empty)
    return log


def test_capture_keeps_cublas_on_the_captured_stream_and_release_drops_shared_workspaces(fake_capture):
    """A capture sets our handle on the side stream and the graph's workspace before
    the capture begins, issues the GEMMs there (no cublasSetStream inside: the
    handle is already on the current stream), uploads on the caller's stream and
    puts the handle back on no stream.  The workspace shared by the stream's
    graphs is one the fast paths keep: release_outputs() drops it (it held up to
    GRAPH_WORKSPACE_STREAMS x 4 MiB until the process ended; a graph still alive
    holds its own reference, returned beside it)."""
    from dnnprims import _cublas, _kernels
    run = _cublas.StridedBatched(np.float32)
    graph, keep = run.capture([_sgemm_args()], 77)
    assert fake_capture[:2] == [("create",), ("math", 4321, 0)]
    assert fake_capture[2:] == [("empty", _cublas.GRAPH_WORKSPACE_BYTES), ("side stream",),
                                ("stream", 4321, 900), ("workspace", 4321, 5 << 20, _cublas.GRAPH_WORKSPACE_BYTES),
                                ("begin", 900), ("sgemm", 4321), ("end", 900), ("upload", 77),
                                ("stream", 4321, None)]
    assert _cublas._GRAPH_WORKSPACES == {(0, 77): keep} and _cublas.captures >= 1
    _kernels.release_outputs()
    assert _cublas._GRAPH_WORKSPACES == {}
    run(*_sgemm_args())                   # the direct call sets its stream again
    assert fake_capture[-2:] == [("stream", 4321, 77), ("sgemm", 4321)]


def test_failed_capture_ends_it_and_puts_the_handle_back(fake_capture):
    """Work that raises inside the capture: the capture is ended (the side stream
    is not left capturing), the failure recorded, None returned, the handle put
    back on no stream, and no later capture is tried."""
    from dnnprims import _cublas
    run = _cublas.StridedBatched(np.float32)

    def work():
        run(*_sgemm_args())
        raise RuntimeError("refused inside the capture")
    assert run.capture_work(work, 77) is None
    assert [e[0] for e in fake_capture].count("end") == 1 and ("upload", 77) not in fake_capture
    assert fake_capture[-1] == ("stream", 4321, None)
    assert len(_cublas.CAPTURE_FAILURES) == 1 and "refused inside" in _cublas.CAPTURE_FAILURES[0]
    count = len(fake_capture)
    assert run.capture_work(work, 77) is None and len(fake_capture) == count


def test_scalar_pointer_stays_the_one_kept_when_two_threads_make_it_at_once(monkeypatch):
    """Plans keep only the host address of cuBLAS's alpha / beta (``_scalar(...)
    .ctypes.data``), so the array at that address must be the one _SCALARS keeps
    for good.  Two threads making the same scalar at once (a get, then a store)
    could each make one: the later store dropped the earlier thread's array while
    its address sat in a cached plan (cuBLAS then read freed host memory as alpha
    or beta).  The other thread is emulated by making the same scalar inside the
    first one's np.full."""
    from dnnprims import _cublas
    monkeypatch.setattr(_cublas, "_SCALARS", {})
    real_full, inner = np.full, []

    class Numpy:                           # _cublas's np, with a np.full that lets "the other thread" in
        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def full(*args, **kwargs):
            if not inner:
                inner.append(None)
                inner[0] = _cublas._scalar(np.dtype(np.float32), 1.0).ctypes.data
            return real_full(*args, **kwargs)
    monkeypatch.setattr(_cublas, "np", Numpy())
    outer = _cublas._scalar(np.dtype(np.float32), 1.0).ctypes.data
    kept = _cublas._SCALARS[np.dtype(np.float32), 1.0]
    assert inner == [outer] == [kept.ctypes.data] and kept[0] == 1.0


def test_capture_inside_a_users_capture_waits_without_recording_a_failure(fake_capture):
    """A user capturing our call into their own CUDA graph (the current stream is
    capturing): a capture of ours would allocate, begin a second capture and upload
    on their stream, which CUDA refuses, invalidating their capture -- and the
    refusal was recorded in CAPTURE_FAILURES, which turned every capture off for the
    process.  Now: NOT_NOW (falsy), no allocation, stream or cuBLAS call, nothing
    recorded; a query CUDA refuses counts as capturing; once the stream is no
    longer capturing, the next call captures."""
    cupy = pytest.importorskip("cupy")
    from dnnprims import _cublas
    run = _cublas.StridedBatched(np.float32)
    run(*_sgemm_args())                   # the handle exists (the first, direct call)
    user = cupy.cuda.get_current_stream()
    count = len(fake_capture)
    for capturing in (True, cupy.cuda.runtime.CUDARuntimeError(906)):   # 906: cudaErrorStreamCaptureImplicit
        user.capturing = capturing
        got = run.capture([_sgemm_args()], 77)
        assert got == () and got is not None and got is _cublas.NOT_NOW
        assert run.capture_work(lambda: run(*_sgemm_args()), 77) is _cublas.NOT_NOW
    assert len(fake_capture) == count and not _cublas.CAPTURE_FAILURES
    user.capturing = False
    graph, keep = run.capture([_sgemm_args()], 77)
    assert ("begin", 900) in fake_capture[count:] and not _cublas.CAPTURE_FAILURES


def test_capture_that_cannot_allocate_falls_back_without_turning_captures_off(fake_capture, monkeypatch):
    """A capture's cuBLAS workspace (4 MiB) or side stream that cannot be made (a
    full GPU) is no capture for that caller -- None returned, it runs its work
    directly and stops asking for that workspace or prepared call -- not an error
    out of the user's convolution (review6a fix 3), and not a failure of captures:
    nothing in CAPTURE_FAILURES, so other workspaces, and this one once memory is
    back, still capture (review6a item 5: it turned captures off for the process)."""
    cupy = pytest.importorskip("cupy")
    from dnnprims import _cublas
    fake_empty = cupy.empty

    def no_memory(*args, **kwargs):
        raise cupy.cuda.memory.OutOfMemoryError(_cublas.GRAPH_WORKSPACE_BYTES, 0)
    monkeypatch.setattr(cupy, "empty", no_memory)
    run = _cublas.StridedBatched(np.float32)
    assert run.capture([_sgemm_args()], 77) is None
    assert not _cublas.CAPTURE_FAILURES
    assert not any(e[0] in ("stream", "workspace", "begin", "sgemm") for e in fake_capture)   # the handle untouched
    monkeypatch.setattr(cupy, "empty", fake_empty)
    graph, keep = run.capture([_sgemm_args()], 77)     # memory back: captured
    assert ("begin", 900) in fake_capture and fake_capture[-1] == ("stream", 4321, None)
    assert not _cublas.CAPTURE_FAILURES


def test_own_handle_is_destroyed_with_its_thread_on_its_own_device(fake_cublas, monkeypatch):
    """Our cuBLAS handles are per thread and device; a thread that ends must not leak
    its handle (and the device memory cuBLAS gave it), as CuPy destroys its own with
    the thread (review6a item 2: ours were never destroyed).  The handle's device is
    made current around cublasDestroy (the thread may have moved to another device),
    then the thread's device is put back; not at interpreter shutdown."""
    import gc
    import sys
    import threading
    cupy = pytest.importorskip("cupy")
    from dnnprims import _cublas
    current = [1]                          # the device current in the thread
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: current[0])

    def set_device(device):
        fake_cublas.log.append(("set device", device))
        current[0] = device
    monkeypatch.setattr(cupy.cuda.runtime, "setDevice", set_device)
    run = _cublas.StridedBatched(np.float32)

    def thread():
        run(*_sgemm_args())                # makes this thread's handle for device 1
        current[0] = 0                     # the thread then moves to device 0, and ends
    worker = threading.Thread(target=thread)
    worker.start()
    worker.join()
    gc.collect()
    log = fake_cublas.log
    assert ("create",) in log and ("sgemm", 4321) in log
    assert log[log.index(("sgemm", 4321)) + 1:] == [("set device", 1), ("destroy", 4321), ("set device", 0)]
    count = len(log)
    monkeypatch.setattr(sys, "is_finalizing", lambda: True)
    worker = threading.Thread(target=lambda: run(*_sgemm_args()))
    worker.start()
    worker.join()
    gc.collect()
    assert ("sgemm", 4321) in log[count:] and ("destroy", 4321) not in log[count:]
