"""A/B timings of helper norms3's paths on the GPU: each new path against the
one it replaces, same process, same data (switches in dnnprims.normalization /
dnnprims.row_normalization), plus the largest difference between the two
results.  Run on the GPU machine from the repository root:
    python notes/norms3_probe.py [OUT.json]
Times: medians of CUDA-event intervals (dnnprims.bench.timing, as the benchmark
measures); "of copy" = floor bytes / time / the copy bandwidth measured here."""
import json
import sys

import cupy as cp
import numpy as np

import dnnprims as dp
from dnnprims import normalization as bn
from dnnprims import row_normalization as rn
from dnnprims.bench import timing

rows = []
copy = timing.measure_ceilings(cp, copy_bytes=2**29, gemm_size=1024, repeat=5)["copy_GBps"]
print(f"copy {copy:.0f} GB/s", flush=True)


def t(fn, repeat=30):
    fn()
    cp.cuda.get_current_stream().synchronize()
    return timing.measure(fn, xp=cp, warmup=3, repeat=repeat).median_ms


def _first(out):
    return out[0] if isinstance(out, tuple) else out


try:
    import torch
    F, aten = torch.nn.functional, torch.ops.aten
except Exception:  # noqa: BLE001
    torch = None


def case(name, floor, fn, module, switches, theirs=None):
    """switches: {label: {switch: value}}; the first label is the default (new)
    path; theirs: PyTorch's call on the same data (timed as "torch")."""
    row = {"case": name, "floor_bytes": floor}
    if theirs is not None:
        try:
            row["torch"] = t(theirs)
            row["torch_of_copy"] = floor / (row["torch"] * 1e-3) / 1e9 / copy
        except Exception as e:  # noqa: BLE001
            row["torch_error"] = f"{type(e).__name__}: {e}"[:200]
    saved = {k: getattr(module, k) for s in switches.values() for k in s}
    ref = None
    try:
        for label, setting in switches.items():
            for k, v in setting.items():
                setattr(module, k, v)
            ms = t(fn)
            out = _first(fn()).astype(cp.float32)
            if ref is None:
                ref = out
                row["max_diff"] = 0.0
            else:
                row["max_diff"] = max(row["max_diff"], float(cp.abs(out - ref).max()))
            row[label] = ms
            row[label + "_of_copy"] = floor / (ms * 1e-3) / 1e9 / copy
    except Exception as e:  # keep going: one failure must not hide the rest
        row["error"] = f"{type(e).__name__}: {e}"[:300]
    finally:
        for k, v in saved.items():
            setattr(module, k, v)
    rows.append(row)
    print(row, flush=True)


rng = np.random.default_rng(0)
f32 = np.float32


def data(shape, dtype=f32):
    return cp.asarray(rng.uniform(-1, 1, shape).astype(dtype))


def params(c):
    return (cp.asarray(rng.uniform(0.5, 1.5, c).astype(f32)), cp.asarray(rng.uniform(-0.5, 0.5, c).astype(f32)),
            cp.zeros(c, f32), cp.ones(c, f32))


def tt(a):
    return torch.from_dlpack(a)


def torch_bn(x, dy, g, b, rm, rv, nhwc=False):
    """(train forward, backward) of PyTorch on the same data (NHWC: the channels-last view)."""
    if torch is None:
        return None, None
    tx, tdy = tt(x), tt(dy)
    if nhwc:
        tx, tdy = tx.permute(0, 3, 1, 2), tdy.permute(0, 3, 1, 2)
    tg, tb, trm, trv = tt(g), tt(b), tt(rm.copy()), tt(rv.copy())
    txg, tgg, tbg = (a.detach().clone().requires_grad_() for a in (tx, tg, tb))
    ty = F.batch_norm(txg, None, None, tgg, tbg, training=True)
    return (lambda: F.batch_norm(tx, trm, trv, tg, tb, training=True),
            lambda: torch.autograd.grad(ty, (txg, tgg, tbg), tdy, retain_graph=True))


# bn_r50_late training: grouped 16-byte kernel vs the fused one-chunk kernel.
x = data((32, 2048, 7, 7))
dy = data((32, 2048, 7, 7))
g, b, rm, rv = params(2048)
tf, tb_ = torch_bn(x, dy, g, b, rm, rv)
case("bn_r50_late train", 3 * x.nbytes, lambda: dp.batchnorm(x, g, b, rm, rv, training=True), bn,
     {"grouped": {"GROUPED": True}, "fused": {"GROUPED": False}}, tf)
# bn_big_nhwc: one-launch rows kernels vs three launches.
x = data((64, 56, 56, 256))
dy = data((64, 56, 56, 256))
g, b, rm, rv = params(256)
_, mean, invstd = dp.batchnorm(x, g, b, layout="NHWC", return_stats=True)
tf, tb_ = torch_bn(x, dy, g, b, rm, rv, nhwc=True)
case("bn_big_nhwc train", 3 * x.nbytes, lambda: dp.batchnorm(x, g, b, rm, rv, layout="NHWC"), bn,
     {"fused": {"ROWS_FUSED": True}, "three": {"ROWS_FUSED": False}}, tf)
case("bn_big_nhwc backward", 5 * x.nbytes,
     lambda: dp.batchnorm_backward(dy, x, g, mean=mean, invstd=invstd, layout="NHWC"), bn,
     {"fused": {"ROWS_FUSED": True}, "three": {"ROWS_FUSED": False}}, tb_)
del tf, tb_
del x, dy
# bn_big_f16 NCHW (not changed: where it stands).
x = data((64, 256, 56, 56), np.float16)
dy = data((64, 256, 56, 56), np.float16)
_, mean, invstd = dp.batchnorm(x, g, b, return_stats=True)
tf, tb_ = torch_bn(x, dy, g, b, rm, rv)
case("bn_big_f16 train", 3 * x.nbytes, lambda: dp.batchnorm(x, g, b, rm, rv), bn, {"now": {}}, tf)
case("bn_big_f16 backward", 5 * x.nbytes, lambda: dp.batchnorm_backward(dy, x, g, mean=mean, invstd=invstd),
     bn, {"now": {}}, tb_)
del x, dy, tf, tb_
# gn_64x256x56x56_g32 backward: plane sums in the row kernel, one-block-per-SM cache.
x = data((64, 256, 56, 56))
dy = data((64, 256, 56, 56))
g, b = params(256)[:2]
_, mean, rstd = dp.group_norm(x, 32, g, b, return_stats=True)
gf = gb = None
if torch is not None:
    tx, tdy, tg, tbb = tt(x), tt(dy), tt(g), tt(b)
    _, tmean, trstd = aten.native_group_norm(tx, tg, tbb, 64, 256, 56 * 56, 32, 1e-5)
    gf = lambda: F.group_norm(tx, 32, tg, tbb, 1e-5)  # noqa: E731
    gb = lambda: aten.native_group_norm_backward(tdy, tx, tmean, trstd, tg, 64, 256, 56 * 56, 32,  # noqa: E731
                                                 [True, True, True])
case("gn backward", 3 * x.nbytes, lambda: dp.group_norm_backward(dy, x, 32, g, mean=mean, rstd=rstd), rn,
     {"planes+cache": {"PLANE_SUMS": True, "BIG_CACHE": True},
      "planes": {"PLANE_SUMS": True, "BIG_CACHE": False},
      "old": {"PLANE_SUMS": False, "BIG_CACHE": False}}, gb)
case("gn forward", 2 * x.nbytes, lambda: dp.group_norm(x, 32, g, b), rn, {"now": {}}, gf)

if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump({"copy_GBps": copy, "rows": rows}, f, indent=1)
