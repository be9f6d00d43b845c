"""Compile the kernel groups the hostwino GPU call needs (the Winograd family and the
benchmark's spin) in parallel, one process per kernel name, so CuPy's disk cache is
warm before the tests and the timing (scripts/warm_kernels.py does every family).
    PYTHONPATH=$PWD python notes/hostwino_warm.py [processes]"""
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor

FILES = ("conv_winograd.cu", "bench_spin.cu")


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
    items = [(f, n) for f in FILES for n in sorted({e.split("<", 1)[0] for e in families[f].name_expressions})]
    t0 = time.time()
    with ProcessPoolExecutor(int(sys.argv[1]) if len(sys.argv) > 1 else 8,
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        for line in pool.map(_compile, items):
            print(line, flush=True)
    print(f"warm compile of {len(items)} kernel names: {time.time() - t0:.1f} s", flush=True)
