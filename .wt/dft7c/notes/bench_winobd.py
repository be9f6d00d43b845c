"""Winograd F(2x2)/F(4x4) on the batch-32 3x3 stride-1 layers (C, K >= 64) against
cuDNN (PyTorch, benchmark mode, TF32 off): the full public call, each stage on
its own, and the launch options of helper winobd (notes/winobd.md).

    python notes/bench_winobd.py [--only NAME] [--repeat N] [--json PATH] [--stages NAMES]

Full calls: the bench's Backend.measure (CUDA events around each public call,
inputs rotated past L2, median).  Stages: each launched `--stage-repeat` times
back to back between two events (GPU time alone: no host gap between stages),
for the filter transform alone, the input transform alone, the two in one launch,
the cuBLAS GEMMs in the layout the NCHW path uses (M[a] = U[a] V[a], V as
(a, c, t)) and in the transposed one (M^T[a] = V^T[a] U^T[a], V as (a, t, c),
the NHWC path's), the output transform with and without vector rows.  Host:
microseconds of Python per public call (a burst of calls, no synchronisation).
The table is printed last.
"""
import argparse
import json
import time

import numpy as np

from dnnprims._cublas import gemm
from dnnprims.algos import REGISTRY, winograd
from dnnprims.bench.__main__ import (PROBLEMS, Backend, _conv_call, _conv_operands, _conv_problem,
                                     _torch_conv_call)

NAMES = {4: "winograd_f4x4_3x3", 2: "winograd_f2x2_3x3"}
WGRAD_NAMES = {4: "winograd_wgrad_f3x3_4x4", 2: "winograd_wgrad_f3x3_2x2"}
OPTIONS = {"old": (False, False), "new": (True, True)}   # (FILTER_IN_INPUT_LAUNCH, VECTOR_ROWS)


def set_options(filter_in_input, vector_rows):
    winograd.FILTER_IN_INPUT_LAUNCH = filter_in_input
    winograd.VECTOR_ROWS = vector_rows


def gpu_ms(cp, fn, repeat):
    """GPU milliseconds per call of fn, `repeat` calls back to back (median of 3 bursts)."""
    fn()
    out = []
    for _ in range(3):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(repeat):
            fn()
        end.record()
        end.synchronize()
        out.append(cp.cuda.get_elapsed_time(start, end) / repeat)
    return float(np.median(out))


def host_us(cp, fn, repeat=50):
    """Microseconds of host time per call (launches are asynchronous)."""
    fn()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    t1 = time.perf_counter()
    cp.cuda.Device().synchronize()
    return (t1 - t0) / repeat * 1e6


def stages(cp, problem, direction, a, b, m, repeat):
    """GPU ms of every stage of one batch chunk (the layers here run in one)."""
    i32 = np.int32
    alg = REGISTRY[NAMES[m]]
    set_options(*OPTIONS["new"])
    plan = alg._plan(problem, direction)
    Cin, Kout, a2 = plan["Cin"], plan["Kout"], plan["alpha2"]
    T = plan["max_tiles"]
    ws = cp.empty(plan["elements"], cp.float32)
    u, v, mm = winograd.workspace_views(ws, a2, Kout, Cin, T, False)
    _, t, in_grid, in_args, out_grid, out_args, _ = plan["chunks"][0]
    input_blocks = int(in_args[-1])
    filter_blocks = in_grid[0] - input_blocks
    fargs = (b, *plan["filter_args"])
    vo, mo = plan["v_offset"], plan["m_offset"]
    expr = plan["input"]
    launch = winograd.FAMILY.launch
    out = cp.empty(problem.x_shape if direction == "backward_data" else problem.y_shape, cp.float32)
    zero_args = (i32(Cin), i32(1), i32(1), i32(0), i32(0), i32(1), i32(1), i32(0), i32(0), i32(0))
    res = {}
    res["filter"] = gpu_ms(cp, lambda: launch(expr, (filter_blocks,), (256,), (a, ws, vo, *zero_args, *fargs)),
                           repeat)
    res["input"] = gpu_ms(cp, lambda: launch(expr, (input_blocks,), (256,), (a, ws, vo, *in_args, *fargs)), repeat)
    res["input+filter"] = gpu_ms(cp, lambda: launch(expr, in_grid, (256,), (a, ws, vo, *in_args, *fargs)), repeat)
    res["gemm"] = gpu_ms(cp, lambda: gemm(cp, u, v, mm), repeat)
    vt = v.reshape(a2, T, Cin)    # the same bytes as the transposed layout (timing only)
    mt = mm.reshape(a2, T, Kout)
    res["gemm_T"] = gpu_ms(cp, lambda: gemm(cp, vt, u, mt, trans_b=True), repeat)
    for vec in (0, 1):
        res[f"output_vec{vec}"] = gpu_ms(cp, lambda: launch(
            plan["output"], out_grid, (256,), (ws, mo, b, i32(0), out, *out_args, i32(vec and plan["vec_rows"]))),
            repeat)
    # The whole call through the algorithm's prepared path (no conv.py front).
    runner = alg.prepare(problem, direction)
    res["prepared"] = gpu_ms(cp, lambda: runner(a, b, out), repeat)
    return res


