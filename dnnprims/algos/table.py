"""The measured heuristic table that ``algo="auto"`` consults.

The table is data: ``dnnprims/algos/conv_table.json`` (or the file named by
``$DNNPRIMS_CONV_TABLE``), written by the tuning command ``python -m
dnnprims.tune`` (:mod:`dnnprims.tune`), which times every registered algorithm
over a grid of problems.  This module reads it and answers "which algorithm,
and why" for one problem.

Format (``"version": 1``), one JSON object::

    {"format": "dnnprims convolution heuristic table", "version": 1,
     "gpu": "NVIDIA H100 80GB HBM3", "date": "2026-11-23T05:40:00Z",
     "cupy": "14.2.0", "cuda_runtime": 13000, "dnnprims": "0.1.0",
     "algorithms": [every registered name when it was measured],
     "features": {name: what it means},        # the documentation of the key
     "grid": {how the grid was chosen, points measured, seconds taken},
     "holdout": {how the held-out points were chosen, and how often the table's
                 pick was within 10 % of the fastest measured algorithm there},
     "entries": [
       {"direction": "forward", "dtype_class": "float32", "layout": "NCHW",
        "groups_class": "1", "R": 3, "S": 3, "stride": [1, 1], "dilation": [1, 1],
        "log2_npq": 12.61, "log2_c": 7.0, "log2_k": 7.0,
        "problem": {"N": 32, "C": 128, "H": 14, "W": 14, "K": 128, "padding": [1, 1],
                    "groups": 1, "dtype": "float32"},
        "winner": "implicit_gemm_64x64",
        "ms": {name: median ms, for every candidate that ran},
        "failed": {name: error text, for a candidate that raised},
        "holdout": false}, ...]}

Features (:func:`features`): the categorical ones must match exactly --
direction, dtype class ("float32", "half" = float16 and bfloat16, which share
kernels, "float64"), layout, groups class ("1", "depthwise" = one input channel
per group, "grouped" = anything else), filter R x S, stride and dilation.  Among
the entries that match, the nearest one in log2 space of (N*P*Q, C, K) decides
(Euclidean distance; one unit = a factor of two in one size); ties go to the
earlier entry.  No matching entry, or none within :data:`MAX_DISTANCE`, means
the documented rule (:func:`dnnprims.algos.auto_preferences`) decides.

The entry's winner is used only if it is registered and :func:`admits` it
under the caller's :class:`ConvOptions` (workspace limit, precision,
determinism) for this exact problem; otherwise the next fastest measured
candidate of that entry, and so on; if none is admitted the rule decides.
"""
import json
import math
import os
import pathlib

VERSION = 1
FORMAT = "dnnprims convolution heuristic table"
DEFAULT_PATH = pathlib.Path(__file__).with_name("conv_table.json")

# Beyond this distance (log2 units: 4 = a factor of 16 in one size) the nearest
# entry says little about the problem; the rule decides.
MAX_DISTANCE = 4.0

FEATURES = {
    "direction": "forward, backward_data or backward_filter",
    "dtype_class": "float32; half (float16 and bfloat16: the same kernels); float64",
    "layout": "NCHW or NHWC (storage of x, y, dx, dy)",
    "groups_class": "1 (ungrouped), depthwise (C / groups == 1), grouped (anything else)",
    "R": "filter height", "S": "filter width",
    "stride": "(stride_h, stride_w)", "dilation": "(dilation_h, dilation_w)",
    "log2_npq": "log2(N * P * Q): GEMM rows of the forward pass (batch times output pixels)",
    "log2_c": "log2(C): input channels", "log2_k": "log2(K): output channels",
}
CATEGORICAL = ("direction", "dtype_class", "layout", "groups_class", "R", "S", "stride", "dilation")
NUMERIC = ("log2_npq", "log2_c", "log2_k")


def dtype_class(dtype):
    return "half" if dtype in ("float16", "bfloat16") else dtype


def groups_class(problem):
    if problem.groups == 1:
        return "1"
    return "depthwise" if problem.C == problem.groups else "grouped"


