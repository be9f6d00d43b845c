"""Compile the kernels of the families helper mem5 touched (batchnorm.cu,
row_normalization.cu, pooling.cu) in parallel, one process per kernel name, so
CuPy's on-disk cache is warm before notes/mem5_ab.py and the GPU tests.
    python notes/mem5_warm.py [processes]"""
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor

FILES = ("batchnorm.cu", "row_normalization.cu", "pooling.cu")


def _compile(item):
    filename, name = item
    import cupy
    from dnnprims import _kernels
    family = _kernels.families()[filename]
    t0 = time.time()
    group = tuple(e for e in family.name_expressions if e.split("<", 1)[0] == name)
    cupy.RawModule(code=family.source, options=_kernels.COMPILE_OPTIONS, name_expressions=group).compile()
    return f"{filename}:{name} {len(group)} specs {time.time() - t0:.1f} s"


def items():
    from dnnprims import _kernels
    found = []
    for filename, family in _kernels.families().items():
        if filename not in FILES:
            continue
        counts = {}
        for e in family.name_expressions:
            counts[e.split("<", 1)[0]] = counts.get(e.split("<", 1)[0], 0) + 1
        found += [(n, filename, name) for name, n in counts.items()]
    return [(f, name) for _, f, name in sorted(found, reverse=True)]


if __name__ == "__main__":
    todo = items()
    if len(sys.argv) > 1 and sys.argv[1] == "--list":
        print(len(todo), todo)
        sys.exit(0)
    t0 = time.time()
    with ProcessPoolExecutor(int(sys.argv[1]) if len(sys.argv) > 1 else 16,
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        for line in pool.map(_compile, todo):
            print(line, flush=True)
    print(f"warm compile of {len(todo)} kernel names: {time.time() - t0:.1f} s", flush=True)
