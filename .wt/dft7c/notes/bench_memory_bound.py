"""Pooling and batch norm against PyTorch on the problems of problems.json, fp32 NCHW.

    PYTHONPATH=. python3 notes/bench_memory_bound.py [out.json]

A stop-gap until `python -m dnnprims.bench memory` exists: times with the
project's one helper (dnnprims.bench.timing.measure), checks every result
against PyTorch's in the same run, prints a table last.  Floor bytes: what a
correct algorithm must move for a tensor larger than L2 (notes/memory_bound.md).
"""
import json
import pathlib
import sys

import cupy as cp
import numpy as np
import torch
import torch.nn.functional as F

import dnnprims as dp
from dnnprims.bench.timing import measure, rotation_count

REPEAT = 30
PROBLEMS = json.loads((pathlib.Path(__file__).resolve().parents[1] / "dnnprims" / "bench"
                       / "problems.json").read_text())


def t(a):
    return torch.as_tensor(a, device="cuda")


def rel(a, b):
    a = cp.asarray(a, dtype=cp.float64)
    b = cp.asarray(b, dtype=cp.float64)
    return float(cp.linalg.norm(a - b) / max(float(cp.linalg.norm(b)), 1e-300))


def copy_bandwidth():
    src = cp.random.random(2**26, dtype=cp.float32)  # 256 MB
    dst = cp.empty_like(src)
    ms = measure(lambda: dst.__setitem__(Ellipsis, src), xp=cp, warmup=5, repeat=REPEAT).median_ms
    return 2 * src.nbytes / (ms * 1e-3) / 1e9


def timed(fn, sets):
    return measure(fn, sets, xp=cp, warmup=5, repeat=REPEAT).median_ms


def pool_rows(p):
    rows = []
    n, c, h, w, k, s, pad = (p[key] for key in ("N", "C", "H", "W", "window", "stride", "pad"))
    mode = p["mode"]
    rng = cp.random.default_rng(0)
    xbytes = n * c * h * w * 4
    sets = []
    for _ in range(rotation_count(xbytes)):
        x = rng.standard_normal((n, c, h, w), dtype=cp.float32)
        y = dp.pool(x, k, mode=mode, stride=s, padding=pad)
        dy = rng.standard_normal(y.shape, dtype=cp.float32)
        sets.append((x, y, dy))
    x, y, dy = sets[0]
    ybytes = y.size * 4
    tf = F.max_pool2d if mode == "max" else F.avg_pool2d
    # forward
    err = rel(dp.pool(x, k, mode=mode, stride=s, padding=pad), tf(t(x), k, s, pad))
    ours = timed(lambda x, y, dy: dp.pool(x, k, mode=mode, stride=s, padding=pad), sets)
    tsets = [(t(a), t(b), t(d)) for a, b, d in sets]
    theirs = timed(lambda x, y, dy: tf(x, k, s, pad), tsets)
    rows.append((p["name"], "fwd", ours, theirs, xbytes + ybytes, err))
    # backward (torch: autograd.grad of a graph built once per input set)
    gsets = []
    for a, _, d in tsets:
        xa = a.clone().requires_grad_(True)
        gsets.append((xa, tf(xa, k, s, pad), d))
    xa, ya, da = gsets[0]
    err = rel(dp.pool_backward(dy, x, y, k, mode=mode, stride=s, padding=pad),
              torch.autograd.grad(ya, xa, da, retain_graph=True)[0])
    ours = timed(lambda x, y, dy: dp.pool_backward(dy, x, y, k, mode=mode, stride=s, padding=pad), sets)
    theirs = timed(lambda xa, ya, da: torch.autograd.grad(ya, xa, da, retain_graph=True), gsets)
    floor = (2 * xbytes if mode == "max" else xbytes) + ybytes  # avg needs no x
    rows.append((p["name"], "bwd", ours, theirs, floor, err))
    return rows


