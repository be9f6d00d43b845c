"""Layer / RMS norm forward on rows that are not 16-byte vectors (helper lnodd,
notes/lnodd.md): old (main's dnnprims/ + kernels/, copied aside by notes/ab/patch_ab.sh) vs
new (notes/wip/lnodd.patch applied: switch row_normalization.LAYER_FORWARD_ODD, the new
norm_rows_forward_odd) vs PyTorch, in ONE process.  Variants:
  old       main: norm_rows_forward (one 1024-thread block a row, the row copied to shared
            memory, two block sums)
  new       the patch's defaults: norm_rows_forward_odd, at most 512 threads a block (4097
            fp32: 16 values a thread, 288 threads; 1001: 4 a thread, 256 threads)
  new b1k   _ODD_BLOCK = 1024 (4097: 8 values a thread, 544 threads; 1001: as new)
  new b128  _ODD_BLOCK = 128 (1001: 8 values a thread, 128 threads; 4097: as new)
  new off   LAYER_FORWARD_ODD = () in the patched tree (= old's launches: a control for noise)
  torch     F.layer_norm / F.rms_norm
Problems (forward: floor 2 x.nbytes, read x + write y): ln / rms 8192x4097 fp32 (the
decision), 4096x1001 fp32, 8192x4097 fp16, and ln / rms 65536x1024 fp32 (16-byte rows: the
register kernel in every variant, an untouched control).  Backward (switch
LAYER_BACKWARD_ODD, norm_rows_backward_odd; floor 3 x.nbytes: read x, dy, write dx): ln / rms
8192x4097 fp32, ln 8192x4097 fp16; the saved statistics come from CuPy in float64 (the same
arrays for every variant).  "new off" there = LAYER_BACKWARD_ODD = () (old's launches).
Before timing, every new variant's (y, mean, rstd) are checked against old (max |diff|
within 1e-4 (fp32) / 2e-2 (fp16) of each output's scale) and the path each took against the
switch: CHECK FAILED lines, repeated under the table.
    python notes/lnodd_ab.py OLD_ROOT --json PATH"""
import sys

sys.path.insert(0, "notes/ab")
import common  # noqa: E402

import cupy as cp  # noqa: E402
import torch  # noqa: E402

import dnnprims as new  # noqa: E402
from dnnprims import row_normalization as new_rn  # noqa: E402

old = common.load_old(sys.argv[1])
from dnnprims_old import row_normalization as old_rn  # noqa: E402

assert old_rn.__file__ != new_rn.__file__
assert "norm_rows_forward_odd" not in old_rn.FAMILY.source, "old must be unpatched"
assert "norm_rows_forward_odd" in new_rn.FAMILY.source, "new must be patched"
JSON = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
F = torch.nn.functional
TOL = {"float32": 1e-4, "float16": 2e-2}
SHORT = {"float32": "", "float16": " f16"}
FAILED = []
EPS = 1e-5
VARIANTS = {"new b1k": dict(_ODD_BLOCK=1024), "new b128": dict(_ODD_BLOCK=128), "new off": dict(LAYER_FORWARD_ODD=()),
            "bwd off": dict(LAYER_BACKWARD_ODD=())}


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
            d = common.max_abs(a, b)
            worst = max(worst, d)
            scale = float(cp.abs(b.astype(cp.float64)).max())
            if not d <= tol * max(scale, 1.0):
                fail(f"CHECK FAILED {name} {tag} output {i}: max |diff| {d:.3e} (scale {scale:.3e})")
        diffs[tag] = worst
    return diffs


def launches(name, fns, odd, attr="_layer_forward_odd"):
    """Whether each new-tree variant's call took norm_rows_forward_odd (attr
    _odd_backward: norm_rows_backward_odd)."""
    for tag, fn in fns.items():
        if not tag.startswith("new"):
            continue
        seen = []
        launch = getattr(new_rn, attr)
        setattr(new_rn, attr, lambda *a: seen.append(launch(*a)) or seen[-1])
        try:
            fn()
        finally:
            setattr(new_rn, attr, launch)
        seen = [s not in (None, False) for s in seen]
        took = any(seen)
        want = odd and tag != "new off"
        print(f"  {name} {tag}: odd kernel {took}", flush=True)
        if took != want:
            fail(f"CHECK FAILED {name} {tag}: odd kernel {took}, expected {want}")


def data(shape, dtype):
    rng = cp.random.default_rng(11)
    x = (rng.random(shape, dtype=cp.float32) * 4 - 1).astype(dtype)
    gamma = (rng.random(shape[-1], dtype=cp.float32) + 0.5).astype(cp.float32)
    beta = (rng.random(shape[-1], dtype=cp.float32) - 0.5).astype(cp.float32)
    if dtype == "float16":  # the parameters in x's dtype (PyTorch's layer norm wants them alike)
        gamma, beta = gamma.astype(cp.float16), beta.astype(cp.float16)
    return x, gamma, beta


def forward(name, shape, dtype, kind, variants, odd=True):
    L = shape[-1]
    x, gamma, beta = data(shape, dtype)
    tx, tg, tb = (torch.as_tensor(a, device="cuda") for a in (x, gamma, beta))
    if kind == "rms":
        fo = lambda: old.rms_norm(x, L, gamma, eps=EPS, return_stats=True)  # noqa: E731
        fn = lambda: new.rms_norm(x, L, gamma, eps=EPS, return_stats=True)  # noqa: E731
        theirs = lambda: F.rms_norm(tx, (L,), tg, EPS)  # noqa: E731
    else:
        fo = lambda: old.layer_norm(x, L, gamma, beta, eps=EPS, return_stats=True)  # noqa: E731
        fn = lambda: new.layer_norm(x, L, gamma, beta, eps=EPS, return_stats=True)  # noqa: E731
        theirs = lambda: F.layer_norm(tx, (L,), tg, tb, EPS)  # noqa: E731
    fns = {"old": fo, "new": fn}
    fns.update({t: common.switched(new_rn, fn, **VARIANTS[t]) for t in variants})
    label = f"{name} forward {dtype}"
    problem = f"{name} fwd{SHORT[dtype]}"
    launches(problem, fns, odd)
    diffs = check(label, fns, TOL[dtype])
    fns["torch"] = theirs
    with torch.no_grad():
        return common.ab_problem(problem, 2 * x.nbytes, fns, diffs, label if odd else f"{label} (control)")


