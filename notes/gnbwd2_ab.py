"""Group / instance norm backward with each block's x and dy in registers (helper gnbwd2,
notes/gnbwd2.md): old (main's dnnprims/ + kernels/, copied aside by notes/ab/patch_ab.sh:
gn_rows_backward_cluster, x and dy bulk-copied into shared memory) vs new
(notes/wip/gnbwd2.patch applied: gn_rows_backward_registers, switch
row_normalization.REGISTER_BACKWARD) vs PyTorch autograd, in ONE process.

Variants (the new tree, switches set during each call):
  new       the patch's defaults: REGISTER_BACKWARD_BYTES 28 KB, ITEMS 4, wide finish
            (64x256x56x56: fp32 CL 8, one plane a block, 224 threads; fp16 / bf16 CL 4,
            two planes, 256 threads; 32x640x40x40 fp32: CL 4, 5 planes, ITEMS 8, 320 threads)
  new i8    REGISTER_BACKWARD_ITEMS 8 (fp32 bench: 128 threads, 7 of 8 vectors a thread used)
  new 56K   budget 56 KB (fp32 CL 4: two planes, 448 threads; 16-bit CL 2: four, 512)
  new 14K   budget 14 KB (16-bit CL 8: one plane a block, 128 threads; fp32 as new)
  new sf    the serial finish (norm_param_grads_finish, as old) instead of the wide one
  new off   REGISTER_BACKWARD = False in the patched tree (must equal old: a control)
  torch     autograd of F.group_norm / F.instance_norm (parameters in x's dtype)
Problems (backward floor 3 x.nbytes: read x, dy; write dx):
  gn_64x256x56x56_g32   fp32, fp16, bf16 (the bench's row; x 205 MB fp32)
  gn_32x640x40x40_g32   fp32, fp16 (K 20: CL 4)
  in_64x256x56x56       instance norm fp32 (K 1: CL 1)
  gn_1024x128x16x16_g32 small rows (K 4 x 256: 8 KB of x + dy a row, ITEMS 4, 128 threads)
  ln_65536x1024         layer norm fp32 backward (untouched path: control)
Before timing, each variant's (dx, dgamma, dbeta) are checked against old (max |diff| within
TOL of each output's scale; failures print CHECK FAILED, also under the table), and the
kernels each new variant ran are printed (every "new*" but "new off" must name
gn_rows_backward_registers).
    python notes/gnbwd2_ab.py OLD_ROOT --json PATH"""
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
assert "gn_rows_backward_registers" not in old_rn.FAMILY.source, "old must be unpatched"
assert "gn_rows_backward_registers" in new_rn.FAMILY.source, "new must be patched"
JSON = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
F = torch.nn.functional
TOL = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 2e-2}
SHORT = {"float32": "", "float16": " f16", "bfloat16": " bf16"}
FAILED = []


def check(name, fns, tol):
    ref = fns["old"]()
    diffs = {}
    for tag, fn in fns.items():
        if tag in ("old", "torch"):
            continue
        got = fn()
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


def kernels_ran(fns, name, must=True):
    """{tag: the row kernels one untimed call of each new-tree variant asked for}."""
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
        got[tag] = sorted(set(ran))
        print(f"  {tag}: {', '.join(got[tag])}", flush=True)
        uses = any(e.startswith("gn_rows_backward_registers<") for e in ran)
        if must and uses != (tag != "new off"):
            FAILED.append(f"CHECK FAILED {name} {tag}: register kernel {'ran' if uses else 'did not run'} ({ran})")
            print(FAILED[-1], flush=True)
    return got


def to_torch(a):
    if a.dtype == _dtypes.BFLOAT16:
        return torch.as_tensor(a.view(cp.uint16), device="cuda").view(torch.bfloat16)
    return torch.as_tensor(a, device="cuda")


def variants(fn):
    s = common.switched
    return {"new": fn,
            "new i8": s(new_rn, fn, REGISTER_BACKWARD_ITEMS=8),
            "new 56K": s(new_rn, fn, REGISTER_BACKWARD_BYTES=56 * 1024),
            "new 14K": s(new_rn, fn, REGISTER_BACKWARD_BYTES=14 * 1024),
            "new sf": s(new_rn, fn, REGISTER_BACKWARD_WIDE_FINISH=False),
            "new off": s(new_rn, fn, REGISTER_BACKWARD=False)}


