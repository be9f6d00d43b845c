"""Old (main's dnnprims/ + kernels/, copied aside by notes/ab/patch_ab.sh) against new
(notes/wip/poolbf16.patch applied) in ONE process: max-pool 3x3 / 2 / 1 backward on the
bench's problems (dnnprims/bench/problems.json) and their 16-bit twins.  Under 30 s.

Rows (floor = read x and dy, write dx, as the bench counts), the decision rows only:
  max3x3s2_big_bf16 [64,256,56,56] bfloat16  -- the row the patch is for (new = SHARES 1)
  max3x3s2_big_f16  [64,256,56,56] float16   -- must stay main's (new = SHARES 0 = main's SASS)
  r50_maxpool_bf16  [32,64,112,112] bfloat16
  r50_maxpool       [32,64,112,112] float32     -- control (kernel unchanged)
Variants: old (main's tree) and new (the patch's defaults); PyTorch's dx is compared, not timed.
Every variant's dx is checked bit for bit against old's before timing (max-pool backward is
deterministic); diff = the number of differing dx elements (0 expected).  Timing: notes/ab/
common.py (eager = CUDA events, median of 20; device = 20 calls queued behind a busy-wait;
two rounds A B A B; the table takes the best round).
    python notes/poolbf16_ab.py OLD_ROOT --json PATH"""
import sys

sys.path.insert(0, "notes/ab")
import common  # noqa: E402

import cupy as cp  # noqa: E402
import torch  # noqa: E402

from dnnprims import _dtypes  # noqa: E402
from dnnprims import pooling as newp  # noqa: E402

OLD_ROOT = sys.argv[1]
JSON = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
old = common.load_old(OLD_ROOT)
from dnnprims_old import pooling as oldp  # noqa: E402

assert oldp.__file__ != newp.__file__, (oldp.__file__, newp.__file__)
assert "first_max_shares_pairwise" not in oldp.FAMILY.source, "old must be unpatched"
assert "first_max_shares_pairwise" in newp.FAMILY.source, "new must be patched"
print("old:", oldp.__file__, "new:", newp.__file__, flush=True)
from cupy.cuda import nvrtc  # noqa: E402
print("NVRTC", nvrtc.getVersion(), "(notes/poolbf16.md infers 13.0 on the device)", flush=True)
F = torch.nn.functional

NEW = {"new": {}}
PROBLEMS = [  # (name, NCHW shape, dtype, layout, variants)
    ("max3x3s2_big_bf16", (64, 256, 56, 56), "bfloat16", "NCHW", NEW),
    ("max3x3s2_big_f16", (64, 256, 56, 56), "float16", "NCHW", NEW),
    ("r50_maxpool_bf16", (32, 64, 112, 112), "bfloat16", "NCHW", NEW),
    ("r50_maxpool", (32, 64, 112, 112), "float32", "NCHW", NEW),
]
OPTS = dict(mode="max", stride=2, padding=1)


def ours(t, layout):
    """Our array of torch tensor t (NCHW logical shape): NHWC as (N, H, W, C), bfloat16 by bits."""
    if layout == "NHWC":
        t = t.permute(0, 2, 3, 1).contiguous()
    if t.dtype == torch.bfloat16:
        return cp.from_dlpack(t.view(torch.int16)).view(_dtypes.BFLOAT16)
    return cp.from_dlpack(t)


def bits(a):
    return a.view(cp.uint16 if a.itemsize == 2 else cp.uint32 if a.itemsize == 4 else cp.uint64)


def kernel_of(x, layout, switches):
    """The backward's kernel expression and grid under these switches (for the log)."""
    saved = {k: getattr(newp, k) for k in switches}
    try:
        for k, v in switches.items():
            setattr(newp, k, v)
        problem = newp._check_problem(x, 3, "max", 2, 1, True, layout)
        plan = newp._make_plan(problem, "backward", True)
        return f"{plan[1]} grid {plan[2][0]}"
    finally:
        for k, v in saved.items():
            setattr(newp, k, v)


copy = common.copy_gbps()
print(f"copy {copy:.0f} GB/s (1 GiB), {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}", flush=True)
rows, kernels = [], []
for name, shape, dtype, layout, variants in PROBLEMS:
    torch.manual_seed(1)
    tx = torch.empty(shape, dtype=getattr(torch, dtype), device="cuda").uniform_(-4, 4)
    if layout == "NHWC":
        tx = tx.contiguous(memory_format=torch.channels_last)
    tx.requires_grad_()
    ty = F.max_pool2d(tx, 3, 2, 1)
    tdy = torch.empty_like(ty).uniform_(-4, 4)
    x, dy = ours(tx.detach(), layout), ours(tdy, layout)
    floor = 2 * x.nbytes + dy.nbytes
    want = oldp.pool_backward(dy, x, None, 3, layout=layout, **OPTS)
    fns = {"old": lambda: oldp.pool_backward(dy, x, None, 3, layout=layout, **OPTS)}
    diffs = {}
    for tag, switches in variants.items():
        fn = common.switched(newp, lambda: newp.pool_backward(dy, x, None, 3, layout=layout, **OPTS), **switches)
        diffs[tag] = int((bits(fn()) != bits(want)).sum())
        fns[tag] = fn
        kernels.append(f"{name} {tag}: {kernel_of(x, layout, switches)}")
    # torch's dx (ours as torch, NCHW) against old's: the same rule, so 0 expected
    dx_t = torch.autograd.grad(ty, tx, tdy, retain_graph=True)[0]
    mine = torch.from_dlpack(want.view(cp.int16)).view(torch.bfloat16) if dtype == "bfloat16" else torch.from_dlpack(want)
    if layout == "NHWC":
        mine = mine.permute(0, 3, 1, 2)
    torch_diff = float((mine.float() - dx_t.float()).abs().max())
    bad = [t for t, d in diffs.items() if d]
    note = f"{dtype} {layout}; max |old - torch| {torch_diff:.3g}" + (f"; NOT bitwise old's: {bad}" if bad else "; all bitwise old's")
    rows.append(common.ab_problem(name, floor, fns, diffs, note))
    del x, dy, want, tx, ty, tdy, dx_t, mine, fns
    cp.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()

print()
print("kernels:")
print("\n".join(kernels))
common.print_table(rows, copy, JSON)
# summary: the decision rows (notes/poolbf16.md)
print()
print("summary (best round, device ms; of copy = floor at copy speed / eager ms)")
nan = float("nan")
for r in rows:
    best = {t: (min(abs(v) for v in m["device"]) if m["device"] else nan) for t, m in r["ms"].items()}
    cands = [t for t in best if t not in ("old", "torch", "copy")]
    v = min(cands, key=lambda t: best[t] if best[t] == best[t] else 1e9)
    e = {t: min(m["eager"]) for t, m in r["ms"].items()}
    fl = r["floor_bytes"] / copy / 1e6
    print(f"{r['problem']:18s} old {best['old']:.4f} new {best['new']:.4f} best {v} {best[v]:.4f}"
          f"  of copy old/new/best {fl / e['old']:.3f}/{fl / e['new']:.3f}/{fl / e[v]:.3f}"
          f"  bitwise {'yes' if not any(r['diff'].values()) else 'NO'}")
