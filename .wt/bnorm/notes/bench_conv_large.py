"""Stage timings of the "dft" convolution on the two public large-filter layers
(H100 run of helper conv_large; notes/conv_large.md).

    python notes/bench_conv_large.py          # prints a table per problem/direction
    python notes/bench_conv_large.py --fused  # the same with the WIP kernels on (dft.FUSED_*)

Each step of dnnprims/algos/dft.py (GEMMs, transposes, filter spectrum, bias)
is wrapped so that CUDA events are recorded around it; a step's time is the
median over repeats of its event-to-event time (GPU time, launch gaps
included).  "call" is the whole public call, CUDA events, median, and "fft" the
cuFFT algorithm on the same data; cuDNN (torch, benchmark mode, TF32 off) too.
"""
import sys

import numpy as np
import cupy

import dnnprims
from dnnprims import conv
from dnnprims.algos import dft as D

PROBLEMS = {"big_7x7_s1": (32, 64, 56, 64, 7, 3), "alex_conv2_5x5": (32, 64, 27, 192, 5, 2)}
REPEAT = 20

_log = []
_depth = [0]   # only outermost steps are logged (the filter spectrum contains GEMMs / a kernel)


def _timed(label, fn, *args, **kwargs):
    if _depth[0]:
        return fn(*args, **kwargs)
    e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
    _depth[0] += 1
    try:
        e0.record()
        r = fn(*args, **kwargs)
        e1.record()
    finally:
        _depth[0] -= 1
    _log.append((label, e0, e1))
    return r


def _wrap(label_of, fn):
    return lambda *args, **kwargs: _timed(label_of(args), fn, *args, **kwargs)


class _Cublas:
    def __init__(self, real):
        self.real = real

    def gemm(self, xp, a, b, c, **kw):
        kind = "cgemm" if c.dtype.kind == "c" else "sgemm"
        label = f"{kind} -> {'x'.join(map(str, c.shape))}" + (" (T)" if kw.get("trans_a") else "")
        return _timed(label, self.real.gemm, xp, a, b, c, **kw)


_ORIGINAL = {}


def _restore():
    for k, v in _ORIGINAL.items():
        setattr(D, k, v)
    D.FAMILY.__dict__.pop("launch", None)


def _instrument():
    """Log every step of dft.py: its cuBLAS calls, its own kernels (transpose,
    and with dft.FUSED_ROWS the fused W-axis kernels), the filter spectrum as one step."""
    for k in ("_cublas", "_transpose", "_filter_spectrum"):
        _ORIGINAL.setdefault(k, getattr(D, k))
    _restore()
    D._cublas = _Cublas(D._cublas)
    D._transpose = _wrap(lambda a: f"transpose {a[3]}x{a[4]}", D._transpose)
    D._filter_spectrum = _wrap(lambda a: "filter spectrum", D._filter_spectrum)
    launch = type(D.FAMILY).launch.__get__(D.FAMILY)
    D.FAMILY.launch = _wrap(lambda a: "kernel " + a[0].split("<")[0], launch)


def _time(fn, repeat=REPEAT):
    for _ in range(3):
        fn()
    cupy.cuda.Device().synchronize()
    ts = []
    for _ in range(repeat):
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        ts.append(cupy.cuda.get_elapsed_time(e0, e1))
    return float(np.median(ts))


def main():
    import torch
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rng = np.random.default_rng(0)
    summary = []
    for name, (N, C, H, K, R, pad) in PROBLEMS.items():
        x = cupy.asarray(rng.standard_normal((N, C, H, H), dtype=np.float32))
        w = cupy.asarray(rng.standard_normal((K, C, R, R), dtype=np.float32) * 0.1)
        y = conv.conv2d_forward(x, w, padding=pad, algo="dft")
        dy = cupy.asarray(rng.standard_normal(y.shape, dtype=np.float32))
        tx, tw, tdy = (torch.as_tensor(a, device="cuda") for a in (x, w, dy))
        calls = {
            "forward": (lambda a: conv.conv2d_forward(x, w, padding=pad, algo=a),
                        lambda: torch.nn.functional.conv2d(tx, tw, padding=pad)),
            "backward_data": (lambda a: conv.conv2d_backward_data(dy, w, x.shape, padding=pad, algo=a),
                              lambda: torch.nn.grad.conv2d_input(tx.shape, tw, tdy, padding=pad)),
            "backward_filter": (lambda a: conv.conv2d_backward_filter(x, dy, w.shape, padding=pad, algo=a),
                                lambda: torch.nn.grad.conv2d_weight(tx, tw.shape, tdy, padding=pad)),
        }
        t64 = [a.double() for a in (tx, tw, tdy)]
        exact = {"forward": lambda: torch.nn.functional.conv2d(t64[0], t64[1], padding=pad),
                 "backward_data": lambda: torch.nn.grad.conv2d_input(tx.shape, t64[1], t64[2], padding=pad),
                 "backward_filter": lambda: torch.nn.grad.conv2d_weight(t64[0], tw.shape, t64[2], padding=pad)}
        for direction, (ours, theirs) in calls.items():
            try:
                ref = exact[direction]()
                got = torch.as_tensor(ours("dft"), device="cuda").double()
                err = float(torch.linalg.norm(got - ref) / torch.linalg.norm(ref))
                t_dft = _time(lambda: ours("dft"))
                t_fft = _time(lambda: ours("fft"))
                t_cudnn = _time(theirs)
                # stage profile: one instrumented call after warm-up, median of REPEAT
                stages = {}
                _instrument()
                for _ in range(REPEAT):
                    _log.clear()
                    ours("dft")
                    cupy.cuda.Device().synchronize()
                    for i, (label, e0, e1) in enumerate(_log):
                        stages.setdefault((i, label), []).append(cupy.cuda.get_elapsed_time(e0, e1))
                _restore()
                print(f"\n{name} {direction} (fused rows={D.FUSED_ROWS}, filter={D.FUSED_FILTER}): dft {t_dft:.3f} ms, fft {t_fft:.3f}, cuDNN {t_cudnn:.3f} "
                      f"(cuDNN/dft {t_cudnn / t_dft:.2f}), dft rel. error vs fp64 {err:.1e}")
                total = 0.0
                for (i, label), ts in sorted(stages.items()):
                    m = float(np.median(ts))
                    total += m
                    print(f"   {label:40s} {m:.4f}")
                print(f"   {'sum of stages':40s} {total:.4f}")
                summary.append((name, direction, t_cudnn, t_fft, t_dft, err))
            except Exception:  # keep the other rows
                import traceback
                traceback.print_exc()

    print("\n| problem | direction | cuDNN ms | fft ms | dft ms | cuDNN/dft | dft error |")
    print("|---|---|---|---|---|---|---|")
    for name, d, c, f, t, e in summary:
        print(f"| {name} | {d} | {c:.3f} | {f:.3f} | {t:.3f} | {c / t:.2f} | {e:.1e} |")


if __name__ == "__main__":
    if "--fused" in sys.argv[1:]:   # the work-in-progress kernels, both flags
        D.FUSED_ROWS = D.FUSED_FILTER = True
    sys.exit(main())
