"""Depthwise and fused-epilogue timings (issue 3, helper conv_dw), on the GPU machine.

    python notes/bench_conv_dw.py

1. The depthwise kernels alone (DEPTHWISE.run, no argument checking) and the
   public call, against PyTorch/cuDNN, for mbv2_dw_112 / mbv2_dw_28 at batch 32
   and 1, each direction, with the floor bytes (read x or dy, write y or dx;
   backward filter reads x and dy) and the fraction of copy bandwidth reached.
2. Fused vs unfused bias + relu forward on r50_2_3x3 (implicit_gemm) and
   mbv2_dw_112 (depthwise), batch 32.
"""
import cupy
import numpy as np
import torch

import dnnprims as dp
from dnnprims.algos import REGISTRY
from dnnprims.bench import timing
from dnnprims.conv import _describe

torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = False
COPY_TBS = 3.0


def rand(shape):
    a = cupy.random.random(shape, dtype=cupy.float32)
    a -= 0.5
    return a


def t(fn, inputs=None, repeat=50):
    return timing.measure(fn, inputs, xp=cupy, warmup=3, repeat=repeat).median_ms


def main():
    rows = []
    dw = REGISTRY["depthwise"]
    for name, N, C, H in (("mbv2_dw_112", 32, 96, 112), ("mbv2_dw_112", 1, 96, 112),
                          ("mbv2_dw_28", 32, 192, 28), ("mbv2_dw_28", 1, 192, 28)):
        p = _describe((N, C, H, H), (C, 1, 3, 3), 1, 1, 1, C, "NCHW", np.float32)
        x, w, dy = rand(p.x_shape), rand(p.w_shape), rand(p.y_shape)
        tx, tw, tdy = (torch.from_dlpack(a) for a in (x, w, dy))
        opts = dict(stride=1, padding=1, groups=C)
        y, dx, dwt = cupy.empty(p.y_shape, np.float32), cupy.empty(p.x_shape, np.float32), cupy.empty(p.w_shape, np.float32)
        nbytes = x.nbytes
        for direction, kernel, public, theirs, floor, check in (
            ("forward", lambda: dw.run(p, "forward", x, w, y),
             lambda: dp.conv2d_forward(x, w, **opts),
             lambda: torch.nn.functional.conv2d(tx, tw, **opts), 2 * nbytes,
             lambda: (dp.conv2d_forward(x, w, **opts), torch.nn.functional.conv2d(tx, tw, **opts))),
            ("backward_data", lambda: dw.run(p, "backward_data", dy, w, dx),
             lambda: dp.conv2d_backward_data(dy, w, p.x_shape, **opts),
             lambda: torch.nn.grad.conv2d_input(p.x_shape, tw, tdy, **opts), 2 * nbytes,
             lambda: (dp.conv2d_backward_data(dy, w, p.x_shape, **opts),
                      torch.nn.grad.conv2d_input(p.x_shape, tw, tdy, **opts))),
            ("backward_filter", lambda: dw.run(p, "backward_filter", x, dy, dwt),
             lambda: dp.conv2d_backward_filter(x, dy, p.w_shape, **opts),
             lambda: torch.nn.grad.conv2d_weight(tx, p.w_shape, tdy, **opts), 2 * nbytes,
             lambda: (dp.conv2d_backward_filter(x, dy, p.w_shape, **opts),
                      torch.nn.grad.conv2d_weight(tx, p.w_shape, tdy, **opts))),
        ):
            ours, theirs_out = check()
            ref = cupy.from_dlpack(theirs_out)
            err = float(cupy.linalg.norm(ours - ref) / cupy.linalg.norm(ref))
            k_ms, pub_ms, th_ms = t(kernel), t(public), t(theirs)
            rows.append((name, N, direction, k_ms, pub_ms, th_ms, th_ms / pub_ms, th_ms / k_ms,
                         floor / (k_ms * 1e-3) / 1e12 / COPY_TBS, err))

    fused = []
    for name, N, C, H, K, R, pad, groups in (("r50_2_3x3", 32, 64, 56, 64, 3, 1, 1),
                                             ("mbv2_dw_112", 32, 96, 112, 96, 3, 1, 96)):
        x, w, b = rand((N, C, H, H)), rand((K, C // groups, R, R)), rand((K,))
        opts = dict(padding=pad, groups=groups)
        algo = dp.conv2d_choose(x.shape, w.shape, **opts)[0]
        f_ms = t(lambda: dp.conv2d_forward(x, w, b, activation="relu", **opts))
        u_ms = t(lambda: dp.activation(dp.conv2d_forward(x, w, b, **opts), "relu"))
        n_ms = t(lambda: dp.conv2d_forward(x, w, b, **opts))
        g = dp.conv2d_forward(x, w, b, activation="relu", **opts)
        r = dp.activation(dp.conv2d_forward(x, w, b, **opts), "relu")
        fused.append((name, algo, n_ms, f_ms, u_ms, float(cupy.abs(g - r).max())))

    print("\n== depthwise, fp32 NCHW (kernel = DEPTHWISE.run alone; public = dp.conv2d_*)")
    print("| problem | N | direction | kernel ms | public ms | cuDNN ms | cuDNN/public | cuDNN/kernel | kernel of copy BW | rel err vs torch |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.4f} | {r[4]:.4f} | {r[5]:.4f} | {r[6]:.2f} | {r[7]:.2f} | {r[8]:.2f} | {r[9]:.1e} |")
    print("\n== fused bias+relu forward, batch 32, fp32 NCHW")
    print("| problem | algorithm | conv+bias ms | fused relu ms | conv+bias then relu ms | max |fused-unfused| |")
    print("|---|---|---|---|---|---|")
    for r in fused:
        print(f"| {r[0]} | {r[1]} | {r[2]:.4f} | {r[3]:.4f} | {r[4]:.4f} | {r[5]:.1e} |")


if __name__ == "__main__":
    main()
