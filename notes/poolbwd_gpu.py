"""GPU timing of branch `poolbwd` (notes/poolbwd.md), one process, torch side by side.

    python notes/poolbwd_gpu.py

1. copy bandwidth (1 GiB device copy, same process);
2. max 3x3 / 2 / 1 backward, NCHW 64x256x56x56 float16 / bfloat16: pool_k3s2_backward
   (ROLLED_BACKWARD = False) against pool_k3s2_backward_rolled for every steps x
   blocks choice; NHWC 64x56x56x256 float32: pool_nhwc_k3s2_backward (SHUFFLE_BACKWARD =
   False) against pool_nhwc_k3s2_backward_shfl for every slots x blocks choice; dx
   compared bitwise with the old path, and with torch's;
3. global_avg_r50 (32x2048x7x7 float32) forward / backward: benchmark-style time
   (events around each call, L2-resident x), host us per call, and kernel-only time
   (calls queued behind torch.cuda._sleep so the host is hidden), x resident in L2
   and rotated over 4 copies (DRAM), ours and torch.
"""
import json
import os
import time

import cupy as cp
import numpy as np
import torch

import dnnprims as dp
from dnnprims import _dtypes, pooling
from dnnprims.bench import timing

F = torch.nn.functional
OUT = os.environ.get("OUT", ".")
rows = []


def ms(fn, repeat=30):
    return timing.measure(fn, xp=cp, warmup=3, repeat=repeat).median_ms


def make(shape, dtype):
    x32 = cp.random.random(shape, dtype=cp.float32) - 0.5
    if dtype == "bfloat16":
        return (x32.view(cp.uint32) >> 16).astype(cp.uint16).view(_dtypes.BFLOAT16)
    return x32.astype(dtype)


src = cp.random.random(2**28, dtype=cp.float32)
dst = cp.empty_like(src)
t = ms(lambda: dst.__setitem__(Ellipsis, src), 10)
COPY = 2 * src.nbytes / (t * 1e-3) / 1e9
del src, dst
cp.get_default_memory_pool().free_all_blocks()
print(f"copy {COPY:.0f} GB/s", flush=True)


def backward_rows(layout, dtype):
    shape = (64, 256, 56, 56) if layout == "NCHW" else (64, 56, 56, 256)
    x = make(shape, dtype)
    opts = dict(stride=2, padding=1, layout=layout)
    y = dp.pool(x, 3, **opts)
    dy = make(y.shape, dtype)
    nchw = (lambda a: a.permute(0, 3, 1, 2)) if layout == "NHWC" else (lambda a: a)
    tx = nchw(torch.from_dlpack(x)).detach().clone().requires_grad_()
    ty = F.max_pool2d(tx, 3, 2, 1)
    tdy = nchw(torch.from_dlpack(dy))
    tdx = torch.autograd.grad(ty, tx, tdy, retain_graph=True)[0]
    t_torch = ms(lambda: torch.autograd.grad(ty, tx, tdy, retain_graph=True))
    floor = 2 * x.nbytes + dy.nbytes
    name = f"{layout} {np.dtype(x.dtype).name}"
    variants = [("old", False, None, None)]
    if layout == "NCHW":
        variants += [(f"rolled S{s} B{b}", True, s, b) for s in pooling._ROLLED_STEPS_CHOICES
                     for b in pooling._ROLLED_BLOCKS_CHOICES]
    else:
        variants += [(f"shfl S{s} B{b}", True, s, b) for s in pooling._SHFL_SLOTS_CHOICES
                     for b in pooling._SHFL_BLOCKS_CHOICES]
    saved = (pooling.ROLLED_BACKWARD, pooling._ROLLED_STEPS, pooling._ROLLED_BLOCKS,
             pooling.SHUFFLE_BACKWARD, pooling._SHFL_SLOTS, pooling._SHFL_BLOCKS)
    ref = None
    for label, new, s, b in variants:
        pooling.ROLLED_BACKWARD = pooling.SHUFFLE_BACKWARD = new
        if s is not None:
            if layout == "NCHW":
                pooling._ROLLED_STEPS, pooling._ROLLED_BLOCKS = s, b
            else:
                pooling._SHFL_SLOTS, pooling._SHFL_BLOCKS = s, b
        pooling._MEMO.clear()
        try:
            dx = dp.pool_backward(dy, x, y, 3, **opts)
            if ref is None:
                ref = dx
            same = bool(cp.array_equal(dx.view(cp.uint16) if dx.dtype.itemsize == 2 else dx,
                                       ref.view(cp.uint16) if ref.dtype.itemsize == 2 else ref))
            diff = float((nchw(torch.from_dlpack(dx)).float() - tdx.float()).abs().max())
            t = ms(lambda: dp.pool_backward(dy, x, y, 3, **opts))
            problem = pooling._check_problem(x, 3, "max", 2, 1, True, layout)
            expr = pooling._make_plan(problem, "backward", True)[1]
        except Exception as e:
            print(f"{name} {label}: {type(e).__name__}: {e}", flush=True)
            continue
        frac = timing.gbps(floor, t) / COPY
        r = dict(name=name, variant=label, ms=t, torch_ms=t_torch, x_torch=t_torch / t, of_copy=frac,
                 same_as_old=same, max_diff_torch=diff, expr=expr)
        rows.append(r)
        print(f"{name:18s} {label:14s} {t:.4f} ms torch {t_torch:.4f} ({t_torch / t:.2f}x) {frac:.3f} of copy "
              f"dx==old {same} |dx-torch| {diff:.3g} [{expr}]", flush=True)
    (pooling.ROLLED_BACKWARD, pooling._ROLLED_STEPS, pooling._ROLLED_BLOCKS,
     pooling.SHUFFLE_BACKWARD, pooling._SHFL_SLOTS, pooling._SHFL_BLOCKS) = saved
    pooling._MEMO.clear()


