"""Old (main's dnnprims/ + kernels/, copied aside by notes/ab/patch_ab.sh) against new
(notes/wip/bn16nhwc2.patch) against PyTorch (F.batch_norm on the channels_last view), in
ONE process: channel-last batch-norm TRAINING forward (running statistics updated) and
BACKWARD (saved statistics) of bn_big_nhwc [64,56,56,256] in float16 and bfloat16 (the
rows the patch is for) and float32 (the control: no AHEAD expressions, main's machine
code), plus float16 [64,56,56,200] (a channel count that is no power of two: 25 vector
columns, 10 lanes a block), parameters float32.
Variants of new (plan-key switches of dnnprims.normalization, set per call):
  new      the patch's defaults: ROWS_16BIT_AHEAD = (2,): batchnorm_rows_*_ahead for
           16-bit (bf16 training with words); float32: main's kernels
  off      ROWS_16BIT_AHEAD = (): main's kernels from the new tree (the A/B's noise)
  words    float16 training with AHEAD and words (ROWS_AHEAD_TRAIN_WORDS both types)
  nowords  bfloat16 training with AHEAD, no words (ROWS_AHEAD_TRAIN_WORDS = (): spills)
Every variant's results are checked BITWISE against old before timing (AHEAD and words
change the order of instructions, not the arithmetic).  Floors: forward 3 x.nbytes
(read x twice, write y), backward 5 x.nbytes.  Table last.
    python notes/bn16nhwc2_ab.py OLD_ROOT --json PATH"""
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
assert not hasattr(old_norm, "ROWS_16BIT_AHEAD"), "old must be unpatched"
assert hasattr(new_norm, "ROWS_16BIT_AHEAD"), "new must be patched"
F = torch.nn.functional
OFF = {"ROWS_16BIT_AHEAD": ()}
TRAIN = {"float32": {"new": {}},
         "float16": {"new": {}, "off": OFF, "words": {"ROWS_AHEAD_TRAIN_WORDS": ("half_t", "bfloat16_t")}},
         "bfloat16": {"new": {}, "off": OFF, "nowords": {"ROWS_AHEAD_TRAIN_WORDS": ()}}}
BACKWARD = {"float32": {"new": {}}, "float16": {"new": {}, "off": OFF}, "bfloat16": {"new": {}, "off": OFF}}
TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def ours(t):
    if t.dtype == torch.bfloat16:
        return cp.from_dlpack(t.view(torch.int16)).view(_dtypes.BFLOAT16)
    return cp.from_dlpack(t)


def specs(x):
    """The resident kernels the new plan runs for x (training forward, backward)."""
    rows = new_norm._Rows(cp, x, x.shape[-1], x.size // x.shape[-1], aligned=True)
    train = new_norm._rows_resident_spec(rows, "float", "train", x.itemsize,
                                         x.itemsize in new_norm.ROWS_TRAIN_ONE_COUNT)
    return train, new_norm._rows_resident_spec(rows, "float", "backward", x.itemsize)


def bitwise(got, want):
    return all(bool((cp.asarray(a).view(cp.uint8) == cp.asarray(b).view(cp.uint8)).all()) for a, b in zip(got, want))


def problem(dtype, shape=(64, 56, 56, 256)):
    """The forward and backward rows of a channel-last problem in dtype."""
    C = shape[-1]
    # data drawn by torch in dtype, NHWC-contiguous; ours views the same memory
    # (bfloat16 through its 16-bit pattern: DLPack has no ml_dtypes)
    tx = torch.empty(shape, dtype=TORCH[dtype], device="cuda").uniform_(-1, 3)
    tdy = torch.empty(shape, dtype=TORCH[dtype], device="cuda").uniform_(-1, 1)
    x, dy = (ours(t) for t in (tx, tdy))
    tx, tdy = tx.permute(0, 3, 1, 2), tdy.permute(0, 3, 1, 2)  # channels_last views, as the bench
    gamma = cp.random.random(C, dtype=cp.float32) + 0.5
    beta = cp.random.random(C, dtype=cp.float32) - 0.5
    rm, rv = cp.zeros(C, cp.float32), cp.ones(C, cp.float32)
    name = "bn_nhwc" + ("" if C == 256 else f"_c{C}") + {"float32": "", "float16": "_f16", "bfloat16": "_bf16"}[dtype]
    note = "new: %s / %s" % specs(x)
    print(name, note, flush=True)
    tg, tb, trm, trv = (torch.from_dlpack(a) for a in (gamma, beta, rm.copy(), rv.copy()))
    out = []
    # training forward (running statistics updated)
    y_old, m_old, s_old = old.batchnorm(x, gamma, beta, rm, rv, layout="NHWC", return_stats=True)
    fwd = {"old": lambda: old.batchnorm(x, gamma, beta, rm, rv, layout="NHWC")}
    diffs = {}
    for tag, sw in TRAIN[dtype].items():
        got = common.switched(new_norm, lambda: new.batchnorm(x, gamma, beta, rm, rv, layout="NHWC",
                                                              return_stats=True), **sw)()
        diffs[tag] = max(common.max_abs(a, b) for a, b in zip(got, (y_old, m_old, s_old)))
        assert bitwise(got, (y_old, m_old, s_old)), f"{name} train {tag}: not bitwise old ({diffs[tag]:.1e})"
        fwd[tag] = common.switched(new_norm, lambda: new.batchnorm(x, gamma, beta, rm, rv, layout="NHWC"), **sw)
    fwd["torch"] = lambda: F.batch_norm(tx, trm, trv, tg, tb, training=True)
    out.append(common.ab_problem(f"{name} train", 3 * x.nbytes, fwd, diffs, note=note))
    # backward with the saved statistics
    dx_old = old.batchnorm_backward(dy, x, gamma, mean=m_old, invstd=s_old, layout="NHWC")
    bwd = {"old": lambda: old.batchnorm_backward(dy, x, gamma, mean=m_old, invstd=s_old, layout="NHWC")}
    diffs = {}
    for tag, sw in BACKWARD[dtype].items():
        call = common.switched(new_norm, lambda: new.batchnorm_backward(dy, x, gamma, mean=m_old, invstd=s_old,
                                                                        layout="NHWC"), **sw)
        got = call()
        diffs[tag] = max(common.max_abs(a, b) for a, b in zip(got, dx_old))
        assert bitwise(got, dx_old), f"{name} backward {tag}: not bitwise old ({diffs[tag]:.1e})"
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
