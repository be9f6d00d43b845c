"""Channel-last batch norm, small problem: host us per call (bursts of 100) and
CUDA-event ms per call over a loop of 200 calls (the GPU-or-host bound), this
tree against PyTorch (channels_last) in the same process.  Run once with the
main tree and once with this branch on PYTHONPATH for before / after.
    python notes/bnf16_probe.py LABEL"""
import sys

import numpy as np
import cupy as cp
import dnnprims as dp
from dnnprims.bench.overhead import per_call_us


def loop_ms(fn, calls=200):
    for _ in range(10):
        fn()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    cp.cuda.get_current_stream().synchronize()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / calls


def main():
    label = sys.argv[1] if len(sys.argv) > 1 else "?"
    import torch
    import torch.nn.functional as F
    rng = np.random.default_rng(0)
    rows = []
    for shape in ((32, 7, 7, 256), (32, 14, 14, 256)):
        c = shape[-1]
        x = cp.asarray(rng.random(shape, dtype=np.float32))
        dy = cp.asarray(rng.random(shape, dtype=np.float32))
        g, b = cp.ones(c, np.float32), cp.zeros(c, np.float32)
        rm, rv = cp.zeros(c, np.float32), cp.ones(c, np.float32)
        _, mean, invstd = dp.batchnorm(x, g, b, layout="NHWC", return_stats=True)
        tx = torch.as_tensor(x, device="cuda").permute(0, 3, 1, 2)  # channels_last view
        tg, tb = torch.ones(c, device="cuda"), torch.zeros(c, device="cuda")
        trm, trv = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
        tdy = torch.as_tensor(dy, device="cuda").permute(0, 3, 1, 2)
        tsave = torch.ops.aten.native_batch_norm(tx, tg, tb, trm, trv, True, 0.1, 1e-5)
        cases = {
            "train": (lambda: dp.batchnorm(x, g, b, rm, rv, training=True, layout="NHWC"),
                      lambda: F.batch_norm(tx, trm, trv, tg, tb, True, 0.1, 1e-5)),
            "infer": (lambda: dp.batchnorm(x, g, b, rm, rv, training=False, layout="NHWC"),
                      lambda: F.batch_norm(tx, trm, trv, tg, tb, False, 0.1, 1e-5)),
            "backward": (lambda: dp.batchnorm_backward(dy, x, g, mean=mean, invstd=invstd, layout="NHWC"),
                         lambda: torch.ops.aten.native_batch_norm_backward(
                             tdy, tx, tg, trm, trv, tsave[1], tsave[2], True, 1e-5, [True, True, True])),
        }
        for name, (ours, theirs) in cases.items():
            rows.append((f"{name} NHWC {'x'.join(map(str, shape))}", per_call_us(ours, cp, calls=500),
                         per_call_us(theirs, cp, calls=500), loop_ms(ours), loop_ms(theirs)))
    print(f"[{label}] {'case':30s} {'host us':>8s} {'torch':>7s} {'loop ms':>8s} {'torch':>7s}")
    for r in rows:
        print(f"[{label}] {r[0]:30s} {r[1]:8.1f} {r[2]:7.1f} {r[3]:8.4f} {r[4]:7.4f}")


if __name__ == "__main__":
    main()
