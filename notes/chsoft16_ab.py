"""A/B of notes/wip/chsoft16.patch (16-bit channel softmax forward in words, notes/chsoft16.md):
old (the tree before the patch) vs new (PACKED16_FORWARD default and variants) vs PyTorch, one
process, on 64x256x56x56 softmax / log_softmax over dim 1, forward and backward, float16 and
bfloat16, float32 as the control (same kernels before and after).  Then a placement probe for
the float16 log_softmax backward (0.84 of copy in one bench run, 0.95 in three): the same old
kernel with dy / y / dx at several relative offsets inside one allocation.

    python notes/chsoft16_ab.py OLD_ROOT --json PATH
"""
import importlib
import sys

sys.path.insert(0, "notes/ab")

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import common  # noqa: E402
from dnnprims import _dtypes, softmaxes  # noqa: E402

SHAPE = (64, 256, 56, 56)
# new: the default (8, 256, 3), persistent with prefetch; newNoPf: the same kernel one tile a
# block (no prefetch: the instruction cut alone); the other launch shapes.
VARIANTS = {"new": True, "newNoPf": (8, 256, 3, False), "new8x4": (8, 256, 4), "new4x5": (4, 256, 5)}


def typed(dtype, low, high, seed):
    """A CuPy array and its torch twin (bfloat16 drawn by torch: CuPy has no generator for it)."""
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
    """Normwise relative error against the float64 result."""
    out = as_torch(out) if not isinstance(out, torch.Tensor) else out
    d = out.double() - ref64
    return float(torch.linalg.vector_norm(d) / torch.linalg.vector_norm(ref64))


def max_rel(a, b):
    """max |a - b| / max |b| (a, b: our arrays)."""
    ta, tb = as_torch(a).double(), as_torch(b).double()
    return float((ta - tb).abs().max() / tb.abs().max())


def differs(a, b):
    """Fraction of output values whose bits differ."""
    it = torch.int16 if a.itemsize == 2 else torch.int32
    return float((as_torch(a).view(-1).view(it) != as_torch(b).view(-1).view(it)).double().mean())


def main():
    old_root = sys.argv[1]
    json_path = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
    old = common.load_old(old_root)
    copy = common.copy_gbps()
    rows = []
    for name in ("float16", "bfloat16", "float32"):
        x, tx = typed(name, -8, 8, 1)
        dy, tdy = typed(name, -1, 1, 2)
        x64 = tx.double()
        item = x.itemsize
        numel = x.size
        for log in (False, True):
            op = "log_softmax" if log else "softmax"
            ours_new = softmaxes.log_softmax if log else softmaxes.softmax
            ours_old = old.log_softmax if log else old.softmax
            tfwd = torch.log_softmax if log else torch.softmax
            want = tfwd(x64, 1)
            fns = {"old": lambda: ours_old(x, axis=1)}
            variants = VARIANTS if item == 2 else {"new": True}
            for tag, switch in variants.items():
                fns[tag] = common.switched(softmaxes, lambda: ours_new(x, axis=1), PACKED16_FORWARD=switch)
            fns["torch"] = lambda: tfwd(tx, 1)
            outs = {tag: fn() for tag, fn in fns.items()}
            errs = {tag: rel_err(v, want) for tag, v in outs.items()}
            diffs = {tag: max_rel(outs[tag], outs["old"]) for tag in variants}
            note = ("err vs float64 (normwise): " + ", ".join(f"{k} {v:.2e}" for k, v in errs.items())
                    + "; bits changed vs old: " + ", ".join(f"{k} {differs(outs[k], outs['old']):.2%}" for k in variants))
            limit = {"float16": 3e-3, "bfloat16": 2e-2, "float32": 1e-5}[name]  # tolerances.py "default"
            for tag in variants:
                if not errs[tag] <= limit or not errs[tag] <= 1.1 * errs["old"] + 1e-7:
                    note += f"; {tag} ERROR ABOVE LIMIT"
            rows.append(common.ab_problem(f"{op} fwd {name}", 2 * numel * item, fns, diffs, note))
            # Backward: the same kernels before and after (a control), and PyTorch's figure.
            y = outs["old"]
            ty = as_torch(y)
            bnew = softmaxes.log_softmax_backward if log else softmaxes.softmax_backward
            bold = old.log_softmax_backward if log else old.softmax_backward
            tb = torch._log_softmax_backward_data if log else torch._softmax_backward_data
            fns = {"old": lambda: bold(dy, y, axis=1), "new": lambda: bnew(dy, y, axis=1),
                   "torch": lambda: tb(tdy, ty, 1, getattr(torch, name))}
            diffs = {"new": max_rel(fns["new"](), fns["old"]())}
            rows.append(common.ab_problem(f"{op} bwd {name}", 3 * numel * item, fns, diffs))
    # Placement probe: float16 log_softmax backward (the old kernel, launched directly) with
    # dy, y, dx at byte offsets 0 / S / 2S of one allocation (back to back), with gaps of
    # 2 MiB and of 96 KiB, and shifted by 512 B; the same three arrays twice in a row
    # ("again": the spread of one placement).
    old_sm = importlib.import_module(old.__name__ + ".softmaxes")
    numel = int(np.prod(SHAPE))
    S = numel * 2
    pool = cp.empty(3 * S + 8 * 2**20, dtype=cp.uint8)
    expr, grid, block, scalars, shared = old_sm._plan("backward", True, SHAPE, 1, np.dtype(np.float16), True)
    src, _ = typed("float16", -1, 1, 3)
    logy = old.log_softmax(src, axis=1)
    probe = {}
    for tag, (oy, odx) in {"old": (S, 2 * S), "gap2MiB": (S + 2**21, 2 * S + 2**22),
                           "gap96KiB": (S + 3 * 2**15, 2 * S + 3 * 2**16), "shift512": (S + 512, 2 * S + 1024),
                           "again": (S, 2 * S)}.items():
        dyv = pool[:S].view(cp.float16).reshape(SHAPE)
        yv = pool[oy:oy + S].view(cp.float16).reshape(SHAPE)
        dxv = pool[odx:odx + S].view(cp.float16).reshape(SHAPE)

        def launch(dyv=dyv, yv=yv, dxv=dxv):
            old_sm.FAMILY.launch(expr, grid, block, (dyv, yv, dxv, *scalars), shared_mem=shared)
        probe[tag] = launch
    pool[:S].view(cp.float16)[...] = src.reshape(-1)
    for oy in {S, S + 2**21, S + 3 * 2**15, S + 512}:
        pool[oy:oy + S].view(cp.float16)[...] = logy.reshape(-1)
    rows.append(common.ab_problem("logsm bwd f16 placed", 3 * S, probe,
                                  note=f"{expr}, grid {grid}, block {block}; x old = placement vs back to back"))
    common.print_table(rows, copy, json_path)


if __name__ == "__main__":
    main()
