"""Batch-norm training forward and backward (saved statistics): the cluster
kernels (CLUSTER, CLUSTER_BACKWARD) against the other paths, in ONE process,
PyTorch side by side, two rounds: ms (median of 20 CUDA-event timed calls, the
bench's `measure`), fraction of the copy bandwidth over the bench's floor bytes
(3x / 5x the tensor; copy of 1 GiB measured in this run), torch / ours, and each
variant's max |out - out_float64| / max |out_float64| (y; dx).
    PYTHONPATH=. python notes/cluster_ab.py"""
import numpy as np
import cupy as cp
import torch

import dnnprims as dp
from dnnprims import normalization as bn
from dnnprims.bench import timing

PROBLEMS = [("bn_big", (64, 256, 56, 56), np.float32), ("bn_big_f16", (64, 256, 56, 56), np.float16),
            ("bn_big_bf16", (64, 256, 56, 56), "bfloat16"), ("bn_r50_early", (32, 64, 112, 112), np.float32),
            ("bn_r50_early_f16", (32, 64, 112, 112), np.float16), ("bn_r50_mid", (32, 256, 28, 28), np.float32),
            ("bn_64x128x28", (64, 128, 28, 28), np.float32), ("bn_big_f64", (64, 256, 56, 56), np.float64)]
VARIANTS = {"other": dict(CLUSTER=False, CLUSTER_BACKWARD=False), "cluster": dict(),
            "cluster 112K": dict(CLUSTER_BLOCK_BYTES=112 * 1024)}
REPEAT = 20


def copy_gbps():
    src = cp.random.random(2**28, dtype=cp.float32)
    dst = cp.empty_like(src)
    t = timing.measure(lambda: dst.__setitem__(Ellipsis, src), xp=cp, warmup=3, repeat=10)
    return 2 * src.nbytes / (t.median_ms * 1e-3) / 1e9


def ms(fn):
    return timing.measure(fn, xp=cp, repeat=REPEAT).median_ms


def setv(v):
    for k, val in {"CLUSTER": True, "CLUSTER_BACKWARD": True, "CLUSTER_BLOCK_BYTES": 1 << 30, **v}.items():
        setattr(bn, k, val)


copy = copy_gbps()
print(f"copy {copy:.0f} GB/s  GPU {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}", flush=True)
rng = np.random.default_rng(0)
F = torch.nn.functional
print(f"{'problem':26s} {'variant':13s} {'ms r1':>8s} {'ms r2':>8s} {'torch':>8s} {'x torch':>7s} {'of copy':>7s} {'err':>9s}")
for name, shape, dtype in PROBLEMS:
    dt = dp._dtypes.BFLOAT16 if dtype == "bfloat16" else np.dtype(dtype)
    host = rng.uniform(-1, 3, shape).astype(np.float32)
    x = cp.asarray(host).astype(dt)
    c = shape[1]
    pd = np.float64 if dt == np.float64 else np.float32
    gamma = cp.asarray(rng.uniform(0.5, 1.5, c).astype(pd))
    beta = cp.asarray(rng.uniform(-0.5, 0.5, c).astype(pd))
    rm, rv = cp.zeros(c, pd), cp.ones(c, pd)
    x64 = x.astype(cp.float64)
    mu = x64.mean(axis=(0, 2, 3), keepdims=True)
    var = x64.var(axis=(0, 2, 3), keepdims=True)
    y64 = (x64 - mu) / cp.sqrt(var + 1e-5) * gamma.astype(cp.float64)[:, None, None] \
        + beta.astype(cp.float64)[:, None, None]
    scale = float(cp.abs(y64).max())
    if dt == dp._dtypes.BFLOAT16:
        tx = torch.as_tensor(x.view(cp.uint16), device="cuda").view(torch.bfloat16)
    else:
        tx = torch.as_tensor(x, device="cuda")
    tg, tb = torch.as_tensor(gamma, device="cuda"), torch.as_tensor(beta, device="cuda")
    trm, trv = torch.as_tensor(rm.copy(), device="cuda"), torch.as_tensor(rv.copy(), device="cuda")
    dy = cp.asarray(rng.uniform(-1, 1, shape).astype(np.float32)).astype(dt)
    dy64 = dy.astype(cp.float64)
    _, mean, invstd = dp.batchnorm(x, gamma, beta, training=True, return_stats=True)
    xhat = (x64 - mu) / cp.sqrt(var + 1e-5)
    n = x.size // c
    g64 = gamma.astype(cp.float64)[:, None, None]
    sdy = dy64.sum(axis=(0, 2, 3), keepdims=True)
    sdyx = (dy64 * xhat).sum(axis=(0, 2, 3), keepdims=True)
    dx64 = g64 / cp.sqrt(var + 1e-5) * (dy64 - sdy / n - xhat * sdyx / n)
    dscale = float(cp.abs(dx64).max())
    if dt == dp._dtypes.BFLOAT16:
        tdy = torch.as_tensor(dy.view(cp.uint16), device="cuda").view(torch.bfloat16)
    else:
        tdy = torch.as_tensor(dy, device="cuda")
    txg, tgg, tbg = (t.detach().clone().requires_grad_() for t in (tx, tg, tb))
    ty = F.batch_norm(txg, None, None, tgg, tbg, training=True)
    ops = {
        "train": (3, lambda: dp.batchnorm(x, gamma, beta, rm, rv, training=True), y64, scale,
                  lambda: F.batch_norm(tx, trm, trv, tg, tb, training=True)),
        "backward": (5, lambda: dp.batchnorm_backward(dy, x, gamma, mean=mean, invstd=invstd)[0], dx64, dscale,
                     lambda: torch.autograd.grad(ty, (txg, tgg, tbg), tdy, retain_graph=True)),
    }
    for op, (passes, fn, ref, ref_scale, torch_fn) in ops.items():
        floor = passes * x.nbytes
        times = {k: [] for k in VARIANTS}
        times["torch"] = []
        errs = {}
        for rnd in range(2):
            for k, v in VARIANTS.items():
                setv(v)
                out = fn()
                if rnd == 0:
                    errs[k] = float(cp.abs(out.astype(cp.float64) - ref).max()) / ref_scale
                times[k].append(ms(fn))
            times["torch"].append(ms(torch_fn))
        setv({})
        t_torch = min(times["torch"])
        for k in VARIANTS:
            best = min(times[k])
            print(f"{name + ' ' + op:26s} {k:13s} {times[k][0]:8.4f} {times[k][1]:8.4f} {t_torch:8.4f} "
                  f"{t_torch / best:7.2f} {floor / (best * 1e-3) / 1e9 / copy:7.3f} {errs[k]:9.2e}", flush=True)
