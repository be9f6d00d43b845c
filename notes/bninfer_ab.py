"""Old (main's unpatched dnnprims/ + kernels/, copied aside) against new (this tree,
notes/wip/bninfer.patch applied) against PyTorch, in ONE process: batch-norm INFERENCE
forward on the bench's problems (dnnprims/bench/problems.json): bn_r50_early
[32,64,112,112], bn_big [64,256,56,56], bn_big_nhwc [64,56,56,256] (NHWC: old the rows
kernel, new batchnorm_infer_rows_packs), bn_big_f16, bn_r50_late [32,2048,7,7] (float32
unless named).  Variants of new: `new` (the shipped switches), `new U4` / `new U1`
(PACKED_UNROLL_WIDE = 4 for float, PACKED_UNROLL_16BIT = 1 for float16: the other unroll,
plan-key switches).

Each callable timed two ways, two rounds (A B A B):
- eager: dnnprims.bench.timing.measure (CUDA events around each call, median of 20) --
  what `python -m dnnprims.bench memory` reports as ms;
- device: dnnprims.bench.timing.measure_queued (20 calls queued behind the overhead
  bench's busy-wait kernel, Backend.device_ms): the device time of one call.
Copy: the bench's same-size copy (floor / 2 bytes each way, cudaMemcpyAsync) both ways,
and a 1 GiB copy (the bench's ceiling) measured in this process.  Floor = read x + write
y = 2 x.nbytes.  diff = max |new - old| (0 expected: the same expressions), also for the
returned mean/invstd; running statistics checked untouched.  Table last.
    python notes/bninfer_ab.py OLD_ROOT [--json PATH]"""
import importlib.util
import json
import sys

import numpy as np
import cupy as cp
import torch

import dnnprims as new
from dnnprims import normalization as new_norm
from dnnprims.bench import timing
from dnnprims.bench.overhead import SPIN

OLD_ROOT = sys.argv[1]
spec = importlib.util.spec_from_file_location("dnnprims_old", f"{OLD_ROOT}/dnnprims/__init__.py",
                                              submodule_search_locations=[f"{OLD_ROOT}/dnnprims"])
old = importlib.util.module_from_spec(spec)
sys.modules["dnnprims_old"] = old
spec.loader.exec_module(old)
from dnnprims_old import normalization as old_norm  # noqa: E402

assert old_norm.__file__ != new_norm.__file__
assert "batchnorm_infer_packs" not in old_norm.FAMILY.source, "old must be unpatched"
assert "batchnorm_infer_packs" in new_norm.FAMILY.source, "new must be patched"
print("old:", old_norm.__file__, "new:", new_norm.__file__, flush=True)

F = torch.nn.functional
REPEAT = 20


def eager_ms(fn):
    return timing.measure(fn, xp=cp, warmup=3, repeat=REPEAT).median_ms


def hold(ns):
    SPIN.launch("spin_wait_ns", (1,), (1,), (np.int64(ns),))


def device_ms(fn):
    t, covered = timing.measure_queued(fn, xp=cp, hold=hold)
    return t.median_ms if covered else -t.median_ms  # negative: a burst outlasted the hold (upper bound)


def copy_gbps():
    src = cp.random.random(2**28, dtype=cp.float32)
    dst = cp.empty_like(src)
    t = timing.measure(lambda: dst.__setitem__(Ellipsis, src), xp=cp, warmup=3, repeat=10)
    return 2 * 2**30 / (t.median_ms * 1e-3) / 1e9


