"""Old (main's dnnprims/ + kernels/, copied aside by notes/ab/patch_ab.sh) against new
(notes/wip/bn16bwd.patch: ROWS_BLOCKS_PER_SM) against PyTorch, in ONE process:
channel-last batch-norm BACKWARD (saved statistics) of [64,56,56,256] float16 (the row the
patch is for), bfloat16 (its shape already has 2 blocks an SM: the control that the cap
changes nothing there), float16 [64,56,56,200], and float16 TRAINING forward as a control
(the cap names the backward only).  Parameters float32.  Main's default for 16-bit is the
_narrow kernels (4 channels a thread).  Variants of new (plan-key switches, set per call):
  b2    ROWS_BLOCKS_PER_SM = (("backward", 2, 2),): fp16 backward_narrow at 2 blocks an SM,
        bf16's shape (grid 264, lanes 1056, cached 7, window 3 instead of 396 / 1584 / 4 / 2)
  b2w4  b2 + the backward L2 window at 0.35 of the L2 (4 batches of every lane)
  b2c5  b2 + ROWS_CACHE_BYTES 80 KB (5 cached batches: is it the cache or the lanes?)
  b3w3  no cap (3 blocks, cached 4) + the backward L2 window at 0.4 (3 batches)
Results checked before timing: b2 against old within 4 units of the last place (other
lanes: not bitwise), dgamma / dbeta within 1e-4 relative; b2w4 / b2c5 BITWISE b2 (same
lanes), b3w3 bitwise old; every bf16 variant and the train control bitwise old.
Floors: forward 3 x.nbytes (read x twice, write y), backward 5 x.nbytes.  Table last.
    python notes/bn16bwd_ab.py OLD_ROOT --json PATH"""
import importlib
import sys

sys.path.insert(0, "notes/ab")
import common  # noqa: E402

import cupy as cp  # noqa: E402
import torch  # noqa: E402

import dnnprims as new  # noqa: E402
from dnnprims import _dtypes  # noqa: E402
from dnnprims import normalization as new_norm  # noqa: E402

old = common.load_old(sys.argv[1])
old_norm = importlib.import_module("dnnprims_old.normalization")
assert not hasattr(old_norm, "ROWS_BLOCKS_PER_SM"), "old must be unpatched"
assert hasattr(new_norm, "ROWS_BLOCKS_PER_SM"), "new must be patched"
F = torch.nn.functional
CAP2 = (("backward", 2, 2),)
TRAIN_WINDOWS = (("train", 2, 0.25), ("train", 4, 0.25))
SWITCH = {"b2": dict(ROWS_BLOCKS_PER_SM=CAP2),
          "b2w4": dict(ROWS_BLOCKS_PER_SM=CAP2, ROWS_L2_WINDOW=TRAIN_WINDOWS + (("backward", 2, 0.35),)),
          "b2c5": dict(ROWS_BLOCKS_PER_SM=CAP2, ROWS_CACHE_BYTES=5 * 16384),
          "b3w3": dict(ROWS_L2_WINDOW=TRAIN_WINDOWS + (("backward", 2, 0.4),))}
# (dtype, shape, direction): [(variant, the result it must equal: "old" / "b2", bitwise?)]
PROBLEMS = [("float16", (64, 56, 56, 256), "backward",
             [("b2", "old", False), ("b2w4", "b2", True), ("b2c5", "b2", True), ("b3w3", "old", True)]),
            ("bfloat16", (64, 56, 56, 256), "backward", [("b2", "old", True), ("b2w4", "old", True)]),
            ("float16", (64, 56, 56, 200), "backward", [("b2", "old", False), ("b2w4", "b2", True)]),
            ("float16", (64, 56, 56, 256), "train", [("b2", "old", True)])]
TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16}
ULP = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}


def ours(t):
    if t.dtype == torch.bfloat16:
        return cp.from_dlpack(t.view(torch.int16)).view(_dtypes.BFLOAT16)
    return cp.from_dlpack(t)


def geometry(x, tensors):
    """'grid G lanes L cached K window W' of the new tree's narrow launch of this x under
    the current switches."""
    C, M = x.shape[-1], x.size // x.shape[-1]
    res = new_norm._Rows(cp, x, C, M, aligned=True, max_vec=4)
    spec = (f"batchnorm_rows_train_narrow<{res.t}, float, {res.index_t}, true>" if tensors == 1 else
            f"batchnorm_rows_backward_narrow<{res.t}, float, {res.index_t}>")
    launch = new_norm._rows_resident_launch(cp, res, spec, C, tensors, x.itemsize)
    return "none" if launch is None else f"{launch[0][0]}/{launch[1]}/{launch[3]}/{launch[4]}"


