"""Layer / RMS norm backward, the fused pipelined kernel's grid and finish (helper lnbwd,
notes/lnbwd.md): old (main's dnnprims/ + kernels/, copied aside by notes/ab/patch_ab.sh) vs
new (notes/wip/lnbwd.patch applied: switches row_normalization.LAYER_BACKWARD_EVEN_FILL and
LAYER_BACKWARD_FINISH_LANES) vs PyTorch, in ONE process.  Variants:
  old      main: norm_rows_backward_fused_pipelined on the resident blocks (1056 on the H100
           fp32 1024 columns: 62-63 rows a block), norm_param_grads_finish_wide (32 lanes x
           32 columns a block: 1024 columns on 32 SMs)
  new      the patch's defaults: even grid (fill 0.9: 1024 blocks of 64 rows) + the narrow
           finish, 128 lanes x 8 columns a block (128 blocks)
  new even even grid only (finish_wide, 32 lanes)
  new fin  narrow finish only (grid = resident blocks)
  new f64  even grid + narrow finish with 64 lanes x 16 columns (64 blocks)
  new off  both off in the patched tree (= old's launches: a control for the noise)
  new c8 / new c6  (16-bit, information) the defaults with the grid capped at 8 / 6 blocks
           an SM (_PIPELINE_GRID_CAP; the half kernel's 111 registers allow 9 resident 64-thread
           blocks an SM: ~1190 partial rows = 9.7 MB written and read back, 2.4 % of the 403 MB
           floor, twice fp32's share)
  torch    autograd of F.layer_norm / F.rms_norm / F.group_norm
The saved statistics come from CuPy in float64 (the same arrays for every variant; no
forward kernel to compile in either tree).
Problems: ln / rms 65536x1024 fp32 (the decision), fp16 (must not get slower), ln 4096x1000
fp32 (odd columns; 16 MB, L2), ln 8192x4097 fp32 (not 16-byte vectors: the unfused kernels in
every variant, a control), group norm 64x256x56x56 / 32 fp32 backward (a control: see
GN_SWITCHES).  Floors as the bench: 3 x.nbytes (read x, dy, write dx).
Before timing, each variant's (dx, dgamma, dbeta) are checked against old (max |diff| within
1e-4 (fp32) / 2e-2 (16-bit) of each output's scale) and, for the new variants, the grid and
finish lanes it ran are printed and checked against the switches: CHECK FAILED lines,
repeated under the table.
    python notes/lnbwd_ab.py OLD_ROOT --json PATH"""
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
assert "norm_param_grads_finish_narrow" not in old_rn.FAMILY.source, "old must be unpatched"
assert "norm_param_grads_finish_narrow" in new_rn.FAMILY.source, "new must be patched"
JSON = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
F = torch.nn.functional
TOL = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 2e-2}
SHORT = {"float32": "", "float16": " f16", "bfloat16": " bf16"}
FAILED = []
EPS = 1e-5
VARIANTS = {"new": None,  # the defaults
            "new even": dict(LAYER_BACKWARD_FINISH_LANES=32),
            "new fin": dict(LAYER_BACKWARD_EVEN_FILL=None),
            "new f64": dict(LAYER_BACKWARD_FINISH_LANES=64),
            "new off": dict(LAYER_BACKWARD_EVEN_FILL=None, LAYER_BACKWARD_FINISH_LANES=32)}
SMS = int(cp.cuda.Device().attributes["MultiProcessorCount"])
VARIANTS.update({"new c8": dict(_PIPELINE_GRID_CAP=8 * SMS), "new c6": dict(_PIPELINE_GRID_CAP=6 * SMS)})


def fail(line):
    FAILED.append(line)
    print(line, flush=True)


def check(name, fns, tol):
    ref = fns["old"]()
    diffs = {}
    for tag, fn in fns.items():
        if tag in ("old", "torch"):
            continue
        got = fn()
        worst = 0.0
        for i, (a, b) in enumerate(zip(got, ref)):
            if a is None and b is None:
                continue
            d = common.max_abs(a, b)
            worst = max(worst, d)
            scale = float(cp.abs(b.astype(cp.float64)).max())
            if not d <= tol * max(scale, 1.0):
                fail(f"CHECK FAILED {name} {tag} output {i}: max |diff| {d:.3e} (scale {scale:.3e})")
        diffs[tag] = worst
    return diffs