def stats(x, rms):
    """(mean, rstd) of each row of x in float64, cast to the accumulation dtype."""
    m = x.astype(cp.float64)
    acc = cp.float32
    if rms:
        return None, (1 / cp.sqrt((m * m).mean(axis=1) + EPS)).astype(acc)
    mean = m.mean(axis=1)
    rstd = 1 / cp.sqrt(((m - mean[:, None]) ** 2).mean(axis=1) + EPS)
    return mean.astype(acc), rstd.astype(acc)


def backward(name, shape, dtype, kind):
    L = shape[-1]
    x, gamma, beta = data(shape, dtype)
    dy = (cp.random.default_rng(12).random(shape, dtype=cp.float32) * 2 - 1).astype(dtype)
    tx, tdy, tg, tb = (torch.as_tensor(a, device="cuda") for a in (x, dy, gamma, beta))
    txg, tgg, tbg = (t.detach().clone().requires_grad_() for t in (tx, tg, tb))
    mean, rstd = stats(x, kind == "rms")
    if kind == "rms":
        fo = lambda: old.rms_norm_backward(dy, x, L, gamma, eps=EPS, rstd=rstd)  # noqa: E731
        fn = lambda: new.rms_norm_backward(dy, x, L, gamma, eps=EPS, rstd=rstd)  # noqa: E731
        ty = F.rms_norm(txg, (L,), tgg, EPS)
        theirs = lambda: torch.autograd.grad(ty, (txg, tgg), tdy, retain_graph=True)  # noqa: E731
    else:
        fo = lambda: old.layer_norm_backward(dy, x, L, gamma, eps=EPS, mean=mean, rstd=rstd)  # noqa: E731
        fn = lambda: new.layer_norm_backward(dy, x, L, gamma, eps=EPS, mean=mean, rstd=rstd)  # noqa: E731
        ty = F.layer_norm(txg, (L,), tgg, tbg, EPS)
        theirs = lambda: torch.autograd.grad(ty, (txg, tgg, tbg), tdy, retain_graph=True)  # noqa: E731
    fns = {"old": fo, "new": fn, "new off": common.switched(new_rn, fn, **VARIANTS["bwd off"])}
    label = f"{name} backward {dtype}"
    problem = f"{name} bwd{SHORT[dtype]}"
    launches(problem, fns, True, "_odd_backward")
    diffs = check(label, fns, TOL[dtype])
    fns["torch"] = theirs
    return common.ab_problem(problem, 3 * x.nbytes, fns, diffs, label)


SUMMARY = ("old", "new", "new b1k", "new b128", "new off", "torch")


def summary(rows, copy):
    print(f"\nsummary (device ms, best round; of copy = floor / copy {copy:.0f} GB/s / device ms)")
    print(f"{'problem':22s} " + " ".join(f"{t:>8s}" for t in SUMMARY) + f" {'new/old':>7s} {'x torch':>7s}"
          + "".join(f" {'copy ' + t:>10s}" for t in ("old", "new", "torch")))
    for r in rows:
        best = {tag: min(abs(t) for t in v["device"]) if v["device"] else float("nan")
                for tag, v in r["ms"].items()}
        floor_ms = r["floor_bytes"] / copy / 1e6
        get = lambda t: best.get(t, float("nan"))  # noqa: E731
        print(f"{r['problem']:22s} " + " ".join(f"{get(t):8.4f}" for t in SUMMARY)
              + f" {get('old') / get('new'):7.3f} {get('torch') / get('new'):7.3f}"
              + "".join(f" {floor_ms / get(t):10.3f}" for t in ("old", "new", "torch")))


def main():
    print("old:", old_rn.__file__, "new:", new_rn.__file__, flush=True)
    copy = common.copy_gbps()
    odd = (8192, 4097)
    rows = [forward("ln_8192x4097", odd, "float32", "ln", ("new b1k", "new off")),
            forward("rms_8192x4097", odd, "float32", "rms", ("new b1k", "new off")),
            forward("ln_4096x1001", (4096, 1001), "float32", "ln", ("new b128", "new off")),
            forward("rms_4096x1001", (4096, 1001), "float32", "rms", ("new b128",)),
            forward("ln_8192x4097", odd, "float16", "ln", ("new b1k", "new off")),
            forward("rms_8192x4097", odd, "float16", "rms", ("new b1k",))]
    rows += [backward("ln_8192x4097", odd, "float32", "ln"), backward("rms_8192x4097", odd, "float32", "rms"),
             backward("ln_8192x4097", odd, "float16", "ln")]
    cp.get_default_memory_pool().free_all_blocks()
    big = (65536, 1024)
    rows += [forward("ln_65536x1024", big, "float32", "ln", (), odd=False),
             forward("rms_65536x1024", big, "float32", "rms", (), odd=False)]
    common.print_table(rows, copy, JSON)
    summary(rows, copy)
    print("\n".join(FAILED) if FAILED else "checks: every variant within tolerance of old; the expected launches ran")


if __name__ == "__main__":
    main()