def problem(name, shape, G, dtype, instance=False):
    dt = _dtypes.BFLOAT16 if dtype == "bfloat16" else np.dtype(dtype)
    rng = cp.random.default_rng(7)
    x = (rng.random(shape, dtype=cp.float32) * 4 - 1).astype(dt)
    dy = (rng.random(shape, dtype=cp.float32) * 2 - 1).astype(dt)
    C = shape[1]
    pd = np.float32 if _dtypes.is_half(dt) else dt
    gamma = (rng.random(C, dtype=cp.float32) + 0.5).astype(pd)
    beta = (rng.random(C, dtype=cp.float32) - 0.5).astype(pd)
    tx, tdy = to_torch(x), to_torch(dy)
    tg, tb = to_torch(gamma).to(tx.dtype), to_torch(beta).to(tx.dtype)
    txg = tx.detach().clone().requires_grad_()
    tgg, tbg = tg.detach().clone().requires_grad_(), tb.detach().clone().requires_grad_()
    if instance:
        _, m_new, r_new = new.instance_norm(x, gamma, beta, return_stats=True)
        _, m_old, r_old = old.instance_norm(x, gamma, beta, return_stats=True)
        ty = F.instance_norm(txg, weight=tgg, bias=tbg, eps=1e-5)
        fns = {"old": lambda: old.instance_norm_backward(dy, x, gamma, mean=m_old, rstd=r_old),
               "new": lambda: new.instance_norm_backward(dy, x, gamma, mean=m_new, rstd=r_new)}
    else:
        _, m_new, r_new = new.group_norm(x, G, gamma, beta, return_stats=True)
        _, m_old, r_old = old.group_norm(x, G, gamma, beta, return_stats=True)
        ty = F.group_norm(txg, G, tgg, tbg, 1e-5)
        fns = {"old": lambda: old.group_norm_backward(dy, x, G, gamma, mean=m_old, rstd=r_old),
               "new": lambda: new.group_norm_backward(dy, x, G, gamma, mean=m_new, rstd=r_new)}
    fns.update(variants(fns["new"]))
    fns["torch"] = lambda: torch.autograd.grad(ty, (txg, tgg, tbg), tdy, retain_graph=True)
    label = f"{'instance' if instance else 'group'}_norm {dtype} backward"
    print(f"{name} bwd {dtype}:", flush=True)
    ran = kernels_ran(fns, name)
    return [common.ab_problem(f"{name} bwd{SHORT[dtype]}", 3 * x.nbytes, fns, check(label, fns, TOL[dtype]),
                              f"{label}; new: {[e for e in ran['new'] if 'registers' in e]}")]


def layer_norm_control():
    rng = cp.random.default_rng(5)
    x = rng.random((65536, 1024), dtype=cp.float32) * 4 - 1
    dy = rng.random((65536, 1024), dtype=cp.float32) * 2 - 1
    gamma = rng.random(1024, dtype=cp.float32) + 0.5
    _, m, r = new.layer_norm(x, 1024, gamma, None, return_stats=True)
    tx, tdy, tg = (torch.as_tensor(a, device="cuda") for a in (x, dy, gamma))
    txg, tgg = tx.detach().clone().requires_grad_(), tg.detach().clone().requires_grad_()
    ty = F.layer_norm(txg, (1024,), tgg, None, 1e-5)
    fns = {"old": lambda: old.layer_norm_backward(dy, x, 1024, gamma, mean=m, rstd=r),
           "new": lambda: new.layer_norm_backward(dy, x, 1024, gamma, mean=m, rstd=r),
           "torch": lambda: torch.autograd.grad(ty, (txg, tgg), tdy, retain_graph=True)}
    return [common.ab_problem("ln_65536x1024 bwd", 3 * x.nbytes, fns, check("layer_norm backward", fns, 1e-4),
                              "layer_norm backward (untouched path: control)")]


def summary(rows, copy):
    """One line a problem: device ms (best round) of old, new, the best new variant, torch;
    of copy = floor at the 1 GiB copy bandwidth / device ms."""
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
        rows += problem("gn_64x256x56x56_g32", (64, 256, 56, 56), 32, dtype)
        cp.get_default_memory_pool().free_all_blocks()
    for dtype in ("float32", "float16"):
        rows += problem("gn_32x640x40x40_g32", (32, 640, 40, 40), 32, dtype)
        cp.get_default_memory_pool().free_all_blocks()
    rows += problem("in_64x256x56x56", (64, 256, 56, 56), 256, "float32", instance=True)
    cp.get_default_memory_pool().free_all_blocks()
    rows += problem("gn_1024x128x16x16_g32", (1024, 128, 16, 16), 32, "float32")
    cp.get_default_memory_pool().free_all_blocks()
    rows += layer_norm_control()
    common.print_table(rows, copy, JSON)
    summary(rows, copy)
    print("\n".join(FAILED) if FAILED else "checks: every variant within tolerance of old; the register kernel ran")


if __name__ == "__main__":
    main()
