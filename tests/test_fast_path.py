"""The host fast path of cached GPU calls: prepared launches (dnnprims/_kernels.py)
and the flat per-call tables of conv, softmax and activations (CallMemo.fast).

CPU tests check how a prepared launch packs its arguments (CuPy arrays faked over
host memory, the driver call captured); GPU tests check that a repeated call
takes the fast path, gives the same result, and that any call differing in
something validated -- an option's type, a view that is not contiguous or not
16-byte aligned -- is still validated (and refused, or run correctly).
"""
import ctypes
import threading

import numpy as np
import pytest

from dnnprims import _kernels, _validate
from dnnprims.testing import assert_close

from conftest import random_array

F64 = np.float64


# ---- prepared launches (CPU: no driver) --------------------------------------------

def _fake_array(shape, dtype=np.float32):
    """A CuPy ndarray over host memory: only its pointer is ever read here."""
    cupy = pytest.importorskip("cupy")
    from cupy.cuda.memory import MemoryPointer, UnownedMemory
    host = np.zeros(int(np.prod(shape)) * np.dtype(dtype).itemsize + 16, np.uint8)
    memory = UnownedMemory(host.ctypes.data, host.nbytes, host, device_id=0)
    return cupy.ndarray(shape, dtype, memptr=MemoryPointer(memory, 0))


class _FakeFunction:
    ptr = 1234

    def __init__(self):
        self.calls = []

    def __call__(self, grid, block, args, shared_mem=0):
        self.calls.append((grid, block, args, shared_mem))


class _FakeKernel:
    def __init__(self):
        self.kernel = _FakeFunction()


class _Stream:
    ptr = 77


def _parameters(params_ptr, sizes):
    """The bytes cuLaunchKernel would read: parameter i has sizes[i] bytes at params[i]."""
    addresses = (ctypes.c_uint64 * len(sizes)).from_address(params_ptr)
    return [ctypes.string_at(addresses[i], size) for i, size in enumerate(sizes)]


@pytest.fixture
def captured(monkeypatch):
    launches = []

    def launch_kernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        launches.append(dict(f=f, dims=(gx, gy, gz, bx, by, bz), shared=shared, stream=stream,
                             params=params, extra=extra))

    monkeypatch.setattr(_kernels, "_launch_kernel", launch_kernel)
    monkeypatch.setattr(_kernels, "_current_stream", lambda: _Stream())
    return launches


def test_prepared_launch_packs_fixed_scalars_and_the_call_arrays(captured):
    a, b, table = _fake_array((3, 5)), _fake_array((7,), np.float64), _fake_array((16, 4), np.int32)
    kernel = _FakeKernel()
    launch = _kernels.PreparedLaunch(
        kernel, (9,), (128, 2),
        (_kernels.ARRAY1, table, np.int32(-5), np.int64(1 << 40), np.float32(0.25), np.float64(-2.5),
         _kernels.ARRAY0, np.int32(7), _kernels.ARRAY1, np.bool_(True)),
        shared_mem=4096)
    assert launch(a, b) is None
    (call,) = captured
    assert call["f"] == 1234 and call["dims"] == (9, 1, 1, 128, 2, 1)
    assert call["shared"] == 4096 and call["stream"] == 77 and call["extra"] == 0
    got = _parameters(call["params"], [8, 8, 4, 8, 4, 8, 8, 4, 8, 1])
    u64 = lambda v: int(v).to_bytes(8, "little")
    assert got[0] == u64(b.data.ptr) and got[8] == u64(b.data.ptr)
    assert got[1] == u64(table.data.ptr) and got[6] == u64(a.data.ptr)
    assert got[2] == np.int32(-5).tobytes() and got[3] == np.int64(1 << 40).tobytes()
    assert got[4] == np.float32(0.25).tobytes() and got[5] == np.float64(-2.5).tobytes()
    assert got[7] == np.int32(7).tobytes() and got[9] == b"\x01"
    # The next call writes the new arrays' pointers into the same slots.
    c, d = _fake_array((2,)), _fake_array((4,))
    launch(c, d)
    got = _parameters(captured[1]["params"], [8, 8, 4, 8, 4, 8, 8])
    assert got[0] == u64(d.data.ptr) and got[6] == u64(c.data.ptr) and got[1] == u64(table.data.ptr)
    assert kernel.kernel.calls == []


