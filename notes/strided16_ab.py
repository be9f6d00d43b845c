"""Batch norm's strided kernels for 16-bit types beyond the measured 32x2048x7x7
(session 9 adopted STRIDED_TYPES = float, half_t, bfloat16_t): 16-bit planes whose
size is not a multiple of 8 (7x7, 14x14) now take them.  A/B in one process:
STRIDED_TYPES = ("float",) (before) vs the default, training forward and backward,
eager (bench timing) and device time (20 calls in a CUDA graph), PyTorch side by side.
    PYTHONPATH=. python notes/strided16_ab.py     (GPU machine, ~30 s)"""
import cupy as cp
import numpy as np
import torch

import dnnprims as dp
from dnnprims import _dtypes, normalization
from dnnprims.bench import timing

GRAPH_CALLS = 20


def graph_ms(fn):
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for _ in range(3):
            fn()
        stream.synchronize()
        stream.begin_capture()
        try:
            for _ in range(GRAPH_CALLS):
                fn()
        finally:
            graph = stream.end_capture()
        graph.upload(stream)
        return timing.measure(lambda: graph.launch(stream), xp=cp, warmup=2, repeat=20).median_ms / GRAPH_CALLS


def as_torch(a):
    if a.dtype == _dtypes.BFLOAT16:   # CuPy exports no bfloat16 through DLPack: its bits as int16
        return torch.from_dlpack(a.view(cp.int16)).view(torch.bfloat16)
    return torch.from_dlpack(a)


def eager_ms(fn):
    return timing.measure(fn, xp=cp, warmup=3, repeat=30).median_ms


rng = np.random.default_rng(0)
print(f"{'shape':18s} {'dtype':9s} {'op':9s} {'before e/g ms':>17s} {'after e/g ms':>17s} "
      f"{'torch e ms':>10s} {'after x torch':>13s} {'max|diff|':>9s}")
for shape in ((32, 2048, 7, 7), (32, 1024, 14, 14), (32, 256, 14, 14), (8, 512, 7, 7)):
    for dtype in (np.float16, _dtypes.BFLOAT16):
        if dtype is None:   # no ml_dtypes here
            continue
        C = shape[1]
        x = cp.asarray(rng.standard_normal(shape).astype(np.float32).astype(dtype))
        dy = cp.asarray(rng.standard_normal(shape).astype(np.float32).astype(dtype))
        g, b = cp.asarray(rng.random(C, np.float32) + 0.5), cp.asarray(rng.standard_normal(C).astype(np.float32))
        rm, rv = cp.zeros(C, np.float32), cp.ones(C, np.float32)
        _, mean, invstd = dp.batchnorm(x, g, b, return_stats=True)
        ops = {"train": lambda: dp.batchnorm(x, g, b, rm, rv, training=True),
               "backward": lambda: dp.batchnorm_backward(dy, x, g, mean=mean, invstd=invstd)}
        tx = as_torch(x).requires_grad_(True)
        tg, tb = torch.from_dlpack(g).requires_grad_(True), torch.from_dlpack(b).requires_grad_(True)
        trm, trv = torch.from_dlpack(rm.copy()), torch.from_dlpack(rv.copy())
        F = torch.nn.functional
        try:
            ty = F.batch_norm(tx, trm, trv, tg, tb, training=True)
        except RuntimeError as e:   # a dtype mix torch refuses: no torch column
            print(f"torch: {e}".splitlines()[0])
            ty = None
        tdy = as_torch(dy)
        theirs = {"train": lambda: F.batch_norm(tx.detach(), trm, trv, tg.detach(), tb.detach(), training=True),
                  "backward": lambda: torch.autograd.grad(ty, (tx, tg, tb), tdy, retain_graph=True)}
        for op, fn in ops.items():
            rows = {}
            outs = {}
            for label, types in (("before", ("float",)), ("after", normalization.STRIDED_TYPES)):
                saved = normalization.STRIDED_TYPES
                normalization.STRIDED_TYPES = types
                try:
                    out = fn()
                    outs[label] = cp.asnumpy(out[0] if isinstance(out, tuple) else out).astype(np.float32)
                    rows[label] = (eager_ms(fn), graph_ms(fn))
                finally:
                    normalization.STRIDED_TYPES = saved
            t_torch = eager_ms(theirs[op]) if ty is not None else float("nan")
            diff = float(np.abs(outs["before"] - outs["after"]).max())
            name = np.dtype(dtype).name
            print(f"{str(shape):18s} {name:9s} {op:9s} {rows['before'][0]:8.4f}/{rows['before'][1]:.4f} "
                  f"{rows['after'][0]:8.4f}/{rows['after'][1]:.4f} {t_torch:10.4f} "
                  f"{t_torch / rows['after'][0]:13.2f} {diff:9.2e}", flush=True)