def launches(name, fns, fused):
    """The grid and finish lanes each new-tree variant's call took (fused pipelined path)."""
    for tag, fn in fns.items():
        if not tag.startswith("new"):
            continue
        seen = {}
        even, finish = new_rn._even_grid, new_rn._finish_wide
        new_rn._even_grid = lambda n, g: seen.setdefault("grid", (n, g, even(n, g)))[2]  # noqa: E731
        new_rn._finish_wide = lambda *a: seen.setdefault("lanes", a[-1]) and finish(*a)  # noqa: E731
        try:
            fn()
        finally:
            new_rn._even_grid, new_rn._finish_wide = even, finish
        print(f"  {name} {tag}: {seen}", flush=True)
        if not fused:
            if "grid" in seen:
                fail(f"CHECK FAILED {name} {tag}: the fused pipelined kernel ran ({seen})")
            continue
        sw = dict(fill=new_rn.LAYER_BACKWARD_EVEN_FILL, lanes=new_rn.LAYER_BACKWARD_FINISH_LANES)
        sw.update({"fill": v for k, v in (VARIANTS[tag] or {}).items() if k == "LAYER_BACKWARD_EVEN_FILL"})
        sw.update({"lanes": v for k, v in (VARIANTS[tag] or {}).items() if k == "LAYER_BACKWARD_FINISH_LANES"})
        if "grid" not in seen or seen.get("lanes") != sw["lanes"]:
            fail(f"CHECK FAILED {name} {tag}: expected the fused pipelined kernel, {sw['lanes']} lanes ({seen})")
        elif not sw["fill"] and seen["grid"][2] != min(seen["grid"][:2]):
            fail(f"CHECK FAILED {name} {tag}: grid {seen['grid']} with the even grid off")


def to_torch(a):
    if a.dtype == _dtypes.BFLOAT16:
        return torch.as_tensor(a.view(cp.uint16), device="cuda").view(torch.bfloat16)
    return torch.as_tensor(a, device="cuda")


def data(shape, dtype, channels):
    dt = _dtypes.BFLOAT16 if dtype == "bfloat16" else np.dtype(dtype)
    rng = cp.random.default_rng(11)
    x = (rng.random(shape, dtype=cp.float32) * 4 - 1).astype(dt)
    dy = (rng.random(shape, dtype=cp.float32) * 2 - 1).astype(dt)
    pd = np.float32 if _dtypes.is_half(dt) else dt
    gamma = (rng.random(channels, dtype=cp.float32) + 0.5).astype(pd)
    beta = (rng.random(channels, dtype=cp.float32) - 0.5).astype(pd)
    return x, dy, gamma, beta


# The group-norm control takes gn_rows_backward_pipelined in both trees (12 specialisations
# to compile per tree instead of the register kernel's 96: the script stays within its
# time); the patch changes no group-norm launch (finish_wide at <= 32 lanes is untouched).
GN_SWITCHES = dict(REGISTER_BACKWARD=False, CLUSTER_BACKWARD=False)


def stats(x, n_rows, rms):
    """(mean, rstd) of each of n_rows rows of x in float64, cast to the accumulation
    dtype (CuPy: no forward kernel of either tree to compile)."""
    m = x.reshape(n_rows, -1).astype(cp.float64)
    acc = _dtypes.accumulate_dtype(x.dtype)
    if rms:
        return None, (1 / cp.sqrt((m * m).mean(axis=1) + EPS)).astype(acc)
    mean = m.mean(axis=1)
    rstd = 1 / cp.sqrt(((m - mean[:, None]) ** 2).mean(axis=1) + EPS)
    return mean.astype(acc), rstd.astype(acc)


