"""Per-call host overhead on cached problems: ``python -m dnnprims.bench.overhead``.

For tiny problems the GPU finishes a kernel in a few microseconds, so what a
call costs is the Python work around the launch: argument checks, describing
the problem, choosing an algorithm, allocating the output, packing kernel
arguments.  This measures it directly: the wall-clock time of many calls in a
row without synchronising (the GPU keeps up, so the host is the bottleneck),
divided by the number of calls, after warm-up (compilation, plan caches).
PyTorch's equivalent calls are timed the same way where torch is installed.
``--profile NAME`` prints cProfile's top entries for one operation.

Target (issue 3): <= 20 us per call on a cached problem.
"""
import argparse
import cProfile
import pstats
import statistics
import time

import numpy as np

import dnnprims as dp

CALLS = 2000
BURST = 100


def _cases(cp, torch):
    """name -> (our call, torch's call or None) on small tensors."""
    f32 = cp.float32
    x = cp.random.random((1, 64, 56, 56), dtype=f32)
    w = cp.random.random((64, 64, 3, 3), dtype=f32)
    w1 = cp.random.random((64, 64, 1, 1), dtype=f32)
    bn_x = cp.random.random((32, 256, 7, 7), dtype=f32)
    gamma, beta = cp.ones(256, f32), cp.zeros(256, f32)
    rm, rv = cp.zeros(256, f32), cp.ones(256, f32)
    rows = cp.random.random((256, 1000), dtype=f32)
    bn_dy = cp.random.random(bn_x.shape, dtype=f32)
    _, bn_mean, bn_invstd = dp.batchnorm(bn_x, gamma, beta, training=True, return_stats=True)
    late = cp.random.random((32, 2048, 7, 7), dtype=f32)        # global_avg_r50
    pool_dy = cp.random.random((1, 64, 28, 28), dtype=f32)
    act = cp.random.random((64, 1024), dtype=f32)
    cases = {
        "conv2d_forward 3x3 b1": (lambda: dp.conv2d_forward(x, w, padding=1), None),
        "conv2d_forward 1x1 b1": (lambda: dp.conv2d_forward(x, w1), None),
        "conv2d_backward_data 3x3 b1": (lambda: dp.conv2d_backward_data(x, w, x.shape, padding=1), None),
        "conv2d_backward_filter 3x3 b1": (lambda: dp.conv2d_backward_filter(x, x, w.shape, padding=1), None),
        "batchnorm train": (lambda: dp.batchnorm(bn_x, gamma, beta, rm, rv, training=True), None),
        "batchnorm infer": (lambda: dp.batchnorm(bn_x, gamma, beta, rm, rv, training=False), None),
        "batchnorm backward": (lambda: dp.batchnorm_backward(bn_dy, bn_x, gamma, mean=bn_mean,
                                                             invstd=bn_invstd), None),
        "pool max 3x3 s2": (lambda: dp.pool(x, 3, stride=2, padding=1), None),
        "pool max 3x3 s2 backward": (lambda: dp.pool_backward(pool_dy, x, None, 3, stride=2, padding=1),
                                     None),
        "pool global avg 32x2048x7x7": (lambda: dp.pool(late, 7, mode="avg"), None),
        "softmax 256x1000": (lambda: dp.softmax(rows), None),
        "softmax backward 256x1000": (lambda: dp.softmax_backward(rows, rows), None),
        "activation relu": (lambda: dp.activation(act, "relu"), None),
        "activation backward relu": (lambda: dp.activation_backward(act, act, "relu"), None),
    }
    if torch is not None:
        F = torch.nn.functional
        t = torch.from_dlpack
        tx, tw, tw1, tbn = t(x), t(w), t(w1), t(bn_x)
        tg, tb, trm, trv = t(gamma), t(beta), t(rm), t(rv)
        trows, tact = t(rows), t(act)
        tbn_dy, tlate, tpool_dy = t(bn_dy), t(late), t(pool_dy)
        tbn_g = tbn.detach().clone().requires_grad_()
        tg_g, tb_g = tg.detach().clone().requires_grad_(), tb.detach().clone().requires_grad_()
        tbn_y = F.batch_norm(tbn_g, None, None, tg_g, tb_g, training=True)
        tx_g = tx.detach().clone().requires_grad_()
        tpool_y = F.max_pool2d(tx_g, 3, 2, 1)
        theirs = {
            "conv2d_forward 3x3 b1": lambda: F.conv2d(tx, tw, padding=1),
            "conv2d_forward 1x1 b1": lambda: F.conv2d(tx, tw1),
            "conv2d_backward_data 3x3 b1": lambda: torch.nn.grad.conv2d_input(tx.shape, tw, tx, padding=1),
            "conv2d_backward_filter 3x3 b1": lambda: torch.nn.grad.conv2d_weight(tx, tw.shape, tx, padding=1),
            "batchnorm train": lambda: F.batch_norm(tbn, trm, trv, tg, tb, training=True),
            "batchnorm infer": lambda: F.batch_norm(tbn, trm, trv, tg, tb, training=False),
            "batchnorm backward": lambda: torch.autograd.grad(tbn_y, (tbn_g, tg_g, tb_g), tbn_dy,
                                                              retain_graph=True),
            "pool max 3x3 s2": lambda: F.max_pool2d(tx, 3, 2, 1),
            "pool max 3x3 s2 backward": lambda: torch.autograd.grad(tpool_y, tx_g, tpool_dy, retain_graph=True),
            "pool global avg 32x2048x7x7": lambda: F.avg_pool2d(tlate, 7),
            "softmax 256x1000": lambda: torch.softmax(trows, 1),
            "softmax backward 256x1000": lambda: torch._softmax_backward_data(trows, trows, 1, trows.dtype),
            "activation relu": lambda: torch.relu(tact),
            "activation backward relu": lambda: torch.ops.aten.threshold_backward(tact, tact, 0),
        }
        cases = {k: (ours, theirs.get(k)) for k, (ours, _) in cases.items()}
    return cases


