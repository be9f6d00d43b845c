"""The measured heuristic table (dnnprims/algos/table.py) and the tuner that writes
it (dnnprims/tune.py): the shipped table's format, nearest-entry lookup, the
fallbacks under ConvOptions, and the tuner's bookkeeping with a fake timer."""
import json

import numpy as np
import pytest

import dnnprims
from dnnprims import algos, tune
from dnnprims.algos import table


def _problem(N=8, C=64, H=14, K=64, R=3, stride=1, groups=1, dtype="float32"):
    return tune.problem_of("forward", dtype, N, C, H, K, R, R, stride, groups)


def _entry(problem, ms, direction="forward", holdout=False):
    return tune.make_entry(direction, problem, ms, {}, holdout)


@pytest.fixture
def synthetic():
    """Install a small table (two 3x3 float32 forward entries) and restore the
    shipped one afterwards."""
    small = _problem(N=1, C=32, H=7, K=32)
    large = _problem(N=32, C=512, H=28, K=512)
    data = {"version": table.VERSION, "entries": [
        _entry(small, {"direct": 0.01, "implicit_gemm_64x64": 0.02, "gemm": 0.03}),
        _entry(large, {"gemm": 1.0, "implicit_gemm_128x128": 1.2, "direct": 9.0}),
    ]}
    previous = table.use(data)
    yield data
    table.use(previous)


# --- the shipped table ---------------------------------------------------------

def test_shipped_table_parses_and_has_the_documented_fields():
    data = json.loads(table.DEFAULT_PATH.read_text())
    assert data["version"] == table.VERSION and data["format"] == table.FORMAT
    for field in ("gpu", "date", "cupy", "cuda_runtime", "dnnprims", "algorithms", "features",
                  "grid", "holdout", "entries"):
        assert field in data, field
    assert set(data["features"]) == set(table.FEATURES)
    assert data["entries"] and 0 <= data["holdout"]["table_fraction"] <= 1
    for entry in data["entries"]:
        assert set(table.FEATURES) <= set(entry)
        assert entry["direction"] in algos.DIRECTIONS
        assert entry["groups_class"] in ("1", "depthwise", "grouped")
        if entry["ms"]:
            assert entry["winner"] == min(entry["ms"], key=entry["ms"].get)
        # the features are those of the problem it was measured on
        problem = tune.entry_problem(entry)
        assert table.features(problem, entry["direction"]) == {k: entry[k] for k in table.FEATURES}
    table.load()  # the loader accepts it


def test_auto_picks_from_the_shipped_table_deterministically():
    shipped = table.load()
    previous = table.use(shipped)
    try:
        decided = 0
        for entry in shipped.data["entries"][:60]:
            problem = tune.entry_problem(entry)
            name, reason = algos.explain_auto(problem, entry["direction"])
            algos.forget_choices()
            assert (name, reason) == algos.explain_auto(problem, entry["direction"])
            assert algos.REGISTRY[name].supports(problem, entry["direction"])[0]
            if reason.startswith("table:"):
                decided += 1
                # on a measured point, the fastest registered measured candidate wins
                registered = [n for n in entry["ms"] if n in algos.REGISTRY]
                assert name == min(registered, key=entry["ms"].get)
        assert decided > 0
    finally:
        table.use(previous)


# --- lookup and fallbacks on a synthetic table ---------------------------------

def test_nearest_entry_decides_in_a_small_table_and_says_why(synthetic):
    # two matching entries (< MIN_NEIGHBOURS): the nearest one's measurements rank
    name, reason = algos.explain_auto(_problem(N=1, C=32, H=14, K=64), "forward")
    assert name == "direct"
    assert reason.startswith("table: measured at the nearest entry; nearest entry "
                             "(forward float32 NCHW N=1 C=32 H=7")
    assert "measured direct 0.010 ms vs implicit_gemm_64x64 0.020 ms, gemm 0.030 ms" in reason
    name, reason = algos.explain_auto(_problem(N=32, C=512, H=28, K=512), "forward")
    assert name == "gemm" and "log2 distance 0.00); measured gemm 1.000 ms vs implicit_gemm_128x128" in reason
    # conv2d_choose reports the same
    assert dnnprims.conv2d_choose((32, 512, 28, 28), (512, 512, 3, 3), padding=1) == (name, reason)


def test_interpolation_places_the_boundary_between_entries():
    # "implicit_gemm_64x64" grows with N, "gemm" does not: at N=16 gemm wins, but
    # the trend through N=1..16 says implicit_gemm_64x64 still wins at N=12.
    entries = [_entry(_problem(N=n, H=8), {"implicit_gemm_64x64": 0.1 * n, "gemm": 1.45})
               for n in (1, 2, 4, 8, 16)]
    t = table.Table({"version": table.VERSION, "entries": entries})
    query = _problem(N=12, H=8)
    assert t.nearest(query, "forward")[0]["winner"] == "gemm"
    ranked, how, entry, distance = t.ranking(query, "forward")
    assert how == "interpolated from the 5 nearest entries" and entry["problem"]["N"] == 16
    assert [name for _, name in ranked] == ["implicit_gemm_64x64", "gemm"]
    assert ranked[0][0] == pytest.approx(1.2, rel=0.1)
    # gemm's times at N <= 4 are censored at CAP x the fastest there (0.2, 0.4, 0.8 ms):
    # its predicted time is lower than the 1.45 ms it measured, the ranking is the same
    assert 1.2 < ranked[1][0] < 1.45
    # at a measured point the measurement decides
    assert t.ranking(_problem(N=16, H=8), "forward")[:2] == (
        [(1.45, "gemm"), (1.6, "implicit_gemm_64x64")], "measured at the nearest entry")
    ranked, how, _, _ = t.ranking(query, "forward")
    name, reason = t.explain(query, "forward", algos.DEFAULT_OPTIONS, algos.REGISTRY, algos.admits)
    assert name == "implicit_gemm_64x64" and reason.startswith(
        "table: interpolated from the 5 nearest entries; nearest entry (forward float32 NCHW N=16 C=64 H=8")
    assert "predicted implicit_gemm_64x64 1.0" in reason and "vs gemm 1.3" in reason
    assert "measured there: implicit_gemm_64x64 1.600 ms, fastest gemm" in reason


def test_other_categorical_features_fall_back_to_the_rule(synthetic):
    for problem, direction in [(_problem(R=1), "forward"),               # other filter
                               (_problem(stride=2), "forward"),          # other stride
                               (_problem(dtype="float16"), "forward"),   # other dtype class
                               (_problem(), "backward_data"),            # other direction
                               (_problem(C=64, K=64, groups=64), "forward")]:  # depthwise
        name, reason = algos.explain_auto(problem, direction)
        assert reason.startswith("rule: "), (problem, direction, reason)


def test_far_from_every_entry_falls_back_to_the_rule(synthetic):
    far = _problem(N=1, C=2, H=3, K=2)        # log2 distance > MAX_DISTANCE from both
    entry, distance = table.current().nearest(far, "forward")
    assert distance > table.MAX_DISTANCE
    assert algos.explain_auto(far, "forward")[1].startswith("rule: ")


