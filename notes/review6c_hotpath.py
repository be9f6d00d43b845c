"""Host time of a replayed cached Winograd call (the whole-call graph hit) on the CPU,
with kernels, cuBLAS, graphs, the pool and the stream faked (notes/review6c.md):
the Python that review6c's changes touch, without the driver calls.

    PYTHONPATH=$PWD python notes/review6c_hotpath.py [calls] [repeats]
"""
import sys
import timeit

import numpy as np
import cupy
from cupy.cuda.memory import MemoryPointer, UnownedMemory

from dnnprims import _kernels, conv
from dnnprims.algos import winograd

_buffers = []


def _allocate(nbytes):
    host = np.zeros(max(nbytes, 1) + 16, np.uint8)
    _buffers.append(host)
    return MemoryPointer(UnownedMemory(host.ctypes.data, host.nbytes, host, device_id=0), 0)


class _Stream:
    ptr = 77


class _Graph:
    def launch(self):
        pass


class _Gemm:
    def __call__(self, *args):
        pass

    def capture(self, calls, stream_key=None):
        return _Graph(), None

    def capture_work(self, work, stream_key=None):
        return _Graph(), None


def main(calls=100000, repeats=7):
    stream = _Stream()
    _kernels.RECYCLABLE = (UnownedMemory,)
    _kernels._current_stream = lambda: stream
    cupy.cuda.runtime.getDevice = lambda: 0
    winograd.FULL_GRAPHS = True
    winograd.FAMILY.prepare = lambda *args, **kwargs: (lambda *arrays: None)
    winograd._GEMM_RUN = {np.dtype(np.float32): _Gemm()}
    with cupy.cuda.using_allocator(_allocate):
        problem = conv._describe((1, 4, 8, 8), (4, 4, 3, 3), (1, 1), (1, 1), (1, 1), 1, "NCHW", "float32")
        run = winograd.WINOGRAD_F2.prepare(problem, "forward")
        a, b = cupy.empty(problem.x_shape, np.float32), cupy.empty(problem.w_shape, np.float32)
        out = cupy.empty(problem.y_shape, np.float32)
        for _ in range(3):
            run(a, b, out)           # direct, then captured: every later call is a hit
        times = timeit.repeat(lambda: run(a, b, out), number=calls, repeat=repeats)
    best = sorted(times)[len(times) // 2] / calls * 1e6
    print(f"replayed cached call (hit), faked driver: {best:.3f} us (median of {repeats} x {calls})")


if __name__ == "__main__":
    main(*(int(v) for v in sys.argv[1:]))
