"""Helper mem5's A/B (notes/mem5.md): the three issue-5 items, old and new paths
switched by module flags in ONE process, PyTorch side by side, two rounds
(A B A B ...): ms = median of REPEAT CUDA-event timed calls (the bench's
`timing.measure`), fraction of the copy bandwidth (1 GiB copy, this process)
over the floor bytes, torch / ours, and whether the output is bitwise the
first variant's.
1. batch norm training forward (bn_big_f16, bn_big): normalization.PERSISTENT_STATISTICS
   off / on (floor: read x twice, write y);
2. group norm backward 64x256x56x56 / 32 groups, float32 / float16 / bfloat16:
   row_normalization.PIPELINED_BACKWARD_LATE / _BULK (floor: x, dy, dx);
3. max 3x3 / 2 / 1 backward NCHW 64x256x56x56 float16 / bfloat16:
   pooling._ROLLED_STEPS / _ROLLED_BLOCKS / ROLLED_PREFETCH (floor: x, dy, dx);
   and NHWC 64x56x56x256 float32 (pool_nhwc_k3s2_backward_shfl, default).
    python notes/mem5_ab.py [OUT.json] [--cpu-check]
--cpu-check: build every variant's switch settings and print the plan, no GPU."""
import json
import sys

CPU_CHECK = "--cpu-check" in sys.argv
REPEAT = 20

BN = [("bn_big_f16", (64, 256, 56, 56), "float16"), ("bn_big", (64, 256, 56, 56), "float32")]
BN_VARIANTS = [("one block a chunk", {"PERSISTENT_STATISTICS": False}),
               ("persistent", {"PERSISTENT_STATISTICS": True})]
GN = [("gn_64x256x56x56_g32", (64, 256, 56, 56), 32, d) for d in ("float32", "float16", "bfloat16")]
GN_VARIANTS = [("cp.async", {"PIPELINED_BACKWARD_LATE": False, "PIPELINED_BACKWARD_BULK": False}),
               ("late", {"PIPELINED_BACKWARD_LATE": True, "PIPELINED_BACKWARD_BULK": False}),
               ("bulk", {"PIPELINED_BACKWARD_LATE": False, "PIPELINED_BACKWARD_BULK": True}),
               ("late bulk", {"PIPELINED_BACKWARD_LATE": True, "PIPELINED_BACKWARD_BULK": True})]
POOL = [("max3x3s2_big_f16", (64, 256, 56, 56), "NCHW", "float16"),
        ("max3x3s2_big_bf16", (64, 256, 56, 56), "NCHW", "bfloat16")]
POOL_VARIANTS = [(f"S{s} B{b}{' PF' if pf else ''}", {"_ROLLED_STEPS": s, "_ROLLED_BLOCKS": b, "ROLLED_PREFETCH": pf})
                 for s, b, pf in ((2, 2, False), (3, 2, False), (4, 2, False), (2, 2, True), (3, 2, True),
                                  (4, 2, True), (2, 1, True), (3, 1, True))]
POOL_NHWC = ("max3x3s2_big_nhwc", (64, 56, 56, 256), "NHWC", "float32")


def cpu_check():
    from dnnprims import normalization, pooling, row_normalization
    for name, flags in BN_VARIANTS:
        assert all(hasattr(normalization, k) for k in flags), flags
    for name, flags in GN_VARIANTS:
        assert all(hasattr(row_normalization, k) for k in flags), flags
    exprs = set(pooling.FAMILY.name_expressions)
    for name, flags in POOL_VARIANTS:
        assert all(hasattr(pooling, k) for k in flags), flags
        e = (f"pool_k3s2_backward_rolled<half_t, int, {flags['_ROLLED_STEPS']}, {flags['_ROLLED_BLOCKS']}, "
             f"{'true' if flags['ROLLED_PREFETCH'] else 'false'}>")
        assert e in exprs, e
    print("cpu check: every switch exists, every pool variant is a declared expression")


if CPU_CHECK:
    cpu_check()
    sys.exit(0)

import cupy as cp  # noqa: E402
import torch  # noqa: E402

