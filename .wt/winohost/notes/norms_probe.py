"""A/B timings of the `norms` helper's paths on the GPU (each new path against the
one it replaces, same process, same data), plus host vs GPU time of bn_r50_late.

Run on the GPU machine from the repository root:  python notes/norms_probe.py [OUT.json]
Times are medians of CUDA-event intervals around each call (dnnprims.bench.timing,
no sync between calls, as the benchmark measures); "of copy" = floor bytes /
time / the copy bandwidth measured here.
"""
import json
import sys

import cupy as cp
import numpy as np

import dnnprims as dp
from dnnprims import normalization, row_normalization, softmaxes, tensor_ops
from dnnprims.bench import timing

rows = []
copy = timing.measure_ceilings(cp, copy_bytes=2**29, gemm_size=1024, repeat=5)["copy_GBps"]
print(f"copy {copy:.0f} GB/s", flush=True)


def t(fn, repeat=30):
    fn()
    cp.cuda.get_current_stream().synchronize()
    return timing.measure(fn, xp=cp, warmup=3, repeat=repeat).median_ms


def case(name, floor, new, old=None, setup_new=None, setup_old=None):
    try:
        if setup_old is not None and old is not None:
            setup_old()
        ms_old = t(old) if old is not None else float("nan")
        if setup_new is not None:
            setup_new()
        ms_new = t(new)
        row = {"case": name, "new_ms": ms_new, "old_ms": ms_old, "floor_bytes": floor,
               "new_of_copy": floor / (ms_new * 1e-3) / 1e9 / copy}
    except Exception as e:  # keep going: one failure must not hide the rest
        row = {"case": name, "error": f"{type(e).__name__}: {e}"[:300]}
    rows.append(row)
    print(row, flush=True)


rng = np.random.default_rng(0)
f32 = np.float32

# 1. bn_r50_late: flat inference kernel vs chunk kernel; host vs GPU time.
x = cp.asarray(rng.standard_normal((32, 2048, 7, 7), f32))
g, b = cp.ones(2048, f32), cp.zeros(2048, f32)
rm, rv = cp.zeros(2048, f32), cp.ones(2048, f32)
n = x.nbytes
infer = lambda: dp.batchnorm(x, g, b, rm, rv, training=False)  # noqa: E731
flat = lambda v: lambda: setattr(normalization, "FLAT_INFERENCE", v)  # noqa: E731
case("bn_r50_late infer (flat vs chunk)", 2 * n, infer, infer, flat(True), flat(False))
rmt, rvt = rm.copy(), rv.copy()
case("bn_r50_late train", 3 * n, lambda: dp.batchnorm(x, g, b, rmt, rvt, training=True))
try:
    from cupyx.profiler import benchmark
    import torch
    import torch.nn.functional as F
    tx, tg, tb, trm, trv = (torch.from_dlpack(a) for a in (x, g, b, rm.copy(), rv.copy()))
    rm2, rv2 = rm.copy(), rv.copy()
    for name, fn in [("ours infer", infer),
                     ("ours train", lambda: dp.batchnorm(x, g, b, rm2, rv2, training=True)),
                     ("torch infer", lambda: F.batch_norm(tx, trm, trv, tg, tb, training=False)),
                     ("torch train", lambda: F.batch_norm(tx, trm, trv, tg, tb, training=True))]:
        r = benchmark(fn, n_repeat=200, n_warmup=20)
        row = {"case": f"bn_r50_late host/gpu {name}", "host_us": float(r.cpu_times.mean() * 1e6),
               "gpu_us": float(r.gpu_times.mean() * 1e6)}
        rows.append(row)
        print(row, flush=True)
except Exception as e:
    print("host/gpu probe failed:", e, flush=True)
del x

# 2. bn_big_nhwc: rows kernels sized by occupancy vs the fixed 4-blocks-per-SM grid.
x = cp.asarray(rng.standard_normal((64, 56, 56, 256), f32))
dy = cp.asarray(rng.standard_normal(x.shape, f32))
g, b = cp.ones(256, f32), cp.zeros(256, f32)
n = x.nbytes
_, mean, invstd = dp.batchnorm(x, g, b, layout="NHWC", return_stats=True)
real_resident = normalization._resident_blocks


def occupancy(on):
    def set_():
        normalization._RESIDENT.clear()
        normalization._resident_blocks = real_resident if on else (lambda cp_, k: 0)
    return set_


