"""Helper dft7c (notes/dft7c.md): why big_7x7_s1 "dft" forward takes 0.30-0.56 ms
between processes.  One process, one mode; notes/dft7c_gpu.sh runs several in turn.

Per process, the forward of big_7x7_s1 (N32 C64 56x56 K64 7x7 pad 3) through the public
function (algo="dft"), inputs rotated past L2:
  b2b     median of back-to-back calls, CUDA events around each (what the bench measures:
          max(host, GPU) per call);
  host    host microseconds per call, submitted while a spin kernel holds the GPU (no back
          pressure from the GPU queue);
  queued  GPU time per call: calls submitted behind the spin kernel, events around each;
  stages  the same, events around every kernel launch and cuBLAS call (GPU time each);
  cuBLAS  the arguments of every cuBLAS call (m, n, k, ld, strides, batch, pointer % 256,
          offsets from the lowest pointer of the call) and the kernels CUPTI saw
          (torch.profiler), to see whether cuBLAS picks other kernels from run to run;
  cuDNN   PyTorch (benchmark mode, TF32 off), b2b and host time the same way.
Modes: dft_first, cudnn_first, bench_like (the bench's ceilings measurement, a 1 GiB copy
and an 8192^2 SGEMM through cupy.matmul, then cuDNN first).  Prints one JSON line
"RESULT {...}" for the driver's table.

    PYTHONPATH=$PWD python notes/dft7c_diag.py MODE [--problems big_7x7_s1,big_11x11_s1]
        [--directions forward,backward_data] [--stages] [--profile]

Call 1 ran the script of the commit before this one (forward of big_7x7_s1, stages and
cuBLAS arguments of the generic path).  "generic" = DFTConvolution._run, the path of
correlate(), timed in the same process as the public (prepared) call.
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np
import cupy as cp

import dnnprims as dp
from dnnprims import _cublas
from dnnprims.algos import dft, fft
from dnnprims.bench import timing

SPIN = cp.RawKernel(r"""
extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}""", "spin")


def spin(ms):
    SPIN((1,), (1,), (np.int64(int(ms * 1.8e6)),))   # ~1.8 GHz clock: about ms milliseconds


def host_and_queued(fn, sets, calls=20):
    """(host us per call, median GPU ms per call) with the GPU held by a spin kernel."""
    cp.cuda.Device().synchronize()
    spin(60)
    events = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(calls)]
    t0 = time.perf_counter()
    for i, (e0, e1) in enumerate(events):
        e0.record()
        fn(*sets[i % len(sets)])
        e1.record()
    host = (time.perf_counter() - t0) / calls * 1e6
    cp.cuda.Device().synchronize()
    gpu = statistics.median(cp.cuda.get_elapsed_time(e0, e1) for e0, e1 in events[1:])
    return host, gpu


def stage_profile(call, reps=8):
    """GPU ms of each launch / cuBLAS call (queued behind a spin kernel), the cuBLAS arguments."""
    real = (dft.FAMILY.launch, fft.FAMILY.launch, _cublas.gemm)
    log, args = [], []

    def wrap(fn, label_of, is_gemm=False):
        def inner(*a, **k):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record()
            r = fn(*a, **k)
            e1.record()
            log.append((label_of(a), e0, e1))
            if is_gemm and record[0]:
                args.append(gemm_arguments(*a[1:4], **k))
            return r
        return inner

    record = [True]
    dft.FAMILY.launch = wrap(real[0], lambda a: a[0].split("<")[0])
    fft.FAMILY.launch = wrap(real[1], lambda a: a[0].split("<")[0])
    _cublas.gemm = wrap(real[2], lambda a: "gemm -> " + "x".join(str(s) for s in a[3].shape), True)
    stages = {}
    try:
        call()          # the arguments, once
        record[0] = False
        cp.cuda.Device().synchronize()
        for _ in range(reps):
            log.clear()
            spin(20)
            call()
            cp.cuda.Device().synchronize()
            for i, (label, e0, e1) in enumerate(log):
                stages.setdefault((i, label), []).append(cp.cuda.get_elapsed_time(e0, e1))
    finally:
        dft.FAMILY.launch, fft.FAMILY.launch, _cublas.gemm = real
    return [(label, statistics.median(ts)) for (i, label), ts in sorted(stages.items())], args


def gemm_arguments(a, b, c, trans_a=False, trans_b=False, beta=0.0):
    """What _cublas.gemm hands cuBLAS (column-major: B's storage first)."""
    la, lb = _cublas._layout(a), _cublas._layout(b)
    M, N = c.shape[-2], c.shape[-1]
    K = (a.shape[-2] if trans_a else a.shape[-1])
    batch = c.shape[0] if c.ndim == 3 else 1
    ptrs = [b.data.ptr, a.data.ptr, c.data.ptr]
    low = min(ptrs)
    return {"m": N, "n": M, "k": K, "transa": int(trans_b), "transb": int(trans_a),
            "lda": lb and lb[0], "strideA": lb and lb[1], "ldb": la and la[0], "strideB": la and la[1],
            "ldc": N, "strideC": M * N if batch > 1 else 0, "batch": batch,
            "ptr%256": [p % 256 for p in ptrs], "offsets_MB": [round((p - low) / 2**20, 3) for p in ptrs],
            "dtype": str(c.dtype)}


def cupti_kernels(call, reps=5):
    """(kernel name, calls, mean us) of every GPU kernel in reps calls (torch.profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    call()
    cp.cuda.Device().synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            call()
        cp.cuda.Device().synchronize()
        torch.cuda.synchronize()
    rows = {}
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None)
        if t is None:
            t = getattr(e, "self_cuda_time_total", 0)
        if t > 0:
            rows[e.key] = [e.count, t]
    return [(n[:110], c, t / max(c, 1)) for n, (c, t) in rows.items()]


PROBLEMS = {"big_7x7_s1": (32, 64, 56, 64, 7, 3), "big_11x11_s1": (32, 32, 64, 32, 11, 5)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("dft_first", "cudnn_first", "bench_like"))
    ap.add_argument("--problems", default="big_7x7_s1")
    ap.add_argument("--directions", default="forward")
    ap.add_argument("--stages", action="store_true", help="per-launch profile of the generic path")
    ap.add_argument("--profile", action="store_true", help="kernel names through torch.profiler")
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    import torch
    from dnnprims.algos import REGISTRY
    from dnnprims.conv import _describe
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.mode == "bench_like":
        print("ceilings", timing.measure_ceilings(cp), flush=True)
    F = torch.nn.functional
    for name in args.problems.split(","):
        N, C, H, K, R, pad = PROBLEMS[name]
        x = cp.random.standard_normal((N, C, H, H), dtype=cp.float32)
        w = cp.random.standard_normal((K, C, R, R), dtype=cp.float32) * 0.1
        dy = cp.random.standard_normal((N, K, H, H), dtype=cp.float32)
        problem = _describe(x.shape, w.shape, (1, 1), (pad, pad), (1, 1), 1, "NCHW", np.dtype("float32"))
        for direction in args.directions.split(","):
            t_start = time.time()
            a0 = x if direction == "forward" else dy
            sets = [(a0, w)] + [(a0.copy(), w.copy())
                                for _ in range(timing.rotation_count(a0.nbytes + w.nbytes) - 1)]
            t_sets = [(torch.from_dlpack(a), torch.from_dlpack(b)) for a, b in sets]
            out = cp.empty(problem.y_shape if direction == "forward" else problem.x_shape, cp.float32)
            if direction == "forward":
                ours = lambda a, b: dp.conv2d_forward(a, b, padding=pad, algo="dft")  # noqa: E731
                theirs = lambda a, b: F.conv2d(a, b, padding=pad)  # noqa: E731
            else:
                ours = lambda a, b: dp.conv2d_backward_data(a, b, (N, C, H, H), padding=pad, algo="dft")  # noqa
                theirs = lambda a, b: torch.nn.grad.conv2d_input((N, C, H, H), b, a, padding=pad)  # noqa: E731
            generic = lambda a, b: REGISTRY["dft"]._run(cp, problem, direction, a, b, out)  # noqa: E731
            res = {"mode": args.mode, "problem": name, "direction": direction}

            def measure(fn, tag, s):
                fn(*s[0])
                cp.cuda.Device().synchronize()
                res[f"b2b_{tag}"] = timing.measure(fn, s, xp=cp, warmup=3, repeat=args.repeat).median_ms
                res[f"host_us_{tag}"], res[f"queued_{tag}"] = host_and_queued(fn, s)

            if args.mode == "dft_first":
                measure(ours, "1", sets)
                measure(theirs, "cudnn", t_sets)
            else:
                measure(theirs, "cudnn", t_sets)
                measure(ours, "1", sets)
            measure(generic, "generic", sets)
            measure(ours, "2", sets)
            got, want = ours(*sets[0]), theirs(*t_sets[0])
            res["rel_err_vs_cudnn"] = float(torch.linalg.norm(torch.from_dlpack(got) - want)
                                            / torch.linalg.norm(want))
            if args.stages:
                stages, gargs = stage_profile(lambda: generic(*sets[0]))
                for label, ms in stages:
                    print(f"   {label:36s} {ms:.4f}")
                print(f"   {'sum of stages':36s} {sum(ms for _, ms in stages):.4f}")
                for g in gargs:
                    print("   cuBLAS", json.dumps(g))
            if args.profile:
                try:
                    for k in cupti_kernels(lambda: ours(*sets[0])):
                        print(f"   kernel {k[1]:3d} x {k[2]:8.1f} us  {k[0]}")
                except Exception as e:   # the profiler is a diagnosis aid only
                    print("   profiler failed:", repr(e)[:200])
            res["seconds"] = time.time() - t_start
            print(f"[{args.mode} {name} {direction}] dft b2b {res['b2b_1']:.3f}/{res['b2b_2']:.3f} ms, host "
                  f"{res['host_us_1']:.0f}/{res['host_us_2']:.0f} us, queued {res['queued_1']:.3f}; generic path b2b "
                  f"{res['b2b_generic']:.3f} host {res['host_us_generic']:.0f} us; cuDNN b2b {res['b2b_cudnn']:.3f} "
                  f"host {res['host_us_cudnn']:.0f} us queued {res['queued_cudnn']:.3f}; "
                  f"err {res['rel_err_vs_cudnn']:.1e}", flush=True)
            print("RESULT " + json.dumps(res), flush=True)
        del x, w, dy
        cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