import dnnprims as dp  # noqa: E402
from dnnprims import _dtypes, normalization, pooling, row_normalization  # noqa: E402
from dnnprims.bench import timing  # noqa: E402

F = torch.nn.functional
aten = torch.ops.aten
TT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def ms(fn):
    fn()
    return timing.measure(fn, xp=cp, warmup=3, repeat=REPEAT).median_ms


def tensor_pair(shape, dtype, seed, low=-1.0, high=1.0):
    """(cupy array, torch tensor) sharing memory, in `dtype`."""
    t32 = torch.empty(shape, device="cuda").uniform_(low, high, generator=torch.Generator("cuda").manual_seed(seed))
    t = t32.to(TT[dtype]).contiguous()
    if dtype == "bfloat16":
        return cp.from_dlpack(t.view(torch.int16)).view(_dtypes.BFLOAT16), t
    return cp.from_dlpack(t), t


def bits(a):
    a = a if isinstance(a, tuple) else (a,)
    return [cp.ascontiguousarray(v).view(cp.uint8) for v in a]


def same(a, b):
    return all(bool(cp.array_equal(u, v)) for u, v in zip(bits(a), bits(b)))


def run(module, variants, fn, torch_fn, floor, name, rows):
    """Two rounds over the variants; outputs compared bitwise with the first."""
    saved = {k: getattr(module, k) for _, flags in variants for k in flags}
    times = {label: [] for label, _ in variants}
    ref, equal = None, {}
    try:
        for rnd in range(2):
            for label, flags in variants:
                for k, v in flags.items():
                    setattr(module, k, v)
                if hasattr(module, "_MEMO"):
                    module._MEMO.clear()
                try:
                    if rnd == 0:
                        out = fn()
                        if ref is None:
                            ref = out
                        equal[label] = same(out, ref)
                        del out
                    times[label].append(ms(fn))
                except Exception as e:  # noqa: BLE001
                    print(f"{name} {label}: {type(e).__name__}: {str(e)[:300]}", flush=True)
    finally:
        for k, v in saved.items():
            setattr(module, k, v)
        if hasattr(module, "_MEMO"):
            module._MEMO.clear()
    t_torch = ms(torch_fn)
    for label, _ in variants:
        if not times[label]:
            continue
        best = min(times[label])
        r = dict(name=name, variant=label, ms=times[label], torch_ms=t_torch, x_torch=t_torch / best,
                 of_copy=timing.gbps(floor, best) / COPY, bitwise_first=equal.get(label))
        rows.append(r)
        print(r, flush=True)


src = cp.random.random(2**28, dtype=cp.float32)
dst = cp.empty_like(src)
COPY = 2 * src.nbytes / (ms(lambda: dst.__setitem__(Ellipsis, src)) * 1e-3) / 1e9
del src, dst
cp.get_default_memory_pool().free_all_blocks()
print(f"copy {COPY:.0f} GB/s", flush=True)
rows = []

for name, shape, layout, dtype in POOL + [POOL_NHWC]:
    try:
        x, tx = tensor_pair(shape, dtype, 5)
        opts = dict(stride=2, padding=1, layout=layout)
        y = dp.pool(x, 3, **opts)
        dy, tdy = tensor_pair(y.shape, dtype, 6)
        nchw = (lambda t: t.permute(0, 3, 1, 2)) if layout == "NHWC" else (lambda t: t)
        txg = nchw(tx).detach().clone().requires_grad_()
        ty = F.max_pool2d(txg, 3, 2, 1)
        torch_fn = lambda: torch.autograd.grad(ty, txg, nchw(tdy), retain_graph=True)  # noqa: E731
        variants = POOL_VARIANTS if layout == "NCHW" else [("shfl (default)", {})]
        run(pooling, variants, lambda: dp.pool_backward(dy, x, y, 3, **opts), torch_fn,
            2 * x.nbytes + dy.nbytes, f"{name} backward", rows)
        tdx = torch_fn()[0]
        dx = dp.pool_backward(dy, x, y, 3, **opts)
        tdx_ours = (torch.from_dlpack(dx.view(cp.int16)).view(torch.bfloat16) if dtype == "bfloat16"
                    else torch.from_dlpack(dx))
        print(f"{name}: max |dx - torch| = {float((nchw(tdx_ours).float() - tdx.float()).abs().max()):.3g}",
              flush=True)
        del x, tx, dy, tdy, y, ty, txg
    except Exception as e:  # noqa: BLE001
        print(f"{name}: {type(e).__name__}: {str(e)[:300]}", flush=True)