def test_winner_refused_by_options_gives_the_next_measured(synthetic):
    problem = _problem(N=32, C=512, H=28, K=512)
    assert algos.REGISTRY["gemm"].workspace_bytes(problem, "forward") > 0
    name, reason = algos.explain_auto(problem, "forward", algos.ConvOptions(workspace_limit=0))
    assert name == "implicit_gemm_128x128"
    assert "faster but refused: gemm (it needs" in reason and "workspace_limit=0" in reason


def test_unregistered_winner_gives_the_next_measured(synthetic):
    problem = _problem(N=32, C=512, H=28, K=512)
    data = dict(synthetic, entries=[dict(e) for e in synthetic["entries"]])
    data["entries"][1]["ms"] = {"winograd_not_here": 0.5, **data["entries"][1]["ms"]}
    table.use(data)
    name, reason = algos.explain_auto(problem, "forward")
    assert name == "gemm" and "winograd_not_here (not registered here)" in reason


def test_no_admitted_candidate_falls_back_to_the_rule(synthetic):
    data = dict(synthetic, entries=[dict(e) for e in synthetic["entries"]])
    data["entries"][1]["ms"] = {"gemm": 1.0}
    table.use(data)
    name, reason = algos.explain_auto(_problem(N=32, C=512, H=28, K=512), "forward",
                                      algos.ConvOptions(workspace_limit=0))
    assert reason.startswith("rule: ") and algos.REGISTRY[name].workspace_bytes(
        _problem(N=32, C=512, H=28, K=512), "forward") == 0


def test_choices_are_memoised(synthetic, monkeypatch):
    problem = _problem(N=1, C=32, H=14, K=64)
    first = algos.explain_auto(problem, "forward")
    monkeypatch.setattr(table.Table, "explain", lambda *a: pytest.fail("not memoised"))
    assert algos.explain_auto(problem, "forward") is first


@pytest.mark.filterwarnings("ignore:DNNPRIMS_CONV_TABLE")
def test_a_missing_or_broken_table_means_the_rule(tmp_path, monkeypatch):
    previous = table.current()
    try:
        broken = tmp_path / "broken.json"
        broken.write_text("{not json")
        monkeypatch.setenv("DNNPRIMS_CONV_TABLE", str(broken))
        table._loaded["done"] = False
        algos.forget_choices()
        assert table.current() is None
        assert algos.explain_auto(_problem(), "forward")[1].startswith("rule: ")
        with pytest.raises(ValueError, match="version"):
            table.Table({"version": 999, "entries": []})
    finally:
        table.use(previous)


# --- the tuner, with a fake timer ----------------------------------------------

def _fake_measure(problem, direction, names, repeat, final_repeat=0):
    """Deterministic times: 'direct' fast on small problems, 'gemm' on large ones;
    'implicit_gemm_64x64' raises."""
    work = problem.flops
    ms, failed = {}, {}
    for name in names:
        if name == "implicit_gemm_64x64":
            failed[name] = "RuntimeError: boom"
        elif name == "direct":
            ms[name] = work / 1e9
        else:
            ms[name] = 0.05 + work / 2e10 + 0.001 * len(name)
    return ms, failed


def test_tuner_writes_a_table_and_reports_the_holdout(tmp_path):
    points = tune.grid_points(tune.GRIDS["quick"], ["forward", "backward_data"], ["float32"])
    out = tmp_path / "t.json"
    lines = []
    data = tune.tune(points, out=out, holdout=0.3, meta={"version": table.VERSION, "gpu": "fake"},
                     measure=_fake_measure, log=lines.append)
    assert lines[0].startswith(f"[   1/{len(points)}]") and "1 failed (implicit_gemm_64x64)" in lines[0]
    written = json.loads(out.read_text())
    assert written["grid"]["points_measured"] == len(points) == len(written["entries"])
    h = written["holdout"]
    held = [e for e in written["entries"] if e["holdout"]]
    assert h["points"] == len(held) > 0 and h["fraction"] == 0.3
    assert 0 <= h["table_within_10pct"] <= h["points"]
    assert all(e["failed"] == {"implicit_gemm_64x64": "RuntimeError: boom"}
               for e in written["entries"] if "implicit_gemm_64x64" in e["failed"])
    assert any("holdout:" in line for line in lines)
    table.Table(written)  # readable by the lookup
    # the split is deterministic and independent of the other points
    assert [e["holdout"] for e in written["entries"]] == [
        tune.is_holdout(tune.point_key(d, p), 0.3) for d, p in points]
    assert data["entries"] == written["entries"]


def test_tuner_stops_at_max_seconds(tmp_path):
    points = tune.grid_points(tune.GRIDS["quick"], ["forward"], ["float32"])
    data = tune.tune(points, out=tmp_path / "t.json", holdout=0.2, max_seconds=0.0,
                     meta={"version": table.VERSION}, measure=_fake_measure, log=lambda s: None)
    assert data["grid"]["stopped_early"] and data["grid"]["points_measured"] <= 1


def test_tuner_update_replaces_the_measured_points_and_keeps_the_rest(tmp_path):
    points = tune.grid_points(tune.GRIDS["quick"], ["forward"], ["float32"])
    meta = {"version": table.VERSION, "gpu": "fake"}
    first = tune.tune(points, out=tmp_path / "a.json", holdout=0.3, meta=meta, measure=_fake_measure,
                      log=lambda s: None)
    redo = [(d, p) for d, p in points if p.R == 3]
    assert 0 < len(redo) < len(points)

    def slower(problem, direction, names, repeat, final_repeat=None):
        ms, failed = _fake_measure(problem, direction, names, repeat, final_repeat)
        return {n: 2 * t for n, t in ms.items()}, failed

    data = tune.tune(redo, out=tmp_path / "b.json", holdout=0.3, meta=meta, measure=slower,
                     log=lambda s: None, keep=first["entries"])
    keys = lambda entries: sorted(tune.point_key(e["direction"], tune.entry_problem(e)) for e in entries)
    assert keys(data["entries"]) == keys(first["entries"])      # every point once
    assert data["grid"]["points_measured"] == len(redo)
    assert data["grid"]["points_kept"] == len(points) - len(redo)
    old = {tune.point_key(e["direction"], tune.entry_problem(e)): e for e in first["entries"]}
    for e in data["entries"]:
        before = old[tune.point_key(e["direction"], tune.entry_problem(e))]
        factor = 2 if e["R"] == 3 else 1
        assert e["ms"] == {n: pytest.approx(factor * t, abs=2e-5) for n, t in before["ms"].items()}  # ms kept to 5 decimals
    assert data["holdout"]["points"] == first["holdout"]["points"]   # the merged table's holdout
    # a --max-seconds cut keeps the old entries of the points it did not reach
    cut = tune.tune(redo, out=tmp_path / "c.json", holdout=0.3, max_seconds=0.0, meta=meta, measure=slower,
                    log=lambda s: None, keep=first["entries"])
    assert cut["grid"]["stopped_early"] and keys(cut["entries"]) == keys(first["entries"])


