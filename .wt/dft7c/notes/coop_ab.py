"""Same process, same tree: batch norm's grid-barrier paths with the cooperative
launch (as shipped) against the same launches through plain cuLaunchKernel (the
code before; safe here: the grids are sized to what is resident), alternated
A B A B.  Host us per call (bursts of 100) and CUDA-event ms.  Compiles only the
four fp32 specialisations it needs (one process each) so it fits a short call.
    python notes/coop_ab.py"""
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor

SPECS = ("batchnorm_train_fused<float, float, int, 4, true>", "batchnorm_backward_fused<float, float, int, 4>",
         "batchnorm_rows_train_fused<float, float, int, 4>", "batchnorm_rows_backward_fused<float, float, int, 4>")


def _module(spec):
    import cupy
    from dnnprims import _kernels, normalization
    return cupy.RawModule(code=normalization.FAMILY.source, options=_kernels.COMPILE_OPTIONS, name_expressions=(spec,))


def _compile(spec):
    _module(spec).compile()
    return spec


def main():
    t0 = time.time()
    with ProcessPoolExecutor(4, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_compile, SPECS))
    print(f"compiled {len(SPECS)} specs in {time.time() - t0:.1f} s", flush=True)
    import numpy as np
    import cupy as cp
    from cupy.cuda import driver
    import dnnprims as dp
    from dnnprims import _kernels, normalization
    from dnnprims.bench.overhead import per_call_us
    from dnnprims.bench.timing import measure
    device = cp.cuda.runtime.getDevice()
    for spec in SPECS:  # the single-spec modules (disk cache) instead of the whole kernel group
        normalization.FAMILY._functions[(device, spec)] = _module(spec).get_function(spec)
    cooperative = _kernels._launch_cooperative_kernel
    plain = driver.launchKernel
    variants = {
        "cooperative": lambda f, gx, gy, gz, bx, by, bz, sh, st, p: cooperative(f, gx, gy, gz, bx, by, bz, sh, st, p),
        "plain": lambda f, gx, gy, gz, bx, by, bz, sh, st, p: plain(f, gx, gy, gz, bx, by, bz, sh, st, p, 0),
    }
    rng = np.random.default_rng(0)
    cases = {}
    for name, shape, layout in (("NCHW 32x256x8x8", (32, 256, 8, 8), "NCHW"),
                                ("NHWC 32x7x7x256", (32, 7, 7, 256), "NHWC"),
                                ("NHWC 64x56x56x256", (64, 56, 56, 256), "NHWC")):
        c = shape[1] if layout == "NCHW" else shape[-1]
        x = cp.asarray(rng.random(shape, dtype=np.float32))
        dy = cp.asarray(rng.random(shape, dtype=np.float32))
        g, b = cp.asarray(np.ones(c, np.float32)), cp.asarray(np.zeros(c, np.float32))
        rm, rv = cp.asarray(np.zeros(c, np.float32)), cp.asarray(np.ones(c, np.float32))
        _, mean, invstd = dp.batchnorm(x, g, b, layout=layout, return_stats=True)
        cases[f"train {name}"] = (lambda x=x, g=g, b=b, rm=rm, rv=rv, layout=layout:
                                  dp.batchnorm(x, g, b, rm, rv, training=True, layout=layout), "64x" not in name)
        cases[f"backward {name}"] = (lambda dy=dy, x=x, g=g, mean=mean, invstd=invstd, layout=layout:
                                     dp.batchnorm_backward(dy, x, g, mean=mean, invstd=invstd, layout=layout),
                                     "64x" not in name)
    results = {}
    for rnd in range(2):
        for variant, fn_launch in variants.items():
            _kernels._launch_cooperative_kernel = fn_launch
            for name, (fn, host) in cases.items():
                ms = measure(fn, xp=cp, warmup=5, repeat=100).median_ms
                us = per_call_us(fn, cp, calls=1000) if host else float("nan")
                results.setdefault((name, variant), []).append((us, ms))
    _kernels._launch_cooperative_kernel = cooperative
    print(f"refused: {_kernels.cooperative_refusals}; total {time.time() - t0:.1f} s")
    print(f"{'case':30s} {'host us coop':>13s} {'plain':>7s} {'event ms coop':>14s} {'plain':>8s}   (2 rounds each)")
    for name in cases:
        co, pl = results[(name, "cooperative")], results[(name, "plain")]
        h = lambda r: "/".join(f"{u:.1f}" for u, _ in r)  # noqa: E731
        e = lambda r: "/".join(f"{m:.4f}" for _, m in r)  # noqa: E731
        print(f"{name:30s} {h(co):>13s} {h(pl):>13s} {e(co):>15s} {e(pl):>15s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
