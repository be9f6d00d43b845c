"""Winograd for 5x5 filters on the GPU (notes/wino5.md): alex_conv2_5x5 in all three
directions, F(2x2, 5x5) / F(5x5, 2x2) against "dft", implicit GEMM, gemm and cuDNN
(PyTorch, benchmark mode, TF32 off), each one's error against PyTorch float64 on the
same N(0, 1) inputs, and a per-launch stage profile of the Winograd calls (CUDA
events around each kernel launch and GEMM).  Then big_7x7_s1: "dft" with the
work-in-progress fused kernels off / on (dft.FUSED_ROWS, dft.FUSED_FILTER).

    python notes/bench_wino5.py [--repeat N] [--json PATH]
"""
import argparse
import json
import sys
import traceback

import numpy as np

from dnnprims.algos import REGISTRY, choose, dft, winograd
from dnnprims.bench import timing
from dnnprims.bench.__main__ import Backend, _conv_call, _conv_operands, _torch_conv_call
from dnnprims.conv import _describe

DIRECTIONS = ("forward", "backward_data", "backward_filter")
ALEX = dict(N=32, C=64, H=27, K=192, R=5, pad=2)
BIG7 = dict(N=32, C=64, H=56, K=64, R=7, pad=3)
CANDIDATES = {
    "forward": ["winograd_f2x2_5x5", "dft", "implicit_gemm", "gemm"],
    "backward_data": ["winograd_f2x2_5x5", "dft", "implicit_gemm", "gemm"],
    "backward_filter": ["winograd_wgrad_f5x5_2x2", "dft", "implicit_gemm_wgrad", "gemm"],
}


def _problem(spec, N=None):
    n = spec["N"] if N is None else N
    return _describe((n, spec["C"], spec["H"], spec["H"]), (spec["K"], spec["C"], spec["R"], spec["R"]),
                     (1, 1), (spec["pad"], spec["pad"]), (1, 1), 1, "NCHW", np.dtype("float32"))


class Inputs:
    def __init__(self, be, problem):
        cp = be.xp
        self.x = cp.random.standard_normal(problem.x_shape, dtype=cp.float32)
        self.w = cp.random.standard_normal(problem.w_shape, dtype=cp.float32)
        self.dy = cp.random.standard_normal(problem.y_shape, dtype=cp.float32)
        sets = timing.rotation_count(self.x.nbytes + self.dy.nbytes + self.w.nbytes)
        self.sets = [(self.x, self.w, self.dy)] + [(self.x.copy(), self.w.copy(), self.dy.copy())
                                                  for _ in range(sets - 1)]
        self.t_sets = [tuple(be.to_torch(v) for v in s) for s in self.sets]


def _reference(be, problem, inp, direction):
    torch = be.torch
    x, w, dy = (be.to_torch(v).double() for v in (inp.x, inp.w, inp.dy))
    return _torch_conv_call(torch, direction, problem, *_conv_operands(direction, x, w, dy))


def _err(be, out, ref):
    torch = be.torch
    return float(torch.linalg.norm(be.to_torch(out).double() - ref) / torch.linalg.norm(ref))


def compare(be, problem, label, directions, names_of, repeat, rows):
    inp = Inputs(be, problem)
    for direction in directions:
        row = {"problem": label, "N": problem.N, "direction": direction, "ms": {}, "err": {},
               "auto": choose(problem, direction, "auto").name, "flops": problem.flops}
        try:
            ref = _reference(be, problem, inp, direction)
            row["ms"]["cudnn"] = be.measure(
                lambda x, w, dy: _torch_conv_call(be.torch, direction, problem, *_conv_operands(direction, x, w, dy)),
                inp.t_sets, repeat)
            row["err"]["cudnn"] = _err(be, _torch_conv_call(be.torch, direction, problem,
                                                            *_conv_operands(direction, *inp.t_sets[0])), ref)
        except Exception:
            traceback.print_exc()
            continue
        for name in names_of(direction):
            if name not in REGISTRY or not REGISTRY[name].supports(problem, direction)[0]:
                continue
            try:
                call = lambda x, w, dy, name=name: _conv_call(direction, problem, *_conv_operands(direction, x, w, dy),
                                                              name)
                row["err"][name] = _err(be, call(*inp.sets[0]), ref)
                row["ms"][name] = be.measure(call, inp.sets, repeat)
            except Exception as e:
                row.setdefault("failed", {})[name] = f"{type(e).__name__}: {e}"[:300]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return inp


