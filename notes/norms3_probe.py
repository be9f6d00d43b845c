"""A/B timings of helper norms3's paths on the GPU: each new path against the
one it replaces, same process, same data (switches in dnnprims.normalization /
dnnprims.row_normalization), plus the largest difference between the two
results.  Run on the GPU machine from the repository root:
    python notes/norms3_probe.py [OUT.json]
Times: medians of CUDA-event intervals (dnnprims.bench.timing, as the benchmark
measures); "of copy" = floor bytes / time / the copy bandwidth measured here."""
import json
import sys

import cupy as cp
import numpy as np

import dnnprims as dp
from dnnprims import normalization as bn
from dnnprims import row_normalization as rn
from dnnprims.bench import timing

rows = []
copy = timing.measure_ceilings(cp, copy_bytes=2**29, gemm_size=1024, repeat=5)["copy_GBps"]
print(f"copy {copy:.0f} GB/s", flush=True)


def t(fn, repeat=30):
    fn()
    cp.cuda.get_current_stream().synchronize()
    return timing.measure(fn, xp=cp, warmup=3, repeat=repeat).median_ms


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def case(name, floor, fn, module, switches):
    """switches: {label: {switch: value}}; the first label is the default (new) path."""
    row = {"case": name, "floor_bytes": floor}
    saved = {k: getattr(module, k) for s in switches.values() for k in s}
    ref = None
    try:
        for label, setting in switches.items():
            for k, v in setting.items():
                setattr(module, k, v)
            ms = t(fn)
            out = _first(fn()).astype(cp.float32)
            if ref is None:
                ref = out
                row["max_diff"] = 0.0
            else:
                row["max_diff"] = max(row["max_diff"], float(cp.abs(out - ref).max()))
            row[label] = ms
            row[label + "_of_copy"] = floor / (ms * 1e-3) / 1e9 / copy
    except Exception as e:  # keep going: one failure must not hide the rest
        row["error"] = f"{type(e).__name__}: {e}"[:300]
    finally:
        for k, v in saved.items():
            setattr(module, k, v)
    rows.append(row)
    print(row, flush=True)


rng = np.random.default_rng(0)
f32 = np.float32


def data(shape, dtype=f32):
    return cp.asarray(rng.uniform(-1, 1, shape).astype(dtype))


def params(c):
    return (cp.asarray(rng.uniform(0.5, 1.5, c).astype(f32)), cp.asarray(rng.uniform(-0.5, 0.5, c).astype(f32)),
            cp.zeros(c, f32), cp.ones(c, f32))


# bn_r50_late training: grouped 16-byte kernel vs the fused one-chunk kernel.
x = data((32, 2048, 7, 7))
g, b, rm, rv = params(2048)
case("bn_r50_late train", 3 * x.nbytes, lambda: dp.batchnorm(x, g, b, rm, rv, training=True), bn,
     {"grouped": {"GROUPED_TRAINING": True}, "fused": {"GROUPED_TRAINING": False}})
# bn_big_nhwc: one-launch rows kernels vs three launches.
x = data((64, 56, 56, 256))
dy = data((64, 56, 56, 256))
g, b, rm, rv = params(256)
_, mean, invstd = dp.batchnorm(x, g, b, layout="NHWC", return_stats=True)
case("bn_big_nhwc train", 3 * x.nbytes, lambda: dp.batchnorm(x, g, b, rm, rv, layout="NHWC"), bn,
     {"fused": {"ROWS_FUSED": True}, "three": {"ROWS_FUSED": False}})
case("bn_big_nhwc backward", 5 * x.nbytes,
     lambda: dp.batchnorm_backward(dy, x, g, mean=mean, invstd=invstd, layout="NHWC"), bn,
     {"fused": {"ROWS_FUSED": True}, "three": {"ROWS_FUSED": False}})
del x, dy
# bn_big_f16 NCHW (not changed: where it stands).
x = data((64, 256, 56, 56), np.float16)
dy = data((64, 256, 56, 56), np.float16)
_, mean, invstd = dp.batchnorm(x, g, b, return_stats=True)
case("bn_big_f16 train", 3 * x.nbytes, lambda: dp.batchnorm(x, g, b, rm, rv), bn, {"now": {}})
case("bn_big_f16 backward", 5 * x.nbytes, lambda: dp.batchnorm_backward(dy, x, g, mean=mean, invstd=invstd),
     bn, {"now": {}})
del x, dy
# gn_64x256x56x56_g32 backward: plane sums in the row kernel, one-block-per-SM cache.
x = data((64, 256, 56, 56))
dy = data((64, 256, 56, 56))
g, b = params(256)[:2]
_, mean, rstd = dp.group_norm(x, 32, g, b, return_stats=True)
case("gn backward", 3 * x.nbytes, lambda: dp.group_norm_backward(dy, x, 32, g, mean=mean, rstd=rstd), rn,
     {"planes+cache": {"PLANE_SUMS": True, "BIG_CACHE": True},
      "planes": {"PLANE_SUMS": True, "BIG_CACHE": False},
      "cache": {"PLANE_SUMS": False, "BIG_CACHE": True},
      "old": {"PLANE_SUMS": False, "BIG_CACHE": False}})
case("gn forward", 2 * x.nbytes, lambda: dp.group_norm(x, 32, g, b), rn, {"now": {}})

if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump({"copy_GBps": copy, "rows": rows}, f, indent=1)