rm, rv = cp.zeros(256, f32), cp.ones(256, f32)
train = lambda: dp.batchnorm(x, g, b, rm, rv, layout="NHWC")  # noqa: E731
back = lambda: dp.batchnorm_backward(dy, x, g, mean=mean, invstd=invstd, layout="NHWC")  # noqa: E731
case("bn_big_nhwc train (occupancy grid vs 4/SM)", 3 * n, train, train, occupancy(True), occupancy(False))
case("bn_big_nhwc backward (occupancy grid vs 4/SM)", 5 * n, back, back, occupancy(True), occupancy(False))
case("bn_big_nhwc infer", 2 * n, lambda: dp.batchnorm(x, g, b, rm, rv, training=False, layout="NHWC"))
del x, dy

# 3. layer / RMS norm backward: fused vs separate gradient kernels.
for dtype in (np.float32, np.float16):
    x = cp.asarray(rng.standard_normal((65536, 1024)).astype(dtype))
    dy = cp.asarray(rng.standard_normal((65536, 1024)).astype(dtype))
    pdt = np.float32
    g = cp.asarray(rng.uniform(0.5, 1.5, 1024).astype(pdt))
    _, mean, rstd = dp.layer_norm(x, 1024, g, return_stats=True)
    n = x.nbytes
    fused = lambda v: lambda: setattr(row_normalization, "FUSED_BACKWARD", v)  # noqa: E731
    ln = lambda: dp.layer_norm_backward(dy, x, 1024, g, mean=mean, rstd=rstd)  # noqa: E731
    _, rstd_r = dp.rms_norm(x, 1024, g, return_stats=True)
    rms = lambda: dp.rms_norm_backward(dy, x, 1024, g, rstd=rstd_r)  # noqa: E731
    tag = np.dtype(dtype).name
    case(f"layer_norm backward {tag} (fused vs separate)", 3 * n, ln, ln, fused(True), fused(False))
    case(f"rms_norm backward {tag} (fused vs separate)", 3 * n, rms, rms, fused(True), fused(False))
    del x, dy

# 4. channel softmax, 16-bit: pairs tiles vs previous kernels.
for dtype in (np.float16,):
    x = cp.asarray(rng.uniform(-1, 1, (64, 256, 56, 56)).astype(dtype))
    dy = cp.asarray(rng.uniform(-1, 1, x.shape).astype(dtype))
    y = dp.softmax(x, axis=1)
    n = x.nbytes

    def pairs(direction, v):
        def set_():
            softmaxes.CHANNEL_PAIRS[direction] = v
            softmaxes._PLANS.clear()
        return set_

    for log in (False, True):
        fwd = (lambda: dp.log_softmax(x, axis=1)) if log else (lambda: dp.softmax(x, axis=1))
        bwd = (lambda: dp.log_softmax_backward(dy, y, axis=1)) if log else \
            (lambda: dp.softmax_backward(dy, y, axis=1))
        name = "log_softmax" if log else "softmax"
        case(f"channel {name} forward fp16 (pairs vs before)", 2 * n, fwd, fwd, pairs("forward", True),
             pairs("forward", False))
        case(f"channel {name} backward fp16 (pairs vs before)", 3 * n, bwd, bwd, pairs("backward", True),
             pairs("backward", False))
    del x, dy, y

# 5. reduce sum over (0, 2, 3): warp rows vs block rows.
x = cp.asarray(rng.standard_normal((64, 256, 56, 56), f32))
warp = lambda v: lambda: setattr(tensor_ops, "WARP_ROWS_MIN_OUTPUTS", 132 * 64 if v else 10**18)  # noqa: E731
red = lambda: dp.reduce_tensor(x, (0, 2, 3), "sum")  # noqa: E731
case("reduce sum (0,2,3) (warp vs block rows)", x.nbytes, red, red, warp(True), warp(False))
try:
    import torch
    tx = torch.from_dlpack(x)
    case("torch reduce sum (0,2,3)", x.nbytes, lambda: tx.sum(dim=(0, 2, 3)))
except Exception as e:
    print("torch reduce failed:", e)

print("\n== norms probe (ms; new = this branch's path, old = the path it replaces)")
print(f"{'case':52s} {'new':>8s} {'old':>8s} {'old/new':>8s} {'of copy':>8s}")
for r in rows:
    if "new_ms" in r:
        print(f"{r['case']:52s} {r['new_ms']:8.4f} {r['old_ms']:8.4f} {r['old_ms'] / r['new_ms']:8.2f} "
              f"{r['new_of_copy']:8.2f}")
    elif "host_us" in r:
        print(f"{r['case']:52s} host {r['host_us']:7.1f} us  gpu {r['gpu_us']:7.1f} us")
    else:
        print(f"{r['case']:52s} {r.get('error')}")
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump({"copy_GBps": copy, "rows": rows}, f, indent=1)
