"""What every A/B of a work-in-progress patch shares (notes/ab/patch_ab.sh runs it):
load the old tree beside the patched one, time each callable eager and in device time,
the 1 GiB and same-size copies, switches set for one call, and the table.

    python notes/<name>_ab.py OLD_ROOT --json PATH
    (the script does `sys.path.insert(0, "notes/ab")` and `import common`).

Timing (as the bench): eager = dnnprims.bench.timing.measure (CUDA events around each
call, median of 20); device = timing.measure_queued (20 calls queued behind the overhead
bench's busy-wait kernel; negative = a burst outlasted the hold: an upper bound).
Each problem is timed in two rounds (A B A B); the table takes the best round."""
import importlib.util
import json
import sys

import numpy as np
import cupy as cp

from dnnprims.bench import timing
from dnnprims.bench.overhead import SPIN

REPEAT = 20


def load_old(root, name="dnnprims_old"):
    """The old tree's dnnprims package (copied aside by patch_ab.sh) as module `name`."""
    spec = importlib.util.spec_from_file_location(name, f"{root}/dnnprims/__init__.py",
                                                  submodule_search_locations=[f"{root}/dnnprims"])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def eager_ms(fn):
    return timing.measure(fn, xp=cp, warmup=3, repeat=REPEAT).median_ms


def _hold(ns):
    SPIN.launch("spin_wait_ns", (1,), (1,), (np.int64(ns),))


def device_ms(fn):
    t, covered = timing.measure_queued(fn, xp=cp, hold=_hold)
    return t.median_ms if covered else -t.median_ms


def copy_gbps():
    """The bench's ceiling: a 1 GiB device copy, read + write bytes over time."""
    src = cp.random.random(2**28, dtype=cp.float32)
    dst = cp.empty_like(src)
    t = timing.measure(lambda: dst.__setitem__(Ellipsis, src), xp=cp, warmup=3, repeat=10)
    del src, dst
    return 2 * 2**30 / (t.median_ms * 1e-3) / 1e9


def same_size_copy(floor_bytes):
    """A device copy moving floor_bytes (half read, half written), the bench's copy-ss."""
    each = max(int(floor_bytes) // 2, 1)
    src, dst = cp.empty(each, cp.uint8), cp.empty(each, cp.uint8)
    src[...] = 1
    return lambda: dst.data.copy_from_device_async(src.data, each)


def switched(module, fn, **switches):
    """fn with module's switches set during each call (switches that key the plans)."""
    def call():
        saved = {k: getattr(module, k) for k in switches}
        for k, v in switches.items():
            assert hasattr(module, k), k
            setattr(module, k, v)
        try:
            return fn()
        finally:
            for k, v in saved.items():
                setattr(module, k, v)
    return call


def max_abs(a, b):
    return float(cp.abs(cp.asarray(a, dtype=cp.float64) - cp.asarray(b, dtype=cp.float64)).max())


def time_rounds(fns, rounds=2):
    """{tag: {"eager": [ms per round], "device": [...]}} of each callable, rounds A B A B."""
    got = {tag: {"eager": [], "device": []} for tag in fns}
    for _ in range(rounds):
        for tag, fn in fns.items():
            got[tag]["eager"].append(eager_ms(fn))
        for tag, fn in fns.items():
            try:
                got[tag]["device"].append(device_ms(fn))
            except Exception as e:  # noqa: BLE001 -- report and go on
                print(f"{tag}: device timing failed: {type(e).__name__}: {e}", flush=True)
    return got


def ab_problem(name, floor_bytes, fns, diffs=None, note=""):
    """Time fns (which should hold "old", the new variants and "torch"; the same-size
    copy is added) and return the row; printed as JSON for the log."""
    fns = dict(fns, copy=same_size_copy(floor_bytes))
    row = {"problem": name, "floor_bytes": floor_bytes, "ms": time_rounds(fns), "diff": diffs or {}, "note": note}
    print(json.dumps(row), flush=True)
    return row


def print_table(rows, copy, json_path=None):
    """The A/B table: ms per round, x torch and x old (best round), of copy (floor at the
    1 GiB copy bandwidth / ours, eager) and of same-size copy (device), diff against old."""
    print()
    print(f"copy {copy:.0f} GB/s (1 GiB, this process).  ms: round 1 / round 2; eager = events around each call,"
          " device = 20 calls queued behind a busy-wait ('-': an upper bound); x torch / x old = their time / ours"
          " (best round, device); of copy = floor at the copy bandwidth / ours (eager); of cp-ss = same-size copy"
          " / ours (device); diff = max |variant - old|")
    print(f"{'problem':22s} {'variant':9s} {'eager ms':>15s} {'device ms':>15s} {'x torch':>7s} {'x old':>6s}"
          f" {'of copy':>7s} {'of cp-ss':>8s}  diff")
    for r in rows:
        best = {tag: {k: (min(abs(t) for t in v) if v else float("nan")) for k, v in t.items()}
                for tag, t in r["ms"].items()}
        floor_ms = r["floor_bytes"] / copy / 1e6
        for tag, t in r["ms"].items():
            if tag == "copy":
                continue
            b = best[tag]
            e = "/".join(f"{v:.4f}" for v in t["eager"])
            d = "/".join(f"{v:.4f}" for v in t["device"])
            diff = r["diff"].get(tag, "")
            x_torch = best["torch"]["device"] / b["device"] if "torch" in best else float("nan")
            x_old = best["old"]["device"] / b["device"] if "old" in best else float("nan")
            print(f"{r['problem']:22s} {tag:9s} {e:>15s} {d:>15s} {x_torch:7.2f} {x_old:6.3f}"
                  f" {floor_ms / b['eager']:7.3f} {best['copy']['device'] / b['device']:8.3f}"
                  f"  {diff if diff == '' else f'{diff:.1e}'}")
        print(f"{'':22s} floor {r['floor_bytes'] / 1e6:.1f} MB = {floor_ms * 1e3:.2f} us at copy speed"
              f"{'; ' + r['note'] if r['note'] else ''}")
    if json_path:
        json.dump({"copy_GBps": copy, "rows": rows}, open(json_path, "w"), indent=1)
