"""Layer / RMS norm forward with the row in registers and one barrier a row (helper
rowbwd, notes/rowbwd.md): old (main's dnnprims/ + kernels/, copied aside by
notes/ab/patch_ab.sh) vs new (notes/wip/rowbwd.patch applied: norm_rows_forward_regs,
switches row_normalization.LAYER_FORWARD_REGISTERS / LAYER_FORWARD_ROWS) vs PyTorch, in
ONE process.  Variants:
  old      main (fp32: norm_rows_forward, one block a row, the row copied to shared memory,
           layer norm 2 block sums = 4 barriers; 16-bit: norm_rows_forward_pipelined)
  new      the patch's defaults (fp32: norm_rows_forward_regs, 1 row a block; 16-bit unchanged)
  new r2   LAYER_FORWARD_ROWS = 2 (2 rows a block: 4 loads in flight a thread, 43 registers)
  new off  LAYER_FORWARD_REGISTERS = () in the patched tree (= old's kernel: a control)
  new regs (16-bit rows) LAYER_FORWARD_PIPELINED = (), LAYER_FORWARD_REGISTERS = every type
           (information only: the patch keeps the pipelined 16-bit forward)
  torch    F.layer_norm / F.rms_norm (the bench's rows), autograd for the backward
Problems: ln / rms 65536x1024 fp32 forward (the decision) and backward (untouched kernels:
controls for the noise), fp16 forward + layer backward, bf16 layer forward, the odd rows
ln 4096x1000 fp32 (250 vectors: partial warps; 16 MB, fits in L2) forward, and ln / rms
8192x4097 fp32 forward (not 16-byte vectors: old kernel in every variant, a control).
Floors as the bench counts them: forward 2 x.nbytes, backward 3 x.nbytes.
Before timing, each variant's outputs (with the saved statistics) are checked against old
(max |diff| within 1e-4 (fp32) / 2e-2 (16-bit) of each output's scale: CHECK FAILED lines,
repeated under the table), and the row kernels each new variant ran are printed and checked.
    python notes/rowbwd_ab.py OLD_ROOT --json PATH"""
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
assert "norm_rows_forward_regs" not in old_rn.FAMILY.source, "old must be unpatched"
assert "norm_rows_forward_regs" in new_rn.FAMILY.source, "new must be patched"
JSON = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
F = torch.nn.functional
TOL = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 2e-2}
SHORT = {"float32": "", "float16": " f16", "bfloat16": " bf16"}
FAILED = []
EPS = 1e-5


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


def kernels_ran(name, fns, expect):
    """The row kernels one call of each new-tree variant asked for; expect: {tag: kernel name}."""
    function = new_rn.FAMILY.function
    for tag, fn in fns.items():
        if not tag.startswith("new"):
            continue
        ran = []
        new_rn.FAMILY.function = lambda e: ran.append(e) or function(e)  # noqa: E731
        try:
            fn()
        finally:
            del new_rn.FAMILY.function  # the class's method again
        names = sorted({e for e in ran})
        print(f"  {name} {tag}: {', '.join(names)}", flush=True)
        want = expect.get(tag)
        if want and not any(e.startswith(want + "<") for e in names):
            FAILED.append(f"CHECK FAILED {name} {tag}: {want} did not run ({names})")
            print(FAILED[-1], flush=True)


def to_torch(a):
    if a.dtype == _dtypes.BFLOAT16:
        return torch.as_tensor(a.view(cp.uint16), device="cuda").view(torch.bfloat16)
    return torch.as_tensor(a, device="cuda")


def data(shape, dtype):
    dt = _dtypes.BFLOAT16 if dtype == "bfloat16" else np.dtype(dtype)
    rng = cp.random.default_rng(11)
    L = shape[-1]
    x = (rng.random(shape, dtype=cp.float32) * 4 - 1).astype(dt)
    dy = (rng.random(shape, dtype=cp.float32) * 2 - 1).astype(dt)
    pd = np.float32 if _dtypes.is_half(dt) else dt
    gamma = (rng.random(L, dtype=cp.float32) + 0.5).astype(pd)
    beta = (rng.random(L, dtype=cp.float32) - 0.5).astype(pd)
    return x, dy, gamma, beta


def forward(name, shape, dtype, rms, variants):
    x, _, gamma, beta = data(shape, dtype)
    L = shape[-1]
    tx, tg, tb = to_torch(x), to_torch(gamma).to(to_torch(x).dtype), to_torch(beta).to(to_torch(x).dtype)
    s = common.switched
    if rms:
        mk = lambda lib: lambda stats=False: lib.rms_norm(x, L, gamma, eps=EPS, return_stats=stats)  # noqa: E731
        theirs = lambda: F.rms_norm(tx, (L,), tg, EPS)  # noqa: E731
    else:
        mk = lambda lib: lambda stats=False: lib.layer_norm(x, L, gamma, beta, EPS, return_stats=stats)  # noqa: E731
        theirs = lambda: F.layer_norm(tx, (L,), tg, tb, EPS)  # noqa: E731
    fo, fn = mk(old), mk(new)
    every = new_rn._X_TYPES
    table = {"new r2": dict(LAYER_FORWARD_ROWS=2), "new off": dict(LAYER_FORWARD_REGISTERS=()),
             "new regs": dict(LAYER_FORWARD_PIPELINED=(), LAYER_FORWARD_REGISTERS=every),
             "new regs2": dict(LAYER_FORWARD_PIPELINED=(), LAYER_FORWARD_REGISTERS=every, LAYER_FORWARD_ROWS=2)}
    timed = {"old": fo, "new": fn, **{t: s(new_rn, fn, **table[t]) for t in variants}, "torch": theirs}
    checked = {"old": lambda: fo(True), "new": lambda: fn(True),
               **{t: s(new_rn, lambda: fn(True), **table[t]) for t in variants}}
    label = f"{'rms' if rms else 'layer'}_norm forward {dtype}"
    fits = (L * x.itemsize) % 16 == 0
    expect = {t: ("norm_rows_forward_regs" if fits else "norm_rows_forward")
              for t in ("new r2", "new regs", "new regs2") if t in variants}
    expect["new off"] = "norm_rows_forward" if dtype == "float32" else None
    if dtype == "float32":
        expect["new"] = "norm_rows_forward_regs" if fits else "norm_rows_forward"
    kernels_ran(f"{name} fwd{SHORT[dtype]}", timed, expect)
    return common.ab_problem(f"{name} fwd{SHORT[dtype]}", 2 * x.nbytes, timed, check(label, checked, TOL[dtype]),
                             label)


