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


def test_prepared_launch_packed_follows_the_c_parameter_layout(captured):
    """packed=True: one buffer in the kernel's C layout (natural alignment),
    passed through cuLaunchKernel's extra (BUFFER_POINTER, BUFFER_SIZE, END)."""
    a, b = _fake_array((3,)), _fake_array((5,))
    launch = _kernels.PreparedLaunch(
        _FakeKernel(), (4,), (32,),
        (_kernels.ARRAY0, np.int32(-3), np.int64(1 << 40), np.bool_(True), np.float32(0.5),
         _kernels.ARRAY1, np.float64(2.0), np.int32(9)), packed=True)
    launch(a, b)
    (call,) = captured
    assert call["params"] == 0 and call["extra"] != 0
    extra = (ctypes.c_uint64 * 5).from_address(call["extra"])
    assert (extra[0], extra[2], extra[4]) == (1, 2, 0)
    size = ctypes.c_uint64.from_address(extra[3]).value
    assert size == 52                     # 8 + 4 (+4) + 8 + 1 (+3) + 4 + 8 + 8 + 4
    buf = ctypes.string_at(extra[1], size)
    u64 = lambda v: int(v).to_bytes(8, "little")
    assert buf[0:8] == u64(a.data.ptr) and buf[8:12] == np.int32(-3).tobytes()
    assert buf[16:24] == np.int64(1 << 40).tobytes() and buf[24:25] == b"\x01"
    assert buf[28:32] == np.float32(0.5).tobytes() and buf[32:40] == u64(b.data.ptr)
    assert buf[40:48] == np.float64(2.0).tobytes() and buf[48:52] == np.int32(9).tobytes()


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


# ---- cooperative launches (CPU: the driver call captured) ------------------------

class _DriverError(Exception):
    def __init__(self, status):
        super().__init__(f"driver error {status}")
        self.status = status


@pytest.fixture
def cooperative(monkeypatch):
    """Captures cuLaunchCooperativeKernel; `refuse` (a list) holds statuses the next calls raise."""
    launches, refuse = [], []

    def launch_cooperative_kernel(f, gx, gy, gz, bx, by, bz, shared, stream, params):
        launches.append(dict(f=f, dims=(gx, gy, gz, bx, by, bz), shared=shared, stream=stream, params=params))
        if refuse:
            raise _DriverError(refuse.pop(0))

    monkeypatch.setattr(_kernels, "_launch_cooperative_kernel", launch_cooperative_kernel)
    monkeypatch.setattr(_kernels, "_DriverError", _DriverError)
    monkeypatch.setattr(_kernels, "_current_stream", lambda: _Stream())
    return launches, refuse


def test_kernel_parameters_one_slot_per_argument_in_order_with_exact_types():
    """kernelParams: one 8-aligned slot per argument, in the signature's order, each
    holding the argument's value with its own C type's size (a pointer 8 bytes, an
    int 4, a long long 8, a float 4, a double 8, an unsigned 4)."""
    a, part, arrive = _fake_array((3, 4)), _fake_array((6,), np.float64), _fake_array((8,), np.uint32)
    args = (a, part, np.int64(-(1 << 40)), np.int32(-7), np.float32(0.5), np.float64(1e-300), np.uint32(0xfffffffe),
            arrive)
    values, params, keep = _kernels.kernel_parameters(args, "k<float>")
    addresses = list(params)
    base = values.buffer_info()[0]
    assert addresses == [base + 8 * i for i in range(len(args))]
    assert all(address % 8 == 0 for address in addresses)
    got = _parameters(params.buffer_info()[0], [8, 8, 8, 4, 4, 8, 4, 8])
    u64 = lambda v: int(v).to_bytes(8, "little")  # noqa: E731
    assert got[0] == u64(a.data.ptr) and got[1] == u64(part.data.ptr) and got[7] == u64(arrive.data.ptr)
    assert got[2] == (-(1 << 40)).to_bytes(8, "little", signed=True)
    assert got[3] == (-7).to_bytes(4, "little", signed=True)
    assert got[4] == np.float32(0.5).tobytes() and got[5] == np.float64(1e-300).tobytes()
    assert got[6] == (0xfffffffe).to_bytes(4, "little")
    assert tuple(keep) == (a, part, arrive)
    for bad in (3, 2.5, None, _kernels.ARRAY0):
        with pytest.raises(TypeError, match="k<float>"):
            _kernels.kernel_parameters((a, bad), "k<float>")


def test_cooperative_launch_packs_like_a_prepared_launch(cooperative, captured):
    launches, _ = cooperative
    a, b, arrive = _fake_array((4,)), _fake_array((4,)), _fake_array((2,), np.uint32)
    kernel = _FakeKernel()
    launch = _kernels.CooperativeLaunch(kernel, (12, 2), (256,), (_kernels.ARRAY1, np.int32(3), arrive,
                                                                  _kernels.ARRAY0, np.float64(0.25)))
    launch(a, b)
    (call,) = launches
    assert call["f"] == 1234 and call["dims"] == (12, 2, 1, 256, 1, 1) and call["stream"] == 77
    got = _parameters(call["params"], [8, 4, 8, 8, 8])
    u64 = lambda v: int(v).to_bytes(8, "little")  # noqa: E731
    assert got[0] == u64(b.data.ptr) and got[1] == np.int32(3).tobytes() and got[2] == u64(arrive.data.ptr)
    assert got[3] == u64(a.data.ptr) and got[4] == np.float64(0.25).tobytes()
    assert captured == [] and kernel.kernel.calls == []  # never an ordinary launch


def test_cooperative_launch_refused_runs_the_fallback_from_then_on(cooperative, captured):
    launches, refuse = cooperative
    a, b = _fake_array((4,)), _fake_array((4,))
    ran = []
    launch = _kernels.CooperativeLaunch(_FakeKernel(), (4000,), (256,), (_kernels.ARRAY0, _kernels.ARRAY1),
                                        expression="k<float>", fallback=lambda *arrays: ran.append(arrays))
    refused = _kernels.cooperative_refusals
    refuse.append(720)                    # CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
    launch(a, b)
    assert len(launches) == 1 and ran == [(a, b)] and not launch._lock.locked()
    assert _kernels.cooperative_refusals == refused + 1
    launch(b, a)                          # refused once: the driver is not asked again
    assert len(launches) == 1 and ran[-1] == (b, a) and captured == []
    # Without a fallback the refusal is raised (nothing ran).
    bare = _kernels.CooperativeLaunch(_FakeKernel(), (4000,), (256,), (_kernels.ARRAY0,), expression="k<float>")
    refuse.append(801)                    # CUDA_ERROR_NOT_SUPPORTED
    with pytest.raises(_kernels.CooperativeLaunchRefused, match="k<float>"):
        bare(a)
    refuse.append(720)
    with pytest.raises(_kernels.CooperativeLaunchRefused):
        _kernels.launch_cooperative(_FakeFunction(), (4000,), (256,), (a, np.int32(1)), 0, "k<float>")


def test_cooperative_launch_busy_or_without_context_stays_cooperative(cooperative, captured, monkeypatch):
    launches, refuse = cooperative
    a, b = _fake_array((4,)), _fake_array((4,))
    kernel = _FakeKernel()
    launch = _kernels.CooperativeLaunch(kernel, (8,), (256,), (_kernels.ARRAY0, np.int32(5), _kernels.ARRAY1))
    launch._lock.acquire()                # another thread is between writing and launching
    try:
        launch(a, b)
    finally:
        launch._lock.release()
    (call,) = launches
    assert call["params"] != launch._params_ptr          # its own copy of the arguments
    assert kernel.kernel.calls == [] and captured == []
    made_current = []
    monkeypatch.setattr(_kernels, "_make_context_current", lambda: made_current.append(1))
    refuse.append(201)                    # CUDA_ERROR_INVALID_CONTEXT: made current, tried again
    launch(b, a)
    assert made_current == [1] and len(launches) == 3 and kernel.kernel.calls == []
    got = _parameters(launches[-1]["params"], [8, 4, 8])
    assert got[0] == int(b.data.ptr).to_bytes(8, "little") and got[2] == int(a.data.ptr).to_bytes(8, "little")
    refuse.extend([201, 201])             # a second error is raised as it is
    with pytest.raises(_DriverError):
        launch(a, b)
    assert not launch._lock.locked()


def test_exact_tells_apart_values_python_treats_as_equal():
    keys = {_validate.exact(v) for v in (1, True, 1.0, np.int64(1), (1, 1), (1.0, 1.0), (True, 1),
                                          (np.int64(1), 1), "NCHW", None)}
    assert len(keys) == 10
    assert _validate.exact((1, 1)) == _validate.exact((1, 1))
    with pytest.raises(TypeError):
        _validate.exact([1, 1])


# ---- output slots (CPU: CuPy arrays over host memory) --------------------------------

