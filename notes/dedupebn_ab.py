"""Old (main's dnnprims/ + kernels/, copied aside by notes/ab/patch_ab.sh) against new
(notes/wip/dedupebn.patch: the batch-norm folds, no change of machine code: notes/dedupebn.md)
against PyTorch, in ONE process.  The patch only refolds code, so this is a control, not an
A/B that decides: channel-last batch norm, TRAINING forward (running statistics updated) and
BACKWARD (saved statistics) of a 32x28x28x256 tensor in float32 and float16, with the resident
kernels (ROWS_RESIDENT, default) and with the fused ones (ROWS_RESIDENT False: the other branch
of the refolded plan builder), set on BOTH trees per call.  Every pair is checked BITWISE
(outputs, mean, invstd, dgamma, dbeta) and the kernel each plan launched must have the same
name, grid and shared memory in old and new; then old / new / torch are timed (expected within
noise: the kernels are byte-identical SASS under NVRTC 13.0).  Table last.
    python notes/dedupebn_ab.py OLD_ROOT --json PATH"""
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
assert not hasattr(old_norm, "_rows_one_launch"), "old must be unpatched"
assert hasattr(new_norm, "_rows_one_launch"), "new must be patched"
F = torch.nn.functional
TORCH = {"float32": torch.float32, "float16": torch.float16}


def both(fn_old, fn_new, **switches):
    return common.switched(old_norm, fn_old, **switches), common.switched(new_norm, fn_new, **switches)


def launched(module):
    """{plan key: ((expression, grid and block, shared bytes, argument count), ...)} of module's plans."""
    def describe(launch):
        try:
            return launch.expression, tuple(launch._dims), launch._shared, len(launch._template)
        except AttributeError:
            return (type(launch).__name__,)
    return {key: tuple(describe(launch) for launch in getattr(plan, "launches", ()))
            for key, plan in module._PLANS.items()}


def bitwise(a, b):
    return all(bool((cp.asarray(p).view(cp.uint8) == cp.asarray(q).view(cp.uint8)).all()) for p, q in zip(a, b))


def problem(dtype, resident):
    shape = (32, 28, 28, 256)
    C = shape[-1]
    tx = torch.empty(shape, dtype=TORCH[dtype], device="cuda").uniform_(-1, 3)
    tdy = torch.empty(shape, dtype=TORCH[dtype], device="cuda").uniform_(-1, 1)
    x, dy = cp.from_dlpack(tx), cp.from_dlpack(tdy)
    tx, tdy = tx.permute(0, 3, 1, 2), tdy.permute(0, 3, 1, 2)
    gamma = cp.random.random(C, dtype=cp.float32) + 0.5
    beta = cp.random.random(C, dtype=cp.float32) - 0.5
    rm_o, rv_o = cp.zeros(C, cp.float32), cp.ones(C, cp.float32)
    rm_n, rv_n = rm_o.copy(), rv_o.copy()
    sw = {"ROWS_RESIDENT": resident}
    name = f"nhwc {dict(float32='f32', float16='f16')[dtype]} {'resident' if resident else 'fused'}"
    fo, fn = both(lambda: old.batchnorm(x, gamma, beta, rm_o, rv_o, layout="NHWC", return_stats=True),
                  lambda: new.batchnorm(x, gamma, beta, rm_n, rv_n, layout="NHWC", return_stats=True), **sw)
    got_o, got_n = fo(), fn()
    assert bitwise(got_o, got_n) and bitwise((rm_o, rv_o), (rm_n, rv_n)), f"{name} train: not bitwise"
    diff = max(common.max_abs(a, b) for a, b in zip(got_o, got_n))
    m, s = got_o[1], got_o[2]
    fwd = dict(zip(("old", "new"), both(lambda: old.batchnorm(x, gamma, beta, rm_o, rv_o, layout="NHWC"),
                                        lambda: new.batchnorm(x, gamma, beta, rm_n, rv_n, layout="NHWC"), **sw)))
    tg, tb, trm, trv = (torch.from_dlpack(a) for a in (gamma, beta, rm_o.copy(), rv_o.copy()))
    fwd["torch"] = lambda: F.batch_norm(tx, trm, trv, tg, tb, training=True)
    rows = [common.ab_problem(f"{name} train", 3 * x.nbytes, fwd, {"new": diff})]
    bo, bn = both(lambda: old.batchnorm_backward(dy, x, gamma, mean=m, invstd=s, layout="NHWC"),
                  lambda: new.batchnorm_backward(dy, x, gamma, mean=m, invstd=s, layout="NHWC"), **sw)
    got_o, got_n = bo(), bn()
    assert bitwise(got_o, got_n), f"{name} backward: not bitwise"
    diff = max(common.max_abs(a, b) for a, b in zip(got_o, got_n))
    bwd = {"old": bo, "new": bn}
    txg, tgg, tbg = (t.detach().clone().requires_grad_() for t in (tx, tg, tb))
    ty = F.batch_norm(txg, None, None, tgg, tbg, training=True)
    bwd["torch"] = lambda: torch.autograd.grad(ty, (txg, tgg, tbg), tdy, retain_graph=True)
    rows.append(common.ab_problem(f"{name} backward", 5 * x.nbytes, bwd, {"new": diff}))
    print(f"{name}: bitwise equal (train: y, mean, invstd, running stats; backward: dx, dgamma, dbeta)", flush=True)
    return rows


copy = common.copy_gbps()
print(f"copy {copy:.0f} GB/s", flush=True)
table = []
for dtype in ("float32", "float16"):
    for resident in (True, False):
        table += problem(dtype, resident)
old_plans, new_plans = launched(old_norm), launched(new_norm)
print(f"plans: {len(old_plans)} old / {len(new_plans)} new, kernels, grids, shared bytes and argument counts "
      f"{'the same' if old_plans == new_plans else 'DIFFERENT'}", flush=True)
for key in sorted(set(old_plans) | set(new_plans), key=repr):
    if old_plans.get(key) != new_plans.get(key):
        print("  old", old_plans.get(key), "\n  new", new_plans.get(key), flush=True)
for launches in new_plans.values():
    print("  ", "; ".join(f"{d[0]} grid {d[1][:3]} shared {d[2]}" if len(d) == 4 else d[0] for d in launches),
          flush=True)
common.print_table(table, copy, sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--json" else None)
