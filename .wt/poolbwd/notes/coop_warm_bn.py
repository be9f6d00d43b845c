"""Compile every kernel name of kernels/batchnorm.cu in parallel (the dnnprims on
PYTHONPATH), so a before/after probe does not time NVRTC."""
import multiprocessing
from concurrent.futures import ProcessPoolExecutor


def _compile(name):
    import cupy
    from dnnprims import _kernels, normalization
    family = normalization.FAMILY
    group = tuple(e for e in family.name_expressions if e.split("<", 1)[0] == name)
    cupy.RawModule(code=family.source, options=_kernels.COMPILE_OPTIONS, name_expressions=group).compile()
    return f"{name}: {len(group)}"


if __name__ == "__main__":
    from dnnprims import normalization
    names = sorted({e.split("<", 1)[0] for e in normalization.FAMILY.name_expressions})
    with ProcessPoolExecutor(8, mp_context=multiprocessing.get_context("spawn")) as pool:
        for line in pool.map(_compile, names):
            print(line, flush=True)
