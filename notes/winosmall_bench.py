"""Host us/call and GPU ms of the cached Winograd call, the cuBLAS path against the
fused WIP path (helper winosmall, notes/winosmall.md).  One process per path (the
flag is read at import: DNNPRIMS_WINOGRAD_FUSED=0/1), rows as JSON lines "ROW {...}";
`--table a.log b.log` prints the side-by-side table.

    DNNPRIMS_WINOGRAD_FUSED=0 python notes/winosmall_bench.py gemm  > gemm.log
    DNNPRIMS_WINOGRAD_FUSED=1 python notes/winosmall_bench.py fused > fused.log
    python notes/winosmall_bench.py --table gemm.log fused.log

Host time: bursts of BURST calls with no synchronisation inside (the launch queue
absorbs them), wall time / BURST, median of BURSTS bursts (dnnprims.bench.overhead's
method).  GPU time: CUDA events around each call (dnnprims.bench.timing.measure),
median.  Error: normwise against the float64 NumPy reference (b32: over the first
two images, which depend on nothing else; no other kernel family is compiled).
"""
import json
import statistics
import sys
import time

import numpy as np

BURST, BURSTS = 100, 20
ALGO = "winograd_f4x4_3x3"


def _host_us(cp, fn):
    for _ in range(20):
        fn()
    samples = []
    for _ in range(BURSTS):
        cp.cuda.get_current_stream().synchronize()
        t0 = time.perf_counter()
        for _ in range(BURST):
            fn()
        samples.append((time.perf_counter() - t0) / BURST * 1e6)
    cp.cuda.get_current_stream().synchronize()
    return statistics.median(samples)


def main(label):
    import cupy as cp
    import dnnprims as dp
    from dnnprims import algos
    from dnnprims.algos import winograd
    from dnnprims.bench.timing import measure

    fused = bool(getattr(winograd, "FUSED_GEMM_OUTPUT", False))
    rng = np.random.default_rng(0)
    for n in (1, 32):
        x = rng.standard_normal((n, 64, 56, 56)).astype(np.float32)
        w = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
        gx, gw = cp.asarray(x), cp.asarray(w)
        for direction in ("forward", "backward_data"):
            for algo in ([ALGO, "winograd_f2x2_3x3"] if n == 1 else [ALGO]):
                x2, w64 = x[:2].astype(np.float64), w.astype(np.float64)
                if direction == "forward":
                    fn = lambda: dp.conv2d_forward(gx, gw, padding=1, algo=algo)   # noqa: E731
                    want = dp.conv2d_forward(x2, w64, padding=1)
                else:
                    fn = lambda: dp.conv2d_backward_data(gx, gw, x.shape, padding=1, algo=algo)   # noqa: E731
                    want = dp.conv2d_backward_data(x2, w64, x2.shape, padding=1)
                got = cp.asnumpy(fn())[:2].astype(np.float64)
                err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
                host = _host_us(cp, fn)
                gpu = measure(fn, xp=cp, warmup=5, repeat=50).median_ms
                row = dict(label=label, fused=fused, n=n, direction=direction, algo=algo, host_us=host,
                           gpu_ms=gpu, err=err)
                # The prepared runner alone (no key, lookup or output slot): b1 only.
                if n == 1:
                    p = dp.conv._describe(x.shape, w.shape, 1, 1, 1, 1, "NCHW", "float32")
                    alg = algos.REGISTRY[algo]
                    runner = alg.prepare(p, direction)
                    out = cp.empty(x.shape, cp.float32)
                    row["runner_us"] = _host_us(cp, lambda: runner(gx, gw, out))
                print("ROW " + json.dumps(row), flush=True)


def table(paths):
    rows = {}
    for path in paths:
        for line in open(path):
            if line.startswith("ROW "):
                r = json.loads(line[4:])
                rows[(r["n"], r["direction"], r["algo"], r["fused"])] = r
    keys = sorted({k[:3] for k in rows})
    print(f"{'problem (x n x64x56x56, K64 3x3)':42} {'path':6} {'host us':>8} {'runner us':>9} {'GPU ms':>8} "
          f"{'rel err':>8}")
    for key in keys:
        n, direction, algo = key
        for fused in (False, True):
            r = rows.get(key + (fused,))
            if r is None:
                print(f"{f'n={n} {direction} {algo}':42} {'fused' if fused else 'gemm':6} (missing)")
                continue
            runner = f"{r['runner_us']:9.1f}" if "runner_us" in r else f"{'-':>9}"
            print(f"{f'n={n} {direction} {algo}':42} {'fused' if fused else 'gemm':6} {r['host_us']:8.1f} "
                  f"{runner} {r['gpu_ms']:8.4f} {r['err']:8.1e}")


if __name__ == "__main__":
    if sys.argv[1] == "--table":
        table(sys.argv[2:])
    else:
        main(sys.argv[1])