def test_prepared_launch_refuses_python_scalars_and_unknown_arguments():
    for bad in (3, 2.5, "x", None, np.complex128(1)):
        with pytest.raises(TypeError, match="argument 1 of conv_x<float>"):
            _kernels.PreparedLaunch(_FakeKernel(), (1,), (32,), (_kernels.ARRAY0, bad),
                                    expression="conv_x<float>")


def test_prepared_launch_falls_back_to_cupy_when_busy_or_on_a_driver_error(captured, monkeypatch):
    a, b = _fake_array((4,)), _fake_array((4,))
    kernel = _FakeKernel()
    launch = _kernels.PreparedLaunch(kernel, (2, 3), (64,), (_kernels.ARRAY0, np.int32(4), _kernels.ARRAY1))
    launch._lock.acquire()              # another thread is between writing and launching
    try:
        launch(a, b)
    finally:
        launch._lock.release()
    assert captured == []
    (grid, block, args, shared), = kernel.kernel.calls
    assert grid == (2, 3, 1) and block == (64, 1, 1) and shared == 0
    assert args[0] is a and args[2] is b and args[1] == np.int32(4)

    class NoContext(Exception):
        pass

    def failing_launch(*args):
        raise NoContext()

    monkeypatch.setattr(_kernels, "_launch_kernel", failing_launch)
    monkeypatch.setattr(_kernels, "_DriverError", NoContext)
    launch(b, a)                        # a thread without a current context: CuPy's launch
    assert kernel.kernel.calls[-1][2][0] is b and not launch._lock.locked()


def test_exact_tells_apart_values_python_treats_as_equal():
    keys = {_validate.exact(v) for v in (1, True, 1.0, np.int64(1), (1, 1), (1.0, 1.0), (True, 1),
                                          (np.int64(1), 1), "NCHW", None)}
    assert len(keys) == 10
    assert _validate.exact((1, 1)) == _validate.exact((1, 1))
    with pytest.raises(TypeError):
        _validate.exact([1, 1])


# ---- the fast paths on the GPU -------------------------------------------------------

def _unaligned_copy(gpu, a):
    """A C-contiguous copy of ``a`` whose data starts 4 bytes past a 16-byte boundary."""
    base = gpu.empty(a.size + 4, a.dtype)
    view = base[1:1 + a.size].reshape(a.shape)
    view[...] = gpu.asarray(a)
    assert view.flags.c_contiguous and view.data.ptr % 16
    return view


def _strided_copy(gpu, a):
    """A copy of ``a`` with the same shape that is not C-contiguous."""
    view = gpu.asfortranarray(gpu.asarray(a))
    assert not view.flags.c_contiguous
    return view


@pytest.mark.gpu
def test_softmax_fast_path_memo_checks_axis_type_alignment_and_contiguity(gpu, rng):
    from dnnprims import softmaxes
    x = random_array(rng, (6, 13, 9), np.float32)
    X = gpu.asarray(x)
    expected = softmaxes.softmax(x.astype(F64), axis=1)
    first = softmaxes.softmax(X, axis=1)
    fast, entries = len(softmaxes._FAST), len(softmaxes._MEMO._entries)
    again = softmaxes.softmax(X, axis=1)
    assert (len(softmaxes._FAST), len(softmaxes._MEMO._entries)) == (fast, entries)
    assert gpu.array_equal(first, again)
    assert_close(again, expected, np.float32)
    with pytest.raises(TypeError, match="axis"):
        softmaxes.softmax(X, axis=True)
    assert_close(softmaxes.softmax(X, axis=np.int64(1)), expected, np.float32)
    assert_close(softmaxes.softmax(X, axis=-2), expected, np.float32)
    assert_close(softmaxes.softmax(_unaligned_copy(gpu, x), axis=1), expected, np.float32)
    assert_close(softmaxes.softmax(_strided_copy(gpu, x), axis=1), expected, np.float32)
    y = softmaxes.softmax(X, axis=2)
    dy = random_array(rng, x.shape, np.float32)
    y64 = softmaxes.softmax(x.astype(F64), axis=2)
    want = softmaxes.softmax_backward(dy.astype(F64), y64, axis=2)
    for dY in (gpu.asarray(dy), gpu.asarray(dy), _unaligned_copy(gpu, dy), _strided_copy(gpu, dy)):
        assert_close(softmaxes.softmax_backward(dY, y, axis=2), want, np.float32)
    with pytest.raises(TypeError, match="dtype"):
        softmaxes.softmax_backward(gpu.asarray(dy).astype(gpu.float64), y, axis=2)