@pytest.fixture
def fake_pool(monkeypatch):
    """CuPy allocations over host memory (one memory object each, as CuPy's pool
    gives), counted as recyclable; a stream whose pointer the test sets."""
    cupy = pytest.importorskip("cupy")
    import contextlib
    from cupy.cuda.memory import MemoryPointer, UnownedMemory
    buffers = []

    def allocate(nbytes):
        host = np.zeros(max(nbytes, 1) + 16, np.uint8)
        buffers.append(host)
        return MemoryPointer(UnownedMemory(host.ctypes.data, host.nbytes, host, device_id=0), 0)

    stream = _Stream()
    stream.ptr = 77
    monkeypatch.setattr(_kernels, "RECYCLABLE", (UnownedMemory,))
    monkeypatch.setattr(_kernels, "_current_stream", lambda: stream)
    monkeypatch.setattr(_kernels, "_recycle_left", _kernels.RECYCLE_BUDGET_BYTES)
    with contextlib.ExitStack() as stack:
        stack.enter_context(cupy.cuda.using_allocator(allocate))
        yield stream, buffers


def test_output_slot_hands_back_a_dropped_output(fake_pool):
    slot = _kernels.OutputSlot((3, 5), np.float32)
    first = slot()
    assert first.shape == (3, 5) and first.dtype == np.float32 and first.flags.c_contiguous
    ptr, ident = first.data.ptr, id(first)
    del first
    again = slot()
    assert again.data.ptr == ptr and id(again) == ident
    assert len(fake_pool[1]) == 1        # one allocation for both calls


def test_output_slot_allocates_anew_while_anything_holds_the_output(fake_pool):
    import weakref
    slot = _kernels.OutputSlot((4, 6), np.float32)
    holders = [
        lambda a: a,                      # the array itself
        lambda a: a[1:],                  # a view
        lambda a: a.reshape(24),          # a view of another shape
        lambda a: a.data,                 # its MemoryPointer
        lambda a: a.data.mem,             # its memory
        lambda a: a.data + 4,             # a pointer into it
        lambda a: weakref.ref(a),         # a weak reference (would see the array come back)
    ]
    for hold in holders:
        out = slot()
        held = hold(out)
        ptr = out.data.ptr
        del out
        other = slot()
        assert other.data.ptr != ptr, hold
        del held, other
    out = slot()                          # nobody holds the last one: it comes back
    ptr = out.data.ptr
    del out
    assert slot().data.ptr == ptr


def test_output_slot_never_learns_its_counts_under_a_tracer(fake_pool):
    """A trace function that reads frame.f_locals (a debugger stepping through
    the first call, Python < 3.13) holds the slot's locals: counts learned then
    were one high, and from then on the slot handed back an output its caller
    still held -- the next call overwrote the previous result (silent)."""
    import sys
    slot = _kernels.OutputSlot((4,), np.float32)
    call_code = _kernels.OutputSlot.__call__.__code__

    def tracer(frame, event, arg):
        if frame.f_code is call_code:
            frame.f_locals                # what a debugger's variables view does
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        first = slot()                    # the slot's first allocation, traced
    finally:
        sys.settrace(previous)
    second = slot()                       # `first` is still held here
    assert second is not first and second.data.ptr != first.data.ptr
    third = slot()
    assert third is not second and third is not first
    ptr = third.data.ptr
    del third
    assert slot().data.ptr == ptr         # untraced: a dropped output still comes back


def test_output_slot_keeps_to_its_stream_and_shape(fake_pool):
    stream, _ = fake_pool
    slot = _kernels.OutputSlot((8,), np.float64)
    out = slot()
    ptr = out.data.ptr
    del out
    stream.ptr = 78                       # another stream: a fresh array, kept from now on
    out = slot()
    assert out.data.ptr != ptr
    ptr = out.data.ptr
    out.shape = (2, 4)                    # reshaped in place, then dropped: never handed back
    del out
    out = slot()
    assert out.shape == (8,) and out.data.ptr != ptr
    ptr = out.data.ptr
    del out
    assert slot().data.ptr == ptr


