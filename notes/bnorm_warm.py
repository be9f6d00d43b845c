"""Compile the batch-norm kernels of a checkout (this tree, or the A/B's "old"
tree) in parallel, filling CuPy's on-disk cache before tests / notes/bnorm_ab.py.
    python notes/bnorm_warm.py ROOT [processes]"""
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor


def _compile(item):
    root, name = item
    sys.path.insert(0, root)
    import cupy
    from dnnprims import _kernels, normalization
    family = normalization.FAMILY
    group = tuple(e for e in family.name_expressions if e.split("<", 1)[0] == name)
    cupy.RawModule(code=family.source, options=_kernels.COMPILE_OPTIONS, name_expressions=group).compile()
    return name


if __name__ == "__main__":
    root = sys.argv[1]
    sys.path.insert(0, root)
    from dnnprims import normalization
    names = sorted({e.split("<", 1)[0] for e in normalization.FAMILY.name_expressions})
    with ProcessPoolExecutor(int(sys.argv[2]) if len(sys.argv) > 2 else 8,
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        print(f"warm {root}:", " ".join(pool.map(_compile, [(root, n) for n in names])), flush=True)
