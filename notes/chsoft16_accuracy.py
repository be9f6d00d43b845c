"""CPU emulation (float32 steps, NumPy) of the 16-bit channel softmax forward before and after
notes/wip/chsoft16.patch, against float64, on 256-long columns:
  old: e = ex2((x - m) * log2e) (FADD, FMUL), s = sum e, y = ex2((x - m) log2e) * (1 / s);
       log: y = (x - m) - log(s)
  new: e = ex2(fma(x, log2e, -M)), M = fl(m log2e), s = sum e, y = ex2(fma(x, log2e, -M)) * rcp(s);
       log: y = (x - m) - (log(s) - fma(m, log2e, -M) ln 2)
ex2 / rcp / log as correctly rounded float32 (their ~2^-22 hardware errors are below the 16-bit
storage rounding); fma as float64 (x is 16-bit: x log2e is exact in float64) rounded to float32.
Prints the normwise error and the fraction of 16-bit outputs that differ from the correctly
rounded result, for data centred at 0 and shifted by large offsets (where a rounded M matters).
    python notes/chsoft16_accuracy.py
"""
import ml_dtypes
import numpy as np

F = np.float32
C = F(1.4426950408889634)
LN2 = F(0.6931471805599453)


def ex2(v):
    return F(np.exp2(v.astype(np.float64))) if np.ndim(v) == 0 else np.exp2(v.astype(np.float64)).astype(F)


def fma(a, b, c):
    return (a.astype(np.float64) * np.float64(b) + c.astype(np.float64)).astype(F)


def forward(x16, log, new):
    x = x16.astype(F)
    m = x.max(axis=0, keepdims=True)
    if new:
        neg_m = -(m * C)
        arg = fma(x, C, neg_m)
    else:
        arg = (x - m) * C
    s = ex2(arg).sum(axis=0, keepdims=True, dtype=F)
    if log:
        big_l = np.log(s).astype(F) - (fma(m, C, neg_m) * LN2 if new else F(0))
        return ((x - m) - big_l).astype(x16.dtype)
    return (ex2(arg) * (F(1) / s)).astype(x16.dtype)


def main():
    rng = np.random.default_rng(0)
    print(f"{'dtype':9s} {'data':18s} {'op':12s} {'old err':>9s} {'new err':>9s} {'old !=rn':>9s} {'new !=rn':>9s}")
    for dtype in (np.float16, ml_dtypes.bfloat16):
        for label, low, high, shift in (("U(-8, 8)", -8, 8, 0), ("U(-8, 8) + 1000", -8, 8, 1000),
                                        ("U(-20, 20) + 30000", -20, 20, 30000), ("U(-8, 8) - 5000", -8, 8, -5000)):
            x16 = (rng.uniform(low, high, (256, 4096)) + shift).astype(dtype)
            x64 = x16.astype(np.float64)
            for log in (False, True):
                z = x64 - x64.max(axis=0)
                want = z - np.log(np.exp(z).sum(axis=0)) if log else np.exp(z) / np.exp(z).sum(axis=0)
                rounded = want.astype(dtype).astype(np.float64)
                out = []
                for new in (False, True):
                    got = forward(x16, log, new).astype(np.float64)
                    err = np.linalg.norm(got - want) / np.linalg.norm(want)
                    out.append((err, np.mean(got != rounded)))
                print(f"{np.dtype(dtype).name:9s} {label:18s} {'log_softmax' if log else 'softmax':12s} "
                      f"{out[0][0]:9.2e} {out[1][0]:9.2e} {out[0][1]:9.3%} {out[1][1]:9.3%}")


if __name__ == "__main__":
    main()
