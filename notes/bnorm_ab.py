"""Old (main's tree) against new (this branch) batch norm in ONE process, PyTorch
side by side, A B A B: ms (median of 20 CUDA-event timed calls, the bench's
`measure`), fraction of the copy bandwidth over the bench's floor bytes (copy of
1 GiB measured in this run), torch / ours; plus old-vs-new output differences.
    python notes/bnorm_ab.py OLD_ROOT [--json PATH]"""
import importlib.util
import json
import sys

import numpy as np
import cupy as cp
import torch

import dnnprims as new
from dnnprims.bench import timing

OLD_ROOT = sys.argv[1]
spec = importlib.util.spec_from_file_location("dnnprims_old", f"{OLD_ROOT}/dnnprims/__init__.py",
                                              submodule_search_locations=[f"{OLD_ROOT}/dnnprims"])
old = importlib.util.module_from_spec(spec)
sys.modules["dnnprims_old"] = old
spec.loader.exec_module(old)
from dnnprims_old import normalization as old_norm  # noqa: E402
from dnnprims import normalization as new_norm  # noqa: E402
assert old_norm.__file__ != new_norm.__file__, (old_norm.__file__, new_norm.__file__)
print("old:", old_norm.__file__, "new:", new_norm.__file__, flush=True)

PROBLEMS = [("bn_big_f16", (64, 256, 56, 56), "NCHW", np.float16), ("bn_big_nhwc", (64, 56, 56, 256), "NHWC", np.float32),
            ("bn_big", (64, 256, 56, 56), "NCHW", np.float32), ("bn_r50_late", (32, 2048, 7, 7), "NCHW", np.float32)]
REPEAT = 20


def copy_gbps():
    src = cp.random.random(2**28, dtype=cp.float32)
    dst = cp.empty_like(src)
    t = timing.measure(lambda: dst.__setitem__(Ellipsis, src), xp=cp, warmup=3, repeat=10)
    return 2 * src.nbytes / (t.median_ms * 1e-3) / 1e9


def ms(fn):
    return timing.measure(fn, xp=cp, repeat=REPEAT).median_ms


