"""GPU check of the heuristic table (helper `table`, session 3): for the public
convolution problems, time every registered algorithm through the public call
(as `python -m dnnprims.bench conv --all-algos` does, fewer repeats), next to
PyTorch/cuDNN, and record which algorithm `auto` picks with the table in use
and with an older table (--old), so that the picks can be judged against the
fastest measured.

    python notes/table_gpu_check.py --out $OUT/check.jsonl --old /tmp/old_table.json \
        --batches 1 --deadline 60 [--only r50_2_3x3,vgg_3_2] [--cpu]

One JSON line per (problem, direction) is appended as soon as it is measured
(a run cut by its deadline keeps what it has); the summary is printed last.
"""
import argparse
import json
import math
import pathlib
import sys
import time

import numpy as np

from dnnprims import algos
from dnnprims.algos import table
from dnnprims.bench import timing
from dnnprims.bench.__main__ import (DIRECTIONS, PROBLEMS, Backend, _conv_call, _conv_operands,
                                     _conv_problem, _torch_conv_call)


def picks(problem, direction, old):
    """(pick with the table in use, its reason, pick with the old table or None)."""
    new_name, reason = algos.explain_auto(problem, direction)
    old_name = None
    if old is not None:
        current = table.use(old)
        try:
            old_name = algos.explain_auto(problem, direction)[0]
        finally:
            table.use(current)
    return new_name, reason, old_name


def check(be, specs, directions, old, repeat, deadline, out):
    rows = []
    rng = np.random.default_rng(0)
    for spec in specs:
        problem = _conv_problem(spec)
        x = be.random(rng, problem.x_shape)
        w = be.random(rng, problem.w_shape, -0.1, 0.1)
        dy = be.random(rng, problem.y_shape)
        for direction in directions:
            if time.perf_counter() > deadline:
                return rows
            a, b = _conv_operands(direction, x, w, dy)
            sets = timing.rotation_count(a.nbytes + b.nbytes)
            inputs = [(a, b)] + [(a.copy(), b.copy()) for _ in range(sets - 1)]
            new_name, reason, old_name = picks(problem, direction, old)
            row = {"name": spec["name"], "N": problem.N, "direction": direction, "pick": new_name,
                   "old_pick": old_name, "reason": reason, "ms": {}, "errors": {}}
            if be.torch is not None:
                t_inputs = [tuple(be.to_torch(v) for v in s) for s in inputs]
                try:
                    row["torch_ms"] = be.measure(
                        lambda ta, tb: _torch_conv_call(be.torch, direction, problem, ta, tb), t_inputs, repeat)
                except Exception as e:  # noqa: BLE001
                    row["errors"]["torch"] = f"{type(e).__name__}: {e}"[:200]
            for name, algorithm in algos.REGISTRY.items():
                if not algos.admits(algorithm, problem, direction)[0]:
                    continue
                try:
                    row["ms"][name] = be.measure(
                        lambda p, q: _conv_call(direction, problem, p, q, name), inputs, repeat)
                except Exception as e:  # noqa: BLE001
                    row["errors"][name] = f"{type(e).__name__}: {e}"[:200]
            if be.torch is not None:     # auto runs, and agrees with cuDNN (fp32 both; sanity only)
                try:
                    ours = be.to_torch(_conv_call(direction, problem, a, b, "auto"))
                    theirs = _torch_conv_call(be.torch, direction, problem, be.to_torch(a), be.to_torch(b))
                    row["auto_rel_err_vs_cudnn"] = float((ours.double() - theirs.double()).norm()
                                                         / theirs.double().norm())
                except Exception as e:  # noqa: BLE001
                    row["errors"]["auto"] = f"{type(e).__name__}: {e}"[:200]
            del inputs
            rows.append(row)
            with open(out, "a") as f:
                f.write(json.dumps(row) + "\n")
        del x, w, dy
        if be.gpu:
            be.xp.get_default_memory_pool().free_all_blocks()
    return rows


