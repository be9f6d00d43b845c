"""Old (main's dnnprims/ + kernels/, copied aside by notes/ab/patch_ab.sh) against new
(notes/wip/mpbwd.patch) against PyTorch, in ONE process: float32 max-pool 3x3 / 2 / 1
BACKWARD on the three benchmark rows (r50_maxpool [32,64,112,112], max3x3s2_big
[64,256,56,56] NCHW, max3x3s2_big_nhwc), one odd NCHW shape [32,96,57,60] (odd height,
W a multiple of 4 but not 8), and controls whose kernels the patch leaves alone (machine
code identical, notes/mpbwd.md): max3x3s2_big_f16 backward, max3x3s2_big forward.
Variants of new (plan-key switches of dnnprims.pooling, set per call):
  NCHW float32: new = pool_k3s2_backward_walk S 4, MINB 4, PF;  S2 / S8 (_WALK_STEPS);
    B3 (_WALK_BLOCKS 3);  noPF (_WALK_PREFETCH False);  off (WALK_BACKWARD False: main's
    R = 2 tile from the new tree: the A/B's noise).
  NHWC float32: new = pool_nhwc_k3s2_backward_shfl SLOTS 8, MINB 2, PF;  slots4;  v8b4 / v8b3
    (_SHFL_VECTOR_BYTES 8: two channels a lane, MINB 4 / 3, PF);  v8b4noPF;  off
    (_SHFL_PREFETCH False: main's kernel).
Every variant's dx is checked BITWISE against old's before timing (the same sums in the
same order: diff 0 expected).  Floor = the bench's: x + dy read, dx written (forward:
x + y).  Table last.
    python notes/mpbwd_ab.py OLD_ROOT --json PATH"""
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
assert not hasattr(old_pool, "WALK_BACKWARD"), "old must be unpatched"
assert hasattr(new_pool, "WALK_BACKWARD"), "new must be patched"
F = torch.nn.functional
OPTS = dict(mode="max", stride=2, padding=1)
NCHW32 = {"new": {}, "S2": {"_WALK_STEPS": 2}, "S8": {"_WALK_STEPS": 8}, "B3": {"_WALK_BLOCKS": 3},
          "noPF": {"_WALK_PREFETCH": False}, "off": {"WALK_BACKWARD": False}}
NHWC32 = {"new": {}, "slots4": {"_SHFL_SLOTS": 4}, "v8b4": {"_SHFL_VECTOR_BYTES": 8},
          "v8b3": {"_SHFL_VECTOR_BYTES": 8, "_SHFL_NARROW_BLOCKS": 3},
          "v8b4noPF": {"_SHFL_VECTOR_BYTES": 8, "_SHFL_PREFETCH": False}, "off": {"_SHFL_PREFETCH": False}}


def expression(x, layout, **switches):
    problem = new_pool._check_problem(x, 3, "max", 2, 1, True, layout)
    return common.switched(new_pool, lambda: new_pool._make_plan(problem, "backward", True)[1], **switches)()


def backward_row(name, shape, layout="NCHW", dtype=cp.float32, variants=None):
    x = cp.random.uniform(-1, 1, shape).astype(dtype)
    y = new.pool(x, 3, layout=layout, **OPTS)
    dy = cp.random.uniform(-1, 1, y.shape).astype(dtype)
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


def forward_row(name, shape):
    x = cp.random.uniform(-1, 1, shape).astype(cp.float32)
    y = old.pool(x, 3, **OPTS)
    tx = torch.from_dlpack(x)
    fns = {"old": lambda: old.pool(x, 3, **OPTS), "new": lambda: new.pool(x, 3, **OPTS),
           "torch": lambda: F.max_pool2d(tx, 3, 2, 1)}
    diffs = {"new": common.max_abs(new.pool(x, 3, **OPTS), y)}
    return common.ab_problem(f"{name} fwd", x.nbytes + y.nbytes, fns, diffs, note="control: same kernel")


copy = common.copy_gbps()
print(f"copy {copy:.0f} GB/s", flush=True)
rows = []
for make in (lambda: backward_row("r50_maxpool", (32, 64, 112, 112), variants=NCHW32),
             lambda: backward_row("max3x3s2_big", (64, 256, 56, 56), variants=NCHW32),
             lambda: backward_row("max3x3s2_big_nhwc", (64, 56, 56, 256), "NHWC", variants=NHWC32),
             lambda: backward_row("odd_32x96x57x60", (32, 96, 57, 60), variants=NCHW32),
             lambda: backward_row("max3x3s2_big_f16", (64, 256, 56, 56), dtype=cp.float16),
             lambda: forward_row("max3x3s2_big", (64, 256, 56, 56))):
    try:
        rows.append(make())
    except Exception as e:  # noqa: BLE001 -- report and go on to the next row
        print(f"row failed: {type(e).__name__}: {e}", flush=True)
    cp.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()
common.print_table(rows, copy, sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--json" else None)
