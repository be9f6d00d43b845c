"""A/B of the channel softmax forward launch bounds (helper bw16), one process.

python notes/bw16_probe.py OUT_DIR
channel_64x256x56x56 softmax / log_softmax FORWARD, fp32 / fp16 / bf16: *_channels_packs
with (K, threads, MINB) = (8, 256, 1) (unbounded: the compiler's 78 / 96 registers),
(8, 256, 4) (64 registers, 4 blocks an SM), (4, 256, 1), (4, 256, 5) (48 registers);
PyTorch beside them.  Then batch-norm training forward, 64x256x56x56 (bn_big) in fp16 /
bf16 / fp32, with 1 and 2 chunks a block of the two-pass kernels (TRAIN_CHUNKS_PER_BLOCK).
(TRAIN_CHUNKS_PER_BLOCK was commit 7407838, reverted: notes/bw16_bn_chunks_dropped.patch;
this script needs it.)  Writes OUT/choice.json: per (log, dtype) the fastest, and the
number of output bytes (first 4 samples) that differ from the first variant's.
"""
import json
import pathlib
import sys

import cupy as cp
import numpy as np
import torch

import dnnprims as dp
from dnnprims import _dtypes, softmaxes
from dnnprims.bench import timing

out = pathlib.Path(sys.argv[1])
COPY = timing.measure_ceilings(cp, gemm_size=1024)["copy_GBps"]
print(f"copy {COPY:.0f} GB/s", flush=True)


def ms(fn):
    return timing.measure(fn, xp=cp, warmup=3, repeat=20).median_ms


def data(shape, dtype, low, high):
    tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    t = torch.empty(shape, dtype=tdt, device="cuda").uniform_(low, high)
    if dtype == "bfloat16":
        return t, cp.from_dlpack(t.view(torch.int16)).view(_dtypes.BFLOAT16)
    return t, cp.from_dlpack(t)


CTYPE = {"float32": "float", "float16": "half_t", "bfloat16": "bfloat16_t"}
VARIANTS = [(8, 256, 1), (8, 256, 4), (4, 256, 1), (4, 256, 5)]
shape, axis = (64, 256, 56, 56), 1
rows, choice = [], {}
saved = {key: dict(table) for key, table in softmaxes.CHANNEL_PACKS.items()}
for dtype in ("float16", "bfloat16", "float32"):
    tx, x = data(shape, dtype, -4, 4)
    floor = 2 * x.nbytes
    for log in (False, True):
        fwd = dp.log_softmax if log else dp.softmax
        torch_ms = ms(lambda: (torch.log_softmax if log else torch.softmax)(tx, axis))
        first, times = None, {}
        for v in VARIANTS:
            softmaxes.CHANNEL_PACKS[("forward", log)] = {CTYPE[dtype]: v}
            softmaxes._PLANS.clear()
            softmaxes._FAST.clear()
            t = ms(lambda: fwd(x, axis=axis))
            got = cp.asnumpy(fwd(x, axis=axis)[:4].view(cp.uint8))
            first = got if first is None else first
            diff = int((got != first).sum())
            times[v] = t
            row = {"op": f"{'log_softmax' if log else 'softmax'} forward", "dtype": dtype, "variant": list(v),
                   "ms": t, "torch_ms": torch_ms, "ratio": torch_ms / t,
                   "of_copy": floor / (t * 1e-3) / 1e9 / COPY, "diff_vs_first": diff}
            rows.append(row)
            print(f"{row['op']:20s} {dtype:8s} {str(v):13s} {t:.4f} ms  torch {torch_ms:.4f}  x{row['ratio']:.2f}  "
                  f"{row['of_copy']:.3f} of copy  bytes differing {diff}", flush=True)
        choice.setdefault(f"forward {log}", {})[CTYPE[dtype]] = list(min(times, key=times.get))
    softmaxes.CHANNEL_PACKS = {key: dict(table) for key, table in saved.items()}
    del x, tx
    cp.get_default_memory_pool().free_all_blocks()
from dnnprims import normalization  # noqa: E402

bn_choice = {}
for dtype in ("float16", "bfloat16", "float32"):
    tx, x = data(shape, dtype, -1, 3)
    ctype = CTYPE[dtype]
    g = cp.ones(256, cp.float32)
    b = cp.zeros(256, cp.float32)
    rm, rv = cp.zeros(256, cp.float32), cp.ones(256, cp.float32)
    tg, tb = torch.ones(256, device="cuda"), torch.zeros(256, device="cuda")
    trm, trv = torch.zeros(256, device="cuda"), torch.ones(256, device="cuda")
    torch_ms = ms(lambda: torch.nn.functional.batch_norm(tx, trm, trv, tg, tb, training=True, momentum=0.1))
    times, first = {}, None
    for cpb in (1, 2):
        normalization.TRAIN_CHUNKS_PER_BLOCK[ctype] = cpb
        t = ms(lambda: dp.batchnorm(x, g, b, rm, rv, training=True))
        got = cp.asnumpy(dp.batchnorm(x, g, b, rm, rv, training=True)[:2].view(cp.uint8))
        first = got if first is None else first
        times[cpb] = t
        of = 3 * x.nbytes / (t * 1e-3) / 1e9 / COPY
        rows.append({"op": "batchnorm train forward", "dtype": dtype, "chunks_per_block": cpb, "ms": t,
                     "torch_ms": torch_ms, "ratio": torch_ms / t, "of_copy": of,
                     "diff_vs_first": int((got != first).sum())})
        print(f"bn train forward     {dtype:8s} cpb {cpb}         {t:.4f} ms  torch {torch_ms:.4f}  "
              f"x{torch_ms / t:.2f}  {of:.3f} of copy  bytes differing {int((got != first).sum())}", flush=True)
    bn_choice[ctype] = min(times, key=times.get)
    normalization.TRAIN_CHUNKS_PER_BLOCK[ctype] = bn_choice[ctype]
    del x, tx
    cp.get_default_memory_pool().free_all_blocks()
choice["bn_chunks_per_block"] = bn_choice
(out / "choice.json").write_text(json.dumps(choice))
(out / "probe.json").write_text(json.dumps({"copy_GBps": COPY, "rows": rows}))
print("choice", choice, flush=True)
