"""A/B of helper gnbwd's group-norm backward paths on the GPU (same process, same
data): norm_rows_backward ("old"), gn_rows_backward_pipelined "x" / "both"
(row_normalization.PIPELINED_BACKWARD) with and without PIPELINED_BACKWARD_LATE /
_BULK (run 1 also had "xl2": slower), PyTorch's native backward, and
cupy's x + dy (2 reads + 1 write, the same traffic mix as the backward: the
practical ceiling of this mix).  float32, float16, bfloat16 at 64x256x56x56 /
32 groups.  From the repository root:  python notes/gnbwd_probe.py [OUT.json]
Times: medians of CUDA-event intervals (dnnprims.bench.timing, as the bench);
"of copy" = floor bytes (3x the tensor: read x, dy; write dx) / time / the copy
bandwidth measured here."""
import json
import sys

import cupy as cp
import numpy as np

import dnnprims as dp
from dnnprims import _dtypes, row_normalization as rn
from dnnprims.bench import timing

copy = timing.measure_ceilings(cp, copy_bytes=2**29, gemm_size=1024, repeat=5)["copy_GBps"]
print(f"copy {copy:.0f} GB/s", flush=True)
import torch
aten = torch.ops.aten


def t(fn, repeat=30):
    fn()
    cp.cuda.get_current_stream().synchronize()
    return timing.measure(fn, xp=cp, warmup=3, repeat=repeat).median_ms


def f32(a):
    if a.dtype.name == "bfloat16":
        return cp.from_dlpack(torch.from_dlpack(a.view(cp.int16)).view(torch.bfloat16).float())
    return a.astype(cp.float32)


rows = []
N, C, H, W, G = 64, 256, 56, 56, 32
x32 = cp.random.default_rng(0).standard_normal((N, C, H, W), dtype=cp.float32)
dy32 = cp.random.default_rng(1).standard_normal((N, C, H, W), dtype=cp.float32)
g32 = cp.random.default_rng(2).uniform(0.5, 1.5, C).astype(cp.float32)
for name in ("float32", "float16", "bfloat16"):
    tt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]
    tx, tdy = torch.from_dlpack(x32).to(tt), torch.from_dlpack(dy32).to(tt)
    if name == "bfloat16":
        x = cp.from_dlpack(tx.view(torch.int16)).view(_dtypes.BFLOAT16)
        dy = cp.from_dlpack(tdy.view(torch.int16)).view(_dtypes.BFLOAT16)
    else:
        x, dy = cp.from_dlpack(tx), cp.from_dlpack(tdy)
    gamma = g32 if x.itemsize == 2 else g32.astype(x.dtype)
    _, mean, rstd = dp.group_norm(x, G, return_stats=True)
    floor = 3 * x.nbytes
    row = {"dtype": name, "floor_bytes": floor}
    tout = torch.empty_like(tx)
    row["torch x+dy"] = t(lambda: torch.add(tx, tdy, out=tout))
    if name == "float32":
        out = cp.empty_like(x)
        row["cupy x+dy"] = t(lambda: cp.add(x, dy, out=out))
    if name == "float32":  # forward (2 x the tensor) for reference: the pipelined forward's fraction
        row["fwd, ms x1.5 (of copy over 2x)"] = t(lambda: dp.group_norm(x, G, gamma, gamma)) * 1.5
    tg = torch.from_dlpack(g32).to(tt)
    _, tmean, trstd = aten.native_group_norm(tx, tg, None, N, C, H * W, G, 1e-5)
    row["torch"] = t(lambda: aten.native_group_norm_backward(tdy, tx, tmean, trstd, tg, N, C, H * W, G,
                                                             [True, True, True]))
    ref = None
    for label, mode, late, bulk in (("old", None, False, False), ("x", "x", False, False),
                                    ("x late", "x", True, False), ("x bulk", "x", False, True),
                                    ("x late bulk", "x", True, True), ("both", "both", False, False),
                                    ("both bulk", "both", False, True)):
        if name != "float32" and label.startswith("x "):
            continue
        rn.PIPELINED_BACKWARD, rn.PIPELINED_BACKWARD_LATE, rn.PIPELINED_BACKWARD_BULK = mode, late, bulk
        try:
            fn = lambda: dp.group_norm_backward(dy, x, G, gamma, mean=mean, rstd=rstd)  # noqa: E731
            row[label] = t(fn)
            got = [f32(a) for a in fn()]
            if ref is None:
                ref = got
            else:
                row[label + " diff"] = [float(cp.abs(a - b).max()) for a, b in zip(got, ref)]
        except Exception as e:  # noqa: BLE001
            row[label + "_error"] = f"{type(e).__name__}: {e}"[:300]
    rn.PIPELINED_BACKWARD, rn.PIPELINED_BACKWARD_LATE, rn.PIPELINED_BACKWARD_BULK = None, False, False
    rows.append(row)
    print(row, flush=True)
    del x, dy, tx, tdy, tout

print(f"\ncopy {copy:.0f} GB/s; floor = 3 x tensor")
print("| dtype | path | ms | GB/s | of copy | torch / path |")
print("|---|---|---|---|---|---|")
for r in rows:
    for k, v in r.items():
        if not isinstance(v, float) or k == "floor_bytes":
            continue
        gbs = r["floor_bytes"] / (v * 1e-3) / 1e9
        th = r.get("torch")
        print(f"| {r['dtype']} | {k} | {v:.4f} | {gbs:.0f} | {gbs / copy:.3f} | "
              f"{'' if th is None else round(th / v, 2)} |")
for r in rows:
    for k, v in r.items():
        if k.endswith("_error") or k.endswith(" diff"):
            print(r["dtype"], k, v)
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump({"copy_GBps": copy, "rows": rows}, f, indent=1)
