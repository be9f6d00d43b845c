"""Old (the unpatched tree) against new (notes/wip/maxpool16.patch applied) in ONE process,
PyTorch side by side, A B A B: NCHW max 3x3 / 2 / 1 pooling backward, ms (median of 20
CUDA-event timed calls: the bench's `timing.measure`), fraction of the copy bandwidth over
the floor bytes as the bench counts them (read x and dy, write dx; the copy of 1 GiB
measured in this process), torch / ours, and whether dx equals old's bit for bit.
16-bit rows: every variant of pool_k3s2_backward_rolled the patch compiles (S steps a
segment, MINB blocks per SM, the L2::256B hint, a grid of k resident waves).
float32 rows: a control (the kernel is unchanged: old == new within noise).
    python notes/maxpool16_ab.py OLD_ROOT [--json PATH]"""
import importlib.util
import json
import sys

import cupy as cp
import torch

from dnnprims import _dtypes, _validate
from dnnprims import pooling as newp
from dnnprims.bench import timing

OLD_ROOT = sys.argv[1]
spec = importlib.util.spec_from_file_location("dnnprims_old", f"{OLD_ROOT}/dnnprims/__init__.py",
                                              submodule_search_locations=[f"{OLD_ROOT}/dnnprims"])
old = importlib.util.module_from_spec(spec)
sys.modules["dnnprims_old"] = old
spec.loader.exec_module(old)
from dnnprims_old import pooling as oldp  # noqa: E402
assert oldp.__file__ != newp.__file__, (oldp.__file__, newp.__file__)
assert "k3s2_tail_row_pairs" not in oldp.FAMILY.source and "k3s2_tail_row_pairs" in newp.FAMILY.source, \
    "old must be unpatched, new patched"
print("old:", oldp.__file__, "new:", newp.__file__, flush=True)

REPEAT = 20
OPTS = dict(mode="max", stride=2, padding=1)
PROBLEMS = [  # (name, shape, dtype): the bench's rows and their 16-bit twins
    ("max3x3s2_big_f16", (64, 256, 56, 56), "float16"),
    ("max3x3s2_big_bf16", (64, 256, 56, 56), "bfloat16"),
    ("r50_maxpool_f16", (32, 64, 112, 112), "float16"),
    ("max3x3s2_big", (64, 256, 56, 56), "float32"),
    ("r50_maxpool", (32, 64, 112, 112), "float32"),
]
SMS = cp.cuda.Device().attributes["MultiProcessorCount"]
# new variants: tag -> (steps S, MINB, hint, waves); "new" = the patch's default
VARIANTS = {"new": (2, 2, False, None)}
for s in (1, 2, 4):
    for b in (2, 3):
        VARIANTS.setdefault(f"S{s} B{b}", (s, b, False, None))
    VARIANTS[f"S{s} B2 hint"] = (s, 2, True, None)
for s in (1, 2):
    for k in (1, 2, 4):
        VARIANTS[f"S{s} B2 waves{k}"] = (s, 2, False, k)
del VARIANTS["S2 B2"]  # = "new"
DEFAULTS = (newp._ROLLED_STEPS, newp._ROLLED_BLOCKS, newp._ROLLED_HINT, newp._ROLLED_WAVES)
assert DEFAULTS == VARIANTS["new"], DEFAULTS


def use(v):
    newp._ROLLED_STEPS, newp._ROLLED_BLOCKS, newp._ROLLED_HINT, newp._ROLLED_WAVES = v
    newp._MEMO = _validate.CallMemo()  # forget the memoised launches


def copy_gbps():
    src = cp.random.random(2**28, dtype=cp.float32)
    dst = cp.empty_like(src)
    t = timing.measure(lambda: dst.__setitem__(Ellipsis, src), xp=cp, warmup=3, repeat=10)
    del src, dst
    return 2 * 2**30 / (t.median_ms * 1e-3) / 1e9


def ms(fn):
    return timing.measure(fn, xp=cp, repeat=REPEAT).median_ms


def typed(shape, dtype, seed):
    t = torch.empty(shape, dtype=getattr(torch, dtype), device="cuda")
    torch.manual_seed(seed)
    t.uniform_(-4, 4)
    if dtype == "bfloat16":
        return cp.from_dlpack(t.view(torch.int16)).view(_dtypes.BFLOAT16), t
    return cp.from_dlpack(t), t


def bits(a):
    return a.view(cp.uint16 if a.itemsize == 2 else cp.uint32)


def as_torch(a):
    if a.dtype.name == "bfloat16":
        return torch.from_dlpack(a.view(cp.int16)).view(torch.bfloat16)
    return torch.from_dlpack(a)