@pytest.mark.gpu
def test_activation_fast_path_memo_checks_alpha_type_and_layout_of_memory(gpu, rng):
    from dnnprims import activations
    x = random_array(rng, (5, 12, 7), np.float32)
    X = gpu.asarray(x)
    expected = activations.activation(x.astype(F64), "elu", alpha=1.0)
    first = activations.activation(X, "elu", alpha=1)
    fast = len(activations._FAST)
    assert gpu.array_equal(activations.activation(X, "elu", alpha=1), first)
    assert len(activations._FAST) == fast
    assert_close(first, expected, np.float32)
    with pytest.raises(TypeError, match="alpha"):
        activations.activation(X, "elu", alpha=True)
    with pytest.raises(ValueError, match="approximate"):
        activations.activation(X, "gelu", approximate=["none"])
    assert_close(activations.activation(X, "elu", alpha=1.0), expected, np.float32)
    assert_close(activations.activation(_unaligned_copy(gpu, x), "elu", alpha=1), expected, np.float32)
    assert_close(activations.activation(_strided_copy(gpu, x), "elu", alpha=1), expected, np.float32)
    dy = random_array(rng, x.shape, np.float32)
    want = activations.activation_backward(dy.astype(F64), x.astype(F64), "silu")
    for dY in (gpu.asarray(dy), gpu.asarray(dy), _unaligned_copy(gpu, dy)):
        assert_close(activations.activation_backward(dY, X, "silu"), want, np.float32)


