"""A/B timings of helper gn's group-norm paths on the GPU (same process, same
data, switches in dnnprims.row_normalization), PyTorch on the same data, and
the largest difference from the first (default) path.  From the repository root:
    python notes/gn_probe.py [OUT.json]
Times: medians of CUDA-event intervals (dnnprims.bench.timing, as the bench);
"of copy" = floor bytes / time / the copy bandwidth measured here.  Floors as
the bench: forward 2x the tensor (read x, write y), backward 3x (x, dy, dx)."""
import json
import sys

import cupy as cp
import numpy as np

import dnnprims as dp
from dnnprims import row_normalization as rn
from dnnprims.bench import timing

copy = timing.measure_ceilings(cp, copy_bytes=2**29, gemm_size=1024, repeat=5)["copy_GBps"]
print(f"copy {copy:.0f} GB/s", flush=True)
rows = []


def t(fn, repeat=30):
    fn()
    cp.cuda.get_current_stream().synchronize()
    return timing.measure(fn, xp=cp, warmup=3, repeat=repeat).median_ms


def case(name, floor, fn, switches, theirs=None):
    row = {"case": name, "floor_bytes": floor}
    if theirs is not None:
        try:
            row["torch"] = t(theirs)
        except Exception as e:  # noqa: BLE001
            row["torch_error"] = f"{type(e).__name__}: {e}"[:200]
    saved = {k: getattr(rn, k) for s in switches.values() for k in s}
    ref = None
    try:
        for label, setting in switches.items():
            for k, v in setting.items():
                setattr(rn, k, v)
            try:
                ms = t(fn)
                out = fn()
                out = out[0] if isinstance(out, tuple) else out
                out = out.astype(cp.float32)
                if ref is None:
                    ref = out
                    row["max_diff"] = 0.0
                else:
                    row["max_diff"] = max(row["max_diff"], float(cp.abs(out - ref).max()))
                row[label] = ms
            except Exception as e:  # noqa: BLE001
                row[label + "_error"] = f"{type(e).__name__}: {e}"[:300]
    finally:
        for k, v in saved.items():
            setattr(rn, k, v)
    rows.append(row)
    print(row, flush=True)


try:
    import torch
    F, aten = torch.nn.functional, torch.ops.aten
except Exception:  # noqa: BLE001
    torch = None

rng = np.random.default_rng(0)
N, C, H, W, G = 64, 256, 56, 56, 32
x = cp.asarray(rng.standard_normal((N, C, H, W), np.float32))
dy = cp.asarray(rng.standard_normal((N, C, H, W), np.float32))
gamma = cp.asarray(rng.uniform(0.5, 1.5, C).astype(np.float32))
beta = cp.asarray(rng.standard_normal(C).astype(np.float32))
_, mean, rstd = dp.group_norm(x, G, gamma, beta, return_stats=True)
n = x.nbytes
tf = tb = None
if torch is not None:
    tx, tdy, tg, tb_ = (torch.as_tensor(a, device="cuda") for a in (x, dy, gamma, beta))
    _, tmean, trstd = aten.native_group_norm(tx, tg, tb_, N, C, H * W, G, 1e-5)
    tf = lambda: F.group_norm(tx, G, tg, tb_, 1e-5)  # noqa: E731
    tb = lambda: aten.native_group_norm_backward(tdy, tx, tmean, trstd, tg, N, C, H * W, G,  # noqa: E731
                                                 [True, True, True])
case("gn fwd", 2 * n, lambda: dp.group_norm(x, G, gamma, beta),
     {"pipelined": {"PIPELINED_FORWARD": True}, "old": {"PIPELINED_FORWARD": False}}, tf)
case("gn bwd", 3 * n, lambda: dp.group_norm_backward(dy, x, G, gamma, mean=mean, rstd=rstd),
     {"x": {"GN_BACKWARD": "x"}, "both": {"GN_BACKWARD": "both"}, "old": {"GN_BACKWARD": None}}, tb)
# dgamma/dbeta agree between paths
outs = {}
for mode in ("x", "both", None):
    rn.GN_BACKWARD = mode
    outs[mode] = dp.group_norm_backward(dy, x, G, gamma, mean=mean, rstd=rstd)
rn.GN_BACKWARD = "x"
for mode in ("both", None):
    for i, what in ((1, "dgamma"), (2, "dbeta")):
        a, b = outs["x"][i], outs[mode][i]
        print(f"{what} x vs {mode}: max |diff| {float(cp.abs(a - b).max()):.3g} (max |value| "
              f"{float(cp.abs(b).max()):.3g})", flush=True)

print("\n| case | path | ms | of copy | torch ms | torch / ours |")
print("|---|---|---|---|---|---|")
for r in rows:
    for k, v in r.items():
        if k in ("case", "floor_bytes", "torch", "max_diff") or k.endswith("_error"):
            continue
        of = r["floor_bytes"] / (v * 1e-3) / 1e9 / copy
        th = r.get("torch")
        print(f"| {r['case']} | {k} | {v:.4f} | {of:.3f} | {th if th is None else round(th, 4)} | "
              f"{'' if th is None else round(th / v, 2)} |")
    print(f"| {r['case']} | max diff vs first | {r.get('max_diff')} | | | |")
for r in rows:
    for k, v in r.items():
        if k.endswith("_error"):
            print(r["case"], k, v)
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump({"copy_GBps": copy, "rows": rows}, f, indent=1)
