"""Row norms at copy speed (helper rownorm, notes/rownorm.md): old (main's dnnprims/ +
kernels/, copied aside by notes/ab/patch_ab.sh) vs new (notes/wip/rownorm.patch applied)
vs PyTorch, in ONE process, on the bench's three row-norm problems
(dnnprims/bench/problems.json), forward and backward, float32, plus the float16 layer
norm forward and backward (the per-row latency case: main's fp16 backward took 2/3 of fp32's time):
  ln_65536x1024   layer_norm  / layer_norm_backward   vs F.layer_norm + torch autograd
  rms_65536x1024  rms_norm    / rms_norm_backward     vs F.rms_norm   + torch autograd
  gn_64x256x56x56_g32 group_norm / group_norm_backward vs F.group_norm + torch autograd
Variants: old, new (shipped switches), and for the layer / RMS backward "new unpipe"
(new tree, LAYER_BACKWARD_PIPELINED = False: the old fused kernel, old 8-lane finish).
Floors as the bench counts them: forward read x + write y = 2 x.nbytes; backward read
x and dy + write dx = 3 x.nbytes (the parameter gradients ride along).
Before timing, each variant's outputs are checked against old (max |diff| of each output
within 1e-4 (fp32) / 2e-2 (fp16) of that output's scale; failures are printed, under the
table too, and the timing goes on).  Torch backward = autograd.grad of the
forward graph (retain_graph), our backward = the *_backward function with the saved
statistics, as the bench's rows.
    python notes/rownorm_ab.py OLD_ROOT --json PATH"""
import sys

sys.path.insert(0, "notes/ab")
import common  # noqa: E402

import numpy as np  # noqa: E402
import cupy as cp  # noqa: E402
import torch  # noqa: E402

import dnnprims as new  # noqa: E402
from dnnprims import row_normalization as new_rn  # noqa: E402

old = common.load_old(sys.argv[1])
from dnnprims_old import row_normalization as old_rn  # noqa: E402

assert old_rn.__file__ != new_rn.__file__
assert "norm_rows_backward_fused_pipelined" not in old_rn.FAMILY.source, "old must be unpatched"
assert "norm_rows_backward_fused_pipelined" in new_rn.FAMILY.source, "new must be patched"
JSON = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
F = torch.nn.functional
# dtype tolerance of old vs new (different summation orders of the same float32 sums)
TOL = {np.float32: 1e-4, np.float16: 2e-2}


def outputs(r):
    return r if isinstance(r, tuple) else (r,)


FAILED = []


def check(name, fns, tol):
    """max |variant - old| over every output (the table's diff); each output within tol of
    its own scale, else a CHECK FAILED line (printed again under the table) and timing goes on."""
    ref = outputs(fns["old"]())
    diffs = {}
    for tag, fn in fns.items():
        if tag in ("old", "torch"):
            continue
        got = outputs(fn())
        assert len(got) == len(ref), (name, tag)
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


def t(a):
    return torch.as_tensor(a, device="cuda")


