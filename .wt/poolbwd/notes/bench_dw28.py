"""Depthwise timings for helper `dw28` (issue 3: mbv2_dw_28 forward >= 2x cuDNN).

    python notes/bench_dw28.py [OUTDIR]

Every public depthwise problem (mbv2_dw_112, mbv2_dw_28; batch 32 and 1), all three
directions: cuDNN (PyTorch, benchmark mode, TF32 off) and our public call
(`dp.conv2d_*(..., groups=C)`, algo "auto"), inputs rotated out of L2 as in
`python -m dnnprims.bench`.  Where dw_small_nchw runs (28 x 28 forward / backward
data) also its launch variants (rows per lane, MINB, threads, grid cap) and the
previous kernel (dw_same_nchw, 2 rows, MINB 3).  A plain copy of x into y at the
same size (the same rotation) gives what this size can reach.  Every variant is
checked against cuDNN.  Caches of launches (plans, prepared launches, the public
fast path) are emptied between variants, so each one really runs.
"""
import json
import os
import sys

import cupy
import numpy as np
import torch

import dnnprims as dp
from dnnprims import conv as dp_conv
from dnnprims.algos import depthwise as dwa
from dnnprims.bench import timing
from dnnprims.conv import _describe

torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = False

# label -> knobs of dnnprims.algos.depthwise (None: the committed default).
VARIANTS = {
    "default": None,
    "same_r2m3": {"SMALL_PATH": False},                    # the kernel before (session 3 default)
    "r7m1": {"small_variant": (7, 1)},
    "r7m2": {"small_variant": (7, 2)},
    "r7m4": {"small_variant": (7, 4)},
    "r7m3t128": {"small_variant": (7, 3), "SMALL_THREADS": 128},
    "r7m3t64": {"small_variant": (7, 3), "SMALL_THREADS": 64},
    "r7m3c396": {"small_variant": (7, 3), "SMALL_GRID_CAP": 396},   # one resident wave (3 x 256 / SM)
    "r7m3c264": {"small_variant": (7, 3), "SMALL_GRID_CAP": 264},
    "r4m1": {"small_variant": (4, 1)},
    "r4m4": {"small_variant": (4, 4)},
    "r8m3": {"small_variant": (8, 3)},
}
PROBLEMS = (("mbv2_dw_112", 32, 96, 112), ("mbv2_dw_112", 1, 96, 112),
            ("mbv2_dw_28", 32, 192, 28), ("mbv2_dw_28", 1, 192, 28))
DIRECTIONS = ("forward", "backward_data", "backward_filter")


def reset():
    dwa.DEPTHWISE._plans.clear()
    dwa.DEPTHWISE.__dict__.get("_prepared_cache", {}).clear()
    dp_conv._MEMO.clear()


def apply(knobs):
    saved = {}
    for k, v in (knobs or {}).items():
        saved[k] = getattr(dwa, k)
        setattr(dwa, k, (lambda p, d, vec, v=v: v) if k == "small_variant" else v)
    reset()
    return saved


def restore(saved):
    for k, v in saved.items():
        setattr(dwa, k, v)
    reset()


def launched():
    return sorted({f"{l[0]} grid {l[1][0]} x {l[2][0]}" for launches, _ in dwa.DEPTHWISE._plans.values()
                   for l in launches})


def rand(shape):
    a = cupy.random.random(shape, dtype=cupy.float32)
    a -= 0.5
    return a


def t(fn, inputs=None, repeat=50):
    return timing.measure(fn, inputs, xp=cupy, warmup=5, repeat=repeat).median_ms


def copy_ms(sources, repeat=50):
    """y[...] = x over the sources in turn (what one pass at this size costs)."""
    y = cupy.empty_like(sources[0])
    return t(lambda u: y.__setitem__(Ellipsis, u), [(u,) for u in sources], repeat=repeat)


