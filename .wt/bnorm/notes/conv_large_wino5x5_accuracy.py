"""How accurate would Winograd F(2x2, 5x5) be in float32?  (helper conv_large;
input for a decision, nothing of it is in the library.)

The transforms come from the existing Toom-Cook generator
(dnnprims.algos.winograd.toom_cook(2, 5, points)); the three stages are run on
NumPy in float32 (transforms + per-position GEMMs over the channels) against
the float64 direct convolution, N(0, 1) data, padding 2, 27x27 images (alex).
    PYTHONPATH=. python notes/conv_large_wino5x5_accuracy.py
"""
from fractions import Fraction

import numpy as np

from dnnprims.algos.winograd import toom_cook
from dnnprims.conv import conv2d_forward


def f2x2_5x5(x, w, points, acc=np.float32, m=2, r=5):
    at, g, bt = (np.array([[float(v) for v in row] for row in mat], dtype=acc)
                 for mat in toom_cook(m, r, points))
    alpha = m + r - 1
    N, C, H, W = x.shape
    K = w.shape[0]
    pad = r // 2
    P, Q = H, W
    th, tw = -(-P // m), -(-Q // m)
    canvas = np.zeros((N, C, th * m + r - 1, tw * m + r - 1), acc)
    canvas[:, :, pad:pad + H, pad:pad + W] = x
    s = canvas.strides
    tiles = np.lib.stride_tricks.as_strided(canvas, (N, C, th, tw, alpha, alpha),
                                            (s[0], s[1], m * s[2], m * s[3], s[2], s[3]))
    v = np.einsum("ai,nctuij,bj->abcntu", bt, tiles, bt).reshape(alpha * alpha, C, -1)
    u = np.einsum("ai,kcij,bj->abkc", g, w.astype(acc), g).reshape(alpha * alpha, K, C)
    mm = np.matmul(u, v).reshape(alpha, alpha, K, N, th, tw)
    y = np.einsum("ia,abkntu,jb->nktiuj", at, mm, at).reshape(N, K, th * m, tw * m)
    return y[:, :, :P, :Q]


def main():
    rng = np.random.default_rng(0)
    half = Fraction(1, 2)
    sets = {"0,+-1,+-2,inf": (0, 1, -1, 2, -2, None),
            "0,+-1,+-1/2,inf": (0, 1, -1, half, -half, None)}
    print("| C | K | direct fp32 | " + " | ".join(f"F(2x2,5x5) {k}" for k in sets) + " |")
    print("|---|---|---|" + "---|" * len(sets))
    for C, K in ((16, 16), (64, 64), (64, 192), (256, 256)):
        x = rng.standard_normal((1, C, 27, 27))
        w = rng.standard_normal((K, C, 5, 5))
        ref = conv2d_forward(x, w, padding=2)
        direct = conv2d_forward(x.astype(np.float32), w.astype(np.float32), padding=2)
        errs = [np.linalg.norm(direct - ref) / np.linalg.norm(ref)]
        for pts in sets.values():
            y = f2x2_5x5(x.astype(np.float32), w.astype(np.float32), pts)
            errs.append(np.linalg.norm(y - ref) / np.linalg.norm(ref))
        print(f"| {C} | {K} | " + " | ".join(f"{e:.1e}" for e in errs) + " |")


if __name__ == "__main__":
    main()
