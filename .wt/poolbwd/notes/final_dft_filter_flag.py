"""Lead, session 3: does dft.FUSED_FILTER (the rewritten dft_filter_spectrum) pay on
big_7x7_s1 (N32 C64 56x56 K64 7x7 pad 3) and alex_conv2_5x5?  Times the public call with
algo="dft" both ways and cuDNN (benchmark mode, TF32 off), median of CUDA-event timings,
and checks each against the other (the GPU test of the kernel is tests/test_conv_dft.py).

    PYTHONPATH=$PWD python notes/final_dft_filter_flag.py
"""
import cupy
import numpy as np
import torch

import dnnprims as dp
from dnnprims.algos import dft
from dnnprims.bench.timing import measure

torch.backends.cudnn.benchmark = True
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
rng = np.random.default_rng(0)
rows = []
for name, (N, C, H, K, R, pad) in {"big_7x7_s1": (32, 64, 56, 64, 7, 3),
                                   "alex_conv2_5x5": (32, 64, 27, 192, 5, 2)}.items():
    x = cupy.asarray(rng.standard_normal((N, C, H, H), dtype=np.float32))
    w = cupy.asarray(rng.standard_normal((K, C, R, R), dtype=np.float32))
    tx, tw = torch.as_tensor(x, device="cuda"), torch.as_tensor(w, device="cuda")
    t_torch = measure(lambda: torch.nn.functional.conv2d(tx, tw, padding=pad), xp=cupy, warmup=5, repeat=50).median_ms
    outs = {}
    for flag in (False, True):
        dft.FUSED_FILTER = flag
        f = lambda: dp.conv2d_forward(x, w, padding=pad, algo="dft")
        outs[flag] = f()
        t = measure(f, xp=cupy, warmup=5, repeat=50).median_ms
        rows.append((name, flag, t, t_torch))
    diff = float(cupy.linalg.norm(outs[True] - outs[False]) / cupy.linalg.norm(outs[False]))
    rows.append((name, "rel diff on/off", diff, None))
dft.FUSED_FILTER = False
print("== dft FUSED_FILTER (forward, ms): problem, flag, ours, cuDNN, cuDNN/ours")
for name, flag, t, tt in rows:
    print(f"{name:16s} {flag!s:16s} {t:.4g}" + (f" {tt:.4f} {tt / t:.2f}" if tt else ""))
