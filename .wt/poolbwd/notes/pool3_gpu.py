"""GPU check of branch `pool3` (notes/pool3.md); run after the pool tests and
`python -m dnnprims.bench memory --only <pool problems> --json PATH`:

    python notes/pool3_gpu.py PATH

Prints (1) a sweep of the NHWC 3x3/2/1 kernels' rows per thread and columns per
thread (fp32 and fp16, 64x56x56x256, against torch channels-last), (2) kernel-only
time of the global-average problem (20 launches in one CUDA graph: no host time),
and last (3) the short table of the benchmark JSON: ours, torch, ratio, fraction
of the copy bandwidth over the floor bytes (floors: dnnprims/bench/__main__.py).
"""
import json
import sys

import cupy as cp
import torch

import dnnprims as dp
from dnnprims import pooling
from dnnprims.bench import timing
from pool_gpu import short_table  # notes/pool_gpu.py: the pool rows of a benchmark JSON


def ms(fn):
    return timing.measure(fn, xp=cp, warmup=3, repeat=30).median_ms


def nhwc_sweep():
    print("== NHWC 3x3/2/1 (N=64, 56x56, C=256): rows R and columns per thread (ms, median of 30)")
    F = torch.nn.functional
    for dtype in (cp.float32, cp.float16):
        size = cp.dtype(dtype).itemsize
        x = cp.random.random((64, 56, 56, 256), dtype=cp.float32).astype(dtype)
        opts = dict(stride=2, padding=1, layout="NHWC")
        y = dp.pool(x, 3, **opts)
        dy = cp.random.random(y.shape, dtype=cp.float32).astype(dtype)
        dx0 = dp.pool_backward(dy, x, y, 3, **opts)
        tx = torch.from_dlpack(x).permute(0, 3, 1, 2).detach().clone().requires_grad_()
        ty = F.max_pool2d(tx, 3, 2, 1)
        tdy = torch.from_dlpack(dy).permute(0, 3, 1, 2)
        t_f = ms(lambda: F.max_pool2d(tx, 3, 2, 1))
        t_b = ms(lambda: torch.autograd.grad(ty, tx, tdy, retain_graph=True))
        floor_f, floor_b = x.nbytes + y.nbytes, 2 * x.nbytes + dy.nbytes
        print(f"{cp.dtype(dtype).name}: torch forward {t_f:.4f} backward {t_b:.4f}")
        saved = (pooling._NHWC_K3S2_FORWARD_ROWS[size], pooling._NHWC_K3S2_BACKWARD_ROWS[size],
                 dict(pooling._NHWC_K3S2_COLS))
        for cols in (4, 28):
            line = []
            pooling._NHWC_K3S2_COLS = {"forward": cols, "backward": cols}
            for r in pooling._NHWC_K3S2_ROWS_CHOICES:
                pooling._NHWC_K3S2_FORWARD_ROWS[size] = pooling._NHWC_K3S2_BACKWARD_ROWS[size] = r
                pooling._MEMO.clear()
                tf = ms(lambda: dp.pool(x, 3, **opts))
                tb = ms(lambda: dp.pool_backward(dy, x, y, 3, **opts))
                same = bool(cp.array_equal(dp.pool(x, 3, **opts), y)) and bool(
                    cp.array_equal(dp.pool_backward(dy, x, y, 3, **opts), dx0))
                line.append(f"R={r}: fwd {tf:.4f} ({t_f / tf:.2f}x, {timing.gbps(floor_f, tf) / COPY:.2f})"
                            f" bwd {tb:.4f} ({t_b / tb:.2f}x, {timing.gbps(floor_b, tb) / COPY:.2f})"
                            f"{'' if same else ' DIFFERS'}")
            print(f"  cols={cols:2d}  " + "   ".join(line))
        (pooling._NHWC_K3S2_FORWARD_ROWS[size], pooling._NHWC_K3S2_BACKWARD_ROWS[size],
         pooling._NHWC_K3S2_COLS) = saved
        pooling._MEMO.clear()
        del x, y, dy, dx0, tx, ty, tdy
        cp.get_default_memory_pool().free_all_blocks()


