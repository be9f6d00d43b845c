"""Group norm forward as a thread-block cluster per row (helper gnorm, notes/gnorm.md):
old (main's dnnprims/ + kernels/, copied aside by notes/ab/patch_ab.sh) vs new
(notes/wip/gnorm.patch applied: gn_rows_forward_cluster, switch
row_normalization.CLUSTER_FORWARD) vs PyTorch, in ONE process.

Forward rows (the decision): variants
  old       main: gn_rows_forward_pipelined (persistent, one 1024-thread block an SM at 100 KB rows)
  new       the patch's defaults: CLUSTER_FORWARD_BYTES 16 KB, CLUSTER_FORWARD_ITEMS 8
            (64x256x56x56: fp32 CL 8, fp16 / bf16 CL 4, 12.5 KB and 128 threads a block)
  new 32K   budget 32 KB (fp32 CL 4, half CL 2: 25 KB blocks)
  new 8K    budget 8 KB (half types CL 8: 6.3 KB blocks; fp32 as new)
  new i4    CLUSTER_FORWARD_ITEMS 4 (256-thread blocks: 6 an SM at 40 registers)
  new i16   CLUSTER_FORWARD_ITEMS 16 (64-thread blocks: 16 an SM, by shared memory; default 128: 12)
  new off   CLUSTER_FORWARD = False in the patched tree (must equal old: a control)
  torch     F.group_norm (parameters in x's dtype, as PyTorch requires)
Backward rows: the patch leaves the backward alone (gn_rows_backward_cluster): old vs new is
a control for the noise, torch autograd side by side; "new b14K" is the shipped backward with
CLUSTER_BLOCK_BYTES = 14 KB (16-bit rows: CL 8, 12.5 KB blocks instead of CL 4, 25 KB; fp32 unchanged).  Problems:
  gn_64x256x56x56_g32   fp32, fp16, bf16 forward and backward (the bench's row; x 205 MB fp32)
  gn_32x640x40x40_g32   K 20 (CL 4 fp32, 2 fp16), 40x40 planes: fp32 forward + backward, fp16 forward
  gn_1024x128x16x16_g32 small rows (K 4 x 256 = 4 KB fp32, CL 1, 64-thread blocks): fp32 forward
  in_64x256x56x56       instance norm fp32 forward (K 1: CL 1, one 12.5 KB plane a block)
  ln_65536x1024         layer norm fp32 forward (untouched path: control)
Floors as the bench counts them: forward 2 x.nbytes (read x, write y), backward 3 x.nbytes.
Before timing, each variant's outputs (y, mean, rstd; dx, dgamma, dbeta) are checked against
old (max |diff| within TOL of each output's scale; failures print CHECK FAILED, also under the
table), and the kernels each variant ran are printed (the forward's new rows must say
gn_rows_forward_cluster<..., CL>).
    python notes/gnorm_ab.py OLD_ROOT --json PATH"""
import sys

sys.path.insert(0, "notes/ab")
import common  # noqa: E402

import numpy as np  # noqa: E402
import cupy as cp  # noqa: E402
import torch  # noqa: E402

import dnnprims as new  # noqa: E402
from dnnprims import _dtypes, row_normalization as new_rn  # noqa: E402

old = common.load_old(sys.argv[1])
from dnnprims_old import row_normalization as old_rn  # noqa: E402

assert old_rn.__file__ != new_rn.__file__
assert "gn_rows_forward_cluster" not in old_rn.FAMILY.source, "old must be unpatched"
assert "gn_rows_forward_cluster" in new_rn.FAMILY.source, "new must be patched"
JSON = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
F = torch.nn.functional
TOL = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 2e-2}
SHORT = {"float32": "", "float16": " f16", "bfloat16": " bf16"}  # the problem column's dtype tag
FAILED = []


def outputs(r):
    return r if isinstance(r, tuple) else (r,)


def check(name, fns, tol):
    ref = outputs(fns["old"]())
    diffs = {}
    for tag, fn in fns.items():
        if tag in ("old", "torch"):
            continue
        got = outputs(fn())
        worst = 0.0
        for i, (a, b) in enumerate(zip(got, ref)):
            d = common.max_abs(a, b)
            worst = max(worst, d)
            scale = float(cp.abs(b.astype(cp.float64)).max())
            if not d <= tol * max(scale, 1.0):
                FAILED.append(f"CHECK FAILED {name} {tag} output {i}: max |diff| {d:.3e} (scale {scale:.3e})")
                print(FAILED[-1], flush=True)
        diffs[tag] = worst
    return diffs


