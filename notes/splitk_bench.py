"""Split-K implicit GEMM on the batch-1 ResNet-50 layers (helper splitk, notes/splitk.md):
today's auto pick, one-pass implicit_gemm, split-K with 2 / 4 / 8 splits and with the
rule, and PyTorch cuDNN (benchmark mode, TF32 off), in one process, same inputs.

    python notes/splitk_bench.py [--dtype float32] [--directions forward backward_data] > bench.log
    python notes/splitk_bench.py --table bench.log [more.log ...]

Needs the patch (notes/wip/splitk_forward_unverified.patch) applied.  Each row is a
JSON line "ROW {...}".  GPU ms: dnnprims.bench's Backend.measure (CUDA events around
each call, median, inputs rotated out of L2, the first call untimed: compilation,
cuDNN autotuning) through the public conv2d_forward / conv2d_backward_data with
algo=<name> (the split-K instances are registered in this process only), so the
fast path and the output slot are what a user gets.  Host us: bursts of 100 calls
with no synchronisation, median of 10 (dnnprims.bench.overhead's method); where host
us >= GPU ms * 1000 the row is host-bound, and its GPU ms is too.  Error: normwise
against PyTorch float64.
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np

PROBLEMS = ["r50_3a_3x3_s2", "r50_3_1x1_dn", "r50_4_1x1_dn", "r50_5_1x1_up", "r50_4_3x3", "r50_5_3x3"]
SPLITS = [2, 4, 8, "auto"]
BURST, BURSTS = 100, 10


def _host_us(cp, fn):
    for _ in range(10):
        fn()
    samples = []
    for _ in range(BURSTS):
        cp.cuda.get_current_stream().synchronize()
        t0 = time.perf_counter()
        for _ in range(BURST):
            fn()
        samples.append((time.perf_counter() - t0) / BURST * 1e6)
    cp.cuda.get_current_stream().synchronize()
    return statistics.median(samples)


def main(dtype, directions, repeat):
    import dnnprims as dp
    from dnnprims import algos
    from dnnprims.algos import implicit_gemm as ig
    from dnnprims.bench import timing
    from dnnprims.bench.__main__ import PROBLEMS as PROBLEM_FILE, Backend, _conv_problem, _torch_conv_call
    from dnnprims.testing import relative_error

    be = Backend()
    assert be.gpu, "no GPU"
    cp = be.xp
    print(f"# {be.describe()}", flush=True)
    specs = {s["name"]: s for s in json.loads(PROBLEM_FILE.read_text())["conv2d"] if s["N"] == 1}
    split_algos = {}
    for s in SPLITS:
        a = ig.ImplicitGemmConvolution(split_k=s)
        algos.register(a)                   # this process only: the public path runs it
        split_algos[a.name] = a
    rng = np.random.default_rng(0)
    for name in PROBLEMS:
        spec = specs[name]
        problem = _conv_problem(spec, dtype)
        opts = dict(stride=problem.stride, padding=problem.padding, dilation=problem.dilation,
                    groups=problem.groups)
        x = be.random(rng, problem.x_shape, dtype=dtype)
        w = be.random(rng, problem.w_shape, -0.1, 0.1, dtype=dtype)
        dy = be.random(rng, problem.y_shape, dtype=dtype)
        for direction in directions:
            if direction == "backward_data" and problem.stride != (1, 1):
                continue
            a, b = (x, w) if direction == "forward" else (dy, w)
            sets = timing.rotation_count(a.nbytes + b.nbytes)
            inputs = [(a, b)] + [(a.copy(), b.copy()) for _ in range(sets - 1)]

            def call(p, q, algo):
                if direction == "forward":
                    return dp.conv2d_forward(p, q, algo=algo, **opts)
                return dp.conv2d_backward_data(p, q, problem.x_shape, algo=algo, **opts)

            ta, tb = be.to_torch(a), be.to_torch(b)
            want = _torch_conv_call(be.torch, direction, problem, ta.double(), tb.double()).cpu().numpy()
            t_inputs = [tuple(be.to_torch(v) for v in s) for s in inputs]
            torch_ms = be.measure(lambda p, q: _torch_conv_call(be.torch, direction, problem, p, q),
                                  t_inputs, repeat)
            auto = algos.choose(problem, direction, "auto").name
            base = dict(problem=name, direction=direction, dtype=dtype, torch_ms=torch_ms, auto=auto)
            print("ROW " + json.dumps({**base, "algo": "cudnn", "ms": torch_ms}), flush=True)
            for algo in ["auto", "implicit_gemm", *split_algos]:
                row = dict(base, algo=algo)
                try:
                    if algo in split_algos:
                        _, splits, chunk = split_algos[algo].splits(problem, direction)
                        row.update(splits=splits, chunk=chunk)
                    row["ms"] = be.measure(lambda p, q: call(p, q, algo), inputs, repeat)
                    row["host_us"] = _host_us(cp, lambda: call(a, b, algo))
                    row["err"] = relative_error(call(a, b, algo), want)
                    row["vs_cudnn"] = torch_ms / row["ms"]
                except Exception as e:   # one failing row must not lose the others
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
                print("ROW " + json.dumps(row), flush=True)
            del inputs, t_inputs
        del x, w, dy
        be.free()


def table(paths):
    rows = []
    for path in paths:
        for line in open(path):
            if line.startswith("ROW "):
                rows.append(json.loads(line[4:]))
    cols = ["auto", "implicit_gemm", "implicit_gemm_splitk2", "implicit_gemm_splitk4", "implicit_gemm_splitk8",
            "implicit_gemm_splitk"]
    heads = ["auto", "igemm", "split2", "split4", "split8", "rule"]
    print("ms per call (GPU events, median); [splits] of the rule; x = cuDNN / best of ours "
          "(> 1: we are faster); err = best row's error vs fp64")
    print(f"{'problem':15s} {'dir':5s} {'dtype':8s} {'auto pick':22s} " +
          " ".join(f"{h:>8s}" for h in heads) + f" {'cudnn':>8s} {'x auto':>7s} {'x best':>7s} {'host us':>8s} err")
    keys = []
    for r in rows:
        k = (r["problem"], r["direction"], r["dtype"])
        if k not in keys:
            keys.append(k)
    for k in keys:
        by = {r["algo"]: r for r in rows if (r["problem"], r["direction"], r["dtype"]) == k}
        cudnn = by.get("cudnn", {}).get("ms")
        cells, best = [], None
        for c in cols:
            r = by.get(c, {})
            if "ms" in r:
                text = f"{r['ms']:.4f}"
                if c == "implicit_gemm_splitk":
                    text = f"{r['ms']:.3f}[{r.get('splits')}]"
                if c != "auto" and (best is None or r["ms"] < best["ms"]):
                    best = r
            else:
                text = "ERR" if "error" in r else "-"
            cells.append(f"{text:>8s}")
        auto = by.get("auto", {})
        x_auto = f"{cudnn / auto['ms']:.2f}" if cudnn and "ms" in auto else "-"
        x_best = f"{cudnn / best['ms']:.2f}" if cudnn and best else "-"
        host = f"{best.get('host_us', float('nan')):.1f}" if best else "-"
        err = f"{best.get('err', float('nan')):.1e}" if best else "-"
        pick = auto.get("auto", by.get("cudnn", {}).get("auto", "?"))
        print(f"{k[0]:15s} {k[1][:5]:5s} {k[2]:8s} {pick[:22]:22s} " + " ".join(cells) +
              f" {cudnn if cudnn is None else round(cudnn, 4)!s:>8s} {x_auto:>7s} {x_best:>7s} {host:>8s} {err}"
              + (f"  best={best['algo']}" if best else ""))
    errors = [r for r in rows if "error" in r]
    for r in errors[:10]:
        print(f"ERROR {r['problem']} {r['direction']} {r['algo']}: {r['error']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--table", nargs="+")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--directions", nargs="+", default=["forward"])
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    if args.table:
        table(args.table)
        sys.exit(0)
    main(args.dtype, args.directions, args.repeat)