def graph_ms(launch, array_sets, count=20):
    """Kernel time of one launch: `count` launches captured in a CUDA graph,
    rotating among the array sets (together larger than L2)."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        launch(*array_sets[0])
        stream.begin_capture()
        for i in range(count):
            launch(*array_sets[i % len(array_sets)])
        graph = stream.end_capture()
        graph.upload(stream)
        return timing.measure(lambda: graph.launch(stream), xp=cp, warmup=2, repeat=20).median_ms / count


def kernel_only():
    print("== global_avg_r50 (32x2048x7x7 fp32) kernel time, 20 launches in a CUDA graph over 5 "
          "input sets (65 MB: past L2) (us)")
    xs = [cp.random.random((32, 2048, 7, 7), dtype=cp.float32) for _ in range(5)]
    x = xs[0]
    y = dp.pool(x, 7, mode="avg", stride=1)
    dys = [cp.random.random(y.shape, dtype=cp.float32) for _ in range(5)]
    dxs = [cp.empty_like(x) for _ in range(5)]
    dy = dys[0]
    problem = pooling._check_problem(x, 7, "avg", 1, 0, True, "NCHW")
    call = pooling._Call(problem)
    for direction, sets, floor in (("forward", [(a, cp.empty_like(y)) for a in xs], x.nbytes + y.nbytes),
                                   ("backward", list(zip(xs, dys, dxs)), dy.nbytes + x.nbytes)):
        launch = call.launch(direction, True)
        t = graph_ms(launch, sets)
        print(f"{direction:8s} {t * 1e3:6.2f} us  floor {floor / 1e6:.1f} MB = {floor / COPY / 1e3:.2f} us"
              f" at copy speed ({timing.gbps(floor, t) / COPY:.2f} of copy)  [{launch.expression}]")
    tx = torch.from_dlpack(x)
    F = torch.nn.functional
    try:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            F.avg_pool2d(tx, 7, 1)
            g = torch.cuda.CUDAGraph()
            txs = [torch.from_dlpack(a) for a in xs]
            with torch.cuda.graph(g, stream=stream):
                for i in range(20):
                    F.avg_pool2d(txs[i % 5], 7, 1)
        torch.cuda.synchronize()
        t = timing.measure(lambda: g.replay(), xp=cp, warmup=2, repeat=20).median_ms / 20
        print(f"torch forward {t * 1e3:6.2f} us (graph)")
    except Exception as e:
        print(f"torch graph failed: {type(e).__name__}: {e}")


def final_rows():
    """Call 2: the paths changed after call 1 (float16 NCHW forward on packed pairs,
    NHWC defaults), ours vs torch, as the benchmark measures them (timing.measure,
    median of 30), and the float16 forward's rows per thread."""
    print(f"== final paths (copy {COPY:.0f} GB/s measured here; ratio = torch / ours)")
    F = torch.nn.functional
    rows = []
    for name, shape, dtype, layout in (("max3x3s2_big_f16", (64, 256, 56, 56), cp.float16, "NCHW"),
                                       ("max3x3s2_big_nhwc", (64, 56, 56, 256), cp.float32, "NHWC"),
                                       ("max3x3s2_big_nhwc f16", (64, 56, 56, 256), cp.float16, "NHWC")):
        x = cp.random.random(shape, dtype=cp.float32).astype(dtype)
        opts = dict(stride=2, padding=1, layout=layout)
        y = dp.pool(x, 3, **opts)
        dy = cp.random.random(y.shape, dtype=cp.float32).astype(dtype)
        nchw = (lambda t: t.permute(0, 3, 1, 2)) if layout == "NHWC" else (lambda t: t)
        tx = nchw(torch.from_dlpack(x)).detach().clone().requires_grad_()
        ty = F.max_pool2d(tx, 3, 2, 1)
        tdy = nchw(torch.from_dlpack(dy))
        ok_y = bool(torch.equal(nchw(torch.from_dlpack(y)), ty.detach()))
        t_f = ms(lambda: F.max_pool2d(tx, 3, 2, 1))
        t_b = ms(lambda: torch.autograd.grad(ty, tx, tdy, retain_graph=True))
        ours_f = ms(lambda: dp.pool(x, 3, **opts))
        ours_b = ms(lambda: dp.pool_backward(dy, x, y, 3, **opts))
        rows.append((name, "forward", ours_f, t_f, x.nbytes + y.nbytes))
        rows.append((name, "backward", ours_b, t_b, 2 * x.nbytes + dy.nbytes))
        print(f"{name}: y equals torch's: {ok_y}")
        if name == "max3x3s2_big_f16":
            saved = pooling._K3S2_FORWARD_ROWS[2]
            line = []
            for r in pooling._K3S2_FORWARD_ROWS_CHOICES:
                pooling._K3S2_FORWARD_ROWS[2] = r
                pooling._MEMO.clear()
                same = bool(cp.array_equal(dp.pool(x, 3, **opts), y))
                line.append(f"R={r} {ms(lambda: dp.pool(x, 3, **opts)):.4f}{'' if same else ' DIFFERS'}")
            pooling._K3S2_FORWARD_ROWS[2] = saved
            pooling._MEMO.clear()
            print("  float16 NCHW forward rows per thread: " + "  ".join(line))
        del x, y, dy, tx, ty, tdy
        cp.get_default_memory_pool().free_all_blocks()
    print(f"{'problem':22s} {'op':9s} {'ours ms':>8s} {'torch ms':>9s} {'ratio':>6s} {'of copy':>8s}")
    for name, op, ours, theirs, floor in rows:
        print(f"{name:22s} {op:9s} {ours:8.4f} {theirs:9.4f} {theirs / ours:6.2f} "
              f"{timing.gbps(floor, ours) / COPY:8.2f}")


if __name__ == "__main__":
    if sys.argv[1] == "--final":  # call 2: no benchmark JSON; copy bandwidth measured here
        COPY = timing.measure_ceilings(cp)["copy_GBps"]
        for step in (kernel_only, final_rows):
            try:
                step()
            except Exception as e:
                print(f"{step.__name__} failed: {type(e).__name__}: {e}")
        sys.exit(0)
    try:
        COPY = json.load(open(sys.argv[1]))["ceilings"]["copy_GBps"]
    except Exception:
        COPY = 3003.0
    for step in (nhwc_sweep, kernel_only):
        try:
            step()
        except Exception as e:  # keep going: the table must print
            print(f"{step.__name__} failed: {type(e).__name__}: {e}")
    short_table(sys.argv[1])
