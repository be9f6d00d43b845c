"""Batch-norm cluster kernels with CLUSTER_MAX_SIZE 8 (shipped) against 16 (the
non-portable 16-block clusters of notes/wip/bn_cluster16.patch), in ONE process,
PyTorch side by side, two rounds (the notes/cluster_ab.py pattern): ms = median
of 20 CUDA-event timed calls (the bench's `measure`), torch / ours, fraction of
the copy bandwidth (1 GiB copy measured in this run) over the floor bytes (3x /
5x the tensor), the CL that ran, launches refused, and max |out - out_float64| /
max |out_float64| (y; dx).  Needs the patch applied (notes/bn16_gpu.sh does).
    PYTHONPATH=. python notes/bn16_ab.py"""
import numpy as np
import cupy as cp
import torch

import dnnprims as dp
from dnnprims import normalization as bn
from dnnprims.bench import timing

assert hasattr(bn, "CLUSTER_MAX_SIZE"), "apply notes/wip/bn_cluster16.patch first"
PROBLEMS = [("bn_big", (64, 256, 56, 56), np.float32, ("train", "backward")),
            ("bn_big_f16", (64, 256, 56, 56), np.float16, ("train", "backward")),
            # N = 32: CL 8 -> 4 planes of 50 KB a block (1 block an SM), CL 16 -> 2 (2 an SM);
            # the backward (x and dy) fits a block only with CL 16 (200 KB; CL 8: 400 KB, other kernels).
            ("bn_r50_early", (32, 64, 112, 112), np.float32, ("train", "backward"))]
VARIANTS = {"CL<=8": dict(CLUSTER_MAX_SIZE=8), "CL<=16": dict(CLUSTER_MAX_SIZE=16)}
REPEAT = 20


def copy_gbps():
    src = cp.random.random(2**28, dtype=cp.float32)
    dst = cp.empty_like(src)
    t = timing.measure(lambda: dst.__setitem__(Ellipsis, src), xp=cp, warmup=3, repeat=10)
    return 2 * src.nbytes / (t.median_ms * 1e-3) / 1e9


def ms(fn):
    return timing.measure(fn, xp=cp, repeat=REPEAT).median_ms


def setv(v):
    for k, val in {"CLUSTER": True, "CLUSTER_BACKWARD": True, "CLUSTER_MAX_SIZE": 8, **v}.items():
        setattr(bn, k, val)


def cluster_sizes(fn):
    """The CL of the cluster kernels a fresh plan of fn prepares (None: other kernels)."""
    seen = []
    prepare = bn.FAMILY.prepare

    def spy(expression, *a, **k):
        if "_cluster<" in expression:
            seen.append(int(expression.rstrip(">").rsplit(",", 1)[1]))
        return prepare(expression, *a, **k)
    bn.FAMILY.prepare = spy
    bn._PLANS.clear()
    bn._MEMO.fast.clear()
    try:
        fn()
    finally:
        bn.FAMILY.prepare = prepare
    return seen[0] if seen else None


def non_portable_probe():
    """The attributes the driver reports for a CL = 16 kernel after the plan set them."""
    from cupy_backends.cuda.api import driver
    spec = "batchnorm_train_cluster<float, float, int, 16>"
    if (cp.cuda.runtime.getDevice(), spec) not in bn.FAMILY._functions:
        return "CL 16 float kernel not loaded"
    ptr = bn.FAMILY.function(spec).kernel.ptr
    names = {10: "CLUSTER_SIZE_MUST_BE_SET", 11: "REQUIRED_CLUSTER_WIDTH", 14: "NON_PORTABLE_CLUSTER_SIZE_ALLOWED",
             8: "MAX_DYNAMIC_SHARED_SIZE_BYTES"}
    out = []
    for a, name in names.items():
        try:
            out.append(f"{name}={driver.funcGetAttribute(a, ptr)}")
        except Exception as e:  # noqa: BLE001 -- a diagnostic line
            out.append(f"{name}=? ({e})")
    return " ".join(out)


copy = copy_gbps()
print(f"copy {copy:.0f} GB/s  GPU {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}", flush=True)
rng = np.random.default_rng(0)
F = torch.nn.functional
print(f"{'problem':24s} {'variant':7s} {'CL':>4s} {'ms r1':>8s} {'ms r2':>8s} {'torch':>8s} {'x torch':>7s} "
      f"{'of copy':>7s} {'refused':>7s} {'err':>9s}", flush=True)
