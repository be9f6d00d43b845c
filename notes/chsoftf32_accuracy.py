"""CPU emulation (float32 NumPy) of the float forward's two exp forms against float64, on
256-long columns: old = expf(x - m) (correctly rounded here; the device's expf is within
2 ulp), new = 2^fl(fl(x - m) * fl(log2 e)) (ex2 correctly rounded here; the device's
ex2.approx is within 2 ulp), so the difference shown is the rounding of the argument
c log2(e) alone, plus 1 / s by one Newton step from a reciprocal off by up to 1 ulp.
Normwise relative error of softmax / log_softmax and the largest elementwise relative
error of softmax (over outputs > 1e-30).
    python notes/chsoftf32_accuracy.py"""
import numpy as np

L = np.float32(1.4426950408889634)


def run(x):
    x64 = x.astype(np.float64)
    m64 = x64.max(0)
    e64 = np.exp(x64 - m64)
    want = e64 / e64.sum(0)
    want_log = (x64 - m64) - np.log(e64.sum(0))
    m = x.max(0)
    c = (x - m).astype(np.float32)
    old = np.exp(c).astype(np.float32)
    new = np.exp2((c * L).astype(np.float32).astype(np.float64)).astype(np.float32)
    out = {}
    for name, d in (("old", old), ("new", new)):
        s = d.sum(0, dtype=np.float32)
        if name == "old":
            r = (np.float32(1) / s).astype(np.float32)
        else:  # rcp.approx off by one ulp at worst, then r + r (1 - s r) in fma
            r0 = np.nextafter((np.float32(1) / s).astype(np.float32), np.float32(0))
            r = (r0.astype(np.float64) + r0.astype(np.float64) * (1 - s.astype(np.float64) * r0)).astype(np.float32)
        y = (d * r).astype(np.float32)
        ly = (c - np.log(s.astype(np.float64)).astype(np.float32)).astype(np.float32)
        big = want > 1e-30
        out[name] = (np.linalg.norm(y - want) / np.linalg.norm(want),
                     np.linalg.norm(ly - want_log) / np.linalg.norm(want_log),
                     float(np.max(np.abs(y[big] - want[big]) / want[big])))
    return out


rng = np.random.default_rng(0)
for label, shift, scale in (("uniform(-8, 8)", 0, 8), ("uniform(-30, 30)", 0, 30), ("+1000", 1000, 8),
                            ("N(0, 1)", 0, None)):
    x = (rng.standard_normal((256, 4096)) if scale is None else rng.uniform(-scale, scale, (256, 4096))) + shift
    res = run(x.astype(np.float32))
    print(f"{label:18s} " + "  ".join(
        f"{k}: softmax {v[0]:.2e} log {v[1]:.2e} max elem {v[2]:.1e}" for k, v in res.items()))