def main(outdir):
    copy_gbs = 2 * 2**30 / (copy_ms([cupy.random.random(2**28, dtype=cupy.float32)], repeat=10) * 1e-3) / 1e9
    rows_out = []
    for name, N, C, H in PROBLEMS:
        p = _describe((N, C, H, H), (C, 1, 3, 3), 1, 1, 1, C, "NCHW", np.float32)
        x, w, dy = rand(p.x_shape), rand(p.w_shape), rand(p.y_shape)
        opts = dict(stride=1, padding=1, groups=C)
        sets = timing.rotation_count(x.nbytes + w.nbytes)
        size_copy_ms = copy_ms([x] + [x.copy() for _ in range(sets - 1)])
        for direction in DIRECTIONS:
            a, b = {"forward": (x, w), "backward_data": (dy, w), "backward_filter": (x, dy)}[direction]
            floor = x.nbytes + dy.nbytes + w.nbytes
            sets = timing.rotation_count(a.nbytes + b.nbytes)
            inputs = [(a, b)] + [(a.copy(), b.copy()) for _ in range(sets - 1)]
            ta = [tuple(torch.from_dlpack(v) for v in s) for s in inputs]
            F = torch.nn.functional
            theirs = {"forward": lambda u, v: F.conv2d(u, v, **opts),
                      "backward_data": lambda u, v: torch.nn.grad.conv2d_input(p.x_shape, v, u, **opts),
                      "backward_filter": lambda u, v: torch.nn.grad.conv2d_weight(u, p.w_shape, v, **opts)}[direction]
            public = {"forward": lambda u, v: dp.conv2d_forward(u, v, **opts),
                      "backward_data": lambda u, v: dp.conv2d_backward_data(u, v, p.x_shape, **opts),
                      "backward_filter": lambda u, v: dp.conv2d_backward_filter(u, v, p.w_shape, **opts)}[direction]
            want = cupy.from_dlpack(theirs(*ta[0]))
            row = {"name": name, "N": N, "direction": direction, "floor_bytes": floor, "copy_ms": size_copy_ms,
                   "cudnn_ms": t(theirs, ta), "variants": {}}
            small = dwa.is_small_nchw(p, direction)
            for label, knobs in VARIANTS.items():
                if knobs is not None and not small:
                    continue
                saved = apply(knobs)
                try:
                    got = public(a, b)
                    err = float(cupy.linalg.norm(got - want) / cupy.linalg.norm(want))
                    del got
                    row["variants"][label] = {"ms": t(public, inputs), "err": err, "kernels": launched()}
                except Exception as e:  # report, go on
                    row["variants"][label] = {"ms": float("nan"), "error": f"{type(e).__name__}: {e}"[:300]}
                finally:
                    restore(saved)
            rows_out.append(row)
            print(json.dumps(row), flush=True)
            del inputs, ta, want
        del x, w, dy
        cupy.get_default_memory_pool().free_all_blocks()
    result = {"copy_GBps": copy_gbs, "rows": rows_out}
    if outdir:
        os.makedirs(outdir, exist_ok=True)
        with open(os.path.join(outdir, "bench_dw28.json"), "w") as f:
            json.dump(result, f, indent=1)
    print(f"\n== dw28 sweep: copy bandwidth {copy_gbs:.0f} GB/s (1 GiB); public call ms; "
          "x = cuDNN / ours; 'of copy' = floor bytes / time / copy bandwidth")
    print("   'copy@size' = y[...] = x at the problem's size (rotated), the reachable floor of one pass")
    for r in rows_out:
        for label, v in r["variants"].items():
            if "error" in v:
                print("ERROR", r["name"], r["N"], r["direction"], label, v["error"])
            elif v["err"] > 1e-5:
                print("WRONG", r["name"], r["N"], r["direction"], label, v["err"])
    print(f"{'problem':12} {'N':>2} {'direction':15} {'cuDNN':>7} {'copy@size':>9} {'default':>8} {'x':>5} "
          f"{'of copy':>7}  best variant")
    for r in rows_out:
        d = r["variants"]["default"]
        floor_ms = r["floor_bytes"] / (copy_gbs * 1e9) * 1e3
        ok = {k: v for k, v in r["variants"].items() if "error" not in v and v["err"] <= 1e-5}
        best = min(ok, key=lambda k: ok[k]["ms"]) if ok else "-"
        best_text = f"{best} {ok[best]['ms']:.4f} ({r['cudnn_ms'] / ok[best]['ms']:.2f}x)" if ok else "-"
        print(f"{r['name']:12} {r['N']:>2} {r['direction']:15} {r['cudnn_ms']:7.4f} {r['copy_ms']:9.4f} "
              f"{d['ms']:8.4f} {r['cudnn_ms'] / d['ms']:5.2f} {floor_ms / d['ms']:7.2f}  {best_text}")
    for r in rows_out:
        if len(r["variants"]) > 1:
            print(f"{r['name']} N={r['N']} {r['direction']}: " + ", ".join(
                f"{k} {v['ms']:.4f}" for k, v in r["variants"].items()))
    for r in rows_out:
        print(f"{r['name']} N={r['N']} {r['direction']} default runs: {r['variants']['default'].get('kernels')}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT"))
