"""Compile the kernels of the norms helper's families in parallel (one process per
kernel name) so that CuPy's on-disk cache is warm before the GPU tests run.
Run on the GPU machine:  python notes/norms_warm.py [processes [kernel names, comma-separated]]"""
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor


def _compile(item):
    filename, name = item
    import cupy
    from dnnprims import _kernels, normalization, row_normalization, softmaxes, tensor_ops  # noqa: F401
    family = _kernels._FAMILIES[filename]
    t0 = time.time()
    group = tuple(e for e in family.name_expressions if e.split("<", 1)[0] == name)
    cupy.RawModule(code=family.source, options=_kernels.COMPILE_OPTIONS, name_expressions=group).compile()
    return f"{filename}:{name} {len(group)} specs {time.time() - t0:.1f} s"


if __name__ == "__main__":
    from dnnprims import _kernels, normalization, row_normalization, softmaxes, tensor_ops
    items = []
    for fam in (normalization.FAMILY, row_normalization.FAMILY, softmaxes.FAMILY, tensor_ops.FAMILY):
        names = sorted({e.split("<", 1)[0] for e in fam.name_expressions})
        items += [(fam.filename, n) for n in names]
    if len(sys.argv) > 2:
        only = set(sys.argv[2].split(","))
        items = [i for i in items if i[1] in only]
    t0 = time.time()
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for line in pool.map(_compile, items):
            print(line, flush=True)
    print(f"warm compile of {len(items)} kernel names: {time.time() - t0:.1f} s", flush=True)
