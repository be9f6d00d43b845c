"""Pooling and batch norm against PyTorch in one run (issue 5, mem_poolbn v3).

    PYTHONPATH=. python3 notes/bench_poolbn.py [out.json]

Uses the project benchmark's rows (dnnprims.bench: bench_pool, bench_batchnorm,
floor bytes documented there), then the batch norm rows again with the
single-read kernels off (normalization.FUSED = False: the v2 two-pass path),
then the host time per call of the small problems.  Prints a table last.
"""
import json
import sys
import time

import cupy as cp
import numpy as np

from dnnprims import normalization, pool, batchnorm, batchnorm_backward
from dnnprims.bench import __main__ as bench
from dnnprims.bench import timing


def copy_gbps():
    src = cp.random.random(2**26, dtype=cp.float32)  # 256 MB
    dst = cp.empty_like(src)
    ms = timing.measure(lambda: dst.__setitem__(Ellipsis, src), xp=cp, warmup=3, repeat=20).median_ms
    return 2 * src.nbytes / (ms * 1e-3) / 1e9


def host_us(fn, calls=200):
    fn()
    cp.cuda.get_current_stream().synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    cp.cuda.get_current_stream().synchronize()
    return (t1 - t0) / calls * 1e6


def main():
    bench._VERBOSE = True  # one line per row as it is measured
    be = bench.Backend()
    problems = json.loads(bench.PROBLEMS.read_text())
    rng = np.random.default_rng(0)
    copy = copy_gbps()
    rows = bench.bench_pool(be, problems["pool"], 30, rng)
    rows += bench.bench_batchnorm(be, problems["batchnorm"], 30, rng)
    normalization.FUSED = False
    two = bench.bench_batchnorm(be, [s for s in problems["batchnorm"]
                                     if s["name"] in ("bn_big", "bn_r50_early", "bn_r50_late")], 30, rng)
    normalization.FUSED = True
    for r in two:
        r["op"] += " (2-pass)"
    rows += [r for r in two if "infer" not in r["op"]]
    # host time per call (no sync), small problems
    x = cp.random.random((32, 2048, 7, 7), dtype=cp.float32)
    g, b = cp.ones(2048, cp.float32), cp.zeros(2048, cp.float32)
    rm, rv = cp.zeros(2048, cp.float32), cp.ones(2048, cp.float32)
    y, mean, invstd = batchnorm(x, g, b, training=True, return_stats=True)
    host = {
        "bn_r50_late train fwd": host_us(lambda: batchnorm(x, g, b, rm, rv, training=True)),
        "bn_r50_late infer fwd": host_us(lambda: batchnorm(x, g, b, rm, rv, training=False)),
        "bn_r50_late bwd": host_us(lambda: batchnorm_backward(x, x, g, mean=mean, invstd=invstd)),
        "global_avg_r50 fwd": host_us(lambda: pool(x, 7, mode="avg", stride=1)),
        "r50_late maxpool 3x3s2 fwd": host_us(lambda: pool(x, 3, stride=2, padding=1)),
    }
    try:
        import torch
        tx = torch.as_tensor(x, device="cuda")
        host["torch F.batch_norm train"] = host_us(
            lambda: torch.nn.functional.batch_norm(tx, None, None, training=True))
    except Exception as e:  # noqa: BLE001
        host["torch"] = repr(e)
    out = {"copy_GBps": copy, "device": be.describe(), "rows": rows, "host_us": host}
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1, default=float)
    print(f"copy {copy:.0f} GB/s; {be.describe()}")
    print(f"{'op':34s} {'problem':18s} {'ours ms':>8s} {'torch ms':>8s} {'x torch':>7s} {'of copy':>7s} rel.err")
    for r in rows:
        frac = r["GBps"] / copy if r.get("GBps") else float("nan")
        print(f"{r['op']:34s} {r['name']:18s} {r.get('ms', float('nan')):8.4f} "
              f"{r.get('torch_ms', float('nan')):8.4f} {r.get('ratio', float('nan')):7.2f} {frac:7.2f} "
              f"{r.get('rel_error', float('nan')):.1e} {r.get('error', '')[:60]}")
    for k, v in host.items():
        print(f"host us/call {k}: {v if isinstance(v, str) else round(v, 1)}")
    print("resident blocks of the fused kernels:", {k[1].split("<")[0] + "<" + k[1].split("<")[1][:12]: v
                                                  for k, v in normalization._RESIDENT.items()})


if __name__ == "__main__":
    main()
