"""Compile, in parallel (one process per kernel name), the kernels that helper host2's GPU
call uses, so that CuPy's on-disk cache is warm before the tests and the overhead table.
    python notes/host2_warm.py [processes]"""
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor

FILES = ("batchnorm.cu", "pooling.cu", "softmax.cu", "activation.cu", "conv_implicit_gemm.cu",
         "conv_implicit_gemm_backward.cu", "conv_direct.cu", "conv_im2col.cu")


def _compile(item):
    filename, name = item
    import cupy
    from dnnprims import _kernels
    family = _kernels.families()[filename]
    t0 = time.time()
    group = tuple(e for e in family.name_expressions if e.split("<", 1)[0] == name)
    cupy.RawModule(code=family.source, options=_kernels.COMPILE_OPTIONS, name_expressions=group).compile()
    return f"{filename}:{name} {len(group)} specs {time.time() - t0:.1f} s"


if __name__ == "__main__":
    from dnnprims import _kernels
    families = _kernels.families()
    items = []
    for filename in FILES:
        counts = {}
        for e in families[filename].name_expressions:
            counts[e.split("<", 1)[0]] = counts.get(e.split("<", 1)[0], 0) + 1
        items += [(counts[n], filename, n) for n in counts]
    items = [(f, n) for _, f, n in sorted(items, reverse=True)]  # the biggest groups first
    t0 = time.time()
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for line in pool.map(_compile, items):
            print(line, flush=True)
    print(f"warm compile of {len(items)} kernel names: {time.time() - t0:.1f} s", flush=True)
