"""Helper host2: trace every pool launch (kernel, grid, block, argument roles, scalar values) on a
fake GPU (notes/host_profile_cpu.py), for comparing two checkouts' argument layouts:
    cd CHECKOUT && PYTHONPATH=$PWD python /work/wt/host2/notes/host2_trace_pool.py > a.json   # then diff the JSON"""
import json, sys
sys.argv = ["x"]
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
import numpy as np
import host_profile_cpu as h
import cupy
from cupy.cuda.memory import MemoryPointer, UnownedMemory
_arena = np.zeros(256 << 20, np.uint8)
_mem = UnownedMemory(_arena.ctypes.data, _arena.nbytes, _arena, device_id=0)
_off = [0]
def alloc(n):
    p = MemoryPointer(_mem, _off[0]); _off[0] = (_off[0] + (n + 511) // 512 * 512 + 512) % (200 << 20)
    return p
cupy.cuda.set_allocator(alloc)
from dnnprims import _kernels, pooling
RECORD = []
def role(a):
    if isinstance(a, cupy.ndarray):
        return ("ptr", a.data.ptr, a.size, str(a.dtype))
    if isinstance(a, np.generic):
        return (str(a.dtype), a.item())
    return repr(a)
class FakeFn:
    def __init__(self, expr): self.expr = expr; self.kernel = self; self.ptr = 1
    def __call__(self, grid, block, args, shared_mem=0):
        g = tuple(grid) + (1, 1); b = tuple(block) + (1, 1)
        RECORD.append((self.expr, [max(1, int(v)) for v in g[:3] + b[:3]], [role(a) for a in args], shared_mem))
_kernels.KernelFamily.function = lambda self, expr: FakeFn(expr)
def rec_prepared(self, *arrays):
    args = tuple(arrays[a.index] if isinstance(a, _kernels._ArrayArgument) else a for a in self._template)
    RECORD.append((self.expression, list(self._dims), [role(a) for a in args], self._shared))
if hasattr(_kernels, "PreparedLaunch"):
    _kernels.PreparedLaunch.__call__ = rec_prepared
import dnnprims as dp
def fa(shape, dtype=np.float32, offset=0):
    n = int(np.prod(shape)) + offset
    base = cupy.ndarray((n,), dtype)
    return base[offset:].reshape(shape) if offset else base.reshape(shape)
out = {}
def call(name, fn, inputs, repeat=2):
    for i in range(repeat):
        RECORD.clear()
        res = fn()
        res = res if isinstance(res, tuple) else (res,)
        names = {v.data.ptr: k for k, v in inputs.items() if v is not None}
        for j, r in enumerate(res):
            names.setdefault(r.data.ptr, f"out{j}")
        def tr(r):
            if isinstance(r, tuple) and r and r[0] == "ptr":
                return names.get(r[1], ("scratch", r[2], r[3]))
            return r
        out[f"{name}#{i}"] = [(e, d, [tr(r) for r in a], sh) for e, d, a, sh in RECORD]
        out[f"{name}#{i}#out"] = [(list(r.shape), str(r.dtype)) for r in res]
cases = [((2, 3, 14, 16), 3, 2, 1, "max", "NCHW"), ((2, 3, 14, 16), 3, 2, 1, "avg", "NCHW"),
         ((2, 3, 7, 7), 7, None, 0, "avg", "NCHW"), ((2, 3, 7, 7), 7, None, 0, "max", "NCHW"),
         ((2, 3, 8, 8), 2, 2, 0, "avg", "NCHW"), ((2, 3, 9, 11), 3, 1, 1, "max", "NCHW"),
         ((2, 9, 11, 8), 3, 2, 1, "max", "NHWC"), ((2, 9, 11, 8), 2, None, 0, "avg", "NHWC"),
         ((2, 3, 9, 11), (3, 2), (2, 1), (1, 0), "avg", "NCHW")]
for dtype in (np.float32, np.float16):
    for shape, k, st, pad, mode, layout in cases:
        for offset in (0, 1):
            x = fa(shape, dtype, offset)
            y = dp.pool(x, k, stride=st, padding=pad, mode=mode, layout=layout)
            dy = fa(y.shape, dtype)
            tag = f"{np.dtype(dtype)}-{shape}-{k}-{st}-{pad}-{mode}-{layout}-{offset}"
            call("fw" + tag, lambda: dp.pool(x, k, stride=st, padding=pad, mode=mode, layout=layout), dict(x=x))
            call("bw" + tag, lambda: dp.pool_backward(dy, x, y, k, stride=st, padding=pad, mode=mode, layout=layout),
                 dict(x=x, dy=dy, y=y))
            call("bwnoy" + tag, lambda: dp.pool_backward(dy, x, None, k, stride=st, padding=pad, mode=mode, layout=layout),
                 dict(x=x, dy=dy))
print("FAST", len(pooling._MEMO.fast), file=sys.stderr)
json.dump(out, sys.stdout, indent=0, default=str)
