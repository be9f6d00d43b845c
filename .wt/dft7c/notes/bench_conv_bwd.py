"""Backward filter and strided backward data: our implicit-GEMM variants side by
side with cuDNN (PyTorch, benchmark mode, TF32 off) and the previous auto
choice, fp32 NCHW, on every public problem (notes/conv_bwd.md).

    python notes/bench_conv_bwd.py [--json PATH] [--only NAME] [--batch N] [--repeat R]
"""
import argparse
import json
import math
import sys
import time

import numpy as np

from dnnprims import algos
from dnnprims.algos import implicit_gemm_backward as igb
from dnnprims.bench import timing
from dnnprims.bench.__main__ import (PROBLEMS, Backend, _conv_call, _conv_operands, _conv_problem,
                                     _torch_conv_call)
from dnnprims.testing import relative_error

# "gemm" is what auto chose before (fp32, ungrouped); auto now picks by the
# rule in dnnprims/algos/__init__.py (column "auto" shows its choice).
WGRAD = ["gemm", "implicit_gemm_wgrad_64x64", "implicit_gemm_wgrad_128x128", "implicit_gemm_wgrad_atomic"]
DGRAD = ["gemm", "implicit_gemm_subpixel_64x64", "implicit_gemm_subpixel_128x64",
         "implicit_gemm_subpixel_128x128"]


def _variants():
    for tile in igb.WGRAD_TILES:
        a = igb.ImplicitGemmBackwardFilter(tile=tile)
        algos.REGISTRY.setdefault(a.name, a)
    for tile in ("64x64", "128x64", "128x128"):
        a = igb.SubpixelBackwardData(tile=tile)
        algos.REGISTRY.setdefault(a.name, a)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default=None)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--budget", type=float, default=1e9, help="stop starting problems after this many s")
    args = ap.parse_args()
    _variants()
    be = Backend()
    print(be.describe(), flush=True)
    specs = json.loads(PROBLEMS.read_text())["conv2d"]
    if args.only:
        specs = [s for s in specs if args.only in s["name"]]
    if args.batch:
        specs = [s for s in specs if s["N"] == args.batch]
    rng = np.random.default_rng(0)
    rows = []
    start = time.time()
    for spec in specs:
        if time.time() - start > args.budget:
            print("budget reached; stopping", flush=True)
            break
        p = _conv_problem(spec)
        x = be.random(rng, p.x_shape)
        w = be.random(rng, p.w_shape, -0.1, 0.1)
        dy = be.random(rng, p.y_shape)
        for direction in ("backward_filter", "backward_data"):
            if direction == "backward_data" and p.stride == (1, 1):
                continue
            a, b = _conv_operands(direction, x, w, dy)
            sets = timing.rotation_count(a.nbytes + b.nbytes)
            inputs = [(a, b)] + [(a.copy(), b.copy()) for _ in range(sets - 1)]
            row = {"name": spec["name"], "N": p.N, "direction": direction, "flops": p.flops,
                   "auto": algos.choose(p, direction, "auto").name, "ms": {}, "err": {}}
            t_inputs = [tuple(be.to_torch(v) for v in s) for s in inputs]
            row["cudnn"] = be.measure(lambda ta, tb: _torch_conv_call(be.torch, direction, p, ta, tb),
                                      t_inputs, args.repeat)
            ref = _torch_conv_call(be.torch, direction, p, be.to_torch(a).double(),
                                   be.to_torch(b).double()).cpu().numpy()
            for name in (WGRAD if direction == "backward_filter" else DGRAD):
                if name != "auto" and not algos.REGISTRY[name].supports(p, direction)[0]:
                    continue
                try:
                    row["ms"][name] = be.measure(lambda u, v: _conv_call(direction, p, u, v, name),
                                                 inputs, args.repeat)
                    row["err"][name] = relative_error(_conv_call(direction, p, a, b, name), ref)
                except Exception as e:  # keep going; record it
                    row["err"][name] = f"{type(e).__name__}: {e}"[:120]
            rows.append(row)
            best = min(((v, k) for k, v in row["ms"].items()), default=(float("nan"), "-"))
            print(f"{spec['name']:>15} N{p.N:<3} {direction[9:]:<7} cudnn {row['cudnn']:.3f} "
                  f"auto={row['auto']} best {best[1]} {best[0]:.3f} "
                  f"ratio {row['cudnn'] / best[0]:.2f}  " +
                  " ".join(f"{k.replace('implicit_gemm_', '')}={v:.3f}" for k, v in row["ms"].items()
                           if True) +
                  "  maxerr %.1e" % max([e for e in row["err"].values() if isinstance(e, float)] or [0]),
                  flush=True)
            errors = {k: e for k, e in row["err"].items() if isinstance(e, str)}
            if errors:
                print("   ERRORS", errors, flush=True)
            del inputs, t_inputs
        del x, w, dy
        be.free()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": be.describe(), "rows": rows}, f, indent=1)
    for direction in ("backward_filter", "backward_data"):
        for n in sorted({r["N"] for r in rows}):
            sel = [r for r in rows if r["direction"] == direction and r["N"] == n]
            if not sel or not any("gemm" in r["ms"] for r in sel):
                continue
            old = [r["cudnn"] / r["ms"]["gemm"] for r in sel if "gemm" in r["ms"]]
            best = [r["cudnn"] / min(r["ms"].values()) for r in sel if r["ms"]]
            print(f"== {direction} N={n}: geomean cuDNN/ours gemm (old auto) {timing.geometric_mean(old):.3f} "
                  f"(min {min(old):.2f}); best new {timing.geometric_mean(best):.3f} (min {min(best):.2f}) "
                  f"over {len(sel)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
