"""Compile kernels in parallel (one process per kernel name, the biggest groups first)
so CuPy's on-disk kernel cache is warm before the GPU tests: on a fresh machine NVRTC
otherwise takes most of a test run, one kernel at a time.
    python scripts/warm_kernels.py [processes] [family.cu | family.cu:kernel_name ...]
        (no names: every kernel of every family)
    python scripts/warm_kernels.py --root DIR [processes] [...]
        (the dnnprims tree under DIR, e.g. the "old" copy of an A/B, notes/ab/patch_ab.sh)"""
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor


def _compile(item):
    root, filename, name = item
    if root:
        sys.path.insert(0, root)
    import cupy
    from dnnprims import _kernels
    family = _kernels.families()[filename]
    t0 = time.time()
    group = tuple(e for e in family.name_expressions if e.split("<", 1)[0] == name)
    cupy.RawModule(code=family.source, options=_kernels.COMPILE_OPTIONS, name_expressions=group).compile()
    return f"{filename}:{name} {len(group)} specs {time.time() - t0:.1f} s"


def _items(root, only):
    """(count, family file, kernel name) of each kernel name the selection names."""
    if root:
        sys.path.insert(0, root)
    from dnnprims import _kernels
    families = {o.split(":")[0] for o in only}
    kernels = {tuple(o.split(":", 1)) for o in only if ":" in o}
    whole = {o for o in only if ":" not in o}
    counts = {}
    for filename, family in _kernels.families().items():
        if only and filename not in families:
            continue
        for e in family.name_expressions:
            name = e.split("<", 1)[0]
            if not only or filename in whole or (filename, name) in kernels:
                counts[filename, name] = counts.get((filename, name), 0) + 1
    return sorted(((n, f, name) for (f, name), n in counts.items()), reverse=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    root = None
    if args[:1] == ["--root"]:
        root, args = args[1], args[2:]
    workers = int(args[0]) if args and args[0].isdigit() else 16
    only = set(args[1:] if args and args[0].isdigit() else args)
    items = [(root, f, name) for _, f, name in _items(root, only)]
    t0 = time.time()
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for line in pool.map(_compile, items):
            print(line, flush=True)
    print(f"warm {root or 'this tree'}: compile of {len(items)} kernel names: {time.time() - t0:.1f} s", flush=True)
