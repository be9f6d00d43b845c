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
        "probed": [names whose time is a single call: hopelessly slow there],
        "holdout": false}, ...]}

Features (:func:`features`): the categorical ones must match exactly --
direction, dtype class ("float32", "half" = float16 and bfloat16, which share
kernels, "float64"), layout, groups class ("1", "depthwise" = one input channel
per group, "grouped" = anything else), filter R x S, stride and dilation.  Among
the entries that match, distance is Euclidean in log2 space of (N*P*Q, C, K)
(one unit = a factor of two in one size; ties go to the earlier entry).

How the entries decide (:meth:`Table.ranking`):

1. No matching entry, or none within :data:`MAX_DISTANCE`: the documented rule
   (:func:`dnnprims.algos.auto_preferences`) decides.
2. The problem is a measured point (nearest entry at distance < EXACT), or
   fewer than MIN_NEIGHBOURS entries match: the nearest entry's measured times
   rank the algorithms.
3. Otherwise the times are interpolated: for each algorithm measured at the
   nearest entry and at no fewer than half of the :data:`NEIGHBOURS` nearest
   entries, a weighted least-squares plane log(ms) ~ a + b . (features -
   problem's features) (weights 1 / (distance + 0.5), ridge :data:`RIDGE` on
   the slopes) predicts exp(a), its time at the problem; algorithms rank by
   that (ties: by the nearest entry's measurement).  Timing scales smoothly
   with the sizes, so a plane through the neighbours on both sides of a
   boundary places the boundary better than the single nearest entry or a
   vote of the nearest entries' measured winners (cross-validated on the
   H100 grid: notes/conv_tune.md, notes/table.md).  Before the fit, each
   neighbour's time of an algorithm is **censored** at :data:`CAP` times that
   neighbour's fastest (and an algorithm that did not run there counts as
   CAP times its fastest): whether a loser was 3x or 30x slower does not
   change the ranking, but a steep plane through one such time (often a
   single timed call, see :data:`dnnprims.tune.SLOW_FACTOR`) can swamp the
   measured winners of the nearer entries.  (The known miss this fixed:
   r50_2_3x3 backward data at batch 32, where one single-call Winograd time
   of 1.99 ms at a neighbour, 6x that neighbour's best, made the plane prefer
   implicit GEMM although Winograd won at the three other equidistant entries.)
   The nearest entry's other measured candidates follow, in measured order.

The first algorithm of that ranking that is registered and that :func:`admits`
under the caller's :class:`ConvOptions` (workspace limit, precision,
determinism) for this exact problem is used; if none is, the rule decides.
Without a ``workspace_limit``, an algorithm that would need more workspace
than the tuner allowed its candidates (``find.FIND_WORKSPACE_LIMIT``, 1 GiB:
nothing bigger was measured) is passed over too.
"""
import json
import math
import os
import pathlib

import numpy as np

from .find import FIND_WORKSPACE_LIMIT

VERSION = 1
FORMAT = "dnnprims convolution heuristic table"
DEFAULT_PATH = pathlib.Path(__file__).with_name("conv_table.json")

# Beyond this distance (log2 units: 4 = a factor of 16 in one size) the nearest
# entry says little about the problem; the rule decides.
MAX_DISTANCE = 4.0
EXACT = 0.05        # nearer than this, the nearest entry is the problem itself
NEIGHBOURS = 8      # entries the interpolation fits (see the module docstring)
MIN_NEIGHBOURS = 4  # fewer matching entries (a tiny table): the nearest one's measurements
RIDGE = 1.0         # ridge penalty on the plane's slopes (a few neighbours, 3 slopes)
CAP = 2.0           # times above CAP x a neighbour's fastest are censored to that (docstring, 3.)
MIN_MEASURED = 0.5  # interpolate an algorithm measured at >= this fraction of the neighbours

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


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _entry_problem(entry):
    """What is wrong with a table entry for the lookup ("" if nothing): times
    must be finite numbers >= 0 (or null: did not run), so that no NaN or
    negative time can win and no string can fail a user's call at lookup."""
    if not isinstance(entry, dict):
        return f"not an object: {entry!r:.60}"
    for name in CATEGORICAL:
        value = entry.get(name)
        if not isinstance(value, (str, int, list)) or isinstance(value, bool):
            return f"{name} is {value!r:.60}"
    for name in NUMERIC:
        if not _is_number(entry.get(name)):
            return f"{name} is {entry.get(name)!r:.60}, not a finite number"
    ms = entry.get("ms")
    if not isinstance(ms, dict):
        return f"ms is {ms!r:.60}, not an object of times"
    for name, value in ms.items():
        if value is not None and not (_is_number(value) and value >= 0):
            return f"ms[{name!r}] is {value!r:.60}, not a finite time >= 0 (or null)"
    problem = entry.get("problem")
    if not isinstance(problem, dict) or not {"N", "C", "H", "W", "K", "groups", "dtype"} <= set(problem):
        return "problem lacks N, C, H, W, K, groups or dtype"
    return ""


def _category(f):
    return tuple(tuple(f[name]) if isinstance(f[name], list) else f[name] for name in CATEGORICAL)


