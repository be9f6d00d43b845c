"""Helper polyphase's GPU timing (notes/polyphase.md): dilated_3x3_d2 (C = K = 256,
28x28, 3x3, dilation 2, padding 2) at batch 32 and 1, NCHW (and NHWC at batch 32),
all three directions: "polyphase", what "auto" picks, the direct alternatives
(gemm, implicit GEMM), cuDNN (PyTorch, benchmark mode, TF32 off) side by side in
this process; the breakdown of polyphase (split copy, inner algorithm on the
stacked sub-problem, merge copy); the relative error against PyTorch float64.
    python notes/polyphase_bench.py [--json PATH]"""
import json
import sys

import cupy as cp
import numpy as np
import torch

from dnnprims import algos, conv
from dnnprims.algos import polyphase
from dnnprims.bench import timing
from dnnprims.conv import conv2d_backward_data, conv2d_backward_filter, conv2d_forward

torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
REPEAT = 20
PAD, DIL = (2, 2), (2, 2)


def measure(fn, sets):
    return timing.measure(fn, sets, xp=cp, warmup=3, repeat=REPEAT).median_ms


def ours(direction, layout, algo, x_shape, w_shape):
    opts = dict(padding=PAD, dilation=DIL, layout=layout, algo=algo)
    if direction == "forward":
        return lambda a, b: conv2d_forward(a, b, **opts)
    if direction == "backward_data":
        return lambda a, b: conv2d_backward_data(a, b, x_shape, **opts)
    return lambda a, b: conv2d_backward_filter(a, b, w_shape, **opts)


def theirs(direction, layout, x_shape, w_shape):
    f = torch.nn.grad
    nchw = (lambda t: t.permute(0, 3, 1, 2)) if layout == "NHWC" else (lambda t: t)
    shape = x_shape if layout == "NCHW" else (x_shape[0], x_shape[3], x_shape[1], x_shape[2])
    kw = dict(padding=PAD, dilation=DIL)
    if direction == "forward":
        return lambda a, b: torch.nn.functional.conv2d(nchw(a), b, **kw)
    if direction == "backward_data":
        return lambda a, b: f.conv2d_input(shape, b, nchw(a), **kw)
    return lambda a, b: f.conv2d_weight(nchw(a), w_shape, nchw(b), **kw)


