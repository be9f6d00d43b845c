"""GPU check of the pooling work of branch `pool` (notes/pool.md); run after
`python -m dnnprims.bench memory --only <pool problems> --json PATH`:

    python notes/pool_gpu.py PATH [--quick]

Prints (1) the previous paths (VECTOR_KERNELS = False: rows forward, tiled backward)
against the pool_k3s2 kernels on the same data, (2) host and GPU time per call
(cupyx.profiler.benchmark) of the small problems, ours and torch's, and last
(3) the short table of the benchmark JSON: ours, torch, ratio, fraction of the
copy bandwidth over the floor bytes (the floors are in dnnprims/bench/__main__.py).
"""
import json
import sys

import cupy as cp
import torch
from cupyx.profiler import benchmark

import dnnprims as dp
from dnnprims import pooling
from dnnprims.bench import timing


def ms(fn):
    return timing.measure(fn, xp=cp, warmup=3, repeat=30).median_ms


def old_vs_new():
    print("== previous paths (VECTOR_KERNELS = False) vs the vectorised kernels (ms, CUDA events, median of 30)")
    for name, shape, dtype, k, opts in (
            ("r50_maxpool", (32, 64, 112, 112), cp.float32, 3, dict(stride=2, padding=1)),
            ("max3x3s2_big", (64, 256, 56, 56), cp.float32, 3, dict(stride=2, padding=1)),
            ("max3x3s2_big_f16", (64, 256, 56, 56), cp.float16, 3, dict(stride=2, padding=1)),
            ("avg2x2s2", (64, 256, 56, 56), cp.float32, 2, dict(mode="avg", stride=2))):
        x = cp.random.random(shape, dtype=cp.float32).astype(dtype)
        y = dp.pool(x, k, **opts)
        dy = cp.random.random(y.shape, dtype=cp.float32).astype(dtype)
        got = {}
        for vector in (False, True):
            pooling.VECTOR_KERNELS = vector
            pooling._MEMO.clear()
            got[vector] = (ms(lambda: dp.pool(x, k, **opts)),
                           ms(lambda: dp.pool_backward(dy, x, y, k, **opts)),
                           dp.pool(x, k, **opts), dp.pool_backward(dy, x, y, k, **opts))
        same = [bool(cp.array_equal(got[False][i], got[True][i])) for i in (2, 3)]
        err = float(cp.abs(got[False][3].astype(cp.float64) - got[True][3].astype(cp.float64)).max())
        print(f"{name:18s} forward {got[False][0]:.4f} -> {got[True][0]:.4f}   "
              f"backward {got[False][1]:.4f} -> {got[True][1]:.4f}   bitwise equal y/dx: {same} "
              f"(dx max diff {err:.2e})")
        cp.get_default_memory_pool().free_all_blocks()
    pooling.VECTOR_KERNELS = True
    pooling._MEMO.clear()


def rows_sweep():
    """Rows per thread (the R template argument) of the pool_k3s2 kernels."""
    print("== pool_k3s2 rows per thread (ms; forward R output rows, backward 2R input rows)")
    for name, shape, dtype in (("r50_maxpool", (32, 64, 112, 112), cp.float32),
                               ("max3x3s2_big", (64, 256, 56, 56), cp.float32),
                               ("max3x3s2_big_f16", (64, 256, 56, 56), cp.float16)):
        size = cp.dtype(dtype).itemsize
        x = cp.random.random(shape, dtype=cp.float32).astype(dtype)
        y = dp.pool(x, 3, stride=2, padding=1)
        dy = cp.random.random(y.shape, dtype=cp.float32).astype(dtype)
        saved = pooling._K3S2_FORWARD_ROWS[size], pooling._K3S2_BACKWARD_ROWS[size]
        line = []
        for r in pooling._K3S2_FORWARD_ROWS_CHOICES:
            pooling._K3S2_FORWARD_ROWS[size] = r
            pooling._MEMO.clear()
            line.append(f"fwd R={r} {ms(lambda: dp.pool(x, 3, stride=2, padding=1)):.4f}"
                        f"{'' if cp.array_equal(dp.pool(x, 3, stride=2, padding=1), y) else ' DIFFERS'}")
        dx0 = dp.pool_backward(dy, x, y, 3, stride=2, padding=1)
        for r in pooling._K3S2_BACKWARD_ROWS_CHOICES:
            pooling._K3S2_BACKWARD_ROWS[size] = r
            pooling._MEMO.clear()
            line.append(f"bwd R={r} {ms(lambda: dp.pool_backward(dy, x, y, 3, stride=2, padding=1)):.4f}"
                        f"{'' if cp.array_equal(dp.pool_backward(dy, x, y, 3, stride=2, padding=1), dx0) else ' DIFFERS'}")
        pooling._K3S2_FORWARD_ROWS[size], pooling._K3S2_BACKWARD_ROWS[size] = saved
        pooling._MEMO.clear()
        print(f"{name:18s} " + "  ".join(line))
        cp.get_default_memory_pool().free_all_blocks()


def host_times():
    print("== host / GPU time per call, us (cupyx.profiler.benchmark, 300 calls)")
    F = torch.nn.functional
    x = cp.random.random((32, 2048, 7, 7), dtype=cp.float32)
    tx = torch.from_dlpack(x)
    xr = cp.random.random((32, 64, 112, 112), dtype=cp.float32)
    txr = torch.from_dlpack(xr)
    cases = {
        "global_avg_r50 fwd": lambda: dp.pool(x, 7, mode="avg", stride=1),
        "  torch": lambda: F.avg_pool2d(tx, 7, 1),
        "r50_maxpool fwd": lambda: dp.pool(xr, 3, stride=2, padding=1),
        "  torch ": lambda: F.max_pool2d(txr, 3, 2, 1),
    }
    for name, fn in cases.items():
        r = benchmark(fn, n_repeat=300, n_warmup=20)
        print(f"{name:20s} host {r.cpu_times.mean() * 1e6:7.1f}  gpu {r.gpu_times.mean() * 1e6:7.1f}")


def short_table(path):
    result = json.load(open(path))
    copy = result.get("ceilings", {}).get("copy_GBps", float("nan"))
    print(f"== pool benchmark (copy {copy:.0f} GB/s; ratio = torch / ours; "
          "of copy = floor bytes / time / copy bandwidth)")
    print(f"{'problem':18s} {'op':22s} {'ours ms':>8s} {'torch ms':>9s} {'ratio':>6s} {'of copy':>8s}")
    for r in result["rows"]:
        if r.get("kind") != "memory" or not r.get("op", "").startswith("pool"):
            continue
        frac = r["GBps"] / copy if "GBps" in r else float("nan")
        print(f"{r['name']:18s} {r['op']:22s} {r.get('ms', float('nan')):8.4f} "
              f"{r.get('torch_ms', float('nan')):9.4f} {r.get('ratio', float('nan')):6.2f} {frac:8.2f}"
              + (f"  ERROR {r['error']}" if "error" in r else ""))


if __name__ == "__main__":
    quick = "--quick" in sys.argv  # host times and the table only
    for step in ((host_times,) if quick else (old_vs_new, rows_sweep, host_times)):
        try:
            step()
        except Exception as e:  # keep going: the table must print
            print(f"{step.__name__} failed: {type(e).__name__}: {e}")
    short_table(sys.argv[1])
