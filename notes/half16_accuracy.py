"""CPU evidence for the 16-bit GELU derivative of kernels/activation_math.cuh
(gelu_derivative_fast): the formula emulated in float32 NumPy (the constants read
from the header; ex2.approx / rcp.approx taken as exact float32, their ~2^-22
error is below the float32 rounding of the steps) over all 65536 float16 bit
patterns and a dense bfloat16 sweep (every bfloat16 in |x| <= 16), against the
float64 gelu'(x) (with erfc: 1 + erf(x) cancels in the tail even in float64).  Prints the max relative error of gelu' (away from its zero
near x = -0.7518, where the absolute error is given), and how many 16-bit
outputs round(gelu'(x)) differ from the correctly rounded float64 value, for the
fast formula and for the library one (erf / exp in float64 rounded to float32,
a stand-in for erff / expf's <= 2 ulp).
    python notes/half16_accuracy.py [ROOT]   (an unpatched ROOT: the constants from notes/wip/gelu16_backward.patch)"""
import math
import re
import sys

import ml_dtypes
import numpy as np

root = sys.argv[1] if len(sys.argv) > 1 else "."
src = open(f"{root}/kernels/activation_math.cuh").read()
if "gelu_derivative_fast(float v)" not in src:  # an unpatched tree: the patch's added lines
    src = "\n".join(line[1:] for line in open(f"{root}/notes/wip/gelu16_backward.patch").read().splitlines()
                    if line.startswith("+") and not line.startswith("+++"))
body = src[src.index("gelu_derivative_fast(float v)"):]
body = body[:body.index("\n}\n")]
consts = [np.float32(c) for c in re.findall(r"(-?\d+\.\d+)f", body)]
k_e, k_t, one, c6, *cs = consts[:10]
c1, c0 = cs[-2], cs[-1]
poly = [c6] + cs  # highest first: c6, c5, ..., c0
phi_c = np.float32([c for c in consts if abs(c - 0.39894228) < 1e-6][0])
f32 = np.float32
erf = np.vectorize(math.erf)
erfc = np.vectorize(math.erfc)


def fast(x):
    x = x.astype(np.float32)
    e = np.exp2((x * (x * k_e)).astype(np.float64)).astype(np.float32)
    t = (1.0 / (np.abs(x) * k_t + one).astype(np.float64)).astype(np.float32)  # fmaf: one rounding
    p = np.full_like(x, poly[0])
    for c in poly[1:]:
        p = (p.astype(np.float64) * t + c).astype(np.float32)
    h = t * p
    r = (x.astype(np.float64) * phi_c + np.where(x < 0, h, -h)).astype(np.float32)
    return (e.astype(np.float64) * r + (x >= 0)).astype(np.float32)


def library(x):
    x = x.astype(np.float32)
    cdf = (f32(0.5) * (f32(1) + erf((x * f32(0.70710677)).astype(np.float64)).astype(np.float32)))
    ex = np.exp((f32(-0.5) * x * x).astype(np.float64)).astype(np.float32)
    return (cdf + x * f32(0.3989423) * ex).astype(np.float32)


def exact(x):
    x = x.astype(np.float64)
    return 0.5 * erfc(-x / math.sqrt(2)) + x / math.sqrt(2 * math.pi) * np.exp(-0.5 * x * x)  # erfc: no cancellation


def report(name, x, dtype):
    x = x[np.isfinite(x.astype(np.float32))]
    ref = exact(x)
    ref16 = ref.astype(dtype)
    for label, fn in (("fast", fast), ("library", library)):
        got = fn(x).astype(np.float64)
        err = np.abs(got - ref)
        away = np.abs(x.astype(np.float64) + 0.7518) > 0.05
        rel = (err / np.maximum(np.abs(ref), 1e-300))[away & (np.abs(ref) > 1e-30)]
        out16 = got.astype(dtype)
        diff = (out16.astype(np.float64) != ref16.astype(np.float64)).sum()
        for lo, hi in ((-np.inf, -3), (-3, 0), (0, np.inf)):
            sel = ((x >= lo) & (x < hi))[away & (np.abs(ref) > 1e-30)]
            print(f"    x in [{lo}, {hi}): max rel err {rel[sel].max():.2e}")
        print(f"{name:9s} {label:8s} n {x.size:7d}  max rel err of gelu' {rel.max():.2e}"
              f" (2^{math.log2(rel.max()):.1f})  max abs err {err.max():.2e}"
              f"  16-bit outputs != correctly rounded: {diff} ({100 * diff / x.size:.3f} %)")
    return fast(x)


x16 = np.arange(65536, dtype=np.uint16).view(np.float16)
report("float16", x16, np.float16)
b = np.arange(65536, dtype=np.uint16).view(ml_dtypes.bfloat16)
b = b[np.abs(b.astype(np.float32)) <= 16]
report("bfloat16", b, ml_dtypes.bfloat16)
# large |x|: the exact limits (1 for x >> 0, 0 for x << 0)
big = np.array([14.5, 20, 100, 65504, -14.5, -20, -65504, 0.0, -0.0], np.float32)
print("large |x| / zeros:", dict(zip(big.tolist(), fast(big).tolist())))

# ---- softmax forward, 16-bit output: y = e * (1 / s) (main) against
# y = 2^((x - m) log2(e) - log2 s) (notes/wip/softmax16_forward.patch), both in
# float32 steps (ex2 taken as exact), then rounded to the storage type; columns
# of 256 values (the channel axis of the benchmark), x uniform in [-8, 8] and
# N(0, 3), against the float64 softmax rounded once.
rng = np.random.default_rng(0)
L = np.float32(1.4426950408889634)
for dtype in (np.float16, ml_dtypes.bfloat16):
    for label, x in (("U(-8,8)", rng.uniform(-8, 8, (256, 4096))), ("N(0,3)", rng.normal(0, 3, (256, 4096)))):
        x = x.astype(dtype).astype(np.float32)
        m = x.max(0)
        d = (x - m).astype(np.float32)
        e = np.exp2((d * L).astype(np.float64)).astype(np.float32)
        s = e.sum(0, dtype=np.float64).astype(np.float32)
        y_main = (e * (np.float32(1) / s)).astype(np.float32)
        y_new = np.exp2((d.astype(np.float64) * L - np.log2(s).astype(np.float32)).astype(np.float32)
                        .astype(np.float64)).astype(np.float32)
        x64 = x.astype(np.float64)
        ref = np.exp(x64 - x64.max(0))
        ref /= ref.sum(0)
        r16 = ref.astype(dtype).astype(np.float64)
        for tag, y in (("main", y_main), ("patch", y_new)):
            y16 = y.astype(dtype).astype(np.float64)
            norm = np.linalg.norm(y16 - ref) / np.linalg.norm(ref)
            print(f"softmax {np.dtype(dtype).name:8s} {label:8s} {tag:5s} normwise err {norm:.2e}  "
                  f"outputs != correctly rounded {100 * (y16 != r16).mean():.3f} %  "
                  f"max rel err before rounding {np.max(np.abs(y - ref) / ref):.1e}")