def test_output_slot_budget_and_release(fake_pool, monkeypatch):
    _, buffers = fake_pool
    big = _kernels.OutputSlot((_kernels.RECYCLE_MAX_BYTES // 4 + 1,), np.float32)
    assert not big._reserve()
    monkeypatch.setattr(_kernels, "_recycle_left", 1000)
    small, other = _kernels.OutputSlot((200,), np.float32), _kernels.OutputSlot((200,), np.float32)
    out = small()
    del out
    assert small._reserved and _kernels._recycle_left == 200
    out = other()                         # over the budget: allocated, never kept
    del out
    assert not other._reserved and not other._free
    small.release()
    assert _kernels._recycle_left == 1000 and not small._free
    out = small()
    del out
    _kernels.release_outputs()
    assert _kernels._recycle_left == 1000 and not small._free
    count = len(buffers)
    small()
    assert len(buffers) == count + 1


def _host_allocate(buffers):
    """A WorkspaceSlot allocator over host memory (records each allocation)."""
    def allocate(size, dtype):
        a = _fake_array((size,), dtype)
        buffers.append(a)
        return a
    return allocate


def test_workspace_slot_reuses_on_its_stream_and_never_shares_streams(fake_pool):
    stream, _ = fake_pool
    made = []
    slot = _kernels.WorkspaceSlot(100, np.float32, allocate=_host_allocate(made))
    first = slot.take()
    assert first.array.shape == (100,) and first.array.dtype == np.float32 and not first.kept
    slot.give_back(first)
    assert first.kept and slot.kept_streams() == (77,)
    again = slot.take()                    # the same stream: the kept workspace
    assert again is first and slot.kept_streams() == ()
    stream.ptr = 78                        # another stream: one of its own
    other = slot.take()
    assert other is not first and other.array.data.ptr != first.array.data.ptr
    stream.ptr = 77
    busy = slot.take()                     # its stream's workspace is taken (another thread): fresh
    assert busy is not first
    slot.give_back(first)
    slot.give_back(busy)                   # the stream already has one kept: busy is dropped
    slot.give_back(other)
    assert sorted(slot.kept_streams()) == [77, 78] and not busy.kept
    assert slot._kept[77] is first and slot._kept[78] is other
    assert len(made) == 3
    assert _kernels._recycle_left == _kernels.RECYCLE_BUDGET_BYTES - 2 * 400


def test_workspace_slot_bounds_release_and_switch(fake_pool, monkeypatch):
    stream, _ = fake_pool
    made = []
    allocate = _host_allocate(made)
    big = _kernels.WorkspaceSlot(_kernels.RECYCLE_MAX_BYTES // 4 + 1, np.float32, allocate=allocate)
    monkeypatch.setattr(_kernels, "_recycle_left", _kernels.RECYCLE_BUDGET_BYTES)
    assert not big._reserve(_kernels.Workspace(None, 0))    # over 32 MB: never kept
    slot = _kernels.WorkspaceSlot(10, np.float64, allocate=allocate)
    for ptr in range(1, 7):                # at most MAX_STREAMS streams kept
        stream.ptr = ptr
        slot.give_back(slot.take())
    assert len(slot.kept_streams()) == _kernels.WorkspaceSlot.MAX_STREAMS
    assert _kernels._recycle_left == _kernels.RECYCLE_BUDGET_BYTES - 80 * _kernels.WorkspaceSlot.MAX_STREAMS
    _kernels.release_outputs()             # drops workspaces too, and gives the bytes back
    assert slot.kept_streams() == () and _kernels._recycle_left == _kernels.RECYCLE_BUDGET_BYTES
    monkeypatch.setattr(_kernels, "_recycle_left", 50)     # the budget is shared with OutputSlot
    slot.give_back(slot.take())
    assert slot.kept_streams() == ()
    monkeypatch.setattr(_kernels, "_recycle_left", _kernels.RECYCLE_BUDGET_BYTES)
    previous = _kernels.set_workspace_reuse(False)
    try:
        slot.give_back(slot.take())
        assert slot.kept_streams() == ()
    finally:
        _kernels.set_workspace_reuse(previous)
    kept = slot.take()
    slot.give_back(kept)
    _kernels.set_workspace_reuse(True)     # switching drops what is kept
    assert slot.kept_streams() == () and not kept.kept
    assert _kernels._recycle_left == _kernels.RECYCLE_BUDGET_BYTES


def test_slot_release_inside_the_budget_lock_does_not_deadlock(fake_pool):
    """A slot's __del__ releases its kept memory under _recycle_lock; the cyclic
    GC can run that finalizer on a thread that already holds the lock (it
    allocates inside _reserve: WeakSet.add).  With a plain Lock that thread
    waited for itself forever; the lock is re-entrant now.  (Checked with a
    timed acquire so that the old code fails instead of hanging.)"""
    made = []
    slot = _kernels.WorkspaceSlot(10, np.float32, allocate=_host_allocate(made))
    slot.give_back(slot.take())
    outputs = _kernels.OutputSlot((4,), np.float32)
    out = outputs()
    del out
    assert slot.kept_streams() and outputs._reserved
    lock = _kernels._recycle_lock
    assert lock.acquire(timeout=1)
    try:
        again = lock.acquire(timeout=1)    # what a finalizer inside the critical section does
        assert again, "the budget lock is not re-entrant"
        lock.release()
        slot.release()                     # as __del__ would, from inside
        outputs.release()
    finally:
        lock.release()
    assert _kernels._recycle_left == _kernels.RECYCLE_BUDGET_BYTES


def test_slots_keep_per_thread_default_streams_apart(fake_pool):
    """CuPy's per-thread default stream has the pointer 2 (cudaStreamPerThread) in
    every host thread, but each thread's is a stream of its own: a workspace or
    an output kept after one thread's call may still be in use on that thread's
    stream, so another thread's call must not get it (CuPy's pool keys it per
    thread for the same reason, cupy/cupy#5069).  Before the fix both slots
    keyed it by the pointer alone and handed it over."""
    stream, _ = fake_pool
    stream.ptr = 2
    made = []
    slot = _kernels.WorkspaceSlot(100, np.float32, allocate=_host_allocate(made))
    outputs = _kernels.OutputSlot((8,), np.float32)
    first = slot.take()
    slot.give_back(first)
    out = outputs()
    ptr = out.data.ptr
    del out
    seen = {}
    cupy = pytest.importorskip("cupy")
    allocator = cupy.cuda.get_allocator()  # the fixture's host allocator (set per thread)

    def other_thread():
        with cupy.cuda.using_allocator(allocator):
            workspace = slot.take()
            seen["workspace"] = workspace
            seen["output"] = outputs().data.ptr
            slot.give_back(workspace)
    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert seen["workspace"] is not first and seen["output"] != ptr
    assert len(slot.kept_streams()) == 2
    assert slot.take() is first            # this thread's own comes back to it


@pytest.mark.parametrize("direction", ["forward", "backward_filter"])
def test_winograd_prepared_call_that_raises_gives_its_workspace_back(fake_pool, monkeypatch, direction):
    """A call whose kept workspace is out (taken) when a launch or cuBLAS raises
    must not keep its bytes counted against the shared reuse budget: before the
    fix the dropped workspace took them along, and release_outputs() could no
    longer give them back (every failure shrank the budget for good).  The
    kernels, cuBLAS handle and device are faked: only the bookkeeping runs."""
    cupy = pytest.importorskip("cupy")
    from cupy.cuda import device as cuda_device
    from dnnprims import conv
    from dnnprims.algos import winograd
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 0)
    monkeypatch.setattr(cuda_device, "get_cublas_handle", lambda: 0)
    monkeypatch.setattr(winograd.FAMILY, "prepare", lambda *args, **kwargs: (lambda *arrays: None))
    fail = []

    def gemm(*args):
        if fail:
            raise RuntimeError("cuBLAS refused")
    monkeypatch.setattr(winograd, "_GEMM_RUN", {np.dtype(np.float32): gemm})
    problem = conv._describe((1, 4, 8, 8), (4, 4, 3, 3), (1, 1), (1, 1), (1, 1), 1, "NCHW", "float32")
    algorithm = winograd.WINOGRAD_F2 if direction == "forward" else winograd.WINOGRAD_WGRAD_F2
    monkeypatch.setattr(algorithm, "_plans", {})   # the plan made under the fake device stays here
    run = algorithm.prepare(problem, direction)
    a, b = _fake_array(problem.x_shape), _fake_array(problem.w_shape)
    out = _fake_array(problem.y_shape if direction == "forward" else problem.w_shape)
    run(a, b, out)                         # kept for stream 77 from now on
    assert _kernels._recycle_left < _kernels.RECYCLE_BUDGET_BYTES
    fail.append(True)
    with pytest.raises(RuntimeError, match="cuBLAS"):
        run(a, b, out)                     # takes the kept workspace, then raises
    _kernels.release_outputs()
    assert _kernels._recycle_left == _kernels.RECYCLE_BUDGET_BYTES


def test_winograd_full_graphs_capture_per_pointers_and_stop_after_misses(fake_pool, monkeypatch):
    """winograd.FULL_GRAPHS: the second call on a kept workspace captures the whole
    call (the GEMM graph only once a call does not run as a whole-call graph); a
    call with the same pointers is one graph launch and nothing else; new pointers
    capture again (FULL_GRAPH_CACHE kept, the least recently used dropped);
    FULL_GRAPH_MISSES graphs dropped without a hit stop the captures (the GEMM graph
    from then on).  Kernels, cuBLAS and graphs are faked."""
    cupy = pytest.importorskip("cupy")
    from dnnprims import conv
    from dnnprims.algos import winograd
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 0)
    monkeypatch.setattr(winograd, "FULL_GRAPHS", True)
    monkeypatch.setattr(winograd, "FULL_GRAPH_CACHE", 2)
    monkeypatch.setattr(winograd, "FULL_GRAPH_MISSES", 3)
    log = []

    def prepare(expr, grid, block, args, **kwargs):
        return lambda *arrays: log.append(("launch", expr.split("<")[0]))
    monkeypatch.setattr(winograd.FAMILY, "prepare", prepare)

    class Graph:
        def __init__(self, name):
            self.name = name

        def launch(self):
            log.append(("graph", self.name))

    class Gemm:
        captured = gemm_captures = 0
        user_capture = False

        def __call__(self, *args):
            log.append(("gemm",))

        def capturing(self):
            return Gemm.user_capture

        def capture(self, calls, stream_key=None):
            Gemm.gemm_captures += 1
            return Graph("gemm"), None

        def capture_work(self, work, stream_key=None):
            before = len(log)
            work()
            del log[before:]                 # captured, not run
            Gemm.captured += 1
            return Graph(f"whole{Gemm.captured}"), None
    monkeypatch.setattr(winograd, "_GEMM_RUN", {np.dtype(np.float32): Gemm()})
    problem = conv._describe((1, 4, 8, 8), (4, 4, 3, 3), (1, 1), (1, 1), (1, 1), 1, "NCHW", "float32")
    monkeypatch.setattr(winograd.WINOGRAD_F2, "_plans", {})
    run = winograd.WINOGRAD_F2.prepare(problem, "forward")
    a, b = _fake_array(problem.x_shape), _fake_array(problem.w_shape)
    out = _fake_array(problem.y_shape)

    def call(*arrays):
        log.clear()
        run(*arrays)
        return list(log)
    first = call(a, b, out)
    assert ("gemm",) in first and len([e for e in first if e[0] == "launch"]) == 2   # direct, then kept
    assert call(a, b, out) == [("graph", "whole1")]      # the whole call captured
    assert Gemm.gemm_captures == 0                       # the GEMM graph waits until it is needed
    assert call(a, b, out) == [("graph", "whole1")]      # same pointers: one launch
    # Inside a user's capture no graph of ours launches (CUDA refuses cudaGraphLaunch on a
    # capturing stream, which invalidates the user's capture): the kernels and the GEMM
    # go into it directly, and nothing is captured.
    Gemm.user_capture = True
    inside = call(a, b, out)
    assert ("gemm",) in inside and not [e for e in inside if e[0] == "graph"]
    assert Gemm.captured == 1 and Gemm.gemm_captures == 0
    Gemm.user_capture = False
    assert call(a, b, out) == [("graph", "whole1")]
    a2, a3, a4 = (_fake_array(problem.x_shape) for _ in range(3))
    assert call(a2, b, out) == [("graph", "whole2")]
    assert call(a, b, out) == [("graph", "whole1")]      # both kept (cache of 2)
    assert call(a3, b, out) == [("graph", "whole3")]     # drops whole2: least recently used, never hit
    assert call(a, b, out) == [("graph", "whole1")]      # the hot one stays (LRU)
    assert Gemm.captured == 3
    # Hits between fresh pointers do not defeat the stop rule (it counted misses in a row,
    # which each hit reset): whole2, whole3, whole4 dropped without a hit make
    # FULL_GRAPH_MISSES = 3, and the next miss stops the captures.
    assert call(a2, b, out) == [("graph", "whole4")]     # drops whole3
    assert call(a, b, out) == [("graph", "whole1")]
    assert call(a4, b, out) == [("graph", "whole5")]     # drops whole4
    assert call(a, b, out) == [("graph", "whole1")]
    assert Gemm.captured == 5 and Gemm.gemm_captures == 0
    stopped = call(a3, b, out)
    assert ("graph", "gemm") in stopped and ("launch", "winograd_input_transform") in stopped
    assert Gemm.captured == 5 and Gemm.gemm_captures == 1
    assert ("graph", "gemm") in call(a, b, out)          # for good, even where a graph was kept
    assert Gemm.captured == 5 and Gemm.gemm_captures == 1
    _kernels.release_outputs()


def test_winograd_graph_switches_read_the_environment_alike():
    """DNNPRIMS_WINOGRAD_FULL_GRAPHS is on by default and "=0 turns it off", as
    DNNPRIMS_WINOGRAD_GEMM_GRAPHS and the other switches: any other value leaves it
    on.  It kept the test of its default-off days (== "1"), so "true" or "yes"
    turned the default-on feature off."""
    import os
    import subprocess
    import sys
    probe = "from dnnprims.algos import winograd as w; print(w.FULL_GRAPHS, w.GEMM_GRAPHS)"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for value, want in (("true", ["True", "True"]), ("1", ["True", "True"]), ("0", ["False", "False"])):
        env = dict(os.environ, DNNPRIMS_WINOGRAD_FULL_GRAPHS=value, DNNPRIMS_WINOGRAD_GEMM_GRAPHS=value,
                   PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.split()[-2:] == want, value

def test_winograd_full_graph_keeps_its_cublas_workspace_alive(fake_pool, monkeypatch):
    """A captured graph replays its cuBLAS GEMM on the workspace that was set on the
    handle at capture (``capture_work`` returns it beside the graph: "must live as
    long as the graph").  Past _cublas.GRAPH_WORKSPACE_STREAMS streams that
    workspace is the capture's own, held by nothing else; the whole-call graph cache
    kept the graph alone, so the workspace went back to the pool while the graph
    still wrote it on every replay (a silent overwrite of whatever the pool handed
    that block to next).  Kernels, cuBLAS and graphs are faked."""
    import gc
    import weakref
    cupy = pytest.importorskip("cupy")
    from dnnprims import conv
    from dnnprims.algos import winograd
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 0)
    monkeypatch.setattr(winograd, "FULL_GRAPHS", True)
    monkeypatch.setattr(winograd.FAMILY, "prepare", lambda *args, **kwargs: (lambda *arrays: None))

    class Graph:
        launches = 0

        def launch(self):
            Graph.launches += 1

    class CublasWorkspace:   # what capture_work allocates when no per-stream one is shared
        pass
    made = []

    class Gemm:
        def __call__(self, *args):
            pass

        def _captured(self):
            keep = CublasWorkspace()
            made.append(weakref.ref(keep))
            return Graph(), keep

        def capture(self, calls, stream_key=None):
            return self._captured()

        def capture_work(self, work, stream_key=None):
            return self._captured()
    monkeypatch.setattr(winograd, "_GEMM_RUN", {np.dtype(np.float32): Gemm()})
    problem = conv._describe((1, 4, 8, 8), (4, 4, 3, 3), (1, 1), (1, 1), (1, 1), 1, "NCHW", "float32")
    monkeypatch.setattr(winograd.WINOGRAD_F2, "_plans", {})
    run = winograd.WINOGRAD_F2.prepare(problem, "forward")
    a, b, out = _fake_array(problem.x_shape), _fake_array(problem.w_shape), _fake_array(problem.y_shape)
    run(a, b, out)                          # direct; the workspace is kept from now on
    run(a, b, out)                          # captures the whole call (the GEMM graph waits: review6c)
    assert len(made) == 1
    launches = Graph.launches
    run(a, b, out)                          # replays the whole-call graph
    assert Graph.launches == launches + 1
    monkeypatch.setattr(winograd, "FULL_GRAPH_MISSES", 0)
    run(_fake_array(problem.x_shape), b, out)   # a miss past the limit: the GEMM graph is captured
    assert len(made) == 2
    gc.collect()
    assert all(ref() is not None for ref in made), "a cached graph's cuBLAS workspace was freed"
    _kernels.release_outputs()              # the workspace, its graphs and their cuBLAS workspaces go
    gc.collect()
    assert all(ref() is None for ref in made)


def test_winograd_call_inside_a_users_capture_runs_directly_and_captures_later(fake_pool, monkeypatch):
    """A user capturing our cached call into their own CUDA graph: our captures answer
    _cublas.NOT_NOW while their stream is capturing.  Those calls run directly (into
    the user's graph), and neither the workspace's GEMM graph nor the prepared call's
    whole-call graphs are turned off: the first call after the user's capture
    captures.  (Before: the second call's failed capture set ``workspace.graphs``
    for good, and the workspace never captured again.)  Kernels, cuBLAS and graphs
    are faked."""
    cupy = pytest.importorskip("cupy")
    from dnnprims import _cublas, conv
    from dnnprims.algos import winograd
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 0)
    monkeypatch.setattr(winograd, "FULL_GRAPHS", True)
    log, user_capturing = [], [False]

    def prepare(expr, grid, block, args, **kwargs):
        return lambda *arrays: log.append(("launch", expr.split("<")[0]))
    monkeypatch.setattr(winograd.FAMILY, "prepare", prepare)

    class Graph:
        def __init__(self, name):
            self.name = name

        def launch(self):
            log.append(("graph", self.name))

    class Gemm:
        def __call__(self, *args):
            log.append(("gemm",))

        def capture(self, calls, stream_key=None):
            return _cublas.NOT_NOW if user_capturing[0] else (Graph("gemm"), None)

        def capture_work(self, work, stream_key=None):
            return _cublas.NOT_NOW if user_capturing[0] else (Graph("whole"), None)
    monkeypatch.setattr(winograd, "_GEMM_RUN", {np.dtype(np.float32): Gemm()})
    problem = conv._describe((1, 4, 8, 8), (4, 4, 3, 3), (1, 1), (1, 1), (1, 1), 1, "NCHW", "float32")
    monkeypatch.setattr(winograd.WINOGRAD_F2, "_plans", {})
    run = winograd.WINOGRAD_F2.prepare(problem, "forward")
    a, b, out = _fake_array(problem.x_shape), _fake_array(problem.w_shape), _fake_array(problem.y_shape)

    def call():
        log.clear()
        run(a, b, out)
        return list(log)
    direct = call()                        # the first call: direct; the workspace is kept from now on
    assert ("gemm",) in direct
    user_capturing[0] = True
    assert [call() for _ in range(3)] == [direct] * 3     # calls 2-4 inside the user's capture
    user_capturing[0] = False
    assert call() == [("graph", "whole")]  # the next call captures, and replays from then on
    assert call() == [("graph", "whole")]
    _kernels.release_outputs()