def main():
    rows = []
    for N, layout in ((32, "NCHW"), (1, "NCHW"), (32, "NHWC")):
        x_shape = (N, 256, 28, 28) if layout == "NCHW" else (N, 28, 28, 256)
        w_shape = (256, 256, 3, 3)
        p = conv._describe(x_shape, w_shape, 1, PAD, DIL, 1, layout, np.dtype("float32"))
        sub = polyphase.sub_problem(p)
        rng = cp.random.RandomState(0)
        x = rng.standard_normal(x_shape, dtype=cp.float32)
        w = (rng.standard_normal(w_shape, dtype=cp.float32) * 0.05).astype(cp.float32)
        dy = rng.standard_normal(p.y_shape, dtype=cp.float32)
        operands = {"forward": (x, w), "backward_data": (dy, w), "backward_filter": (x, dy)}
        sets_count = timing.rotation_count(x.nbytes + dy.nbytes)
        for direction in algos.DIRECTIONS:
            a, b = operands[direction]
            sets = [(a, b)] + [(a.copy(), b.copy()) for _ in range(sets_count - 1)]
            tsets = [tuple(torch.as_tensor(v, device="cuda") for v in s) for s in sets]
            auto = algos.auto_rule(p, direction)
            inner = algos.REGISTRY["polyphase"].inner(p, direction)[0].name
            direct_alt = "implicit_gemm_wgrad" if direction == "backward_filter" else "implicit_gemm"
            row = {"N": N, "layout": layout, "direction": direction, "auto": auto, "inner": inner}
            row["cudnn_ms"] = measure(theirs(direction, layout, x_shape, w_shape), tsets)
            for algo in ("polyphase", "auto", "gemm", direct_alt):
                try:
                    row[f"{algo}_ms"] = measure(ours(direction, layout, algo, x_shape, w_shape), sets)
                except Exception as e:  # noqa: BLE001 -- record it, go on
                    row[f"{algo}_ms"] = None
                    row[f"{algo}_error"] = f"{type(e).__name__}: {e}"[:200]
            # Breakdown: the split copy of a, the inner algorithm on the stacked operands, the merge.
            stacked = {"forward": (sub.x_shape, None), "backward_data": (sub.y_shape, None),
                       "backward_filter": (sub.x_shape, sub.y_shape)}[direction]
            sa = polyphase.split_phases(cp, a, layout, DIL)
            sb = polyphase.split_phases(cp, b, layout, DIL) if stacked[1] else b
            row["split_ms"] = measure(lambda t: polyphase.split_phases(cp, t, layout, DIL), [(a,)])
            inner_opts = dict(padding=sub.padding, layout=layout, algo=inner)
            if direction == "forward":
                run_inner = lambda u, v: conv2d_forward(u, v, **inner_opts)  # noqa: E731
                out_full, out_sub = cp.empty(p.y_shape, cp.float32), cp.empty(sub.y_shape, cp.float32)
            elif direction == "backward_data":
                run_inner = lambda u, v: conv2d_backward_data(u, v, sub.x_shape, **inner_opts)  # noqa: E731
                out_full, out_sub = cp.empty(p.x_shape, cp.float32), cp.empty(sub.x_shape, cp.float32)
            else:
                run_inner = lambda u, v: conv2d_backward_filter(u, v, w_shape, **inner_opts)  # noqa: E731
                out_full = out_sub = None
            row["inner_ms"] = measure(run_inner, [(sa, sb)])
            if out_full is not None:
                row["merge_ms"] = measure(lambda s, o: polyphase.merge_phases(s, o, layout, DIL),
                                          [(out_sub, out_full)])
            else:
                row["split_b_ms"] = measure(lambda t: polyphase.split_phases(cp, t, layout, DIL), [(b,)])
            # Error against PyTorch float64.
            got = ours(direction, layout, "polyphase", x_shape, w_shape)(a, b)
            ref = theirs(direction, layout, x_shape, w_shape)(*(torch.as_tensor(v, device="cuda").double()
                                                                for v in (a, b)))
            got_t = torch.as_tensor(got, device="cuda").double()
            if layout == "NHWC" and direction != "backward_filter":
                got_t = got_t.permute(0, 3, 1, 2)
            row["rel_error"] = float((got_t - ref).norm() / ref.norm())
            rows.append(row)
            print(json.dumps(row), flush=True)
            del sets, tsets, sa, sb
        del x, w, dy
        cp.get_default_memory_pool().free_all_blocks()
    if len(sys.argv) > 2 and sys.argv[1] == "--json":
        with open(sys.argv[2], "w") as f:
            json.dump(rows, f, indent=1)
    fmt = lambda v: "   -   " if v is None else f"{v:7.3f}"  # noqa: E731
    print("\nN  layout direction        cuDNN   polyph  ratio   auto(=)          gemm    igemm   "
          "split   inner   merge/splitb  err      inner")
    for r in rows:
        alt = r.get("implicit_gemm_ms") or r.get("implicit_gemm_wgrad_ms")
        ratio = r["cudnn_ms"] / r["polyphase_ms"] if r.get("polyphase_ms") else None
        print(f"{r['N']:<2} {r['layout']} {r['direction']:<16} {fmt(r['cudnn_ms'])} {fmt(r['polyphase_ms'])} "
              f"{fmt(ratio)} {fmt(r['auto_ms'])}={r['auto'][:8]:<8} {fmt(r['gemm_ms'])} {fmt(alt)} "
              f"{fmt(r['split_ms'])} {fmt(r['inner_ms'])} {fmt(r.get('merge_ms') or r.get('split_b_ms'))}"
              f"       {r['rel_error']:.1e}  {r['inner']}")


if __name__ == "__main__":
    main()
