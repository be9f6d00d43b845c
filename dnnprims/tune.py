"""Measure the heuristic table that ``algo="auto"`` consults, on this GPU.

    python -m dnnprims.tune [--grid default|quick] [--quick] [--directions D ...]
                            [--dtypes T ...] [--layouts L ...] [--out PATH] [--holdout FRACTION]
                            [--max-seconds S] [--repeat R] [--final-repeat F]
                            [--skip NAME ...] [--filters R ...] [--update] [--list]

For every point of a grid of problems (batch, channels, image size, filter
size, stride, groups, dtype, direction, layout: NCHW unless --layouts says more) it times every registered
algorithm that supports the point (:func:`applicable`: whatever is in the
registry at the time, one entry per tile configuration) with CUDA events
(:func:`time_candidates`: the candidates are timed interleaved, round-robin,
so that a slow moment of the GPU or the host hits all of them, and the
finalists within FINALIST of the best get more samples), and writes the table
in the format documented in :mod:`dnnprims.algos.table` (default: the copy in
the package).  An algorithm that raises is recorded under the entry's "failed"
and the run goes on.  A candidate whose probe (its first timed call) is more
than ``SLOW_FACTOR`` times the best probe is recorded with that single call (it
cannot win; it would only cost time), and so is the only candidate of a point
(it wins whatever its time).  Before a candidate is written off that way it
gets a second single call and keeps the faster of the two, if the first was at
most ``RECHECK_FACTOR`` times the best (beyond that a stray slow call cannot
hide a winner): one slow call once recorded a 6x-too-slow Winograd time that
misled the table's interpolation.  Such single-call times are listed in the
entry's "probed", the candidates that got the finalists' samples in its
"finalists".

Whatever is registered in ``dnnprims.algos.REGISTRY`` when the tuner runs is
timed (every registered name is a candidate wherever it ``supports`` a point and
fits FIND_WORKSPACE_LIMIT): a newly registered algorithm needs no change here,
only a re-run.  ``--skip NAME ...`` leaves algorithms out.  A candidate that
breaks the CUDA context (an illegal address: every later call would fail too)
stops the run; the table measured so far is written and the message names it.

The grid (GRIDS) is a base block (every filter, channel pair, batch and image
size) plus extra "blocks" that add points where the base is thin; the default
grid adds batch-1 points with the channel counts between the base ones (64,
256, 1024), where the choice is decided by launch and host time rather than
by arithmetic and the base grid left the table to interpolate.

What is timed is the public call a user makes (:func:`public_call`:
``conv2d_forward(x, w, algo=name, ...)`` and the two backward functions), not
the algorithm's ``run`` alone: at batch 1 a call is bound by host time
(validation, output allocation, the algorithm's own launches: 25-50 us against
10-30 us of GPU work), and the algorithm that launches least can win there
although its kernel is slower.  Timed through ``run``, the tuner's winner at a
grid point was within 10 % of the fastest public call on 11 of 17 batch-1
benchmark problems under 60 us (notes/table.md).

Points are visited in a fixed shuffled order, so ``--max-seconds`` (stop
starting new points after that long) leaves an even sample of the grid (the
log and ``grid.unmeasured`` count the points left out, per block), and the
table so far is written to ``<out>.partial`` every ``SAVE_EVERY`` points, so a
run killed midway still leaves a usable table there; ``--out`` itself is
written only when the run ends (Ctrl-C leaves the table there as it was).  The finalists' extra samples are taken only while the
pace of the recent points says the whole grid ends within PACE_MARGIN x
--max-seconds: they never cost grid points.

Updating part of a table: ``--filters 5 7 --update`` re-measures only the grid
points with those filter sizes and replaces their entries in the table at
``--out``, keeping every other entry as it was (the grid's metadata records
the update): a new algorithm that applies only there (say a 5x5 Winograd
tile) costs a minute of GPU time, not the whole grid.  The holdout figures
are recomputed over the merged table.

Holdout: a point is held out when ``crc32(point key) / 2^32 < --holdout``
(deterministic; independent of the grid's order and of which other points
exist).  Held-out points are looked up in a table built from the other points
only; the run reports how often that pick is within 10 % of the fastest
measured algorithm at the point (and, for comparison, how often the rule's
pick is), prints it and stores it in the table's "holdout" metadata.  The
table written contains all points (held-out ones marked ``"holdout": true``).
"""
import argparse
import datetime
import itertools
import json
import os
import pathlib
import random
import sys
import tempfile
import time
import zlib

from . import algos
from .algos import table as conv_table
from .algos.find import FIND_WORKSPACE_LIMIT, gpu_name, random_operands