def stage_profile(be, problem, inp, direction, name, repeat=10):
    """Median ms of each kernel launch / GEMM of one call (CUDA events between them)."""
    cp = be.xp
    log = []
    real_launch, real_gemm = winograd.FAMILY.launch, winograd.gemm

    def launch(expr, *a, **k):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        real_launch(expr, *a, **k)
        e1.record()
        log.append((expr.split("<")[0], e0, e1))

    def gemm(*a, **k):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        real_gemm(*a, **k)
        e1.record()
        log.append(("cuBLAS GEMMs", e0, e1))

    winograd.FAMILY.launch, winograd.gemm = launch, gemm
    stages = {}
    try:
        for _ in range(repeat + 2):
            log.clear()
            _conv_call(direction, problem, *_conv_operands(direction, inp.x, inp.w, inp.dy), name)
            cp.cuda.Device().synchronize()
            for i, (label, e0, e1) in enumerate(log):
                stages.setdefault((i, label), []).append(cp.cuda.get_elapsed_time(e0, e1))
    finally:
        winograd.FAMILY.launch, winograd.gemm = real_launch, real_gemm
    return [(label, float(np.median(ts[2:]))) for (i, label), ts in sorted(stages.items())]


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--json", default=None)
    parser.add_argument("--no-big7", action="store_true")
    args = parser.parse_args(argv)
    be = Backend()
    print(be.describe(), flush=True)
    rows, profiles = [], []
    for N in (32, 1):
        p = _problem(ALEX, N)
        inp = compare(be, p, "alex_conv2_5x5", DIRECTIONS, CANDIDATES.get, args.repeat, rows)
        if N == 32:
            for direction in DIRECTIONS:
                name = CANDIDATES[direction][0]
                try:
                    profiles.append((direction, name, stage_profile(be, p, inp, direction, name)))
                except Exception:
                    traceback.print_exc()
        del inp
        be.free()
    if not args.no_big7:
        p = _problem(BIG7)
        for flags in ((), ("FUSED_ROWS",), ("FUSED_FILTER",), ("FUSED_ROWS", "FUSED_FILTER")):
            saved = dft.FUSED_ROWS, dft.FUSED_FILTER
            dft.FUSED_ROWS, dft.FUSED_FILTER = "FUSED_ROWS" in flags, "FUSED_FILTER" in flags
            try:
                label = "big_7x7_s1 dft " + ("+".join(flags) or "unfused")
                names = (lambda d: ["dft", "fft"]) if not flags else (lambda d: ["dft"])
                compare(be, p, label, DIRECTIONS if not flags else ("forward", "backward_data"), names,
                        args.repeat, rows)
            finally:
                dft.FUSED_ROWS, dft.FUSED_FILTER = saved
            be.free()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": be.describe(), "rows": rows,
                       "profiles": [{"direction": d, "name": n, "stages": s} for d, n, s in profiles]}, f, indent=1)
    for direction, name, stages in profiles:
        print(f"\nstages of {name} {direction}, alex batch 32 (ms):")
        for label, ms in stages:
            print(f"   {label:40s} {ms:.4f}")
        print(f"   {'sum':40s} {sum(ms for _, ms in stages):.4f}")
    print("\n| problem | N | direction | cuDNN ms | ours ms (err) ... | best | cuDNN/best | auto |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ours = {k: v for k, v in r["ms"].items() if k != "cudnn"}
        if "cudnn" not in r["ms"] or not ours:
            print(r)
            continue
        best = min(ours, key=ours.get)
        cells = ", ".join(f"{k} {v:.3f} ({r['err'].get(k, float('nan')):.1e})" for k, v in ours.items())
        print(f"| {r['problem']} | {r['N']} | {r['direction']} | {r['ms']['cudnn']:.3f} "
              f"({r['err']['cudnn']:.1e}) | {cells} | {best} | {r['ms']['cudnn'] / ours[best]:.2f} | {r['auto']} |"
              + (f" FAILED {r['failed']}" if "failed" in r else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
