"""``algo="find"``: time the applicable algorithms for one exact problem on the
current GPU, once, and remember the winner -- cuDNN's find mode.

Each registered algorithm that supports the problem and direction (and whose
workspace fits ``FIND_WORKSPACE_LIMIT``) runs on fresh random inputs of the
problem's shapes, timed by the one timing helper (:mod:`dnnprims.bench.timing`,
CUDA events, median).  The winner is kept in memory and in a JSON file,

    $DNNPRIMS_CACHE_DIR/conv_find.json, else $XDG_CACHE_HOME/dnnprims/...,
    else ~/.cache/dnnprims/conv_find.json

format ``{"version": 2, "entries": {key: {"algo": name, "ms": {name: median ms},
"failed": {name: error text}}}}`` with key ``"<GPU name>|<direction>|<ConvProblem
fields>|<ConvOptions fields>|<software>"`` (the problem carries dtype and layout;
the software is the dnnprims, CuPy and CUDA runtime versions and ``CUPY_TF32``
as set when the problem is found: each changes which algorithm is fastest, so a
winner found under another one is timed again rather than reused).  A stale
or unreadable file, or entry, is ignored (and rewritten); so is an entry whose
winner no longer admits the problem or that was timed over other candidates
than those registered now (a newer dnnprims).  The cache never fails a call:
without a writable directory (or a home) only the in-memory cache is kept.  A
candidate that raises while timed (say, out of memory) is recorded under
"failed" and the others decide; if every one raises, the first error is raised.
"""
import dataclasses
import json
import os
import pathlib
import tempfile

from . import DEFAULT_OPTIONS, REGISTRY, admits

VERSION = 2  # 2: keys carry the ConvOptions (and, since, the software: older keys never match)
FIND_WORKSPACE_LIMIT = 1 << 30
_WARMUP, _REPEAT = 2, 7
_memory = {}
_disk = None  # the loaded entries of the cache file


def cache_path():
    """The cache file.  Raises RuntimeError where there is no home directory to
    put it in (and neither variable names a place)."""
    root = os.environ.get("DNNPRIMS_CACHE_DIR") or None   # "" means unset, not the current directory
    if root is None:
        root = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "dnnprims"
    return pathlib.Path(root) / "conv_find.json"


_names = {}  # device id -> GPU name


def gpu_name():
    """The current GPU's name.  Without CuPy or a usable CUDA GPU (no driver, or
    one too old), a RuntimeError that says so, not the driver's bare error."""
    try:
        import cupy
        device = cupy.cuda.runtime.getDevice()
        name = _names.get(device)
        if name is None:
            name = cupy.cuda.runtime.getDeviceProperties(device)["name"]
            name = _names[device] = name.decode() if isinstance(name, bytes) else str(name)
    except (ImportError, RuntimeError) as e:   # CUDARuntimeError is a RuntimeError
        raise RuntimeError("algo='find' times the algorithms on a CUDA GPU, and none is usable here "
                           f"({type(e).__name__}: {e}); algo='auto' needs no GPU") from e
    return name


_versions = None  # "dnnprims=...,cupy=...,cuda=..." of this process


def _software():
    """What besides the GPU decides the winner: the library versions (read once)
    and CUPY_TF32 (read per key: CuPy reads it when it first needs it)."""
    global _versions
    if _versions is None:
        import cupy
        from .. import __version__
        _versions = f"dnnprims={__version__},cupy={cupy.__version__},cuda={cupy.cuda.runtime.runtimeGetVersion()}"
    return f"{_versions},CUPY_TF32={os.environ.get('CUPY_TF32') or '0'}"


def problem_key(problem, direction, options=DEFAULT_OPTIONS):
    fields = ",".join(f"{f.name}={getattr(problem, f.name)}" for f in dataclasses.fields(problem))
    allowed = ",".join(f"{f.name}={getattr(options, f.name)}" for f in dataclasses.fields(options))
    return f"{gpu_name()}|{direction}|{fields}|{allowed}|{_software()}".replace(" ", "")


