"""Winograd backward filter on the GPU: time F(3x3, 4x4) and F(3x3, 2x2) against
implicit_gemm_wgrad, gemm and cuDNN (PyTorch's conv2d_weight, benchmark mode, TF32
off) on the 3x3 stride-1 problems of dnnprims/bench/problems.json with C, K >= 64,
and measure each one's error against float64 (PyTorch in float64 on the same
N(0, 1) inputs).  At batch 32 also: a stage breakdown (x transform, dy transform,
GEMMs, output transform), NHWC timings, and a sweep of the split target.
The figures of notes/wino_wgrad.md come from this script.

    python notes/bench_wino_wgrad.py [--only NAME] [--batch N] [--json PATH]
"""
import argparse
import dataclasses
import json
import sys

import numpy as np

from dnnprims._cublas import gemm
from dnnprims.algos import REGISTRY, choose, winograd
from dnnprims.bench import timing
from dnnprims.bench.__main__ import PROBLEMS, Backend, _conv_call, _conv_problem, _torch_conv_call

DIRECTION = "backward_filter"
NAMES = ["winograd_wgrad_f3x3_4x4", "winograd_wgrad_f3x3_2x2", "implicit_gemm_wgrad", "gemm"]
SHORT = {"winograd_wgrad_f3x3_4x4": "W4", "winograd_wgrad_f3x3_2x2": "W2",
         "implicit_gemm_wgrad": "igemm", "gemm": "gemm", "cudnn": "cuDNN"}