def same_size_copy(floor):
    each = max(int(floor) // 2, 1)
    src, dst = cp.empty(each, cp.uint8), cp.empty(each, cp.uint8)
    src[...] = 1
    return lambda: dst.data.copy_from_device_async(src.data, each)


def switched(fn, **switches):
    """fn with new_norm's switches set during the call (plan-key switches: no stale plan)."""
    def call():
        saved = {k: getattr(new_norm, k) for k in switches}
        for k, v in switches.items():
            setattr(new_norm, k, v)
        try:
            return fn()
        finally:
            for k, v in saved.items():
                setattr(new_norm, k, v)
    return call


def as_torch(a):
    return torch.from_dlpack(a)


def max_abs(a, b):
    return float((as_torch(a).double() - as_torch(b).double()).abs().max())


def kernel_of(norm, x, channels, inner, layout):
    """The inference kernel the plan of `norm` (old or new module) launches."""
    if layout == "NHWC" or inner == 1:
        if getattr(norm, "PACKED_INFERENCE", False):
            packed = norm._rows_packs_launch(x, True, channels, "float")
            if packed is not None:
                return packed[0]
        return "batchnorm_rows_normalize"
    t = norm._dtypes.cuda_type(x.dtype)
    if getattr(norm, "PACKED_INFERENCE", False) and inner >= norm._VECTOR[t]:
        return norm._packs_launch(x, True, channels, inner, "float")[0]
    if norm.FLAT_INFERENCE and inner % norm._VECTOR[t]:
        return norm._flat_launch(x, x, channels, inner, "float")[0]
    return norm._launch_of(x, channels, x.size // channels // inner, inner, (x, x)).spec(
        "batchnorm_normalize", "float", "false")


PROBLEMS = [("bn_r50_early", (32, 64, 112, 112), "float32", "NCHW"),
            ("bn_big", (64, 256, 56, 56), "float32", "NCHW"),
            ("bn_big_nhwc", (64, 56, 56, 256), "float32", "NHWC"),
            ("bn_big_f16", (64, 256, 56, 56), "float16", "NCHW"),
            ("bn_r50_late", (32, 2048, 7, 7), "float32", "NCHW")]

COPY = copy_gbps()
print(f"copy {COPY:.0f} GB/s (1 GiB)", flush=True)
rows = []
for name, shape, dtype, layout in PROBLEMS:
    C = shape[1] if layout == "NCHW" else shape[-1]
    inner = int(np.prod(shape[2:])) if layout == "NCHW" else 1
    x = (cp.random.random(shape, dtype=cp.float32) * 4 - 1).astype(dtype)
    gamma = cp.random.random(C, dtype=cp.float32) + 0.5
    beta = cp.random.random(C, dtype=cp.float32) - 0.5
    rm = cp.random.random(C, dtype=cp.float32) * 0.2 - 0.1
    rv = cp.random.random(C, dtype=cp.float32) + 0.5
    rm0, rv0 = rm.copy(), rv.copy()
    floor = 2 * x.nbytes
    y_old, m_old, s_old = old.batchnorm(x, gamma, beta, rm, rv, training=False, layout=layout, return_stats=True)
    y_new, m_new, s_new = new.batchnorm(x, gamma, beta, rm, rv, training=False, layout=layout, return_stats=True)
    fns = {"old": lambda: old.batchnorm(x, gamma, beta, rm, rv, training=False, layout=layout),
           "new": lambda: new.batchnorm(x, gamma, beta, rm, rv, training=False, layout=layout)}
    diffs = {"new": max_abs(y_new, y_old), "new_mean": max_abs(m_new, m_old), "new_invstd": max_abs(s_new, s_old)}
    # the other unroll (NHWC too: the rows packs kernel reads the same switches)
    tag, sw = ("new U1", {"PACKED_UNROLL_16BIT": 1}) if dtype == "float16" else \
        ("new U4", {"PACKED_UNROLL_WIDE": 4})
    fns[tag] = switched(fns["new"], **sw)
    diffs[tag] = max_abs(switched(lambda: new.batchnorm(x, gamma, beta, rm, rv, training=False,
                                                        layout=layout), **sw)(), y_old)
    assert bool((rm == rm0).all()) and bool((rv == rv0).all()), "running statistics changed"
    tx, tg, tb, trm, trv = (as_torch(a) for a in (x, gamma, beta, rm.copy(), rv.copy()))
    if layout == "NHWC":
        tx = tx.permute(0, 3, 1, 2)  # channels_last memory, as the bench
    fns["torch"] = lambda: F.batch_norm(tx, trm, trv, tg, tb, training=False)
    fns["copy"] = same_size_copy(floor)
    kernels = {"old": kernel_of(old_norm, x, C, inner, layout), "new": kernel_of(new_norm, x, C, inner, layout)}
    print(f"{name}: old {kernels['old']}, new {kernels['new']}", flush=True)
    got = {tag: {"eager": [], "device": []} for tag in fns}
    for _ in range(2):  # A B A B
        for tag, fn in fns.items():
            got[tag]["eager"].append(eager_ms(fn))
        for tag, fn in fns.items():
            try:
                got[tag]["device"].append(device_ms(fn))
            except Exception as e:  # noqa: BLE001 -- report and go on
                print(f"{name} {tag}: device timing failed: {type(e).__name__}: {e}", flush=True)
    row = {"problem": name, "shape": shape, "dtype": dtype, "layout": layout, "floor_bytes": floor, "ms": got,
           "max_abs_diff_vs_old": diffs, "kernels": kernels}
    rows.append(row)
    print(json.dumps(row), flush=True)
    del x, y_old, y_new, tx, fns
    cp.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()

print()
print(f"copy {COPY:.0f} GB/s (1 GiB copy, this process).  ms: round 1 / round 2; eager = the bench's ms (events"
      " around each call), device = measure_queued (20 calls behind a busy-wait; '-' prefix: uncovered, an"
      " upper bound); x torch = torch / ours (best round, same timing); of copy = floor bytes at the 1 GiB copy"
      " bandwidth / ours (the bench's 'of copy'), and same-size copy / ours (device); diff = max |new - old|")
print(f"{'problem':13s} {'variant':7s} {'eager ms':>15s} {'device ms':>15s} {'x torch e':>9s} {'x torch d':>9s}"
      f" {'of copy e':>9s} {'of cp-ss d':>10s}  diff")
for r in rows:
    best = {tag: {k: (min(abs(t) for t in v) if v else float("nan")) for k, v in t.items()}
            for tag, t in r["ms"].items()}
    floor_ms = r["floor_bytes"] / COPY / 1e6
    for tag, t in r["ms"].items():
        if tag == "copy":
            continue
        b = best[tag]
        e = "/".join(f"{v:.4f}" for v in t["eager"])
        d = "/".join(f"{v:.4f}" for v in t["device"])
        diff = r["max_abs_diff_vs_old"].get(tag, "")
        print(f"{r['problem']:13s} {tag:7s} {e:>15s} {d:>15s} {best['torch']['eager'] / b['eager']:9.2f}"
              f" {best['torch']['device'] / b['device']:9.2f} {floor_ms / b['eager']:9.3f}"
              f" {best['copy']['device'] / b['device']:10.3f}  {diff if diff == '' else f'{diff:.1e}'}")
    c = best["copy"]
    print(f"{'':13s} {'copy-ss':7s} {c['eager']:15.4f} {c['device']:15.4f}   floor {r['floor_bytes'] / 1e6:.1f} MB ="
          f" {floor_ms * 1e3:.2f} us at {COPY:.0f} GB/s; kernels old {r['kernels']['old']} / new {r['kernels']['new']}")
if len(sys.argv) > 3 and sys.argv[2] == "--json":
    json.dump(rows, open(sys.argv[3], "w"), indent=1)
