"""Compile the kernel groups of the convolution families "polyphase" can run inside
(direct, im2col, implicit GEMM, Winograd, depthwise) in parallel, one process per
kernel name, so CuPy's disk cache is warm before the GPU tests (helper polyphase;
scripts/warm_kernels.py does every family).
    python notes/polyphase_warm.py [processes]"""
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor

FILES = ("conv_direct.cu", "conv_im2col.cu", "conv_implicit_gemm.cu", "conv_implicit_gemm_backward.cu",
         "conv_winograd.cu", "conv_depthwise.cu")


def _compile(item):
    filename, name = item
    import cupy
    from dnnprims import _kernels
    import dnnprims.algos  # noqa: F401  (declares the families)
    family = _kernels.families()[filename]
    t0 = time.time()
    group = tuple(e for e in family.name_expressions if e.split("<", 1)[0] == name)
    cupy.RawModule(code=family.source, options=_kernels.COMPILE_OPTIONS, name_expressions=group).compile()
    return f"{filename}:{name} {len(group)} specs {time.time() - t0:.1f} s"


if __name__ == "__main__":
    from dnnprims import _kernels
    import dnnprims.algos  # noqa: F401
    items = []
    for filename in FILES:
        counts = {}
        for e in _kernels.families()[filename].name_expressions:
            counts[e.split("<", 1)[0]] = counts.get(e.split("<", 1)[0], 0) + 1
        items += [(n, filename, name) for name, n in counts.items()]
    items = [(f, name) for _, f, name in sorted(items, reverse=True)]
    t0 = time.time()
    with ProcessPoolExecutor(int(sys.argv[1]) if len(sys.argv) > 1 else 16,
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        for line in pool.map(_compile, items):
            print(line, flush=True)
    print(f"warm compile of {len(items)} kernel names: {time.time() - t0:.1f} s", flush=True)
