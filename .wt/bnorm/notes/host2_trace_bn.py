"""Helper host2: trace every bn launch (kernel, grid, block, argument roles, scalar values) on a
fake GPU (notes/host_profile_cpu.py), for comparing two checkouts' argument layouts:
    cd CHECKOUT && PYTHONPATH=$PWD python /work/wt/host2/notes/host2_trace_bn.py > a.json   # then diff the JSON"""
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
    p = MemoryPointer(_mem, _off[0]); _off[0] += (n + 511) // 512 * 512 + 512
    return p
cupy.cuda.set_allocator(alloc)

from dnnprims import _kernels, normalization
normalization._resident_blocks = lambda cp, kernel: 1056
normalization._sm_count = lambda cp: 132
RECORD = []
roles = {}
def role(a):
    if isinstance(a, cupy.ndarray):
        return roles.get(a.data.ptr, ("scratch", a.size, str(a.dtype)))
    if isinstance(a, np.generic):
        return (str(a.dtype), a.item())
    return repr(a)
def rec_launch(self, expr, grid, block, args, shared_mem=0):
    g = tuple(grid) + (1, 1); b = tuple(block) + (1, 1)
    RECORD.append((expr, [max(1, int(v)) for v in g[:3] + b[:3]], [role(a) for a in args]))
_kernels.KernelFamily.launch = rec_launch
def rec_prepared(self, *arrays):
    args = tuple(arrays[a.index] if isinstance(a, _kernels._ArrayArgument) else a for a in self._template)
    RECORD.append((self.expression, list(self._dims), [role(a) for a in args]))
if hasattr(_kernels, "PreparedLaunch"):
    _kernels.PreparedLaunch.__call__ = rec_prepared
import dnnprims as dp

def fa(shape, dtype=np.float32, offset=0):
    n = int(np.prod(shape)) + offset
    base = cupy.ndarray((n,), dtype)
    return base[offset:].reshape(shape) if offset else base.reshape(shape)

out = {}
def run(name, fn, inputs, repeat=2):
    for i in range(repeat):
        roles.clear()
        for k, v in inputs.items():
            if v is not None:
                roles[v.data.ptr] = k
        RECORD.clear()
        res = fn()
        res = res if isinstance(res, tuple) else (res,)
        for j, r in enumerate(res):
            roles[r.data.ptr] = f"out{j}"
        # re-resolve roles of outputs (recorded before they were known): redo by replay
        out[f"{name}#{i}"] = [(e, d, [r for r in a]) for e, d, a in RECORD]
        out[f"{name}#{i}#shapes"] = [(tuple(r.shape), str(r.dtype)) for r in res]
    return res

# outputs are recorded as scratch (unknown at launch time): map them after the call
def run2(name, fn, inputs, repeat=2):
    for i in range(repeat):
        RECORD.clear()
        roles.clear()
        for k, v in inputs.items():
            if v is not None:
                roles[v.data.ptr] = k
        captured = []
        global role
        res = fn()
        res = res if isinstance(res, tuple) else (res,)
        out[f"{name}#{i}"] = RECORD[:]
        out[f"{name}#{i}#out"] = [(tuple(r.shape), str(r.dtype)) for r in res]

# Record raw pointers, then translate after the call.
def role(a):
    if isinstance(a, cupy.ndarray):
        return ("ptr", a.data.ptr, a.size, str(a.dtype))
    if isinstance(a, np.generic):
        return (str(a.dtype), a.item())
    return repr(a)

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
        out[f"{name}#{i}"] = [(e, d, [tr(r) for r in a]) for e, d, a in RECORD]
        out[f"{name}#{i}#out"] = [(list(r.shape), str(r.dtype)) for r in res]

for dtype, pdtype in ((np.float32, np.float32), (np.float16, np.float32)):
    for shape, layout in (((4, 8, 7, 7), "NCHW"), ((2, 8, 4, 4), "NCHW"), ((2, 3, 64, 64), "NCHW"),
                          ((3, 5, 16), "NCHW"), ((2, 5, 5, 8), "NHWC")):
        c = shape[1] if layout == "NCHW" else shape[-1]
        for offset in (0, 1):
            x = fa(shape, dtype, offset)
            dy = fa(shape, dtype)
            g, b, rm, rv = (fa((c,), pdtype) for _ in range(4))
            tag = f"{np.dtype(dtype)}-{shape}-{layout}-{offset}"
            for train in (True, False):
                call(f"fw-{tag}-{train}", lambda: dp.batchnorm(x, g, b, rm, rv, training=train, layout=layout,
                                                             return_stats=True),
                     dict(x=x, g=g, b=b, rm=rm, rv=rv))
            call(f"fw-nostats-{tag}", lambda: dp.batchnorm(x, None, None, training=True, layout=layout,
                                                          return_stats=True), dict(x=x))
            y, mean, invstd = dp.batchnorm(x, g, b, training=True, layout=layout, return_stats=True)
            mean, invstd = fa((c,), np.float32), fa((c,), np.float32)
            call(f"bw-saved-{tag}", lambda: dp.batchnorm_backward(dy, x, g, mean=mean, invstd=invstd, layout=layout),
                 dict(x=x, dy=dy, g=g, mean=mean, invstd=invstd))
            call(f"bw-recompute-{tag}", lambda: dp.batchnorm_backward(dy, x, None, layout=layout),
                 dict(x=x, dy=dy))
    normalization.FUSED = False
    call("fw-unfused", lambda: dp.batchnorm(x, g, b, rm, rv, training=True, layout="NHWC", return_stats=True),
         dict(x=x, g=g, b=b, rm=rm, rv=rv))
    normalization.FUSED = True
json.dump(out, open(sys.argv[1] if len(sys.argv) > 1 else "/dev/stdout", "w"), indent=0, default=str)
import sys as _s
print("FAST", len(normalization._MEMO.fast), "PLANS", len(getattr(normalization, "_PLANS", {})), normalization.__file__, file=_s.stderr)