SLOW_FACTOR = 4.0
RECHECK_FACTOR = 12.0   # a first single call up to this x the best gets a second one
# Interleaved timing (time_candidates): samples per candidate, taken PER_ROUND at a
# time after one untimed call, round-robin over the candidates; after DROP_AFTER
# rounds a candidate over DROP_FACTOR x the best stops; the finalists (within
# FINALIST x the best) get FINAL_REPEAT more samples.
REPEAT = 6
PER_ROUND = 2
DROP_AFTER = 2
DROP_FACTOR = 2.0   # = table.CAP: the lookup censors times above it anyway
FINALIST = 1.15
FINAL_REPEAT = 8   # 14 samples for the finalists
# Under SMALL_MS the finalists get twice FINAL_REPEAT: the noise sits there (host-bound
# calls; notes/table2.md) and such calls cost next to nothing.
SMALL_MS = 0.05
SAVE_EVERY = 50
WITHIN = 1.10   # "a good pick": at most 10 % slower than the fastest measured

# filters: (R, S, stride) of ungrouped convolutions; depthwise: the same for
# groups == C == K.  Channels: C and K each take every value (C x K pairs);
# depthwise points have K == C.  Points over max_gflop are left out (their
# timing would dominate the run; the nearest smaller entry stands in).
# A grid's "blocks" add points: each block overrides some keys of the base
# (batches, images, channels, filters, depthwise) and keeps the others.
GRIDS = {
    "default": {"filters": [[1, 1, 1], [1, 1, 2], [3, 3, 1], [3, 3, 2], [5, 5, 1], [7, 7, 1]],
                "depthwise": [[3, 3, 1], [3, 3, 2]],
                "batches": [1, 8, 32], "images": [7, 14, 28, 56], "channels": [32, 128, 512],
                "max_gflop": 42.0,   # 42: big_7x7_s1 at batch 32 (40.3 GFLOP) gets its own point
                # batch 1: the channel counts between the base ones (ResNet's 64/256/1024 among
                # them); small N*P*Q (49..3136 rows), where launch and host time decide
                "blocks": [{"name": "batch1", "batches": [1], "channels": [64, 256, 1024]},
                           # 5x5 / 7x7 between the base channel counts: FFT, DFT and Winograd
                           # cross over there (C = K = 64 was read off C = K = 32 and picked
                           # fft at 0.55 ms where dft runs in 0.36)
                           {"name": "large_filters", "filters": [[5, 5, 1], [7, 7, 1]], "depthwise": [],
                            "batches": [8, 32], "channels": [64, 256]},
                           # ResNet's last stage (C or K = 2048 on 7x7 / 14x14 images) was 4x past
                           # the base's 512: the planes extrapolated there and put implicit GEMM
                           # (0.20 ms) over cuBLAS (0.10 ms) on r50_5_1x1_up / _dn
                           {"name": "wide_channels", "filters": [[1, 1, 1], [1, 1, 2], [3, 3, 1]],
                            "depthwise": [], "batches": [1, 32], "images": [7, 14],
                            "channels": [512, 2048]}]},
    "quick": {"filters": [[1, 1, 1], [3, 3, 1]], "depthwise": [[3, 3, 1]],
              "batches": [1, 32], "images": [7, 28], "channels": [32, 256], "max_gflop": 5.0},
}
DTYPES = ("float32", "float16")


