"""softmax / log_softmax and their backward: reference checks, GPU vs reference, bad inputs."""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from conftest import FLOAT_DTYPES, random_array
from dnnprims import _dtypes
from dnnprims.reference import softmaxes as ref
from dnnprims.softmaxes import log_softmax, log_softmax_backward, softmax, softmax_backward
from dnnprims.testing import assert_close
from dnnprims.testing.gradcheck import numerical_gradient
from dnnprims.testing.strategies import softmax_problems

SETTINGS = settings(max_examples=30, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def softmax_by_rows(x, axis):
    """Independent float64 softmax: each 1-D slice through math.exp, no vectorised reduction."""
    moved = np.moveaxis(np.asarray(x, np.float64), axis, -1)
    out = np.empty_like(moved)
    for idx in np.ndindex(moved.shape[:-1]):
        row = moved[idx]
        top = max(row)
        e = [math.exp(v - top) for v in row]
        total = math.fsum(e)
        out[idx] = [v / total for v in e]
    return np.moveaxis(out, -1, axis)


# ---- the reference against hand cases and independent formulas -----------------

def test_hand_values():
    x = np.log(np.array([[1.0, 2.0, 3.0, 4.0]]))
    np.testing.assert_allclose(ref.softmax(x, -1), [[0.1, 0.2, 0.3, 0.4]], rtol=1e-15)
    np.testing.assert_allclose(ref.log_softmax(x, -1), np.log([[0.1, 0.2, 0.3, 0.4]]), rtol=1e-14)
    np.testing.assert_array_equal(ref.softmax(np.array([5.0]), 0), [1.0])


def test_large_inputs_do_not_overflow():
    x = np.array([1000.0, 1000.0, -1000.0])
    np.testing.assert_allclose(ref.softmax(x, 0), [0.5, 0.5, 0.0], atol=1e-300)
    np.testing.assert_allclose(ref.log_softmax(x, 0), [-math.log(2), -math.log(2), -2000 - math.log(2)])


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_matches_independent_loop_and_sums_to_one(rng, axis):
    x = random_array(rng, (2, 3, 4, 5), low=-5, high=5)
    y = ref.softmax(x, axis)
    np.testing.assert_allclose(y, softmax_by_rows(x, axis), rtol=1e-13)
    np.testing.assert_allclose(y.sum(axis=axis), 1.0, rtol=1e-14)
    np.testing.assert_allclose(ref.log_softmax(x, axis), np.log(softmax_by_rows(x, axis)), rtol=1e-12, atol=1e-13)


def test_shift_invariance(rng):
    x = random_array(rng, (3, 7))
    shift = random_array(rng, (3, 1), low=-50, high=50)
    np.testing.assert_allclose(ref.softmax(x + shift, 1), ref.softmax(x, 1), rtol=1e-12)
    np.testing.assert_allclose(ref.log_softmax(x + shift, 1), ref.log_softmax(x, 1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_backward_by_finite_differences(rng, log, axis):
    forward, backward = (ref.log_softmax, ref.log_softmax_backward) if log else (ref.softmax, ref.softmax_backward)
    x = random_array(rng, (2, 3, 4), low=-2, high=2)
    dy = random_array(rng, x.shape)
    analytic = backward(dy, forward(x, axis), axis)
    numeric = numerical_gradient(lambda: float(np.sum(dy * forward(x, axis))), x)
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-9)


def test_backward_is_the_jacobian_transpose(rng):
    """<dy, J v> == <J^T dy, v> with J = diag(y) - y y^T for one row."""
    x = random_array(rng, (9,))
    y = ref.softmax(x, 0)
    jacobian = np.diag(y) - np.outer(y, y)
    dy, v = random_array(rng, (9,)), random_array(rng, (9,))
    np.testing.assert_allclose(dy @ (jacobian @ v), ref.softmax_backward(dy, y, 0) @ v, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(ref.log_softmax_backward(dy, np.log(y), 0),
                               dy - y * dy.sum(), rtol=1e-12, atol=1e-14)


# ---- every path against the float64 reference, in every dtype --------------------

# Short and long rows (warp and block kernels), and middle axes (column kernel),
# including the channel axis of an NCHW tensor.
CASES = [
    ((7, 13), -1), ((13,), 0), ((1,), 0), ((4, 1), -1), ((3, 3), 1), ((5, 3), 0),
    ((3, 1000), 1), ((2, 1024), 1), ((3, 1025), -1), ((2, 5000), -1),
    ((2, 7, 3, 5), 1), ((2, 7, 3, 5), 0), ((2, 7, 3, 5), 2), ((2, 7, 3, 5), -1),
    ((2, 3000, 3), 1), ((1, 13, 1, 1), 1),
    # register rows: one and two warps per row, several rows per block, an odd
    # length (scalar packs), past the register capacity (block kernel)
    ((9, 2048), 1), ((5, 4096), -1), ((6, 2049), -1), ((2, 12000), -1), ((2, 40000), -1),
    # shared-memory channel tiles: partial tiles, narrow tiles, and an axis too
    # long for the tile (column kernel)
    ((2, 40, 48), 1), ((3, 17, 7), 1), ((2, 5, 2), 1), ((2, 1600, 20), 1),
    # channel axis held in registers (16-bit forward) by 8, 16 and 32 rows of threads
    ((2, 256, 40), 1), ((2, 300, 16), 1), ((2, 1000, 9), 1),
    # 16-byte packs of the axis: the longest axis (64 rows of threads), one past
    # it, partial last tiles, narrow tiles, a 4-D middle axis
    ((3, 512, 24), 1), ((2, 513, 8), 1), ((2, 33, 136), 1), ((5, 3, 1, 8), 1), ((2, 64, 3, 8), 1),
]


def check_four_ops(xp, rng, dtype, shape, axis):
    """softmax, log_softmax and both backwards on random data against the float64 reference."""
    x = random_array(rng, shape, dtype, low=-4, high=4)
    dy = random_array(rng, shape, dtype)
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    y = softmax(xp.asarray(x), axis=axis)
    assert y.dtype == dtype and y.shape == shape and isinstance(y, xp.ndarray)
    assert_close(y, ref.softmax(x64, axis), dtype, what="softmax")
    assert_close(log_softmax(xp.asarray(x), axis=axis), ref.log_softmax(x64, axis), dtype, what="log_softmax")

    y_stored = ref.softmax(x, axis)  # a genuine softmax output in the storage dtype
    dx = softmax_backward(xp.asarray(dy), xp.asarray(y_stored), axis=axis)
    assert_close(dx, ref.softmax_backward(dy64, y_stored.astype(np.float64), axis), dtype,
                 what="softmax_backward")
    logy_stored = ref.log_softmax(x, axis)
    dx = log_softmax_backward(xp.asarray(dy), xp.asarray(logy_stored), axis=axis)
    assert_close(dx, ref.log_softmax_backward(dy64, logy_stored.astype(np.float64), axis), dtype,
                 what="log_softmax_backward")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape,axis", CASES, ids=[f"{s}-axis{a}" for s, a in CASES])
def test_forward_and_backward_against_reference(xp, rng, dtype, shape, axis):
    check_four_ops(xp, rng, dtype, shape, axis)


@pytest.fixture
def fresh_fast_table():
    """An empty table of prepared launches before and after the test, so a call
    takes the path the test selects and no later test inherits it."""
    from dnnprims import softmaxes
    softmaxes._FAST.clear()
    yield
    softmaxes._FAST.clear()


def use_packs(monkeypatch, shape):
    """Every (direction, log) and dtype takes *_channels_packs with this (K, threads[,
    forward blocks an SM]; the backward gets (K, threads)), or (shape None) none does."""
    from dnnprims import softmaxes
    types = ("float", "double", "half_t", "bfloat16_t")
    monkeypatch.setattr(softmaxes, "CHANNEL_PACKS", {
        key: ({t: (shape if key[0] == "forward" else shape[:2]) for t in types} if shape else {})
        for key in softmaxes.CHANNEL_PACKS})
    monkeypatch.setattr(softmaxes, "PACKED16_FORWARD", False)  # the 16-bit forward too (words: below)
    monkeypatch.setattr(softmaxes, "FLOAT_FORWARD", False)  # and the float forward (floats: below)
    monkeypatch.setattr(softmaxes, "_PLANS", {})


PAIR_CASES = [((2, 7, 3, 6), 1), ((2, 13, 2), 1), ((3, 1, 4), 1), ((1, 3, 130), 1), ((2, 256, 64), 1),
              ((2, 600, 16), 1), ((2, 3000, 4), 1), ((4, 7, 14), 1), ((3, 5, 7, 2), 2),
              ((3, 100, 48), 1), ((1, 17, 520), 1)]


@pytest.mark.parametrize("path", ["packs", "pairs", "tile"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape,axis", PAIR_CASES, ids=[f"{s}-axis{a}" for s, a in PAIR_CASES])
def test_channel_pairs_paths(xp, rng, monkeypatch, fresh_fast_table, path, dtype, shape, axis):
    """Each strided-axis path where the shape allows it: 16-byte packs of inner
    positions, 16-bit tiles with two inner positions per thread (inner even: one
    and several tiles, a partial last tile, narrow tiles for a long axis, an axis
    too long for any tile), and the one-position kernels, against the float64
    reference, forward and backward."""
    from dnnprims import softmaxes
    pairs = path == "pairs"
    monkeypatch.setattr(softmaxes, "CHANNEL_PAIRS", {"forward": pairs, "backward": pairs})
    use_packs(monkeypatch, (8, 256) if path == "packs" else None)
    check_four_ops(xp, rng, dtype, shape, axis)


PACK_CASES = [((3, 512, 24), 1), ((2, 513, 8), 1), ((2, 300, 16), 1), ((3, 5, 8), 1), ((2, 256, 64), 1),
              ((2, 33, 136), 1), ((2, 3, 64, 4, 2), 2)]


@pytest.mark.parametrize("pack_shape", [(8, 256), (8, 512), (4, 256), (4, 512), (8, 256, 4), (4, 256, 5)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape,axis", PACK_CASES, ids=[f"{s}-axis{a}" for s, a in PACK_CASES])
def test_channel_packs_shapes(xp, rng, monkeypatch, fresh_fast_table, pack_shape, dtype, shape, axis):
    """*_channels_packs with 4 or 8 packs a thread and 256 or 512 threads a block,
    and the forward with registers capped for 4 or 5 blocks an SM (axis up to the
    capacity and one past it, narrow and partial tiles), forward and backward
    against the float64 reference."""
    use_packs(monkeypatch, pack_shape)
    check_four_ops(xp, rng, dtype, shape, axis)


WORDS_DTYPES = [d for d in _dtypes.SUPPORTED if d.itemsize == 2]
WORDS_SWITCHES = [False, True, (8, 256, 4), (8, 256, 3), (4, 256, 5), (8, 256, 3, False)]
WORDS_CASES = PACK_CASES + [((2, 256, 3136), 1), ((3, 17, 8, 2), 1), ((1, 1, 64), 1)]


@pytest.mark.parametrize("switch", WORDS_SWITCHES, ids=str)
@pytest.mark.parametrize("dtype", WORDS_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape,axis", WORDS_CASES, ids=[f"{s}-axis{a}" for s, a in WORDS_CASES])
def test_channel_words_forward(xp, rng, monkeypatch, fresh_fast_table, switch, dtype, shape, axis):
    """The 16-bit forward in words (PACKED16_FORWARD: the default table, each declared
    (K, 256, MINB), one tile a block (no prefetch), and off): axis up to the capacity and one past it, partial and
    narrow tiles, more tiles than the persistent grid (2 x 49 tiles of 64 positions at
    (2, 256, 3136): each block walks and prefetches several), an axis of 1,
    forward and backward against the float64 reference."""
    from dnnprims import softmaxes
    monkeypatch.setattr(softmaxes, "PACKED16_FORWARD", switch)
    monkeypatch.setattr(softmaxes, "_SMS", {})
    if xp is not np:
        # A 2-SM grid as well: every block walks many tiles (the prefetch of the next one).
        monkeypatch.setattr(softmaxes, "_sm_count", lambda: 2 if shape == (2, 256, 3136) else 132)
    check_four_ops(xp, rng, dtype, shape, axis)


@pytest.mark.parametrize("switch", [False, True, (8, 256, 4), (4, 256, 5)], ids=str)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_channel_forward_special_values(xp, rng, monkeypatch, fresh_fast_table, switch, dtype):
    """The forward packs / words kernels on an axis of 37 with, by inner position: a
    fully masked column (NaN, as in PyTorch), one NaN (the whole column NaN: the
    packed max ignores it, the sum does not), some -inf (probability 0,
    log-probability -inf), values near the largest the dtype allows (bfloat16 up to
    3e38: the words kernel's base-2 offset would overflow there and takes x - max),
    all equal values, large negative ones, and random data elsewhere; against the
    float64 reference.  (float16: +-30000, so that a log-probability x - max stays finite.)"""
    from dnnprims import softmaxes
    use_packs(monkeypatch, (8, 256))
    monkeypatch.setattr(softmaxes, "PACKED16_FORWARD", switch)
    check_special_values(xp, rng, dtype)


def check_special_values(xp, rng, dtype):
    """The special-value columns of test_channel_forward_special_values against float64."""
    dtype = np.dtype(dtype)
    big = {"float16": 30000.0, "bfloat16": 1e30, "float32": 1e30, "float64": 1e150}[dtype.name]
    x = rng.uniform(-4, 4, (2, 37, 24))
    x[:, :, 0] = -np.inf
    x[0, 5, 1] = np.nan
    x[:, ::3, 2] = -np.inf
    x[:, :, 3] = rng.uniform(-1, 1, (2, 37)) * big
    x[:, 7, 3] = big
    x[:, :, 4] = 1.5
    x[1, :, 9] = -big
    x[:, :, 10] = rng.uniform(-1, 1, (2, 37)) + (3e38 if dtype.name == "bfloat16" else 0.5 * big)
    x[:, :, 11] = rng.uniform(-60, 60, (2, 37)) + 1000.0
    x = x.astype(dtype)
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        want = {"softmax": ref.softmax(x64, 1), "log_softmax": ref.log_softmax(x64, 1)}
    for name, f in (("softmax", softmax), ("log_softmax", log_softmax)):
        got = f(xp.asarray(x), axis=1)
        got = np.asarray(got.get() if hasattr(got, "get") else got, np.float64)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want[name]), err_msg=name)
        assert np.isnan(got[:, :, 0]).all() and np.isnan(got[0, :, 1]).all()
        finite = np.isfinite(want[name])
        infinite = ~finite & ~np.isnan(want[name])
        np.testing.assert_array_equal(got[infinite], want[name][infinite])
        assert_close(got[finite], want[name][finite], dtype, what=name)


def test_channel_words_table_declared_and_refusals(monkeypatch):
    """Every CHANNEL_WORDS entry plans a declared words kernel with a grid of at most
    blocks-an-SM x SMs; shapes without a kernel (512 threads, an undeclared bound) are
    refused; float never takes the words kernel."""
    from dnnprims import softmaxes
    monkeypatch.setattr(softmaxes, "_PLANS", {})
    monkeypatch.setattr(softmaxes, "_sm_count", lambda: 132)
    for log, table in softmaxes.CHANNEL_WORDS.items():
        for dtype in WORDS_DTYPES:
            expr, grid, block = softmaxes._plan("forward", log, (64, 256, 56, 56), 1, dtype, True)[:3]
            k, threads, minb, *persistent = table[_dtypes.cuda_type(dtype)]
            assert "channels_words" in expr and expr in softmaxes.FAMILY.name_expressions, expr
            tiles = 64 * 49  # of 64 positions
            assert grid == ((minb * 132,) if persistent in ([], [True]) else (tiles,))
            assert block[0] * block[1] == threads == 256
    monkeypatch.setattr(softmaxes, "PACKED16_FORWARD", (8, 256, 3, False))  # one tile a block
    assert softmaxes._plan("forward", False, (64, 256, 56, 56), 1, np.dtype(np.float16), True)[1] == (64 * 49,)
    monkeypatch.setattr(softmaxes, "PACKED16_FORWARD", (8, 256, 3))  # persistent
    assert softmaxes._plan("forward", False, (64, 256, 56, 56), 1, np.dtype(np.float16), True)[1] == (3 * 132,)
    monkeypatch.setattr(softmaxes, "PACKED16_FORWARD", True)
    # an axis of one: the packs kernel (exact 1 / 0)
    assert "channels_packs" in softmaxes._plan("forward", True, (2, 1, 64), 1, np.dtype(np.float16), True)[0]
    assert "channels_words" not in softmaxes._plan("forward", False, (2, 256, 64), 1, np.dtype(np.float32), True)[0]
    for entry in ((8, 512, 3), (8, 256, 1), (4, 256, 4)):
        monkeypatch.setattr(softmaxes, "PACKED16_FORWARD", entry)
        with pytest.raises(ValueError, match="CHANNEL_WORDS"):
            softmaxes._plan("forward", False, (2, 256, 64), 1, np.dtype(np.float16), True)


FLOAT_SWITCHES = [False, True, (8, 256, 3, True, False), (8, 256, 4, True, False), (8, 256, 3, False, False),
                  (8, 256, 3, True, True), (16, 256, 2, True, False)]
FLOAT_CASES = PACK_CASES + [((2, 256, 3136), 1), ((3, 17, 8, 2), 1), ((1, 1, 64), 1), ((2, 7, 12), 1),
                            ((5, 3, 1, 8), 1), ((2, 64, 3, 8), 1), ((3, 37, 4), 1)]


@pytest.mark.parametrize("switch", FLOAT_SWITCHES, ids=str)
@pytest.mark.parametrize("shape,axis", FLOAT_CASES, ids=[f"{s}-axis{a}" for s, a in FLOAT_CASES])
def test_channel_floats_forward(xp, rng, monkeypatch, fresh_fast_table, switch, shape, axis):
    """The float forward with fewer instructions (FLOAT_FORWARD: off, the default table,
    each declared (K, 256, MINB, exp2, stream)): axis up to the capacity (8 packs: 512 =
    64 rows of threads, 4 positions wide) and one past it (the tile kernel), partial and narrow
    tiles (inner 12, 24, 8, 4: rows of threads holding fewer than K rows, threads past
    inner), many tiles, an axis of 1 (the packs kernel), all four ops against float64."""
    from dnnprims import softmaxes
    monkeypatch.setattr(softmaxes, "FLOAT_FORWARD", switch)
    check_four_ops(xp, rng, np.float32, shape, axis)


@pytest.mark.parametrize("switch", [False, True], ids=str)
@pytest.mark.parametrize("dtype", [d for d in _dtypes.SUPPORTED if d != np.float32], ids=lambda d: d.name)
def test_float_forward_switch_leaves_other_dtypes(xp, rng, monkeypatch, fresh_fast_table, switch, dtype):
    """FLOAT_FORWARD changes the float32 forward only: the other dtypes plan and compute
    the same either way (channel axis, packs shape)."""
    from dnnprims import softmaxes
    monkeypatch.setattr(softmaxes, "FLOAT_FORWARD", switch)
    for log in (False, True):
        expr = softmaxes._plan("forward", log, (2, 256, 64), 1, np.dtype(dtype), True)[0]
        assert "channels_floats" not in expr, expr
    check_four_ops(xp, rng, dtype, (2, 256, 64), 1)


@pytest.mark.parametrize("switch", FLOAT_SWITCHES, ids=str)
def test_channel_floats_special_values(xp, rng, monkeypatch, fresh_fast_table, switch):
    """test_channel_forward_special_values' columns (fully -inf, one NaN, some -inf,
    +-1e30, constant, offset by 1000) through every FLOAT_FORWARD setting, float32."""
    from dnnprims import softmaxes
    use_packs(monkeypatch, (8, 256))
    monkeypatch.setattr(softmaxes, "FLOAT_FORWARD", switch)
    check_special_values(xp, rng, np.float32)


@pytest.mark.parametrize("shape", [(2, 256, 3136), (3, 37, 12), (2, 513, 8)], ids=str)
def test_channel_floats_expf_is_bitwise_the_packs_kernel(gpu, rng, monkeypatch, fresh_fast_table, shape):
    """With exp2 False the floats kernel computes what the packs kernel does, in the same
    order: the same bits (so the A/B's timing of that variant isolates the exp and 1 / s)."""
    import cupy
    from dnnprims import softmaxes
    x = cupy.asarray(random_array(rng, shape, np.float32, low=-8, high=8))
    for f in (softmax, log_softmax):
        monkeypatch.setattr(softmaxes, "FLOAT_FORWARD", False)
        old = f(x, axis=1)
        monkeypatch.setattr(softmaxes, "FLOAT_FORWARD", (8, 256, 3, False, False))
        new = f(x, axis=1)
        assert cupy.array_equal(old.view(cupy.int32), new.view(cupy.int32)), f.__name__


def test_channel_floats_table_declared_and_refusals(monkeypatch):
    """Every CHANNEL_FLOATS entry and declared variant plans a declared floats kernel with
    the packs kernel's grid and block; FLOAT_FORWARD False plans the packs kernel; shapes
    without a kernel are refused; the backward and an axis of one never take it."""
    from dnnprims import softmaxes
    monkeypatch.setattr(softmaxes, "_PLANS", {})
    shape, f32 = (64, 256, 56, 56), np.dtype(np.float32)
    monkeypatch.setattr(softmaxes, "FLOAT_FORWARD", False)
    packs = {log: softmaxes._plan("forward", log, shape, 1, f32, True) for log in (False, True)}
    assert all("channels_packs" in p[0] for p in packs.values())
    variants = [True] + [(k, 256, b, e, c) for k, b, e, c in softmaxes._FLOATS_VARIANTS]
    for switch in variants:
        monkeypatch.setattr(softmaxes, "FLOAT_FORWARD", switch)
        for log in (False, True):
            expr, grid, block, scalars, shared = softmaxes._plan("forward", log, shape, 1, f32, True)
            assert "channels_floats" in expr and expr in softmaxes.FAMILY.name_expressions, expr
            if switch is True or switch[0] == 8:  # the packs kernel's tiles
                assert (grid, block, shared) == packs[log][1:3] + (0,) and scalars == packs[log][3]
            else:  # 16 packs: 16 rows of threads, tiles of 64 positions
                assert (grid, block, shared) == ((64 * 49,), (16, 16), 0)
            assert "channels_floats" not in softmaxes._plan("backward", log, shape, 1, f32, True)[0]
            assert "channels_packs" in softmaxes._plan("forward", log, (2, 1, 64), 1, f32, True)[0]
    for entry in ((8, 512, 3, True, False), (8, 256, 5, True, False), (4, 256, 3, True, False),
                  (8, 256, 4, False, True), (8, 256, 3)):
        monkeypatch.setattr(softmaxes, "FLOAT_FORWARD", entry)
        with pytest.raises(ValueError, match="FLOAT_FORWARD"):
            softmaxes._plan("forward", False, (2, 256, 64), 1, f32, True)


ROW_CASES = [((7, 13), -1), ((3, 1000), 1), ((5, 1024), 1), ((9, 2048), 1), ((6, 2049), -1), ((3, 2, 300), -1),
             ((2, 8192), -1)]


@pytest.mark.parametrize("short_row_packs", [8, 4, 2, 1])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape,axis", ROW_CASES, ids=[f"{s}-axis{a}" for s, a in ROW_CASES])
def test_row_thread_counts(xp, rng, monkeypatch, fresh_fast_table, short_row_packs, dtype, shape, axis):
    """Rows in registers by the fewest threads (SHORT_ROW_PACKS 8: a warp and 4 rows
    a block for short rows, a partial last block) and spread over more threads when
    rows are few (4, 2, 1 packs a thread: 64-256 threads a row, block reductions,
    threads holding no pack), 16-byte and scalar packs, against the float64 reference."""
    from dnnprims import softmaxes
    monkeypatch.setattr(softmaxes, "SHORT_ROW_PACKS", short_row_packs)
    monkeypatch.setattr(softmaxes, "_PLANS", {})
    check_four_ops(xp, rng, dtype, shape, axis)


@pytest.mark.parametrize("shape,threads,rows_per_block", [
    ((256, 1000), 128, 1),    # a classifier: few rows, 2 packs of 4 floats a thread
    ((65536, 1024), 32, 4),   # many rows fill the GPU with a warp a row
    ((4, 13), 32, 4),         # one scalar pack a thread already
    ((2, 8192), 256, 1),      # capped at 256 threads a row
])
def test_row_plan_spreads_few_rows(monkeypatch, shape, threads, rows_per_block):
    """The register-row launch for float32 rows: more threads a row only while the grid
    stays under the GPU's resident threads."""
    from dnnprims import softmaxes
    monkeypatch.setattr(softmaxes, "SHORT_ROW_PACKS", 2)
    for direction in ("forward", "backward"):
        expr, grid, block, _, _ = softmaxes._plan(direction, False, shape, 1, np.dtype(np.float32), True)
        assert expr.startswith(f"softmax_{direction}_rows_registers<float")
        assert block == (threads, rows_per_block)
        assert grid == (-(-shape[0] // rows_per_block),)


def test_channel_packs_table_names_declared_kernels(monkeypatch):
    """Every CHANNEL_PACKS entry plans a kernel the family declares (CI compiles those),
    and an entry without a kernel (a launch bound on 512 threads or on the backward) is
    refused instead of launched."""
    from dnnprims import _dtypes, softmaxes
    monkeypatch.setattr(softmaxes, "PACKED16_FORWARD", False)  # CHANNEL_WORDS: test_channel_words_table_*
    monkeypatch.setattr(softmaxes, "FLOAT_FORWARD", False)  # CHANNEL_FLOATS: test_channel_floats_table_*
    for (direction, log), table in softmaxes.CHANNEL_PACKS.items():
        for dtype in _dtypes.SUPPORTED:
            if _dtypes.cuda_type(dtype) in table:
                expr = softmaxes._plan(direction, log, (2, 256, 64), 1, dtype, True)[0]
                assert "channels_packs" in expr and expr in softmaxes.FAMILY.name_expressions, expr
    for direction, entry in (("forward", (8, 512, 4)), ("forward", (8, 256, 5)), ("backward", (8, 256, 4))):
        monkeypatch.setattr(softmaxes, "CHANNEL_PACKS", {key: {"float": entry} for key in softmaxes.CHANNEL_PACKS})
        with pytest.raises(ValueError, match="CHANNEL_PACKS"):
            softmaxes._plan(direction, False, (2, 256, 64), 1, np.float32, True)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_minus_infinity_entries(xp, dtype):
    """Masked (-inf) entries get probability 0; a fully masked slice is NaN, as in PyTorch."""
    x = np.array([[0.0, -np.inf, 0.0], [-np.inf, -np.inf, -np.inf], [1.0, 2.0, -np.inf]]).astype(dtype)
    y = softmax(xp.asarray(x), axis=1)
    y = np.asarray(y.get() if hasattr(y, "get") else y, np.float64)
    np.testing.assert_array_equal(y[0], [0.5, 0.0, 0.5])
    assert np.isnan(y[1]).all()
    e = math.exp(-1)
    np.testing.assert_allclose(y[2], [e / (1 + e), 1 / (1 + e), 0.0], rtol=4e-3)
    ly = log_softmax(xp.asarray(x), axis=1)
    ly = np.asarray(ly.get() if hasattr(ly, "get") else ly, np.float64)
    assert ly[0, 1] == -np.inf and ly[2, 2] == -np.inf
    # The same along a middle axis (column kernel).
    yt = softmax(xp.asarray(np.ascontiguousarray(x.T)[None]), axis=1)
    yt = np.asarray(yt.get() if hasattr(yt, "get") else yt, np.float64)
    np.testing.assert_array_equal(yt[0, :, 0], [0.5, 0.0, 0.5])
    assert np.isnan(yt[0, :, 1]).all()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_non_contiguous_input(xp, rng, dtype):
    base = random_array(rng, (6, 5, 8), dtype, low=-3, high=3)
    x = xp.asarray(base)[:, ::2, 1::2].transpose(2, 0, 1)  # strided and transposed
    expected_x = np.ascontiguousarray(base[:, ::2, 1::2].transpose(2, 0, 1)).astype(np.float64)
    for axis in (0, 1, 2):
        assert_close(softmax(x, axis=axis), ref.softmax(expected_x, axis), dtype, what=f"axis {axis}")
        y = ref.softmax(expected_x, axis).astype(dtype)
        dy = random_array(rng, y.shape, dtype)
        strided_dy = xp.asarray(np.asfortranarray(dy))
        assert_close(softmax_backward(strided_dy, xp.asarray(y), axis=axis),
                     ref.softmax_backward(dy.astype(np.float64), y.astype(np.float64), axis), dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape,axis", [((4, 1024), 1), ((3, 8, 40), 1)])
def test_misaligned_views(xp, rng, dtype, shape, axis):
    """A contiguous view that starts one element into its buffer cannot take 16-byte packs."""
    size = int(np.prod(shape))
    flat = random_array(rng, (size + 1,), dtype, low=-4, high=4)
    x = xp.asarray(flat)[1:].reshape(shape)
    expected = np.ascontiguousarray(flat[1:].reshape(shape)).astype(np.float64)
    assert_close(softmax(x, axis=axis), ref.softmax(expected, axis), dtype, what="softmax")
    y = ref.softmax(expected, axis).astype(dtype)
    dy_flat = random_array(rng, (size + 1,), dtype)
    dy = xp.asarray(dy_flat)[1:].reshape(shape)
    assert_close(log_softmax_backward(dy, xp.asarray(y), axis=axis),
                 ref.log_softmax_backward(dy_flat[1:].reshape(shape).astype(np.float64),
                                          y.astype(np.float64), axis), dtype)


@pytest.mark.parametrize("shape,axis", [((0, 5), -1), ((3, 0), -1), ((3, 0, 2), 0)])
def test_empty(xp, shape, axis):
    x = xp.ones(shape, np.float32)
    for f in (softmax, log_softmax):
        y = f(x, axis=axis)
        assert y.shape == shape and y.dtype == np.float32
    assert softmax_backward(x, x, axis=axis).shape == shape
    assert log_softmax_backward(x, x, axis=axis).shape == shape


def test_zero_output_gradient(xp, rng):
    y = xp.asarray(ref.softmax(random_array(rng, (3, 4)), 1))
    for backward in (softmax_backward, log_softmax_backward):
        dx = backward(None, y, axis=1)
        assert dx.shape == (3, 4) and not bool((dx != 0).any())


@SETTINGS
@given(problem=softmax_problems())
def test_hypothesis_shapes_and_axes(xp, problem):
    shape, axis = problem
    rng = np.random.default_rng(sum(shape) + axis)
    for dtype in (np.float32, np.float64):
        x = random_array(rng, shape, dtype, low=-6, high=6)
        expected = softmax_by_rows(x, axis)
        assert_close(softmax(xp.asarray(x), axis=axis), expected, dtype, what="softmax")
        assert_close(log_softmax(xp.asarray(x), axis=axis), np.log(expected), dtype, what="log_softmax")
        dy = random_array(rng, shape, dtype)
        y = expected.astype(dtype)
        assert_close(softmax_backward(xp.asarray(dy), xp.asarray(y), axis=axis),
                     y * (dy - np.sum(dy * y, axis=axis, keepdims=True, dtype=np.float64)), dtype)


# ---- bad inputs --------------------------------------------------------------

@pytest.mark.parametrize("f", [softmax, log_softmax])
def test_axis_out_of_range(f):
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        f(np.ones((2, 3)), axis=2)
    with pytest.raises(ValueError, match="axis -3"):
        f(np.ones((2, 3)), axis=-3)


@pytest.mark.parametrize("f", [softmax_backward, log_softmax_backward])
def test_backward_axis_out_of_range(f):
    with pytest.raises(ValueError, match="axis 5"):
        f(np.ones((2, 3)), np.ones((2, 3)), axis=5)


@pytest.mark.parametrize("axis", [1.0, None, "1", True])
def test_axis_not_an_int(axis):
    with pytest.raises(TypeError, match="axis must be an int"):
        softmax(np.ones((2, 3)), axis=axis)


def test_zero_dimensional_input():
    with pytest.raises(ValueError, match="x must have at least 1 dimension"):
        softmax(np.array(1.0))
    with pytest.raises(ValueError, match="y must have at least 1 dimension"):
        softmax_backward(np.array(1.0), np.array(1.0))


def test_integer_dtype():
    with pytest.raises(TypeError, match="x must have a floating dtype"):
        log_softmax(np.ones((2, 3), np.int32))
    with pytest.raises(TypeError, match="dy must have a floating dtype"):
        softmax_backward(np.ones((2, 3), np.int64), np.ones((2, 3)))


def test_not_an_array():
    with pytest.raises(TypeError, match="x must be a numpy.ndarray or cupy.ndarray"):
        softmax([1.0, 2.0])


def test_mismatched_dtypes():
    with pytest.raises(TypeError, match="y has dtype float64 but dy has dtype float32"):
        softmax_backward(np.ones((2, 3), np.float32), np.ones((2, 3)))


def test_mismatched_shapes():
    with pytest.raises(ValueError, match=r"dy must have shape \(2, 3\)"):
        log_softmax_backward(np.ones((3, 2)), np.ones((2, 3)))


def test_mixing_numpy_and_cupy(gpu):
    with pytest.raises(TypeError, match="cannot mix NumPy and CuPy arrays: dy is NumPy but y is CuPy"):
        softmax_backward(np.ones((2, 3)), gpu.ones((2, 3)))


@pytest.mark.gpu
@pytest.mark.parametrize("log", [False, True])
def test_repeated_gpu_calls_reuse_the_validated_plan_and_still_check(gpu, rng, log):
    from dnnprims import softmaxes
    forward = softmaxes.log_softmax if log else softmaxes.softmax
    backward = softmaxes.log_softmax_backward if log else softmaxes.softmax_backward
    x = random_array(rng, (5, 13, 7), np.float32)
    X = gpu.asarray(x)
    first = forward(X, axis=1)
    entries = len(softmaxes._MEMO._entries)
    again = forward(X, axis=1)
    assert len(softmaxes._MEMO._entries) == entries and gpu.array_equal(first, again)
    assert_close(again, forward(x.astype(np.float64), axis=1), np.float32)
    with pytest.raises(TypeError, match="axis"):
        forward(X, axis=True)
    with pytest.raises(ValueError, match="axis"):
        forward(X, axis=3)
    dy = gpu.asarray(random_array(rng, x.shape, np.float32))
    for _ in range(2):
        dx = backward(dy, again, axis=1)
    y64 = forward(x.astype(np.float64), axis=1)
    assert_close(dx, backward(dy.get().astype(np.float64), y64, axis=1), np.float32)
    with pytest.raises(ValueError, match="dy"):
        backward(dy[:, :-1], again, axis=1)


# ---------------------------------------------------------------------- review6g: the user's side (CPU)

@pytest.mark.parametrize("call,match", [
    (lambda x: softmax(None), "x must be a numpy.ndarray or cupy.ndarray, got None"),
    (lambda x: log_softmax(None, axis=0), "x must be a numpy.ndarray or cupy.ndarray, got None"),
    (lambda x: softmax_backward(x, None), "y must be a numpy.ndarray or cupy.ndarray, got None"),
    (lambda x: log_softmax_backward(None, None), "y must be a numpy.ndarray or cupy.ndarray, got None"),
])
def test_none_for_a_required_array_names_it(call, match):
    """A None in place of a required array is a TypeError naming it (was AttributeError)."""
    with pytest.raises(TypeError, match=match):
        call(np.ones((2, 3), np.float32))