def stage_breakdown(cp, problem, x, dy, m):
    """ms of x transforms, dy transforms, GEMMs, output transform of one call
    (CUDA events between stages, median of 10 after 2 warm-ups)."""
    alg = REGISTRY[f"winograd_wgrad_f3x3_{m}x{m}"]
    plan = alg._cached_plan(problem)
    out = cp.empty(problem.w_shape, cp.float32)
    workspace = cp.empty(plan["elements"], cp.float32)
    samples = []
    for _ in range(12):
        ev = [cp.cuda.Event() for _ in range(5)]
        totals = [0.0] * 4
        for _, st, beta, x_grid, x_args, dy_grid, dy_args in plan["chunks"]:
            mw, xt, dt = winograd.wgrad_workspace_views(workspace, plan["alpha2"], problem.K, problem.C,
                                                        plan["splits"], plan["full_split_tiles"], st,
                                                        plan["nhwc"])
            ev[0].record()
            winograd.FAMILY.launch(plan["input"], x_grid, (256,), (x, workspace, plan["xt_offset"], *x_args))
            ev[1].record()
            winograd.FAMILY.launch(plan["grad"], dy_grid, (256,), (dy, workspace, plan["dt_offset"], *dy_args))
            ev[2].record()
            gemm(cp, dt, xt, mw, trans_a=plan["nhwc"], trans_b=not plan["nhwc"], beta=beta)
            ev[3].record()
            ev[3].synchronize()
            for i in range(3):
                totals[i] += cp.cuda.get_elapsed_time(ev[i], ev[i + 1])
        expr, grid, args = plan["output"]
        ev[0].record()
        winograd.FAMILY.launch(expr, grid, (256,), (mw, out, *args))
        ev[1].record()
        ev[1].synchronize()
        totals[3] = cp.cuda.get_elapsed_time(ev[0], ev[1])
        samples.append(totals)
    ms = [float(np.median([s[i] for s in samples[2:]])) for i in range(4)]
    return ms, len(plan["chunks"]), plan["splits"], plan["full_split_tiles"]


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--sweep", action="store_true", help="time split targets at batch 32")
    args = parser.parse_args(argv)
    be = Backend()
    cp, torch = be.xp, be.torch
    print(be.describe(), flush=True)
    specs = [s for s in json.loads(PROBLEMS.read_text())["conv2d"]
             if (s["R"], s["S"], s["stride"], s["dilation"], s["groups"]) == (3, 3, 1, 1, 1)
             and min(s["C"], s["K"]) >= 64 and (args.only is None or s["name"] in args.only.split(","))
             and (args.batch is None or s["N"] == args.batch)]
    rows, breakdown, sweep = [], [], []
    for spec in specs:
        problem = _conv_problem(spec)
        x = cp.random.standard_normal(problem.x_shape, dtype=cp.float32)
        dy = cp.random.standard_normal(problem.y_shape, dtype=cp.float32)
        sets = timing.rotation_count(x.nbytes + dy.nbytes)
        inputs = [(x, dy)] + [(x.copy(), dy.copy()) for _ in range(sets - 1)]
        t_inputs = [tuple(be.to_torch(v) for v in s) for s in inputs]
        row = {"name": spec["name"], "N": problem.N, "flops": problem.flops,
               "auto": choose(problem, DIRECTION, "auto").name, "ms": {}, "err": {}}
        row["ms"]["cudnn"] = be.measure(
            lambda ta, tb: _torch_conv_call(torch, DIRECTION, problem, ta, tb), t_inputs, args.repeat)
        ref = _torch_conv_call(torch, DIRECTION, problem, be.to_torch(x).double(), be.to_torch(dy).double())
        norm = torch.linalg.norm(ref)

        def err(out):
            return float(torch.linalg.norm(be.to_torch(out).double() - ref) / norm)

        row["err"]["cudnn"] = err(_torch_conv_call(torch, DIRECTION, problem, *t_inputs[0]))
        for name in NAMES:
            if not REGISTRY[name].supports(problem, DIRECTION)[0]:
                continue
            try:
                row["ms"][name] = be.measure(lambda p, q: _conv_call(DIRECTION, problem, p, q, name),
                                             inputs, args.repeat)
                row["err"][name] = err(_conv_call(DIRECTION, problem, x, dy, name))
            except Exception as e:  # keep going: one failure must not lose the run
                row.setdefault("failed", {})[name] = f"{type(e).__name__}: {e}"[:300]
        ours = {k: v for k, v in row["ms"].items() if k != "cudnn"}
        row["best"] = min(ours, key=ours.get)
        row["ratio_best"] = row["ms"]["cudnn"] / ours[row["best"]]
        rows.append(row)
        print(json.dumps(row), flush=True)
        if problem.N == 32:
            for m in (4, 2):
                try:
                    ms, chunks, splits, st = stage_breakdown(cp, problem, x, dy, m)
                    breakdown.append({"name": spec["name"], "m": m, "x": ms[0], "dy": ms[1], "gemm": ms[2],
                                      "out": ms[3], "chunks": chunks, "splits": splits, "split_tiles": st})
                except Exception as e:
                    print("breakdown failed", spec["name"], m, e, flush=True)
            # NHWC: our two Winograd variants on the same data (transposed once).
            pn = dataclasses.replace(problem, layout="NHWC")
            xn, dyn = cp.ascontiguousarray(x.transpose(0, 2, 3, 1)), cp.ascontiguousarray(dy.transpose(0, 2, 3, 1))
            for name in NAMES[:2]:
                try:
                    row.setdefault("nhwc_ms", {})[name] = be.measure(
                        lambda p, q: _conv_call_layout(pn, p, q, name), [(xn, dyn)], args.repeat)
                    row.setdefault("nhwc_err", {})[name] = err(_conv_call_layout(pn, xn, dyn, name))
                except Exception as e:
                    row.setdefault("failed", {})[name + " NHWC"] = f"{type(e).__name__}: {e}"[:300]
            del xn, dyn
            if args.sweep:
                saved = winograd.WGRAD_TARGET_BLOCKS, winograd.WGRAD_MIN_SPLIT_DEPTH
                for target, min_depth in ((132, 512), (528, 512), (1056, 256), (264, 1024)):
                    winograd.WGRAD_TARGET_BLOCKS, winograd.WGRAD_MIN_SPLIT_DEPTH = target, min_depth
                    for name in NAMES[:2]:
                        ms = be.measure(lambda p, q: _conv_call(DIRECTION, problem, p, q, name), inputs,
                                        args.repeat)
                        sweep.append({"name": spec["name"], "algo": SHORT[name], "target": target,
                                      "min_depth": min_depth, "ms": ms,
                                      "splits": winograd.wgrad_sizes(problem, int(name[-1]))[2]})
                winograd.WGRAD_TARGET_BLOCKS, winograd.WGRAD_MIN_SPLIT_DEPTH = saved
        del inputs, t_inputs, ref, x, dy
        be.free()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": be.describe(), "rows": rows, "breakdown": breakdown, "sweep": sweep}, f, indent=1)
    print("\nsplit sweep (ms): problem | algo | target blocks | min depth | splits | ms")
    for s in sweep:
        print(f"{s['name']} | {s['algo']} | {s['target']} | {s['min_depth']} | {s['splits']} | {s['ms']:.3f}")
    print("\nstage breakdown (ms): problem | F | x transform | dy transform | GEMMs | output | chunks | splits x tiles")
    for b in breakdown:
        print(f"{b['name']} | W{b['m']} | {b['x']:.3f} | {b['dy']:.3f} | {b['gemm']:.3f} | {b['out']:.3f} | "
              f"{b['chunks']} | {b['splits']} x {b['split_tiles']}")
    print("\nNHWC (ms, err): " + "; ".join(
        f"{r['name']} " + ", ".join(f"{SHORT[n]} {r['nhwc_ms'][n]:.3f} ({r['nhwc_err'][n]:.1e})"
                                    for n in r.get("nhwc_ms", {})) for r in rows if "nhwc_ms" in r))
    print("\nbackward filter | N | cuDNN ms | " + " | ".join(SHORT[n] for n in NAMES)
          + " | best | cuDNN/best | eff TFLOP/s | err W4 | err W2 | err igemm | err cuDNN")
    for r in rows:
        ms = " | ".join(f"{r['ms'][n]:.3f}" if n in r["ms"] else "-" for n in NAMES)
        e = " | ".join(f"{r['err'][n]:.1e}" if n in r["err"] else "-"
                       for n in ("winograd_wgrad_f3x3_4x4", "winograd_wgrad_f3x3_2x2", "implicit_gemm_wgrad",
                                 "cudnn"))
        print(f"{r['name']} | {r['N']} | {r['ms']['cudnn']:.3f} | {ms} | {SHORT[r['best']]} | "
              f"{r['ratio_best']:.2f} | {r['flops'] / r['ms'][r['best']] / 1e9:.1f} | {e}"
              + (f" | FAILED {r['failed']}" if "failed" in r else ""))
    for n in (32, 1):
        sel = [r["ratio_best"] for r in rows if r["N"] == n]
        if sel:
            print(f"batch {n} backward filter: geomean cuDNN/best {np.exp(np.mean(np.log(sel))):.3f}, "
                  f"min {min(sel):.2f}, >= 1.0 on {sum(v >= 1.0 for v in sel)}/{len(sel)}")
    return 0


def _conv_call_layout(problem, x, dy, name):
    import dnnprims as dp
    return dp.conv2d_backward_filter(x, dy, problem.w_shape, padding=problem.padding, layout="NHWC", algo=name)


if __name__ == "__main__":
    sys.exit(main())