rows = []
copy = copy_gbps()
print(f"copy {copy:.0f} GB/s", flush=True)
rng = np.random.default_rng(0)
F = torch.nn.functional
for name, shape, layout, dtype in PROBLEMS:
    x = cp.asarray(rng.uniform(-1, 3, shape).astype(dtype))
    dy = cp.asarray(rng.uniform(-1, 1, shape).astype(dtype))
    c = shape[1] if layout == "NCHW" else shape[-1]
    gamma = cp.asarray(rng.uniform(0.5, 1.5, c).astype(np.float32))
    beta = cp.asarray(rng.uniform(-0.5, 0.5, c).astype(np.float32))
    rm, rv = cp.zeros(c, np.float32), cp.ones(c, np.float32)
    n = x.nbytes
    fns = {}
    for tag, mod in (("old", old), ("new", new)):
        _, mean, invstd = mod.batchnorm(x, gamma, beta, training=True, layout=layout, return_stats=True)
        fns[tag] = {
            "train": (lambda m=mod: m.batchnorm(x, gamma, beta, rm, rv, training=True, layout=layout)),
            "infer": (lambda m=mod: m.batchnorm(x, gamma, beta, rm, rv, training=False, layout=layout)),
            "backward": (lambda m=mod, a=mean, b=invstd: m.batchnorm_backward(dy, x, gamma, mean=a, invstd=b,
                                                                              layout=layout)),
        }
    tx, tdy = torch.as_tensor(x, device="cuda"), torch.as_tensor(dy, device="cuda")
    if layout == "NHWC":
        tx, tdy = tx.permute(0, 3, 1, 2), tdy.permute(0, 3, 1, 2)
    tg, tb = torch.as_tensor(gamma, device="cuda"), torch.as_tensor(beta, device="cuda")
    trm, trv = torch.as_tensor(rm.copy(), device="cuda"), torch.as_tensor(rv.copy(), device="cuda")
    txg, tgg, tbg = (t.detach().clone().requires_grad_() for t in (tx, tg, tb))
    ty = F.batch_norm(txg, None, None, tgg, tbg, training=True)
    fns["torch"] = {"train": lambda: F.batch_norm(tx, trm, trv, tg, tb, training=True),
                    "infer": lambda: F.batch_norm(tx, trm, trv, tg, tb, training=False),
                    "backward": lambda: torch.autograd.grad(ty, (txg, tgg, tbg), tdy, retain_graph=True)}
    # old vs new outputs (the same partials merged in the same order: expected bitwise equal)
    diffs = {}
    for op in ("train", "backward"):
        a, b = fns["old"][op](), fns["new"][op]()
        a = a if isinstance(a, tuple) else (a,)
        b = b if isinstance(b, tuple) else (b,)
        diffs[op] = max(float(cp.abs(p.astype(cp.float64) - q.astype(cp.float64)).max()) for p, q in zip(a, b))
    floors = {"train": 3 * n, "infer": 2 * n, "backward": 5 * n}
    for op in ("train", "infer", "backward"):
        got = {"old": [], "new": [], "torch": []}
        for _ in range(2):  # A B A B
            for tag in ("old", "new", "torch"):
                got[tag].append(ms(fns[tag][op]))
        row = {"problem": name, "op": op, "floor_bytes": floors[op], "copy_GBps": copy,
               "old_diff": diffs.get(op)}
        for tag, t in got.items():
            row[tag + "_ms"] = t
        best = {tag: min(t) for tag, t in got.items()}
        row["new_of_copy"] = floors[op] / (best["new"] * 1e-3) / 1e9 / copy
        row["old_of_copy"] = floors[op] / (best["old"] * 1e-3) / 1e9 / copy
        row["torch_over_new"] = best["torch"] / best["new"]
        row["torch_over_old"] = best["torch"] / best["old"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    del x, dy, fns, tx, tdy, ty, txg
    cp.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()

print()
print(f"copy {copy:.0f} GB/s; ms = the two A/B medians; 'of copy' and x torch from the better of the two")
print(f"{'problem':12s} {'op':9s} {'old ms':>15s} {'new ms':>15s} {'torch ms':>15s} {'old/cp':>6s} {'new/cp':>6s}"
      f" {'xT old':>6s} {'xT new':>6s} {'old-new':>8s}")
for r in rows:
    f = lambda t: "/".join(f"{v:.4f}" for v in t)  # noqa: E731
    d = r["old_diff"]
    print(f"{r['problem']:12s} {r['op']:9s} {f(r['old_ms']):>15s} {f(r['new_ms']):>15s} {f(r['torch_ms']):>15s}"
          f" {r['old_of_copy']:6.3f} {r['new_of_copy']:6.3f} {r['torch_over_old']:6.2f} {r['torch_over_new']:6.2f}"
          f" {'-' if d is None else f'{d:.1e}':>8s}")
if len(sys.argv) > 3 and sys.argv[2] == "--json":
    json.dump(rows, open(sys.argv[3], "w"), indent=1)


def kernel_profile(label, fn, calls=5):
    """GPU kernels of `fn` (CUPTI through torch.profiler: CuPy's launches too), us per call."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    for e in prof.key_averages():
        total = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if total:
            print(f"  {label:22s} {e.count // calls:2d}x {total / calls:8.1f} us/call  {e.key[:90]}")


print("\nkernels per call (torch.profiler), bn_big_nhwc fp32 and bn_big_f16:")
try:
    for name, shape, layout, dtype in PROBLEMS[:2]:
        x = cp.asarray(rng.uniform(-1, 3, shape).astype(dtype))
        dy = cp.asarray(rng.uniform(-1, 1, shape).astype(dtype))
        c = shape[1] if layout == "NCHW" else shape[-1]
        gamma, beta = cp.ones(c, np.float32), cp.zeros(c, np.float32)
        _, mean, invstd = new.batchnorm(x, gamma, beta, layout=layout, return_stats=True)
        tx, tdy = torch.as_tensor(x, device="cuda"), torch.as_tensor(dy, device="cuda")
        if layout == "NHWC":
            tx, tdy = tx.permute(0, 3, 1, 2), tdy.permute(0, 3, 1, 2)
        tg, tb = torch.as_tensor(gamma, device="cuda"), torch.as_tensor(beta, device="cuda")
        txg = tx.detach().clone().requires_grad_()
        ty = F.batch_norm(txg, None, None, tg, tb, training=True)
        kernel_profile(f"{name} new train", lambda: new.batchnorm(x, gamma, beta, layout=layout))
        kernel_profile(f"{name} torch train", lambda: F.batch_norm(tx, None, None, tg, tb, training=True))
        kernel_profile(f"{name} new backward",
                       lambda: new.batchnorm_backward(dy, x, gamma, mean=mean, invstd=invstd, layout=layout))
        kernel_profile(f"{name} torch backward", lambda: torch.autograd.grad(ty, (txg,), tdy, retain_graph=True))
        del x, dy, tx, tdy, txg, ty
        cp.get_default_memory_pool().free_all_blocks()
except Exception as e:  # the A/B table above is what matters
    print("profile failed:", type(e).__name__, e)
