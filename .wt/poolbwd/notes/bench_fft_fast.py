"""Device script of helper fft_fast: "fft" per buffer layout / fast path on the
three FFT problems at batch 32, all directions, side by side with cuDNN.
Times with dnnprims.bench.timing.measure (CUDA events, median, inputs rotated).
    python notes/bench_fft_fast.py
"""
import cupy
import numpy as np

import dnnprims
from dnnprims.algos import fft
from dnnprims.bench.timing import measure

PROBLEMS = [("big_7x7_s1", 32, 64, 56, 64, 7, 3), ("big_11x11_s1", 32, 32, 64, 32, 11, 5),
            ("alex_conv2_5x5", 32, 64, 27, 192, 5, 2)]
VARIANTS = [("fast strided", "strided", True), ("fast spatial", "spatial_first", True),
            ("generic strided", "strided", False)]


def main():
    import torch
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    rows = []
    rng = np.random.default_rng(0)
    for name, N, C, H, K, R, pad in PROBLEMS:
        x = cupy.asarray(rng.standard_normal((N, C, H, H), dtype=np.float32))
        w = cupy.asarray(rng.standard_normal((K, C, R, R), dtype=np.float32))
        b = cupy.asarray(rng.standard_normal(K, dtype=np.float32))
        dy = cupy.asarray(rng.standard_normal((N, K, H, H), dtype=np.float32))
        calls = {
            "forward": lambda algo: dnnprims.conv2d_forward(x, w, b, padding=pad, algo=algo),
            "backward_data": lambda algo: dnnprims.conv2d_backward_data(dy, w, x.shape, padding=pad, algo=algo),
            "backward_filter": lambda algo: dnnprims.conv2d_backward_filter(x, dy, w.shape, padding=pad, algo=algo),
        }
        tx, tw, tb, tdy = (torch.from_dlpack(a) for a in (x, w, b, dy))
        F = torch.nn.functional
        torch_calls = {
            "forward": lambda: F.conv2d(tx, tw, tb, padding=pad),
            "backward_data": lambda: torch.nn.grad.conv2d_input(tuple(x.shape), tw, tdy, padding=pad),
            "backward_filter": lambda: torch.nn.grad.conv2d_weight(tx, tuple(w.shape), tdy, padding=pad),
        }
        ref = {d: calls[d]("gemm") for d in calls}
        for direction, call in calls.items():
            t_cudnn = measure(torch_calls[direction], xp=cupy, warmup=5, repeat=30).median_ms
            row = [name, direction, t_cudnn]
            for _, layout, fast in VARIANTS:
                fft.LAYOUT, fft.FAST = layout, fast
                out = call("fft")
                err = float(cupy.linalg.norm(out - ref[direction]) / cupy.linalg.norm(ref[direction]))
                row.append((measure(lambda: call("fft"), xp=cupy, warmup=5, repeat=30).median_ms, err))
            fft.LAYOUT, fft.FAST = "strided", True
            rows.append(row)
    print("\n| problem | direction | cuDNN ms | " + " | ".join(v[0] + " ms (err vs gemm)" for v in VARIANTS)
          + " | cuDNN / best fft |")
    print("|---|---|---|" + "---|" * len(VARIANTS) + "---|")
    for r in rows:
        best = min(t for t, _ in r[3:])
        print(f"| {r[0]} | {r[1]} | {r[2]:.3f} | " + " | ".join(f"{t:.3f} ({e:.1e})" for t, e in r[3:])
              + f" | {r[2] / best:.2f} |")


if __name__ == "__main__":
    main()
