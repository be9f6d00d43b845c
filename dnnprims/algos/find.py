"""``algo="find"``: time the applicable algorithms for one exact problem on the
current GPU, once, and remember the winner -- cuDNN's find mode.

Each registered algorithm that supports the problem and direction (and whose
workspace fits ``FIND_WORKSPACE_LIMIT``) runs on fresh random inputs of the
problem's shapes, timed by the one timing helper (:mod:`dnnprims.bench.timing`,
CUDA events, median).  The winner is kept in memory and in a JSON file,

    $DNNPRIMS_CACHE_DIR/conv_find.json, else $XDG_CACHE_HOME/dnnprims/...,
    else ~/.cache/dnnprims/conv_find.json

format ``{"version": 1, "entries": {key: {"algo": name, "ms": {name: median ms}}}}``
with key ``"<GPU name>|<direction>|<ConvProblem fields>"`` (the problem carries
dtype and layout).  A stale or unreadable file is ignored (and rewritten).
"""
import dataclasses
import json
import os
import pathlib
import tempfile

from . import DEFAULT_OPTIONS, REGISTRY, admits

VERSION = 2  # 2: keys carry the ConvOptions
FIND_WORKSPACE_LIMIT = 1 << 30
_WARMUP, _REPEAT = 2, 7
_memory = {}
_disk = None  # the loaded entries of the cache file


def cache_path():
    root = os.environ.get("DNNPRIMS_CACHE_DIR")
    if root is None:
        root = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "dnnprims"
    return pathlib.Path(root) / "conv_find.json"


_names = {}  # device id -> GPU name


def gpu_name():
    import cupy
    device = cupy.cuda.runtime.getDevice()
    name = _names.get(device)
    if name is None:
        name = cupy.cuda.runtime.getDeviceProperties(device)["name"]
        name = _names[device] = name.decode() if isinstance(name, bytes) else str(name)
    return name


def problem_key(problem, direction, options=DEFAULT_OPTIONS):
    fields = ",".join(f"{f.name}={getattr(problem, f.name)}" for f in dataclasses.fields(problem))
    allowed = ",".join(f"{f.name}={getattr(options, f.name)}" for f in dataclasses.fields(options))
    return f"{gpu_name()}|{direction}|{fields}|{allowed}".replace(" ", "")


def _load():
    global _disk
    if _disk is None:
        try:
            data = json.loads(cache_path().read_text())
            _disk = data["entries"] if data.get("version") == VERSION else {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            _disk = {}
    return _disk


def _save(entries):
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            json.dump({"version": VERSION, "entries": entries}, f, indent=1, sort_keys=True)
        os.replace(f.name, path)
    except OSError:
        pass  # a read-only home: the in-memory cache still works


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


def time_algorithms(problem, direction, names, options=DEFAULT_OPTIONS):
    """{name: median ms} on fresh random inputs of the problem's shapes (each
    algorithm as it runs under ``options``: see ConvAlgorithm.under)."""
    import cupy
    from ..bench import timing

    a, b, out = random_operands(problem, direction)
    result = {}
    for name in names:
        algorithm = REGISTRY[name].under(options)
        result[name] = timing.measure(lambda: algorithm.run(problem, direction, a, b, out), xp=cupy,
                                      warmup=_WARMUP, repeat=_REPEAT).median_ms
    return result


def find(problem, direction, options=DEFAULT_OPTIONS):
    """The name of the fastest algorithm for this problem on this GPU (timed once)
    among those the options admit."""
    key = problem_key(problem, direction, options)
    name = _memory.get(key)
    if name is not None:
        return name
    entries = _load()
    entry = entries.get(key)
    if entry is None or entry.get("algo") not in REGISTRY:
        names = candidates(problem, direction, options)
        times = time_algorithms(problem, direction, names, options)
        entry = {"algo": min(times, key=times.get), "ms": times}
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
