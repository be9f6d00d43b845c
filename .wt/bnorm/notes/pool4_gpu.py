"""GPU check of branch `pool4` (notes/pool4.md).

    python notes/pool4_gpu.py --warm     compile the pooling kernels in parallel (CuPy's cache)
    python notes/pool4_gpu.py PATH       after `python -m dnnprims.bench memory --only ... --json PATH`

Prints (1) the 16-bit max backward rows (NCHW float16 / bfloat16, NHWC float16 /
bfloat16, 64x256x56x56) and NHWC float32 against torch, with dx compared bitwise
against the scalar paths (VECTOR_KERNELS off), (2) the global-average kernel-only
time (notes/pool3_gpu.py), and last (3) the short table of the benchmark JSON.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def warm():
    import multiprocessing
    import time
    from concurrent.futures import ProcessPoolExecutor
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
    from warm_kernels import _compile
    from dnnprims import pooling
    names = sorted({e.split("<", 1)[0] for e in pooling.FAMILY.name_expressions},
                   key=lambda n: -sum(e.startswith(n + "<") for e in pooling.FAMILY.name_expressions))
    t0 = time.time()
    with ProcessPoolExecutor(16, mp_context=multiprocessing.get_context("spawn")) as pool:
        for line in pool.map(_compile, [("pooling.cu", n) for n in names]):
            print(line, flush=True)
    print(f"warm compile of {len(names)} pooling kernel names: {time.time() - t0:.1f} s", flush=True)


def rows16(COPY):
    import cupy as cp
    import numpy as np
    import torch
    import dnnprims as dp
    from dnnprims import pooling
    from dnnprims.bench import timing

    def ms(fn):
        return timing.measure(fn, xp=cp, warmup=3, repeat=30).median_ms

    from dnnprims import _dtypes

    def make(shape, dtype):  # random values in [0, 1); bfloat16: the upper half of float32's bits
        x32 = cp.random.random(shape, dtype=cp.float32)
        if dtype == "bfloat16":
            return (x32.view(cp.uint32) >> 16).astype(cp.uint16).view(_dtypes.BFLOAT16)
        return x32.astype(dtype)

    F = torch.nn.functional
    print(f"== max 3x3/2/1 backward (copy {COPY:.0f} GB/s; ratio = torch / ours)")
    out = []
    for layout, dtype in (("NCHW", cp.float16), ("NCHW", "bfloat16"), ("NHWC", cp.float16),
                          ("NHWC", "bfloat16"), ("NHWC", cp.float32), ("NCHW", cp.float32)):
        shape = (64, 256, 56, 56) if layout == "NCHW" else (64, 56, 56, 256)
        x = make(shape, dtype)
        opts = dict(stride=2, padding=1, layout=layout)
        y = dp.pool(x, 3, **opts)
        dy = make(y.shape, dtype)
        dx = dp.pool_backward(dy, x, y, 3, **opts)
        saved = pooling.VECTOR_KERNELS
        pooling.VECTOR_KERNELS = False
        pooling._MEMO.clear()
        dx_scalar = dp.pool_backward(dy, x, y, 3, **opts)
        pooling.VECTOR_KERNELS = saved
        pooling._MEMO.clear()
        same = bool(cp.array_equal(dx, dx_scalar))
        nchw = (lambda t: t.permute(0, 3, 1, 2)) if layout == "NHWC" else (lambda t: t)
        try:
            tx = nchw(torch.from_dlpack(x)).detach().clone().requires_grad_()
            ty = F.max_pool2d(tx, 3, 2, 1)
            tdy = nchw(torch.from_dlpack(dy))
            tdx = torch.autograd.grad(ty, tx, tdy, retain_graph=True)[0]
            diff = float((nchw(torch.from_dlpack(dx)).float() - tdx.float()).abs().max())
            t_b = ms(lambda: torch.autograd.grad(ty, tx, tdy, retain_graph=True))
            del tx, ty, tdy, tdx
        except Exception as e:
            print(f"  torch: {type(e).__name__}: {e}")
            diff = t_b = float("nan")
        ours = ms(lambda: dp.pool_backward(dy, x, y, 3, **opts))
        floor = 2 * x.nbytes + dy.nbytes
        name = f"{layout} {np.dtype(x.dtype).name}"
        out.append((name, ours, t_b, timing.gbps(floor, ours) / COPY))
        print(f"{name:18s} bwd {ours:.4f} ms torch {t_b:.4f} ({t_b / ours:.2f}x) "
              f"{timing.gbps(floor, ours) / COPY:.2f} of copy; dx == scalar path: {same}; "
              f"max |dx - torch| {diff:.3g}", flush=True)
        del x, y, dy, dx, dx_scalar
        cp.get_default_memory_pool().free_all_blocks()
    return out


if __name__ == "__main__":
    if sys.argv[1] == "--warm":
        warm()
        sys.exit(0)
    try:
        COPY = json.load(open(sys.argv[1]))["ceilings"]["copy_GBps"]
    except Exception:
        COPY = 3000.0
    try:
        rows16(COPY)
    except Exception as e:
        print(f"rows16 failed: {type(e).__name__}: {e}")
    try:
        import pool3_gpu
        pool3_gpu.COPY = COPY
        pool3_gpu.kernel_only()
    except Exception as e:
        print(f"kernel_only failed: {type(e).__name__}: {e}")
    from pool_gpu import short_table
    short_table(sys.argv[1])