def bn_rows(p):
    rows = []
    n, c, h, w = (p[key] for key in ("N", "C", "H", "W"))
    rng = cp.random.default_rng(1)
    xbytes = n * c * h * w * 4
    sets = []
    for _ in range(rotation_count(xbytes)):
        x = rng.standard_normal((n, c, h, w), dtype=cp.float32) * 2 + 0.5
        dy = rng.standard_normal((n, c, h, w), dtype=cp.float32)
        g = rng.random(c, dtype=cp.float32) + 0.5
        b = rng.standard_normal(c, dtype=cp.float32)
        sets.append((x, dy, g, b, cp.zeros(c, cp.float32), cp.ones(c, cp.float32)))
    x, dy, g, b, rm, rv = sets[0]
    tsets = [tuple(t(a) for a in s) for s in sets]
    tx, tdy, tg, tb, trm, trv = tsets[0]
    # training forward
    y, mean, invstd = dp.batchnorm(x, g, b, rm.copy(), rv.copy(), return_stats=True)
    err = rel(y, F.batch_norm(tx, trm.clone(), trv.clone(), tg, tb, training=True))
    ours = timed(lambda x, dy, g, b, rm, rv: dp.batchnorm(x, g, b, rm, rv), sets)
    theirs = timed(lambda x, dy, g, b, rm, rv: F.batch_norm(x, rm, rv, g, b, training=True), tsets)
    rows.append((p["name"], "train fwd", ours, theirs, 3 * xbytes, err))
    # inference forward
    err = rel(dp.batchnorm(x, g, b, rm, rv, training=False),
              F.batch_norm(tx, trm, trv, tg, tb, training=False))
    ours = timed(lambda x, dy, g, b, rm, rv: dp.batchnorm(x, g, b, rm, rv, training=False), sets)
    theirs = timed(lambda x, dy, g, b, rm, rv: F.batch_norm(x, rm, rv, g, b, training=False), tsets)
    rows.append((p["name"], "infer fwd", ours, theirs, 2 * xbytes, err))
    # backward with saved statistics (torch: autograd.grad through cuDNN)
    stats = []
    gsets = []
    for (x, dy, g, b, rm, rv), (tx, tdy, tg, tb, trm, trv) in zip(sets, tsets):
        _, mean, invstd = dp.batchnorm(x, g, b, return_stats=True)
        stats.append((x, dy, g, mean, invstd))
        xa, ga, ba = (a.clone().requires_grad_(True) for a in (tx, tg, tb))
        gsets.append((F.batch_norm(xa, None, None, ga, ba, training=True), (xa, ga, ba), tdy))
    dx, dgamma, dbeta = dp.batchnorm_backward(*stats[0][1::-1], stats[0][2], mean=stats[0][3],
                                              invstd=stats[0][4])
    tdx, tdg, tdb = torch.autograd.grad(gsets[0][0], gsets[0][1], gsets[0][2], retain_graph=True)
    err = max(rel(dx, tdx), rel(dgamma, tdg), rel(dbeta, tdb))
    ours = timed(lambda x, dy, g, m, s: dp.batchnorm_backward(dy, x, g, mean=m, invstd=s), stats)
    theirs = timed(lambda y, inputs, d: torch.autograd.grad(y, inputs, d, retain_graph=True), gsets)
    rows.append((p["name"], "bwd", ours, theirs, 5 * xbytes, err))
    return rows


def host_overhead():
    """Host time per call (no synchronisation) and the top of a profile: small
    problems are launch-bound when this exceeds the GPU time."""
    import cProfile
    import io
    import pstats
    import time
    x = cp.random.standard_normal((32, 2048, 7, 7), dtype=cp.float32)
    g, b = cp.ones(2048, cp.float32), cp.zeros(2048, cp.float32)
    rm, rv = cp.zeros(2048, cp.float32), cp.ones(2048, cp.float32)
    _, mean, invstd = dp.batchnorm(x, g, b, return_stats=True)
    calls = {
        "batchnorm train": lambda: dp.batchnorm(x, g, b, rm, rv),
        "batchnorm infer": lambda: dp.batchnorm(x, g, b, rm, rv, training=False),
        "batchnorm bwd": lambda: dp.batchnorm_backward(x, x, g, mean=mean, invstd=invstd),
        "pool global": lambda: dp.pool(x, 7, mode="avg"),
        "pool 3x3s2": lambda: dp.pool(x, 3, stride=2, padding=1),
        "empty x4": lambda: [cp.empty(2048, cp.float32) for _ in range(4)],
        "torch bn train": (lambda tx=t(x), tg=t(g), tb=t(b), trm=t(rm), trv=t(rv):
                           F.batch_norm(tx, trm, trv, tg, tb, training=True)),
    }
    for name, fn in calls.items():
        for _ in range(20):
            fn()
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            fn()
        host = (time.perf_counter() - t0) / 200 * 1e6
        cp.cuda.Device().synchronize()
        print(f"host {name:16}: {host:7.1f} us per call")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        dp.batchnorm(x, g, b, rm, rv, training=False)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(14)
    print("\n".join(out.getvalue().splitlines()[-22:]))


def main():
    host_overhead()
    copy = copy_bandwidth()
    rows = []
    for p in PROBLEMS["pool"]:
        rows += pool_rows(p)
        cp.get_default_memory_pool().free_all_blocks()
    for p in PROBLEMS["batchnorm"]:
        rows += bn_rows(p)
        cp.get_default_memory_pool().free_all_blocks()
    out = [dict(problem=name, op=op, ours_ms=o, torch_ms=th, speedup=th / o, floor_bytes=fb,
                ours_GBps=fb / o / 1e6, of_copy=fb / o / 1e6 / copy, rel_err_vs_torch=e)
           for name, op, o, th, fb, e in rows]
    if len(sys.argv) > 1:
        pathlib.Path(sys.argv[1]).write_text(json.dumps(dict(copy_GBps=copy, rows=out), indent=1))
    print(f"device-to-device copy: {copy:.0f} GB/s (read + write)")
    print(f"{'problem':16} {'op':10} {'ours ms':>8} {'torch ms':>8} {'x':>5} {'GB/s':>6} "
          f"{'of copy':>7} {'err':>8}")
    for r in out:
        print(f"{r['problem']:16} {r['op']:10} {r['ours_ms']:8.4f} {r['torch_ms']:8.4f} "
              f"{r['speedup']:5.2f} {r['ours_GBps']:6.0f} {r['of_copy']:7.2f} "
              f"{r['rel_err_vs_torch']:8.1e}")


if __name__ == "__main__":
    main()
