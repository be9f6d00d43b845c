"""Old (main's dnnprims/ + kernels/, copied aside by notes/ab/patch_ab.sh) against new
(notes/wip/bnnhwc.patch: batchnorm_rows_{train,backward}_resident, ROWS_RESIDENT) against
PyTorch (F.batch_norm on the channels_last view), in ONE process: batch-norm TRAINING
forward (running statistics updated) and BACKWARD (saved statistics) of bn_big_nhwc
[64,56,56,256] in float32 and float16 (parameters float32).
Variants of new (plan-key switches of dnnprims.normalization, set per call):
  new      the patch's defaults (cache = what an SM's shared memory leaves, L2 window 0.5)
  nohint   ROWS_L2_WINDOW = None  (the big cache alone, plain loads / stores)
  cache32  ROWS_CACHE_BYTES = 32768 (rows_fused's static cache size) with the hints
  w0.25 / w0.8  ROWS_L2_WINDOW = 0.25 / 0.8 of the L2
Floors: forward 3 x.nbytes (read x twice, write y), backward 5 x.nbytes.  Results of
every variant are checked bitwise against old before timing (same lanes, batches and
merge order: diff 0 expected; fp16 old runs 1 block an SM, new 2, so its lanes and
hence its rounding differ: diff within fp16 rounding there).  Table last.
    python notes/bnnhwc_ab.py OLD_ROOT --json PATH"""
import importlib
import sys

sys.path.insert(0, "notes/ab")
import common  # noqa: E402

import cupy as cp  # noqa: E402
import torch  # noqa: E402

import dnnprims as new  # noqa: E402
from dnnprims import normalization as new_norm  # noqa: E402

old = common.load_old(sys.argv[1])
old_norm = importlib.import_module("dnnprims_old.normalization")
assert "batchnorm_rows_train_resident" not in old_norm.FAMILY.source, "old must be unpatched"
assert "batchnorm_rows_train_resident" in new_norm.FAMILY.source, "new must be patched"
F = torch.nn.functional
VARIANTS = {"new": {}, "nohint": {"ROWS_L2_WINDOW": None}, "cache32": {"ROWS_CACHE_BYTES": 32768},
            "w0.25": {"ROWS_L2_WINDOW": 0.25}, "w0.8": {"ROWS_L2_WINDOW": 0.8}}


def launch_facts(x, tensors):
    """(cached batches, window batches, shared bytes, grid) the new plan picks for x."""
    rows = new_norm._Rows(cp, x, x.shape[-1], x.size // x.shape[-1], aligned=True)
    kind = "train" if tensors == 1 else "backward"
    spec = rows.spec(f"{kind}_resident", "float")
    got = new_norm._rows_resident_launch(cp, rows, spec, x.shape[-1], tensors, x.itemsize)
    return None if got is None else dict(grid=got[0], lanes=got[1], cached=got[3], window=got[4], shared=got[5])


def problem(dtype):
    """The forward and backward rows of bn_big_nhwc in dtype."""
    shape = (64, 56, 56, 256)
    C = shape[-1]
    x = (cp.random.random(shape, dtype=cp.float32) * 4 - 1).astype(dtype)
    dy = (cp.random.random(shape, dtype=cp.float32) * 2 - 1).astype(dtype)
    gamma = cp.random.random(C, dtype=cp.float32) + 0.5
    beta = cp.random.random(C, dtype=cp.float32) - 0.5
    rm, rv = cp.zeros(C, cp.float32), cp.ones(C, cp.float32)
    name = "bn_big_nhwc" + ("" if dtype == "float32" else "_f16")
    facts = {"train": launch_facts(x, 1), "backward": launch_facts(x, 2)}
    print(name, facts, flush=True)
    out = []
    # training forward (running statistics updated)
    y_old, m_old, s_old = old.batchnorm(x, gamma, beta, rm, rv, layout="NHWC", return_stats=True)
    fwd = {"old": lambda: old.batchnorm(x, gamma, beta, rm, rv, layout="NHWC")}
    diffs = {}
    for tag, sw in VARIANTS.items():
        y, m, s = common.switched(new_norm, lambda: new.batchnorm(x, gamma, beta, rm, rv, layout="NHWC",
                                                                  return_stats=True), **sw)()
        diffs[tag] = max(common.max_abs(y, y_old), common.max_abs(m, m_old), common.max_abs(s, s_old))
        fwd[tag] = common.switched(new_norm, lambda: new.batchnorm(x, gamma, beta, rm, rv, layout="NHWC"), **sw)
    tx = torch.from_dlpack(x).permute(0, 3, 1, 2)  # channels_last memory, as the bench
    tg, tb, trm, trv = (torch.from_dlpack(a) for a in (gamma, beta, rm.copy(), rv.copy()))
    fwd["torch"] = lambda: F.batch_norm(tx, trm, trv, tg, tb, training=True)
    out.append(common.ab_problem(f"{name} train", 3 * x.nbytes, fwd, diffs, note=str(facts["train"])))
    # backward with the saved statistics
    dx_old = old.batchnorm_backward(dy, x, gamma, mean=m_old, invstd=s_old, layout="NHWC")
    bwd = {"old": lambda: old.batchnorm_backward(dy, x, gamma, mean=m_old, invstd=s_old, layout="NHWC")}
    diffs = {}
    for tag, sw in VARIANTS.items():
        call = common.switched(new_norm, lambda: new.batchnorm_backward(dy, x, gamma, mean=m_old, invstd=s_old,
                                                                        layout="NHWC"), **sw)
        diffs[tag] = max(common.max_abs(a, b) for a, b in zip(call(), dx_old))
        bwd[tag] = call
    txg, tgg, tbg = (t.detach().clone().requires_grad_() for t in (tx, tg, tb))  # as the bench
    ty = F.batch_norm(txg, None, None, tgg, tbg, training=True)
    tdy = torch.from_dlpack(dy).permute(0, 3, 1, 2)
    bwd["torch"] = lambda: torch.autograd.grad(ty, (txg, tgg, tbg), tdy, retain_graph=True)
    out.append(common.ab_problem(f"{name} backward", 5 * x.nbytes, bwd, diffs, note=str(facts["backward"])))
    return out


copy = common.copy_gbps()
print(f"copy {copy:.0f} GB/s", flush=True)
rows = []
for dtype in ("float32", "float16"):
    rows += problem(dtype)
    cp.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()
common.print_table(rows, copy, sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--json" else None)
