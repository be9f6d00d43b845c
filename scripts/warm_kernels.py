"""Compile every kernel name of every family in parallel (one process per name, the
biggest groups first) so CuPy's on-disk kernel cache is warm before the GPU tests:
on a fresh machine NVRTC otherwise takes most of a test run, one kernel at a time.
    python scripts/warm_kernels.py [processes] [family.cu ...]   (only those families)"""
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor


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
    only = set(sys.argv[2:])
    items = []
    for filename, family in _kernels.families().items():
        if only and filename not in only:
            continue
        counts = {}
        for e in family.name_expressions:
            name = e.split("<", 1)[0]
            counts[name] = counts.get(name, 0) + 1
        items += [(n, filename, name) for name, n in counts.items()]
    items = [(f, name) for _, f, name in sorted(items, reverse=True)]
    t0 = time.time()
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for line in pool.map(_compile, items):
            print(line, flush=True)
    print(f"warm compile of {len(items)} kernel names: {time.time() - t0:.1f} s", flush=True)