for name, shape, dtype, ops_wanted in PROBLEMS:
    dt = np.dtype(dtype)
    host = rng.uniform(-1, 3, shape).astype(np.float32)
    x = cp.asarray(host).astype(dt)
    c = shape[1]
    gamma = cp.asarray(rng.uniform(0.5, 1.5, c).astype(np.float32))
    beta = cp.asarray(rng.uniform(-0.5, 0.5, c).astype(np.float32))
    rm, rv = cp.zeros(c, np.float32), cp.ones(c, np.float32)
    x64 = x.astype(cp.float64)
    mu = x64.mean(axis=(0, 2, 3), keepdims=True)
    var = x64.var(axis=(0, 2, 3), keepdims=True)
    y64 = (x64 - mu) / cp.sqrt(var + 1e-5) * gamma.astype(cp.float64)[:, None, None] \
        + beta.astype(cp.float64)[:, None, None]
    scale = float(cp.abs(y64).max())
    del y64
    tx = torch.as_tensor(x, device="cuda")
    tg, tb = torch.as_tensor(gamma, device="cuda"), torch.as_tensor(beta, device="cuda")
    trm, trv = torch.as_tensor(rm.copy(), device="cuda"), torch.as_tensor(rv.copy(), device="cuda")
    dy = cp.asarray(rng.uniform(-1, 1, shape).astype(np.float32)).astype(dt)
    setv({})
    _, mean, invstd = dp.batchnorm(x, gamma, beta, training=True, return_stats=True)
    tdy = torch.as_tensor(dy, device="cuda")
    txg, tgg, tbg = (t.detach().clone().requires_grad_() for t in (tx, tg, tb))
    ty = F.batch_norm(txg, None, None, tgg, tbg, training=True)
    ops = {
        "train": (3, lambda: dp.batchnorm(x, gamma, beta, rm, rv, training=True),
                  lambda: F.batch_norm(tx, trm, trv, tg, tb, training=True)),
        "backward": (5, lambda: dp.batchnorm_backward(dy, x, gamma, mean=mean, invstd=invstd)[0],
                     lambda: torch.autograd.grad(ty, (txg, tgg, tbg), tdy, retain_graph=True)),
    }
    for op in ops_wanted:
        passes, fn, torch_fn = ops[op]
        if op == "train":
            ref = lambda: (x64 - mu) / cp.sqrt(var + 1e-5) * gamma.astype(cp.float64)[:, None, None] \
                + beta.astype(cp.float64)[:, None, None]  # noqa: E731
            ref_scale = scale
        else:
            dy64 = dy.astype(cp.float64)
            xhat = (x64 - mu) / cp.sqrt(var + 1e-5)
            n = x.size // c
            sdy = dy64.sum(axis=(0, 2, 3), keepdims=True)
            sdyx = (dy64 * xhat).sum(axis=(0, 2, 3), keepdims=True)
            dx64 = gamma.astype(cp.float64)[:, None, None] / cp.sqrt(var + 1e-5) * (dy64 - sdy / n - xhat * sdyx / n)
            del dy64, xhat
            ref = lambda: dx64  # noqa: E731
            ref_scale = float(cp.abs(dx64).max())
        floor = passes * x.nbytes
        times = {k: [] for k in VARIANTS}
        times["torch"] = []
        errs, cls, refused = {}, {}, {}
        for k, v in VARIANTS.items():  # a fresh plan each: its first launch is where a refusal shows
            setv(v)
            before = bn.cluster_refusals
            cls[k] = cluster_sizes(fn)
            fn()
            refused[k] = bn.cluster_refusals - before
        for rnd in range(2):
            for k, v in VARIANTS.items():
                setv(v)
                out = fn()
                if rnd == 0:
                    errs[k] = float(cp.abs(out.astype(cp.float64) - ref()).max()) / ref_scale
                times[k].append(ms(fn))
            times["torch"].append(ms(torch_fn))
        setv({})
        t_torch = min(times["torch"])
        for k in VARIANTS:
            best = min(times[k])
            print(f"{name + ' ' + op:24s} {k:7s} {str(cls[k]):>4s} {times[k][0]:8.4f} {times[k][1]:8.4f} "
                  f"{t_torch:8.4f} {t_torch / best:7.2f} {floor / (best * 1e-3) / 1e9 / copy:7.3f} "
                  f"{refused[k]:7d} {errs[k]:9.2e}", flush=True)
        if op == "backward":
            del dx64
print("CL 16 kernel attributes:", non_portable_probe(), flush=True)
print(f"cluster launches refused in this process: {bn.cluster_refusals}", flush=True)
