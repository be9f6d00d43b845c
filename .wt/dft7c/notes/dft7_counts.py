"""FLOPs and bytes of each stage of "dft" forward (= backward data on these square,
C = K layers) for the big_7x7_s1 / big_11x11_s1 layers at batch 32, float32
(helper dft7, notes/dft7.md).  Real FLOPs: a complex MAC = 8, a real x complex = 4."""
import numpy as np

from dnnprims.algos import dft
from dnnprims.conv import _describe

for name, (N, C, H, K, R, pad) in {"big_7x7_s1": (32, 64, 56, 64, 7, 3),
                                   "big_11x11_s1": (32, 32, 64, 32, 11, 5)}.items():
    p = _describe((N, C, H, H), (K, C, R, R), (1, 1), (pad, pad), (1, 1), 1, "NCHW", np.dtype("float32"))
    g = dft.Geometry(p, "forward")
    T0, T1 = g.T
    h, F = g.half, g.frequencies
    P = Q = H
    MB = 1e6
    x = N * C * H * H * 4
    a1 = H * h * N * C * 8
    Z = F * N * C * 8
    G = F * C * K * 8
    Y = F * N * K * 8
    Yp = P * h * N * K * 8
    y = N * K * P * Q * 4
    stages = [
        ("filter spectrum (fused kernel)", C * K * T0 * (R * R * 2 + h * R * 4) * 2, C * K * R * R * 4 + G),
        ("W-axis DFT (dft_rows_forward)", N * C * H * H * h * 4, x + a1),
        ("H-axis DFT (cGEMM %dx%d @ %dx%d)" % (T0, H, H, h * N * C), T0 * H * h * N * C * 8, a1 + Z),
        ("per-frequency cGEMM (%d x %dx%d @ %dx%d)" % (F, N, C, C, K), F * N * C * K * 8, Z + G + Y),
        ("H-axis inverse (cGEMM %dx%d)" % (P, T0), P * T0 * h * N * K * 8, Y + Yp),
        ("W-axis inverse (dft_rows_inverse)", N * K * P * h * Q * 4, Yp + y),
    ]
    direct = 2 * N * C * K * P * Q * R * R
    print(f"{name}: T = {T0} x {T1}, h = {h}, F = {F}; direct conv {direct / 1e9:.1f} GFLOP")
    print("| stage | GFLOP | MB moved | ms at 3.0 TB/s | ms at 50 TFLOP/s |")
    print("|---|---|---|---|---|")
    tf, tb = 0, 0
    for label, fl, by in stages:
        tf += fl
        tb += by
        print(f"| {label} | {fl / 1e9:.2f} | {by / MB:.1f} | {by / 3e12 * 1e3:.3f} | {fl / 50e12 * 1e3:.3f} |")
    print(f"| total | {tf / 1e9:.2f} | {tb / MB:.1f} | {tb / 3e12 * 1e3:.3f} | {tf / 50e12 * 1e3:.3f} |\n")
