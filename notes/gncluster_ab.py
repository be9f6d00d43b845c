"""Group-norm backward (NCHW, saved statistics): gn_rows_backward_cluster
(row_normalization.CLUSTER_BACKWARD, at several CLUSTER_BLOCK_BYTES budgets,
which pick the cluster size) against the pipelined path (CLUSTER_BACKWARD =
False: what shipped before), in ONE process, PyTorch's F.group_norm backward
(torch.autograd.grad) side by side, two rounds: ms (median of 20 CUDA-event
timed calls, the bench's `measure`), fraction of the copy bandwidth over the
floor (3x the tensor: read x, read dy, write dx; copy of 1 GiB measured in this
run), torch / ours, bitwise repeatability, and max |r - r_float64| / max
|r_float64| of dx, dgamma, dbeta against a float64 run (the non-cluster path).
    PYTHONPATH=. python notes/gncluster_ab.py"""
import time

import numpy as np
import cupy as cp
import torch

import dnnprims as dp
from dnnprims import _dtypes, row_normalization as rn
from dnnprims.bench import timing

# (name, shape, groups, dtype): the problem in three dtypes; rows of 25 KB
# (x + dy fit the pipelined kernel's four buffers: does the cluster kernel lose
# there? -> CLUSTER_MIN_ROW_BYTES); instance norm (K = 1: CL 1 only).
PROBLEMS = [("gn 64x256x56x56 g32", (64, 256, 56, 56), 32, "float32"),
            ("gn 64x256x56x56 g32", (64, 256, 56, 56), 32, "float16"),
            ("gn 64x256x56x56 g32", (64, 256, 56, 56), 32, "bfloat16"),
            ("gn 64x256x28x28 g32", (64, 256, 28, 28), 32, "float32"),
            ("in 64x256x56x56", (64, 256, 56, 56), 256, "float32")]
# fp32 at the shape: CL 2 at 112 KB (two blocks an SM), CL 1 at 227 KB
# (one 200 KB block an SM), CL 4 at 56 KB, CL 8 at 28 KB; half types halve CL.
VARIANTS = {"pipelined (old)": dict(CLUSTER_BACKWARD=False),
            "cluster 112K": dict(CLUSTER_BACKWARD=True, CLUSTER_BLOCK_BYTES=112 * 1024),
            "cluster 227K": dict(CLUSTER_BACKWARD=True, CLUSTER_BLOCK_BYTES=227 * 1024),
            "cluster 56K": dict(CLUSTER_BACKWARD=True, CLUSTER_BLOCK_BYTES=56 * 1024),
            "cluster 28K": dict(CLUSTER_BACKWARD=True, CLUSTER_BLOCK_BYTES=28 * 1024)}
REPEAT = 20
DEFAULTS = {k: getattr(rn, k) for k in ("CLUSTER_BACKWARD", "CLUSTER_BLOCK_BYTES", "CLUSTER_MIN_ROW_BYTES")}


def copy_gbps():
    src = cp.random.random(2**28, dtype=cp.float32)
    dst = cp.empty_like(src)
    t = timing.measure(lambda: dst.__setitem__(Ellipsis, src), xp=cp, warmup=3, repeat=10)
    return 2 * src.nbytes / (t.median_ms * 1e-3) / 1e9


def ms(fn):
    return timing.measure(fn, xp=cp, repeat=REPEAT).median_ms


def setv(v):
    for k, val in {**DEFAULTS, "CLUSTER_MIN_ROW_BYTES": 0, **v}.items():
        setattr(rn, k, val)


def expressions_used(fn):
    """The row_normalization kernels one call asks for (cluster or not, which CL)."""
    seen = []
    function = rn.FAMILY.function
    rn.FAMILY.function = lambda e: seen.append(e) or function(e)
    try:
        fn()
    finally:
        del rn.FAMILY.function
    return [e.split(",")[0].split("<")[0] + ("<CL " + e.rstrip(">").split(",")[-1].strip() + ">" if "cluster" in e else "")
            for e in seen if "backward" in e]


def to_torch(a):
    if a.dtype == _dtypes.BFLOAT16:
        return torch.as_tensor(a.view(cp.uint16), device="cuda").view(torch.bfloat16)
    return torch.as_tensor(a, device="cuda")