def problem_of(direction, dtype, N, C, H, K, R, S, stride, groups, layout="NCHW"):
    """The ConvProblem of one grid point ("same" padding), validated like a call."""
    from .conv import _describe
    x_shape = (N, C, H, H) if layout == "NCHW" else (N, H, H, C)
    return _describe(x_shape, (K, C // groups, R, S), stride, (R // 2, S // 2), 1, groups,
                     layout, dtype)


def grid_blocks(grid):
    """The base block of ``grid`` and its extra blocks, each a complete spec."""
    base = {k: v for k, v in grid.items() if k != "blocks"}
    return [base] + [dict(base, **block) for block in grid.get("blocks", [])]


def grid_points(grid, directions, dtypes, layouts=("NCHW",)):
    """Every (direction, problem) of ``grid`` (a GRIDS value: the base block and
    its extra blocks, a point listed twice kept once), in a fixed shuffled order."""
    points, seen = [], set()
    for block in grid_blocks(grid):
        shapes = []
        for R, S, stride in block["filters"]:
            for C in block["channels"]:
                for K in block["channels"]:
                    shapes.append((C, K, R, S, stride, 1))
        for R, S, stride in block.get("depthwise", []):
            for C in block["channels"]:
                shapes.append((C, C, R, S, stride, C))
        for direction, dtype, layout in itertools.product(directions, dtypes, layouts):
            for N, H, (C, K, R, S, stride, groups) in itertools.product(block["batches"], block["images"],
                                                                        shapes):
                p = problem_of(direction, dtype, N, C, H, K, R, S, stride, groups, layout)
                key = point_key(direction, p)
                if p.flops <= block["max_gflop"] * 1e9 and key not in seen:
                    seen.add(key)
                    points.append((direction, p))
    random.Random(0).shuffle(points)
    return points


def applicable(problem, direction, skip=()):
    """(names, failed): the candidates find mode would time (every registered
    algorithm admitted under the default options, workspace within
    FIND_WORKSPACE_LIMIT; none named in ``skip``), except that an algorithm
    whose ``supports``/``workspace_bytes`` raises is recorded, not fatal."""
    names, failed = [], {}
    for name, algorithm in algos.REGISTRY.items():
        if name in skip:
            continue
        try:
            if (algos.admits(algorithm, problem, direction)[0]
                    and algorithm.workspace_bytes(problem, direction) <= FIND_WORKSPACE_LIMIT):
                names.append(name)
        except Exception as e:  # noqa: BLE001 -- a broken algorithm is data, not fatal
            failed[name] = f"supports/workspace_bytes: {type(e).__name__}: {e}"[:300]
    return names, failed


def point_key(direction, p):
    return (f"{direction}|{p.dtype}|{p.layout}|N={p.N}|C={p.C}|H={p.H}|W={p.W}|K={p.K}|"
            f"{p.R}x{p.S}|stride={p.stride[0]},{p.stride[1]}|groups={p.groups}")


def is_holdout(key, fraction):
    return zlib.crc32(key.encode()) / 2**32 < fraction


class BrokenContext(RuntimeError):
    """A candidate left the CUDA context unusable: the run cannot go on."""


def _context_ok(cupy):
    try:
        cupy.cuda.runtime.deviceSynchronize()
        return True
    except Exception:  # noqa: BLE001 -- a sticky error (illegal address, launch failure)
        return False


# The memory pool is emptied after a point only above this size (cudaMalloc and
# cudaFree on every point cost time; a full pool is of no use to the next point).
POOL_KEEP_BYTES = 8 * 2**30


def public_call(problem, direction, name, a, b):
    """A no-argument callable: the public function of ``direction`` on the
    operands ``a``, ``b`` (as :func:`random_operands` makes them) with
    ``algo=name``, i.e. what a user's call costs (see the module docstring)."""
    from . import conv
    options = dict(stride=problem.stride, padding=problem.padding, dilation=problem.dilation,
                   groups=problem.groups, layout=problem.layout, algo=name)
    if direction == "forward":
        return lambda: conv.conv2d_forward(a, b, **options)
    if direction == "backward_data":
        return lambda: conv.conv2d_backward_data(a, b, problem.x_shape, **options)
    return lambda: conv.conv2d_backward_filter(a, b, problem.w_shape, **options)


class EventTimer:
    """Times blocks of public calls on the GPU with CUDA events: the one
    interface :func:`time_candidates` uses (tests pass a fake with the same
    ``block`` method)."""

    def __init__(self, cupy):
        self.cupy = cupy

    def block(self, call, count, warm=True):
        """Drain the stream, make one untimed call when ``warm``, then
        ``count`` timed calls back to back: their ms.  After the untimed call
        the timed ones run as in a loop of this call (a host-bound call costs
        its host time, a GPU-bound one its GPU time), whatever ran before it:
        without the drain, a candidate timed right after a slower one would
        have its host time hidden behind the other's queued GPU work."""
        cupy = self.cupy
        stream = cupy.cuda.get_current_stream()
        stream.synchronize()
        if warm:
            call()
        events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(count)]
        for start, end in events:
            start.record(stream)
            call()
            end.record(stream)
        events[-1][1].synchronize()
        return [cupy.cuda.get_elapsed_time(start, end) for start, end in events]