@pytest.mark.gpu
def test_fast_path_launches_from_several_threads(gpu, rng):
    """Prepared launches share their argument buffer: a lock, and threads whose
    CUDA context is not yet current fall back to CuPy's launch."""
    from dnnprims import softmaxes
    inputs = [random_array(rng, (64, 100), np.float32) for _ in range(4)]
    expected = [softmaxes.softmax(x.astype(F64)) for x in inputs]
    results, errors = {}, []

    def work(i):
        try:
            X = gpu.asarray(inputs[i])
            for _ in range(50):
                y = softmaxes.softmax(X)
            gpu.cuda.get_current_stream().synchronize()
            results[i] = y.get()
        except Exception as e:  # reported below
            errors.append(e)

    softmaxes.softmax(gpu.asarray(inputs[0]))     # the entry exists before the threads start
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i in range(4):
        assert_close(results[i], expected[i], np.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("algo", ["auto", "implicit_gemm", "direct"])
def test_conv_forward_fast_path_memo_checks_option_types(gpu, rng, algo):
    from dnnprims import conv
    x, w, b = (random_array(rng, s, np.float32) for s in ((2, 4, 7, 7), (6, 4, 3, 3), (6,)))
    X, W, B = gpu.asarray(x), gpu.asarray(w), gpu.asarray(b)
    x64, w64, b64 = x.astype(F64), w.astype(F64), b.astype(F64)
    want = conv.conv2d_forward(x64, w64, b64, padding=1, activation="relu")
    first = conv.conv2d_forward(X, W, B, padding=1, algo=algo, activation="relu")
    fast, entries = len(conv._FAST), len(conv._MEMO._entries)
    again = conv.conv2d_forward(X, W, B, padding=1, algo=algo, activation="relu")
    assert (len(conv._FAST), len(conv._MEMO._entries)) == (fast, entries)
    assert gpu.array_equal(first, again)
    assert_close(again, want, np.float32)
    for padding in ((1, 1), [1, 1], np.int64(1), (np.int64(1), 1)):
        assert_close(conv.conv2d_forward(X, W, B, padding=padding, algo=algo, activation="relu"), want,
                     np.float32)
    with pytest.raises(TypeError, match="padding"):
        conv.conv2d_forward(X, W, B, padding=(1.0, 1.0), algo=algo, activation="relu")
    with pytest.raises(TypeError, match="padding"):
        conv.conv2d_forward(X, W, B, padding=1.0, algo=algo, activation="relu")
    with pytest.raises(TypeError, match="groups"):
        conv.conv2d_forward(X, W, B, padding=1, groups=True, algo=algo, activation="relu")
    with pytest.raises(TypeError, match="alpha"):
        conv.conv2d_forward(X, W, B, padding=1, algo=algo, activation="elu", alpha=True)
    with pytest.raises(TypeError, match="workspace_limit"):
        conv.conv2d_forward(X, W, B, padding=1, algo=algo, activation="relu", workspace_limit=True)
    assert_close(conv.conv2d_forward(_strided_copy(gpu, x), W, B, padding=1, algo=algo, activation="relu"),
                 want, np.float32)
    no_bias = conv.conv2d_forward(x64, w64, padding=1, activation="elu", alpha=0.5)
    for _ in range(2):   # without bias, an activation fused or applied after
        assert_close(conv.conv2d_forward(X, W, padding=1, algo=algo, activation="elu", alpha=0.5),
                     no_bias, np.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("algo", ["auto", "implicit_gemm", "implicit_gemm_subpixel"])
def test_conv_backward_data_fast_path_memo_checks_shape_types(gpu, rng, algo):
    from dnnprims import conv
    stride = 2 if algo == "implicit_gemm_subpixel" else 1
    x_shape = (2, 4, 9, 9)
    w = random_array(rng, (6, 4, 3, 3), np.float32)
    P = (9 + 2 - 3) // stride + 1
    dy = random_array(rng, (2, 6, P, P), np.float32)
    dY, W = gpu.asarray(dy), gpu.asarray(w)
    want = conv.conv2d_backward_data(dy.astype(F64), w.astype(F64), x_shape, stride=stride, padding=1)
    for _ in range(2):
        assert_close(conv.conv2d_backward_data(dY, W, x_shape, stride=stride, padding=1, algo=algo),
                     want, np.float32)
    assert_close(conv.conv2d_backward_data(dY, W, list(x_shape), stride=stride, padding=1, algo=algo),
                 want, np.float32)
    with pytest.raises(TypeError, match="x_shape"):
        conv.conv2d_backward_data(dY, W, (2.0, 4, 9, 9), stride=stride, padding=1, algo=algo)
    with pytest.raises(TypeError, match="stride"):
        conv.conv2d_backward_data(dY, W, x_shape, stride=float(stride), padding=1, algo=algo)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("algo", ["implicit_gemm_wgrad", "implicit_gemm_wgrad_atomic", "auto"])
@pytest.mark.parametrize("batch", [1, 8])
def test_conv_backward_filter_fast_path_every_wgrad_mode(gpu, rng, algo, dtype, batch):
    """Direct, split (partials + sum) and atomic modes, float32 and half (a float accumulator)."""
    from dnnprims import conv
    x = random_array(rng, (batch, 8, 16, 16), dtype)
    dy = random_array(rng, (batch, 8, 16, 16), dtype)
    X, dY = gpu.asarray(x), gpu.asarray(dy)
    want = conv.conv2d_backward_filter(x.astype(F64), dy.astype(F64), (8, 8, 3, 3), padding=1)
    deterministic = algo == "implicit_gemm_wgrad"
    results = [conv.conv2d_backward_filter(X, dY, (8, 8, 3, 3), padding=1, algo=algo,
                                           deterministic=deterministic) for _ in range(3)]
    for dw in results:
        assert_close(dw, want, dtype, algorithm=algo)
    if deterministic:
        assert gpu.array_equal(results[0], results[2])
    with pytest.raises(TypeError, match="deterministic"):
        conv.conv2d_backward_filter(X, dY, (8, 8, 3, 3), padding=1, algo=algo, deterministic=1)
    with pytest.raises(TypeError, match="w_shape"):
        conv.conv2d_backward_filter(X, dY, (8, 8, 3, True), padding=1, algo=algo,
                                    deterministic=deterministic)