for name, shape, dtype in BN:
    try:
        x, tx = tensor_pair(shape, dtype, 1, -1.0, 3.0)
        c = shape[1]
        gamma = cp.random.uniform(0.5, 1.5, c).astype(cp.float32)
        beta = cp.random.uniform(-0.5, 0.5, c).astype(cp.float32)
        rm, rv = cp.zeros(c, cp.float32), cp.ones(c, cp.float32)
        tg, tb = torch.from_dlpack(gamma), torch.from_dlpack(beta)
        trm, trv = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
        run(normalization, BN_VARIANTS,
            lambda: dp.batchnorm(x, gamma, beta, None, None, training=True, return_stats=True),
            lambda: F.batch_norm(tx, trm, trv, tg, tb, training=True), 3 * x.nbytes, name + " train", rows)
        # the backward that recomputes the statistics (batchnorm_statistics<FINISH=true>)
        dy, tdy = tensor_pair(shape, dtype, 2)
        txg, tgg, tbg = (t.detach().clone().requires_grad_() for t in (tx, tg, tb))
        ty = F.batch_norm(txg, None, None, tgg, tbg, training=True)
        run(normalization, BN_VARIANTS, lambda: dp.batchnorm_backward(dy, x, gamma),
            lambda: torch.autograd.grad(ty, (txg, tgg, tbg), tdy, retain_graph=True), 5 * x.nbytes,
            name + " backward (recomputed stats; torch: saved)", rows)
        del x, tx, dy, tdy, txg, ty
    except Exception as e:  # noqa: BLE001
        print(f"{name}: {type(e).__name__}: {str(e)[:300]}", flush=True)

for name, shape, groups, dtype in GN:
    try:
        x, tx = tensor_pair(shape, dtype, 3)
        dy, tdy = tensor_pair(shape, dtype, 4)
        n, c = shape[0], shape[1]
        g32 = cp.random.uniform(0.5, 1.5, c).astype(cp.float32)
        gamma = g32 if x.itemsize == 2 else g32.astype(x.dtype)
        _, mean, rstd = dp.group_norm(x, groups, return_stats=True)
        tg = torch.from_dlpack(g32).to(TT[dtype])
        _, tmean, trstd = aten.native_group_norm(tx, tg, None, n, c, shape[2] * shape[3], groups, 1e-5)
        run(row_normalization, GN_VARIANTS,
            lambda: dp.group_norm_backward(dy, x, groups, gamma, mean=mean, rstd=rstd),
            lambda: aten.native_group_norm_backward(tdy, tx, tmean, trstd, tg, n, c, shape[2] * shape[3], groups,
                                                    [True, True, True]),
            3 * x.nbytes, f"{name} {dtype} backward", rows)
        del x, tx, dy, tdy
    except Exception as e:  # noqa: BLE001
        print(f"{name} {dtype}: {type(e).__name__}: {str(e)[:300]}", flush=True)

print(f"\ncopy {COPY:.0f} GB/s; ms = the two rounds' medians of {REPEAT}; of copy and x torch from the better round")
print("| problem | variant | ms (round 1 / 2) | torch ms | x torch | of copy | bitwise = first |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['name']} | {r['variant']} | {' / '.join(f'{t:.4f}' for t in r['ms'])} | {r['torch_ms']:.4f} | "
          f"{r['x_torch']:.2f} | {r['of_copy']:.3f} | {r['bitwise_first']} |")
if len(sys.argv) > 1 and not sys.argv[1].startswith("--"):
    with open(sys.argv[1], "w") as f:
        json.dump({"copy_GBps": COPY, "rows": rows}, f, indent=1)
