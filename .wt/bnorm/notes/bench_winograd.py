"""Winograd on the GPU: time F(2x2) and F(4x4) against our other algorithms and
cuDNN (PyTorch, benchmark mode, TF32 off) on the 3x3 stride-1 problems of
dnnprims/bench/problems.json with C, K >= 64, forward and backward data, and
measure each one's error against float64 (cuDNN in float64 on the same
inputs, N(0, 1) data).  Then a per-stage breakdown of the Winograd path.
The figures of notes/conv_wino.md come from this script.

    python notes/bench_winograd.py [--only NAME] [--batch N] [--breakdown] [--json PATH]
"""
import argparse
import json
import sys

import numpy as np

from dnnprims.algos import REGISTRY, choose
from dnnprims.bench import timing
from dnnprims.bench.__main__ import (PROBLEMS, Backend, _conv_call, _conv_operands, _conv_problem,
                                     _torch_conv_call)

NAMES = ["winograd_f4x4_3x3", "winograd_f2x2_3x3", "implicit_gemm", "gemm"]
SHORT = {"winograd_f4x4_3x3": "F4", "winograd_f2x2_3x3": "F2", "implicit_gemm": "igemm", "gemm": "gemm"}


def stage_breakdown(cp, problem, direction, a, b, m):
    """Milliseconds of filter transform, input transform, GEMMs, output transform
    of the first batch chunk, each timed alone (notes/bench_winobd.py's stages:
    the kernels take the workspace and offsets since helper winobd)."""
    import importlib.util
    import pathlib
    spec = importlib.util.spec_from_file_location("bench_winobd", pathlib.Path(__file__).with_name("bench_winobd.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    s = module.stages(cp, problem, direction, a, b, m, 10)
    plan = REGISTRY[f"winograd_f{m}x{m}_3x3"]._plan(problem, direction)
    return [s["filter"], s["input"], s["gemm"], s["output_vec1"]], len(plan["chunks"])


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--breakdown", action="store_true")
    args = parser.parse_args(argv)
    be = Backend()
    cp, torch = be.xp, be.torch
    print(be.describe(), flush=True)
    specs = [s for s in json.loads(PROBLEMS.read_text())["conv2d"]
             if (s["R"], s["S"], s["stride"], s["dilation"], s["groups"]) == (3, 3, 1, 1, 1)
             and min(s["C"], s["K"]) >= 64 and (args.only is None or args.only in s["name"])
             and (args.batch is None or s["N"] == args.batch)]
    rows, breakdown = [], []
    for spec in specs:
        problem = _conv_problem(spec)
        x = cp.random.standard_normal(problem.x_shape, dtype=cp.float32)
        w = cp.random.standard_normal(problem.w_shape, dtype=cp.float32)
        dy = cp.random.standard_normal(problem.y_shape, dtype=cp.float32)
        for direction in ("forward", "backward_data"):
            a, b = _conv_operands(direction, x, w, dy)
            sets = timing.rotation_count(a.nbytes + b.nbytes)
            inputs = [(a, b)] + [(a.copy(), b.copy()) for _ in range(sets - 1)]
            t_inputs = [tuple(be.to_torch(v) for v in s) for s in inputs]
            row = {"name": spec["name"], "N": problem.N, "direction": direction,
                   "auto": choose(problem, direction, "auto").name, "ms": {}, "err": {}}
            row["ms"]["cudnn"] = be.measure(
                lambda ta, tb: _torch_conv_call(torch, direction, problem, ta, tb), t_inputs, args.repeat)
            ref = _torch_conv_call(torch, direction, problem, be.to_torch(a).double(), be.to_torch(b).double())
            norm = torch.linalg.norm(ref)

            def err(out):
                return float(torch.linalg.norm(be.to_torch(out).double() - ref) / norm)

            row["err"]["cudnn"] = err(_torch_conv_call(torch, direction, problem, *t_inputs[0]))
            for name in NAMES:
                if not REGISTRY[name].supports(problem, direction)[0]:
                    continue
                try:
                    row["ms"][name] = be.measure(lambda p, q: _conv_call(direction, problem, p, q, name),
                                                 inputs, args.repeat)
                    row["err"][name] = err(_conv_call(direction, problem, a, b, name))
                except Exception as e:  # keep going: one failure must not lose the run
                    row.setdefault("failed", {})[name] = f"{type(e).__name__}: {e}"[:200]
            ours = {k: v for k, v in row["ms"].items() if k != "cudnn"}
            row["best"] = min(ours, key=ours.get)
            row["ratio_best"] = row["ms"]["cudnn"] / ours[row["best"]]
            row["ratio_auto"] = row["ms"]["cudnn"] / ours[row["auto"]] if row["auto"] in ours else None
            rows.append(row)
            print(json.dumps(row), flush=True)
            if problem.N == 32 and args.breakdown:
                for m in (2, 4):
                    ms, chunks = stage_breakdown(cp, problem, direction, a, b, m)
                    breakdown.append({"name": spec["name"], "direction": direction, "m": m,
                                      "filter": ms[0], "input": ms[1], "gemm": ms[2], "output": ms[3],
                                      "chunks": chunks})
            del inputs, t_inputs, ref
        del x, w, dy
        be.free()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": be.describe(), "rows": rows, "breakdown": breakdown}, f, indent=1)
    print("\nproblem | N | direction | cuDNN ms | " + " | ".join(SHORT[n] for n in NAMES)
          + " | best | cuDNN/best | auto | cuDNN/auto | err F4 | err F2 | err igemm | err cuDNN")
    for r in rows:
        ms = " | ".join(f"{r['ms'][n]:.3f}" if n in r["ms"] else "-" for n in NAMES)
        e = " | ".join(f"{r['err'][n]:.1e}" if n in r["err"] else "-"
                       for n in ("winograd_f4x4_3x3", "winograd_f2x2_3x3", "implicit_gemm", "cudnn"))
        ra = f"{r['ratio_auto']:.2f}" if r["ratio_auto"] else "-"
        print(f"{r['name']} | {r['N']} | {r['direction']} | {r['ms']['cudnn']:.3f} | {ms} | "
              f"{SHORT[r['best']]} | {r['ratio_best']:.2f} | {SHORT.get(r['auto'], r['auto'])} | {ra} | {e}"
              + (f" | FAILED {r['failed']}" if "failed" in r else ""))
    print("\nstage breakdown (ms): problem | direction | m | filter | input | gemm | output | chunks")
    for b in breakdown:
        print(f"{b['name']} | {b['direction']} | F{b['m']} | {b['filter']:.3f} | {b['input']:.3f} | "
              f"{b['gemm']:.3f} | {b['output']:.3f} | {b['chunks']}")
    for n in (32, 1):
        for d in ("forward", "backward_data"):
            sel = [r["ratio_best"] for r in rows if r["N"] == n and r["direction"] == d]
            if sel:
                print(f"batch {n} {d}: geomean cuDNN/best {np.exp(np.mean(np.log(sel))):.3f}, "
                      f"min {min(sel):.2f}, >= 1.0 on {sum(v >= 1.0 for v in sel)}/{len(sel)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