for layout, dtype in (("NCHW", cp.float16), ("NCHW", "bfloat16"), ("NHWC", cp.float32)):
    try:
        backward_rows(layout, dtype)
    except Exception as e:
        print(f"{layout} {dtype}: {type(e).__name__}: {e}", flush=True)
    cp.get_default_memory_pool().free_all_blocks()


def global_avg():
    shape = (32, 2048, 7, 7)
    xs = [make(shape, cp.float32) for _ in range(4)]
    dys = [make((32, 2048, 1, 1), cp.float32) for _ in range(4)]
    txs = [torch.from_dlpack(a).detach().clone().requires_grad_() for a in xs]
    tys = [F.avg_pool2d(a, 7, 1, 0) for a in txs]
    tdys = [torch.from_dlpack(a) for a in dys]
    floor_f = xs[0].nbytes + dys[0].nbytes
    ours_f = lambda i: dp.pool(xs[i], 7, mode="avg", stride=1)
    theirs_f = lambda i: F.avg_pool2d(txs[i], 7, 1, 0)
    ours_b = lambda i: dp.pool_backward(dys[i], xs[i], None, 7, mode="avg", stride=1)
    theirs_b = lambda i: torch.autograd.grad(tys[i], txs[i], tdys[i], retain_graph=True)
    for direction, ours, theirs in (("forward", ours_f, theirs_f), ("backward", ours_b, theirs_b)):
        for who, fn in (("ours", ours), ("torch", theirs)):
            for _ in range(5):
                fn(0)
            torch.cuda.synchronize()
            bench = ms(lambda: fn(0), 100)  # the benchmark's way: events around each call, x in L2
            n = 200
            t0 = time.perf_counter()
            for _ in range(n):
                fn(0)
            host = (time.perf_counter() - t0) / n * 1e6
            torch.cuda.synchronize()
            kernel = {}
            for label, idx in (("L2", lambda k: 0), ("rot4", lambda k: k % 4)):
                torch.cuda._sleep(int(50e6))  # ~30 ms of GPU: the calls below queue behind it
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record()
                for k in range(n):
                    fn(idx(k))
                end.record()
                end.synchronize()
                kernel[label] = cp.cuda.get_elapsed_time(start, end) / n * 1e3
            r = dict(name="global_avg_r50", direction=direction, who=who, bench_ms=bench, host_us=host,
                     kernel_us_L2=kernel["L2"], kernel_us_dram=kernel["rot4"],
                     of_copy_dram=floor_f / (kernel["rot4"] * 1e-6) / 1e9 / COPY if direction == "forward" else None)
            rows.append(r)
            print(f"global_avg_r50 {direction:8s} {who:5s} bench {bench * 1e3:6.2f} us, host {host:5.2f} us/call, "
                  f"kernel {kernel['L2']:5.2f} us (x in L2) {kernel['rot4']:5.2f} us (4 copies)", flush=True)


try:
    global_avg()
except Exception as e:
    print(f"global_avg: {type(e).__name__}: {e}", flush=True)
json.dump(dict(copy_GBps=COPY, rows=rows), open(os.path.join(OUT, "poolbwd.json"), "w"), indent=1)
print("== summary (ms, torch ms, x torch, of copy, dx == old path's)")
for name in dict.fromkeys(r["name"] for r in rows if "variant" in r):
    group = [r for r in rows if r.get("name") == name and "variant" in r]
    old = next((r for r in group if r["variant"] == "old"), None)
    best = min(group, key=lambda r: r["ms"])
    for tag, r in (("old", old), ("best", best)):
        if r is not None:
            print(f"{name:18s} {tag:4s} {r['variant']:14s} {r['ms']:.4f} {r['torch_ms']:.4f} {r['x_torch']:.2f}x "
                  f"{r['of_copy']:.3f} {r['same_as_old']}")
for r in rows:
    if r.get("name") == "global_avg_r50":
        print(f"global_avg_r50 {r['direction']:8s} {r['who']:5s} bench {r['bench_ms'] * 1e3:.2f} us host "
              f"{r['host_us']:.2f} us kernel L2 {r['kernel_us_L2']:.2f} us DRAM {r['kernel_us_dram']:.2f} us")
