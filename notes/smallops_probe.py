"""smallops A/B probe (GPU): row softmax on few rows, and the channel-pack kernels,
old (the branch base's kernels/softmax.cu, loaded as a second kernel family) vs
new, PyTorch side by side, in one process.

    python notes/smallops_probe.py OUT [--warm-base]

The base source is expected at probe_base/softmax.cu (next to kernels/, copied
in by the run, not committed).  --warm-base only compiles the base family's
kernels into CuPy's disk cache (in parallel) and exits.  Per op and variant:
  call  -- CUDA events around each call, median (what python -m dnnprims.bench measures)
  gpu   -- GPU time a call with the calls queued behind a spin kernel (no host gaps)
  host  -- host time a call (a loop of calls, the GPU keeping up)
"""
import json
import multiprocessing
import pathlib
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
BASE_FILE = "../probe_base/softmax.cu"   # relative to kernels/
CLASSIFIER = (256, 1000)
CHANNEL = (64, 256, 56, 56)
DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
ROW_VARIANTS = {          # name -> (family, SHORT_ROW_PACKS, _WARP_ROWS_PER_BLOCK)
    "base": ("base", 8, 4),
    "new_w4": ("new", 8, 4),   # new kernel, old launch (a warp a row, 4 rows a block)
    "new_w1": ("new", 8, 1),   # a warp a row, one row a block (256 blocks)
    "s4": ("new", 4, 4),       # 64 threads a row
    "s2": ("new", 2, 4),       # 128 threads a row
    "s1": ("new", 1, 4),       # 256 threads a row
}


def problems():
    """(label, shape, axis, dtype name) of every timed problem."""
    out = [("classifier", CLASSIFIER, 1, "float32")]
    out += [(f"channel {DTYPES[d]}", CHANNEL, 1, d) for d in DTYPES]
    return out


def base_expressions():
    """Every expression the base family runs in this probe (its plan = the new _plan
    with SHORT_ROW_PACKS 8, which is the old rule; channel plans are unchanged)."""
    from dnnprims import _dtypes, softmaxes
    saved = softmaxes.SHORT_ROW_PACKS
    softmaxes.SHORT_ROW_PACKS = 8
    try:
        exprs = []
        for _, shape, axis, dname in problems():
            dtype = _dtypes.BFLOAT16 if dname == "bfloat16" else np.dtype(dname)
            for direction in ("forward", "backward"):
                for log in (False, True):
                    plan = softmaxes._plan(direction, log, shape, axis, dtype, True)
                    exprs.append(plan[0])
        return sorted(set(exprs))
    finally:
        softmaxes.SHORT_ROW_PACKS = saved


def _compile_group(group):
    import cupy
    from dnnprims import _kernels
    source = (_kernels.KERNEL_DIR / BASE_FILE).read_text()
    t0 = time.time()
    cupy.RawModule(code=source, options=_kernels.COMPILE_OPTIONS, name_expressions=tuple(group)).compile()
    return f"{group[0].split('<')[0]} x{len(group)} {time.time() - t0:.1f} s"


def groups(exprs):
    by_name = {}
    for e in exprs:
        by_name.setdefault(e.split("<", 1)[0], []).append(e)
    return list(by_name.values())


def warm_base():
    exprs = base_expressions()
    with ProcessPoolExecutor(6, mp_context=multiprocessing.get_context("spawn")) as pool:
        for line in pool.map(_compile_group, groups(exprs)):
            print("warm base:", line, flush=True)


