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


def big(label):
    """bn_big (64x256x56x56) backward, NCHW, fused single-read kernel against the
    two-pass path (switch FUSED), per dtype; and bn_big_nhwc with ROWS_FUSED on / off."""
    from dnnprims import _dtypes, normalization
    from dnnprims.bench.timing import measure
    rng = np.random.default_rng(0)
    for dtype, layout in ((np.float16, "NCHW"), (_dtypes.BFLOAT16, "NCHW"), (np.float32, "NCHW"),
                          (np.float32, "NHWC")):
        shape = (64, 256, 56, 56) if layout == "NCHW" else (64, 56, 56, 256)
        x = cp.asarray(rng.random(shape, dtype=np.float32)).astype(dtype)
        dy = cp.asarray(rng.random(shape, dtype=np.float32)).astype(dtype)
        p = np.float32 if dtype != np.float64 else dtype
        g, b = cp.ones(256, p), cp.zeros(256, p)
        _, mean, invstd = dp.batchnorm(x, g, b, layout=layout, return_stats=True)
        switch = "FUSED" if layout == "NCHW" else "ROWS_FUSED"
        out = []
        for on in (True, False, True, False):
            setattr(normalization, switch, on)
            fwd = measure(lambda: dp.batchnorm(x, g, b, layout=layout), xp=cp, warmup=3, repeat=20).median_ms
            bwd = measure(lambda: dp.batchnorm_backward(dy, x, g, mean=mean, invstd=invstd, layout=layout), xp=cp,
                          warmup=3, repeat=20).median_ms
            out.append(f"{switch}={int(on)} fwd {fwd:.4f} bwd {bwd:.4f}")
        setattr(normalization, switch, True)
        print(f"[{label}] big {np.dtype(dtype).name} {layout}: " + " | ".join(out), flush=True)


def main():
    label = sys.argv[1] if len(sys.argv) > 1 else "?"
    if len(sys.argv) > 2 and sys.argv[2] == "big":
        return big(label)
    import torch
    import torch.nn.functional as F
    rng = np.random.default_rng(0)
    rows, ab = [], []
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
        from dnnprims import normalization
        if hasattr(normalization, "ROWS_FUSED_MIN_ROWS"):  # A/B of the fused grid's rows per lane
            for m in (1, 8, 32, 1):
                normalization.ROWS_FUSED_MIN_ROWS = m
                ab.append((f"min_rows {m:2d} {'x'.join(map(str, shape))}", loop_ms(cases["train"][0]),
                           loop_ms(cases["backward"][0])))
            normalization.ROWS_FUSED_MIN_ROWS = 1
    print(f"[{label}] {'case':30s} {'host us':>8s} {'torch':>7s} {'loop ms':>8s} {'torch':>7s}")
    for r in rows:
        print(f"[{label}] {r[0]:30s} {r[1]:8.1f} {r[2]:7.1f} {r[3]:8.4f} {r[4]:7.4f}")
    for r in ab:
        print(f"[{label}] {r[0]:30s} train loop ms {r[1]:.4f}  backward {r[2]:.4f}")


if __name__ == "__main__":
    main()
