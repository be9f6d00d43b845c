"""Compile the Winograd family's kernel groups in parallel (one process per kernel
name, as dnnprims._kernels groups them) so CuPy's disk cache is warm before the
GPU tests (helper winosmall; scripts/warm_kernels.py does every family).
    python notes/winosmall_warm.py [processes]"""
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor


def _compile(name):
    import cupy
    from dnnprims import _kernels
    from dnnprims.algos import winograd
    family = winograd.FAMILY
    t0 = time.time()
    group = tuple(e for e in family.name_expressions if e.split("<", 1)[0] == name)
    cupy.RawModule(code=family.source, options=_kernels.COMPILE_OPTIONS, name_expressions=group).compile()
    return f"{name}: {len(group)} specs {time.time() - t0:.1f} s"


if __name__ == "__main__":
    from dnnprims.algos import winograd
    names = sorted({e.split("<", 1)[0] for e in winograd.FAMILY.name_expressions})
    t0 = time.time()
    with ProcessPoolExecutor(int(sys.argv[1]) if len(sys.argv) > 1 else 8,
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        for line in pool.map(_compile, names):
            print(line, flush=True)
    print(f"warm compile of {len(names)} winograd kernel names: {time.time() - t0:.1f} s", flush=True)