def backward(name, shape, dtype, rms):
    x, dy, gamma, beta = data(shape, dtype)
    L = shape[-1]
    tx, tdy = to_torch(x), to_torch(dy)
    tg, tb = to_torch(gamma).to(tx.dtype), to_torch(beta).to(tx.dtype)
    txg, tgg, tbg = (t.detach().clone().requires_grad_() for t in (tx, tg, tb))
    if rms:
        _, ro = old.rms_norm(x, L, gamma, eps=EPS, return_stats=True)
        _, rn = new.rms_norm(x, L, gamma, eps=EPS, return_stats=True)
        fns = {"old": lambda: old.rms_norm_backward(dy, x, L, gamma, eps=EPS, rstd=ro),
               "new": lambda: new.rms_norm_backward(dy, x, L, gamma, eps=EPS, rstd=rn)}
        ty = F.rms_norm(txg, (L,), tgg, EPS)
        fns["torch"] = lambda: torch.autograd.grad(ty, (txg, tgg), tdy, retain_graph=True)
    else:
        _, mo, ro = old.layer_norm(x, L, gamma, beta, EPS, return_stats=True)
        _, mn, rn = new.layer_norm(x, L, gamma, beta, EPS, return_stats=True)
        fns = {"old": lambda: old.layer_norm_backward(dy, x, L, gamma, eps=EPS, mean=mo, rstd=ro),
               "new": lambda: new.layer_norm_backward(dy, x, L, gamma, eps=EPS, mean=mn, rstd=rn)}
        ty = F.layer_norm(txg, (L,), tgg, tbg, EPS)
        fns["torch"] = lambda: torch.autograd.grad(ty, (txg, tgg, tbg), tdy, retain_graph=True)
    label = f"{'rms' if rms else 'layer'}_norm backward {dtype}"
    return common.ab_problem(f"{name} bwd{SHORT[dtype]}", 3 * x.nbytes, fns, check(label, fns, TOL[dtype]),
                             f"{label} (unchanged kernels: control)")


def summary(rows, copy):
    print(f"\nsummary (device ms, best round; of copy = floor / copy {copy:.0f} GB/s / device ms)")
    print(f"{'problem':22s} {'old':>7s} {'new':>7s} {'new r2':>7s} {'torch':>7s} {'x old':>6s} {'x torch':>7s}"
          f" {'copy old':>8s} {'copy new':>8s} {'copy r2':>7s} {'copy torch':>10s}")
    for r in rows:
        best = {tag: min(abs(t) for t in v["device"]) if v["device"] else float("nan")
                for tag, v in r["ms"].items()}
        floor_ms = r["floor_bytes"] / copy / 1e6
        r2 = best.get("new r2", float("nan"))
        print(f"{r['problem']:22s} {best['old']:7.4f} {best['new']:7.4f} {r2:7.4f} {best['torch']:7.4f}"
              f" {best['old'] / best['new']:6.3f} {best['torch'] / best['new']:7.3f} {floor_ms / best['old']:8.3f}"
              f" {floor_ms / best['new']:8.3f} {floor_ms / r2:7.3f} {floor_ms / best['torch']:10.3f}")


def main():
    print("old:", old_rn.__file__, "new:", new_rn.__file__, flush=True)
    copy = common.copy_gbps()
    big = (65536, 1024)
    rows = [forward("ln_65536x1024", big, "float32", False, ("new r2", "new off")),
            forward("rms_65536x1024", big, "float32", True, ("new r2", "new off")),
            backward("ln_65536x1024", big, "float32", False),
            backward("rms_65536x1024", big, "float32", True)]
    cp.get_default_memory_pool().free_all_blocks()
    rows += [forward("ln_65536x1024", big, "float16", False, ("new regs", "new regs2")),
             forward("rms_65536x1024", big, "float16", True, ("new regs", "new regs2")),
             backward("ln_65536x1024", big, "float16", False),
             forward("ln_65536x1024", big, "bfloat16", False, ("new regs",))]
    cp.get_default_memory_pool().free_all_blocks()
    rows += [forward("ln_4096x1000", (4096, 1000), "float32", False, ("new r2", "new off")),
             forward("ln_8192x4097", (8192, 4097), "float32", False, ()),
             forward("rms_8192x4097", (8192, 4097), "float32", True, ())]
    common.print_table(rows, copy, JSON)
    summary(rows, copy)
    print("\n".join(FAILED) if FAILED else "checks: every variant within tolerance of old; the expected kernels ran")


if __name__ == "__main__":
    main()