def test_tuner_update_holds_out_kept_entries_by_its_own_fraction(tmp_path):
    # --update --holdout F: the kept entries follow F too, so the merged table's
    # holdout report is over the split its "fraction" names (before: the kept
    # entries kept the earlier run's flags, a mixed split).
    points = tune.grid_points(tune.GRIDS["quick"], ["forward"], ["float32"])
    meta = {"version": table.VERSION, "gpu": "fake"}
    first = tune.tune(points, out=tmp_path / "a.json", holdout=0.5, meta=meta, measure=_fake_measure,
                      log=lambda s: None)
    assert any(e["holdout"] for e in first["entries"])
    redo = [(d, p) for d, p in points if p.R == 3]
    data = tune.tune(redo, out=tmp_path / "b.json", holdout=0.0, meta=meta, measure=_fake_measure,
                     log=lambda s: None, keep=first["entries"])
    assert not any(e["holdout"] for e in data["entries"])
    assert data["holdout"]["fraction"] == 0.0 and data["holdout"]["points"] == 0
    assert any(e["holdout"] for e in first["entries"])   # the earlier table's entries are not changed


def test_tuner_filters_the_grid_by_filter_size(capsys, tmp_path):
    assert tune.main(["--quick", "--filters", "1", "--list"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) > 1 and all("|1x1|" in line for line in out[:-1])
    with pytest.raises(SystemExit):   # nothing to update
        tune.main(["--quick", "--update", "--out", str(tmp_path / "missing.json"), "--list"])
    assert "--update" in capsys.readouterr().err


def test_tuner_lists_its_grid_without_a_gpu(capsys):
    assert tune.main(["--quick", "--directions", "forward", "--dtypes", "float32", "--list"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].endswith("points in grid 'quick'") and out[0].startswith("forward|float32|NCHW|")
    with pytest.raises(SystemExit):
        tune.main(["--holdout", "1.5", "--list"])


def test_grid_points_are_valid_and_shuffled_deterministically():
    a = tune.grid_points(tune.GRIDS["quick"], algos.DIRECTIONS, tune.DTYPES)
    b = tune.grid_points(tune.GRIDS["quick"], algos.DIRECTIONS, tune.DTYPES)
    assert a == b and len({tune.point_key(d, p) for d, p in a}) == len(a)
    assert all(p.flops <= tune.GRIDS["quick"]["max_gflop"] * 1e9 for _, p in a)
    assert {table.groups_class(p) for _, p in a} == {"1", "depthwise"}
    assert np.all([p.P == -(-p.H // p.stride[0]) for _, p in a])   # "same" padding


def test_a_broken_algorithm_is_recorded_not_fatal(tmp_path, monkeypatch):
    class Broken(algos.ConvAlgorithm):
        name = "broken_test_algorithm"

        def supports(self, problem, direction):
            raise RuntimeError("cannot tell")
    monkeypatch.setitem(algos.REGISTRY, Broken.name, Broken())
    names, failed = tune.applicable(_problem(), "forward")
    assert Broken.name not in names and "direct" in names
    assert failed == {Broken.name: "supports/workspace_bytes: RuntimeError: cannot tell"}
    points = tune.grid_points(tune.GRIDS["quick"], ["forward"], ["float32"])[:3]
    data = tune.tune(points, out=tmp_path / "t.json", meta={"version": table.VERSION},
                     measure=_fake_measure, log=lambda s: None)
    assert all(Broken.name in e["failed"] for e in data["entries"])


def test_without_a_limit_auto_keeps_to_the_measured_workspace(synthetic):
    # 32 x 512 x 112 x 112, 3x3: gemm's column matrix is ~7 GiB, more than was ever measured
    big = _problem(N=32, C=512, H=112, K=512)
    assert algos.REGISTRY["gemm"].workspace_bytes(big, "forward") > algos.find.FIND_WORKSPACE_LIMIT
    table.use({"version": table.VERSION, "entries": [
        _entry(big, {"gemm": 1.0, "implicit_gemm_128x128": 1.2, "direct": 9.0})]})
    name, reason = algos.explain_auto(big, "forward")
    assert name == "implicit_gemm_128x128" and "more than the tuner measured with" in reason
    # an explicit limit is the caller's decision
    limit = algos.REGISTRY["gemm"].workspace_bytes(big, "forward")
    assert algos.explain_auto(big, "forward", algos.ConvOptions(workspace_limit=limit))[0] == "gemm"


# --- the decision rule: measured winners near the problem ----------------------

def _ring_table(outlier):
    """The r50_2_3x3 backward-data situation in miniature (forward here): a query
    at C = K = 64 has four entries at log2 distance 1.41 (C, K in {32, 128}) and
    four farther ones (N*P*Q / 4).  Winograd wins at every one of the nearest;
    ``outlier`` is its time at C=32 K=128 (6x the best there when it is a stray
    single-call time)."""
    entries = []
    for C in (32, 128):
        for K in (32, 128):
            for H, far in ((56, False), (28, True)):
                scale = (C * K / 4096) * (0.25 if far else 1.0)
                wino, igemm = 0.30 * scale, (0.40 if far else 0.45) * scale
                if far:     # at a quarter of the rows implicit GEMM wins
                    wino = 0.60 * scale
                if (C, K, far) == (32, 128, False):
                    wino = outlier
                entries.append(_entry(_problem(N=32, C=C, H=H, K=K),
                                      {"winograd_f4x4_3x3": wino, "implicit_gemm": igemm}))
    return table.Table({"version": table.VERSION, "entries": entries})


def test_one_stray_slow_time_does_not_outvote_the_nearest_measured_winners(monkeypatch):
    query = _problem(N=32, C=64, H=56, K=64)
    t = _ring_table(outlier=2.7)      # 6x the best there (implicit GEMM's 0.45 ms)
    assert [round(d, 2) for d, _ in t.neighbours(query, "forward", 4)] == [1.41] * 4
    ranked, how, _, _ = t.ranking(query, "forward")
    assert how == "interpolated from the 8 nearest entries"
    assert ranked[0][1] == "winograd_f4x4_3x3"
    name, reason = t.explain(query, "forward", algos.DEFAULT_OPTIONS, algos.REGISTRY, algos.admits)
    assert name == "winograd_f4x4_3x3" and "predicted winograd_f4x4_3x3" in reason
    # without the censoring (the session-2 lookup) the stray time wins the argument
    monkeypatch.setattr(table, "CAP", float("inf"))
    assert t.ranking(query, "forward")[0][0][1] == "implicit_gemm"


def test_without_a_stray_time_the_interpolation_agrees():
    query = _problem(N=32, C=64, H=56, K=64)
    t = _ring_table(outlier=0.30 * 2.0)      # Winograd's honest time there
    assert t.ranking(query, "forward")[0][0][1] == "winograd_f4x4_3x3"


def test_censoring_keeps_the_measured_order_at_a_grid_point():
    t = _ring_table(outlier=4.0)
    at = _problem(N=32, C=32, H=56, K=128)          # the entry with the stray time itself
    ranked, how, entry, distance = t.ranking(at, "forward")
    assert how == "measured at the nearest entry" and distance == 0
    assert [name for _, name in ranked] == ["implicit_gemm", "winograd_f4x4_3x3"]


def test_an_algorithm_missing_at_some_neighbours_is_still_ranked():
    # "gemm" ran at the nearest entry and 5 of 8 neighbours only (workspace elsewhere):
    # it is interpolated (missing times count as CAP x the fastest), not put last
    entries = []
    for i, n in enumerate((1, 2, 4, 8, 16, 32, 64, 128)):
        ms = {"implicit_gemm": 1.0 * n}
        if i < 5:
            ms["gemm"] = 0.5 * n
        entries.append(_entry(_problem(N=n, H=8), ms))
    t = table.Table({"version": table.VERSION, "entries": entries})
    ranked, how, entry, _ = t.ranking(_problem(N=3, H=8), "forward")
    assert how.startswith("interpolated") and [name for _, name in ranked] == ["gemm", "implicit_gemm"]


def test_nearest_entry_winner_on_a_grid_point_of_a_batch_1_table():
    # batch-1 entries sit at small N*P*Q: a batch-1 problem is decided by them,
    # a batch-32 problem by the batch-32 entries
    entries = [_entry(_problem(N=1, C=c, H=h, K=c), {"direct": 0.02, "implicit_gemm": 0.03})
               for c in (64, 256) for h in (7, 14, 28, 56)]
    entries += [_entry(_problem(N=32, C=c, H=h, K=c), {"direct": 0.9, "implicit_gemm": 0.3})
                for c in (64, 256) for h in (28, 56)]
    t = table.Table({"version": table.VERSION, "entries": entries})
    for c, h in ((64, 28), (128, 14), (256, 56)):
        ranked, how, entry, _ = t.ranking(_problem(N=1, C=c, H=h, K=c), "forward")
        assert ranked[0][1] == "direct" and entry["problem"]["N"] == 1, (c, h, how)
    assert t.ranking(_problem(N=32, C=128, H=56, K=128), "forward")[0][0][1] == "implicit_gemm"


# --- the holdout figure ----------------------------------------------------------

def test_holdout_counts_picks_within_10_percent_of_the_fastest():
    # a smooth world: "direct" wins below N=8, "gemm" from N=8 up; held-out points are
    # looked up in a table of the others
    def ms(n):
        return {"direct": 0.01 * n, "gemm": 0.05 + 0.001 * n}
    entries = [_entry(_problem(N=n, H=8), ms(n), holdout=n in (3, 24)) for n in (1, 2, 3, 4, 16, 24, 32)]
    # a held-out point whose measurement contradicts its neighbours: a miss
    entries.append(_entry(_problem(N=6, H=8), {"direct": 0.20, "gemm": 0.10}, holdout=True))
    h = tune.evaluate_holdout(entries)
    assert h["points"] == 3 and h["table_decided"] == 3
    assert h["table_within_10pct"] == 2 and h["table_fraction"] == pytest.approx(2 / 3, abs=1e-4)
    assert h["by_batch"] == {"N=3": {"points": 1, "table_within_10pct": 1},
                             "N=24": {"points": 1, "table_within_10pct": 1},
                             "N=6": {"points": 1, "table_within_10pct": 0}}
    assert h["by_class"] == {"forward float32": {"points": 3, "table_within_10pct": 2}}
    assert h["misses"] == [{"point": "forward float32 N=6 C=64 H=8 K=64 3x3 s1 g=1", "pick": "direct",
                            "pick_ms": 0.2, "best": "gemm", "best_ms": 0.1}]
    assert h["table_geomean_slowdown"] == pytest.approx(2 ** (1 / 3), abs=1e-3)
    assert h["by_block"] == {}     # no grid given


def test_holdout_reports_the_base_grid_and_each_block_apart():
    grid = tune.GRIDS["default"]
    points = tune.grid_points(grid, ["forward"], ["float32"])
    entries = [_entry(p, {"direct": 1.0, "gemm": 2.0}, holdout=i % 5 == 0) for i, (_, p) in enumerate(points)]
    h = tune.evaluate_holdout(entries, grid)
    assert set(h["by_block"]) == {"base"} | {block["name"] for block in grid["blocks"]}
    assert sum(b["points"] for b in h["by_block"].values()) == h["points"]
    assert h["by_block"]["batch1"]["points"] == sum(
        1 for e in entries if e["holdout"] and e["problem"]["N"] == 1 and e["problem"]["C"] in (64, 256, 1024))
    assert h["by_block"]["large_filters"]["points"] == sum(
        1 for e in entries if e["holdout"] and e["problem"]["N"] > 1 and e["problem"]["C"] in (64, 256))
    assert tune.block_of(_entry(_problem(N=2), {"direct": 1.0}), grid) is None   # off the grid


def test_holdout_of_the_shipped_table_is_recomputable():
    # recomputed from the stored per-algorithm times with today's lookup.  Issue 4's
    # target is 0.90 (the shipped H100 table: 0.900); the floor here only catches a
    # broken lookup: two tuning runs of the same grid agree on a pick within 10 % on
    # ~92 % of the points (notes/table.md), so a re-measured table can land under 0.90.
    data = json.loads(table.DEFAULT_PATH.read_text())
    assert all(e["ms"] for e in data["entries"] if e["holdout"])
    h = tune.evaluate_holdout(data["entries"])
    assert h["points"] > 500 and h["table_fraction"] >= 0.85, h["table_fraction"]
    assert h["table_fraction"] > h["rule_fraction"] + 0.2


# --- the grid and the tuner's robustness ------------------------------------------

def test_the_default_grid_has_batch_1_points_between_the_base_channels():
    points = tune.grid_points(tune.GRIDS["default"], ["forward"], ["float32"])
    keys = [tune.point_key(d, p) for d, p in points]
    assert len(set(keys)) == len(keys)
    one = [p for _, p in points if p.N == 1]
    assert {p.C for p in one} == {32, 64, 128, 256, 512, 1024, 2048}
    assert {p.C for _, p in points if p.N > 1 and p.R <= 3} == {32, 128, 512, 2048}
    # C or K = 2048 (the wide_channels block) only on 7x7 / 14x14 images
    assert {p.H for _, p in points if 2048 in (p.C, p.K)} == {7, 14}
    # 5x5 / 7x7 at batch 8 and 32 also between them (the large_filters block)
    assert {p.C for _, p in points if p.N > 1 and p.R >= 5} == {32, 64, 128, 256, 512}
    # every filter and image size of the base block, and depthwise, at batch 1 with C=64
    assert {(p.R, p.stride[0]) for p in one if p.C == 64 and p.groups == 1} == \
        {(r, s) for r, _, s in tune.GRIDS["default"]["filters"]}
    assert {p.H for p in one if p.C == 64} == set(tune.GRIDS["default"]["images"])
    assert any(p.groups == p.C == 256 for p in one)
    assert min(p.N * p.P * p.Q for p in one) == 16      # 7x7 image, stride 2
    assert all(p.flops <= tune.GRIDS["default"]["max_gflop"] * 1e9 for p in one)


def test_a_newly_registered_algorithm_is_timed_without_changes(tmp_path, monkeypatch):
    class New(algos.ConvAlgorithm):
        name = "new_test_algorithm"
    monkeypatch.setitem(algos.REGISTRY, New.name, New())
    assert New.name in tune.applicable(_problem(), "forward")[0]
    assert New.name not in tune.applicable(_problem(), "forward", skip=[New.name])[0]

    def measure(problem, direction, names, repeat, final_repeat=0):
        ms, failed = _fake_measure(problem, direction, [n for n in names if n != New.name], repeat)
        ms[New.name] = 1e-9                       # fastest everywhere
        return ms, failed, ["direct"]
    points = tune.grid_points(tune.GRIDS["quick"], ["forward"], ["float32"])[:4]
    data = tune.tune(points, out=tmp_path / "t.json", meta={"version": table.VERSION},
                     measure=measure, log=lambda s: None)
    assert all(e["winner"] == New.name for e in data["entries"])
    assert all(e["probed"] == ["direct"] for e in data["entries"])
    skipped = tune.tune(points, out=tmp_path / "s.json", meta={"version": table.VERSION},
                        measure=_fake_measure, log=lambda s: None, skip=[New.name])
    assert all(New.name not in e["ms"] for e in skipped["entries"])
    assert skipped["grid"]["skipped"] == [New.name]


def test_a_broken_cuda_context_stops_the_run_and_keeps_what_was_measured(tmp_path):
    calls = []

    def measure(problem, direction, names, repeat, final_repeat=0):
        calls.append(problem)
        if len(calls) == 3:
            raise tune.BrokenContext("boom_algorithm broke the CUDA context")
        return _fake_measure(problem, direction, names, repeat)
    points = tune.grid_points(tune.GRIDS["quick"], ["forward"], ["float32"])
    lines = []
    data = tune.tune(points, out=tmp_path / "t.json", meta={"version": table.VERSION},
                     measure=measure, log=lines.append)
    written = json.loads((tmp_path / "t.json").read_text())
    assert written["grid"]["points_measured"] == 2 == len(written["entries"])
    assert written["grid"]["stopped_early"] and "boom_algorithm" in written["grid"]["broken"]
    assert any(line.startswith("stopping: boom_algorithm") for line in lines)
    assert data["holdout"]["points"] <= 2


def test_skip_must_name_registered_algorithms():
    with pytest.raises(SystemExit):
        tune.main(["--skip", "no_such_algorithm", "--list"])


@pytest.mark.parametrize("direction", algos.DIRECTIONS)
def test_the_tuner_times_the_public_call(direction):
    # the callable the tuner times is the user's call with algo=name (here on the NumPy
    # path, which runs the reference whatever the name): right function, shapes, options
    problem = tune.problem_of(direction, "float32", 2, 3, 5, 4, 3, 3, 2, 1)
    shapes = {"forward": (problem.x_shape, problem.w_shape, problem.y_shape),
              "backward_data": (problem.y_shape, problem.w_shape, problem.x_shape),
              "backward_filter": (problem.x_shape, problem.y_shape, problem.w_shape)}[direction]
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(-0.5, 0.5, s).astype(np.float32) for s in shapes[:2])
    out = tune.public_call(problem, direction, "direct", a, b)()
    assert out.shape == shapes[2] and out.dtype == np.float32
    call = {"forward": lambda: dnnprims.conv2d_forward(a, b, stride=2, padding=1),
            "backward_data": lambda: dnnprims.conv2d_backward_data(a, b, problem.x_shape, stride=2, padding=1),
            "backward_filter": lambda: dnnprims.conv2d_backward_filter(a, b, problem.w_shape, stride=2,
                                                                        padding=1)}[direction]
    np.testing.assert_allclose(out, call(), rtol=1e-6)
    with pytest.raises(ValueError, match="algo"):
        tune.public_call(problem, direction, "no_such_algorithm", a, b)()


def _fake_gpu(monkeypatch, times, broken=False):
    """measure_point on the NumPy path: a stand-in `cupy` module (synchronize, memory
    pool), operands from NumPy, and a timer whose blocks say times[name] for the public
    call of `name` (which really runs, on the reference path).  Returns the timed blocks
    as (name, timed calls)."""
    import sys
    import types

    def synchronize():
        if broken:
            raise RuntimeError("cudaErrorIllegalAddress")
    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(deviceSynchronize=synchronize))
    fake.get_default_memory_pool = lambda: types.SimpleNamespace(total_bytes=lambda: 0,
                                                                  free_all_blocks=lambda: None)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    rng = np.random.default_rng(0)
    monkeypatch.setattr(tune, "random_operands", lambda p, d: (
        rng.uniform(-0.5, 0.5, p.x_shape).astype(p.dtype), rng.uniform(-0.5, 0.5, p.w_shape).astype(p.dtype),
        None))
    timed, real = [], tune.public_call

    def public_call(problem, direction, name, a, b):
        call = real(problem, direction, name, a, b)

        def run():
            if name == "implicit_gemm":
                raise RuntimeError("boom")
            out = call()
            assert out.shape == problem.y_shape
            return name
        return run

    class Timer:
        def __init__(self, cupy):
            assert cupy is fake

        def block(self, call, count, warm=True):
            if warm:
                call()
            name = [call() for _ in range(count)][0]
            timed.append((name, count))
            return [times[name]] * count
    monkeypatch.setattr(tune, "public_call", public_call)
    monkeypatch.setattr(tune, "EventTimer", Timer)
    return timed


def test_measure_point_probes_losers_twice_only_when_it_may_matter(monkeypatch):
    timed = _fake_gpu(monkeypatch, {"direct": 1.0, "gemm": 10.0, "fft": 100.0, "dft": 1.1})
    problem = tune.problem_of("forward", "float32", 1, 3, 5, 4, 3, 3, 1, 1)
    ms, failed, probed, samples = tune.measure_point(
        problem, "forward", ["direct", "gemm", "fft", "implicit_gemm", "dft"], 6, 4)
    assert ms == {"direct": 1.0, "gemm": 10.0, "fft": 100.0, "dft": 1.1}
    assert failed == {"implicit_gemm": "RuntimeError: boom"} and probed == ["gemm", "fft"]
    # probes (one call each); gemm (10x, within RECHECK_FACTOR) a second one, fft (100x)
    # none; then direct and dft interleaved in rounds of 2, and 4 more each as finalists
    assert timed[:5] == [("direct", 1), ("gemm", 1), ("fft", 1), ("dft", 1), ("gemm", 1)]
    assert timed[5:] == [("direct", 2), ("dft", 2), ("dft", 2), ("direct", 2), ("direct", 2), ("dft", 2),
                         ("direct", 2), ("dft", 2), ("dft", 2), ("direct", 2)]
    assert samples == {"direct": 10, "dft": 10, "gemm": 1, "fft": 1}
    entry = tune.make_entry("forward", problem, ms, failed, False, probed)
    assert entry["probed"] == ["fft", "gemm"] and entry["winner"] == "direct"
    assert tune.measure_point(problem, "forward", [], 6) == ({}, {}, [], {})   # nothing applicable


def test_measure_point_stops_on_a_broken_context(monkeypatch):
    _fake_gpu(monkeypatch, {"direct": 1.0}, broken=True)
    problem = tune.problem_of("forward", "float32", 1, 3, 5, 4, 3, 3, 1, 1)
    with pytest.raises(tune.BrokenContext, match="implicit_gemm broke the CUDA context"):
        tune.measure_point(problem, "forward", ["direct", "implicit_gemm"], 6)


# --- interleaved timing (time_candidates) with a scripted clock ----------------------

class _Clock:
    """A fake timer: block k of the run (counted over every candidate) takes
    truth[name] x slow(k) per call; records (name, count, warm)."""

    def __init__(self, truth, slow=lambda k: 1.0, fail=()):
        self.truth, self.slow, self.fail, self.log = truth, slow, set(fail), []

    def calls(self):
        return {name: name for name in self.truth}

    def block(self, name, count, warm=True):
        k = len(self.log)
        self.log.append((name, count, warm))
        if name in self.fail and k > len(self.truth):     # fails after its probe
            raise RuntimeError(f"{name} failed")
        return [self.truth[name] * self.slow(k)] * count


def test_rounds_visit_the_candidates_in_turn():
    clock = _Clock({"a": 1.0, "b": 1.1, "c": 1.12})
    ms, failed, probed, samples = tune.time_candidates(clock.calls(), clock, repeat=6, final_repeat=4)
    assert ms == {"a": 1.0, "b": 1.1, "c": 1.12} and not failed and not probed
    # probes, then 3 rounds of 2 samples, each round starting one candidate further on
    assert [n for n, _, _ in clock.log[3:12]] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert all(count == 2 and warm for _, count, warm in clock.log[3:])
    assert samples == {"a": 10, "b": 10, "c": 10}      # all three within FINALIST: 4 more each


def test_a_slow_moment_hits_every_candidate_not_one():
    # the GPU (or host) is 1.5x slower during 3 blocks: timed back to back, the candidate
    # timed then would have lost all its samples to it; interleaved, each loses one block
    truth = {"a": 1.0, "b": 1.06, "c": 1.3}
    clock = _Clock(truth, slow=lambda k: 1.5 if 3 <= k < 6 else 1.0)
    ms, _, _, samples = tune.time_candidates(clock.calls(), clock, repeat=6, final_repeat=4)
    assert min(ms, key=ms.get) == "a" and ms == pytest.approx(truth)
    assert samples == {"a": 10, "b": 10, "c": 6}       # c (1.3x) is no finalist


def test_clear_losers_stop_after_two_rounds_and_hopeless_ones_after_the_probe():
    clock = _Clock({"a": 1.0, "slow": 2.5, "hopeless": 20.0, "recheck": 6.0})
    ms, _, probed, samples = tune.time_candidates(clock.calls(), clock, repeat=6, final_repeat=4)
    assert ms == {"a": 1.0, "slow": 2.5, "hopeless": 20.0, "recheck": 6.0}
    assert sorted(probed) == ["hopeless", "recheck"]
    # 'recheck' (6x: within RECHECK_FACTOR) got a second probe, 'hopeless' (20x) not
    assert [entry for entry in clock.log if entry[0] in ("recheck", "hopeless")] == [
        ("hopeless", 1, True), ("recheck", 1, True), ("recheck", 1, False)]
    # 'slow' (2.5x > DROP_FACTOR) keeps its first DROP_AFTER rounds; 'a' alone: no finalists
    assert samples == {"a": 6, "slow": tune.DROP_AFTER * tune.PER_ROUND, "hopeless": 1, "recheck": 1}


def test_a_lone_candidate_is_timed_by_its_probe():
    clock = _Clock({"a": 0.5})
    assert tune.time_candidates(clock.calls(), clock) == ({"a": 0.5}, {}, ["a"], {"a": 1})


def test_a_candidate_failing_in_a_later_round_is_recorded_and_the_others_go_on():
    seen = []
    clock = _Clock({"a": 1.0, "b": 1.05}, fail=["b"])
    ms, failed, _, samples = tune.time_candidates(clock.calls(), clock, repeat=6, final_repeat=4,
                                                  on_failure=lambda n, t: seen.append((n, t)))
    assert ms == {"a": 1.0} and failed == {"b": "RuntimeError: b failed"} and samples == {"a": 6}
    assert seen == [("b", "RuntimeError: b failed")]
    with pytest.raises(tune.BrokenContext):
        def broken(name, text):
            raise tune.BrokenContext(name)
        tune.time_candidates(_Clock({"a": 1.0, "b": 1.05}, fail=["b"]).calls(),
                             _Clock({"a": 1.0, "b": 1.05}, fail=["b"]), on_failure=broken)


def test_finalist_samples_stop_when_the_pace_says_the_grid_would_not_fit(tmp_path, monkeypatch):
    # a fake clock: every point takes 1 s; the grid has 200 points and 150 s: at that
    # pace it cannot end within PACE_MARGIN x 150 s, so finalist samples go off once the
    # pace is known (PACE_MIN points) and the cut counts the points left per block
    now = [0.0]
    monkeypatch.setattr(tune.time, "perf_counter", lambda: now[0])
    asked = []

    def measure(problem, direction, names, repeat, final_repeat=0):
        now[0] += 1.0
        asked.append(final_repeat)
        return {"direct": 1.0, "gemm": 1.05}, {}, [], {"direct": repeat + final_repeat,
                                                       "gemm": repeat + final_repeat}
    grid = tune.GRIDS["default"]
    points = tune.grid_points(grid, ["forward"], ["float32"])[:200]
    lines = []
    data = tune.tune(points, out=tmp_path / "t.json", max_seconds=150, meta={"version": table.VERSION},
                     measure=measure, log=lines.append, grid_info={"spec": grid})
    assert asked[:tune.PACE_MIN] == [tune.FINAL_REPEAT] * tune.PACE_MIN
    assert set(asked[tune.PACE_MIN:]) == {0}
    g = data["grid"]
    assert g["points_measured"] == 151 and g["stopped_early"]
    assert g["finalist_points"] == tune.PACE_MIN and g["finalist_samples_off"] == 151 - tune.PACE_MIN
    assert sum(g["unmeasured"].values()) == 49 and set(g["unmeasured"]) <= {"base"} | {b["name"] for b in tune.GRIDS["default"]["blocks"]}
    assert any(line.startswith("stopping after 151 s") and "not measured: " in line for line in lines)
    assert data["entries"][0]["finalists"] == ["direct", "gemm"]
    assert "finalists" not in data["entries"][-1]
    # enough time: finalist samples everywhere
    asked.clear()
    now[0] = 0.0
    tune.tune(points[:60], out=tmp_path / "u.json", max_seconds=1000, meta={"version": table.VERSION},
              measure=measure, log=lambda s: None)
    assert set(asked) == {tune.FINAL_REPEAT}


def test_a_new_table_clears_the_calls_that_remember_an_auto_choice():
    # conv's call memo and fast table hold the algorithm "auto" chose for a kind of call;
    # switching tables must make those calls decide again.
    from dnnprims import conv
    conv._MEMO.put(("a kind of call",), "plan with an old choice")
    conv._MEMO.put_fast(("a fast key",), "closure with an old choice")
    previous = table.use(None)
    try:
        assert conv._MEMO.get(("a kind of call",)) is None
        assert ("a fast key",) not in conv._MEMO.fast
    finally:
        table.use(previous)


def test_the_event_timer_drains_warms_then_times_each_call():
    # the GPU timer's order of operations, on a stand-in cupy that logs them
    import types
    log = []

    class Event:
        def __init__(self):
            self.i = sum(1 for x in log if x[0] == "record")

        def record(self, stream):
            log.append(("record", stream))
            self.t = len(log)

        def synchronize(self):
            log.append(("event sync",))
    stream = types.SimpleNamespace(synchronize=lambda: log.append(("stream sync",)))
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(
        get_current_stream=lambda: stream, Event=Event,
        get_elapsed_time=lambda start, end: float(end.t - start.t)))
    times = tune.EventTimer(fake).block(lambda: log.append(("call",)), 2)
    assert log == [("stream sync",), ("call",), ("record", stream), ("call",), ("record", stream),
                   ("record", stream), ("call",), ("record", stream), ("event sync",)]
    assert times == [2.0, 2.0]
    log.clear()
    assert tune.EventTimer(fake).block(lambda: log.append(("call",)), 1, warm=False) == [2.0]
    assert log[:2] == [("stream sync",), ("record", stream)]


def test_noise_report_compares_implicit_gemm_with_its_own_tile():
    from dnnprims.algos.implicit_gemm import pick_tile
    small, large = _problem(N=1, C=32, H=7, K=32), _problem(N=32, C=512, H=28, K=512)
    tiles = {p: "implicit_gemm_" + pick_tile(p, "forward") for p in (small, large)}
    entries = [_entry(small, {"implicit_gemm": 0.020, tiles[small]: 0.025, "direct": 0.01}),   # 25 % apart
               _entry(large, {"implicit_gemm": 1.00, tiles[large]: 1.02}),
               _entry(_problem(N=8), {"implicit_gemm": 0.5})]                              # no twin
    assert tune.noise_report(entries) == {"pairs": 2, "over_10pct": 1, "pairs_under_30us": 1,
                                          "over_10pct_under_30us": 1}
    probed = tune.make_entry("forward", small, {"implicit_gemm": 0.02, tiles[small]: 0.5}, {}, False,
                             [tiles[small]])
    assert tune.noise_report([probed])["pairs"] == 0


def test_noise_report_of_the_shipped_table():
    data = json.loads(table.DEFAULT_PATH.read_text())
    noise = tune.noise_report(data["entries"])
    assert noise["pairs"] > 1000 and noise["over_10pct"] < 0.2 * noise["pairs"]


def test_small_points_give_their_finalists_twice_the_samples():
    fast = _Clock({"a": 0.01, "b": 0.0105})         # under SMALL_MS: host-bound, noisy, cheap
    assert tune.time_candidates(fast.calls(), fast, repeat=6, final_repeat=4)[3] == {"a": 14, "b": 14}
    slow = _Clock({"a": 1.0, "b": 1.05})
    assert tune.time_candidates(slow.calls(), slow, repeat=6, final_repeat=4)[3] == {"a": 10, "b": 10}


def test_the_tuner_runs_measure_point_end_to_end_on_a_stand_in_gpu(monkeypatch, tmp_path):
    # tune -> measure_point -> time_candidates -> the (fake) event timer -> the public call
    class Times(dict):
        def __missing__(self, name):
            return 0.03 + 0.001 * len(name)
    timed = _fake_gpu(monkeypatch, Times(direct=0.02, gemm=0.0205))
    points = [("forward", tune.problem_of("forward", "float32", 1, 3, 5, 4, 3, 3, 1, 1))]
    data = tune.tune(points, out=tmp_path / "t.json", meta={"version": table.VERSION}, log=lambda s: None)
    entry, = data["entries"]
    assert entry["winner"] == "direct" and entry["finalists"] == ["direct", "gemm"]
    assert entry["failed"] == {"implicit_gemm": "RuntimeError: boom"}
    assert sum(k for n, k in timed if n == "direct") == 1 + tune.REPEAT + 2 * tune.FINAL_REPEAT


# --- a table from elsewhere (review6d) -------------------------------------------

def _one_entry_table(**changes):
    """A table of one entry at _problem(N=1, C=32, H=7, K=32), 'gemm' measured
    slower than 'direct', with ``changes`` applied to the entry (``ms_gemm``: gemm's time)."""
    entry = _entry(_problem(N=1, C=32, H=7, K=32), {"direct": 0.01, "gemm": 0.03})
    if "ms_gemm" in changes:
        entry["ms"]["gemm"] = changes.pop("ms_gemm")
    entry.update(changes)
    return {"version": table.VERSION, "entries": [entry]}


@pytest.mark.parametrize("changes", [
    {"ms_gemm": float("nan")}, {"ms_gemm": -1.0}, {"ms_gemm": float("inf")},
    {"ms_gemm": "fast"}, {"ms_gemm": True}, {"ms": [0.01]}, {"log2_c": float("nan")},
    {"log2_npq": float("inf")}, {"log2_k": "7"}, {"problem": None}, {"direction": None},
])
def test_a_table_with_a_bad_time_or_feature_is_refused_naming_the_entry(changes):
    # Before: NaN, negative or zero times were ranked as measured (a NaN, or
    # -1 ms, "won"), a string time raised TypeError inside a user's conv call.
    with pytest.raises(ValueError, match="entry 0"):
        table.Table(_one_entry_table(**changes), "t.json")


def test_a_missing_time_is_a_candidate_that_did_not_run():
    t = table.Table(_one_entry_table(ms_gemm=None))
    problem = _problem(N=1, C=32, H=7, K=32)
    assert t.explain(problem, "forward", algos.DEFAULT_OPTIONS, algos.REGISTRY, algos.admits)[0] == "direct"


def test_a_bad_table_named_by_the_variable_is_ignored_with_a_warning(tmp_path, monkeypatch):
    previous = table.current()
    try:
        for text in (None, "{not json", json.dumps({"version": 999, "entries": []}),
                     json.dumps(_one_entry_table(ms_gemm="fast"))):
            path = tmp_path / "mine.json"
            if text is not None:
                path.write_text(text)
            monkeypatch.setenv("DNNPRIMS_CONV_TABLE", str(path))
            table._loaded["done"] = False
            algos.forget_choices()
            with pytest.warns(UserWarning, match="DNNPRIMS_CONV_TABLE"):
                assert table.current() is None
            assert algos.explain_auto(_problem(N=1, C=32, H=7, K=32), "forward")[1].startswith("rule: ")
    finally:
        table.use(previous)


@pytest.mark.parametrize("value", [5, 1.5, ["t.json"], b"t.json"])
def test_use_refuses_what_is_not_a_table(value):
    # Before: use(5) was accepted and the next conv call raised AttributeError.
    previous = table.current()
    try:
        with pytest.raises(TypeError, match="table"):
            table.use(value)
        assert table.current() is previous
    finally:
        table.use(previous)


# --- the tuner's command line (review6d) -------------------------------------------

@pytest.fixture
def no_tuning(monkeypatch):
    """main() as on a machine without a GPU, and a tune() that must not be reached."""
    import cupy
    monkeypatch.setattr(cupy.cuda.runtime, "getDeviceCount", lambda: 0)
    monkeypatch.setattr(tune, "tune", lambda *a, **k: pytest.fail("tune() reached"))


def test_the_tuner_without_a_gpu_says_so_and_exits_2(no_tuning, capsys, tmp_path):
    assert tune.main(["--quick", "--out", str(tmp_path / "t.json")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("args, where", [
    (["--repeat", "0"], "--repeat"),              # no samples: only the probed losers got a time
    (["--repeat", "-3"], "--repeat"),
    (["--final-repeat", "-1"], "--final-repeat"),
    (["--filters", "9"], "--filters"),            # no point: an empty table replaced the shipped one
    (["--max-seconds", "0"], "--max-seconds"),    # likewise
    (["--max-seconds", "-5"], "--max-seconds"),
])
def test_the_tuner_refuses_arguments_that_would_write_a_wrong_table(no_tuning, capsys, tmp_path, args, where):
    with pytest.raises(SystemExit) as stop:
        tune.main(["--quick", "--out", str(tmp_path / "t.json")] + args)
    assert stop.value.code == 2 and where in capsys.readouterr().err


@pytest.mark.parametrize("text", [
    json.dumps({"version": 999, "entries": []}), "[]", json.dumps({"version": 1, "entries": 3}),
    json.dumps({"version": 1, "entries": [{"direction": "forward"}]}),
])
def test_the_tuner_refuses_to_update_an_incompatible_table(no_tuning, capsys, tmp_path, text):
    # Before: a foreign or malformed table was only found out after the GPU run
    # (AttributeError / KeyError), or merged into the new one.
    old = tmp_path / "old.json"
    old.write_text(text)
    with pytest.raises(SystemExit):
        tune.main(["--quick", "--filters", "3", "--update", "--out", str(old)])
    assert "--update" in capsys.readouterr().err


def test_the_tuner_refuses_an_unwritable_out_before_measuring(no_tuning, capsys, tmp_path):
    # Before: the first write (after SAVE_EVERY points, or at the end) raised and
    # every measurement of the run was lost.
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(SystemExit):
        tune.main(["--quick", "--out", str(blocker / "t.json")])
    assert "--out" in capsys.readouterr().err
    # a missing directory is made
    assert tune.main(["--quick", "--out", str(tmp_path / "new" / "dir" / "t.json")]) == 2
    assert (tmp_path / "new" / "dir").is_dir() and list((tmp_path / "new" / "dir").iterdir()) == []


def test_an_interrupted_run_never_replaces_the_table_at_out(tmp_path, monkeypatch):
    # Before: Ctrl-C after 60 points of the default grid replaced the 6018-entry
    # table at --out (by default the shipped one) with the 50 entries of the last
    # periodic save, marked neither stopped_early nor partial.
    monkeypatch.setattr(tune, "SAVE_EVERY", 2)
    points = tune.grid_points(tune.GRIDS["quick"], ["forward"], ["float32"])
    out = tmp_path / "t.json"
    out.write_text(table.DEFAULT_PATH.read_text())
    calls = []

    def interrupted(problem, direction, names, repeat, final_repeat=0):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return _fake_measure(problem, direction, names, repeat)
    with pytest.raises(KeyboardInterrupt):
        tune.tune(points, out=out, meta={"version": table.VERSION}, measure=interrupted, log=lambda s: None)
    assert out.read_text() == table.DEFAULT_PATH.read_text()
    partial = json.loads((tmp_path / "t.json.partial").read_text())   # what was measured is kept
    assert len(partial["entries"]) == 2 and table.Table(partial)
    # a run that ends writes --out and removes the partial file
    tune.tune(points, out=out, meta={"version": table.VERSION}, measure=_fake_measure, log=lambda s: None)
    assert len(json.loads(out.read_text())["entries"]) == len(points)
    assert not (tmp_path / "t.json.partial").exists()


@pytest.mark.parametrize("ms, written", [(4e-6, 4e-6), (1e-9, 1e-6), (0.0, 1e-6),
                                         (1.23456789e-3, 1.23457e-3), (123.4567891, 123.457)])
def test_the_tuner_writes_every_time_positive_and_to_six_digits(ms, written):
    """make_entry rounded times to 5 decimals: a time under 5e-6 ms became 0.0,
    which the lookup ranks first among measured times but, when it
    interpolates, takes for a candidate that did not run (and a 1 us time kept
    3 digits).  Times are written to 6 significant digits, at least 1 ns."""
    entry = _entry(_problem(), {"tiny": ms, "gemm": 1e4})
    assert entry["ms"]["tiny"] == pytest.approx(written, rel=1e-12) and entry["ms"]["tiny"] > 0
    assert entry["winner"] == "tiny" and list(entry["ms"]) == ["tiny", "gemm"]


def test_a_tiny_time_ranks_first_whether_measured_or_interpolated():
    """What the tuner writes is ranked alike by both lookups (a written 0.0 was
    first when measured, but passed over by the interpolation)."""
    entries = [_entry(_problem(N=n, H=8), {"tiny": 3e-6, "gemm": 1.45}) for n in (1, 2, 4, 8, 16)]
    t = table.Table({"version": table.VERSION, "entries": entries})
    ranked, how, _, _ = t.ranking(_problem(N=16, H=8), "forward")
    assert how == "measured at the nearest entry" and ranked[0][1] == "tiny"
    ranked, how, _, _ = t.ranking(_problem(N=12, H=8), "forward")
    assert how.startswith("interpolated") and [name for _, name in ranked] == ["tiny", "gemm"]
    assert 0 < ranked[0][0] < 1e-3