SHORT = {"forward": "fwd", "backward_data": "bwd_data", "backward_filter": "bwd_filt"}


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default=None)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--stage-repeat", type=int, default=20)
    parser.add_argument("--stages", default="r50_2_3x3,r50_3_3x3,r50_4_3x3,r50_5_3x3")
    parser.add_argument("--json", default=None)
    parser.add_argument("--options", default="old,new", help="launch options to time on the r50 layers")
    parser.add_argument("--directions", default="forward,backward_data")
    parser.add_argument("--bounds", action="store_true", help="r50_3: smaller batch chunks too")
    args = parser.parse_args(argv)
    be = Backend()
    cp, torch = be.xp, be.torch
    print(be.describe(), flush=True)
    specs = [s for s in json.loads(PROBLEMS.read_text())["conv2d"]
             if (s["R"], s["S"], s["stride"], s["dilation"], s["groups"]) == (3, 3, 1, 1, 1)
             and min(s["C"], s["K"]) >= 64 and s["N"] == 32
             and (args.only is None or any(o in s["name"] for o in args.only.split(",")))]
    rows = []
    for spec in specs:
        problem = _conv_problem(spec)
        x = cp.random.standard_normal(problem.x_shape, dtype=cp.float32)
        w = cp.random.standard_normal(problem.w_shape, dtype=cp.float32)
        dy = cp.random.standard_normal(problem.y_shape, dtype=cp.float32)
        small = spec["name"].startswith("r50")
        for direction in args.directions.split(","):
            names = WGRAD_NAMES if direction == "backward_filter" else NAMES
            a, b = _conv_operands(direction, x, w, dy)
            sets = max(1, min(4, -(-3 * 50 * 2**20 // (2 * (a.nbytes + b.nbytes)))))
            inputs = [(a, b)] + [(a.copy(), b.copy()) for _ in range(sets - 1)]
            t_inputs = [tuple(be.to_torch(q) for q in s) for s in inputs]
            row = {"name": spec["name"], "direction": direction, "ms": {}, "err": {}}
            row["ms"]["cudnn"] = be.measure(
                lambda ta, tb: _torch_conv_call(torch, direction, problem, ta, tb), t_inputs, args.repeat)
            ref = _torch_conv_call(torch, direction, problem, be.to_torch(a).double(), be.to_torch(b).double())
            norm = torch.linalg.norm(ref)
            for m in (4, 2):
                name = names[m]
                opts = args.options.split(",") if small and direction != "backward_filter" else ["new"]
                for opt in opts:
                    set_options(*OPTIONS[opt])
                    key = f"F{m}_{opt}"
                    try:
                        row["ms"][key] = be.measure(lambda p, q: _conv_call(direction, problem, p, q, name),
                                                    inputs, args.repeat)
                        out = _conv_call(direction, problem, a, b, name)
                        row["err"][key] = float(torch.linalg.norm(be.to_torch(out).double() - ref) / norm)
                    except Exception as e:  # keep going: one failure must not lose the run
                        row.setdefault("failed", {})[key] = f"{type(e).__name__}: {e}"[:300]
            set_options(*OPTIONS["new"])
            if small:
                row["host_us_F4"] = host_us(cp, lambda: _conv_call(direction, problem, a, b, names[4]))
                ta, tb = t_inputs[0]
                row["host_us_cudnn"] = host_us(cp, lambda: _torch_conv_call(torch, direction, problem, ta, tb))
            if spec["name"] in args.stages.split(",") and direction != "backward_filter":
                for m in (4, 2):
                    try:
                        row[f"stages_F{m}"] = stages(cp, problem, direction, a, b, m, args.stage_repeat)
                    except Exception as e:
                        row.setdefault("failed", {})[f"stages_F{m}"] = f"{type(e).__name__}: {e}"[:300]
            if spec["name"] == "r50_3_3x3" and args.bounds and direction != "backward_filter":
                # smaller batch chunks: V and M nearer L2's size
                for bound in (16, 32):
                    winograd.WORKSPACE_BOUND = bound * 2**20
                    row["ms"][f"F4_new_bound{bound}MiB"] = be.measure(
                        lambda p, q: _conv_call(direction, problem, p, q, NAMES[4]), inputs, args.repeat)
                winograd.WORKSPACE_BOUND = 512 * 2**20
            rows.append(row)
            print(json.dumps(row), flush=True)
            del inputs, t_inputs, ref
        del x, w, dy
        be.free()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print("\n== winobd table (ms; ratio = cuDNN / ours, > 1 is faster than cuDNN)")
    print(f"{'layer':10s} {'dir':8s} {'cuDNN':>7s} {'F4 old':>7s} {'F4 new':>7s} {'F2 old':>7s} {'F2 new':>7s} "
          f"{'best':>6s} {'ratio':>6s} {'errF4':>8s}")
    for r in rows:
        ms = r["ms"]
        ours = {k: v for k, v in ms.items() if k != "cudnn" and "bound" not in k and k.endswith("new")}
        best = min(ours, key=ours.get) if ours else None
        f = lambda k: f"{ms[k]:7.3f}" if k in ms else f"{'-':>7s}"  # noqa: E731
        print(f"{r['name']:10s} {SHORT[r['direction']]:8s} {f('cudnn')} {f('F4_old')} {f('F4_new')} {f('F2_old')} "
              f"{f('F2_new')} {best or '-':>6s} {ms['cudnn'] / ours[best] if best else 0:6.2f} "
              f"{r['err'].get('F4_new', float('nan')):8.1e}")
    print("\nstages (GPU ms, each alone, back to back): filter | input | input+filter | gemm | gemm_T | "
          "output vec0 | vec1 | prepared call")
    for r in rows:
        for m in (4, 2):
            s = r.get(f"stages_F{m}")
            if s:
                print(f"{r['name']:10s} {SHORT[r['direction']]:8s} F{m} " + " ".join(
                    f"{s[k]:.4f}" for k in ("filter", "input", "input+filter", "gemm", "gemm_T",
                                            "output_vec0", "output_vec1", "prepared")))
    for r in rows:
        extra = {k: round(v, 4) for k, v in r["ms"].items() if "bound" in k}
        if "host_us_F4" in r or extra:
            print(f"{r['name']:10s} {SHORT[r['direction']]:8s} host us/call F4 {r.get('host_us_F4', 0):.1f} "
                  f"cuDNN {r.get('host_us_cudnn', 0):.1f} {extra}")
        if r.get("failed"):
            print(f"{r['name']} {r['direction']} FAILED: {r['failed']}")


if __name__ == "__main__":
    main()
