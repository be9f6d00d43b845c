"""A/B of the softmax3 paths on the GPU, in one process (notes/softmax3_run.sh).

python notes/softmax3_probe.py OUT_DIR

1. channel_64x256x56x56 softmax / log_softmax, forward and backward, fp32 / fp16 / bf16:
   the main paths (shared-memory tile, 16-bit pairs and registers: CHANNEL_PACKS off)
   against *_channels_packs with (K packs, threads) = (8, 256), (8, 512), (4, 256),
   (4, 512); PyTorch beside them.  Writes OUT/choice.json: per (direction, log) and dtype
   the fastest, None = the main paths (the first run, 2026-11-23, chose per direction over
   softmax + log_softmax together; softmaxes.CHANNEL_PACKS now holds the per-(direction,
   log) fastest of that run's table).
2. bias_act 64x56x56x256 NHWC backward (relu, gelu; fp32, fp16): packed kernel vs the
   scalar one (both with the new row chunks and reduce).
"""
import json
import pathlib
import sys

import cupy as cp
import numpy as np
import torch

import dnnprims as dp
from dnnprims import _dtypes, activations, softmaxes
from dnnprims.bench import timing

out = pathlib.Path(sys.argv[1])
COPY = timing.measure_ceilings(cp, gemm_size=1024)["copy_GBps"]
print(f"copy {COPY:.0f} GB/s", flush=True)


def ms(fn):
    return timing.measure(fn, xp=cp, warmup=3, repeat=15).median_ms


def data(shape, dtype, low, high):
    tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    t = torch.empty(shape, dtype=tdt, device="cuda").uniform_(low, high)
    if dtype == "bfloat16":
        return t, cp.from_dlpack(t.view(torch.int16)).view(_dtypes.BFLOAT16)
    return t, cp.from_dlpack(t)


CTYPE = {"float32": "float", "float16": "half_t", "bfloat16": "bfloat16_t"}
VARIANTS = [None, (8, 256), (8, 512), (4, 256), (4, 512)]
shape, axis = (64, 256, 56, 56), 1
results, choice = [], {}
saved = dict(softmaxes.CHANNEL_PACKS)
for dtype in ("float32", "float16", "bfloat16"):
    tx, x = data(shape, dtype, -4, 4)
    tdy, dy = data(shape, dtype, -1, 1)
    nbytes = x.nbytes
    per = {}
    for log in (False, True):
        fwd, bwd = (dp.log_softmax, dp.log_softmax_backward) if log else (dp.softmax, dp.softmax_backward)
        y = fwd(x, axis=axis)
        ty = torch.log_softmax(tx, axis) if log else torch.softmax(tx, axis)
        tb = torch._log_softmax_backward_data if log else torch._softmax_backward_data
        torch_f = ms(lambda: (torch.log_softmax if log else torch.softmax)(tx, axis))
        torch_b = ms(lambda: tb(tdy, ty, axis, ty.dtype))
        ref_f = np.asarray(fwd(x, axis=axis)[:2].get(), np.float32)
        for v in VARIANTS:
            softmaxes.CHANNEL_PACKS = {key: ({CTYPE[dtype]: v} if v else {}) for key in saved}
            softmaxes._PLANS.clear()
            softmaxes._FAST.clear()
            f_ms, b_ms = ms(lambda: fwd(x, axis=axis)), ms(lambda: bwd(dy, y, axis=axis))
            diff = float(np.abs(np.asarray(fwd(x, axis=axis)[:2].get(), np.float32) - ref_f).max())
            name = "main" if v is None else f"packs{v[0]}x{v[1]}"
            for direction, t, tt, floor in (("forward", f_ms, torch_f, 2 * nbytes), ("backward", b_ms, torch_b, 3 * nbytes)):
                per[(direction, log, name)] = t
                row = {"op": f"{'log_softmax' if log else 'softmax'} {direction}", "dtype": dtype, "path": name,
                       "ms": t, "torch_ms": tt, "ratio": tt / t, "of_copy": floor / (t * 1e-3) / 1e9 / COPY,
                       "max_diff_vs_first": diff}
                results.append(row)
                print(f"{row['op']:22s} {dtype:8s} {name:12s} {t:.4f} ms  torch {tt:.4f}  x{row['ratio']:.2f}  "
                      f"{row['of_copy']:.2f} of copy  diff {diff:.1e}", flush=True)
        del y, ty
    for direction in ("forward", "backward"):
        for log in (False, True):
            best = min(VARIANTS, key=lambda v: per[(direction, log, "main" if v is None else f"packs{v[0]}x{v[1]}")])
            choice.setdefault(f"{direction} {log}", {})[CTYPE[dtype]] = best
    del x, dy, tx, tdy
    cp.get_default_memory_pool().free_all_blocks()
softmaxes.CHANNEL_PACKS = saved
(out / "choice.json").write_text(json.dumps(choice))
print("choice", choice, flush=True)

shape_nhwc = (64, 56, 56, 256)
for dtype in ("float32", "float16"):
    _, x = data(shape_nhwc, dtype, -3, 3)
    _, dy = data(shape_nhwc, dtype, -1, 1)
    _, b = data((256,), dtype, -1, 1)
    for mode in ("relu", "gelu"):
        times = {}
        for packed in (True, False):
            activations.NHWC_PACKED = packed
            times[packed] = ms(lambda: dp.bias_activation_backward(dy, x, b, mode, layout="NHWC"))
        activations.NHWC_PACKED = True
        of = 3 * x.nbytes / (times[True] * 1e-3) / 1e9 / COPY
        row = {"op": f"bias_activation {mode} backward NHWC", "dtype": dtype, "packed_ms": times[True],
               "scalar_ms": times[False], "of_copy": of}
        results.append(row)
        print(f"{row['op']:34s} {dtype:8s} packed {times[True]:.4f} ms ({of:.2f} of copy)  scalar {times[False]:.4f}",
              flush=True)
    del x, dy
    cp.get_default_memory_pool().free_all_blocks()
(out / "probe.json").write_text(json.dumps({"copy_GBps": COPY, "rows": results}, default=str))
