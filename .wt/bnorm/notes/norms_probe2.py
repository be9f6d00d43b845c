"""Second A/B probe of the norms helper (after run 1): reduce over (0, 2, 3) by the
one-launch planes kernel vs the rows + columns stages, and the 16-bit channel
softmax forward with the axis in registers (pairs) vs the pairs tile.
python notes/norms_probe2.py [OUT.json]"""
import json
import sys

import cupy as cp
import numpy as np

import dnnprims as dp
from dnnprims import softmaxes, tensor_ops
from dnnprims.bench import timing

COPY = 3000.0  # GB/s, measured 3002 in the last full run (not re-measured: budget)
rows = []


def t(fn):
    fn()
    cp.cuda.get_current_stream().synchronize()
    return timing.measure(fn, xp=cp, warmup=3, repeat=30).median_ms


def ab(name, floor, fn, set_new, set_old, torch_fn=None):
    try:
        set_old()
        old = t(fn)
        set_new()
        new = t(fn)
        theirs = t(torch_fn) if torch_fn is not None else float("nan")
        r = {"case": name, "new_ms": new, "old_ms": old, "torch_ms": theirs,
             "of_copy": floor / (new * 1e-3) / 1e9 / COPY}
    except Exception as e:
        r = {"case": name, "error": f"{type(e).__name__}: {e}"[:300]}
    rows.append(r)


try:
    import torch
except Exception:
    torch = None
rng = np.random.default_rng(0)
x = cp.asarray(rng.standard_normal((64, 256, 56, 56), np.float32))
tx = torch.from_dlpack(x) if torch is not None else None


def planes(v):
    return lambda: (setattr(tensor_ops, "PLANES_MIN_OUTPUTS", 128 if v else 10**18),
                    setattr(tensor_ops, "_MEMO", type(tensor_ops._MEMO)()))


ab("reduce sum (0,2,3) (planes vs rows+columns)", x.nbytes, lambda: dp.reduce_tensor(x, (0, 2, 3), "sum"),
   planes(True), planes(False), (lambda: tx.sum(dim=(0, 2, 3))) if tx is not None else None)
del x, tx


def regs(v):
    return lambda: (setattr(softmaxes, "CHANNEL_PAIRS_REGISTERS", v), softmaxes._PLANS.clear())


for dtype, tag in ((np.float16, "fp16"), ("bfloat16", "bf16")):
    if dtype == "bfloat16":
        tt = torch.empty((64, 256, 56, 56), dtype=torch.bfloat16, device="cuda").uniform_(-1, 1)
        from dnnprims import _dtypes
        x = cp.from_dlpack(tt.view(torch.int16)).view(_dtypes.BFLOAT16)
    else:
        x = cp.asarray(rng.uniform(-1, 1, (64, 256, 56, 56)).astype(dtype))
        tt = torch.from_dlpack(x)
    for log in (False, True):
        fn = (lambda: dp.log_softmax(x, axis=1)) if log else (lambda: dp.softmax(x, axis=1))
        tf = (lambda: torch.log_softmax(tt, 1)) if log else (lambda: torch.softmax(tt, 1))
        ab(f"channel {'log_' if log else ''}softmax forward {tag} (registers pairs vs tile pairs)",
           2 * x.nbytes, fn, regs(True), regs(False), tf)
    del x, tt

print("\n== norms probe 2 (ms)")
print(f"{'case':64s} {'new':>8s} {'old':>8s} {'torch':>8s} {'x torch':>7s} {'of copy':>7s}")
for r in rows:
    if "new_ms" in r:
        print(f"{r['case']:64s} {r['new_ms']:8.4f} {r['old_ms']:8.4f} {r['torch_ms']:8.4f} "
              f"{r['torch_ms'] / r['new_ms']:7.2f} {r['of_copy']:7.2f}")
    else:
        print(f"{r['case']:64s} {r['error']}")
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump(rows, f, indent=1)
