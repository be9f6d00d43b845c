"""GPU check of branch `pool5` (notes/pool5.md): launch-bounds / columns variants.

    python notes/pool5_gpu.py --warm     compile the pooling kernels in parallel (notes/pool4_gpu.py)
    python notes/pool5_gpu.py PATH       after `python -m dnnprims.bench memory --only ... --json PATH`

Prints the max 3x3 / 2 / 1 backward (64x256x56x56 NCHW, 64x56x56x256 NHWC) of every
variant of _K3S2_BACKWARD_BLOCKS / _NHWC_K3S2_BACKWARD_BLOCKS (MINB = 1, 2, 3 blocks
per SM: registers capped at 255 / 128 / 85) and, NHWC, columns per thread 7 / 14 / 32,
side by side with torch, dx compared bitwise with the current default; then the
best variant per row, then the short table of the benchmark JSON.  Writes
$OUT/variants.json.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def variants(COPY):
    import cupy as cp
    import numpy as np
    import torch
    import dnnprims as dp
    from dnnprims import _dtypes, pooling
    from dnnprims.bench import timing

    def ms(fn):
        return timing.measure(fn, xp=cp, warmup=3, repeat=30).median_ms

    def make(shape, dtype):
        x32 = cp.random.random(shape, dtype=cp.float32)
        if dtype == "bfloat16":
            return (x32.view(cp.uint32) >> 16).astype(cp.uint16).view(_dtypes.BFLOAT16)
        return x32.astype(dtype)

    F = torch.nn.functional
    out, best = [], []
    print(f"== max 3x3/2/1 backward variants (copy {COPY:.0f} GB/s; ratio = torch / ours)", flush=True)
    for layout, dtype in (("NCHW", cp.float16), ("NHWC", cp.float16), ("NHWC", cp.float32),
                          ("NCHW", "bfloat16"), ("NHWC", "bfloat16")):
        shape = (64, 256, 56, 56) if layout == "NCHW" else (64, 56, 56, 256)
        x = make(shape, dtype)
        opts = dict(stride=2, padding=1, layout=layout)
        y = dp.pool(x, 3, **opts)
        dy = make(y.shape, dtype)
        size = x.dtype.itemsize
        pooling._MEMO.clear()
        dx0 = dp.pool_backward(dy, x, y, 3, **opts)
        nchw = (lambda t: t.permute(0, 3, 1, 2)) if layout == "NHWC" else (lambda t: t)
        try:
            tx = nchw(torch.from_dlpack(x)).detach().clone().requires_grad_()
            ty = F.max_pool2d(tx, 3, 2, 1)
            tdy = nchw(torch.from_dlpack(dy))
            tdx = torch.autograd.grad(ty, tx, tdy, retain_graph=True)[0]
            diff = float((nchw(torch.from_dlpack(dx0)).float() - tdx.float()).abs().max())
            t_b = ms(lambda: torch.autograd.grad(ty, tx, tdy, retain_graph=True))
            del tx, ty, tdy, tdx
        except Exception as e:
            print(f"  torch: {type(e).__name__}: {e}")
            diff = t_b = float("nan")
        name = f"{layout} {np.dtype(x.dtype).name}"
        floor = 2 * x.nbytes + dy.nbytes
        blocks_table = pooling._K3S2_BACKWARD_BLOCKS if layout == "NCHW" else pooling._NHWC_K3S2_BACKWARD_BLOCKS
        rows_table = pooling._K3S2_BACKWARD_ROWS if layout == "NCHW" else pooling._NHWC_K3S2_BACKWARD_ROWS
        saved = (dict(blocks_table), dict(rows_table), dict(pooling._NHWC_K3S2_COLS))
        rows = []
        for blocks in pooling._BACKWARD_BLOCKS_CHOICES:
            for cols in ((None,) if layout == "NCHW" else (7, 14, 32)):
                blocks_table[size] = blocks
                rows_table[size] = 1
                if cols is not None:
                    pooling._NHWC_K3S2_COLS[("backward", size)] = cols
                pooling._MEMO.clear()
                try:
                    dx = dp.pool_backward(dy, x, y, 3, **opts)
                    same = bool(cp.array_equal(dx, dx0))
                    t = ms(lambda: dp.pool_backward(dy, x, y, 3, **opts))
                    del dx
                except Exception as e:
                    print(f"  {name} blocks {blocks} cols {cols}: {type(e).__name__}: {e}", flush=True)
                    continue
                frac = timing.gbps(floor, t) / COPY
                try:
                    problem = pooling._check_problem(x, 3, "max", 2, 1, True, layout)
                    expr = pooling._make_plan(problem, "backward", True)[1]
                    expr = expr.split("<", 1)[0][5:] + "<" + expr.split(", ", 2)[2]
                except Exception as e:
                    expr = f"? {type(e).__name__}"
                rows.append(dict(name=name, blocks=blocks, cols=cols, ms=t, torch_ms=t_b, of_copy=frac,
                                 same=same))
                print(f"{name:16s} MINB {blocks} cols {str(cols):4s} bwd {t:.4f} ms torch {t_b:.4f} "
                      f"({t_b / t:.2f}x) {frac:.2f} of copy; dx == default's: {same} [{expr}]", flush=True)
        blocks_table.clear(); blocks_table.update(saved[0])
        rows_table.clear(); rows_table.update(saved[1])
        pooling._NHWC_K3S2_COLS.clear(); pooling._NHWC_K3S2_COLS.update(saved[2])
        pooling._MEMO.clear()
        print(f"  {name}: max |dx(default) - torch| {diff:.3g}", flush=True)
        out += rows
        if rows:
            best.append(min(rows, key=lambda r: r["ms"]))
        del x, y, dy, dx0
        cp.get_default_memory_pool().free_all_blocks()
    try:
        json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "variants.json"), "w"), indent=1)
    except Exception as e:
        print(f"variants.json: {e}")
    return best


if __name__ == "__main__":
    if sys.argv[1] == "--warm":
        import pool4_gpu
        pool4_gpu.warm()
        sys.exit(0)
    try:
        COPY = json.load(open(sys.argv[1]))["ceilings"]["copy_GBps"]
    except Exception:
        COPY = 3000.0
    best = []
    try:
        best = variants(COPY)
    except Exception as e:
        print(f"variants failed: {type(e).__name__}: {e}")
    from pool_gpu import short_table
    short_table(sys.argv[1])
    print("== best variant per row (ms, torch ms, x torch, of copy, dx == default's)")
    for r in best:
        print(f"{r['name']:16s} MINB {r['blocks']} cols {str(r['cols']):4s} {r['ms']:.4f} {r['torch_ms']:.4f} "
              f"{r['torch_ms'] / r['ms']:.2f}x {r['of_copy']:.2f} {r['same']}")
