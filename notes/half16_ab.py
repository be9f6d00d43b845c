"""Old (the unpatched tree) against new (this tree, notes/wip/gelu16_backward.patch
and notes/wip/softmax16_forward.patch applied) in ONE process, PyTorch side by
side, A B A B: ms (median of 20 CUDA-event timed calls, the bench's `measure`),
fraction of the copy bandwidth over the floor bytes (copy of 1 GiB measured in
this run), torch / ours; plus each result's normwise error against float64
(torch, on the GPU) and the fraction of outputs that differ from old's bits.
Problem: 64x256x56x56 (NCHW), the bench's act_64x256x56x56 / channel_64x256x56x56.
    python notes/half16_ab.py OLD_ROOT [--json PATH]"""
import importlib.util
import json
import math
import sys

import numpy as np
import cupy as cp
import torch

import dnnprims as new
from dnnprims import _dtypes
from dnnprims.bench import timing

OLD_ROOT = sys.argv[1]
spec = importlib.util.spec_from_file_location("dnnprims_old", f"{OLD_ROOT}/dnnprims/__init__.py",
                                              submodule_search_locations=[f"{OLD_ROOT}/dnnprims"])
old = importlib.util.module_from_spec(spec)
sys.modules["dnnprims_old"] = old
spec.loader.exec_module(old)
from dnnprims_old import softmaxes as old_sm  # noqa: E402
from dnnprims_old import activations as old_act  # noqa: E402
from dnnprims import softmaxes as new_sm  # noqa: E402
from dnnprims import activations as new_act  # noqa: E402
assert old_sm.__file__ != new_sm.__file__, (old_sm.__file__, new_sm.__file__)
assert "derivative_for" not in old_act.FAMILY.source and "derivative_for" in new_act.FAMILY.source, \
    "old must be unpatched, new patched"
assert "PairMax" not in old_sm.FAMILY.source and "PairMax" in new_sm.FAMILY.source, "old must be unpatched, new patched"
print("old:", old_sm.__file__, "new:", new_sm.__file__, flush=True)

SHAPE = (64, 256, 56, 56)
REPEAT = 20
DTYPES = ("float16", "bfloat16", "float32")  # float32: a control (its kernels are unchanged)


def copy_gbps():
    src = cp.random.random(2**28, dtype=cp.float32)
    dst = cp.empty_like(src)
    t = timing.measure(lambda: dst.__setitem__(Ellipsis, src), xp=cp, warmup=3, repeat=10)
    return 2 * src.nbytes / (t.median_ms * 1e-3) / 1e9


def ms(fn):
    return timing.measure(fn, xp=cp, repeat=REPEAT).median_ms


def typed(dtype, low, high, seed):
    t = torch.empty(SHAPE, dtype=getattr(torch, dtype), device="cuda")
    torch.manual_seed(seed)
    t.uniform_(low, high)
    if dtype == "bfloat16":
        return cp.from_dlpack(t.view(torch.int16)).view(_dtypes.BFLOAT16), t
    return cp.from_dlpack(t), t


def as_torch(a):
    if a.dtype.name == "bfloat16":
        return torch.from_dlpack(a.view(cp.int16)).view(torch.bfloat16)
    return torch.from_dlpack(a)


def rel_err(out, ref64):
    d = as_torch(out).double() - ref64
    return float(torch.linalg.vector_norm(d) / torch.linalg.vector_norm(ref64))


def differs(a, b):
    return float((as_torch(a).view(-1).view(torch.int16 if a.itemsize == 2 else torch.int32)
                  != as_torch(b).view(-1).view(torch.int16 if b.itemsize == 2 else torch.int32)).double().mean())


def plan_launch(sm, log, x, y, entry=None):
    """The softmax forward launch that _plan gives (entry: a CHANNEL_PACKS entry for x's type)."""
    table = sm.CHANNEL_PACKS[("forward", log)]
    saved = dict(table)
    if entry is not None:
        table[sm._dtypes.cuda_type(x.dtype)] = entry
    try:
        expr, grid, block, scalars, shared = sm._plan("forward", log, x.shape, 1, x.dtype, True)
    finally:
        table.clear()
        table.update(saved)
    return expr, (lambda: sm.FAMILY.launch(expr, grid, block, (x, y, *scalars), shared_mem=shared))


