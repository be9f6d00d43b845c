"""Old (main's dnnprims/ + kernels/, copied aside by notes/ab/patch_ab.sh) against new
(notes/wip/smallbn.patch) against PyTorch, in ONE process: NCHW batch-norm TRAINING forward
(running statistics updated, as the bench's row) of the small L2-resident planes the
patch's batchnorm_train_queued is for:
  bn_r50_late        [32,2048,7,7] float32 (the bench row; G = 4: 512 groups)
  bn_r50_late_f16    [32,2048,7,7] float16 (G = 8: 256 groups)
  bn_r50_l3_f16      [32,1024,14,14] float16 (196 % 8 = 4: G = 2, 512 groups)
Variants of new (plan-key switches of dnnprims.normalization, set per call):
  new    the patch's defaults: STRIDED_QUEUE = 2 (where the size rule takes it: 2 groups a
         block staged in 64 KB of shared memory, 2 blocks an SM)
  q4     STRIDED_QUEUE = 4, STRIDED_QUEUE_MIN_BLOCKS = 1 (4 groups a block, forced; 128 KB,
         1 block an SM)
  off    STRIDED_QUEUE = 1: batchnorm_train_strided from the new tree (A/B noise control)
Each variant's y / mean / invstd / running statistics are checked against old before
timing (the queued kernel does the strided kernel's arithmetic in its order: bitwise
expected; asserted within 1e-6 x max|y| for float32, one 16-bit ulp otherwise).
Floor: 2 x.nbytes (x read once -- it fits in L2 -- and y written), as the bench.
Table last.
    python notes/smallbn_ab.py OLD_ROOT --json PATH"""
import importlib
import sys

sys.path.insert(0, "notes/ab")
import common  # noqa: E402

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import dnnprims as new  # noqa: E402
from dnnprims import normalization as new_norm  # noqa: E402

old = common.load_old(sys.argv[1])
old_norm = importlib.import_module("dnnprims_old.normalization")
assert not hasattr(old_norm, "STRIDED_QUEUE"), "old must be unpatched"
assert hasattr(new_norm, "STRIDED_QUEUE"), "new must be patched"
F = torch.nn.functional
TORCH = {"float32": torch.float32, "float16": torch.float16}


def kernel_of(x, switches):
    """The training-forward kernel expression the new plan takes for x under switches."""
    got = []
    saved = new_norm.FAMILY.prepare

    def plan():
        c, outer, inner = x.shape[1], x.shape[0], x.size // (x.shape[0] * x.shape[1])
        new_norm._build_forward_plan(cp, x, x, np.float32, c, outer, inner, True, True, 0.1, 1e-5,
                                     False, False, True)
    new_norm.FAMILY.prepare = lambda e, *a, **k: got.append(e) or saved(e, *a, **k)
    try:
        common.switched(new_norm, plan, **switches)()
    finally:
        new_norm.FAMILY.prepare = saved
    return got[0].replace("batchnorm_train_", "") if got else "?"


def problem(name, shape, dtype, variants):
    C = shape[1]
    tx = torch.empty(shape, dtype=TORCH[dtype], device="cuda").uniform_(-1, 3)
    x = cp.from_dlpack(tx)
    gamma = cp.random.random(C, dtype=cp.float32) + 0.5
    beta = cp.random.random(C, dtype=cp.float32) - 0.5
    rm0 = (cp.random.random(C, dtype=cp.float32) - 0.5) * 0.2
    rv0 = cp.random.random(C, dtype=cp.float32) + 0.5
    tg, tb, trm, trv = (torch.from_dlpack(a) for a in (gamma, beta, rm0.copy(), rv0.copy()))
    rm, rv = rm0.copy(), rv0.copy()  # the timed calls' running statistics (updated each call)
    ro, vo = rm0.copy(), rv0.copy()
    y_old, m_old, s_old = old.batchnorm(x, gamma, beta, ro, vo, momentum=0.1, return_stats=True)
    scale = float(cp.abs(y_old.astype(cp.float32)).max())
    tol = 1e-6 * scale if dtype == "float32" else 2 ** -10 * scale
    fns = {"old": lambda: old.batchnorm(x, gamma, beta, rm, rv)}
    diffs, kernels = {}, []
    for tag, sw in variants.items():
        rn, vn = rm0.copy(), rv0.copy()
        y, m, s = common.switched(new_norm, lambda: new.batchnorm(x, gamma, beta, rn, vn, momentum=0.1,
                                                                  return_stats=True), **sw)()
        diffs[tag] = common.max_abs(y, y_old)
        small = max(common.max_abs(a, b) for a, b in ((m, m_old), (s, s_old), (rn, ro), (vn, vo)))
        bitwise = bool((y.view(cp.uint8) == y_old.view(cp.uint8)).all())
        kernels.append(f"{tag}: {kernel_of(x, sw)}{' bitwise' if bitwise else ''}")
        assert diffs[tag] <= tol and small <= 1e-5 * max(1.0, float(cp.abs(s_old).max())), (
            f"{name} {tag}: y diff {diffs[tag]:.2e} (tol {tol:.1e}), stats diff {small:.2e}")
        fns[tag] = common.switched(new_norm, lambda: new.batchnorm(x, gamma, beta, rm, rv), **sw)
    fns["torch"] = lambda: F.batch_norm(tx, trm, trv, tg, tb, training=True)
    note = "; ".join(kernels)
    print(name, note, flush=True)
    return common.ab_problem(f"{name} train", 2 * x.nbytes, fns, diffs, note=note)


ON = {}
Q4 = {"STRIDED_QUEUE": 4, "STRIDED_QUEUE_MIN_BLOCKS": 1}
OFF = {"STRIDED_QUEUE": 1}
copy = common.copy_gbps()
print(f"copy {copy:.0f} GB/s", flush=True)
rows = [problem("bn_r50_late", (32, 2048, 7, 7), "float32", {"new": ON, "q4": Q4, "off": OFF}),
        problem("bn_r50_late_f16", (32, 2048, 7, 7), "float16", {"new": ON, "q4": Q4, "off": OFF}),
        problem("bn_r50_l3_f16", (32, 1024, 14, 14), "float16", {"new": ON, "q4": Q4, "off": OFF})]
common.print_table(rows, copy, sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--json" else None)
