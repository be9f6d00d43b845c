"""Host us per call and CUDA-event ms of batch norm's grid-barrier (fused) paths,
for the dnnprims on PYTHONPATH (before / after the cooperative launch: run once
per tree).  Prints one JSON object.   python notes/coop_probe.py LABEL"""
import json
import sys

import cupy as cp

import dnnprims as dp
from dnnprims import _kernels
from dnnprims.bench.overhead import per_call_us
from dnnprims.bench.timing import measure

cooperative = []
if hasattr(_kernels, "_launch_cooperative_kernel"):  # count the cooperative launches (after)
    real = _kernels._launch_cooperative_kernel

    def counted(*args):
        cooperative.append(1)
        return real(*args)

    _kernels._launch_cooperative_kernel = counted


def cases():
    f32 = cp.float32
    out = {}
    for name, shape, layout, host in (("NCHW 32x256x8x8 (one chunk)", (32, 256, 8, 8), "NCHW", True),
                                      ("NCHW 32x256x7x7 (overhead's)", (32, 256, 7, 7), "NCHW", True),
                                      ("NHWC 32x7x7x256", (32, 7, 7, 256), "NHWC", True),
                                      ("bn_big 64x256x56x56", (64, 256, 56, 56), "NCHW", False),
                                      ("bn_big_nhwc", (64, 56, 56, 256), "NHWC", False),
                                      ("bn_r50_early 32x64x112x112", (32, 64, 112, 112), "NCHW", False),
                                      ("bn_r50_late 32x2048x7x7", (32, 2048, 7, 7), "NCHW", False)):
        c = shape[1] if layout == "NCHW" else shape[-1]
        x, dy = cp.random.random(shape, dtype=f32), cp.random.random(shape, dtype=f32)
        g, b, rm, rv = cp.ones(c, f32), cp.zeros(c, f32), cp.zeros(c, f32), cp.ones(c, f32)
        _, mean, invstd = dp.batchnorm(x, g, b, layout=layout, return_stats=True)
        train = (lambda x=x, g=g, b=b, rm=rm, rv=rv, layout=layout:
                 dp.batchnorm(x, g, b, rm, rv, training=True, layout=layout))
        backward = (lambda dy=dy, x=x, g=g, mean=mean, invstd=invstd, layout=layout:
                    dp.batchnorm_backward(dy, x, g, mean=mean, invstd=invstd, layout=layout))
        out[f"train {name}"] = (train, host)
        out[f"backward {name}"] = (backward, host)
    return out


def main():
    label = sys.argv[1]
    rows = {}
    for name, (fn, host) in cases().items():
        before = len(cooperative)
        ms = measure(fn, xp=cp, warmup=5, repeat=30).median_ms
        launched = len(cooperative) - before
        us = per_call_us(fn, cp, calls=1000) if host else None
        rows[name] = {"event_ms": ms, "host_us": us, "cooperative_launches": launched}
        print(f"{label}: {name}: {ms:.4f} ms, host {us} us, cooperative {launched}", file=sys.stderr, flush=True)
    print(json.dumps({"label": label, "rows": rows,
                      "refusals": getattr(_kernels, "cooperative_refusals", None)}))


if __name__ == "__main__":
    main()
