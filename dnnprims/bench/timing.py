"""The one timing helper, the device ceilings, and the FLOP/byte accounting.

``measure`` times a callable: on the GPU with CUDA events recorded on the
current stream around each call (so launch overhead between calls counts, as
it does for a user), on the CPU with ``time.perf_counter``; warm-up calls
first (compilation, handle creation, caches), then the median of ``repeat``
calls.  When the inputs fit in L2 (50 MB on the H100) repeated calls over one
buffer measure the cache, so callers may pass several input sets and the
calls rotate among them.
"""
import dataclasses
import os
import statistics
import time

import numpy as np

# Inputs smaller than this are rotated among several copies when timed
# (the H100's L2 is 50 MB; leave headroom for outputs).
L2_BYTES = 50 * 2**20


@dataclasses.dataclass(frozen=True)
class Timing:
    median_ms: float
    min_ms: float
    repeats: int

    def __str__(self):
        return f"{self.median_ms:.3f} ms"


def _is_cupy(xp):
    return xp is not None and xp.__name__ == "cupy"


def measure(fn, inputs=None, *, xp=None, warmup=3, repeat=20):
    """Median time of ``fn(*inputs[i % len(inputs)])`` (or ``fn()`` when inputs is None).

    ``xp`` is the array module the work runs on: cupy -> CUDA events on the
    current stream, numpy/None -> host clock."""
    sets = [()] if inputs is None else [tuple(s) for s in inputs]
    for i in range(warmup):
        fn(*sets[i % len(sets)])
    samples = []
    if _is_cupy(xp):
        stream = xp.cuda.get_current_stream()
        stream.synchronize()
        events = [(xp.cuda.Event(), xp.cuda.Event()) for _ in range(repeat)]
        for i, (start, end) in enumerate(events):
            start.record(stream)
            fn(*sets[i % len(sets)])
            end.record(stream)
        events[-1][1].synchronize()
        samples = [xp.cuda.get_elapsed_time(start, end) for start, end in events]
    else:
        for i in range(repeat):
            t0 = time.perf_counter()
            fn(*sets[i % len(sets)])
            samples.append((time.perf_counter() - t0) * 1e3)
    return Timing(statistics.median(samples), min(samples), repeat)


def measure_queued(fn, inputs=None, *, xp, hold, calls=20, warmup=2, repeat=10, hold_s=5e-3):
    """Device time of one call of ``fn``, host time and launch latency taken out:
    ``hold(ns)`` launches a busy-wait kernel that holds the current stream for
    ``hold_s``, ``calls`` calls (rotating among the input sets) queue behind it,
    and CUDA events from the hold's end to the last call's end time them back to
    back.  Works for any callable that does not synchronise (ours, PyTorch's,
    a copy), with no graph capture.  Returns (Timing per call, covered): covered
    is False when a burst took the host longer than the hold (a hidden
    synchronisation, or calls slower to issue than ``hold_s``), so the GPU may
    have idled between calls and the figure is an upper bound."""
    sets = [()] if inputs is None else [tuple(s) for s in inputs]
    stream = xp.cuda.get_current_stream()
    for i in range(warmup):
        fn(*sets[i % len(sets)])
    stream.synchronize()
    start, end = xp.cuda.Event(), xp.cuda.Event()
    samples, covered = [], True
    for _ in range(repeat):
        t0 = time.perf_counter()
        hold(int(hold_s * 1e9))
        start.record(stream)
        for i in range(calls):
            fn(*sets[i % len(sets)])
        end.record(stream)
        covered &= time.perf_counter() - t0 < hold_s
        end.synchronize()
        samples.append(xp.cuda.get_elapsed_time(start, end) / calls)
    return Timing(statistics.median(samples), min(samples), repeat), covered


def rotation_count(nbytes, limit=L2_BYTES, most=4):
    """How many input sets to rotate among so that they do not all sit in L2."""
    if nbytes <= 0:
        return 1
    return int(min(most, max(1, -(-3 * limit // (nbytes * 2)))))


def measure_ceilings(cp, copy_bytes=2**30, gemm_size=8192, repeat=10):
    """Measured ceilings of the current GPU: device-to-device copy bandwidth
    (bytes read + written, GB/s) and SGEMM fp32 without TF32 (TFLOP/s)."""
    tf32 = os.environ.get("CUPY_TF32", "0")
    n = copy_bytes // 4
    src = cp.random.random(n, dtype=cp.float32)
    dst = cp.empty_like(src)
    t = measure(lambda: dst.__setitem__(Ellipsis, src), xp=cp, warmup=3, repeat=repeat)
    copy_gbs = 2 * src.nbytes / (t.median_ms * 1e-3) / 1e9
    del src, dst
    a = cp.random.random((gemm_size, gemm_size), dtype=cp.float32) - 0.5
    b = cp.random.random((gemm_size, gemm_size), dtype=cp.float32) - 0.5
    out = cp.empty_like(a)
    t = measure(lambda: cp.matmul(a, b, out=out), xp=cp, warmup=2, repeat=repeat)
    sgemm = 2 * gemm_size**3 / (t.median_ms * 1e-3) / 1e12
    del a, b, out
    cp.get_default_memory_pool().free_all_blocks()
    return {"copy_GBps": copy_gbs, "sgemm_fp32_TFLOPs": sgemm, "sgemm_size": gemm_size,
            "copy_bytes_each_way": copy_bytes, "CUPY_TF32": tf32}


def conv_flops(p):
    """Direct-convolution work of one direction: 2 * N * K * P * Q * (C / groups) * R * S."""
    return 2 * p["N"] * p["K"] * p["P"] * p["Q"] * (p["C"] // p["groups"]) * p["R"] * p["S"]


def conv_bytes(p, direction, itemsize=4):
    """Fewest bytes a direction must move: read its two inputs, write its output once."""
    x = p["N"] * p["C"] * p["H"] * p["W"]
    w = p["K"] * (p["C"] // p["groups"]) * p["R"] * p["S"]
    y = p["N"] * p["K"] * p["P"] * p["Q"]
    return itemsize * (x + w + y)


def multi_pass_floor(passes_bytes, once_bytes, reread_bytes, cache_bytes=None):
    """Floor of an operation that must pass over ``reread_bytes`` of input twice when it does not
    fit in L2 (batchnorm's statistics, then normalise): ``passes_bytes``.  When those inputs fit
    in L2 the second pass is served from it, so a correct algorithm moves only ``once_bytes``
    through device memory (each input read once, each output written once)."""
    cache_bytes = L2_BYTES if cache_bytes is None else cache_bytes
    return once_bytes if reread_bytes <= cache_bytes else passes_bytes


def tflops(flops, ms):
    return flops / (ms * 1e-3) / 1e12 if ms and ms > 0 else float("nan")


def gbps(nbytes, ms):
    return nbytes / (ms * 1e-3) / 1e9 if ms and ms > 0 else float("nan")


def geometric_mean(values):
    values = [v for v in values if v is not None and np.isfinite(v) and v > 0]
    if not values:
        return float("nan")
    return float(np.exp(np.mean(np.log(values))))
