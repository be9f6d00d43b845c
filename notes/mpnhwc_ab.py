"""Old (main's dnnprims/ + kernels/, copied aside by notes/ab/patch_ab.sh) against new
(notes/wip/mpnhwc.patch) against PyTorch, in ONE process: float32 NHWC max-pool 3x3 / 2 / 1
BACKWARD -- max3x3s2_big_nhwc [64,56,56,256], an odd shape with C = 96 [32,57,45,96] (odd H
and W), r50's pool in NHWC with C = 64 [32,112,112,64] -- and the NCHW row max3x3s2_big
backward as the control (its kernel, pool_k3s2_backward_walk, is not touched).
Variants of new (plan-key switches of dnnprims.pooling, set per call):
  new  = pool_nhwc_k3s2_backward_walk SLOTS 8, S 2, MINB 4, no PF (64 registers, 4 blocks an SM);
  S1 / S4 (_NHWC_WALK_STEPS);  B3 (_NHWC_WALK_BLOCKS 3: 72 registers);  PF (S 2, MINB 2, the
  next step's loads ahead: 96 registers);  K4 / K4S4 (_NHWC_WALK_SLOTS 4: 4 window columns x
  8 channel vectors a warp, whole 128-byte lines an instruction; S 2 / 4);  off (NHWC_WALK_BACKWARD False: main's
  pool_nhwc_k3s2_backward_shfl from the new tree: the A/B's noise).
Every variant's dx is checked BITWISE against old's before timing (the same sums in the
same order: diff 0 expected).  Floor = the bench's: x + dy read, dx written.  Table last.
    python notes/mpnhwc_ab.py OLD_ROOT --json PATH"""
import importlib
import sys

sys.path.insert(0, "notes/ab")
import common  # noqa: E402

import cupy as cp  # noqa: E402
import torch  # noqa: E402

import dnnprims as new  # noqa: E402
from dnnprims import pooling as new_pool  # noqa: E402

old = common.load_old(sys.argv[1])
old_pool = importlib.import_module("dnnprims_old.pooling")
assert not hasattr(old_pool, "NHWC_WALK_BACKWARD"), "old must be unpatched"
assert hasattr(new_pool, "NHWC_WALK_BACKWARD"), "new must be patched"
F = torch.nn.functional
OPTS = dict(mode="max", stride=2, padding=1)
ALL = {"new": {}, "S1": {"_NHWC_WALK_STEPS": 1}, "S4": {"_NHWC_WALK_STEPS": 4}, "B3": {"_NHWC_WALK_BLOCKS": 3},
       "PF": {"_NHWC_WALK_BLOCKS": 2, "_NHWC_WALK_PREFETCH": True}, "K4": {"_NHWC_WALK_SLOTS": 4},
       "K4S4": {"_NHWC_WALK_SLOTS": 4, "_NHWC_WALK_STEPS": 4}, "off": {"NHWC_WALK_BACKWARD": False}}


def expression(x, layout, **switches):
    problem = new_pool._check_problem(x, 3, "max", 2, 1, True, layout)
    return common.switched(new_pool, lambda: new_pool._make_plan(problem, "backward", True)[1], **switches)()


def backward_row(name, shape, layout="NHWC", variants=None):
    x = cp.random.uniform(-1, 1, shape).astype(cp.float32)
    y = new.pool(x, 3, layout=layout, **OPTS)
    dy = cp.random.uniform(-1, 1, y.shape).astype(cp.float32)
    view = (lambda t: t.permute(0, 3, 1, 2)) if layout == "NHWC" else (lambda t: t)
    tx = view(torch.from_dlpack(x)).detach().clone().requires_grad_()  # as the bench
    ty = F.max_pool2d(tx, 3, 2, 1)
    tdy = view(torch.from_dlpack(dy))
    want = old.pool_backward(dy, x, y, 3, layout=layout, **OPTS)
    fns = {"old": lambda: old.pool_backward(dy, x, y, 3, layout=layout, **OPTS)}
    diffs, notes = {}, []
    for tag, sw in (variants or {"new": {}}).items():
        call = common.switched(new_pool, lambda: new.pool_backward(dy, x, y, 3, layout=layout, **OPTS), **sw)
        got = call()
        bitwise = bool((got.view(cp.uint8) == want.view(cp.uint8)).all())
        diffs[tag] = common.max_abs(got, want)
        notes.append(f"{tag} {expression(x, layout, **sw)}{'' if bitwise else ' NOT BITWISE old'}")
        if not bitwise:
            print(f"{name} {tag}: dx NOT bitwise old's (max diff {diffs[tag]:.1e})", flush=True)
        fns[tag] = call
    tgot = torch.autograd.grad(ty, tx, tdy, retain_graph=True)[0]
    diffs["torch"] = common.max_abs(cp.from_dlpack(tgot.permute(0, 2, 3, 1).contiguous() if layout == "NHWC"
                                                   else tgot), want)
    fns["torch"] = lambda: torch.autograd.grad(ty, tx, tdy, retain_graph=True)
    floor = 2 * x.nbytes + dy.nbytes
    print(name, "; ".join(notes), flush=True)
    return common.ab_problem(f"{name} bwd", floor, fns, diffs, note="; ".join(notes))


copy = common.copy_gbps()
print(f"copy {copy:.0f} GB/s", flush=True)
rows = []
for make in (lambda: backward_row("max3x3s2_big_nhwc", (64, 56, 56, 256), variants=ALL),
             lambda: backward_row("odd_nhwc_c96", (32, 57, 45, 96), variants=ALL),
             lambda: backward_row("r50_nhwc_c64", (32, 112, 112, 64), variants=ALL),
             lambda: backward_row("max3x3s2_big NCHW", (64, 256, 56, 56), "NCHW")):
    try:
        rows.append(make())
    except Exception as e:  # noqa: BLE001 -- report and go on to the next row
        print(f"row failed: {type(e).__name__}: {e}", flush=True)
    cp.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()
common.print_table(rows, copy, sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--json" else None)