class Table:
    """A loaded table: its metadata and its entries indexed by categorical key."""

    def __init__(self, data, source="<memory>"):
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ValueError(f"{source}: not a version {VERSION} convolution table")
        self.data, self.source = data, str(source)
        self.index = {}
        for i, entry in enumerate(data["entries"]):
            why = _entry_problem(entry)
            if why:
                raise ValueError(f"{source}: entry {i}: {why}")
            point = tuple(float(entry[name]) for name in NUMERIC)
            self.index.setdefault(_category(entry), []).append((point, entry))

    def neighbours(self, problem, direction, count=1):
        """[(distance, entry)] of the ``count`` nearest entries with the same
        categorical features, nearest first ([] where there is none)."""
        f = features(problem, direction)
        candidates = self.index.get(_category(f))
        if not candidates:
            return []
        query = tuple(f[name] for name in NUMERIC)
        ranked = sorted(((math.dist(point, query), i) for i, (point, _) in enumerate(candidates)))
        return [(d, candidates[i][1]) for d, i in ranked[:count]]

    def nearest(self, problem, direction):
        """(entry, distance) of the nearest entry with the same categorical
        features, or (None, None)."""
        near = self.neighbours(problem, direction)
        return (near[0][1], near[0][0]) if near else (None, None)

    def ranking(self, problem, direction):
        """(ranked [(ms, name)], how, nearest entry, its distance): the
        algorithms in the order the table prefers them for this problem, or
        None where the rule must decide (see the module docstring)."""
        near = [(d, e) for d, e in self.neighbours(problem, direction, NEIGHBOURS) if e["ms"]]
        if not near or near[0][0] > MAX_DISTANCE:
            return None
        distance, entry = near[0]
        measured = sorted((ms, name) for name, ms in entry["ms"].items() if ms is not None)
        if distance < EXACT or len(near) < MIN_NEIGHBOURS:
            return measured, "measured at the nearest entry", entry, distance
        query = features(problem, direction)
        offsets = np.array([[1.0] + [e[n] - query[n] for n in NUMERIC] for _, e in near])
        weights = np.array([1.0 / (d + 0.5) for d, _ in near])
        penalty = RIDGE * np.diag([0.0] + [1.0] * len(NUMERIC))
        lhs = offsets.T @ (weights[:, None] * offsets) + penalty
        ceilings = [CAP * min((v for v in e["ms"].values() if v), default=math.inf) for _, e in near]
        names = [n for n in sorted(entry["ms"]) if entry["ms"][n]
                 and sum(1 for _, e in near if e["ms"].get(n)) >= MIN_MEASURED * len(near)]
        predicted = []
        for name in names:
            log_ms = np.log([min(e["ms"].get(name) or cap, cap) for (_, e), cap in zip(near, ceilings)])
            plane = np.linalg.solve(lhs, offsets.T @ (weights * log_ms))
            predicted.append((float(np.exp(plane[0])), entry["ms"][name], name))
        predicted.sort()
        rest = [(ms, name) for ms, name in measured if name not in names]
        return ([(ms, name) for ms, _, name in predicted] + rest,
                f"interpolated from the {len(near)} nearest entries", entry, distance)

    def explain(self, problem, direction, options, registry, admits, ranked_as=None):
        """(name, reason) from the table, or None where the rule must decide.
        ``ranked_as``: rank by this problem's entries instead (a dilated problem's
        undilated twin); admission and workspace are still judged on ``problem``."""
        ranking = self.ranking(problem if ranked_as is None else ranked_as, direction)
        if ranking is None:
            return None
        ranked, how, entry, distance = ranking
        refused = []
        for ms, name in ranked:
            algorithm = registry.get(name)
            if algorithm is None:
                refused.append(f"{name} (not registered here)")
                continue
            ok, why = admits(algorithm, problem, direction, options)
            if ok and options.workspace_limit is None:
                need = algorithm.workspace_bytes(problem, direction)
                if need > FIND_WORKSPACE_LIMIT:
                    ok, why = False, (f"it needs {need} bytes of workspace, more than the tuner "
                                      f"measured with (FIND_WORKSPACE_LIMIT={FIND_WORKSPACE_LIMIT})")
            if ok:
                return name, _reason(entry, distance, how, name, ranked, refused)
            refused.append(f"{name} ({why})")
        return None


def _describe_entry(entry):
    p = entry["problem"]
    return (f"{entry['direction']} {p['dtype']} {entry['layout']} N={p['N']} C={p['C']} "
            f"H={p['H']} W={p['W']} K={p['K']} {entry['R']}x{entry['S']} "
            f"stride={tuple(entry['stride'])} groups={p['groups']}")


def _reason(entry, distance, how, name, ranked, refused):
    times = dict((n, ms) for ms, n in ranked)
    others = ", ".join(f"{n} {ms:.3f} ms" for ms, n in ranked[:4] if n != name)
    word = "measured" if how.startswith("measured") else "predicted"
    text = (f"table: {how}; nearest entry ({_describe_entry(entry)}; log2 distance {distance:.2f}); "
            f"{word} {name} {times[name]:.3f} ms" + (f" vs {others}" if others else ""))
    if word == "predicted" and name in entry["ms"]:
        text += f"; measured there: {name} {entry['ms'][name]:.3f} ms, fastest {entry['winner']}"
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
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            _loaded["table"] = None
            named = os.environ.get("DNNPRIMS_CONV_TABLE")
            if named or not isinstance(e, FileNotFoundError):
                import warnings
                what = f"DNNPRIMS_CONV_TABLE={named}" if named else f"the table {DEFAULT_PATH}"
                warnings.warn(f"{what} cannot be used ({type(e).__name__}: {e}); "
                              f"algo='auto' follows the rule", stacklevel=2)
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
    elif table is not None and not isinstance(table, Table):
        raise TypeError(f"table must be a Table, a dict in the table format, a path or None, "
                        f"got {type(table).__name__}")
    _loaded["table"], _loaded["done"] = table, True
    forget_choices()
    return previous
