"""Profile the Python host path of cached GPU calls on a machine WITHOUT a GPU.

CuPy arrays are faked over host memory (never dereferenced), the CUDA entry
points that would fail without a driver are stubbed (getDevice, the memory
pool, module loading, cuLaunchKernel, the current stream), so what is timed
is our Python plus CuPy's ndarray construction: everything of a call except
the driver's own launch cost (~2 us on the H100 host) and the real pool.

    PYTHONPATH=$PWD python notes/host_profile_cpu.py [--profile NAME]
"""
import argparse
import cProfile
import pstats
import sys
import timeit
import types

import numpy as np
import cupy
from cupy.cuda.memory import MemoryPointer, UnownedMemory

_keep = []
_arena = np.zeros(64 << 20, np.uint8)
# One memory object per allocation, as CuPy's pool gives (OutputSlot counts its references).
cupy.cuda.set_allocator(lambda n: MemoryPointer(UnownedMemory(_arena.ctypes.data, n, _arena, device_id=0), 0))
cupy.cuda.runtime.getDevice = lambda: 0
cupy.cuda.get_current_stream = lambda device_id=-1: types.SimpleNamespace(ptr=0)
cupy.cuda.runtime.memsetAsync = lambda *a: None


class _FakeDevice:
    def __init__(self, i=None):
        self.id = 0 if i is None else int(i)

    def __enter__(self):
        return self

    def __exit__(self, *a):
        pass


cupy.cuda.Device = _FakeDevice


def fake(shape, dtype=np.float32):
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize + 64
    buf = np.zeros(n, np.uint8)
    _keep.append(buf)
    mem = UnownedMemory(buf.ctypes.data, buf.nbytes, buf, device_id=0)
    return cupy.ndarray(shape, dtype, memptr=MemoryPointer(mem, 0))


def _fake_asarray(a, dtype=None):
    a = np.asarray(a, dtype)
    out = fake(a.shape, a.dtype)
    return out


cupy.asarray = _fake_asarray


def _fake_filled(shape, *value, dtype=float):
    return fake(shape if isinstance(shape, tuple) else (shape,), np.dtype(dtype))


cupy.zeros = cupy.ones = lambda shape, dtype=float: _fake_filled(shape, dtype=dtype)
cupy.full = lambda shape, value, dtype=float: _fake_filled(shape, dtype=dtype)

from dnnprims import _kernels  # noqa: E402

class _FakeFunction:
    ptr = 1

    def __call__(self, grid, block, args, shared_mem=0):
        pass


class _FakeRawKernel:
    kernel = _FakeFunction()

    def __call__(self, grid, block, args, shared_mem=0):
        pass


_fake_kernel = _FakeRawKernel()
_kernels.KernelFamily.function = lambda self, expression: _fake_kernel
_kernels.RECYCLABLE = (UnownedMemory,)   # the fake pool's memory may be kept for reuse
if "--no-recycle" in sys.argv:
    _kernels.RECYCLE_BUDGET_BYTES = _kernels._recycle_left = 0
if hasattr(_kernels, "_launch_kernel"):
    _kernels._launch_kernel = lambda *args: None
_kernels._current_stream = cupy.cuda.get_current_stream

import dnnprims as dp  # noqa: E402


def cases():
    x = fake((1, 64, 56, 56))
    w = fake((64, 64, 3, 3))
    rows = fake((256, 1000))
    act = fake((64, 1024))
    bn_x = fake((32, 256, 7, 7))
    gamma, beta, rm, rv = (fake((256,)) for _ in range(4))
    return {
        "batchnorm train": lambda: dp.batchnorm(bn_x, gamma, beta, rm, rv, training=True),
        "batchnorm infer": lambda: dp.batchnorm(bn_x, gamma, beta, rm, rv, training=False),
        "conv2d_forward 3x3 b1": lambda: dp.conv2d_forward(x, w, padding=1),
        "conv2d_backward_data 3x3 b1": lambda: dp.conv2d_backward_data(x, w, x.shape, padding=1),
        "conv2d_backward_filter 3x3 b1": lambda: dp.conv2d_backward_filter(x, x, w.shape, padding=1),
        "softmax 256x1000": lambda: dp.softmax(rows),
        "softmax_backward 256x1000": lambda: dp.softmax_backward(rows, rows),
        "activation relu": lambda: dp.activation(act, "relu"),
        "activation_backward relu": lambda: dp.activation_backward(act, act, "relu"),
        "cupy.ndarray alone": lambda: cupy.ndarray((256, 1000), np.dtype(np.float32)),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", default=None)
    parser.add_argument("--no-recycle", action="store_true", help="never reuse outputs (OutputSlot)")
    args = parser.parse_args()
    table = cases()
    if args.profile:
        fn = next(f for k, f in table.items() if args.profile in k)
        fn()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(20000):
            fn()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
        return
    for name, fn in table.items():
        fn()
        best = min(timeit.repeat(fn, number=5000, repeat=5)) / 5000 * 1e6
        print(f"{name:34s} {best:6.2f} us (no driver launch)")


if __name__ == "__main__":
    sys.exit(main())
