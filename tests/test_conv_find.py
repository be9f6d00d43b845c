"""``algo="find"``'s on-disk cache (dnnprims/algos/find.py) from a user's side:
a damaged, stale or shared cache file, or one that cannot be written, never
fails the convolution and never makes it run an algorithm that does not admit
the problem.  The timing is faked: no GPU."""
import json
import pathlib

import pytest

from dnnprims import algos
from dnnprims.algos import find as find_mode
from dnnprims.conv import _describe


def _problem(R=3):
    return _describe((2, 4, 7, 7), (8, 4, R, R), 1, R // 2, 1, 1, "NCHW", "float32")


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """A cache directory of its own, a fake GPU name and a fake timer ('direct'
    fastest); yields the list of directions timed."""
    monkeypatch.setenv("DNNPRIMS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(find_mode, "gpu_name", lambda: "Test GPU")
    timed = []

    def fake_times(problem, direction, names, options=algos.DEFAULT_OPTIONS, failed=None):
        timed.append(direction)
        return {name: (0.5 if name == "direct" else 1.0) for name in names}

    monkeypatch.setattr(find_mode, "time_algorithms", fake_times)
    find_mode.forget()
    yield timed
    find_mode.forget()


def _write(path, data):
    pathlib.Path(path).write_text(json.dumps(data))


@pytest.mark.parametrize("text", [
    b"{not json", b"", b"[1, 2]", b'{"version": 2, "entries": []}', b'{"version": 2, "entries": 7}',
    b'{"version": 2, "entries": {"k": 1}}', b'{"version": 2}', b"\xff\xfe{}",
])
def test_a_damaged_cache_file_is_ignored_and_rewritten(cache, tmp_path, text):
    (tmp_path / "conv_find.json").write_bytes(text)
    assert find_mode.find(_problem(), "forward") == "direct"
    assert cache == ["forward"]
    data = json.loads((tmp_path / "conv_find.json").read_text())
    assert data["version"] == find_mode.VERSION and len(data["entries"]) == 1


@pytest.mark.parametrize("entry", [
    "direct", 3, None, [], {"ms": {}}, {"algo": ["direct"]}, {"algo": None}, {"algo": 5},
])
def test_a_malformed_entry_is_timed_again(cache, tmp_path, entry):
    key = find_mode.problem_key(_problem(), "forward")
    _write(tmp_path / "conv_find.json", {"version": find_mode.VERSION, "entries": {key: entry}})
    assert find_mode.find(_problem(), "forward") == "direct"
    assert cache == ["forward"]


def test_a_cached_winner_that_no_longer_admits_the_problem_is_timed_again(cache, tmp_path):
    # An older version's cache (or one edited by hand) names a registered
    # algorithm that does not support this problem (3x3 Winograd on 5x5 filters):
    # using it would fail the user's call with "does not support".
    problem = _problem(R=5)
    assert not algos.admits(algos.REGISTRY["winograd_f2x2_3x3"], problem, "forward")[0]
    key = find_mode.problem_key(problem, "forward")
    names = find_mode.candidates(problem, "forward")
    _write(tmp_path / "conv_find.json", {"version": find_mode.VERSION, "entries": {
        key: {"algo": "winograd_f2x2_3x3", "ms": dict({n: 1.0 for n in names}, winograd_f2x2_3x3=0.1)}}})
    assert algos.choose(problem, "forward", "find", gpu=True).name == "direct"
    assert cache == ["forward"]


def test_a_cached_winner_is_timed_again_when_the_candidates_changed(cache, tmp_path):
    # A newer dnnprims registers another algorithm that admits the problem: the
    # cached winner was never compared with it.
    problem = _problem()
    names = find_mode.candidates(problem, "forward")
    assert "direct" in names and len(names) > 2
    key = find_mode.problem_key(problem, "forward")
    _write(tmp_path / "conv_find.json", {"version": find_mode.VERSION, "entries": {
        key: {"algo": "gemm", "ms": {n: 1.0 for n in names if n != "direct"}}}})
    assert find_mode.find(problem, "forward") == "direct"
    assert cache == ["forward"]
    # the same candidates: the cached winner stands, without timing
    find_mode.forget()
    assert find_mode.find(problem, "forward") == "direct"
    assert cache == ["forward"]


def test_an_unwritable_cache_does_not_fail_the_call(cache, tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("DNNPRIMS_CACHE_DIR", str(blocker / "sub"))   # a file in the way: mkdir fails
    assert find_mode.find(_problem(), "forward") == "direct"
    assert find_mode.find(_problem(), "forward") == "direct"
    assert cache == ["forward"]   # the in-memory cache still works


def test_no_home_directory_does_not_fail_the_call(cache, monkeypatch):
    # A container whose user has no passwd entry and no $HOME: Path.home() raises
    # RuntimeError ("Could not determine home directory").
    monkeypatch.delenv("DNNPRIMS_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)

    def no_home():
        raise RuntimeError("Could not determine home directory.")
    monkeypatch.setattr(pathlib.Path, "home", staticmethod(no_home))
    assert find_mode.find(_problem(), "forward") == "direct"
    assert cache == ["forward"]


def test_an_empty_cache_dir_variable_means_unset(monkeypatch, tmp_path):
    # DNNPRIMS_CACHE_DIR="" must not put conv_find.json into the current directory.
    monkeypatch.setenv("DNNPRIMS_CACHE_DIR", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert find_mode.cache_path() == tmp_path / "dnnprims" / "conv_find.json"


def test_a_failed_write_leaves_no_temporary_file(cache, tmp_path, monkeypatch):
    def refuse(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(find_mode.os, "replace", refuse)
    assert find_mode.find(_problem(), "forward") == "direct"
    assert list(tmp_path.iterdir()) == []


def test_entries_another_process_wrote_meanwhile_are_kept(cache, tmp_path):
    # Two processes share the cache: each read the file before the other wrote.
    # The atomic replace must not drop the other's entry (a lost update).
    path = tmp_path / "conv_find.json"
    assert find_mode.find(_problem(3), "forward") == "direct"       # this process reads the file
    other = json.loads(path.read_text())
    other["entries"]["Other GPU|forward|x"] = {"algo": "direct", "ms": {"direct": 1.0}}
    _write(path, other)                                              # the other process writes
    assert find_mode.find(_problem(5), "forward") == "direct"       # then this one writes again
    entries = json.loads(path.read_text())["entries"]
    assert "Other GPU|forward|x" in entries and len(entries) == 3


def test_a_candidate_that_fails_while_timed_does_not_fail_the_call(monkeypatch, tmp_path):
    # e.g. out of memory for one algorithm's workspace: find records it and
    # picks among the others, as the tuner does.
    monkeypatch.setenv("DNNPRIMS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(find_mode, "gpu_name", lambda: "Test GPU")
    monkeypatch.setattr(find_mode, "random_operands", lambda problem, direction: (None, None, None))
    from dnnprims.bench import timing

    class Result:
        def __init__(self, ms):
            self.median_ms = ms

    def fake_measure(fn, *, xp=None, warmup=0, repeat=0):
        fn()
        return Result(0.5)
    monkeypatch.setattr(timing, "measure", fake_measure)
    problem = _problem()
    names = find_mode.candidates(problem, "forward")
    failing = names[0]

    class Fake:
        def __init__(self, name):
            self.name = name

        def under(self, options):
            return self

        def run(self, *args):
            if self.name == failing:
                raise MemoryError("out of memory allocating the workspace")
    monkeypatch.setattr(find_mode, "REGISTRY", {name: Fake(name) for name in names})
    monkeypatch.setattr(find_mode, "candidates", lambda *args: names)
    find_mode.forget()
    try:
        winner = find_mode.find(problem, "forward")
        assert winner in names and winner != failing
        entry, = json.loads((tmp_path / "conv_find.json").read_text())["entries"].values()
        assert failing in entry["failed"] and failing not in entry["ms"]
        # every candidate failing is an error the user sees (the first one's)
        monkeypatch.setattr(Fake, "run", lambda self, *args: 1 / 0)
        find_mode.forget()
        (tmp_path / "conv_find.json").unlink()
        with pytest.raises(ZeroDivisionError):
            find_mode.find(problem, "forward")
    finally:
        find_mode.forget()


@pytest.mark.parametrize("direction", algos.DIRECTIONS)
def test_an_empty_problem_is_not_timed(cache, direction):
    # An empty batch reaches choose() before conv's "nothing to compute" return:
    # timing the candidates on empty operands measures launch overhead only (and
    # runs kernels that are never run on empty arrays otherwise).
    empty = _describe((0, 4, 7, 7), (8, 4, 3, 3), 1, 1, 1, 1, "NCHW", "float32")
    assert find_mode.find(empty, direction) == algos.auto_rule(empty, direction)
    assert cache == []


@pytest.mark.parametrize("no_gpu", ["driver", "cupy"])
def test_find_without_a_usable_gpu_says_so(monkeypatch, tmp_path, no_gpu):
    """conv2d_choose(algo="find") needs a GPU: without one (no driver, or no CuPy)
    it raised the driver's bare cudaErrorInsufficientDriver (or ImportError).
    Now a RuntimeError says that find times on a GPU and auto needs none.  On
    NumPy inputs "find" means "auto" (README), so conv2d_forward still runs."""
    import sys
    import numpy as np
    import dnnprims
    monkeypatch.setenv("DNNPRIMS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(find_mode, "_names", {})
    if no_gpu == "driver":
        cupy = pytest.importorskip("cupy")

        def no_driver():
            raise cupy.cuda.runtime.CUDARuntimeError(35)   # cudaErrorInsufficientDriver
        monkeypatch.setattr(cupy.cuda.runtime, "getDevice", no_driver)
    else:
        monkeypatch.setitem(sys.modules, "cupy", None)     # import cupy raises ImportError
    find_mode.forget()
    with pytest.raises(RuntimeError, match="algo='find' times the algorithms on a CUDA GPU, and none is "
                                           "usable here .*algo='auto' needs no GPU"):
        dnnprims.conv2d_choose((2, 4, 7, 7), (8, 4, 3, 3), padding=1, algo="find")
    x, w = np.ones((2, 4, 7, 7), np.float32), np.ones((8, 4, 3, 3), np.float32)
    np.testing.assert_array_equal(dnnprims.conv2d_forward(x, w, padding=1, algo="find"),
                                  dnnprims.conv2d_forward(x, w, padding=1))
    assert not (tmp_path / "conv_find.json").exists()
    find_mode.forget()


@pytest.mark.parametrize("change", ["CUPY_TF32", "dnnprims", "cupy", "cuda"])
def test_a_winner_found_under_other_software_is_timed_again(cache, tmp_path, monkeypatch, change):
    """The key held the GPU name but neither the library versions nor CUPY_TF32,
    which change which algorithm is fastest: a winner timed under TF32, or by an
    older dnnprims / CuPy / CUDA, was reused for good.  They are in the key now
    (a file shared by two set-ups keeps both entries)."""
    cupy = pytest.importorskip("cupy")
    import dnnprims
    monkeypatch.delenv("CUPY_TF32", raising=False)
    monkeypatch.setattr(find_mode, "_versions", None)
    assert find_mode.find(_problem(), "forward") == "direct"
    find_mode.forget()
    assert find_mode.find(_problem(), "forward") == "direct"
    assert cache == ["forward"]                          # the same software: from the file
    monkeypatch.setenv("CUPY_TF32", "0")                  # unset and "0" both mean strict fp32
    assert find_mode.find(_problem(), "forward") == "direct" and cache == ["forward"]
    if change == "CUPY_TF32":
        monkeypatch.setenv("CUPY_TF32", "1")
    elif change == "dnnprims":
        monkeypatch.setattr(dnnprims, "__version__", "99.0")
    elif change == "cupy":
        monkeypatch.setattr(cupy, "__version__", "99.0")
    else:
        monkeypatch.setattr(cupy.cuda.runtime, "runtimeGetVersion", lambda: 99000)
    monkeypatch.setattr(find_mode, "_versions", None)     # a new process
    find_mode.forget()
    assert find_mode.find(_problem(), "forward") == "direct"
    assert cache == ["forward", "forward"]
    entries = json.loads((tmp_path / "conv_find.json").read_text())["entries"]
    assert len(entries) == 2
    new, = (key for key in entries if key == find_mode.problem_key(_problem(), "forward"))
    assert ("CUPY_TF32=1" if change == "CUPY_TF32" else "99") in new.split("|")[-1]
    monkeypatch.setattr(find_mode, "_versions", None)
