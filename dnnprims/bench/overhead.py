"""Per-call host overhead on cached problems: ``python -m dnnprims.bench.overhead``.

For tiny problems the GPU finishes a kernel in a few microseconds, so what a
call costs is the Python work around the launch: argument checks, describing
the problem, choosing an algorithm, allocating the output, packing kernel
arguments.  This measures it directly, after warm-up (compilation, plan
caches): bursts of calls with no synchronisation, the wall-clock time of a
burst divided by its calls, the median burst.

Each burst runs while the GPU is held by a busy-wait kernel (``spin_wait_ns``,
kernels/bench_spin.cu) launched just before it, longer than the burst: every
launch of the burst queues behind it, so the burst's time is host work alone.
Without the spin a call whose GPU work outlasts its host work (a batch-1
Winograd convolution: three kernels and a GEMM) measures a mix of the two, and
a hidden synchronisation (a blocking free, a ``.get()``) is invisible.  With
it, a burst that outlasts the spin has waited for the GPU: such rows are
flagged ``sync?`` (a synchronisation, or more launches than CUDA queues).  The
GPU time per call (CUDA events from the spin's end to the burst's end: the
burst's kernels back to back) is reported too; ``gpu>=host`` marks rows whose
calls a free-running loop could not issue faster than the GPU runs them
(there the host figure is no bound on a real loop's time per call).
"free" is the old method (no spin) for comparison with earlier logs.
PyTorch's equivalent calls are timed the same way where torch is installed.
``--profile NAME`` prints cProfile's top entries for one operation;
``--only A,B`` times the cases whose names contain A or B.

Target (issue 3): <= 20 us per call on a cached problem.
"""
import argparse
import cProfile
import pstats
import statistics
import time

import numpy as np

import dnnprims as dp
from dnnprims._kernels import KernelFamily

CALLS = 2000
BURST = 100
# The busy wait that holds the GPU during a timed burst: at least SPIN_MIN_S, and
# SPIN_FACTOR times a free-running burst (so a burst slower than that is a wait).
SPIN_MIN_S = 2e-3
SPIN_FACTOR = 4
SPIN = KernelFamily("bench_spin.cu", ["spin_wait_ns"])


def _cases(cp, torch, wanted=None):
    """name -> (our call, torch's call or None) on small tensors (``wanted``: name
    substrings; the batch-norm statistics, whose kernels take a while to compile on
    a fresh machine, are only made when a batch-norm case is wanted)."""
    f32 = cp.float32
    x = cp.random.random((1, 64, 56, 56), dtype=f32)
    w = cp.random.random((64, 64, 3, 3), dtype=f32)
    w1 = cp.random.random((64, 64, 1, 1), dtype=f32)
    bn_x = cp.random.random((32, 256, 7, 7), dtype=f32)
    gamma, beta = cp.ones(256, f32), cp.zeros(256, f32)
    rm, rv = cp.zeros(256, f32), cp.ones(256, f32)
    rows = cp.random.random((256, 1000), dtype=f32)
    bn_dy = cp.random.random(bn_x.shape, dtype=f32)
    if wanted is None or any(w in "batchnorm backward" for w in wanted):
        _, bn_mean, bn_invstd = dp.batchnorm(bn_x, gamma, beta, training=True, return_stats=True)
    else:
        bn_mean = bn_invstd = None
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
    """Host microseconds per call, free-running: bursts of ``burst`` calls,
    synchronised between bursts, the median burst.  Where the GPU takes longer
    per call than the host, this is not host time (see :func:`measure`)."""
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


def measure(fn, cp, calls=CALLS, burst=BURST):
    """(host us per call, GPU us per call, fraction of bursts the spin covered).

    Each burst is timed while a busy-wait kernel holds the stream (longer than
    a free-running burst takes, :data:`SPIN_FACTOR`): the host loop is all
    that is timed.  A burst is covered when it ended before the spin could
    have: any burst that waited for the GPU is not."""
    stream = cp.cuda.get_current_stream()
    for _ in range(20):
        fn()
    stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(burst):
        fn()
    free = time.perf_counter() - t0
    stream.synchronize()
    spin_ns = np.int64(max(SPIN_MIN_S, SPIN_FACTOR * free) * 1e9)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    host, gpu, covered = [], [], 0
    bursts = max(1, calls // burst)
    for _ in range(bursts):
        launched = time.perf_counter()
        SPIN.launch("spin_wait_ns", (1,), (1,), (spin_ns,))
        start.record(stream)
        t0 = time.perf_counter()
        for _ in range(burst):
            fn()
        t1 = time.perf_counter()
        end.record(stream)
        end.synchronize()
        host.append((t1 - t0) / burst * 1e6)
        gpu.append(cp.cuda.get_elapsed_time(start, end) * 1e3 / burst)
        covered += (t1 - launched) * 1e9 < spin_ns
    return statistics.median(host), statistics.median(gpu), covered / bursts


def _flags(host, gpu, covered):
    flags = []
    if covered < 1:
        flags.append(f"sync?({1 - covered:.0%})")
    if gpu >= host:
        flags.append("gpu>=host")
    return " ".join(flags)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m dnnprims.bench.overhead", description=__doc__)
    parser.add_argument("--profile", default=None, help="cProfile one case (a name substring)")
    parser.add_argument("--calls", type=int, default=CALLS)
    parser.add_argument("--only", default=None, help="comma-separated name substrings: time only these")
    parser.add_argument("--no-pieces", action="store_true", help="skip the table of pieces")
    args = parser.parse_args(argv)
    import cupy as cp
    try:
        import torch
        torch.backends.cudnn.benchmark = True
    except ImportError:
        torch = None
    wanted = args.only.split(",") if args.only else None
    cases = _cases(cp, torch, wanted)
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
    if wanted:
        cases = {k: v for k, v in cases.items() if any(w in k for w in wanted)}
    # host / GPU: us per call with the GPU held by a spin (see measure); "no reuse":
    # the same calls with every output allocated (OutputSlot off); "free": no spin.
    print(f"{'operation':30s} {'ours host':>9s} {'ours GPU':>8s} {'free':>6s} {'torch host':>10s} "
          f"{'torch GPU':>9s} {'no reuse':>8s}  flags (ours; torch)")
    for name, (ours, theirs) in cases.items():
        host, gpu, covered = measure(ours, cp, args.calls)
        free = per_call_us(ours, cp, args.calls)
        if theirs is not None:
            t_host, t_gpu, t_covered = measure(theirs, cp, args.calls)
            t_flags = _flags(t_host, t_gpu, t_covered)
        else:
            t_host = t_gpu = float("nan")
            t_flags = ""
        reuse = _kernels.set_output_reuse(False)
        try:
            fresh, _, fresh_covered = measure(ours, cp, args.calls)
        finally:
            _kernels.set_output_reuse(reuse)
        flags = _flags(host, gpu, min(covered, fresh_covered))
        print(f"{name:30s} {host:9.1f} {gpu:8.1f} {free:6.1f} {t_host:10.1f} {t_gpu:9.1f} {fresh:8.1f}  "
              f"{flags or '-'}; {t_flags or '-'}", flush=True)
    if args.no_pieces:
        return 0
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
        print(f"{'  ' + name:34s} {measure(fn, cp, args.calls)[0]:12.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
