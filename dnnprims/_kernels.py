"""The one kernel loader.

Each ``kernels/<family>.cu`` file is a *kernel family*: CUDA C++ templates
plus the list of name expressions (specialisations) the library may request.
A family is compiled per device and per kernel: the first launch of
``activation_forward<...>`` compiles every declared specialisation of
``activation_forward`` in one NVRTC call (CuPy also keeps the binary in its
on-disk cache), not the whole family -- a family of several kernels times
dtypes, index types and modes has hundreds of specialisations, over a minute
of NVRTC for the first call otherwise.  Every launch goes through
:meth:`KernelFamily.function`.  Nothing else in dnnprims compiles code.

Two ways to launch.  :meth:`KernelFamily.launch` takes every argument each
call (CuPy packs them: a few hundred nanoseconds per argument).  A hot path
that repeats one launch prepares it once with :meth:`KernelFamily.prepare`:
grid, block, shared memory and every fixed argument (NumPy scalars, plan
arrays such as tap tables) are packed into one buffer, and a call writes only
the data pointers of the arrays it is given (:data:`ARRAY0` ... in the
argument list mark where) and calls ``cuLaunchKernel`` -- about a microsecond
of Python for any number of arguments.

A kernel that synchronises its whole grid (blocks waiting for each other
through counters in global memory: batch norm's fused kernels) needs every
block resident at once.  It is launched with ``cooperative=True``
(``cuLaunchCooperativeKernel``): the driver guarantees co-residency -- whatever
else holds SMs: another stream, an MPS client, a smaller partition -- or
refuses the launch, and :class:`CooperativeLaunchRefused` tells the caller to
take its multi-launch path; :func:`co_resident_blocks` sizes such a grid.

A fast path also takes its output from an :class:`OutputSlot`, which hands
the previous output back when the caller has dropped it (no allocation).

Without a GPU, :func:`compile_with_nvrtc` compiles a family to PTX through
NVRTC alone; CI uses it to prove that every specialisation builds cleanly.
"""
import array
import functools
import hashlib
import os
import pathlib
import sys
import threading
import weakref

import numpy as np

from ._validate import INT32_LIMIT

_HERE = pathlib.Path(__file__).resolve().parent
# Installed wheels carry kernels/ as dnnprims/kernels; a source checkout has it
# beside the package.
KERNEL_DIR = _HERE / "kernels" if (_HERE / "kernels" / "common.cuh").exists() else _HERE.parent / "kernels"

# Options for every compile.  -std=c++17 for alias templates and if constexpr;
# no fast-math: results must match the references within the documented bounds.
COMPILE_OPTIONS = ("-std=c++17", f"-I{KERNEL_DIR}")

_FAMILIES = {}


def index_type(*sizes):
    """'int' when every size (element count) fits 32-bit indexing, else 'long long'."""
    return "int" if max(sizes, default=0) <= INT32_LIMIT else "long long"


