"""Old (main's dnnprims/ + kernels/, copied aside by notes/ab/patch_ab.sh) against new
(notes/wip/bn16nhwc3.patch) against PyTorch (F.batch_norm on the channels_last view), in
ONE process: channel-last batch-norm TRAINING forward (running statistics updated) and
BACKWARD (saved statistics) of [64,56,56,256] in float16 and bfloat16 (the rows the patch
is for), float16 [64,56,56,200] (25 / 50 vector columns), and float32 (the control: the
switches do not touch it, `new` is main's machine code).  Parameters float32.
Variants of new (plan-key switches of dnnprims.normalization, set per call):
  narrow    ROWS_16BIT_NARROW = ("train", "backward"): batchnorm_rows_*_narrow, the
            resident kernels at 4 channels a thread (8-byte vectors): float32's lanes,
            batches and merge for 16-bit data
  launches  ROWS_16BIT_LAUNCHES = ("train", "backward"): the three-launch path
            (statistics + merge + normalize; reduce + merge + data), PyTorch's shape
  new       (float32 only) the patch's defaults: main's kernels
Results are checked before timing: narrow / launches against old within a few units
of the dtype's last place (other lanes and batches: not bitwise), float32 new bitwise.
Floors: forward 3 x.nbytes (read x twice, write y), backward 5 x.nbytes.  Table last.
    python notes/bn16nhwc3_ab.py OLD_ROOT --json PATH"""
import importlib
import sys

sys.path.insert(0, "notes/ab")
import common  # noqa: E402

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import dnnprims as new  # noqa: E402
from dnnprims import _dtypes  # noqa: E402
from dnnprims import normalization as new_norm  # noqa: E402

old = common.load_old(sys.argv[1])
old_norm = importlib.import_module("dnnprims_old.normalization")
assert not hasattr(old_norm, "ROWS_16BIT_NARROW"), "old must be unpatched"
assert hasattr(new_norm, "ROWS_16BIT_NARROW"), "new must be patched"
F = torch.nn.functional
BOTH = ("train", "backward")
VARIANTS = {"float32": {"new": {}},
            "float16": {"narrow": {"ROWS_16BIT_NARROW": BOTH}, "launches": {"ROWS_16BIT_LAUNCHES": BOTH}},
            "bfloat16": {"narrow": {"ROWS_16BIT_NARROW": BOTH}, "launches": {"ROWS_16BIT_LAUNCHES": BOTH}}}
TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
ULP = {"float32": 0.0, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}  # 0: bitwise


def ours(t):
    if t.dtype == torch.bfloat16:
        return cp.from_dlpack(t.view(torch.int16)).view(_dtypes.BFLOAT16)
    return cp.from_dlpack(t)


def geometry(x, narrow):
    """(expression, grid, lanes, cached batches, L2 window batches) of the training
    forward's and the backward's resident launch in the new tree."""
    C, M = x.shape[-1], x.size // x.shape[-1]
    rows = new_norm._Rows(cp, x, C, M, aligned=True)
    res = new_norm._Rows(cp, x, C, M, aligned=True, max_vec=4) if narrow else rows
    out = []
    for direction, tensors in (("train", 1), ("backward", 2)):
        if narrow:
            spec = (f"batchnorm_rows_train_narrow<{res.t}, float, {res.index_t}, true>" if tensors == 1 else
                    f"batchnorm_rows_backward_narrow<{res.t}, float, {res.index_t}>")
        else:
            one = x.itemsize in new_norm.ROWS_TRAIN_ONE_COUNT and tensors == 1
            spec = rows.spec(f"{direction}_resident", "float", flag=new_norm._rows_resident_flags(
                rows, one if tensors == 1 else None))
        launch = new_norm._rows_resident_launch(cp, res, spec, C, tensors, x.itemsize)
        out.append(f"{direction}: {spec.split('<')[0][15:]} VEC {res.vec}" + (
            "" if launch is None else f" grid {launch[0]} lanes {launch[1]} cached {launch[3]} window {launch[4]}"))
    return "; ".join(out)


def close(got, want, dtype, what):
    """max |got - want| over the arrays; asserts bitwise (float32) or within 4 units
    of the last place of the largest |want| (16-bit: other summation order)."""
    d = max(common.max_abs(a, b) for a, b in zip(got, want))
    for a, b in zip(got, want):
        if ULP[dtype] == 0.0:
            assert bool((cp.asarray(a).view(cp.uint8) == cp.asarray(b).view(cp.uint8)).all()), f"{what}: not bitwise"
        else:
            scale = float(cp.abs(cp.asarray(b, dtype=cp.float64)).max())
            err = common.max_abs(a, b)
            assert err <= 4 * ULP[dtype] * max(scale, 1e-3), f"{what}: {err:.2e} > 4 ulp of {scale:.2e}"
    return d