def kernels_ran(fns):
    """{tag: the row kernels a call of each new-tree variant asked for} (one untimed call)."""
    function = new_rn.FAMILY.function
    got = {}
    for tag, fn in fns.items():
        if not tag.startswith("new"):
            continue
        ran = []
        new_rn.FAMILY.function = lambda e: ran.append(e) or function(e)  # noqa: E731
        try:
            fn()
        finally:
            del new_rn.FAMILY.function  # the class's method again
        got[tag] = sorted({e for e in ran if not e.startswith("norm_param_grads_finish")})
        print(f"  {tag}: {', '.join(got[tag])}", flush=True)
    return got


def to_torch(a):
    if a.dtype == _dtypes.BFLOAT16:
        return torch.as_tensor(a.view(cp.uint16), device="cuda").view(torch.bfloat16)
    return torch.as_tensor(a, device="cuda")


def variants(fn_new, stats_new=None):
    """The new tree's forward variants of one call (switches set during each call)."""
    s = common.switched
    return {"new": fn_new,
            "new 32K": s(new_rn, fn_new, CLUSTER_FORWARD_BYTES=32 * 1024),
            "new 8K": s(new_rn, fn_new, CLUSTER_FORWARD_BYTES=8 * 1024),
            "new i4": s(new_rn, fn_new, CLUSTER_FORWARD_ITEMS=4),
            "new i16": s(new_rn, fn_new, CLUSTER_FORWARD_ITEMS=16),
            "new off": s(new_rn, fn_new, CLUSTER_FORWARD=False)}


def group_norm(name, shape, G, dtype, backward=True, instance=False):
    dt = _dtypes.BFLOAT16 if dtype == "bfloat16" else np.dtype(dtype)
    rng = cp.random.default_rng(7)
    x = (rng.random(shape, dtype=cp.float32) * 4 - 1).astype(dt)
    dy = (rng.random(shape, dtype=cp.float32) * 2 - 1).astype(dt)
    C = shape[1]
    pd = np.float32 if _dtypes.is_half(dt) else dt
    gamma = (rng.random(C, dtype=cp.float32) + 0.5).astype(pd)
    beta = (rng.random(C, dtype=cp.float32) - 0.5).astype(pd)
    n = x.nbytes
    tx, tdy = to_torch(x), to_torch(dy)
    tg, tb = to_torch(gamma).to(tx.dtype), to_torch(beta).to(tx.dtype)
    tol = TOL[dtype]
    label = f"{'instance' if instance else 'group'}_norm {dtype}"
    out = []
    if instance:
        fwd = {"old": lambda: old.instance_norm(x, gamma, beta, return_stats=True),
               "new": lambda: new.instance_norm(x, gamma, beta, return_stats=True),
               "torch": lambda: F.instance_norm(tx, weight=tg, bias=tb, eps=1e-5)}
    else:
        fwd = {"old": lambda: old.group_norm(x, G, gamma, beta, return_stats=True),
               "new": lambda: new.group_norm(x, G, gamma, beta, return_stats=True),
               "torch": lambda: F.group_norm(tx, G, tg, tb, 1e-5)}
    fwd.update(variants(fwd["new"]))
    fwd = {"old": fwd.pop("old"), **fwd}
    print(f"{name} fwd {dtype}:", flush=True)
    ran = kernels_ran(fwd)
    for tag, exprs in ran.items():
        if tag != "new off" and not any(e.startswith("gn_rows_forward_cluster<") for e in exprs):
            FAILED.append(f"CHECK FAILED {name} fwd {dtype} {tag}: the cluster kernel did not run ({exprs})")
            print(FAILED[-1], flush=True)
    out.append(common.ab_problem(f"{name} fwd{SHORT[dtype]}", 2 * n, fwd,
                                 check(f"{label} forward", fwd, tol), f"{label} forward; new: {ran['new']}"))
    if backward:
        _, mean_new, rstd_new = new.group_norm(x, G, gamma, beta, return_stats=True)
        _, mean_old, rstd_old = old.group_norm(x, G, gamma, beta, return_stats=True)
        txg = tx.detach().clone().requires_grad_()
        tgg, tbg = tg.detach().clone().requires_grad_(), tb.detach().clone().requires_grad_()
        ty = F.group_norm(txg, G, tgg, tbg, 1e-5)
        bwd = {"old": lambda: old.group_norm_backward(dy, x, G, gamma, mean=mean_old, rstd=rstd_old),
               "new": lambda: new.group_norm_backward(dy, x, G, gamma, mean=mean_new, rstd=rstd_new),
               "torch": lambda: torch.autograd.grad(ty, (txg, tgg, tbg), tdy, retain_graph=True)}
        # the backward cluster at a 14 KB budget: 16-bit rows CL 8 (12.5 KB of x + dy a block, like
        # fp32's), fp32 as shipped (no size fits: the largest, 8)
        bwd["new b14K"] = common.switched(new_rn, bwd["new"], CLUSTER_BLOCK_BYTES=14 * 1024)
        out.append(common.ab_problem(f"{name} bwd{SHORT[dtype]}", 3 * n, bwd,
                                     check(f"{label} backward", bwd, tol),
                                     f"{label} backward (unchanged kernels: control)"))
    return out