# ---- fast-table keys (CPU: CuPy arrays over host memory, the algorithm faked) ---------

class _RecordingAlgorithm:
    """Stands in for a chosen convolution algorithm: its prepared launch
    returns which direction it was prepared for (the runner hands that back)."""
    name = "recording"
    fused_activations = frozenset()

    def prepare(self, problem, direction, has_bias=False, activation=None):
        return lambda a, b, out, bias=None: (direction, problem)


@pytest.fixture
def fake_conv(fake_pool, monkeypatch):
    """conv's GPU paths on host memory: device 0, a fresh memo, every choice a
    _RecordingAlgorithm."""
    cupy = pytest.importorskip("cupy")
    from dnnprims import conv
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 0)
    monkeypatch.setattr(conv, "_current_device", lambda: 0)
    memo = _validate.CallMemo()
    monkeypatch.setattr(conv, "_MEMO", memo)
    monkeypatch.setattr(conv, "_FAST", memo.fast)
    monkeypatch.setattr(conv, "choose", lambda *args, **kwargs: _RecordingAlgorithm())
    return conv


def test_conv_backward_data_and_filter_fast_keys_never_collide(fake_conv):
    """Backward data (dy, w, x_shape) and backward filter (x, dy, w_shape) share
    one fast table and their keys had the same layout: a same-padded n-channel
    convolution of a batch of n gives equal keys for dy (n, n, h, h), w (n, n, r, r),
    x_shape (n, n, h, h) and x (n, n, h, h), dy (n, n, r, r), w_shape (n, n, h, h)
    -- the second call then ran the first one's prepared backward data (a dx of
    the same shape as the dw asked for: a silent wrong result)."""
    conv = fake_conv
    n, h, r = 4, 5, 3
    a, b = _fake_array((n, n, h, h)), _fake_array((n, n, r, r))
    direction, problem = conv.conv2d_backward_data(a, b, (n, n, h, h), padding=1)
    assert direction == "backward_data" and len(conv._FAST) == 1
    direction, problem = conv.conv2d_backward_filter(a, b, (n, n, h, h), padding=1)
    assert direction == "backward_filter" and problem.w_shape == (n, n, h, h) and problem.R == h
    assert len(conv._FAST) == 2
    # each now hits its own entry
    assert conv.conv2d_backward_data(a, b, (n, n, h, h), padding=1)[0] == "backward_data"
    assert conv.conv2d_backward_filter(a, b, (n, n, h, h), padding=1)[0] == "backward_filter"
    assert len(conv._FAST) == 2


def test_fft_cufft_plans_are_per_stream(fake_pool, monkeypatch):
    """A cuFFT plan has one work area, and PlanNd.fft sets the plan's stream and
    then executes (the GIL released between): a plan shared by two streams ran
    two transforms in one work area at once, and with two threads one thread's
    transform could run on the other's stream (out of order with its own
    kernels).  The plans are kept per stream (a setup, shared, hands out the
    current stream's)."""
    cupy = pytest.importorskip("cupy")
    import sys
    from types import SimpleNamespace
    from dnnprims.algos import fft
    stream, _ = fake_pool

    class Plan:
        def __init__(self, *args):
            pass

    # cuFFT faked (no libcufft needed): only the plans' identities are checked
    cufft = SimpleNamespace(PlanNd=Plan, CUFFT_R2C=0x2a, CUFFT_C2R=0x2c, CUFFT_D2Z=0x6a, CUFFT_Z2D=0x6c)
    monkeypatch.setitem(sys.modules, "cupy.cuda.cufft", cufft)
    monkeypatch.setitem(vars(cupy.cuda), "cufft", cufft)   # setattr would import the real one first
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 0)
    monkeypatch.setattr(fft, "_plans", {})
    monkeypatch.setattr(fft, "_setups", {})
    monkeypatch.setattr(fft, "_twiddle_matrices", lambda *args: (None, None))
    g = SimpleNamespace(T=(16, 16), extent=(5, 5), channels_in=3, channels_out=4, frequencies=16 * 9)
    f32 = np.dtype(np.float32)
    for inverse in (False, True):
        stream.ptr = 77
        plan, spatial = fft._plan(cupy, inverse, f32, (16, 16), 6), fft._spatial_plan(inverse, f32, (16, 16), 6)
        assert fft._plan(cupy, inverse, f32, (16, 16), 6) is plan     # cached on its stream
        assert fft._spatial_plan(inverse, f32, (16, 16), 6) is spatial
        stream.ptr = 78
        assert fft._plan(cupy, inverse, f32, (16, 16), 6) is not plan
        assert fft._spatial_plan(inverse, f32, (16, 16), 6) is not spatial
        stream.ptr = 77
        assert fft._plan(cupy, inverse, f32, (16, 16), 6) is plan
    # a setup (twiddle matrices, shared by every stream) hands out the current stream's plans
    setup = fft._setup(cupy, g, 2, f32)
    plans = setup.plans(cupy)
    assert setup.plans(cupy) == plans
    stream.ptr = 78
    assert fft._setup(cupy, g, 2, f32) is setup
    assert all(a is not b for a, b in zip(setup.plans(cupy), plans))
    stream.ptr = 77
    assert setup.plans(cupy) == plans