def problem(dtype, shape=(64, 56, 56, 256)):
    C = shape[-1]
    tx = torch.empty(shape, dtype=TORCH[dtype], device="cuda").uniform_(-1, 3)
    tdy = torch.empty(shape, dtype=TORCH[dtype], device="cuda").uniform_(-1, 1)
    x, dy = (ours(t) for t in (tx, tdy))
    tx, tdy = tx.permute(0, 3, 1, 2), tdy.permute(0, 3, 1, 2)  # channels_last views, as the bench
    gamma = cp.random.random(C, dtype=cp.float32) + 0.5
    beta = cp.random.random(C, dtype=cp.float32) - 0.5
    rm, rv = cp.zeros(C, cp.float32), cp.ones(C, cp.float32)
    name = "bn_nhwc" + ("" if C == 256 else f"_c{C}") + {"float32": "", "float16": "_f16", "bfloat16": "_bf16"}[dtype]
    note = "old " + geometry(x, False) + (" | narrow " + geometry(x, True) if dtype != "float32" else "")
    print(name, note, flush=True)
    tg, tb, trm, trv = (torch.from_dlpack(a) for a in (gamma, beta, rm.copy(), rv.copy()))
    out = []
    y_old, m_old, s_old = old.batchnorm(x, gamma, beta, rm, rv, layout="NHWC", return_stats=True)
    fwd = {"old": lambda: old.batchnorm(x, gamma, beta, rm, rv, layout="NHWC")}
    diffs = {}
    for tag, sw in VARIANTS[dtype].items():
        got = common.switched(new_norm, lambda: new.batchnorm(x, gamma, beta, rm, rv, layout="NHWC",
                                                              return_stats=True), **sw)()
        diffs[tag] = close(got[:1], (y_old,), dtype, f"{name} train {tag} y")
        rel = max(float(cp.abs(a - b).max() / cp.abs(b).max()) for a, b in zip(got[1:], (m_old, s_old)))
        assert rel <= 1e-4, f"{name} train {tag}: statistics differ by {rel:.1e} (relative)"
        fwd[tag] = common.switched(new_norm, lambda: new.batchnorm(x, gamma, beta, rm, rv, layout="NHWC"), **sw)
    fwd["torch"] = lambda: F.batch_norm(tx, trm, trv, tg, tb, training=True)
    out.append(common.ab_problem(f"{name} train", 3 * x.nbytes, fwd, diffs, note=note))
    dx_old = old.batchnorm_backward(dy, x, gamma, mean=m_old, invstd=s_old, layout="NHWC")
    bwd = {"old": lambda: old.batchnorm_backward(dy, x, gamma, mean=m_old, invstd=s_old, layout="NHWC")}
    diffs = {}
    for tag, sw in VARIANTS[dtype].items():
        call = common.switched(new_norm, lambda: new.batchnorm_backward(dy, x, gamma, mean=m_old, invstd=s_old,
                                                                        layout="NHWC"), **sw)
        got = call()
        diffs[tag] = close(got[:1], dx_old[:1], dtype, f"{name} backward {tag} dx")
        rel = max(float(cp.abs(a - b).max() / cp.abs(b).max()) for a, b in zip(got[1:], dx_old[1:]))
        assert rel <= 1e-4, f"{name} backward {tag}: dgamma / dbeta differ by {rel:.1e} (relative)"
        bwd[tag] = call
    txg, tgg, tbg = (t.detach().clone().requires_grad_() for t in (tx, tg, tb))  # as the bench
    ty = F.batch_norm(txg, None, None, tgg, tbg, training=True)
    bwd["torch"] = lambda: torch.autograd.grad(ty, (txg, tgg, tbg), tdy, retain_graph=True)
    out.append(common.ab_problem(f"{name} backward", 5 * x.nbytes, bwd, diffs, note=note))
    return out


copy = common.copy_gbps()
print(f"copy {copy:.0f} GB/s", flush=True)
rows = []
for dtype, shape in (("float16", (64, 56, 56, 256)), ("bfloat16", (64, 56, 56, 256)), ("float32", (64, 56, 56, 256)),
                     ("float16", (64, 56, 56, 200))):
    rows += problem(dtype, shape)
    cp.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()
common.print_table(rows, copy, sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--json" else None)