def row_norm(name, rows, L, dtype, rms, backward_only=False):
    rng = cp.random.default_rng(5)
    x = (rng.random((rows, L), dtype=cp.float32) * 4 - 1).astype(dtype)
    dy = (rng.random((rows, L), dtype=cp.float32) * 2 - 1).astype(dtype)
    gamma = (rng.random(L, dtype=cp.float32) + 0.5).astype(dtype)
    beta = (rng.random(L, dtype=cp.float32) - 0.5).astype(dtype)
    n = x.nbytes
    tx, tdy, tg, tb = t(x), t(dy), t(gamma), t(beta)
    txg, tgg, tbg = (a.detach().clone().requires_grad_() for a in (tx, tg, tb))
    out = []
    if rms:
        eps = float(np.finfo(np.float32).eps)
        _, rstd_new = new.rms_norm(x, L, gamma, eps=eps, return_stats=True)
        _, rstd_old = old.rms_norm(x, L, gamma, eps=eps, return_stats=True)
        fwd = {"old": lambda: old.rms_norm(x, L, gamma, eps=eps), "new": lambda: new.rms_norm(x, L, gamma, eps=eps),
               "torch": lambda: F.rms_norm(tx, (L,), tg, eps)}
        ty = F.rms_norm(txg, (L,), tgg, eps)
        bwd = {"old": lambda: old.rms_norm_backward(dy, x, L, gamma, eps=eps, rstd=rstd_old),
               "new": lambda: new.rms_norm_backward(dy, x, L, gamma, eps=eps, rstd=rstd_new),
               "torch": lambda: torch.autograd.grad(ty, (txg, tgg), tdy, retain_graph=True)}
    else:
        _, mean_new, rstd_new = new.layer_norm(x, L, gamma, beta, return_stats=True)
        _, mean_old, rstd_old = old.layer_norm(x, L, gamma, beta, return_stats=True)
        fwd = {"old": lambda: old.layer_norm(x, L, gamma, beta), "new": lambda: new.layer_norm(x, L, gamma, beta),
               "torch": lambda: F.layer_norm(tx, (L,), tg, tb, 1e-5)}
        ty = F.layer_norm(txg, (L,), tgg, tbg, 1e-5)
        bwd = {"old": lambda: old.layer_norm_backward(dy, x, L, gamma, mean=mean_old, rstd=rstd_old),
               "new": lambda: new.layer_norm_backward(dy, x, L, gamma, mean=mean_new, rstd=rstd_new),
               "torch": lambda: torch.autograd.grad(ty, (txg, tgg, tbg), tdy, retain_graph=True)}
    bwd["new unpipe"] = common.switched(new_rn, bwd["new"], LAYER_BACKWARD_PIPELINED=False)
    tol = TOL[np.dtype(dtype).type]
    label = ("rms_norm" if rms else "layer_norm") + ("" if dtype == cp.float32 else f" {np.dtype(dtype).name}")
    if not backward_only:
        out.append(common.ab_problem(f"{name} fwd", 2 * n, fwd, check(f"{label} forward", fwd, tol),
                                     f"{label} forward"))
    out.append(common.ab_problem(f"{name} bwd", 3 * n, bwd, check(f"{label} backward", bwd, tol),
                                 f"{label} backward (dx, dgamma{'' if rms else ', dbeta'})"))
    return out


def group_norm(name, N, C, H, W, G):
    rng = cp.random.default_rng(6)
    x = rng.random((N, C, H, W), dtype=cp.float32) * 4 - 1
    dy = rng.random((N, C, H, W), dtype=cp.float32) * 2 - 1
    gamma, beta = rng.random(C, dtype=cp.float32) + 0.5, rng.random(C, dtype=cp.float32) - 0.5
    n = x.nbytes
    tx, tdy, tg, tb = t(x), t(dy), t(gamma), t(beta)
    txg, tgg, tbg = (a.detach().clone().requires_grad_() for a in (tx, tg, tb))
    _, mean_new, rstd_new = new.group_norm(x, G, gamma, beta, return_stats=True)
    _, mean_old, rstd_old = old.group_norm(x, G, gamma, beta, return_stats=True)
    fwd = {"old": lambda: old.group_norm(x, G, gamma, beta), "new": lambda: new.group_norm(x, G, gamma, beta),
           "torch": lambda: F.group_norm(tx, G, tg, tb, 1e-5)}
    ty = F.group_norm(txg, G, tgg, tbg, 1e-5)
    bwd = {"old": lambda: old.group_norm_backward(dy, x, G, gamma, mean=mean_old, rstd=rstd_old),
           "new": lambda: new.group_norm_backward(dy, x, G, gamma, mean=mean_new, rstd=rstd_new),
           "torch": lambda: torch.autograd.grad(ty, (txg, tgg, tbg), tdy, retain_graph=True)}
    return [common.ab_problem(f"{name} fwd", 2 * n, fwd, check("group_norm forward", fwd, 1e-4), "group_norm forward"),
            common.ab_problem(f"{name} bwd", 3 * n, bwd, check("group_norm backward", bwd, 1e-4),
                              "group_norm backward (dx, dgamma, dbeta)")]


def main():
    print("old:", old_rn.__file__, "new:", new_rn.__file__, flush=True)
    copy = common.copy_gbps()
    rows = []
    rows += row_norm("ln_65536x1024", 65536, 1024, cp.float32, rms=False)
    cp.get_default_memory_pool().free_all_blocks()
    rows += row_norm("rms_65536x1024", 65536, 1024, cp.float32, rms=True)
    cp.get_default_memory_pool().free_all_blocks()
    rows += group_norm("gn_64x256x56x56_g32", 64, 256, 56, 56, 32)
    cp.get_default_memory_pool().free_all_blocks()
    rows += row_norm("ln_65536x1024 f16", 65536, 1024, cp.float16, rms=False)
    common.print_table(rows, copy, JSON)
    print("\n".join(FAILED) if FAILED else "checks: every variant within tolerance of old")


if __name__ == "__main__":
    main()