def _median(samples):
    ordered = sorted(samples)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def time_candidates(calls, timer, repeat=REPEAT, final_repeat=FINAL_REPEAT, on_failure=None):
    """({name: ms}, {name: error text}, [names timed by single calls],
    {name: samples behind its ms}) for ``calls`` ({name: no-argument callable},
    the likely winner first), timed with ``timer.block`` (see EventTimer).

    1. Each candidate: one untimed call (compiles, builds plans, validates),
       then one timed call, the probe.  A candidate whose probe is over
       SLOW_FACTOR x the best probe gets a second one if the first was at most
       RECHECK_FACTOR x the best, and keeps the faster; still over SLOW_FACTOR:
       written off with that single call (it cannot win).  A lone candidate is
       timed by its probe only (it wins whatever its time).
    2. The others get ``repeat`` samples in rounds, round-robin (each round
       visits every candidate, starting one further along each round): per
       visit an untimed call and PER_ROUND timed ones.  A slow moment of the GPU or of
       the host then hits every candidate instead of all ``repeat`` samples of
       one (in one tuning run, 20 % of the identical-kernel pairs under 30 us
       differed by more than 10 %: notes/table2.md).  After DROP_AFTER rounds a
       candidate over DROP_FACTOR x the best median keeps its median so far:
       the lookup censors every time at CAP (= DROP_FACTOR) x a point's fastest,
       so more samples of it would change nothing.
    3. The finalists (within FINALIST x the best median, when there are two or
       more) get ``final_repeat`` more samples (twice that where the best is
       under SMALL_MS), interleaved the same way; their time is the median of
       all their samples.

    A candidate that raises is recorded in the failures and timed no more;
    ``on_failure(name, text)`` is called first (the tuner checks the CUDA
    context there and raises BrokenContext)."""
    ms, failed, probed, samples = {}, {}, [], {}

    def attempt(name, count, warm=True):
        try:
            return timer.block(calls[name], count, warm)
        except Exception as e:  # noqa: BLE001 -- a failing algorithm is data, not fatal
            failed[name] = f"{type(e).__name__}: {e}"[:300]
            if on_failure is not None:
                on_failure(name, failed[name])
            return None

    probes = {}
    for name in calls:
        got = attempt(name, 1)          # warm (untimed) + the probe
        if got is not None:
            probes[name] = got[0]
    if len(probes) == 1:
        (name, t), = probes.items()
        return {name: t}, failed, [name], {name: 1}
    best = min(probes.values(), default=None)
    alive = []
    for name, t in probes.items():
        if t > SLOW_FACTOR * best and t <= RECHECK_FACTOR * best:
            again = attempt(name, 1, warm=False)
            if again is None:
                continue
            t = min(t, again[0])    # one slow call is not enough to write it off
        if t > SLOW_FACTOR * best:
            ms[name], samples[name] = t, 1
            probed.append(name)
        else:
            alive.append(name)
    taken = {name: [] for name in alive}

    def rounds(names, count, shift=0):
        for r in range(-(-count // PER_ROUND)):
            for j in range(len(names)):
                name = names[(j + r + shift) % len(names)]
                if name in failed:
                    continue
                got = attempt(name, min(PER_ROUND, count - r * PER_ROUND))
                if got is not None:
                    taken[name].extend(got)

    def medians(names):
        return {n: _median(taken[n]) for n in names if n not in failed and taken[n]}

    first = min(repeat, DROP_AFTER * PER_ROUND)
    rounds(alive, first)
    now = medians(alive)
    if now:
        top = min(now.values())
        for name, t in now.items():
            if t > DROP_FACTOR * top:
                alive.remove(name)
    rounds([n for n in alive if n not in failed], repeat - first, shift=DROP_AFTER)
    now = medians(taken)
    if now and final_repeat > 0:
        top = min(now.values())
        finalists = [n for n, t in now.items() if t <= FINALIST * top]
        if len(finalists) > 1:
            rounds(finalists, final_repeat * (2 if top < SMALL_MS else 1))
    for name in taken:
        if name not in failed and taken[name]:
            ms[name], samples[name] = _median(taken[name]), len(taken[name])
    return ms, failed, probed, samples


def measure_point(problem, direction, names, repeat, final_repeat=None):
    """({name: median ms}, {name: error text}, [names timed by single calls],
    {name: samples}) for the candidates ``names`` (:func:`time_candidates` on
    the public calls).  Raises BrokenContext if a candidate broke the CUDA
    context."""
    import cupy

    final_repeat = FINAL_REPEAT if final_repeat is None else final_repeat
    try:
        a, b, _ = random_operands(problem, direction)
    except Exception as e:  # noqa: BLE001 -- out of memory: record, go on
        cupy.get_default_memory_pool().free_all_blocks()
        return {}, {name: f"inputs: {type(e).__name__}: {e}"[:300] for name in names}, [], {}

    def on_failure(name, text):
        if not _context_ok(cupy):
            raise BrokenContext(f"{name} broke the CUDA context on {direction} "
                                f"{point_key(direction, problem)}: {text}")
    calls = {name: public_call(problem, direction, name, a, b) for name in names}
    result = time_candidates(calls, EventTimer(cupy), repeat, final_repeat, on_failure)
    calls = a = b = None   # the operands go back to the pool before it may be emptied
    pool = cupy.get_default_memory_pool()
    if pool.total_bytes() > POOL_KEEP_BYTES:
        pool.free_all_blocks()
    return result


MIN_WRITTEN_MS = 1e-6  # 1 ns: below any timer's resolution


def _written_ms(v):
    """A time as the table keeps it: 6 significant digits (far below timing
    noise), never under MIN_WRITTEN_MS.  Rounding to 5 decimals wrote 0.0 for
    a time under 5e-6 ms, which the lookup ranks first when measured but takes
    for "did not run" when it interpolates."""
    return float(f"{max(v, MIN_WRITTEN_MS):.6g}")


def make_entry(direction, p, ms, failed, holdout, probed=()):
    entry = conv_table.features(p, direction)
    entry["problem"] = {"N": p.N, "C": p.C, "H": p.H, "W": p.W, "K": p.K,
                        "padding": list(p.padding), "groups": p.groups, "dtype": p.dtype}
    entry["winner"] = min(ms, key=ms.get) if ms else None
    entry["ms"] = {name: _written_ms(v) for name, v in sorted(ms.items(), key=lambda kv: kv[1])}
    entry["failed"] = failed
    entry["probed"] = sorted(name for name in probed if name in ms)
    entry["holdout"] = holdout
    return entry


def entry_problem(entry):
    """The ConvProblem an entry was measured on."""
    from .conv import _describe
    q = entry["problem"]
    x_shape = (q["N"], q["C"], q["H"], q["W"]) if entry["layout"] == "NCHW" else \
        (q["N"], q["H"], q["W"], q["C"])
    w_shape = (q["K"], q["C"] // q["groups"], entry["R"], entry["S"])
    return _describe(x_shape, w_shape, tuple(entry["stride"]), tuple(q["padding"]),
                     tuple(entry["dilation"]), q["groups"], entry["layout"], q["dtype"])


def rule_pick(problem, direction, options=algos.DEFAULT_OPTIONS):
    """The documented rule's pick, or None.  The rule reads no table entry of the
    problem itself; a dilated problem's rule consults the table at its undilated
    twin (the tuning grids hold no dilated points, so the holdout is unaffected)."""
    for name, _ in algos.auto_preferences(problem, direction):
        algorithm = algos.REGISTRY.get(name)
        try:
            if algorithm is not None and algos.admits(algorithm, problem, direction, options)[0]:
                return name
        except Exception:  # noqa: BLE001 -- a broken algorithm: the next preference
            continue
    return None


def block_of(entry, grid):
    """The name of the first block of ``grid`` (a GRIDS value) that holds the
    entry's point ("base" for the base block), or None."""
    q = entry["problem"]
    for i, block in enumerate(grid_blocks(grid)):
        shapes = block["filters"] if q["groups"] == 1 else block.get("depthwise", [])
        if (q["N"] in block["batches"] and q["H"] in block["images"] and q["C"] in block["channels"]
                and q["K"] in block["channels"] and [entry["R"], entry["S"], entry["stride"][0]] in shapes):
            return block.get("name", "base") if i else "base"
    return None


def evaluate_holdout(entries, grid=None):
    """How often the pick of a table built from the non-held-out entries is
    within 10 % of the fastest measured algorithm on the held-out entries
    (also per class, per batch, and per block of ``grid`` where given: the
    base block's figure stays comparable when blocks are added)."""
    train = conv_table.Table({"version": conv_table.VERSION,
                              "entries": [e for e in entries if not e["holdout"]]})
    tested = [e for e in entries if e["holdout"] and e["ms"]]
    report = {"points": len(tested), "table_within_10pct": 0, "rule_within_10pct": 0,
              "table_decided": 0, "contested_points": 0, "contested_table_within_10pct": 0,
              "by_class": {}, "by_batch": {}, "by_block": {}, "misses": []}
    slowdowns = []
    for e in tested:
        problem = entry_problem(e)
        best = min(e["ms"].values())
        choice = train.explain(problem, e["direction"], algos.DEFAULT_OPTIONS, algos.REGISTRY, algos.admits)
        if choice is not None:
            report["table_decided"] += 1
            pick = choice[0]
        else:
            pick = rule_pick(problem, e["direction"])
        t = e["ms"].get(pick)
        good = t is not None and t <= WITHIN * best
        report["table_within_10pct"] += good
        if len(e["ms"]) > 1:   # more than one candidate ran: the pick could go wrong
            report["contested_points"] += 1
            report["contested_table_within_10pct"] += good
        for group, name in (("by_class", f"{e['direction']} {e['dtype_class']}"),
                            ("by_batch", f"N={e['problem']['N']}"),
                            ("by_block", grid and block_of(e, grid))):
            if not name:
                continue
            cls = report.setdefault(group, {}).setdefault(name, {"points": 0, "table_within_10pct": 0})
            cls["points"] += 1
            cls["table_within_10pct"] += good
        if not good:
            report["misses"].append({"point": _short(e), "pick": pick, "pick_ms": t,
                                     "best": e["winner"], "best_ms": best})
        if t is not None:
            slowdowns.append(t / best)
        rule_t = e["ms"].get(rule_pick(problem, e["direction"]))
        if rule_t is not None and rule_t <= WITHIN * best:
            report["rule_within_10pct"] += 1
    n = max(1, len(tested))
    report["table_fraction"] = round(report["table_within_10pct"] / n, 4)
    report["rule_fraction"] = round(report["rule_within_10pct"] / n, 4)
    report["contested_table_fraction"] = round(
        report["contested_table_within_10pct"] / max(1, report["contested_points"]), 4)
    if slowdowns:
        import math
        report["table_geomean_slowdown"] = round(math.exp(sum(map(math.log, slowdowns)) / len(slowdowns)), 4)
    report["misses"] = report["misses"][:40]
    return report


def noise_report(entries):
    """Timing noise seen in the table itself: ``implicit_gemm`` runs the same
    kernel as ``implicit_gemm_<pick_tile>``, so where both were fully timed their
    ratio is pure noise.  Counts the pairs that differ by more than 10 %, all
    and under 30 us (the session-3 table: 5.2 % of 2633, 20.7 % of the 656 under
    30 us, 0.2 % above: notes/table2.md)."""
    from .algos.implicit_gemm import pick_tile
    report = {"pairs": 0, "over_10pct": 0, "pairs_under_30us": 0, "over_10pct_under_30us": 0}
    for e in entries:
        ms, probed = e["ms"], set(e.get("probed", ()))
        if "implicit_gemm" not in ms or "implicit_gemm" in probed:
            continue
        twin = "implicit_gemm_" + pick_tile(entry_problem(e), e["direction"])
        if twin not in ms or twin in probed:
            continue
        a, b = ms["implicit_gemm"], ms[twin]
        off = max(a, b) > WITHIN * min(a, b)
        report["pairs"] += 1
        report["over_10pct"] += off
        if min(a, b) < 0.03:
            report["pairs_under_30us"] += 1
            report["over_10pct_under_30us"] += off
    return report


def _short(e):
    q = e["problem"]
    return (f"{e['direction']} {q['dtype']} N={q['N']} C={q['C']} H={q['H']} K={q['K']} "
            f"{e['R']}x{e['S']} s{e['stride'][0]} g={q['groups']}")


def metadata():
    import cupy
    from . import __version__
    return {"format": conv_table.FORMAT, "version": conv_table.VERSION, "gpu": gpu_name(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "cupy": cupy.__version__, "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
            "dnnprims": __version__, "algorithms": list(algos.REGISTRY),
            "features": conv_table.FEATURES}


def dumps(data):
    """The table as JSON text: metadata indented, one entry per line (small,
    and a re-measured table diffs line by line)."""
    head = json.dumps({k: v for k, v in data.items() if k != "entries"}, indent=1)
    entries = ",\n".join(json.dumps(e, separators=(",", ":")) for e in data.get("entries", []))
    return head[:-2] + ',\n "entries": [\n' + entries + "\n ]\n}\n"


def write(path, data):
    """Write atomically (a killed run leaves the previous complete file)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        f.write(dumps(data))
    os.replace(f.name, path)


def _projected_end(durations, elapsed, remaining):
    """When the run would end at the pace of the last points (``durations``:
    seconds each of the last PACE_WINDOW points took; a point over
    COMPILE_SECONDS paid first-use kernel compiles and does not count), or None
    before PACE_MIN points."""
    usual = [d for d in durations if d <= COMPILE_SECONDS]
    if len(usual) < PACE_MIN:
        return None
    return elapsed + sum(usual) / len(usual) * remaining


PACE_WINDOW = 400      # points over which the tuner's pace is measured
PACE_MIN = 50
COMPILE_SECONDS = 2.0  # a point that took longer compiled kernels (the first ~100 points: ~75 s)
PACE_MARGIN = 0.9      # finalist samples only while the projected end is within this x --max-seconds


def tune(points, *, out, holdout=0.2, max_seconds=None, repeat=REPEAT, final_repeat=FINAL_REPEAT,
         grid_info=None, meta=None, measure=measure_point, log=print, skip=(), keep=()):
    """Measure ``points`` ([(direction, problem)]), write the table to ``out``,
    return it.  ``measure(problem, direction, names, repeat, final_repeat)`` ->
    (ms, failed[, probed[, samples]]) is injectable so the bookkeeping can be
    tested without a GPU.  Algorithms named in ``skip`` are not timed.

    Time: with ``max_seconds``, no point starts after that many seconds
    (points come in a fixed shuffled order: a cut leaves an even sample, and
    the points left out are counted per block in the log and in
    ``grid.unmeasured``); the finalists' extra samples are taken only while
    the pace of the last PACE_WINDOW points says the whole grid still ends
    within PACE_MARGIN x max_seconds, so the extra samples never cost points.

    ``keep``: entries of an earlier table kept as they are (``--update``);
    they are written with the measured ones and count in the holdout.  A kept
    entry whose point is measured again is replaced."""
    meta = dict(meta if meta is not None else metadata())
    partial = pathlib.Path(str(out) + ".partial")
    kept = {}
    for e in keep:   # held out or not by this run's fraction: the split the holdout report names
        k = point_key(e["direction"], entry_problem(e))
        kept[k] = dict(e, holdout=is_holdout(k, holdout))
    keep = kept

    def merged():   # kept entries not measured again (a --max-seconds cut keeps the old ones), then ours
        return [e for k, e in keep.items() if k not in measured] + entries
    start = time.perf_counter()
    entries, stopped, broken, unmeasured, measured = [], False, None, {}, set()
    extras = {"points": 0, "off": 0}
    data = dict(meta)
    history, last = [], 0.0   # seconds each recent point took; when the last one started

    def snapshot():
        data.update(grid=dict(grid_info or {}, points_total=len(points), points_measured=len(entries),
                              points_kept=len(merged()) - len(entries),
                              seconds=round(time.perf_counter() - start, 1), stopped_early=stopped,
                              unmeasured=unmeasured, repeat=repeat, final_repeat=final_repeat,
                              finalist_points=extras["points"], finalist_samples_off=extras["off"],
                              slow_factor=SLOW_FACTOR, skipped=sorted(skip), broken=broken,
                              timing="the public call (conv2d_forward / conv2d_backward_data / "
                                     "conv2d_backward_filter with algo=name), CUDA events; "
                                     "dnnprims.tune.time_candidates: a warm call and a probe each, "
                                     f"then `repeat` samples per candidate in rounds of {PER_ROUND} after an "
                                     "untimed call, round-robin over the candidates; candidates within "
                                     f"{FINALIST} x the best get `final_repeat` more (entry's 'finalists'); "
                                     "median"),
                    entries=merged())
        return data

    for i, (direction, p) in enumerate(points):
        elapsed = time.perf_counter() - start
        if max_seconds is not None and elapsed > max_seconds:
            stopped = True
            spec = (grid_info or {}).get("spec")
            for d, q in points[i:]:
                block = (spec and block_of(make_entry(d, q, {}, {}, False), spec)) or "all"
                unmeasured[block] = unmeasured.get(block, 0) + 1
            log(f"stopping after {elapsed:.0f} s (--max-seconds {max_seconds}): "
                f"{i} of {len(points)} points measured; not measured: "
                + ", ".join(f"{block} {n}" for block, n in sorted(unmeasured.items())))
            break
        if i:
            history.append(elapsed - last)
            del history[:-PACE_WINDOW]
        last = elapsed
        extra = final_repeat
        if max_seconds is not None:
            end = _projected_end(history, elapsed, len(points) - i)
            if end is not None and end > PACE_MARGIN * max_seconds:
                extra = 0
                extras["off"] += 1
        key = point_key(direction, p)
        names, refused = applicable(p, direction, skip)
        first = rule_pick(p, direction)   # likely fast: later slow ones cost one call only
        names.sort(key=lambda name: name != first)
        try:
            ms, failed, *rest = measure(p, direction, names, repeat, extra)
        except BrokenContext as e:
            stopped, broken = True, str(e)
            log(f"stopping: {e}; re-run with --skip NAME after fixing it")
            break
        failed = {**refused, **failed}
        entry = make_entry(direction, p, ms, failed, is_holdout(key, holdout), rest[0] if rest else ())
        samples = rest[1] if len(rest) > 1 else {}
        finalists = sorted(n for n, k in samples.items() if k > repeat)
        if finalists:
            entry["finalists"] = finalists
            extras["points"] += 1
        entries.append(entry)
        measured.add(key)
        best = f"{entry['winner']} {ms[entry['winner']]:.3f} ms" if ms else "no candidate ran"
        log(f"[{i + 1:4d}/{len(points)}] {elapsed:6.1f}s {key}: {best} of {len(names)}"
            + (f" ({len(finalists)} finalists)" if finalists else "")
            + (f", {len(failed)} failed ({', '.join(failed)})" if failed else ""))
        if (i + 1) % SAVE_EVERY == 0:   # beside --out: an interrupted run leaves the table there alone
            write(partial, snapshot())
    data = snapshot()
    data["holdout"] = dict(evaluate_holdout(merged(), (grid_info or {}).get("spec")), fraction=holdout,
                           split="a point is held out when crc32(its key) / 2^32 < fraction; "
                                 "held-out points are looked up in a table of the other points")
    data["grid"]["noise"] = noise_report(merged())
    write(out, data)
    partial.unlink(missing_ok=True)
    h, noise = data["holdout"], data["grid"]["noise"]
    log(f"wrote {out}: {len(entries)} entries measured, {len(merged()) - len(entries)} kept, in {data['grid']['seconds']} s; finalist samples at "
        f"{extras['points']} points (off at {extras['off']} points to keep within --max-seconds)")
    log(f"holdout: {h['points']} points; table pick within 10 % of the fastest on "
        f"{h['table_within_10pct']} ({100 * h['table_fraction']:.1f} %), the rule's on "
        f"{h['rule_within_10pct']} ({100 * h['rule_fraction']:.1f} %); on the {h['contested_points']} points "
        f"with more than one candidate: {100 * h['contested_table_fraction']:.1f} %; "
        f"geomean slowdown of the table's pick {h.get('table_geomean_slowdown', float('nan'))}")
    log(f"noise: identical-kernel pairs (implicit_gemm vs its tile) more than 10 % apart: "
        f"{noise['over_10pct']} of {noise['pairs']}; under 30 us: {noise['over_10pct_under_30us']} of "
        f"{noise['pairs_under_30us']} (session 3, timed back to back: 5.2 % and 20.7 %)")
    for group in ("by_block", "by_batch", "by_class"):
        log(f"holdout {group[3:]}: " + "; ".join(
            f"{name} {c['table_within_10pct']}/{c['points']}" for name, c in sorted(h[group].items())))
    return data


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m dnnprims.tune", description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", choices=sorted(GRIDS), default="default")
    parser.add_argument("--quick", action="store_true", help="same as --grid quick")
    parser.add_argument("--directions", nargs="+", choices=algos.DIRECTIONS, default=list(algos.DIRECTIONS))
    parser.add_argument("--dtypes", nargs="+", choices=("float32", "float16", "bfloat16", "float64"),
                        default=list(DTYPES))
    parser.add_argument("--layouts", nargs="+", choices=("NCHW", "NHWC"), default=["NCHW"])
    parser.add_argument("--out", default=str(conv_table.DEFAULT_PATH), help="table file to write")
    parser.add_argument("--holdout", type=float, default=0.2, help="fraction of points held out")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="start no new point after this many seconds")
    parser.add_argument("--repeat", type=int, default=REPEAT,
                        help="timed samples per candidate (median; interleaved, see time_candidates)")
    parser.add_argument("--final-repeat", type=int, default=FINAL_REPEAT,
                        help="more samples for the candidates within FINALIST x the best")
    parser.add_argument("--skip", nargs="+", default=[], metavar="NAME",
                        help="registered algorithms not to time (e.g. one that is broken)")
    parser.add_argument("--filters", nargs="+", type=int, default=None, metavar="R",
                        help="only the grid points with these filter sizes (R = S)")
    parser.add_argument("--update", action="store_true",
                        help="keep the other entries of the table at --out; replace only the points measured")
    parser.add_argument("--list", action="store_true", help="print the grid and exit (no GPU needed)")
    import dnnprims  # noqa: F401 -- every public module imported: whatever registers algorithms has run
    args = parser.parse_args(argv)
    unknown = sorted(set(args.skip) - set(algos.REGISTRY))
    if unknown:
        parser.error(f"--skip: not registered: {', '.join(unknown)}")
    if not 0 <= args.holdout < 1:
        parser.error("--holdout must be in [0, 1)")
    if args.repeat < 1:   # with no samples only the written-off candidates would get a time
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    if args.max_seconds is not None and not args.max_seconds > 0:   # would stop before the first point
        parser.error(f"--max-seconds must be positive, got {args.max_seconds}")
    if args.final_repeat < 0:
        parser.error(f"--final-repeat must be at least 0, got {args.final_repeat}")
    name = "quick" if args.quick else args.grid
    points = grid_points(GRIDS[name], args.directions, args.dtypes, args.layouts)
    if args.filters is not None:
        points = [(d, q) for d, q in points if q.R in args.filters]
        if not points:   # without --update an empty table would replace the one at --out
            sizes = sorted({q.R for _, q in grid_points(GRIDS[name], args.directions, args.dtypes, args.layouts)})
            parser.error(f"--filters {' '.join(map(str, args.filters))}: no point of grid {name!r} has "
                         f"these filter sizes (it has {', '.join(map(str, sizes))})")
    keep, grid_info = [], None
    if args.update:
        try:
            with open(args.out) as f:
                old = json.load(f)
            conv_table.Table(old, args.out)          # the version and every entry's features and times
            keep, grid_info = old["entries"], old.get("grid")
            for e in keep:
                entry_problem(e)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
            parser.error(f"--update: cannot use the table at --out {args.out}: {type(e).__name__}: {e}")
    if args.list:
        for direction, p in points:
            print(point_key(direction, p))
        print(f"{len(points)} points in grid {name!r}")
        return 0
    try:   # find out now, not after the first SAVE_EVERY points (or the whole run) are measured
        folder = pathlib.Path(args.out).absolute().parent
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        parser.error(f"--out {args.out}: cannot write there ({type(e).__name__}: {e})")
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
    except Exception as e:  # noqa: BLE001
        print(f"python -m dnnprims.tune needs a CUDA GPU and CuPy ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    timed = [n for n in algos.REGISTRY if n not in args.skip]
    print(f"tuning {len(points)} points of grid {name!r} ({', '.join(args.directions)}; "
          f"{', '.join(args.dtypes)}) over {len(timed)} registered algorithms on {gpu_name()}: "
          f"{', '.join(timed)}", flush=True)
    command = "python -m dnnprims.tune " + " ".join(sys.argv[1:] if argv is None else argv)
    if grid_info is None:
        grid_info = {"name": name, "spec": GRIDS[name], "directions": args.directions, "dtypes": args.dtypes,
                     "layouts": args.layouts, "padding": "R // 2, S // 2", "dilation": 1, "command": command}
    else:   # --update: the grid is the earlier table's; say what was measured again
        grid_info = {k: v for k, v in grid_info.items() if k in ("name", "spec", "directions", "dtypes", "layouts",
                                                                 "padding", "dilation", "command", "updates")}
        grid_info["updates"] = grid_info.get("updates", []) + [
            {"command": command, "points": len(points),
             "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}]
    data = tune(points, out=args.out, holdout=args.holdout, max_seconds=args.max_seconds, repeat=args.repeat,
                final_repeat=args.final_repeat,
                grid_info=grid_info, log=lambda s: print(s, flush=True), skip=args.skip, keep=keep)
    return 3 if data["grid"]["broken"] else 0


if __name__ == "__main__":
    sys.exit(main())