def check(got, want, dtype, bitwise, what):
    """max |got - want| of the first array; BITWISE for every array, or the first within 4
    units of the last place of the largest |want| and the rest within 1e-4 relative."""
    if bitwise:
        for a, b in zip(got, want):
            assert bool((cp.asarray(a).view(cp.uint8) == cp.asarray(b).view(cp.uint8)).all()), f"{what}: not bitwise"
        return common.max_abs(got[0], want[0])
    scale = float(cp.abs(cp.asarray(want[0], dtype=cp.float64)).max())
    err = common.max_abs(got[0], want[0])
    assert err <= 4 * ULP[dtype] * max(scale, 1e-3), f"{what}: {err:.2e} > 4 ulp of {scale:.2e}"
    rel = max(float(cp.abs(a - b).max() / cp.abs(b).max()) for a, b in zip(got[1:], want[1:]))
    assert rel <= 1e-4, f"{what}: the other results differ by {rel:.1e} (relative)"
    return err


def problem(dtype, shape, direction, variants):
    C = shape[-1]
    tx = torch.empty(shape, dtype=TORCH[dtype], device="cuda").uniform_(-1, 3)
    tdy = torch.empty(shape, dtype=TORCH[dtype], device="cuda").uniform_(-1, 1)
    x, dy = (ours(t) for t in (tx, tdy))
    tx, tdy = tx.permute(0, 3, 1, 2), tdy.permute(0, 3, 1, 2)  # channels_last views, as the bench
    gamma = cp.random.random(C, dtype=cp.float32) + 0.5
    beta = cp.random.random(C, dtype=cp.float32) - 0.5
    rm, rv = cp.zeros(C, cp.float32), cp.ones(C, cp.float32)
    name = ("bn_nhwc" + ("" if C == 256 else f"_c{C}") + {"float16": "_f16", "bfloat16": "_bf16"}[dtype]
            + (" train" if direction == "train" else " bwd"))
    tensors = 1 if direction == "train" else 2
    note = "grid/lanes/cached/window: old " + geometry(x, tensors) + "".join(
        f", {tag} " + common.switched(new_norm, lambda: geometry(x, tensors), **SWITCH[tag])()
        for tag, _, _ in variants)
    print(name, note, flush=True)
    m_old, s_old = old.batchnorm(x, gamma, beta, rm, rv, layout="NHWC", return_stats=True)[1:]
    if direction == "train":
        fns = {"old": lambda: old.batchnorm(x, gamma, beta, rm, rv, layout="NHWC", return_stats=True)}
        new_call = lambda: new.batchnorm(x, gamma, beta, rm, rv, layout="NHWC", return_stats=True)  # noqa: E731
        tg, tb, trm, trv = (torch.from_dlpack(a) for a in (gamma, beta, rm.copy(), rv.copy()))
        torch_call = lambda: F.batch_norm(tx, trm, trv, tg, tb, training=True)  # noqa: E731
    else:
        fns = {"old": lambda: old.batchnorm_backward(dy, x, gamma, mean=m_old, invstd=s_old, layout="NHWC")}
        new_call = lambda: new.batchnorm_backward(dy, x, gamma, mean=m_old, invstd=s_old,  # noqa: E731
                                                  layout="NHWC")
        txg, tgg, tbg = (t.detach().clone().requires_grad_() for t in (tx, torch.from_dlpack(gamma),
                                                                         torch.from_dlpack(beta)))
        ty = F.batch_norm(txg, None, None, tgg, tbg, training=True)
        torch_call = lambda: torch.autograd.grad(ty, (txg, tgg, tbg), tdy, retain_graph=True)  # noqa: E731
    results = {"old": fns["old"]()}
    diffs = {}
    for tag, ref, bitwise in variants:
        call = common.switched(new_norm, new_call, **SWITCH[tag])
        results[tag] = call()
        diffs[tag] = check(results[tag], results[ref], dtype, bitwise, f"{name} {tag} vs {ref}")
        fns[tag] = call
    fns["torch"] = torch_call
    floor = (3 if direction == "train" else 5) * x.nbytes
    return common.ab_problem(name, floor, fns, diffs, note=note)


copy = common.copy_gbps()
print(f"copy {copy:.0f} GB/s", flush=True)
rows = []
for dtype, shape, direction, variants in PROBLEMS:
    rows.append(problem(dtype, shape, direction, variants))
    cp.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()
common.print_table(rows, copy, sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--json" else None)