def features(problem, direction):
    """The table key of one problem: {feature name: value} (see FEATURES)."""
    return {"direction": direction, "dtype_class": dtype_class(problem.dtype),
            "layout": problem.layout, "groups_class": groups_class(problem),
            "R": problem.R, "S": problem.S, "stride": list(problem.stride),
            "dilation": list(problem.dilation),
            "log2_npq": round(math.log2(max(1, problem.N * problem.P * problem.Q)), 3),
            "log2_c": round(math.log2(max(1, problem.C)), 3),
            "log2_k": round(math.log2(max(1, problem.K)), 3)}


def _category(f):
    return tuple(tuple(f[name]) if isinstance(f[name], list) else f[name] for name in CATEGORICAL)


class Table:
    """A loaded table: its metadata and its entries indexed by categorical key."""

    def __init__(self, data, source="<memory>"):
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ValueError(f"{source}: not a version {VERSION} convolution table")
        self.data, self.source = data, str(source)
        self.index = {}
        for entry in data["entries"]:
            point = tuple(float(entry[name]) for name in NUMERIC)
            self.index.setdefault(_category(entry), []).append((point, entry))

    def nearest(self, problem, direction):
        """(entry, distance) of the nearest entry with the same categorical
        features, or (None, None)."""
        f = features(problem, direction)
        candidates = self.index.get(_category(f))
        if not candidates:
            return None, None
        query = tuple(f[name] for name in NUMERIC)
        best, best_d = None, None
        for point, entry in candidates:   # first minimum wins: deterministic
            d = math.sqrt(sum((a - b) ** 2 for a, b in zip(point, query)))
            if best_d is None or d < best_d:
                best, best_d = entry, d
        return best, best_d

    def explain(self, problem, direction, options, registry, admits):
        """(name, reason) from the table, or None where the rule must decide."""
        entry, distance = self.nearest(problem, direction)
        if entry is None or distance > MAX_DISTANCE:
            return None
        ranked = sorted((ms, name) for name, ms in entry["ms"].items() if ms is not None)
        refused = []
        for ms, name in ranked:
            algorithm = registry.get(name)
            if algorithm is None:
                refused.append(f"{name} (not registered here)")
                continue
            ok, why = admits(algorithm, problem, direction, options)
            if ok:
                return name, _reason(entry, distance, name, ranked, refused)
            refused.append(f"{name} ({why})")
        return None


def _describe_entry(entry):
    p = entry["problem"]
    return (f"{entry['direction']} {p['dtype']} {entry['layout']} N={p['N']} C={p['C']} "
            f"H={p['H']} W={p['W']} K={p['K']} {entry['R']}x{entry['S']} "
            f"stride={tuple(entry['stride'])} groups={p['groups']}")


def _reason(entry, distance, name, ranked, refused):
    times = ", ".join(f"{n} {ms:.3f} ms" for ms, n in ranked[:4] if n != name)
    mine = dict((n, ms) for ms, n in ranked)[name]
    text = (f"table: nearest entry ({_describe_entry(entry)}; log2 distance {distance:.2f}) "
            f"measured {name} {mine:.3f} ms" + (f" vs {times}" if times else ""))
    if refused:
        text += "; faster but refused: " + "; ".join(refused)
    return text


_loaded = {"table": None, "done": False}


def path():
    """The table file in use: $DNNPRIMS_CONV_TABLE, else the one in the package."""
    return pathlib.Path(os.environ.get("DNNPRIMS_CONV_TABLE") or DEFAULT_PATH)


def load(source=None):
    """Read and check a table file (default: :func:`path`)."""
    source = path() if source is None else pathlib.Path(source)
    return Table(json.loads(source.read_text()), source)


def current():
    """The table ``auto`` consults (loaded once), or None where there is none.
    An unreadable table is ignored: the rule decides."""
    if not _loaded["done"]:
        try:
            _loaded["table"] = load()
        except (OSError, ValueError, KeyError, TypeError):
            _loaded["table"] = None
        _loaded["done"] = True
    return _loaded["table"]


def use(table):
    """Make ``table`` (a Table, a dict in the table format, a path, or None for
    no table) the one ``auto`` consults; returns the previous one.  Clears the
    memoised choices."""
    from . import forget_choices
    previous = current()
    if isinstance(table, dict):
        table = Table(table)
    elif isinstance(table, (str, os.PathLike)):
        table = load(table)
    _loaded["table"], _loaded["done"] = table, True
    forget_choices()
    return previous