T0 = time.time()
copy = copy_gbps()
print(f"copy {copy:.0f} GB/s  GPU {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}  "
      f"defaults {DEFAULTS}", flush=True)
F = torch.nn.functional
rng = np.random.default_rng(0)
table = []
for name, shape, G, dtype in PROBLEMS:
    dt = _dtypes.BFLOAT16 if dtype == "bfloat16" else np.dtype(dtype)
    C = shape[1]
    x = cp.asarray(rng.uniform(-1, 3, shape).astype(np.float32)).astype(dt)
    dy = cp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(dt)
    pd = np.float32 if _dtypes.is_half(dt) else dt
    gamma = cp.asarray(rng.uniform(0.5, 1.5, C).astype(pd))
    beta = cp.asarray(rng.uniform(-0.5, 0.5, C).astype(pd))
    _, mean, rstd = dp.group_norm(x, G, gamma, beta, return_stats=True)
    setv(dict(CLUSTER_BACKWARD=False))  # the float64 result from the other kernels
    want = dp.group_norm_backward(dy.astype(cp.float64), x.astype(cp.float64), G, gamma.astype(cp.float64))
    scales = [float(cp.abs(w).max()) for w in want]
    tx = to_torch(x).detach().clone().requires_grad_(True)
    tg = to_torch(gamma).to(tx.dtype).requires_grad_(True)  # torch: parameters in x's dtype
    tb = to_torch(beta).to(tx.dtype).requires_grad_(True)
    tdy = to_torch(dy)
    ty = F.group_norm(tx, G, tg, tb, 1e-5)
    torch_fn = lambda: torch.autograd.grad(ty, (tx, tg, tb), tdy, retain_graph=True)  # noqa: E731
    t_err = float((torch_fn()[0].double() - torch.as_tensor(want[0], device="cuda")).abs().max()) / scales[0]
    floor = 3 * x.nbytes
    times = {k: [] for k in VARIANTS}
    times["torch"] = []
    errs, same, used = {}, {}, {}
    for rnd in range(2):
        for k, v in VARIANTS.items():
            setv(v)
            fn = lambda: dp.group_norm_backward(dy, x, G, gamma, mean=mean, rstd=rstd)  # noqa: E731
            if rnd == 0:
                used[k] = " ".join(sorted(set(expressions_used(fn)))) or "?"
                got, again = fn(), fn()
                errs[k] = [float(cp.abs(g.astype(cp.float64) - w).max()) / s for g, w, s in zip(got, want, scales)]
                same[k] = all(bool((a.view(cp.uint8) == b.view(cp.uint8)).all()) for a, b in zip(got, again))
                del got, again
            times[k].append(ms(fn))
        times["torch"].append(ms(torch_fn))
    setv({})
    t_torch = min(times["torch"])
    print(f"\n{name} {dtype}: torch {times['torch'][0]:.4f} / {times['torch'][1]:.4f} ms "
          f"({floor / (t_torch * 1e-3) / 1e9 / copy:.3f} of copy, dx err {t_err:.2e})", flush=True)
    for k in VARIANTS:
        best = min(times[k])
        frac = floor / (best * 1e-3) / 1e9 / copy
        row = (name, dtype, k, times[k][0], times[k][1], t_torch, t_torch / best, frac, errs[k], same[k], used[k])
        table.append(row)
        print(f"  {k:16s} {times[k][0]:8.4f} {times[k][1]:8.4f} ms  x torch {t_torch / best:5.2f}  of copy {frac:.3f}"
              f"  err dx/dg/db {errs[k][0]:.1e}/{errs[k][1]:.1e}/{errs[k][2]:.1e}  repeat-bitwise {same[k]}  "
              f"[{used[k]}]", flush=True)
    del x, dy, want, tx, tdy, ty

print(f"\n== summary (copy {copy:.0f} GB/s, floor 3x tensor, ms = better of two rounds; {time.time() - T0:.0f} s)")
print(f"{'problem':20s} {'dtype':9s} {'variant':16s} {'ms':>8s} {'x torch':>7s} {'of copy':>7s} {'err dx':>8s} bitwise")
for name, dtype, k, r1, r2, tt, xt, frac, err, same_, _ in table:
    print(f"{name:20s} {dtype:9s} {k:16s} {min(r1, r2):8.4f} {xt:7.2f} {frac:7.3f} {err[0]:8.1e} {same_}")