def test_batchnorm_stream_workspaces_are_bounded(monkeypatch):
    """Batch norm keeps one workspace (barrier counters, partials) per stream:
    a program that makes a new stream per step kept one per stream for good.
    Beyond MAX_WORKSPACES the oldest is dropped (plans that hold its arrays
    keep them alive); a live stream's own stays while it is among the newest."""
    from types import SimpleNamespace
    from dnnprims import normalization
    stream = SimpleNamespace(ptr=1000)
    cuda = SimpleNamespace(runtime=SimpleNamespace(getDevice=lambda: 0), get_current_stream=lambda: stream)
    cp = SimpleNamespace(cuda=cuda, zeros=lambda n, dtype: np.zeros(n, dtype))
    monkeypatch.setattr(normalization, "_WORKSPACES", {})
    limit = getattr(normalization, "MAX_WORKSPACES", 64)   # (the old code had no bound)
    first = normalization._stream_workspace(cp)
    assert normalization._stream_workspace(cp) is first
    for ptr in range(1001, 1001 + 3 * limit):
        stream.ptr = ptr
        work = normalization._stream_workspace(cp)
        assert normalization._stream_workspace(cp) is work
        assert len(normalization._WORKSPACES) <= limit
    stream.ptr = 1000
    assert normalization._stream_workspace(cp) is not first     # dropped long ago: a new one
    # _fused_grid's counters belong to the workspace it returns
    monkeypatch.setattr(normalization, "_RESIDENT", {(0, "k"): 64})
    launch = SimpleNamespace(splits=2)
    grid, per_round, work = normalization._fused_grid(cp, launch, "k", 12)
    assert work is normalization._stream_workspace(cp) and work.arrive.size >= 24


def test_pool_backward_fast_entry_never_skips_checking_a_y_of_another_type(fake_pool, monkeypatch):
    """pool_backward's fast key holds y's shape and dtype only for an exact
    cupy.ndarray: a subclass gave False there, the validated call still made an
    entry, and from then on any y of that type -- of any shape or dtype --
    passed unchecked.  The launch is faked (it does not read y)."""
    cupy = pytest.importorskip("cupy")
    from cupy.cuda.memory import MemoryPointer, UnownedMemory
    from dnnprims import pooling

    class Sub(cupy.ndarray):
        pass

    host = np.zeros(4096, np.uint8)
    memory = UnownedMemory(host.ctypes.data, host.nbytes, host, device_id=0)

    def sub(shape):
        return Sub(shape, np.float32, memptr=MemoryPointer(memory, 0))

    launched = []
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 0)
    monkeypatch.setattr(pooling, "_current_device", lambda: 0)
    monkeypatch.setattr(pooling, "_MEMO", _validate.CallMemo())
    monkeypatch.setattr(pooling._Call, "run", lambda self, direction, arrays: launched.append(direction)
                        or (lambda *arrays: launched.append("fast")))
    x, dy = _fake_array((1, 2, 8, 8)), _fake_array((1, 2, 4, 4))
    pooling.pool_backward(dy, x, sub((1, 2, 4, 4)), 2)
    pooling.pool_backward(dy, x, sub((1, 2, 4, 4)), 2)
    with pytest.raises(ValueError, match="y must have shape"):
        pooling.pool_backward(dy, x, sub((1, 2, 3, 3)), 2)
    assert "fast" not in launched


@pytest.mark.parametrize("first", [0.0, -0.0])
@pytest.mark.parametrize("mode", ["leaky_relu", "elu"])
def test_activation_alpha_minus_zero_gives_the_same_bits_cached_or_not(fake_pool, monkeypatch, mode, first):
    """alpha=-0.0 == 0.0, so the fast and memo keys (and the plan caches) took one
    for the other: a cached call ran with the sign of whichever came first, and
    leaky_relu / elu give zeros of alpha's sign times x's on the negative side
    -- other bits than the uncached call and the NumPy path.  A zero alpha now
    runs as 0.0.  The launch is faked; what it would compute is the oracle's
    result for the alpha it was prepared with."""
    pytest.importorskip("cupy")
    from dnnprims import activations
    from dnnprims.reference import activations as reference
    monkeypatch.setattr(activations._validate._cupy.cuda.runtime, "getDevice", lambda: 0)
    monkeypatch.setattr(activations, "_current_device", lambda: 0)
    memo = _validate.CallMemo()
    monkeypatch.setattr(activations, "_MEMO", memo)
    monkeypatch.setattr(activations, "_FAST", memo.fast)
    ran = []
    monkeypatch.setattr(activations, "_prepare", lambda direction, mode, approximate, alpha, n, dtype:
                        lambda *arrays: ran.append(alpha))
    x, dy = _fake_array((4, 8)), _fake_array((4, 8))
    xn, dyn = np.array([-2.0, -0.5, 0.0, 3.0]), np.array([1.0, -1.0, 1.0, 1.0])
    for alpha in (first, -first, first, -first):
        activations.activation(x, mode, alpha=alpha)
        assert reference.activation(xn, mode, ran[-1]).tobytes() == \
            activations.activation(xn, mode, alpha=alpha).tobytes()
        activations.activation_backward(dy, x, mode, alpha=alpha)
        assert reference.activation_backward(dyn, xn, mode, ran[-1]).tobytes() == \
            activations.activation_backward(dyn, xn, mode, alpha=alpha).tobytes()


def test_release_outputs_keeps_what_cached_plans_launch_with_and_says_so(monkeypatch):
    """release_outputs() said "call before free_all_blocks to return it all", but
    batch norm's stream workspaces, its plans' statistics and constants and the
    FFT / DFT setups stay: cached plans hold them and launch with their pointers
    (DFT's run keeps its setup as run.setup), so dropping them would free
    nothing.  It keeps them, and its docstring and the README now say which."""
    import pathlib
    from dnnprims import normalization
    from dnnprims.algos import dft, fft
    kept = {(normalization, "_WORKSPACES"): {("device", "stream"): object()},
            (normalization, "_CONSTANTS"): {("device", 1.0, 8, "float32"): object()},
            (fft, "_setups"): {"key": object()}, (dft, "_setups"): {"key": object()}}
    for (module, name), table in kept.items():
        monkeypatch.setattr(module, name, dict(table))
    _kernels.release_outputs()
    for (module, name), table in kept.items():
        assert getattr(module, name) == table
    doc = " ".join(_kernels.release_outputs.__doc__.split())
    assert "return it all" not in doc
    assert all(words in doc for words in ("Not dropped", "batch norm's per-stream workspaces",
                                           "FFT / DFT setups", "cuFFT plans"))
    readme = " ".join((pathlib.Path(__file__).parent.parent / "README.md").read_text().split())
    assert "to return everything" not in readme and "batch norm's per-stream workspaces, FFT / DFT setups" in readme


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
@pytest.mark.parametrize("first", ["backward_data", "backward_filter"])
def test_conv_backward_data_and_filter_with_equal_shapes_on_the_gpu(gpu, rng, first):
    """The GPU check of test_conv_backward_data_and_filter_fast_keys_never_collide:
    a same-padded 4-channel convolution of a batch of 4, backward data then
    backward filter (and the other order) on arrays of the same shapes, each
    against the float64 reference, twice (the second call: the fast path)."""
    from dnnprims import conv
    a = random_array(rng, (4, 4, 5, 5), np.float32)
    b = random_array(rng, (4, 4, 3, 3), np.float32)
    A, B = gpu.asarray(a), gpu.asarray(b)
    calls = {"backward_data": (conv.conv2d_backward_data,
                               conv.conv2d_backward_data(a.astype(F64), b.astype(F64), (4, 4, 5, 5), padding=1)),
             "backward_filter": (conv.conv2d_backward_filter,
                                 conv.conv2d_backward_filter(a.astype(F64), b.astype(F64), (4, 4, 5, 5), padding=1))}
    order = [first, "backward_filter" if first == "backward_data" else "backward_data"]
    for _ in range(2):
        for direction in order:
            call, want = calls[direction]
            assert_close(call(A, B, (4, 4, 5, 5), padding=1), want, np.float32, what=direction)