def geomean(values):
    values = [v for v in values if v and math.isfinite(v) and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def summary(rows):
    lines = [f"{'problem':15s} {'N':>2s} {'dir':5s} {'pick (new)':24s} {'ms':>7s} {'old pick':24s} {'ms':>7s} "
             f"{'fastest':24s} {'ms':>7s} {'cuDNN':>7s} {'new/fast':>8s}"]
    short = {"forward": "fwd", "backward_data": "bdata", "backward_filter": "bfilt"}
    for r in rows:
        if not r["ms"]:
            continue
        best = min(r["ms"], key=r["ms"].get)
        t_new, t_old = r["ms"].get(r["pick"]), r["ms"].get(r["old_pick"])
        lines.append(f"{r['name']:15s} {r['N']:2d} {short[r['direction']]:5s} {r['pick']:24s} "
                     f"{t_new or float('nan'):7.4f} {str(r['old_pick']):24s} {t_old or float('nan'):7.4f} "
                     f"{best:24s} {r['ms'][best]:7.4f} {r.get('torch_ms') or float('nan'):7.4f} "
                     f"{(t_new or float('nan')) / r['ms'][best]:8.2f}")
    errs = [r["auto_rel_err_vs_cudnn"] for r in rows if "auto_rel_err_vs_cudnn" in r]
    failed = {(r["name"], r["N"], r["direction"]): r["errors"] for r in rows if r["errors"]}
    lines.append(f"auto vs cuDNN (fp32 both), worst normwise relative difference: "
                 f"{max(errs) if errs else float('nan'):.2e} over {len(errs)} rows; errors: {failed or 'none'}")
    lines.append("")
    lines.append("geomean cuDNN/ours per batch and direction: new pick | old pick | fastest of ours "
                 "(picks within 10 % of the fastest: new, old)")
    for n in sorted({r["N"] for r in rows}):
        for direction in DIRECTIONS + ("all",):
            sel = [r for r in rows if r["N"] == n and (direction == "all" or r["direction"] == direction)
                   and r["ms"] and r.get("torch_ms")]
            if not sel:
                continue

            def ratio(r, name):
                t = r["ms"].get(name)
                return r["torch_ms"] / t if t else None
            new = geomean([ratio(r, r["pick"]) for r in sel])
            old = geomean([ratio(r, r["old_pick"]) for r in sel])
            best = geomean([r["torch_ms"] / min(r["ms"].values()) for r in sel])
            good_new = sum(r["ms"].get(r["pick"], 1e9) <= 1.1 * min(r["ms"].values()) for r in sel)
            good_old = sum(r["ms"].get(r["old_pick"], 1e9) <= 1.1 * min(r["ms"].values()) for r in sel)
            lines.append(f"  N={n:2d} {direction:16s} {len(sel):2d} problems: {new:.3f} | {old:.3f} | {best:.3f}"
                         f"   within 10 %: {good_new}/{len(sel)}, {good_old}/{len(sel)}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--old", default=None, help="an older table file: its picks are reported too")
    parser.add_argument("--batches", default="1", help="comma-separated batch sizes of problems.json")
    parser.add_argument("--only", default=None, help="comma-separated name fragments")
    parser.add_argument("--directions", default=",".join(DIRECTIONS))
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--deadline", type=float, default=60.0, help="start nothing new after this many s")
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--summary-of", nargs="*", default=None, help="only print the summary of these jsonl files")
    args = parser.parse_args(argv)
    if args.summary_of is not None:
        rows = [json.loads(line) for path in args.summary_of for line in open(path) if line.strip()]
        print(summary(rows))
        return 0
    start = time.perf_counter()
    be = Backend(force_cpu=args.cpu)
    old = table.load(args.old) if args.old else None
    batches = {int(n) for n in args.batches.split(",")}
    specs = [s for s in json.loads(pathlib.Path(PROBLEMS).read_text())["conv2d"] if s["N"] in batches]
    if args.only:
        specs = [s for s in specs if any(w in s["name"] for w in args.only.split(","))]
    print(f"{be.describe()}; table {table.path()} ({len(table.current().data['entries'])} entries); "
          f"{len(specs)} problems", flush=True)
    rows = check(be, specs, args.directions.split(","), old, args.repeat, start + args.deadline, args.out)
    print(f"measured {len(rows)} (problem, direction) rows in {time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
