"""Floors as in dnnprims.bench (train fwd 3x, bwd 5x, so single-read paths can pass 1.0 of copy).

Final GPU check + timing of mem_poolbn v3 in ONE process (one NVRTC compile):
the GPU tests of the paths changed since the first run, then timings side by
side with PyTorch (no CPU references: the tests check correctness).

    PYTHONPATH=. python3 notes/gpu_final.py OUT_DIR
"""
import json
import sys
import time

import pytest

out = sys.argv[1] if len(sys.argv) > 1 else "."
t0 = time.time()
rc1 = pytest.main(["-q", "-m", "gpu", "-p", "no:cacheprovider", "--tb=short", "--maxfail=10",
                   "tests/test_normalization.py", "-k", "single_read or channel_last and float32"])
rc2 = pytest.main(["-q", "-m", "gpu", "-p", "no:cacheprovider", "--tb=short", "--maxfail=10",
                   "tests/test_pooling.py", "-k", "direct_paths_ties and not True"])
print(f"TESTS normalization rc={rc1} pooling rc={rc2} ({time.time() - t0:.0f} s)", flush=True)

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import dnnprims as dp  # noqa: E402
from dnnprims import normalization  # noqa: E402
from dnnprims.bench import __main__ as bench  # noqa: E402
from dnnprims.bench.timing import measure  # noqa: E402

R = 10
rows = []


def ms(fn):
    return measure(fn, xp=cp, warmup=2, repeat=R).median_ms


src = cp.random.random(2**26, dtype=cp.float32)
dst = cp.empty_like(src)
copy = 2 * src.nbytes / (ms(lambda: dst.__setitem__(Ellipsis, src)) * 1e-3) / 1e9
del src, dst
problems = json.loads(bench.PROBLEMS.read_text())


def row(op, name, floor, ours, theirs):
    r = {"op": op, "name": name, "ms": ours, "torch_ms": theirs, "bytes": floor}
    r["of_copy"] = floor / (ours * 1e-3) / 1e9 / copy
    r["ratio"] = theirs / ours if theirs else None
    rows.append(r)
    print(f"{op:30s} {name:18s} {ours:8.4f} {theirs or float('nan'):8.4f} "
          f"{r['ratio'] or float('nan'):6.2f} {r['of_copy']:5.2f}", flush=True)


def tt(a, layout):
    t = torch.as_tensor(a, device="cuda")
    return t.permute(0, 3, 1, 2) if layout == "NHWC" else t


for s in problems["pool"]:
    layout, dtype = s.get("layout", "NCHW"), s.get("dtype", "float32")
    shape = bench._shape_of(s, layout)
    x = cp.random.random(shape, dtype=cp.float32).astype(dtype)
    k, st, pad, mode = s["window"], s["stride"], s["pad"], s["mode"]
    o = dict(mode=mode, stride=st, padding=pad, layout=layout)
    y = dp.pool(x, k, **o)
    dy = cp.random.random(y.shape, dtype=cp.float32).astype(dtype)
    tx, tdy = tt(x, layout), tt(dy, layout)
    f = (lambda a: F.max_pool2d(a, k, st, pad)) if mode == "max" else \
        (lambda a: F.avg_pool2d(a, k, st, pad, count_include_pad=True))
    txg = tx.detach().clone().requires_grad_()
    ty = f(txg)
    row(f"pool_{mode} fwd", s["name"], x.nbytes + y.nbytes, ms(lambda: dp.pool(x, k, **o)), ms(lambda: f(tx)))
    row(f"pool_{mode} bwd", s["name"], (x.nbytes if mode == "max" else 0) + dy.nbytes + x.nbytes,
        ms(lambda: dp.pool_backward(dy, x, y, k, **o)),
        ms(lambda: torch.autograd.grad(ty, txg, tdy, retain_graph=True)))
    del x, y, dy, tx, tdy, txg, ty
    cp.get_default_memory_pool().free_all_blocks()

for s in problems["batchnorm"]:
    layout, dtype = s.get("layout", "NCHW"), s.get("dtype", "float32")
    shape = bench._shape_of(s, layout)
    C = s["C"]
    x = cp.random.random(shape, dtype=cp.float32).astype(dtype)
    dy = cp.random.random(shape, dtype=cp.float32).astype(dtype)
    g, b = cp.random.random(C, dtype=cp.float32) + 0.5, cp.random.random(C, dtype=cp.float32)
    rm, rv = cp.zeros(C, cp.float32), cp.ones(C, cp.float32)
    tx, tdy = tt(x, layout), tt(dy, layout)
    tg, tb, trm, trv = (torch.as_tensor(a, device="cuda") for a in (g, b, rm.copy(), rv.copy()))
    n = x.nbytes
    torch_train = ms(lambda: F.batch_norm(tx, trm, trv, tg, tb, training=True))
    train = lambda: dp.batchnorm(x, g, b, rm, rv, layout=layout)  # noqa: E731
    if layout == "NCHW":
        normalization.FUSED_FORWARD_MIN_BYTES = 0
        for pre in (True, False):
            normalization.FUSED_PREFETCH = pre
            row(f"bn train fwd fused{' prefetch' if pre else ''}", s["name"], 3 * n, ms(train), torch_train)
        normalization.FUSED = False
        row("bn train fwd 2-pass", s["name"], 3 * n, ms(train), torch_train)
        normalization.FUSED, normalization.FUSED_PREFETCH = True, True
        normalization.FUSED_FORWARD_MIN_BYTES = 128 << 20
    else:
        for per_sm in (4, 8):
            normalization.ROWS_REDUCE_PER_SM = per_sm
            row(f"bn train fwd rows {per_sm}/SM", s["name"], 3 * n, ms(train), torch_train)
        normalization.ROWS_REDUCE_PER_SM = 4
    row("bn infer fwd", s["name"], 2 * n, ms(lambda: dp.batchnorm(x, g, b, rm, rv, training=False,
                                                                  layout=layout)),
        ms(lambda: F.batch_norm(tx, trm, trv, tg, tb, training=False)))
    _, mean, invstd = dp.batchnorm(x, g, b, return_stats=True, layout=layout)
    txg, tgg, tbg = (t.detach().clone().requires_grad_() for t in (tx, tg, tb))
    ty = F.batch_norm(txg, None, None, tgg, tbg, training=True)
    row("bn bwd" + (" fused" if layout == "NCHW" else ""), s["name"], 5 * n,
        ms(lambda: dp.batchnorm_backward(dy, x, g, mean=mean, invstd=invstd, layout=layout)),
        ms(lambda: torch.autograd.grad(ty, (txg, tgg, tbg), tdy, retain_graph=True)))
    del x, dy, tx, tdy, txg, ty
    cp.get_default_memory_pool().free_all_blocks()

with open(f"{out}/final.json", "w") as fh:
    json.dump({"copy_GBps": copy, "rows": rows, "resident": {k[1]: v for k, v in normalization._RESIDENT.items()}},
              fh, indent=1)
print(f"copy {copy:.0f} GB/s; resident {sorted(set(normalization._RESIDENT.values()))}; total {time.time() - t0:.0f} s")