def main(out):
    import cupy as cp
    import torch
    from dnnprims import _dtypes, _kernels, softmaxes
    from dnnprims.bench import timing

    def to32(a):
        """A float32 CuPy copy (bfloat16 through torch: CuPy cannot cast it)."""
        if a.dtype == _dtypes.BFLOAT16:
            return cp.from_dlpack(torch.from_dlpack(a.view(cp.int16)).view(torch.bfloat16).float())
        return a.astype(cp.float32)

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    new_family = softmaxes.FAMILY
    base_family = _kernels.KernelFamily(BASE_FILE, base_expressions())
    families = {"new": new_family, "base": base_family}
    spin = cp.RawKernel(r'''
extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}''', "spin")

    def use(family, short_packs, rows_per_block):
        softmaxes.FAMILY = families[family]
        softmaxes.SHORT_ROW_PACKS = short_packs
        softmaxes._WARP_ROWS_PER_BLOCK = rows_per_block
        softmaxes._PLANS.clear()
        softmaxes._FAST.clear()

    def call_ms(fn, repeat):
        return timing.measure(fn, xp=cp, warmup=5, repeat=repeat).median_ms

    def gpu_us(fn, calls=200):
        samples = []
        for _ in range(3):
            cp.cuda.Stream.null.synchronize()
            start, end = cp.cuda.Event(), cp.cuda.Event()
            spin((1,), (1,), (np.int64(12_000_000),))   # ~6 ms: every call below is queued before it ends
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            samples.append(cp.cuda.get_elapsed_time(start, end) * 1e3 / calls)
        return min(samples)

    def host_us(fn, calls=2000):
        fn()
        cp.cuda.Stream.null.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        cp.cuda.Stream.null.synchronize()
        return (t1 - t0) * 1e6 / calls

    # copy bandwidth of this run (1 GiB each way)
    src = cp.random.random(2**28, dtype=cp.float32)
    dst = cp.empty_like(src)
    t = call_ms(lambda: dst.__setitem__(Ellipsis, src), 10)
    copy_gbps = 2 * src.nbytes / (t * 1e-3) / 1e9
    del src, dst
    print(f"copy {copy_gbps:.0f} GB/s", flush=True)

    cp.random.seed(0)
    rows = []

    def operands(shape, dname):
        x32 = cp.random.uniform(-4, 4, shape, dtype=cp.float32)
        dy32 = cp.random.uniform(-1, 1, shape, dtype=cp.float32)
        if dname == "bfloat16":
            xb = torch.from_dlpack(x32).to(torch.bfloat16)
            dyb = torch.from_dlpack(dy32).to(torch.bfloat16)
            # our bfloat16 arrays: the same bits viewed as ml_dtypes.bfloat16
            to_ours = lambda t: cp.from_dlpack(t.view(torch.int16)).view(_dtypes.BFLOAT16)  # noqa: E731
            return to_ours(xb), to_ours(dyb), xb, dyb
        x = x32.astype(dname)
        dy = dy32.astype(dname)
        return x, dy, torch.from_dlpack(x), torch.from_dlpack(dy)

    def ops(x, dy, tx, tdy, axis):
        """(name, ours(), theirs()) for the four ops; y from the forward of each."""
        out = []
        for log in (False, True):
            label = "log_softmax" if log else "softmax"
            fwd = softmaxes.log_softmax if log else softmaxes.softmax
            bwd = softmaxes.log_softmax_backward if log else softmaxes.softmax_backward
            y = fwd(x, axis)
            ty = (torch.log_softmax if log else torch.softmax)(tx, axis)
            tb = torch._log_softmax_backward_data if log else torch._softmax_backward_data
            out.append((f"{label} forward", lambda fwd=fwd: fwd(x, axis), lambda log=log: (
                torch.log_softmax if log else torch.softmax)(tx, axis), (fwd, (x,))))
            out.append((f"{label} backward", lambda bwd=bwd, y=y: bwd(dy, y, axis),
                        lambda tb=tb, ty=ty: tb(tdy, ty, axis, ty.dtype), (bwd, (dy, y))))
        return out

    for label, shape, axis, dname in problems():
        x, dy, tx, tdy = operands(shape, dname)
        nbytes = x.nbytes
        classifier = label == "classifier"
        variants = ROW_VARIANTS if classifier else {"base": ("base", 8, 4), "new": ("new", 2, 4)}
        repeat = 300 if classifier else 60
        for op, ours, theirs, (f, args) in ops(x, dy, tx, tdy, axis):
            floor = (2 if "forward" in op else 3) * nbytes
            row = {"problem": label, "op": op, "dtype": dname, "floor_bytes": floor}
            use("new", 8, 4)
            want = to32(f(*args, axis=axis))
            for rnd in range(2):   # A/B twice, interleaved
                for name, config in variants.items():
                    use(*config)
                    if rnd == 0:
                        got = to32(f(*args, axis=axis))
                        row[f"{name}_maxdiff"] = float(cp.max(cp.abs(got - want)))
                        row[f"{name}_plan"] = softmaxes._plan(op.split()[1], op.startswith("log"), shape, axis,
                                                              x.dtype, True)[:3]
                    row.setdefault(f"{name}_call_ms", []).append(call_ms(ours, repeat))
                    if classifier:
                        row.setdefault(f"{name}_gpu_us", []).append(gpu_us(ours))
                        row.setdefault(f"{name}_host_us", []).append(host_us(ours))
                row.setdefault("torch_call_ms", []).append(call_ms(theirs, repeat))
                if classifier:
                    row.setdefault("torch_gpu_us", []).append(gpu_us(theirs))
                    row.setdefault("torch_host_us", []).append(host_us(theirs))
            for key in [k for k in row if isinstance(row[k], list) and k.endswith(("_ms", "_us"))]:
                row[key] = min(row[key])   # the better of the two rounds
            row["of_copy_new" if not classifier else "of_copy_s2"] = floor / (
                row["new_call_ms" if not classifier else "s2_call_ms"] * 1e-3) / 1e9 / copy_gbps
            rows.append(row)
            print(json.dumps(row, default=str), flush=True)
        del x, dy, tx, tdy
        cp.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()
    use("new", 2, 4)
    (pathlib.Path(out) / "probe.json").write_text(json.dumps({"copy_GBps": copy_gbps, "rows": rows},
                                                             default=str, indent=1))
    print(f"\n== classifier_256x1000 fp32 (us; call = events around each call, median; gpu = queued, "
          f"no host gaps; host = host time a call). copy {copy_gbps:.0f} GB/s")
    names = list(ROW_VARIANTS) + ["torch"]
    for what in ("call", "gpu", "host"):
        print(f"{what:5s} {'op':22s} " + " ".join(f"{n:>7s}" for n in names))
        for r in rows:
            if r["problem"] != "classifier":
                continue
            scale = 1e3 if what == "call" else 1
            print(f"{what:5s} {r['op']:22s} " + " ".join(
                f"{r[f'{n}_{what}_ms' if what == 'call' else f'{n}_{what}_us'] * scale:7.2f}" for n in names))
    print("classifier x torch (call): " + "; ".join(
        f"{r['op']}: base {r['torch_call_ms'] / r['base_call_ms']:.2f} s2 {r['torch_call_ms'] / r['s2_call_ms']:.2f}"
        for r in rows if r["problem"] == "classifier"))
    print("\n== channel_64x256x56x56 (ms, events around each call; base = branch base kernels)")
    print(f"{'op':22s} {'dtype':8s} {'base':>8s} {'new':>8s} {'new/base':>8s} {'torch':>8s} {'x torch':>7s} {'of copy':>7s}")
    for r in rows:
        if r["problem"] == "classifier":
            continue
        print(f"{r['op']:22s} {r['dtype']:8s} {r['base_call_ms']:8.4f} {r['new_call_ms']:8.4f} "
              f"{r['new_call_ms'] / r['base_call_ms']:8.3f} {r['torch_call_ms']:8.4f} "
              f"{r['torch_call_ms'] / r['new_call_ms']:7.2f} {r['of_copy_new']:7.2f}")
    print("max |new - base| over variants: " + ", ".join(
        f"{r['problem']} {r['op']}: {max(v for k, v in r.items() if k.endswith('_maxdiff')):.1e}" for r in rows))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    if "--warm-base" in sys.argv:
        warm_base()
    else:
        main(sys.argv[1])
