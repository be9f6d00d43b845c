"""Compile the Winograd family's kernels in parallel, one process per kernel name
(scripts/warm_kernels.py restricted to conv_winograd.cu): notes/wino5b_gpu.sh."""
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, "scripts")
from warm_kernels import _compile  # noqa: E402

if __name__ == "__main__":
    from dnnprims.algos import winograd
    names = sorted({e.split("<", 1)[0] for e in winograd.FAMILY.name_expressions})
    t0 = time.time()
    with ProcessPoolExecutor(len(names), mp_context=multiprocessing.get_context("spawn")) as pool:
        for line in pool.map(_compile, [("conv_winograd.cu", n) for n in names]):
            print(line, flush=True)
    print(f"warm: {time.time() - t0:.1f} s")