@pytest.mark.gpu
def test_fft_conv_on_two_streams_from_two_threads(gpu, rng):
    """The GPU check of test_fft_cufft_plans_are_per_stream: two threads, each on
    its own stream, run the same FFT convolution on different data many times;
    every result matches its reference (one shared cuFFT plan could mix the two
    transforms' work areas, or run one on the other thread's stream)."""
    from dnnprims import conv
    w = random_array(rng, (8, 8, 7, 7), np.float32)
    xs = [random_array(rng, (4, 8, 32, 32), np.float32) for _ in range(2)]
    wants = [conv.conv2d_forward(x.astype(F64), w.astype(F64), padding=3) for x in xs]
    W = gpu.asarray(w)
    errors = []

    def work(i):
        try:
            with gpu.cuda.Stream(non_blocking=True) as stream:
                X = gpu.asarray(xs[i])
                ys = [conv.conv2d_forward(X, W, padding=3, algo="fft") for _ in range(50)]
                stream.synchronize()
                for y in ys:
                    assert_close(y, wants[i], np.float32)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


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


# ---- batch norm and pooling (helper host2) -------------------------------------------

def _bn_reference(x, g, b, rm, rv, **options):
    """The float64 reference; float64 running statistics are updated in place (like the GPU's)."""
    from dnnprims import normalization
    return normalization.batchnorm(*(None if a is None else np.asarray(a, F64) for a in (x, g, b, rm, rv)),
                                   **options)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4, 6, 7, 7), (3, 5, 4, 8), (2, 3, 64, 65)])
def test_batchnorm_fast_path_updates_running_statistics_in_place_and_checks(gpu, rng, shape):
    """7x7 (fused training, flat inference), inner a multiple of the vector (chunk
    kernels), a channel over two chunks (two-pass training)."""
    from dnnprims import normalization
    c = shape[1]
    x = random_array(rng, shape, np.float32)
    g, b = random_array(rng, (c,), np.float32), random_array(rng, (c,), np.float32)
    rm0, rv0 = random_array(rng, (c,), np.float32), random_array(rng, (c,), np.float32, 0.5, 2)
    X, G, B = gpu.asarray(x), gpu.asarray(g), gpu.asarray(b)
    RM, RV = gpu.asarray(rm0), gpu.asarray(rv0)
    rm64, rv64 = rm0.astype(F64), rv0.astype(F64)
    want = None
    for call in range(3):  # validated, then twice through the fast table
        fast = len(normalization._MEMO.fast)
        y, mean, invstd = normalization.batchnorm(X, G, B, RM, RV, training=True, momentum=0.25,
                                                  return_stats=True)
        want = normalization.batchnorm(x.astype(F64), g.astype(F64), b.astype(F64), rm64, rv64,
                                       training=True, momentum=0.25, return_stats=True)
        if call:
            assert len(normalization._MEMO.fast) == fast
        for got, ref, what in zip((y, mean, invstd), want, ("y", "mean", "invstd")):
            assert_close(got, ref, np.float32, what=what)
        assert_close(RM, rm64, np.float32, what="running_mean")    # updated in place, every call
        assert_close(RV, rv64, np.float32, what="running_var")
    # Returned statistics are fresh arrays each call; without return_stats y alone.
    y2, mean2, _ = normalization.batchnorm(X, G, B, training=True, return_stats=True)
    y3, mean3, _ = normalization.batchnorm(X, G, B, training=True, return_stats=True)
    assert mean2.data.ptr != mean3.data.ptr and gpu.array_equal(mean2, mean3)
    y4 = normalization.batchnorm(X, G, B, training=True)
    assert gpu.array_equal(y4, y2) and gpu.array_equal(mean2, mean3)
    assert_close(mean2, want[1], np.float32)
    # Options of another exact type are not the cached entry: validated (and refused).
    fast = len(normalization._MEMO.fast)
    with pytest.raises(TypeError, match="momentum"):
        normalization.batchnorm(X, G, B, RM, RV, training=True, momentum=True)
    with pytest.raises(TypeError, match="training"):
        normalization.batchnorm(X, G, B, RM, RV, training=1, momentum=0.25)
    with pytest.raises(ValueError, match="eps"):
        normalization.batchnorm(X, G, B, RM, RV, momentum=0.25, eps=-1)
    assert len(normalization._MEMO.fast) == fast
    ref = _bn_reference(x, g, b, None, None, training=True, eps=1.0)
    for eps in (1, 1.0, 1, 1.0):  # int and float: two entries, both validated once
        assert_close(normalization.batchnorm(X, G, B, training=True, eps=eps), ref, np.float32)
    assert len(normalization._MEMO.fast) == fast + 2
    # Views take the checked path (copies; running statistics written back).
    rm_view, rv_view = gpu.asarray(np.repeat(rm0, 2))[::2], gpu.asarray(np.repeat(rv0, 2))[::2]
    rm_ref, rv_ref = rm0.astype(F64), rv0.astype(F64)
    for X_view in (_unaligned_copy(gpu, x), _strided_copy(gpu, x), X):
        got = normalization.batchnorm(X_view, G, B, rm_view, rv_view, training=True)
        expect = _bn_reference(x, g, b, rm_ref, rv_ref, training=True)
        assert_close(got, expect, np.float32)
        assert_close(rm_view, rm_ref, np.float32, what="running_mean view")
        assert_close(rv_view, rv_ref, np.float32, what="running_var view")
    G_view = gpu.asarray(np.repeat(g, 2))[::2]
    assert_close(normalization.batchnorm(X, G_view, B, training=True),
                 _bn_reference(x, g, b, None, None, training=True), np.float32)
    # Inference: the running statistics are read, not written; gamma / beta None.
    infer = _bn_reference(x, None, None, rm0, rv0, training=False, return_stats=True)
    for _ in range(3):
        rm_in, rv_in = gpu.asarray(rm0), gpu.asarray(rv0)
        got = normalization.batchnorm(X, None, None, rm_in, rv_in, training=False, return_stats=True)
        for a, r in zip(got, infer):
            assert_close(a, r, np.float32)
        assert gpu.array_equal(rm_in, gpu.asarray(rm0)) and gpu.array_equal(rv_in, gpu.asarray(rv0))
    with pytest.raises(ValueError, match="required"):
        normalization.batchnorm(X, None, None, training=False)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4, 6, 7, 7), (2, 3, 64, 65)])
def test_batchnorm_backward_fast_path_checks(gpu, rng, shape):
    from dnnprims import normalization
    c = shape[1]
    x, dy = random_array(rng, shape, np.float32), random_array(rng, shape, np.float32)
    g = random_array(rng, (c,), np.float32)
    X, dY, G = gpu.asarray(x), gpu.asarray(dy), gpu.asarray(g)
    _, mean, invstd = normalization.batchnorm(X, G, None, training=True, return_stats=True)
    want = normalization.batchnorm_backward(dy.astype(F64), x.astype(F64), g.astype(F64))
    want_no_gamma = normalization.batchnorm_backward(dy.astype(F64), x.astype(F64), None)
    for stats in (dict(mean=mean, invstd=invstd), {}):
        for call in range(3):
            fast = len(normalization._MEMO.fast)
            got = normalization.batchnorm_backward(dY, X, G, **stats)
            if call:
                assert len(normalization._MEMO.fast) == fast
            for a, r, what in zip(got, want, ("dx", "dgamma", "dbeta")):
                assert_close(a, r, np.float32, what=what)
            for a, r in zip(normalization.batchnorm_backward(dY, X, None, **stats), want_no_gamma):
                assert_close(a, r, np.float32)
    fast = len(normalization._MEMO.fast)
    with pytest.raises(TypeError, match="eps"):
        normalization.batchnorm_backward(dY, X, G, mean=mean, invstd=invstd, eps=True)
    with pytest.raises(TypeError, match="dtype"):
        normalization.batchnorm_backward(dY.astype(np.float64), X, G, mean=mean, invstd=invstd)
    with pytest.raises(ValueError, match="invstd"):
        normalization.batchnorm_backward(dY, X, G, mean=mean, invstd=invstd[:-1])
    assert len(normalization._MEMO.fast) == fast
    for dY_view in (_unaligned_copy(gpu, dy), _strided_copy(gpu, dy)):
        for a, r in zip(normalization.batchnorm_backward(dY_view, X, G, mean=mean, invstd=invstd), want):
            assert_close(a, r, np.float32)
    for a, r in zip(normalization.batchnorm_backward(dY, _unaligned_copy(gpu, x), G, mean=mean,
                                                     invstd=invstd), want):
        assert_close(a, r, np.float32)


