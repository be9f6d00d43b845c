"""Compile named kernel groups of a checkout (this tree, or the A/B's "old" copy) in
parallel, one process a group, filling CuPy's on-disk cache before notes/half16_ab.py.
    python notes/half16_warm.py ROOT family.cu:kernel_name [...]"""
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor


def _compile(item):
    root, filename, name = item
    sys.path.insert(0, root)
    import cupy
    from dnnprims import _kernels
    family = _kernels.families()[filename]
    t0 = time.time()
    group = tuple(e for e in family.name_expressions if e.split("<", 1)[0] == name)
    cupy.RawModule(code=family.source, options=_kernels.COMPILE_OPTIONS, name_expressions=group).compile()
    return f"{filename}:{name} {len(group)} specs {time.time() - t0:.1f} s"


if __name__ == "__main__":
    root = sys.argv[1]
    items = [(root, *a.split(":")) for a in sys.argv[2:]]
    with ProcessPoolExecutor(len(items), mp_context=multiprocessing.get_context("spawn")) as pool:
        print(f"warm {root}:", "; ".join(pool.map(_compile, items)), flush=True)