def per_call_us(fn, cp, calls=CALLS, burst=BURST):
    """Host microseconds per call: bursts of ``burst`` calls, synchronised between
    bursts, the median burst.  A burst stays well under CUDA's queue of pending
    launches, so a kernel that runs longer than its call's host time (a batch-1
    3x3 convolution takes ~50 us on the GPU) cannot block the loop and be
    counted as host time; one long loop would measure the GPU instead."""
    stream = cp.cuda.get_current_stream()
    for _ in range(20):
        fn()
    stream.synchronize()
    samples = []
    for _ in range(max(1, calls // burst)):
        t0 = time.perf_counter()
        for _ in range(burst):
            fn()
        samples.append((time.perf_counter() - t0) / burst * 1e6)
        stream.synchronize()
    return statistics.median(samples)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m dnnprims.bench.overhead", description=__doc__)
    parser.add_argument("--profile", default=None, help="cProfile one case (a name substring)")
    parser.add_argument("--calls", type=int, default=CALLS)
    args = parser.parse_args(argv)
    import cupy as cp
    try:
        import torch
        torch.backends.cudnn.benchmark = True
    except ImportError:
        torch = None
    cases = _cases(cp, torch)
    if args.profile:
        name = next(k for k in cases if args.profile in k)
        fn = cases[name][0]
        per_call_us(fn, cp, 50)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            fn()
        prof.disable()
        cp.cuda.get_current_stream().synchronize()
        print(f"== cProfile of {name}, {args.calls} calls")
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
        return 0
    from dnnprims import _kernels, activations
    # "no reuse": the same calls with every output allocated (OutputSlot off).
    print(f"{'operation':34s} {'ours us/call':>12s} {'torch us/call':>13s} {'ours, no reuse':>14s}")
    for name, (ours, theirs) in cases.items():
        mine = per_call_us(ours, cp, args.calls)
        other = per_call_us(theirs, cp, args.calls) if theirs is not None else float("nan")
        reuse = _kernels.set_output_reuse(False)
        try:
            fresh = per_call_us(ours, cp, args.calls)
        finally:
            _kernels.set_output_reuse(reuse)
        print(f"{name:34s} {mine:12.1f} {other:13.1f} {fresh:14.1f}")
    # What the pieces cost, for reading the profile.
    a = cp.empty(16, cp.float32)
    f32 = np.dtype(np.float32)
    act = cp.empty((64, 1024), f32)
    out = cp.empty_like(act)
    expr, grid, scalars = activations._cached_plan("forward", "relu", "none", None, act.size, f32, True)
    prepared = activations.FAMILY.prepare(expr, grid, (activations._BLOCK,),
                                          (_kernels.ARRAY0, _kernels.ARRAY1, *scalars))
    # The same launch with its arguments packed in the C layout, through cuLaunchKernel's
    # ``extra``: checked against kernelParams (a driver error would fall back to CuPy).
    packed = _kernels.PreparedLaunch(activations.FAMILY.function(expr), grid, (activations._BLOCK,),
                                     (_kernels.ARRAY0, _kernels.ARRAY1, *scalars), packed=True)
    check = cp.empty_like(act)
    prepared(act, out)
    packed(act, check)                  # writes the pointers (CuPy's launch on a driver error)
    try:                                # the driver's answer to the packed buffer itself
        _kernels._launch_kernel(packed._ptr, *packed._dims, 0, cp.cuda.get_current_stream().ptr,
                                packed._params_ptr, packed._extra_ptr)
        packed_ok = "driver accepted"
    except Exception as e:  # reported, then timed anyway (it falls back to CuPy's launch)
        packed_ok = f"driver error {e}"
    cp.cuda.get_current_stream().synchronize()
    print(f"packed (extra) launch: {packed_ok}; same result: {bool((check == out).all())}")
    slot = _kernels.OutputSlot((32, 256, 7, 7), f32)
    pieces = {
        "cupy.empty(shape, cp.float32)": lambda: cp.empty((32, 256, 7, 7), cp.float32),
        "cupy.ndarray(shape, dtype)": lambda: cp.ndarray((32, 256, 7, 7), f32),
        "cupy.cuda.runtime.getDevice": cp.cuda.runtime.getDevice,
        "cupy.cuda.get_current_stream": cp.cuda.get_current_stream,
        "ndarray.device.id": lambda: a.device.id,
        "FAMILY.launch (relu, 5 args)": lambda: activations.FAMILY.launch(
            expr, grid, (activations._BLOCK,), (act, out, *scalars)),
        "PreparedLaunch (relu, 5 args)": lambda: prepared(act, out),
        "PreparedLaunch packed (extra)": lambda: packed(act, out),
        "OutputSlot, output dropped": slot,
    }
    for name, fn in pieces.items():
        print(f"{'  ' + name:34s} {per_call_us(fn, cp, args.calls):12.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