rows = []
copy = copy_gbps()
print(f"copy {copy:.0f} GB/s", flush=True)
for dtype in DTYPES:
    x, tx = typed(dtype, -4, 4, 1)
    dy, tdy = typed(dtype, -1, 1, 2)
    n = x.nbytes
    # ---- gelu backward
    x64, dy64 = tx.double(), tdy.double()
    ref = dy64 * (0.5 * torch.special.erfc(-x64 / math.sqrt(2)) + x64 / math.sqrt(2 * math.pi) * torch.exp(-0.5 * x64 * x64))
    outs = {"old": old.activation_backward(dy, x, "gelu"), "new": new.activation_backward(dy, x, "gelu"),
            "torch": torch.ops.aten.gelu_backward(tdy, tx, approximate="none")}
    errs = {k: (rel_err(v, ref) if k != "torch" else float(torch.linalg.vector_norm(v.double() - ref)
                                                              / torch.linalg.vector_norm(ref)))
            for k, v in outs.items()}
    fns = {"old": lambda: old.activation_backward(dy, x, "gelu"), "new": lambda: new.activation_backward(dy, x, "gelu"),
           "torch": lambda: torch.ops.aten.gelu_backward(tdy, tx, approximate="none")}
    cases = [("gelu_bwd", fns, errs, differs(outs["old"], outs["new"]), 3 * n)]
    del outs, ref
    # ---- softmax / log_softmax forward over the channel axis
    for log in (False, True):
        fold = "log_softmax" if log else "softmax"
        ref = torch.log_softmax(x64, 1) if log else torch.softmax(x64, 1)
        fo, fnw = (old.log_softmax, new.log_softmax) if log else (old.softmax, new.softmax)
        tf = torch.log_softmax if log else torch.softmax
        yo, yn = fo(x, axis=1), fnw(x, axis=1)
        finite = torch.isfinite(ref)
        errs = {"old": rel_err(yo, ref), "new": rel_err(yn, ref),
                "torch": float(torch.linalg.vector_norm(tf(tx, 1).double() - ref) / torch.linalg.vector_norm(ref))}
        fns = {"old": lambda f=fo: f(x, axis=1), "new": lambda f=fnw: f(x, axis=1), "torch": lambda f=tf: f(tx, 1)}
        if dtype != "float32":  # the other launch bound of the forward packs kernel, new code
            other = (8, 256, 4) if (new_sm.CHANNEL_PACKS[("forward", log)][_dtypes.cuda_type(x.dtype)]
                                    != (8, 256, 4)) else (8, 256)
            y2 = cp.empty_like(x)
            expr, launch = plan_launch(new_sm, log, x, y2, other)
            launch()
            errs[f"new{other}"] = rel_err(y2, ref)
            fns[f"new{other}"] = launch
            print(f"{dtype} {fold}: extra variant {expr}", flush=True)
        cases.append((fold + "_fwd", fns, errs, differs(yo, yn), 2 * n))
        del yo, yn, ref
    for op, fns, errs, diff, floor in cases:
        got = {tag: [] for tag in fns}
        for _ in range(2):  # A B A B
            for tag in fns:
                got[tag].append(ms(fns[tag]))
        best = {tag: min(t) for tag, t in got.items()}
        row = {"dtype": dtype, "op": op, "floor_bytes": floor, "copy_GBps": copy, "frac_bits_changed": diff,
               "ms": got, "rel_err_vs_f64": errs,
               "of_copy": {tag: floor / (t * 1e-3) / 1e9 / copy for tag, t in best.items()},
               "torch_over": {tag: best["torch"] / t for tag, t in best.items()}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    del x, dy, tx, tdy, x64, dy64, cases, fns
    cp.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()

print()
print(f"copy {copy:.0f} GB/s; 64x256x56x56; ms = the two A/B medians; of copy / x torch from the better one;"
      " err = normwise vs float64; chg = fraction of output bits old != new")
print(f"{'dtype':8s} {'op':15s} {'variant':14s} {'ms':>15s} {'of copy':>7s} {'x torch':>7s} {'err':>8s}")
for r in rows:
    for tag, t in r["ms"].items():
        print(f"{r['dtype']:8s} {r['op']:15s} {tag:14s} {'/'.join(f'{v:.4f}' for v in t):>15s}"
              f" {r['of_copy'][tag]:7.3f} {r['torch_over'][tag]:7.3f} {r['rel_err_vs_f64'][tag]:8.1e}")
    print(f"{'':8s} {r['op']:15s} chg {r['frac_bits_changed']:.4f}")
if len(sys.argv) > 3 and sys.argv[2] == "--json":
    json.dump(rows, open(sys.argv[3], "w"), indent=1)
