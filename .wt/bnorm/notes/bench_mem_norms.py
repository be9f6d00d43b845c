"""H100 timing for notes/mem_norms.md: the row-norm and tensor-op benchmark rows
(dnnprims.bench, fp32, side by side with PyTorch), plus half-type rows and the
group-norm backward with a larger shared-memory cache (both rows of x and dy on
chip), in one process.  Writes $OUT/mem_norms.json; prints the table last.

    python notes/bench_mem_norms.py [--layer-norm-only]
"""
import json
import os
import pathlib
import sys

import numpy as np

import dnnprims as dp
from dnnprims import row_normalization
from dnnprims.bench import __main__ as bench
from dnnprims.bench import timing


def half_layer_norm_rows(be, repeat, name):
    """float16 / bfloat16 layer and RMS norm against PyTorch (data made by torch, shared by DLPack)."""
    cp, torch = be.xp, be.torch
    F, aten = torch.nn.functional, torch.ops.aten
    rows = []
    for tdtype in ({"fp16": torch.float16, "bf16": torch.bfloat16}[name],):
        x32 = cp.random.random((65536, 1024), dtype=cp.float32) * 4 - 2
        tx = torch.from_dlpack(x32).to(tdtype)
        x = cp.from_dlpack(tx)
        dy = cp.from_dlpack(torch.from_dlpack(cp.random.random((65536, 1024), dtype=cp.float32) - 0.5).to(tdtype))
        tdy = torch.from_dlpack(dy)
        g = cp.random.random(1024, dtype=cp.float32) + 0.5
        b = cp.random.random(1024, dtype=cp.float32) - 0.5
        tg, tb = torch.from_dlpack(g), torch.from_dlpack(b)
        n = x.nbytes
        _, mean, rstd = dp.layer_norm(x, 1024, g, b, return_stats=True)
        _, tmean, trstd = aten.native_layer_norm(tx, [1024], tg.to(tdtype), tb.to(tdtype), 1e-5)
        tgh, tbh = tg.to(tdtype), tb.to(tdtype)
        rows.append(bench._memory_row(
            be, f"layer_norm forward {name}", "ln_65536x1024", x.shape, 2 * n, 2 * n,
            lambda: dp.layer_norm(x, 1024, g, b), lambda: F.layer_norm(tx, (1024,), tgh, tbh, 1e-5), None, repeat))
        rows.append(bench._memory_row(
            be, f"layer_norm backward {name}", "ln_65536x1024", x.shape, 3 * n, 3 * n,
            lambda: dp.layer_norm_backward(dy, x, 1024, g, mean=mean, rstd=rstd),
            lambda: aten.native_layer_norm_backward(tdy, tx, [1024], tmean, trstd, tgh, tbh, [True] * 3),
            None, repeat))
        rows.append(bench._memory_row(
            be, f"rms_norm forward {name}", "rms_65536x1024", x.shape, 2 * n, 2 * n,
            lambda: dp.rms_norm(x, 1024, g, eps=1e-5), lambda: F.rms_norm(tx, (1024,), tgh, 1e-5), None, repeat))
        del x, dy, tx, tdy, x32
        be.free()
    return rows


def half_group_rows(be, repeat):
    cp, torch = be.xp, be.torch
    F = torch.nn.functional
    rows = []
    x = cp.random.random((64, 256, 56, 56), dtype=cp.float32).astype(cp.float16)
    tx = torch.from_dlpack(x)
    g = cp.random.random(256, dtype=cp.float32).astype(cp.float16) + 0.5
    tg = torch.from_dlpack(g)
    n = x.nbytes
    rows.append(bench._memory_row(
        be, "group_norm forward fp16", "gn_64x256x56x56_g32", x.shape, 2 * n, 2 * n,
        lambda: dp.group_norm(x, 32, g, g), lambda: F.group_norm(tx, 32, tg, tg, 1e-5), None, repeat))
    rows.append(bench._memory_row(
        be, "transform NCHW->NHWC fp16", "nchw_64x256x56x56", x.shape, 2 * n, 2 * n,
        lambda: dp.transform_layout(x), lambda: tx.permute(0, 2, 3, 1).contiguous(), None, repeat))
    return rows


def big_cache_rows(be, repeat):
    """Group-norm backward with both 100 KB rows (x and dy) in shared memory."""
    cp = be.xp
    x = cp.random.random((64, 256, 56, 56), dtype=cp.float32) - 0.5
    dy = cp.random.random((64, 256, 56, 56), dtype=cp.float32) - 0.5
    g = cp.random.random(256, dtype=cp.float32) + 0.5
    _, mean, rstd = dp.group_norm(x, 32, g, g, return_stats=True)
    old = row_normalization.CACHE_BYTES
    row_normalization.CACHE_BYTES = 220 * 1024
    try:
        want = dp.group_norm_backward(dy, x, 32, g, mean=mean, rstd=rstd)
        row = bench._memory_row(
            be, "group_norm backward, 220KB cache", "gn_64x256x56x56_g32", x.shape, 3 * x.nbytes, 3 * x.nbytes,
            lambda: dp.group_norm_backward(dy, x, 32, g, mean=mean, rstd=rstd), None, None, repeat)
    finally:
        row_normalization.CACHE_BYTES = old
    got = dp.group_norm_backward(dy, x, 32, g, mean=mean, rstd=rstd)
    row["rel_error"] = float(max(timing_rel(a, b) for a, b in zip(got, want)))
    return [row]


def timing_rel(a, b):
    return float(abs(a - b).max() / max(float(abs(b).max()), 1e-30))


def main():
    be = bench.Backend()
    print(be.describe(), flush=True)
    rng = np.random.default_rng(0)
    problems = json.loads(bench.PROBLEMS.read_text())
    result = {"device": be.describe(), "rows": []}
    result["ceilings"] = timing.measure_ceilings(be.xp)
    repeat = 30
    if "--layer-norm-only" in sys.argv:  # the second H100 call: the warp-per-row kernels
        problems["group_norm"], problems["tensor_ops"] = [], []
    steps = [lambda: bench.bench_row_norms(be, {k: problems[k] for k in ("layer_norm", "rms_norm", "group_norm")},
                                           repeat, rng),
             lambda: bench.bench_tensor_ops(be, problems["tensor_ops"], repeat, rng),
             lambda: half_layer_norm_rows(be, repeat, "fp16"),
             lambda: half_layer_norm_rows(be, repeat, "bf16")]
    if "--layer-norm-only" not in sys.argv:
        steps += [lambda: big_cache_rows(be, repeat), lambda: half_group_rows(be, repeat)]
    for step in steps:
        try:
            result["rows"] += step()
        except Exception as e:
            import traceback
            traceback.print_exc()
            result["rows"].append({"kind": "setup", "error": bench._error_text(e)})
    out = pathlib.Path(os.environ.get("OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "mem_norms.json").write_text(json.dumps(result, indent=1, default=float))
    print()
    print(bench.tables(result))
    print(f"copy {result['ceilings']['copy_GBps']:.0f} GB/s")
    for r in result["rows"]:
        if r["kind"] == "setup":
            print("set-up error:", r["error"])


if __name__ == "__main__":
    main()