def layer_norm_control():
    rng = cp.random.default_rng(5)
    x = rng.random((65536, 1024), dtype=cp.float32) * 4 - 1
    gamma, beta = rng.random(1024, dtype=cp.float32) + 0.5, rng.random(1024, dtype=cp.float32) - 0.5
    tx, tg, tb = (torch.as_tensor(a, device="cuda") for a in (x, gamma, beta))
    fwd = {"old": lambda: old.layer_norm(x, 1024, gamma, beta, return_stats=True),
           "new": lambda: new.layer_norm(x, 1024, gamma, beta, return_stats=True),
           "torch": lambda: F.layer_norm(tx, (1024,), tg, tb, 1e-5)}
    return [common.ab_problem("ln_65536x1024 fwd", 2 * x.nbytes, fwd, check("layer_norm forward", fwd, 1e-4),
                              "layer_norm forward (untouched path: control)")]


def summary(rows, copy):
    """One line a problem (patch_ab.sh shows the log's last 40 lines): device ms (best round) of old,
    new, the best new variant, torch; of copy = floor at the 1 GiB copy bandwidth / device ms."""
    print(f"\nsummary (device ms, best round; of copy = floor / copy {copy:.0f} GB/s / device ms)")
    print(f"{'problem':29s} {'old':>7s} {'new':>7s} {'best variant':>20s} {'torch':>7s} {'x old':>6s}"
          f" {'copy old':>8s} {'copy new':>8s} {'copy best':>9s} {'copy torch':>10s}")
    for r in rows:
        best = {tag: min(abs(t) for t in v["device"]) if v["device"] else float("nan")
                for tag, v in r["ms"].items()}
        floor_ms = r["floor_bytes"] / copy / 1e6
        news = {t: v for t, v in best.items() if t.startswith("new") and t != "new off" and v == v}
        bt = min(news, key=news.get) if news else "new"
        print(f"{r['problem']:29s} {best['old']:7.4f} {best['new']:7.4f} {bt:>11s} {best[bt]:8.4f}"
              f" {best['torch']:7.4f} {best['old'] / best['new']:6.3f} {floor_ms / best['old']:8.3f}"
              f" {floor_ms / best['new']:8.3f} {floor_ms / best[bt]:9.3f} {floor_ms / best['torch']:10.3f}")


def main():
    print("old:", old_rn.__file__, "new:", new_rn.__file__, flush=True)
    copy = common.copy_gbps()
    rows = []
    for dtype in ("float32", "float16", "bfloat16"):
        rows += group_norm("gn_64x256x56x56_g32", (64, 256, 56, 56), 32, dtype)
        cp.get_default_memory_pool().free_all_blocks()
    rows += group_norm("gn_32x640x40x40_g32", (32, 640, 40, 40), 32, "float32")
    rows += group_norm("gn_32x640x40x40_g32", (32, 640, 40, 40), 32, "float16", backward=False)
    cp.get_default_memory_pool().free_all_blocks()
    rows += group_norm("gn_1024x128x16x16_g32", (1024, 128, 16, 16), 32, "float32", backward=False)
    cp.get_default_memory_pool().free_all_blocks()
    rows += group_norm("in_64x256x56x56", (64, 256, 56, 56), 256, "float32", backward=False, instance=True)
    cp.get_default_memory_pool().free_all_blocks()
    rows += layer_norm_control()
    common.print_table(rows, copy, JSON)
    summary(rows, copy)
    print("\n".join(FAILED) if FAILED else "checks: every variant within tolerance of old; the cluster kernel ran")


if __name__ == "__main__":
    main()