rows = []
copy = copy_gbps()
print(f"copy {copy:.0f} GB/s, {SMS} SMs, {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}", flush=True)
for name, shape, dtype in PROBLEMS:
    x, tx = typed(shape, dtype, 1)
    tx.requires_grad_()
    ty = torch.nn.functional.max_pool2d(tx, 3, 2, 1)
    dy, tdy = typed(tuple(ty.shape), dtype, 2)
    floor = 2 * x.nbytes + dy.nbytes
    want = oldp.pool_backward(dy, x, None, 3, **OPTS)
    dx_torch = torch.autograd.grad(ty, tx, tdy, retain_graph=True)[0]
    torch_diff = float((as_torch(want).float() - dx_torch.float()).abs().max())
    fns = {"old": (None, lambda: oldp.pool_backward(dy, x, None, 3, **OPTS)),
           "torch": (None, lambda: torch.autograd.grad(ty, tx, tdy, retain_graph=True))}
    variants = VARIANTS if x.itemsize == 2 else {"new": VARIANTS["new"]}
    exprs, same = {}, {}
    for tag, v in variants.items():
        use(v)
        got = newp.pool_backward(dy, x, None, 3, **OPTS)
        same[tag] = bool((bits(got) == bits(want)).all())
        problem = newp._check_problem(x, 3, "max", 2, 1, True, "NCHW")
        _, expr, grid, _, _ = newp._make_plan(problem, "backward", True)
        exprs[tag] = f"{expr} grid {grid[0]}"
        fns[tag] = (v, lambda: newp.pool_backward(dy, x, None, 3, **OPTS))
        del got
    got = {tag: [] for tag in fns}
    for _ in range(2):  # A B A B
        for tag, (v, fn) in fns.items():
            if v is not None:
                use(v)
            got[tag].append(ms(fn))
    use(DEFAULTS)
    best = {tag: min(t) for tag, t in got.items()}
    row = {"problem": name, "shape": shape, "dtype": dtype, "floor_bytes": floor, "copy_GBps": copy,
           "ms": got, "of_copy": {tag: floor / (t * 1e-3) / 1e9 / copy for tag, t in best.items()},
           "torch_over": {tag: best["torch"] / t for tag, t in best.items()},
           "bitwise_equal_old": same, "max_abs_old_minus_torch": torch_diff, "kernels": exprs}
    rows.append(row)
    print(json.dumps(row), flush=True)
    del x, tx, ty, dy, tdy, want, dx_torch, fns
    cp.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()

print()
print(f"copy {copy:.0f} GB/s; NCHW max 3x3/2/1 backward; ms = the two A/B medians; of copy / x torch from"
      " the better one; == : dx bitwise old's")
print(f"{'problem':18s} {'variant':14s} {'ms':>15s} {'of copy':>7s} {'x torch':>7s} {'==':>3s}")
for r in rows:
    order = sorted(r["ms"], key=lambda t: (t not in ("old", "new", "torch"), min(r["ms"][t])))
    for tag in order:
        t = r["ms"][tag]
        eq = "" if tag in ("old", "torch") else ("yes" if r["bitwise_equal_old"][tag] else "NO")
        print(f"{r['problem']:18s} {tag:14s} {'/'.join(f'{v:.4f}' for v in t):>15s}"
              f" {r['of_copy'][tag]:7.3f} {r['torch_over'][tag]:7.2f} {eq:>3s}")
    print(f"{r['problem']:18s} max |old - torch| = {r['max_abs_old_minus_torch']:.3g}")
if len(sys.argv) > 3 and sys.argv[2] == "--json":
    json.dump(rows, open(sys.argv[3], "w"), indent=1)
print()
print("summary (best of the two rounds; best = the fastest new variant; ok = every new variant's dx == old's)")
print(f"{'problem':18s} {'old ms':>7s} {'new ms':>7s} {'best':>15s} {'ms':>7s} {'torch':>7s}"
      f" {'of copy old/new/best':>20s} {'x torch best':>12s} {'ok':>3s}")
for r in rows:
    b = {tag: min(t) for tag, t in r["ms"].items()}
    v = min((t for t in b if t not in ("old", "torch")), key=b.get)
    oc = r["of_copy"]
    print(f"{r['problem']:18s} {b['old']:7.4f} {b['new']:7.4f} {v:>15s} {b[v]:7.4f} {b['torch']:7.4f}"
          f" {oc['old']:6.3f}/{oc['new']:.3f}/{oc[v]:.3f} {r['torch_over'][v]:12.2f}"
          f" {'yes' if all(r['bitwise_equal_old'].values()) else 'NO':>3s}")
