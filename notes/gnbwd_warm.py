"""Warm CuPy's kernel cache for kernels/row_normalization.cu only (scripts/warm_kernels.py
restricted to one family): python notes/gnbwd_warm.py [processes]"""
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from warm_kernels import _compile  # noqa: E402

if __name__ == "__main__":
    from dnnprims import row_normalization
    family = row_normalization.FAMILY
    names = {}
    for e in family.name_expressions:
        names[e.split("<", 1)[0]] = names.get(e.split("<", 1)[0], 0) + 1
    items = [(family.filename, n) for n, _ in sorted(names.items(), key=lambda kv: -kv[1])]
    t0 = time.time()
    with ProcessPoolExecutor(int(sys.argv[1]) if len(sys.argv) > 1 else 16,
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        for line in pool.map(_compile, items):
            print(line, flush=True)
    print(f"warm compile of {len(items)} kernel names: {time.time() - t0:.1f} s", flush=True)