@pytest.mark.gpu
def test_batchnorm_fast_path_per_stream(gpu, rng):
    """The fused kernels' barrier workspace is per stream: so are plans and fast entries."""
    from dnnprims import normalization
    x = random_array(rng, (8, 16, 7, 7), np.float32)
    X = gpu.asarray(x)
    gpu.cuda.Device().synchronize()  # the streams below do not wait for the null stream
    want = _bn_reference(x, None, None, None, None, training=True)
    streams = [gpu.cuda.Stream(non_blocking=True) for _ in range(2)]
    results = []
    for _ in range(2):
        for s in streams:
            with s:
                results.append(normalization.batchnorm(X, None, None, training=True))
    for s in streams:
        s.synchronize()
    for y in results:
        assert_close(y, want, np.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,window,stride,padding,mode", [
    ((2, 4, 14, 16), 3, 2, 1, "max"),       # k3s2 vector kernels
    ((2, 4, 7, 7), 7, None, 0, "avg"),      # global average
    ((2, 4, 9, 11), (3, 2), (2, 1), (1, 0), "max"),  # overlapping: two launches backward
])
def test_pool_fast_path_checks_option_types_and_views(gpu, rng, shape, window, stride, padding, mode):
    from dnnprims import pooling
    x = random_array(rng, shape, np.float32)
    X = gpu.asarray(x)
    opts = dict(stride=stride, padding=padding, mode=mode)
    want = pooling.pool(x.astype(F64), window, **opts)
    dy = random_array(rng, want.shape, np.float32)
    dY = gpu.asarray(dy)
    want_dx = pooling.pool_backward(dy.astype(F64), x.astype(F64), None, window, **opts)
    for call in range(3):
        fast = len(pooling._MEMO.fast)
        y = pooling.pool(X, window, **opts)
        dx = pooling.pool_backward(dY, X, y, window, **opts)
        dx_no_y = pooling.pool_backward(dY, X, None, window, **opts)
        if call:
            assert len(pooling._MEMO.fast) == fast
        assert_close(y, want, np.float32)
        assert_close(dx, want_dx, np.float32)
        assert_close(dx_no_y, want_dx, np.float32)
    pair = lambda v: v if type(v) is tuple else (v, v)  # noqa: E731
    fast = len(pooling._MEMO.fast)
    with pytest.raises(TypeError, match="padding"):
        pooling.pool(X, window, stride=stride, padding=tuple(float(p) for p in pair(padding)), mode=mode)
    with pytest.raises(TypeError, match="window"):
        pooling.pool(X, (pair(window)[0], True), stride=stride, padding=padding, mode=mode)
    with pytest.raises(TypeError, match="count_include_pad"):
        pooling.pool(X, window, count_include_pad=1, **opts)
    with pytest.raises(ValueError, match="mode"):
        pooling.pool(X, window, stride=stride, padding=padding, mode="MAX")
    with pytest.raises(TypeError, match="dtype"):
        pooling.pool_backward(dY.astype(np.float64), X, None, window, **opts)
    with pytest.raises(ValueError, match="y"):
        pooling.pool_backward(dY, X, X, window, **opts)
    assert len(pooling._MEMO.fast) == fast
    # Equal options of other (valid) types, and views, give the same result.
    assert_close(pooling.pool(X, pair(window), stride=stride if stride is None else pair(stride),
                              padding=pair(padding), mode=mode), want, np.float32)
    assert_close(pooling.pool(X, np.int64(pair(window)[0]) if type(window) is int else window, **opts),
                 want, np.float32)
    for X_view in (_unaligned_copy(gpu, x), _strided_copy(gpu, x)):
        assert_close(pooling.pool(X_view, window, **opts), want, np.float32)
        assert_close(pooling.pool_backward(dY, X_view, None, window, **opts), want_dx, np.float32)
    for dY_view in (_unaligned_copy(gpu, dy), _strided_copy(gpu, dy)):
        assert_close(pooling.pool_backward(dY_view, X, None, window, **opts), want_dx, np.float32)


# ---- output slots on the GPU (helper launch) -------------------------------------------