def backward(name, shape, dtype, kind, variants, fused=True):
    L = shape[-1]
    channels = shape[1] if kind == "gn" else L
    x, dy, gamma, beta = data(shape, dtype, channels)
    tx, tdy = to_torch(x), to_torch(dy)
    tg, tb = to_torch(gamma).to(tx.dtype), to_torch(beta).to(tx.dtype)
    txg, tgg, tbg = (t.detach().clone().requires_grad_() for t in (tx, tg, tb))
    groups = 32
    mean, rstd = stats(x, shape[0] * groups if kind == "gn" else x.size // L, kind == "rms")
    if kind == "rms":
        fo = lambda: old.rms_norm_backward(dy, x, L, gamma, eps=EPS, rstd=rstd)  # noqa: E731
        fn = lambda: new.rms_norm_backward(dy, x, L, gamma, eps=EPS, rstd=rstd)  # noqa: E731
        ty = F.rms_norm(txg, (L,), tgg, EPS)
        theirs = lambda: torch.autograd.grad(ty, (txg, tgg), tdy, retain_graph=True)  # noqa: E731
    elif kind == "ln":
        fo = lambda: old.layer_norm_backward(dy, x, L, gamma, eps=EPS, mean=mean, rstd=rstd)  # noqa: E731
        fn = lambda: new.layer_norm_backward(dy, x, L, gamma, eps=EPS, mean=mean, rstd=rstd)  # noqa: E731
        ty = F.layer_norm(txg, (L,), tgg, tbg, EPS)
        theirs = lambda: torch.autograd.grad(ty, (txg, tgg, tbg), tdy, retain_graph=True)  # noqa: E731
    else:  # the control: gn_rows_backward_pipelined in both trees (GN_SWITCHES)
        mean, rstd = mean.reshape(shape[0], groups), rstd.reshape(shape[0], groups)
        fo = common.switched(old_rn, lambda: old.group_norm_backward(dy, x, groups, gamma, eps=EPS, mean=mean,
                                                                     rstd=rstd), **GN_SWITCHES)
        fn = common.switched(new_rn, lambda: new.group_norm_backward(dy, x, groups, gamma, eps=EPS, mean=mean,
                                                                     rstd=rstd), **GN_SWITCHES)
        ty = F.group_norm(txg, groups, tgg, tbg, EPS)
        theirs = lambda: torch.autograd.grad(ty, (txg, tgg, tbg), tdy, retain_graph=True)  # noqa: E731
    fns = {"old": fo, "new": fn}
    fns.update({t: common.switched(new_rn, fn, **VARIANTS[t]) for t in variants})
    label = f"{name} backward {dtype}"
    problem = f"{name} bwd{SHORT[dtype]}"
    launches(problem, fns, fused)
    diffs = check(label, fns, TOL[dtype])
    fns["torch"] = theirs
    return common.ab_problem(problem, 3 * x.nbytes, fns, diffs, label if fused else f"{label} (control)")


SUMMARY = ("old", "new", "new even", "new fin", "new f64", "new off", "new c8", "new c6", "torch")


def summary(rows, copy):
    print(f"\nsummary (device ms, best round; of copy = floor / copy {copy:.0f} GB/s / device ms)")
    print(f"{'problem':22s} " + " ".join(f"{t:>8s}" for t in SUMMARY) + f" {'new/old':>7s} {'x torch':>7s}"
          + " ".join(f" {'copy ' + t.replace('new ', ''):>9s}" for t in ("old", "new", "torch")))
    for r in rows:
        best = {tag: min(abs(t) for t in v["device"]) if v["device"] else float("nan")
                for tag, v in r["ms"].items()}
        floor_ms = r["floor_bytes"] / copy / 1e6
        get = lambda t: best.get(t, float("nan"))  # noqa: E731
        print(f"{r['problem']:22s} " + " ".join(f"{get(t):8.4f}" for t in SUMMARY)
              + f" {get('old') / get('new'):7.3f} {get('torch') / get('new'):7.3f}"
              + "".join(f" {floor_ms / get(t):9.3f}" for t in ("old", "new", "torch")))


def main():
    print("old:", old_rn.__file__, "new:", new_rn.__file__, flush=True)
    copy = common.copy_gbps()
    big = (65536, 1024)
    every = ("new even", "new fin", "new f64", "new off")
    rows = [backward("ln_65536x1024", big, "float32", "ln", every),
            backward("rms_65536x1024", big, "float32", "rms", every)]
    cp.get_default_memory_pool().free_all_blocks()
    rows += [backward("ln_65536x1024", big, "float16", "ln", ("new even", "new fin", "new off", "new c8", "new c6")),
             backward("rms_65536x1024", big, "float16", "rms", ("new off", "new c8")),
             backward("ln_4096x1000", (4096, 1000), "float32", "ln", ("new even", "new fin", "new off")),
             backward("ln_8192x4097", (8192, 4097), "float32", "ln", (), fused=False)]
    cp.get_default_memory_pool().free_all_blocks()
    rows += [backward("gn_64x256x56x56", (64, 256, 56, 56), "float32", "gn", (), fused=False)]
    common.print_table(rows, copy, JSON)
    summary(rows, copy)
    print("\n".join(FAILED) if FAILED else "checks: every variant within tolerance of old; the expected launches ran")


if __name__ == "__main__":
    main()