@functools.lru_cache(maxsize=None)
def headers_digest(kernel_dir=None):
    """SHA-256 (first 16 hex digits) of every kernels/*.cuh, names and contents."""
    h = hashlib.sha256()
    for path in sorted(pathlib.Path(kernel_dir or KERNEL_DIR).glob("*.cuh")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


class KernelFamily:
    """One ``kernels/*.cu`` file and the specialisations the library launches."""

    def __init__(self, filename, name_expressions):
        self.filename = filename
        self.name_expressions = tuple(name_expressions)
        self._declared = frozenset(self.name_expressions)
        self._modules = {}  # (device id, kernel name) -> cupy.RawModule
        self._functions = {}  # (device id, expression) -> cupy.RawKernel: the hot-path lookup
        _FAMILIES[filename] = self

    @property
    def source(self):
        # CuPy's kernel cache keys on this text and the options, not on the headers
        # it includes: the headers' digest in the text (last, so compiler messages keep
        # the file's line numbers) makes a changed header compile afresh instead of
        # loading stale binaries.
        return (KERNEL_DIR / self.filename).read_text() + f"\n// headers {headers_digest()}\n"

    def function(self, expression):
        """The compiled kernel for one name expression on the current device."""
        import cupy

        device = cupy.cuda.runtime.getDevice()
        kernel = self._functions.get((device, expression))
        if kernel is not None:
            return kernel
        if expression not in self._declared:
            raise KeyError(f"{expression!r} is not a declared specialisation of {self.filename}")
        kernel_name = expression.split("<", 1)[0]
        module = self._modules.get((device, kernel_name))
        if module is None:
            group = tuple(e for e in self.name_expressions if e.split("<", 1)[0] == kernel_name)
            module = cupy.RawModule(code=self.source, options=COMPILE_OPTIONS, name_expressions=group)
            try:
                module.compile()
            except cupy.cuda.compiler.CompileException as e:
                raise RuntimeError(f"compiling {kernel_name} of kernel family {self.filename} failed:\n"
                                   f"{e.get_message()}") from None
            self._modules[(device, kernel_name)] = module
        kernel = self._functions[(device, expression)] = module.get_function(expression)
        return kernel

    def launch(self, expression, grid, block, args, shared_mem=0, cooperative=False):
        """Launch on the current device and current CuPy stream.

        ``cooperative=True``: a kernel with a grid barrier; the driver runs every
        block at once or raises :class:`CooperativeLaunchRefused` (nothing ran).
        Its arguments must then be CuPy arrays or NumPy scalars of the kernel's
        exact C types (:func:`kernel_parameters`)."""
        import cupy

        kernel = self._functions.get((cupy.cuda.runtime.getDevice(), expression))
        if kernel is None:
            kernel = self.function(expression)
        if cooperative:
            launch_cooperative(kernel.kernel, grid, block, args, shared_mem, expression)
            return
        # The device's cupy Function: skips RawKernel's per-call device lookup.
        kernel.kernel(grid, block, args, shared_mem=shared_mem)

    def prepare(self, expression, grid, block, args, shared_mem=0, cooperative=False, fallback=None):
        """A :class:`PreparedLaunch` of one specialisation on the current device.

        ``args`` is the kernel's argument list with :data:`ARRAY0`,
        :data:`ARRAY1`, ... where the call passes arrays (``ARRAY1`` is the
        call's second array; an index may repeat or go unused); every other
        entry is fixed now: a NumPy scalar of the exact C type, or a CuPy array
        that the launch keeps alive (a tap table).  Cache the result per device:
        it launches on the device it was prepared on.

        ``cooperative=True`` returns a :class:`CooperativeLaunch` (a grid
        barrier kernel); ``fallback(*arrays)`` is what it runs instead when the
        driver refuses the grid (None: the refusal is raised)."""
        if cooperative:
            return CooperativeLaunch(self.function(expression), grid, block, args, shared_mem, expression,
                                     fallback=fallback)
        return PreparedLaunch(self.function(expression), grid, block, args, shared_mem, expression)


class _ArrayArgument:
    """Marks where :meth:`PreparedLaunch.__call__` puts its k-th array."""

    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index

    def __repr__(self):
        return f"ARRAY{self.index}"


ARRAY0, ARRAY1, ARRAY2, ARRAY3, ARRAY4, ARRAY5, ARRAY6, ARRAY7 = (_ArrayArgument(i) for i in range(8))

_SCALAR_KINDS = frozenset("biuf")


def _launch_dims(grid, block):
    """(gx, gy, gz, bx, by, bz): Function.__call__'s normalisation, each at least 1."""
    grid = tuple(grid) + (1, 1)
    block = tuple(block) + (1, 1)
    return tuple(max(1, int(v)) for v in grid[:3] + block[:3])


def _pack_arguments(template, packed=False, expression=None):
    """The bytes of a kernel's arguments: (values, offsets, end, slots, keep).

    Each argument's value goes at ``offsets[i]`` of ``values`` (an
    ``array('Q')``, whose buffer never moves): its own 8-byte slot
    (kernelParams), or with ``packed`` the kernel's C parameter layout (each
    argument at its natural alignment -- pointers 8, a scalar its size).  A CuPy
    array is its data pointer (kept alive in ``keep``), a NumPy scalar its
    exact bytes, little-endian (the host and the device both are); an
    :data:`ARRAY0`-style marker is an empty pointer slot listed in ``slots`` as
    (item of ``values``, array index).  Anything else -- a Python int or float,
    None -- is refused: its C type would be a guess."""
    import cupy

    offsets, end = [], 0
    for a in template:
        size = a.dtype.itemsize if isinstance(a, np.generic) else 8
        offset = -(-end // size) * size if packed else 8 * len(offsets)
        offsets.append(offset)
        end = offset + size
    values = array.array("Q", bytes(8 * max(len(offsets), 1, -(-end // 8))))
    raw = memoryview(values).cast("B")
    slots, keep = [], []
    try:
        for i, (a, offset) in enumerate(zip(template, offsets)):
            if isinstance(a, _ArrayArgument):
                slots.append((offset // 8, a.index))
            elif isinstance(a, cupy.ndarray):
                values[offset // 8] = a.data.ptr
                keep.append(a)
            elif isinstance(a, np.generic) and a.dtype.kind in _SCALAR_KINDS and a.dtype.itemsize <= 8:
                raw[offset:offset + a.dtype.itemsize] = a.astype(a.dtype.newbyteorder("<")).tobytes()
            else:
                raise TypeError(f"argument {i} of {expression or 'a prepared launch'} must be a CuPy "
                                f"array, an ARRAY marker or a NumPy scalar of the kernel's C type, "
                                f"got {type(a).__name__}")
    finally:
        raw.release()
    return values, offsets, end, tuple(slots), tuple(keep)


def kernel_parameters(args, expression=None):
    """(values, params, keep) of one launch: ``params`` is cuLaunchKernel's
    ``kernelParams``, an ``array('Q')`` of one address per argument, each
    pointing at that argument's 8-byte slot in ``values`` (the layout of
    :func:`_pack_arguments` without markers: a CuPy array's data pointer, a
    NumPy scalar's bytes at the slot's start -- the host, like the device, is
    little-endian).  All three must stay alive until the launch call returns
    (the driver copies the values at launch).  A per-call path: no copy of
    the checks of _pack_arguments beyond the type of each argument."""
    values = array.array("Q", bytes(8 * max(len(args), 1)))
    keep = []
    for i, a in enumerate(args):
        if isinstance(a, _NDARRAY):
            values[i] = a.data.ptr
            keep.append(a)
        elif type(a) in _SCALAR_TYPES:
            values[i] = _from_bytes(a.tobytes(), "little")
        else:
            raise TypeError(f"argument {i} of {expression or 'a launch'} must be a CuPy array or a NumPy "
                            f"scalar of the kernel's C type, got {type(a).__name__}")
    base = values.buffer_info()[0]
    return values, array.array("Q", range(base, base + 8 * max(len(args), 1), 8)), keep


_from_bytes = int.from_bytes
# NumPy scalar types a kernel argument may have (the kinds of _SCALAR_KINDS, at most 8 bytes).
_SCALAR_TYPES = frozenset(t for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                                      np.uint32, np.uint64, np.float16, np.float32, np.float64))
if sys.byteorder != "little":  # the slots' layout assumes a little-endian host
    raise ImportError("dnnprims launches kernels from little-endian hosts only")


class CooperativeLaunchRefused(RuntimeError):
    """The driver would not run a cooperative launch: its grid is more blocks
    than the device (or this process's share of it) holds at once, or the
    device has no cooperative launch.  Nothing ran; take the multi-launch path."""


# CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, CUDA_ERROR_NOT_SUPPORTED
_REFUSALS = frozenset((720, 801))
cooperative_refusals = 0  # launches refused so far (tests check that a fallback ran)


def _cooperative_call(ptr, dims, shared, params_ptr, expression):
    """cuLaunchCooperativeKernel on the current stream (errors: _cooperative_retry)."""
    gx, gy, gz, bx, by, bz = dims
    try:
        _launch_cooperative_kernel(ptr, gx, gy, gz, bx, by, bz, shared, _current_stream().ptr, params_ptr)
    except _DriverError as e:
        _cooperative_retry(e, ptr, dims, shared, params_ptr, expression)


def _cooperative_retry(error, ptr, dims, shared, params_ptr, expression):
    """After a failed cooperative launch: a refusal raises
    CooperativeLaunchRefused; any other driver error (a thread whose CUDA
    context is not current yet) makes the current device's context current and
    launches once more -- a second error is raised as it is (a refusal as
    CooperativeLaunchRefused)."""
    global cooperative_refusals
    for attempt in (0, 1):
        if getattr(error, "status", None) in _REFUSALS:
            cooperative_refusals += 1
            raise CooperativeLaunchRefused(
                f"cooperative launch of {expression or 'a kernel'} with grid {dims[:3]} refused: {error}")
        if attempt:
            raise error
        _make_context_current()
        gx, gy, gz, bx, by, bz = dims
        try:
            _launch_cooperative_kernel(ptr, gx, gy, gz, bx, by, bz, shared, _current_stream().ptr, params_ptr)
            return
        except _DriverError as e:
            error = e


def _make_context_current():
    import cupy

    device = cupy.cuda.runtime.getDevice()
    cupy.cuda.runtime.setDevice(device)  # the runtime makes the device's primary context current
    cupy.cuda.runtime.free(0)


def launch_cooperative(function, grid, block, args, shared_mem=0, expression=None):
    """Launch a cupy ``Function`` (a kernel with a grid barrier) through
    cuLaunchCooperativeKernel on the current stream: every block resident at
    once, or :class:`CooperativeLaunchRefused`.  The packed arguments stay
    referenced here until the driver call returns."""
    values, params, keep = kernel_parameters(args, expression)
    _cooperative_call(function.ptr, _launch_dims(grid, block), int(shared_mem), params.buffer_info()[0],
                      expression)
    del values, keep


_COOPERATIVE = {}  # device -> its SM count, 0 when it has no cooperative launch


def co_resident_blocks(function, block_threads, shared_mem=0):
    """Blocks of a cupy ``Function`` that the current device runs at once
    (the occupancy API times the SM count): the most a cooperative launch of
    it can have.  0 when the device has no cooperative launch or the
    occupancy API fails (the caller then never takes a grid-barrier path)."""
    try:
        import cupy
        from cupy_backends.cuda.api import driver

        runtime = cupy.cuda.runtime
        device = runtime.getDevice()
        sms = _COOPERATIVE.get(device)
        if sms is None:  # 0 without cooperative launch, else the SM count
            cooperative = runtime.deviceGetAttribute(runtime.cudaDevAttrCooperativeLaunch, device)
            sms = _COOPERATIVE[device] = int(cooperative and runtime.deviceGetAttribute(
                runtime.cudaDevAttrMultiProcessorCount, device))
        if not sms:
            return 0
        per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(function.ptr, int(block_threads),
                                                                  int(shared_mem))
    except Exception:
        return 0
    return max(0, int(per_sm)) * int(sms)


class PreparedLaunch:
    """One kernel launch with everything fixed but some arrays' data pointers.

    The arguments live in one 8-byte slot each of ``_values`` (CUDA reads as
    many bytes of a slot as the parameter's size; x86-64 and aarch64 hosts,
    like the device, are little-endian), and
    ``_params`` holds the slots' addresses: ``cuLaunchKernel``'s
    ``kernelParams``.  A call writes the given arrays' pointers into their
    slots and launches on the current stream.  The slots are shared, so a
    lock keeps two threads from interleaving write and launch; a call that
    finds it taken (another thread, or a signal handler re-entering) takes
    CuPy's ordinary launch instead, as does a driver error (a thread whose
    CUDA context is not yet current: CuPy's launch makes it current, or
    raises the real error)."""

    __slots__ = ("_kernel", "_function", "_ptr", "_dims", "_shared", "_template", "_slots",
                 "_values", "_params", "_params_ptr", "_extra", "_extra_ptr", "_keep", "_lock",
                 "expression")

    def __init__(self, kernel, grid, block, args, shared_mem=0, expression=None, packed=False):
        self.expression = expression
        self._kernel = kernel
        self._function = kernel.kernel            # the cupy Function of the current device
        self._ptr = self._function.ptr
        self._dims = _launch_dims(grid, block)
        self._shared = int(shared_mem)
        self._template = tuple(args)
        # Where each argument's bytes go: its own 8-byte slot (kernelParams), or
        # packed (``packed=True``: the kernel's C parameter layout, passed
        # through cuLaunchKernel's ``extra`` buffer).  Pointers are 8-aligned
        # either way, so a call writes them as items of the 'Q' array (the
        # cheapest item assignment; its buffer never moves).
        self._values, offsets, end, self._slots, self._keep = _pack_arguments(self._template, packed, expression)
        base = self._values.buffer_info()[0]
        if packed:
            # CU_LAUNCH_PARAM_BUFFER_POINTER (1), the buffer, CU_LAUNCH_PARAM_BUFFER_SIZE (2),
            # a pointer to its size_t size, CU_LAUNCH_PARAM_END (0).
            self._params = array.array("Q", [end])
            self._extra = array.array("Q", [1, base, 2, self._params.buffer_info()[0], 0])
            self._params_ptr, self._extra_ptr = 0, self._extra.buffer_info()[0]
        else:
            self._params = array.array("Q", [base + offset for offset in offsets] or [base])
            self._params_ptr, self._extra, self._extra_ptr = self._params.buffer_info()[0], None, 0
        self._lock = threading.Lock()

    def __call__(self, *arrays):
        """Launch with these arrays in the marked places, on the current CuPy stream."""
        if not self._lock.acquire(False):
            return self._launch_with_cupy(arrays)
        try:
            values = self._values
            for slot, index in self._slots:
                values[slot] = arrays[index].data.ptr
            gx, gy, gz, bx, by, bz = self._dims
            try:
                _launch_kernel(self._ptr, gx, gy, gz, bx, by, bz, self._shared,
                               _current_stream().ptr, self._params_ptr, self._extra_ptr)
            except _DriverError:
                self._launch_with_cupy(arrays)
        finally:
            self._lock.release()

    def _launch_with_cupy(self, arrays):
        self._function(self._dims[:3], self._dims[3:], self._arguments(arrays), shared_mem=self._shared)

    def _arguments(self, arrays):
        return tuple(arrays[a.index] if isinstance(a, _ArrayArgument) else a for a in self._template)


class CooperativeLaunch(PreparedLaunch):
    """A :class:`PreparedLaunch` of a kernel with a grid barrier, through
    ``cuLaunchCooperativeKernel``: every block resident at once, or the driver
    refuses.  On a refusal it runs ``fallback(*arrays)`` (the caller's
    multi-launch path), and so on every later call (the same grid, kernel and
    device are refused again); without a fallback the refusal is raised.  A
    call that finds the slots busy packs its own copy (never CuPy's ordinary
    launch: that would drop the co-residency guarantee)."""

    __slots__ = ("_fallback", "_refused")

    def __init__(self, kernel, grid, block, args, shared_mem=0, expression=None, fallback=None):
        super().__init__(kernel, grid, block, args, shared_mem, expression)
        self._fallback = fallback
        self._refused = False

    def __call__(self, *arrays):
        if self._refused:
            return self._fallback(*arrays)
        if not self._lock.acquire(False):
            return self._launch_own_copy(arrays)
        try:
            values = self._values
            for slot, index in self._slots:
                values[slot] = arrays[index].data.ptr
            gx, gy, gz, bx, by, bz = self._dims
            try:
                _launch_cooperative_kernel(self._ptr, gx, gy, gz, bx, by, bz, self._shared,
                                           _current_stream().ptr, self._params_ptr)
            except _DriverError as e:
                _cooperative_retry(e, self._ptr, self._dims, self._shared, self._params_ptr, self.expression)
            return None
        except CooperativeLaunchRefused:
            if self._fallback is None:
                raise
            self._refused = True
        finally:
            self._lock.release()
        return self._fallback(*arrays)

    def _launch_own_copy(self, arrays):
        try:
            launch_cooperative(self._function, self._dims[:3], self._dims[3:], self._arguments(arrays),
                               self._shared, self.expression)
        except CooperativeLaunchRefused:
            if self._fallback is None:
                raise
            self._refused = True
            self._fallback(*arrays)


class OutputSlot:
    """The output array of one kind of fast-path call, handed out again once
    nobody else holds it.

    Allocating an output costs more host time than the launch that fills it
    (CuPy's memory pool and ``ndarray``: 2.5-4.5 us on the H100's host, both
    the allocation and the free when the caller drops it).  A cached call
    whose previous output was dropped -- the common case of an inference loop
    or a benchmark -- can take that array back instead: this is what the pool
    would do with the freed block (same size, same stream, stream order keeps
    the new kernel after every earlier use), without the round trip.

    ``slot()`` returns a C-contiguous array of the slot's shape and dtype on
    the current device and stream.  The slot keeps one array; it hands it out
    again only when every reference to it, its ``MemoryPointer`` and its
    memory is the slot's own (so no view, no ``.data``, no DLPack or
    ``__cuda_array_interface__`` consumer that holds the array, no weak
    reference), its memory came from CuPy's pool (:data:`RECYCLABLE`), the
    current stream is the one it was allocated on, and its shape was not
    reset in place; otherwise it allocates a fresh array (and keeps that one).
    Arrays over :data:`RECYCLE_MAX_BYTES` are never kept, and all slots
    together keep at most :data:`RECYCLE_BUDGET_BYTES`;
    :func:`release_outputs` drops every kept array.  CPython only: with the
    GIL disabled nothing is kept.  The reference counts of an array only the
    slot holds are learned on the slot's first untraced allocation (under a
    trace function -- a debugger, coverage -- nothing is kept until then)."""

    __slots__ = ("shape", "dtype", "nbytes", "_free", "_counts", "_reserved", "__weakref__")

    def __init__(self, shape, dtype):
        self.shape = tuple(int(v) for v in shape)
        self.dtype = np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self._free = []          # (kept array, its stream); list.pop claims it atomically
        self._counts = None      # reference counts of an array only the slot holds
        self._reserved = False   # counted against RECYCLE_BUDGET_BYTES

    def __call__(self):
        free = self._free
        if free:
            try:
                out, stream = free.pop()
            except IndexError:   # another thread took it
                pass
            else:
                if (_reference_counts(out) == self._counts and stream == _stream_key()
                        and out.shape == self.shape):
                    free.append((out, stream))
                    return out
                del out              # still held elsewhere (or moved): allocate anew
        out = _NDARRAY(self.shape, self.dtype)
        if (self._reserved or self._reserve()) and type(out.data.mem) in RECYCLABLE:
            counts = _reference_counts(out)
            if self._counts is None:
                if _gettrace() is not None:
                    # A trace function (a debugger) may hold this frame's locals
                    # (frame.f_locals, Python < 3.13): counts learned now could be
                    # one high, and an array its caller still holds would pass.
                    # Learn them on an untraced call.  (A profile function --
                    # cProfile -- reads no locals: benchmarks' --profile keeps reuse.)
                    return out
                self._counts = counts
            if not free and counts == self._counts:
                free.append((out, _stream_key()))
        return out

    def _reserve(self):
        global _recycle_left
        if not (_RECYCLING and 0 < self.nbytes <= RECYCLE_MAX_BYTES and self.nbytes <= _recycle_left):
            return False
        with _recycle_lock:
            if self._reserved or self.nbytes > _recycle_left:
                return self._reserved
            _recycle_left -= self.nbytes
            self._reserved = True
            _SLOTS.add(self)
        return True

    def release(self):
        """Drop the kept array and give its bytes back to the budget."""
        global _recycle_left
        self._free.clear()
        with _recycle_lock:
            if self._reserved:
                self._reserved = False
                _recycle_left += self.nbytes

    def __del__(self):
        try:
            self.release()
        except Exception:  # interpreter shutdown
            pass


# cudaStreamPerThread: CuPy's per-thread default stream (CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1)
# has this one pointer in every host thread, but each thread's is a stream of its
# own: memory kept for it is kept per thread (as CuPy's pool does, cupy/cupy#5069).
_PER_THREAD_STREAM = 2


def stream_key(ptr):
    """A stream (its pointer) as the key of memory kept or laid out for it
    (OutputSlot, WorkspaceSlot, normalization's stream workspace): the pointer,
    with the thread for the per-thread default stream."""
    return ptr if ptr != _PER_THREAD_STREAM else (ptr, threading.get_ident())


def _stream_key():
    return stream_key(_current_stream().ptr)


def _reference_counts(out):
    """(array, its MemoryPointer, its memory) reference counts and the array's
    weak references, as seen from a caller that holds ``out`` in one local."""
    data = out.data
    return _getrefcount(out), _getrefcount(data), _getrefcount(data.mem), _getweakrefcount(out)


def set_output_reuse(enabled):
    """Turn the fast paths' output reuse (:class:`OutputSlot`) on or off; off
    also drops every kept array.  Returns the previous setting."""
    global _RECYCLING
    previous = _RECYCLING
    _RECYCLING = bool(enabled) and _GIL
    release_outputs()
    return previous


def release_outputs():
    """Drop every output array and workspace the fast paths keep for reuse, and
    the cuBLAS workspaces their CUDA graphs share per stream: their memory goes
    back to CuPy's pool (call before ``free_all_blocks`` to return it to the
    driver; a graph still alive holds its own workspace).

    Not dropped: what the cached plans launch with, which stays allocated while
    they are cached -- batch norm's per-stream workspaces (barrier counters,
    partials), its plans' scratch statistics and constant gamma/beta vectors,
    the prepared launches' tables (implicit GEMM's taps), the FFT / DFT setups
    (transform matrices) and cuFFT plans.  A plan holds these arrays and writes
    their pointers into its launches, so dropping them here would free nothing;
    the caches are bounded instead (notes/review6e.md, "Tables and bounds")."""
    from . import _cublas
    for slot in list(_SLOTS):
        slot.release()
    _cublas._GRAPH_WORKSPACES.clear()


class Workspace:
    """One workspace array of a :class:`WorkspaceSlot`, on one stream."""

    __slots__ = ("array", "stream", "kept", "graphs")

    def __init__(self, array, stream):
        self.array = array
        self.stream = stream
        self.kept = False        # counted against RECYCLE_BUDGET_BYTES, held by the slot between calls
        # What the prepared call captured over this array (CUDA graphs whose pointers
        # lie in it: they live and die with it), False when it captures nothing.
        self.graphs = None


class WorkspaceSlot:
    """The scratch memory of one prepared problem, kept per stream.

    A prepared call whose kernels pass intermediate results through device
    memory (Winograd's transformed tiles) would otherwise allocate it every
    call: ``cupy.empty`` and the free cost 3-4 us of host time, as much as a
    launch.  :meth:`take` returns the :class:`Workspace` kept for the current
    stream, or a fresh one; :meth:`give_back` keeps it for the next call on
    that stream (call it in a ``finally``: a kept workspace dropped without it
    keeps its bytes counted against the budget).  Reuse on one stream is
    safe: the stream runs the next call's kernels after this call's.  A call on another stream gets a workspace of
    its own (at most :data:`MAX_STREAMS` kept), and a call that finds its
    stream's workspace taken (another thread between take and give_back) a
    fresh one that is then dropped.  Workspaces over :data:`RECYCLE_MAX_BYTES`
    are never kept; kept ones count against :data:`RECYCLE_BUDGET_BYTES`
    (shared with :class:`OutputSlot`); :func:`release_outputs` drops them and
    ``set_workspace_reuse(False)`` (or ``DNNPRIMS_WORKSPACE_REUSE=0``) turns
    keeping off.  ``allocate(size, dtype)`` makes a fresh array (CuPy's by
    default)."""

    MAX_STREAMS = 4

    __slots__ = ("size", "dtype", "nbytes", "_kept", "_allocate", "__weakref__")

    def __init__(self, size, dtype, allocate=None):
        self.size = int(size)
        self.dtype = np.dtype(dtype)
        self.nbytes = self.size * self.dtype.itemsize
        self._kept = {}          # stream pointer -> Workspace; dict.pop claims one atomically
        self._allocate = allocate

    def take(self):
        stream = _stream_key()
        workspace = self._kept.pop(stream, None)
        if workspace is None:
            allocate = self._allocate
            workspace = Workspace(_NDARRAY((self.size,), self.dtype) if allocate is None
                                  else allocate(self.size, self.dtype), stream)
        return workspace

    def give_back(self, workspace):
        """Keep ``workspace`` (from :meth:`take`) for the next call on its stream,
        if reuse is on and the budget allows; else drop it."""
        if _KEEP_WORKSPACES and (workspace.kept or self._reserve(workspace)):
            kept = self._kept
            if len(kept) < self.MAX_STREAMS and kept.setdefault(workspace.stream, workspace) is workspace:
                return
        if workspace.kept:
            self._unreserve(workspace)

    def _reserve(self, workspace):
        global _recycle_left
        if not (_KEEP_WORKSPACES and 0 < self.nbytes <= RECYCLE_MAX_BYTES and self.nbytes <= _recycle_left):
            return False
        with _recycle_lock:
            if self.nbytes > _recycle_left:
                return False
            _recycle_left -= self.nbytes
            workspace.kept = True
            _SLOTS.add(self)
        return True

    def _unreserve(self, workspace):
        global _recycle_left
        with _recycle_lock:
            if workspace.kept:
                workspace.kept = False
                _recycle_left += self.nbytes

    def kept_streams(self):
        """The streams (pointers; (pointer, thread) for the per-thread default
        stream) whose workspace the slot holds now."""
        return tuple(self._kept)

    def release(self):
        """Drop every kept workspace and give its bytes back to the budget."""
        while self._kept:
            try:
                _, workspace = self._kept.popitem()
            except KeyError:     # another thread emptied it
                break
            self._unreserve(workspace)

    def __del__(self):
        try:
            self.release()
        except Exception:  # interpreter shutdown
            pass


def set_workspace_reuse(enabled):
    """Turn keeping prepared calls' workspaces (:class:`WorkspaceSlot`) on or
    off; off also drops every kept one.  Returns the previous setting."""
    global _KEEP_WORKSPACES
    previous = _KEEP_WORKSPACES
    _KEEP_WORKSPACES = bool(enabled)
    for slot in list(_SLOTS):
        if isinstance(slot, WorkspaceSlot):
            slot.release()
    return previous


# An output of at most this many bytes may be kept for reuse; all kept outputs
# together at most RECYCLE_BUDGET_BYTES (memory the pool cannot hand to other sizes).
RECYCLE_MAX_BYTES = 32 << 20
RECYCLE_BUDGET_BYTES = 256 << 20
_recycle_left = RECYCLE_BUDGET_BYTES
# Re-entrant: a slot's __del__ (release) may run from the cyclic GC on a thread
# that holds the lock (an allocation inside _reserve), and must not deadlock it.
_recycle_lock = threading.RLock()
_SLOTS = weakref.WeakSet()
# Reference counts mean "nobody else holds it" only with the GIL;
# DNNPRIMS_OUTPUT_REUSE=0 in the environment (or set_output_reuse(False)) turns reuse off.
_GIL = getattr(sys, "_is_gil_enabled", lambda: True)()
_RECYCLING = _GIL and os.environ.get("DNNPRIMS_OUTPUT_REUSE", "1") != "0"
# DNNPRIMS_WORKSPACE_REUSE=0 (or set_workspace_reuse(False)) allocates every workspace per call.
_KEEP_WORKSPACES = os.environ.get("DNNPRIMS_WORKSPACE_REUSE", "1") != "0"
_getrefcount = sys.getrefcount
_gettrace = sys.gettrace
_getweakrefcount = weakref.getweakrefcount
RECYCLABLE = ()   # memory types whose arrays may be kept: CuPy's pool (set in _bind_driver)
_NDARRAY = None


def _bind_driver():
    """The driver entry points a prepared launch calls (CuPy's thin wrappers)."""
    global _launch_kernel, _launch_cooperative_kernel, _current_stream, _DriverError, RECYCLABLE, _NDARRAY
    try:
        import cupy
        from cupy.cuda import driver, get_current_stream, memory
    except ImportError:  # CPU-only install: nothing launches
        return
    _launch_kernel, _current_stream, _DriverError = driver.launchKernel, get_current_stream, driver.CUDADriverError
    _launch_cooperative_kernel = driver.launchCooperativeKernel
    RECYCLABLE = (memory.PooledMemory,)
    _NDARRAY = cupy.ndarray


_launch_kernel = _launch_cooperative_kernel = _current_stream = None
_DriverError = RuntimeError
_bind_driver()


def families():
    """Every kernel family the library declares (imports all primitive modules)."""
    from . import (algos, pooling, normalization, row_normalization, softmaxes, activations,  # noqa: F401
                   recurrent, tensor_ops)
    from .bench import overhead  # noqa: F401  (the benchmark's busy-wait kernel)
    return dict(_FAMILIES)


def compile_with_nvrtc(family, arch="compute_90"):
    """Compile every specialisation of a family to PTX with NVRTC (no GPU needed).

    Returns NVRTC's log; raises RuntimeError with the log on failure."""
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(family.source, family.filename, [], [])
    try:
        for expr in family.name_expressions:
            nvrtc.addNameExpression(prog, expr)
        options = [f"--gpu-architecture={arch}", *COMPILE_OPTIONS]
        try:
            nvrtc.compileProgram(prog, options)
        except nvrtc.NVRTCError:
            raise RuntimeError(f"compiling kernel family {family.filename} failed:\n"
                               f"{nvrtc.getProgramLog(prog)}") from None
        for expr in family.name_expressions:
            nvrtc.getLoweredName(prog, expr)  # raises if an expression was not instantiated
        return nvrtc.getProgramLog(prog).strip("\x00").strip()
    finally:
        nvrtc.destroyProgram(prog)


def ceil_div(a, b):
    return -(-a // b)