@pytest.mark.gpu
def test_fast_paths_reuse_a_dropped_output_and_never_one_still_held(gpu, rng):
    """Every fast path takes its output from an OutputSlot: a call whose last
    output was dropped gets that array back (same pointer) with the right
    values; an output still held is never written by a later call."""
    import dnnprims as dp
    _kernels.release_outputs()            # earlier tests may have used up the budget
    f32 = np.float32
    x = random_array(rng, (2, 8, 12, 12), f32)
    w = random_array(rng, (8, 8, 3, 3), f32)
    dy = random_array(rng, (2, 8, 12, 12), f32)
    g, b = random_array(rng, (8,), f32), random_array(rng, (8,), f32)
    rows = random_array(rng, (16, 40), f32)
    pooled = dp.pool(x.astype(F64), 2, mode="max")
    cases = {
        "softmax": (lambda a: dp.softmax(a), rows),
        "log_softmax backward": (lambda a: dp.log_softmax_backward(a, gpu.asarray(rows)), rows),
        "relu": (lambda a: dp.activation(a, "relu"), x),
        "silu backward": (lambda a: dp.activation_backward(a, gpu.asarray(x), "silu"), dy),
        "pool": (lambda a: dp.pool(a, 2, mode="max"), x),
        "pool backward": (lambda a: dp.pool_backward(a, gpu.asarray(x), None, 2, mode="avg"),
                          random_array(rng, pooled.shape, f32)),
        "batchnorm": (lambda a: dp.batchnorm(a, gpu.asarray(g), gpu.asarray(b), training=True), x),
        "batchnorm backward dgamma": (
            lambda a: dp.batchnorm_backward(a, gpu.asarray(x), gpu.asarray(g))[1], dy),
        "conv forward": (lambda a: dp.conv2d_forward(a, gpu.asarray(w), padding=1, algo="implicit_gemm"), x),
        "conv backward data": (lambda a: dp.conv2d_backward_data(a, gpu.asarray(w), x.shape, padding=1,
                                                                 algo="implicit_gemm"), dy),
        "conv backward filter atomic": (
            lambda a: dp.conv2d_backward_filter(gpu.asarray(x), a, w.shape, padding=1,
                                                algo="implicit_gemm_wgrad_atomic"), dy),
    }
    for name, (call, data) in cases.items():
        first, second = data, data[::-1].copy() * f32(0.5) + f32(0.25)
        A, B = gpu.asarray(first), gpu.asarray(second)
        want_a, want_b = call(A).get(), call(B).get()    # validated, then the fast table
        kept = call(A)
        got = call(B)
        assert got.data.ptr != kept.data.ptr, name
        ptr = got.data.ptr
        del got
        again = call(B)
        assert again.data.ptr == ptr, name               # the dropped output came back
        other = call(A)                                   # again is held: a new array
        assert other.data.ptr not in (ptr, kept.data.ptr), name
        gpu.cuda.get_current_stream().synchronize()
        for got, want in ((kept, want_a), (again, want_b), (other, want_a)):   # atomics: not bitwise
            np.testing.assert_allclose(got.get(), want, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_filter"])
def test_winograd_workspace_per_stream(gpu, rng, direction, monkeypatch):
    """A cached Winograd call keeps its workspace per stream (same stream: the
    same memory; another stream: its own), with results equal to the reference
    on every call, stream and pair of arrays; release_outputs drops the
    workspaces."""
    import dnnprims as dp
    _kernels.release_outputs()
    f32 = np.float32
    x = random_array(rng, (2, 8, 10, 10), f32)
    w = random_array(rng, (8, 8, 3, 3), f32)
    dy = random_array(rng, (2, 8, 10, 10), f32)
    if direction == "forward":
        algo = "winograd_f4x4_3x3"
        call = lambda a, b: dp.conv2d_forward(a, b, padding=1, algo=algo)   # noqa: E731
        reference = lambda a, b: dp.conv2d_forward(a, b, padding=1)   # noqa: E731
        args = (x, w)
    elif direction == "backward_data":
        algo = "winograd_f4x4_3x3"
        call = lambda a, b: dp.conv2d_backward_data(a, b, x.shape, padding=1, algo=algo)   # noqa: E731
        reference = lambda a, b: dp.conv2d_backward_data(a, b, x.shape, padding=1)   # noqa: E731
        args = (dy, w)
    else:
        algo = "winograd_wgrad_f3x3_2x2"
        call = lambda a, b: dp.conv2d_backward_filter(a, b, w.shape, padding=1, algo=algo)   # noqa: E731
        reference = lambda a, b: dp.conv2d_backward_filter(a, b, w.shape, padding=1)   # noqa: E731
        args = (x, dy)
    other = tuple(a[::-1].copy() * f32(0.5) + f32(0.25) for a in args)
    want = reference(*(a.astype(F64) for a in args))
    want_other = reference(*(a.astype(F64) for a in other))
    A, B = (gpu.asarray(a) for a in args)
    A2, B2 = (gpu.asarray(a) for a in other)
    taken = []
    original_take = _kernels.WorkspaceSlot.take

    def take(self):
        workspace = original_take(self)
        taken.append((workspace, workspace.array.data.ptr, workspace.stream))
        return workspace
    monkeypatch.setattr(_kernels.WorkspaceSlot, "take", take)
    for _ in range(3):
        assert_close(call(A, B), want, np.float32)
        assert_close(call(A2, B), reference(other[0].astype(F64), args[1].astype(F64)), np.float32)
        assert_close(call(A2, B2), want_other, np.float32)
    default = [(ws, ptr) for ws, ptr, s in taken]
    assert len({ptr for _, ptr in default[1:]}) == 1 and default[1][0] is default[-1][0]
    side = gpu.cuda.Stream(non_blocking=True)
    taken.clear()
    with side:
        for _ in range(3):
            assert_close(call(A, B), want, np.float32)
        side.synchronize()
    assert all(s == side.ptr for _, _, s in taken)
    assert not {ptr for _, ptr, _ in taken} & {ptr for _, ptr in default}
    assert_close(call(A2, B2), want_other, np.float32)       # the default stream's workspace again
    slots = [s for s in _kernels._SLOTS if isinstance(s, _kernels.WorkspaceSlot) and s.kept_streams()]
    assert slots
    _kernels.release_outputs()
    assert not any(s.kept_streams() for s in slots)
    assert_close(call(A, B), want, np.float32)
    gpu.cuda.Device().synchronize()


@pytest.mark.parametrize("direction", ["forward", "backward_data"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_winograd_gemm_graph_is_captured_once_per_workspace(gpu, rng, direction, dtype, monkeypatch):
    """From the second call on a kept workspace the cached Winograd call's GEMM
    replays as a CUDA graph (winograd.GEMM_GRAPHS): one capture per workspace,
    and every call -- new values in the same arrays, new arrays, graphs turned
    off -- equals the reference."""
    import dnnprims as dp
    from dnnprims import _cublas
    from dnnprims.algos import winograd
    # The GEMM graph alone: the whole-call graph (on by default) captures too and has its
    # own test (test_winograd_full_graph_matches_reference_on_every_pointer_set).
    monkeypatch.setattr(winograd, "FULL_GRAPHS", False)
    _kernels.release_outputs()
    x = random_array(rng, (1, 16, 12, 12), dtype)
    w = random_array(rng, (16, 16, 3, 3), dtype)
    if direction == "forward":
        call = lambda a, b: dp.conv2d_forward(a, b, padding=1, algo="winograd_f4x4_3x3")   # noqa: E731
        reference = lambda a, b: dp.conv2d_forward(a, b, padding=1)   # noqa: E731
    else:
        call = lambda a, b: dp.conv2d_backward_data(a, b, x.shape, padding=1,   # noqa: E731
                                                    algo="winograd_f4x4_3x3")
        reference = lambda a, b: dp.conv2d_backward_data(a, b, x.shape, padding=1)   # noqa: E731
    A, W = gpu.asarray(x), gpu.asarray(w)
    before = _cublas.captures
    for _ in range(4):
        a = random_array(rng, x.shape, dtype)
        A[...] = gpu.asarray(a)
        assert_close(call(A, W), reference(a.astype(F64), w.astype(F64)), dtype)
    assert not _cublas.CAPTURE_FAILURES
    assert _cublas.captures == before + 1
    A2, W2 = gpu.asarray(x[:, :, ::-1].copy()), gpu.asarray(w * dtype(0.5))
    assert_close(call(A2, W2), reference(x[:, :, ::-1].astype(F64), (w * dtype(0.5)).astype(F64)), dtype)
    assert _cublas.captures == before + 1        # the GEMM's pointers are the workspace's only
    monkeypatch.setattr(winograd, "GEMM_GRAPHS", False)
    for _ in range(2):
        assert_close(call(A, W), reference(a.astype(F64), w.astype(F64)), dtype)
    assert _cublas.captures == before + 1
    gpu.cuda.Device().synchronize()


@pytest.mark.parametrize("direction", ["forward", "backward_data"])
def test_winograd_full_graph_matches_reference_on_every_pointer_set(gpu, rng, direction, monkeypatch):
    """winograd.FULL_GRAPHS (on by default): the whole cached call replayed as a
    graph per pointer set gives the reference on every call -- new values in the same
    arrays, new arrays, a bias, an input 4 bytes past a 16-byte boundary, a side
    stream."""
    import dnnprims as dp
    from dnnprims import _cublas
    from dnnprims.algos import winograd
    monkeypatch.setattr(winograd, "FULL_GRAPHS", True)
    _kernels.release_outputs()
    f32 = np.float32
    x = random_array(rng, (1, 16, 12, 12), f32)
    w = random_array(rng, (16, 16, 3, 3), f32)
    bias = random_array(rng, (16,), f32)
    if direction == "forward":
        def call(a, b, with_bias=False):
            return dp.conv2d_forward(a, b, gpu.asarray(bias) if with_bias else None, padding=1,
                                     algo="winograd_f4x4_3x3")

        def reference(a, b, with_bias=False):
            return dp.conv2d_forward(a, b, bias.astype(F64) if with_bias else None, padding=1)
    else:
        def call(a, b, with_bias=False):
            return dp.conv2d_backward_data(a, b, x.shape, padding=1, algo="winograd_f4x4_3x3")

        def reference(a, b, with_bias=False):
            return dp.conv2d_backward_data(a, b, x.shape, padding=1)
    A, W = gpu.asarray(x), gpu.asarray(w)
    before = _cublas.captures
    for i in range(5):
        a = random_array(rng, x.shape, f32)
        A[...] = gpu.asarray(a)
        assert_close(call(A, W), reference(a.astype(F64), w.astype(F64)), f32)
    assert not _cublas.CAPTURE_FAILURES and _cublas.captures == before + 1   # the whole call (GEMM graph: lazy)
    A2 = _unaligned_copy(gpu, x[:, ::-1])
    assert_close(call(A2, W, True), reference(x[:, ::-1].astype(F64), w.astype(F64), True), f32)
    side = gpu.cuda.Stream(non_blocking=True)
    with side:
        for _ in range(3):
            assert_close(call(A, W), reference(a.astype(F64), w.astype(F64)), f32)
        side.synchronize()
    gpu.cuda.Device().synchronize()


def _winograd_calls(dp, x_shape, direction):
    """(call, reference) of a winograd_f4x4_3x3 forward / backward-data call, pad 1."""
    if direction == "forward":
        return (lambda a, b: dp.conv2d_forward(a, b, padding=1, algo="winograd_f4x4_3x3"),
                lambda a, b: dp.conv2d_forward(a, b, padding=1))
    return (lambda a, b: dp.conv2d_backward_data(a, b, x_shape, padding=1, algo="winograd_f4x4_3x3"),
            lambda a, b: dp.conv2d_backward_data(a, b, x_shape, padding=1))


@pytest.mark.parametrize("direction", ["forward", "backward_data"])
def test_winograd_call_captured_into_a_users_graph(gpu, rng, direction):
    """A user capturing our cached call into a CUDA graph of theirs (review6a item 1).
    The second call on a kept workspace would capture graphs of ours; inside the
    user's capture it must not (no capture, nothing in CAPTURE_FAILURES): calls 2-4
    run directly, into the user's graph, whose replays compute with the input's
    values at replay; the first call after the user's capture captures ours."""
    import dnnprims as dp
    from dnnprims import _cublas
    _kernels.release_outputs()
    f32 = np.float32
    x = random_array(rng, (1, 16, 12, 12), f32)
    w = random_array(rng, (16, 16, 3, 3), f32)
    call, reference = _winograd_calls(dp, x.shape, direction)
    A, W = gpu.asarray(x), gpu.asarray(w)
    user = gpu.cuda.Stream(non_blocking=True)
    with user:
        assert_close(call(A, W), reference(x.astype(F64), w.astype(F64)), f32)   # call 1: direct, kept
        user.synchronize()
        before = _cublas.captures
        user.begin_capture()
        try:
            ys = [call(A, W) for _ in range(3)]
        finally:
            graph = user.end_capture()
        assert _cublas.captures == before and not _cublas.CAPTURE_FAILURES
        for _ in range(2):
            a = random_array(rng, x.shape, f32)
            A[...] = gpu.asarray(a)
            graph.launch()
            want = reference(a.astype(F64), w.astype(F64))
            for y in ys:
                assert_close(y, want, f32)
        assert_close(call(A, W), want, f32)                 # not captured by the user: captures ours
        assert _cublas.captures > before and not _cublas.CAPTURE_FAILURES
        user.synchronize()


@pytest.mark.parametrize("direction", ["forward", "backward_data"])
def test_winograd_graph_replayed_inside_a_users_capture(gpu, rng, direction):
    """The open half of review6a item 1 (notes/review6c.md): a cached call whose
    whole-call graph exists (the same pointers on calls 2 and 3), then captured into
    a user's graph.  CUDA refuses ``cudaGraphLaunch`` on a capturing stream (and the
    refusal invalidates the user's capture: the H100 run of session 8), so the call
    queries the stream and runs its kernels and GEMMs into the capture directly.
    Each replay of the user's graph must give the reference."""
    import dnnprims as dp
    from dnnprims import _cublas
    _kernels.release_outputs()
    f32 = np.float32
    x = random_array(rng, (1, 16, 12, 12), f32)
    w = random_array(rng, (16, 16, 3, 3), f32)
    call, reference = _winograd_calls(dp, x.shape, direction)
    A, W = gpu.asarray(x), gpu.asarray(w)
    user = gpu.cuda.Stream(non_blocking=True)
    with user:
        for _ in range(3):                                  # output dropped: the next call gets it back
            call(A, W)
        user.synchronize()
        assert _cublas.captures > 0 and not _cublas.CAPTURE_FAILURES
        A2 = gpu.asarray(x)
        user.begin_capture()
        try:
            y, y2 = call(A, W), call(A2, W)
        finally:
            graph = user.end_capture()
        for _ in range(2):
            a, a2 = random_array(rng, x.shape, f32), random_array(rng, x.shape, f32)
            A[...], A2[...] = gpu.asarray(a), gpu.asarray(a2)
            graph.launch()
            assert_close(y, reference(a.astype(F64), w.astype(F64)), f32)
            assert_close(y2, reference(a2.astype(F64), w.astype(F64)), f32)
        assert not _cublas.CAPTURE_FAILURES
        user.synchronize()