def _read():
    """The well-formed entries of the cache file ({} where it is missing,
    unreadable, of another version or not in the format)."""
    try:
        data = json.loads(cache_path().read_text())
        entries = data["entries"] if data.get("version") == VERSION else {}
        return {key: entry for key, entry in entries.items()
                if isinstance(entry, dict) and isinstance(entry.get("algo"), str)}
    except (OSError, RuntimeError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return {}


def _load():
    global _disk
    if _disk is None:
        _disk = _read()
    return _disk


def _save(entries):
    """Write ``entries`` over the file's current ones (another process may have
    added some since this one read it), atomically."""
    name = None
    try:
        path = cache_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        merged = dict(_read(), **entries)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            name = f.name
            json.dump({"version": VERSION, "entries": merged}, f, indent=1, sort_keys=True)
        os.replace(name, path)
        name = None
    except (OSError, RuntimeError):
        pass  # a read-only home, or none: the in-memory cache still works
    finally:
        if name is not None:
            try:
                os.unlink(name)
            except OSError:
                pass


def candidates(problem, direction, options=DEFAULT_OPTIONS):
    """The names find times: admitted under ``options``, and the workspace of the
    algorithm as it runs under them (ConvAlgorithm.under) within FIND_WORKSPACE_LIMIT."""
    return [name for name, algorithm in REGISTRY.items()
            if admits(algorithm, problem, direction, options)[0]
            and algorithm.under(options).workspace_bytes(problem, direction) <= FIND_WORKSPACE_LIMIT]


def random_operands(problem, direction):
    """(a, b, out) for ``algorithm.run``: random a and b in [-0.5, 0.5) (never
    zeros) of the problem's shapes and dtype on the current GPU, out empty."""
    import cupy

    shapes = {"forward": (problem.x_shape, problem.w_shape, problem.y_shape),
              "backward_data": (problem.y_shape, problem.w_shape, problem.x_shape),
              "backward_filter": (problem.x_shape, problem.y_shape, problem.w_shape)}[direction]
    a, b = ((cupy.random.random(s, dtype="float32") - 0.5).astype(problem.dtype) for s in shapes[:2])
    return a, b, cupy.empty(shapes[2], dtype=problem.dtype)


def time_algorithms(problem, direction, names, options=DEFAULT_OPTIONS, failed=None):
    """{name: median ms} on fresh random inputs of the problem's shapes (each
    algorithm as it runs under ``options``: see ConvAlgorithm.under).  An
    algorithm that raises is left out and its error stored in ``failed``
    (a dict) where given, else raised."""
    import cupy
    from ..bench import timing

    a, b, out = random_operands(problem, direction)
    result = {}
    for name in names:
        algorithm = REGISTRY[name].under(options)
        try:
            result[name] = timing.measure(lambda: algorithm.run(problem, direction, a, b, out), xp=cupy,
                                          warmup=_WARMUP, repeat=_REPEAT).median_ms
        except Exception as e:  # noqa: BLE001 -- one candidate's failure (out of memory) is data
            if failed is None:
                raise
            failed[name] = (e, f"{type(e).__name__}: {e}"[:300])
    return result


def _usable(entry, problem, direction, options, names):
    """Whether a cached entry still answers: its winner admits the problem under
    the options, and it was timed over the candidates registered now."""
    algorithm = REGISTRY.get(entry["algo"])
    if algorithm is None or not admits(algorithm, problem, direction, options)[0]:
        return False
    timed = entry.get("ms")
    failed = entry.get("failed") or {}
    return (isinstance(timed, dict) and isinstance(failed, dict)
            and set(timed) | set(failed) == set(names))


def find(problem, direction, options=DEFAULT_OPTIONS):
    """The name of the fastest algorithm for this problem on this GPU (timed once)
    among those the options admit."""
    if 0 in (problem.N * problem.C * problem.H * problem.W, problem.N * problem.K * problem.P * problem.Q):
        from . import auto_rule   # nothing to compute (conv returns before running): nothing to time
        return auto_rule(problem, direction, options)
    key = problem_key(problem, direction, options)
    name = _memory.get(key)
    if name is not None:
        return name
    entries = _load()
    entry = entries.get(key)
    names = candidates(problem, direction, options)
    if entry is None or not _usable(entry, problem, direction, options, names):
        failed = {}
        times = time_algorithms(problem, direction, names, options, failed)
        if not times and failed:
            raise next(iter(failed.values()))[0]
        entry = {"algo": min(times, key=times.get), "ms": times}
        if failed:
            entry["failed"] = {n: text for n, (_, text) in failed.items()}
        entries[key] = entry
        _save(entries)
    _memory[key] = entry["algo"]
    return entry["algo"]


def forget():
    """Drop the in-memory cache (the file stays): the next call reads the file again.
    Also drops the convolution calls' memo of chosen algorithms."""
    global _disk
    from .. import conv
    _memory.clear()
    _disk = None
    conv._MEMO.clear()
