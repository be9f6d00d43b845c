"""Pooling: the reference against loops and hand-computed cases, finite
differences and the adjoint identity; both paths against the reference; bad inputs."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from dnnprims import _dtypes, pool, pool_backward
from dnnprims.reference import pooling as reference
from dnnprims.testing.strategies import pool_problems
from dnnprims.testing.tolerances import assert_close

from conftest import FLOAT_DTYPES, random_array

HYPOTHESIS = settings(max_examples=30, deadline=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture])


# ---------------------------------------------------------------------- independent loops

def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def loop_pool(x, window, stride=None, padding=0, mode="max", count_include_pad=True):
    """NCHW pooling as explicit loops, PyTorch's kernel written out; also returns
    the selected (h, w) of every max window."""
    (kh, kw), (ph, pw) = _pair(window), _pair(padding)
    sh, sw = _pair(window) if stride is None else _pair(stride)
    n, c, h, w = x.shape
    ho, wo = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    y = np.zeros((n, c, ho, wo))
    where = {}
    for b in range(n):
        for ch in range(c):
            for oh in range(ho):
                for ow in range(wo):
                    hs, ws = oh * sh - ph, ow * sw - pw
                    he, we = min(hs + kh, h + ph), min(ws + kw, w + pw)
                    pool_size = (he - hs) * (we - ws)
                    h0, w0, h1, w1 = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
                    if mode == "max":
                        best, arg = -np.inf, (h0, w0)
                        for i in range(h0, h1):
                            for j in range(w0, w1):
                                v = x[b, ch, i, j]
                                if v > best or np.isnan(v):
                                    best, arg = v, (i, j)
                        y[b, ch, oh, ow] = best
                        where[b, ch, oh, ow] = arg
                    else:
                        total = x[b, ch, h0:h1, w0:w1].sum()
                        divisor = pool_size if count_include_pad else (h1 - h0) * (w1 - w0)
                        y[b, ch, oh, ow] = total / divisor
    return y, where


def loop_max_backward(dy, x, window, stride=None, padding=0):
    _, where = loop_pool(x, window, stride, padding, "max")
    dx = np.zeros(x.shape)
    for (b, ch, oh, ow), (i, j) in where.items():
        dx[b, ch, i, j] += dy[b, ch, oh, ow]
    return dx


def ref_pool(x, window, stride=None, padding=0, mode="max", count_include_pad=True, layout="NCHW"):
    return pool(x, window, mode=mode, stride=stride, padding=padding,
                count_include_pad=count_include_pad, layout=layout)


CONFIGS = [  # window, stride, padding: overlapping, non-overlapping, strided, rectangular
    (3, 2, 1), (2, None, 0), (3, 1, 1), (1, None, 0), ((3, 2), (2, 1), (1, 0)), (4, 3, 2)]


# ---------------------------------------------------------------------- reference vs hand and loops

def test_max_pool_4x4_by_hand():
    x = np.array([[1, 3, 2, 0],
                  [4, 2, 9, 1],
                  [0, 5, 6, 6],
                  [7, 1, 6, 8]], dtype=np.float64)[None, None]
    y = pool(x, 2)
    np.testing.assert_array_equal(y[0, 0], [[4, 9], [7, 8]])
    dx = pool_backward(np.array([[[[1.0, 2.0], [3.0, 4.0]]]]), x, y, 2)
    np.testing.assert_array_equal(dx[0, 0], [[0, 0, 0, 0], [1, 0, 2, 0], [0, 0, 0, 0], [3, 0, 0, 4]])


def test_avg_pool_padding_divisor_by_hand():
    x = np.ones((1, 1, 2, 2))
    # 3x3 window, padding 1, stride 1: each window holds all 4 ones.
    np.testing.assert_allclose(pool(x, 3, mode="avg", stride=1, padding=1)[0, 0],
                               np.full((2, 2), 4 / 9))
    np.testing.assert_allclose(pool(x, 3, mode="avg", stride=1, padding=1,
                                    count_include_pad=False)[0, 0], np.ones((2, 2)))


def test_max_ties_go_to_first_and_nan_wins():
    x = np.array([[[[2.0, 2.0], [2.0, 2.0]]]])
    dx = pool_backward(np.ones((1, 1, 1, 1)), x, None, 2)
    np.testing.assert_array_equal(dx[0, 0], [[1, 0], [0, 0]])
    x = np.array([[[[1.0, np.nan], [5.0, np.nan]]]])
    y = pool(x, 2)
    assert np.isnan(y).all()
    dx = pool_backward(np.ones((1, 1, 1, 1)), x, y, 2)
    np.testing.assert_array_equal(dx[0, 0], [[0, 0], [0, 1]])  # the last NaN, as PyTorch


def test_all_negative_infinity_window_routes_to_first_real_element():
    x = np.full((1, 1, 3, 3), -np.inf)
    dx = pool_backward(np.ones((1, 1, 2, 2)), x, None, 3, stride=2, padding=1)
    expect = np.zeros((3, 3))
    expect[0, 0] = 1
    expect[0, 1] = expect[1, 0] = expect[1, 1] = 1
    np.testing.assert_array_equal(dx[0, 0], expect)


@pytest.mark.parametrize("window,stride,padding", CONFIGS)
@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("mode", ["max", "avg"])
def test_reference_matches_loops(rng, mode, count_include_pad, window, stride, padding):
    x = random_array(rng, (2, 3, 7, 6))
    expect, _ = loop_pool(x, window, stride, padding, mode, count_include_pad)
    y = ref_pool(x, window, stride, padding, mode, count_include_pad)
    np.testing.assert_allclose(y, expect, rtol=1e-13, atol=0)


@pytest.mark.parametrize("window,stride,padding", CONFIGS)
def test_reference_max_backward_matches_loops_with_ties(rng, window, stride, padding):
    x = rng.integers(-2, 3, size=(2, 2, 7, 5)).astype(np.float64)  # many ties
    y = ref_pool(x, window, stride, padding)
    dy = rng.integers(-3, 4, size=y.shape).astype(np.float64)
    dx = pool_backward(dy, x, y, window, stride=stride, padding=padding)
    np.testing.assert_array_equal(dx, loop_max_backward(dy, x, window, stride, padding))


@pytest.mark.parametrize("window,stride,padding", CONFIGS)
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_backward_is_the_adjoint(rng, window, stride, padding, count_include_pad):
    x = random_array(rng, (2, 3, 7, 6))
    opts = dict(mode="avg", stride=stride, padding=padding, count_include_pad=count_include_pad)
    y = pool(x, window, **opts)
    dy = random_array(rng, y.shape)
    dx = pool_backward(dy, x, None, window, **opts)
    np.testing.assert_allclose(np.vdot(y, dy), np.vdot(x, dx), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("window,stride,padding", CONFIGS[:3])
def test_backward_by_finite_differences(rng, mode, window, stride, padding):
    x = random_array(rng, (1, 2, 5, 6))  # distinct values: max is differentiable
    opts = dict(mode=mode, stride=stride, padding=padding)
    dy = random_array(rng, pool(x, window, **opts).shape)
    dx = pool_backward(dy, x, None, window, **opts)
    h = 1e-6
    numeric = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        xp_, xm = x.copy(), x.copy()
        xp_[idx] += h
        xm[idx] -= h
        numeric[idx] = np.vdot(pool(xp_, window, **opts) - pool(xm, window, **opts), dy) / (2 * h)
    np.testing.assert_allclose(dx, numeric, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("mode", ["max", "avg"])
def test_nhwc_is_the_transposed_nchw(rng, mode):
    x = random_array(rng, (2, 3, 7, 5))
    y = pool(x, 3, mode=mode, stride=2, padding=1)
    y_nhwc = pool(x.transpose(0, 2, 3, 1), 3, mode=mode, stride=2, padding=1, layout="NHWC")
    np.testing.assert_array_equal(y_nhwc, y.transpose(0, 2, 3, 1))
    dy = random_array(rng, y.shape)
    dx = pool_backward(dy, x, y, 3, mode=mode, stride=2, padding=1)
    dx_nhwc = pool_backward(dy.transpose(0, 2, 3, 1), x.transpose(0, 2, 3, 1), None, 3, mode=mode,
                            stride=2, padding=1, layout="NHWC")
    np.testing.assert_array_equal(dx_nhwc, dx.transpose(0, 2, 3, 1))


@HYPOTHESIS
@given(problem=pool_problems())
def test_reference_matches_loops_hypothesis(problem):
    rng = np.random.default_rng(0)
    layout = problem.pop("layout")
    x_shape = problem.pop("x_shape")
    x = random_array(rng, x_shape)
    x_nchw = x if layout == "NCHW" else x.transpose(0, 3, 1, 2)
    expect, _ = loop_pool(x_nchw, problem["window"], problem["stride"], problem["padding"],
                          problem["mode"], problem["count_include_pad"])
    y = pool(x, layout=layout, **problem)
    y_nchw = y if layout == "NCHW" else y.transpose(0, 3, 1, 2)
    np.testing.assert_allclose(y_nchw, expect, rtol=1e-13)


# ---------------------------------------------------------------------- both paths vs the reference

def _check_against_reference(xp, x, dy, window, opts, layout):
    """Run on xp with storage-dtype inputs; compare with the float64 reference."""
    dtype = x.dtype
    y = pool(xp.asarray(x), window, layout=layout, **opts)
    dx = pool_backward(xp.asarray(dy), xp.asarray(x), y, window, layout=layout, **opts)
    assert y.dtype == dtype and dx.dtype == dtype and type(y) is type(xp.asarray(x))
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    assert_close(y, pool(x64, window, layout=layout, **opts), dtype, what="pool")
    assert_close(dx, pool_backward(dy64, x64, None, window, layout=layout, **opts), dtype,
                 what="pool_backward")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("window,stride,padding", CONFIGS)
def test_matches_reference(xp, rng, dtype, layout, mode, window, stride, padding):
    opts = dict(mode=mode, stride=stride, padding=padding, count_include_pad=mode == "avg")
    shape = (2, 3, 13, 7) if layout == "NCHW" else (2, 13, 7, 3)
    x = random_array(rng, shape, dtype)
    y_shape = pool(x.astype(np.float64), window, layout=layout, **opts).shape
    _check_against_reference(xp, x, random_array(rng, y_shape, dtype), window, opts, layout)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("window,stride,padding", CONFIGS)
def test_avg_count_exclude_pad_matches_reference(xp, rng, dtype, layout, window, stride, padding):
    opts = dict(mode="avg", stride=stride, padding=padding, count_include_pad=False)
    shape = (1, 3, 7, 13) if layout == "NCHW" else (1, 7, 13, 3)
    x = random_array(rng, shape, dtype)
    y_shape = pool(x.astype(np.float64), window, layout=layout, **opts).shape
    _check_against_reference(xp, x, random_array(rng, y_shape, dtype), window, opts, layout)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("window,stride,padding", CONFIGS)
def test_max_ties_match_reference_exactly(xp, rng, dtype, layout, window, stride, padding):
    """Integer-valued data: many ties, and every sum is exact in every dtype."""
    shape = (2, 3, 7, 13) if layout == "NCHW" else (2, 7, 13, 3)
    x = rng.integers(-2, 3, size=shape).astype(dtype)
    opts = dict(stride=stride, padding=padding, layout=layout)
    y = pool(xp.asarray(x), window, **opts)
    dy = rng.integers(-4, 5, size=y.shape).astype(dtype)
    dx = pool_backward(xp.asarray(dy), xp.asarray(x), y, window, **opts)
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    np.testing.assert_array_equal(_host(y).astype(np.float64), pool(x64, window, **opts))
    np.testing.assert_array_equal(_host(dx).astype(np.float64),
                                  pool_backward(dy64, x64, None, window, **opts))


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


@pytest.mark.parametrize("mode", ["max", "avg"])
def test_nan_propagates(xp, mode):
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    x[0, 0, 1, 1] = np.nan
    y = _host(pool(xp.asarray(x), 2, mode=mode))
    assert np.isnan(y[0, 0, 0, 0]) and not np.isnan(y[0, 0, 1:, 1:]).any()
    dx = _host(pool_backward(xp.asarray(np.ones(y.shape, np.float32)), xp.asarray(x), None, 2,
                             mode=mode))
    expect = pool_backward(np.ones(y.shape), x.astype(np.float64), None, 2, mode=mode)
    np.testing.assert_array_equal(dx, expect)


@HYPOTHESIS
@given(problem=pool_problems())
def test_matches_reference_hypothesis(xp, problem):
    rng = np.random.default_rng(1)
    x = random_array(rng, problem.pop("x_shape"), np.float32)
    window, layout = problem.pop("window"), problem.pop("layout")
    y_shape = pool(x.astype(np.float64), window, layout=layout, **problem).shape
    _check_against_reference(xp, x, random_array(rng, y_shape, np.float32), window, problem, layout)


@pytest.mark.parametrize("mode", ["max", "avg"])
def test_non_contiguous_input(xp, rng, mode):
    base = random_array(rng, (2, 7, 9, 6), np.float32)
    x = xp.asarray(base).transpose(0, 3, 1, 2)  # NCHW view of NHWC memory
    y = pool(x, 3, mode=mode, stride=2, padding=1)
    x_copy = np.ascontiguousarray(base.transpose(0, 3, 1, 2))
    assert_close(y, pool(x_copy.astype(np.float64), 3, mode=mode, stride=2, padding=1), np.float32)
    dy = xp.asarray(random_array(rng, y.shape[::-1], np.float32)).T
    dx = pool_backward(dy, x, y, 3, mode=mode, stride=2, padding=1)
    assert_close(dx, pool_backward(_host(dy).astype(np.float64), x_copy.astype(np.float64), None, 3,
                                   mode=mode, stride=2, padding=1), np.float32)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("shape,window,stride,padding", [
    ((2, 3, 70, 120), 3, 2, 1),   # several row tiles per plane, with halo rows
    ((1, 2, 9, 301), (3, 2), (1, 2), (1, 0)),  # rows misaligned for 16-byte loads
    ((2, 5, 7, 7), 7, 1, 0),      # whole-plane window: the global path
    ((3, 2, 4, 9), (4, 9), 2, 0),  # rectangular whole-plane window
])
def test_fast_paths_match_reference(xp, rng, dtype, mode, shape, window, stride, padding):
    """Shapes that reach the tiled and global NCHW kernels in their less common corners."""
    opts = dict(mode=mode, stride=stride, padding=padding, count_include_pad=mode == "avg")
    x = random_array(rng, shape, dtype)
    y_shape = pool(x.astype(np.float64), window, **opts).shape
    _check_against_reference(xp, x, random_array(rng, y_shape, dtype), window, opts, "NCHW")


@pytest.mark.parametrize("window,stride,padding", [(3, 2, 1), ((5, 4), 1, 0)])
def test_fast_paths_ties_and_nan_exactly(xp, rng, window, stride, padding):
    """Integer data (many ties, all -inf planes, NaNs) on the tiled and global paths."""
    x = rng.integers(-2, 3, size=(3, 4, 5, 4)).astype(np.float32)
    x[0, 1] = -np.inf
    x[1, 2, 1, 1] = x[1, 2, 3, 2] = np.nan
    opts = dict(stride=stride, padding=padding)
    y = pool(xp.asarray(x), window, **opts)
    dy = rng.integers(-4, 5, size=y.shape).astype(np.float32)
    dx = pool_backward(xp.asarray(dy), xp.asarray(x), y, window, **opts)
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    np.testing.assert_array_equal(_host(y).astype(np.float64), pool(x64, window, **opts))
    np.testing.assert_array_equal(_host(dx).astype(np.float64),
                                  pool_backward(dy64, x64, None, window, **opts))


# Direct paths (v3): NCHW rows kernels (CASE 1 = 3x3/2, CASE 2 = 2x2/2, 0 = any),
# NHWC kernels vectorised along C (C % VEC == 0) or not; max backward with
# overlap (argmax bytes + gather), without overlap (argmax recomputed), and
# windows of more than 256 elements with overlap (the tiled / general fallback).
DIRECT_CONFIGS = [
    (3, 2, 1), (3, 2, 0),          # CASE 1, with and without padding
    (2, 2, 0), (2, 2, 1),          # CASE 2
    (3, 1, 1), ((3, 2), (2, 1), (1, 0)),  # generic, overlapping
    (2, 3, 0), (1, 1, 0),          # generic, no overlap (stride > window, 1x1)
    ((17, 16), 1, (8, 0)),         # overlap, 272-element windows: not the byte path
]
DIRECT_SIZES = [(1, 1), (3, 7), (7, 13), (13, 3), (20, 150)]


def _fresh_plans(monkeypatch):
    """Forget the memoised GPU calls (their launches), so a patched switch takes effect."""
    from dnnprims import _validate, pooling
    monkeypatch.setattr(pooling, "_MEMO", _validate.CallMemo())


def _direct_shape(layout, c, hw):
    return (2, c, *hw) if layout == "NCHW" else (2, *hw, c)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout,c", [("NCHW", 3), ("NHWC", 3), ("NHWC", 16)])
@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("window,stride,padding", DIRECT_CONFIGS)
@pytest.mark.parametrize("rows_backward", [False, True])
def test_direct_paths_match_reference(xp, rng, monkeypatch, rows_backward, dtype, layout, c, mode,
                                      window, stride, padding):
    from dnnprims import pooling
    monkeypatch.setattr(pooling, "ROWS_BACKWARD", rows_backward)
    _fresh_plans(monkeypatch)
    opts = dict(mode=mode, stride=stride, padding=padding, count_include_pad=mode == "avg")
    kh, kw = (window, window) if isinstance(window, int) else window
    ph, pw = (padding, padding) if isinstance(padding, int) else padding
    for hw in DIRECT_SIZES:
        if hw[0] + 2 * ph < kh or hw[1] + 2 * pw < kw:
            continue
        x = random_array(rng, _direct_shape(layout, c, hw), dtype)
        y_shape = pool(x.astype(np.float64), window, layout=layout, **opts).shape
        _check_against_reference(xp, x, random_array(rng, y_shape, dtype), window, opts, layout)


@pytest.mark.parametrize("layout,c", [("NCHW", 2), ("NHWC", 8), ("NHWC", 5)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("window,stride,padding", DIRECT_CONFIGS)
@pytest.mark.parametrize("rows_backward", [False, True])
def test_direct_paths_ties_and_nan_exactly(xp, rng, monkeypatch, rows_backward, layout, c, dtype, window,
                                           stride, padding):
    """Integer data (ties, all -inf planes, NaNs): the argmax bytes, the recomputed
    argmax and the vector lanes pick exactly the reference's element."""
    from dnnprims import pooling
    monkeypatch.setattr(pooling, "ROWS_BACKWARD", rows_backward)
    _fresh_plans(monkeypatch)
    shape = _direct_shape(layout, c, (13, 21))
    x = rng.integers(-2, 3, size=shape).astype(dtype)
    if layout == "NCHW":
        x[0, 1] = -np.inf
        x[1, 0, 1, 1] = x[1, 0, 3, 2] = np.nan
    else:
        x[0, :, :, 1] = -np.inf
        x[1, 1, 1, 0] = x[1, 3, 2, 0] = np.nan
    opts = dict(stride=stride, padding=padding, layout=layout)
    y = pool(xp.asarray(x), window, **opts)
    dy = rng.integers(-4, 5, size=y.shape).astype(dtype)
    dx = pool_backward(xp.asarray(dy), xp.asarray(x), y, window, **opts)
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    np.testing.assert_array_equal(_host(y).astype(np.float64), pool(x64, window, **opts))
    np.testing.assert_array_equal(_host(dx).astype(np.float64),
                                  pool_backward(dy64, x64, None, window, **opts))


@pytest.mark.parametrize("mode", ["max", "avg"])
def test_nhwc_misaligned_falls_back_to_scalar_loads(xp, rng, mode):
    """An NHWC view starting 4 bytes into its buffer: C % VEC == 0 but the
    pointers are not 16-byte aligned, so the kernels must use VEC = 1."""
    base = xp.asarray(random_array(rng, (2 * 7 * 9 * 8 + 1,), np.float32))
    x = base[1:].reshape(2, 7, 9, 8)
    opts = dict(mode=mode, stride=2, padding=1, layout="NHWC")
    y = pool(x, 3, **opts)
    dbase = xp.asarray(random_array(rng, (y.size + 1,), np.float32))
    dy = dbase[1:].reshape(y.shape)
    dx = pool_backward(dy, x, y, 3, **opts)
    x64, dy64 = _host(x).astype(np.float64), _host(dy).astype(np.float64)
    assert_close(y, pool(x64, 3, **opts), np.float32, what="pool")
    assert_close(dx, pool_backward(dy64, x64, None, 3, **opts), np.float32, what="pool_backward")


@pytest.mark.parametrize("shape", [(3, 100, 7, 7), (2, 5, 8, 8), (1, 1, 1, 1), (2, 129, 3, 5), (1, 7, 9, 9)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("max_blocks", [None, 2])
def test_global_average_pool_small_planes(xp, rng, monkeypatch, shape, dtype, max_blocks):
    """Whole-plane average pooling: planes of up to 64 values are staged many to a
    block (several blocks, a partial last block, and the grid-stride loop when the
    grid is capped); 9x9 planes and float64 take the warp-per-plane kernel."""
    from dnnprims import pooling
    if max_blocks is not None:
        monkeypatch.setattr(pooling, "_MAX_ITEMS_BLOCKS", max_blocks)
        _fresh_plans(monkeypatch)
    x = random_array(rng, shape, dtype)
    window = shape[2:]
    got = pool(xp.asarray(x), window, mode="avg")
    assert_close(got, pool(x.astype(np.float64), window, mode="avg"), dtype)


# NCHW 3x3 / stride 2 / padding 1, W a multiple of the 16-byte vector (8 elements
# covers every dtype): the vectorised pool_k3s2 kernels.  Heights 1, 3, 7, 13
# (odd: a last window with a padded bottom row) and even ones (last band partial).
K3S2_SIZES = [(1, 8), (3, 16), (7, 8), (13, 24), (2, 8), (14, 40), (20, 112)]


def _k3s2_expressions(shape, dtype, mode, layout="NCHW"):
    from dnnprims import pooling
    problem = pooling._check_problem(np.empty(shape, dtype), 3, mode, 2, 1, True, layout)
    return [pooling._make_plan(problem, d, True)[1] for d in ("forward", "backward")]


def test_k3s2_kernels_serve_their_problems_only():
    fwd, bwd = _k3s2_expressions((2, 3, 13, 24), np.float16, "max")
    # the 16-bit backward: pool_k3s2_backward_rolled on sm_90+ GPUs, pool_k3s2_backward elsewhere
    assert fwd.startswith("pool_k3s2_forward<half_t") and bwd.startswith("pool_k3s2_backward")
    assert "<half_t" in bwd
    fwd, bwd = _k3s2_expressions((2, 3, 13, 24), np.float32, "avg")
    assert fwd.startswith("pool_k3s2_forward<float") and not bwd.startswith("pool_k3s2")
    # W = 12: a whole number of float32 vectors but not of float16 ones
    assert _k3s2_expressions((1, 1, 5, 12), np.float32, "max")[0].startswith("pool_k3s2")
    assert not _k3s2_expressions((1, 1, 5, 12), np.float16, "max")[0].startswith("pool_k3s2")
    assert not _k3s2_expressions((1, 1, 5, 14), np.float32, "max")[0].startswith("pool_k3s2")


def test_k2s2_avg_backward_kernel_serves_its_problems_only():
    from dnnprims import pooling

    def backward_expr(shape, dtype, mode, window=2, stride=2, padding=0):
        problem = pooling._check_problem(np.empty(shape, dtype), window, mode, stride, padding, True,
                                         "NCHW")
        return pooling._make_plan(problem, "backward", True)[1]
    assert backward_expr((2, 3, 7, 16), np.float16, "avg").startswith("pool_k2s2_avg_backward<half_t")
    assert backward_expr((2, 3, 7, 4), np.float64, "avg").startswith("pool_k2s2_avg_backward<double")
    assert not backward_expr((2, 3, 7, 12), np.float16, "avg").startswith("pool_k2s2")
    assert not backward_expr((2, 3, 7, 16), np.float32, "max").startswith("pool_k2s2")
    assert not backward_expr((2, 3, 7, 16), np.float32, "avg", padding=1).startswith("pool_k2s2")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("hw", [(2, 8), (3, 16), (7, 8), (13, 24), (20, 40), (9, 112)])
@pytest.mark.parametrize("vector", [True, False])
def test_k2s2_avg_backward_matches_reference(xp, rng, monkeypatch, vector, dtype, hw):
    """Average 2x2 / 2 backward (odd heights: the last input row gets zeros)."""
    from dnnprims import pooling
    monkeypatch.setattr(pooling, "VECTOR_KERNELS", vector)
    _fresh_plans(monkeypatch)
    opts = dict(mode="avg", stride=2, padding=0)
    x = random_array(rng, (2, 3, *hw), dtype)
    y_shape = pool(x.astype(np.float64), 2, **opts).shape
    _check_against_reference(xp, x, random_array(rng, y_shape, dtype), 2, opts, "NCHW")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("mode,count_include_pad", [("max", True), ("avg", True), ("avg", False)])
@pytest.mark.parametrize("k3s2", [True, False])
def test_k3s2_paths_match_reference(xp, rng, monkeypatch, k3s2, dtype, mode, count_include_pad):
    from dnnprims import pooling
    monkeypatch.setattr(pooling, "VECTOR_KERNELS", k3s2)
    _fresh_plans(monkeypatch)
    opts = dict(mode=mode, stride=2, padding=1, count_include_pad=count_include_pad)
    for hw in K3S2_SIZES:
        x = random_array(rng, (2, 3, *hw), dtype)
        y_shape = pool(x.astype(np.float64), 3, **opts).shape
        _check_against_reference(xp, x, random_array(rng, y_shape, dtype), 3, opts, "NCHW")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("hw", K3S2_SIZES)
def test_k3s2_ties_and_nan_exactly(xp, rng, monkeypatch, dtype, hw):
    """Integer data (ties inside and across the vector and band seams, all -inf
    planes, NaNs, -0.0 against 0.0 in the argmax): the vectorised kernels pick the reference's element."""
    _fresh_plans(monkeypatch)
    _check_integer_data_exactly(xp, rng, _nchw_integer_data(rng, dtype, hw), dict(stride=2, padding=1))


def _nchw_integer_data(rng, dtype, hw):
    """(3, 4, *hw) integer data with ties, all -inf planes, NaNs, -0.0, +-inf mixes."""
    x = rng.integers(-1, 2, size=(3, 4, *hw)).astype(dtype)
    x[0, 1] = -np.inf
    x[1, 0, 0, :] = -0.0
    x[1, 2, hw[0] // 2, 3] = x[1, 2, hw[0] - 1, hw[1] - 1] = x[2, 3, 0, 0] = np.nan
    # +inf ties (first wins), windows mixing -inf and +inf, a plane of -inf with a few real values
    x[2, 0, 0, :4] = x[2, 0, hw[0] - 1, hw[1] - 3:] = np.inf
    x[2, 1, :, ::2] = -np.inf
    x[2, 1, hw[0] // 2, 1] = np.inf
    x[2, 2] = -np.inf
    x[2, 2, hw[0] - 1, hw[1] // 2] = x[2, 2, 0, hw[1] - 1] = 0.0
    return x


def _check_integer_data_exactly(xp, rng, x, opts):
    """Max pool 3x3 / 2 of integer-valued x and dy: y and dx equal the reference's exactly."""
    y = pool(xp.asarray(x), 3, **opts)
    dy = rng.integers(-4, 5, size=y.shape).astype(x.dtype)
    dx = pool_backward(xp.asarray(dy), xp.asarray(x), y, 3, **opts)
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    np.testing.assert_array_equal(_host(y).astype(np.float64), pool(x64, 3, **opts))
    np.testing.assert_array_equal(_host(dx).astype(np.float64),
                                  pool_backward(dy64, x64, None, 3, **opts))


def test_k3s2_misaligned_falls_back(xp, rng):
    """x starting 4 bytes into its buffer: W % VEC == 0 but the rows are not
    16-byte aligned, so the scalar paths must run (and agree)."""
    base = xp.asarray(random_array(rng, (2 * 3 * 7 * 16 + 1,), np.float32))
    x = base[1:].reshape(2, 3, 7, 16)
    y = pool(x, 3, stride=2, padding=1)
    dy = xp.asarray(random_array(rng, y.shape, np.float32))
    dx = pool_backward(dy, x, y, 3, stride=2, padding=1)
    x64, dy64 = _host(x).astype(np.float64), _host(dy).astype(np.float64)
    assert_close(y, pool(x64, 3, stride=2, padding=1), np.float32, what="pool")
    assert_close(dx, pool_backward(dy64, x64, None, 3, stride=2, padding=1), np.float32,
                 what="pool_backward")


# NHWC 3x3 / stride 2 / padding 1, C a multiple of the 16-byte vector: the
# column-rolling pool_nhwc_k3s2 kernels.  Odd and even H and W (a last window
# with a padded bottom row / right column, or a window-less last step that
# finishes the last odd column), 1 x 1, and widths across several segments.
NHWC_K3S2_SIZES = [(1, 1), (2, 3), (3, 7), (7, 13), (14, 14), (13, 20), (6, 35)]


def test_nhwc_k3s2_kernels_serve_their_problems_only():
    fwd, bwd = _k3s2_expressions((2, 13, 7, 16), np.float16, "max", "NHWC")
    assert fwd.startswith("pool_nhwc_k3s2_forward<half_t") and bwd.startswith("pool_nhwc_k3s2_backward<half_t")
    fwd, bwd = _k3s2_expressions((2, 13, 7, 4), np.float32, "avg", "NHWC")
    assert fwd.startswith("pool_nhwc_k3s2_forward<float") and not bwd.startswith("pool_nhwc_k3s2")
    # C = 12: a whole number of float32 vectors but not of float16 ones
    assert _k3s2_expressions((1, 5, 5, 12), np.float32, "max", "NHWC")[1].startswith("pool_nhwc_k3s2")
    assert not _k3s2_expressions((1, 5, 5, 12), np.float16, "max", "NHWC")[0].startswith("pool_nhwc_k3s2")
    assert not _k3s2_expressions((1, 5, 5, 6), np.float32, "max", "NHWC")[0].startswith("pool_nhwc_k3s2")
    from dnnprims import pooling
    other = pooling._check_problem(np.empty((1, 9, 9, 8), np.float32), 3, "max", 2, 0, True, "NHWC")
    assert not pooling._make_plan(other, "forward", True)[1].startswith("pool_nhwc_k3s2")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("mode,count_include_pad", [("max", True), ("avg", True), ("avg", False)])
@pytest.mark.parametrize("rows,cols", [(1, 8), (2, 8), (1, 1), (2, 3)])
def test_nhwc_k3s2_matches_reference(xp, rng, monkeypatch, dtype, mode, count_include_pad, rows, cols):
    """Every rows-per-thread choice and segment length (1: every step a segment
    seam; 3: seams inside the row)."""
    from dnnprims import pooling
    size = np.dtype(dtype).itemsize
    monkeypatch.setitem(pooling._NHWC_K3S2_FORWARD_ROWS, size, rows)
    monkeypatch.setitem(pooling._NHWC_K3S2_BACKWARD_ROWS, size, rows)
    monkeypatch.setattr(pooling, "_NHWC_K3S2_COLS", {"forward": cols, "backward": cols})
    _fresh_plans(monkeypatch)
    opts = dict(mode=mode, stride=2, padding=1, count_include_pad=count_include_pad)
    for hw, c in zip(NHWC_K3S2_SIZES, (8, 16, 8, 24, 8, 16, 8)):
        x = random_array(rng, (2, *hw, c), dtype)
        y_shape = pool(x.astype(np.float64), 3, layout="NHWC", **opts).shape
        _check_against_reference(xp, x, random_array(rng, y_shape, dtype), 3, opts, "NHWC")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("hw", NHWC_K3S2_SIZES)
@pytest.mark.parametrize("rows,cols", [(1, 8), (2, 3)])
def test_nhwc_k3s2_ties_and_nan_exactly(xp, rng, monkeypatch, dtype, hw, rows, cols):
    """Integer data (ties across columns, rows and segment seams, all -inf
    channels, NaNs, -0.0 against 0.0): the kernels pick the reference's element
    and sum each dx element's windows exactly."""
    from dnnprims import pooling
    size = np.dtype(dtype).itemsize
    monkeypatch.setitem(pooling._NHWC_K3S2_FORWARD_ROWS, size, rows)
    monkeypatch.setitem(pooling._NHWC_K3S2_BACKWARD_ROWS, size, rows)
    monkeypatch.setattr(pooling, "_NHWC_K3S2_COLS", {"forward": cols, "backward": cols})
    _fresh_plans(monkeypatch)
    _check_integer_data_exactly(xp, rng, _nhwc_integer_data(rng, dtype, hw),
                                dict(stride=2, padding=1, layout="NHWC"))


def _nhwc_integer_data(rng, dtype, hw):
    """(3, *hw, 8) integer data with ties, all -inf channels, NaNs, -0.0, +-inf mixes."""
    x = rng.integers(-1, 2, size=(3, *hw, 8)).astype(dtype)
    x[0, :, :, 1] = -np.inf
    x[1, 0, :, :] = -0.0
    x[1, hw[0] // 2, hw[1] - 1, 3] = x[1, hw[0] - 1, hw[1] // 2, 5] = x[2, 0, 0, 0] = np.nan
    # +inf ties, windows mixing -inf and +inf, a channel of -inf with a few real values
    x[2, 0, :3, 2] = x[2, hw[0] - 1, hw[1] - 1, 2] = np.inf
    x[2, ::2, :, 4] = -np.inf
    x[2, hw[0] // 2, 0, 4] = np.inf
    x[2, :, :, 6] = -np.inf
    x[2, hw[0] - 1, hw[1] // 2, 6] = x[2, 0, hw[1] - 1, 6] = -0.0
    return x


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("blocks", [1, 2, 3])
def test_k3s2_backward_blocks_variants(gpu, rng, monkeypatch, blocks, layout, dtype):
    """Every __launch_bounds__ choice of the R = 1 max backward kernels (fewer
    registers, spills): random data against the reference, integer data
    (ties, NaN, +-inf, -0.0) exactly, segment seams (NHWC cols 3 and 32)."""
    from dnnprims import pooling
    size = np.dtype(dtype).itemsize
    nchw = layout == "NCHW"
    assert blocks in pooling._BACKWARD_BLOCKS_CHOICES
    monkeypatch.setattr(pooling, "ROLLED_BACKWARD", False)
    monkeypatch.setattr(pooling, "SHUFFLE_BACKWARD", False)
    monkeypatch.setattr(pooling, "WALK_BACKWARD", False)
    monkeypatch.setitem(pooling._K3S2_BACKWARD_ROWS if nchw else pooling._NHWC_K3S2_BACKWARD_ROWS, size, 1)
    monkeypatch.setitem(pooling._K3S2_BACKWARD_BLOCKS if nchw else pooling._NHWC_K3S2_BACKWARD_BLOCKS,
                        size, blocks)
    for cols in ((32,) if nchw else (3, 32)):
        monkeypatch.setattr(pooling, "_NHWC_K3S2_COLS", {"forward": cols, "backward": cols})
        _fresh_plans(monkeypatch)
        for hw in (K3S2_SIZES[2:5] if nchw else NHWC_K3S2_SIZES[2:6]):
            shape = (2, 3, *hw) if nchw else (2, *hw, 8)
            bwd = _k3s2_expressions(shape, dtype, "max", layout)[1]
            assert bwd.startswith("pool_k3s2_backward<" if nchw else "pool_nhwc_k3s2_backward<")
            assert bwd.endswith(f", 1, {blocks}>")
            x = random_array(rng, shape, dtype)
            opts = dict(mode="max", stride=2, padding=1)
            y_shape = pool(x.astype(np.float64), 3, layout=layout, **opts).shape
            _check_against_reference(gpu, x, random_array(rng, y_shape, dtype), 3, opts, layout)
            data = _nchw_integer_data(rng, dtype, hw) if nchw else _nhwc_integer_data(rng, dtype, hw)
            _check_integer_data_exactly(gpu, rng, data, dict(stride=2, padding=1, layout=layout))


# (steps, blocks, hint, waves, shares) of pool_k3s2_backward_rolled: every compiled choice;
# the hint only where it is compiled; waves 1e-9: a grid of one block strides over all
# items; shares: both ROLLED_SHARES_* switches (the kernel's SHARES where compiled: two
# blocks, no hint, S 1 / 2, 2 for bfloat16 only; elsewhere SHARES 0, as _rolled_settings says)
_ROLLED_VARIANTS = [(s, b, False, None, 0) for s in (1, 2, 4) for b in (2, 3)] + [
    (s, 2, True, None, 0) for s in (1, 2, 4)] + [(1, 2, False, 1e-9, 0), (2, 2, False, 1e-9, 0),
                                                  (2, 2, False, 1, 0)] + [
    (s, 2, False, None, k) for s in (1, 2) for k in (1, 2)] + [(4, 2, False, None, 1),
    (2, 2, False, 1e-9, 1), (1, 2, False, 1, 2), (2, 3, False, None, 1), (2, 2, True, None, 2)]


@pytest.mark.parametrize("dtype", [p for p in FLOAT_DTYPES if np.dtype(p.values[0]).itemsize == 2])
@pytest.mark.parametrize("steps, blocks, hint, waves, shares", _ROLLED_VARIANTS)
def test_k3s2_backward_rolled_variants(gpu, rng, monkeypatch, steps, blocks, hint, waves, shares, dtype):
    """pool_k3s2_backward_rolled (NCHW 16-bit max 3x3 / 2 / 1 backward rolling
    down the plane), every steps / blocks / hint / shares choice and a one-block grid:
    odd and even heights, 1 and 2 rows, several segments (segment seams), random
    data against the reference, integer data (ties, NaN, +-inf, -0.0) exactly,
    and dx bitwise equal to pool_k3s2_backward's (also on the tail step's fast
    path, k3s2_tail_row_pairs, and its exact fallback)."""
    from dnnprims import pooling
    assert steps in pooling._ROLLED_STEPS_CHOICES and blocks in pooling._ROLLED_BLOCKS_CHOICES
    assert not hint or blocks == pooling._ROLLED_HINT_BLOCKS
    monkeypatch.setattr(pooling, "_ROLLED_STEPS", steps)
    monkeypatch.setattr(pooling, "_ROLLED_BLOCKS", blocks)
    monkeypatch.setattr(pooling, "_ROLLED_HINT", hint)
    monkeypatch.setattr(pooling, "_ROLLED_WAVES", waves)
    monkeypatch.setattr(pooling, "ROLLED_SHARES_HALF", shares)
    monkeypatch.setattr(pooling, "ROLLED_SHARES_BFLOAT16", shares)
    monkeypatch.setattr(pooling, "ROLLED_BFLOAT16", None)
    t = "bfloat16_t" if np.dtype(dtype) == _dtypes.BFLOAT16 else "half_t"
    # the kernel's SHARES: the switch where compiled (two blocks, no hint, S 1 / 2, the type's choices), else 0
    k = (shares if shares in pooling._ROLLED_SHARES_CHOICES[t] and blocks == 2 and not hint
         and steps in pooling._ROLLED_SHARES_STEPS else 0)
    opts = dict(mode="max", stride=2, padding=1)
    for hw in K3S2_SIZES + [(30, 24), (57, 16), (60, 8), (57, 64)]:  # (57, 64): > 256 items
        shape = (2, 3, *hw)
        monkeypatch.setattr(pooling, "ROLLED_BACKWARD", True)
        _fresh_plans(monkeypatch)
        bwd = _k3s2_expressions(shape, dtype, "max")[1]
        assert bwd.startswith("pool_k3s2_backward_rolled<")
        assert bwd.endswith(f", {steps}, {blocks}, {'true' if hint else 'false'}, {k}>")
        x = random_array(rng, shape, dtype)
        y_shape = pool(x.astype(np.float64), 3, **opts).shape
        dy = random_array(rng, y_shape, dtype)
        _check_against_reference(gpu, x, dy, 3, opts, "NCHW")
        data = _nchw_integer_data(rng, dtype, hw)
        _check_integer_data_exactly(gpu, rng, data, dict(stride=2, padding=1))
        # NaN in the tail steps' windows (x rows 2 oh_end - 1 .. 2 oh_end + 1 for every
        # segment length: rows 1 and 3 mod 4) and a NaN column: their exact fallback
        data[0, 0, 1::4, :] = data[0, 3, 3::4, 1::3] = data[1, 1, :, hw[1] // 2] = np.nan
        _check_integer_data_exactly(gpu, rng, data, dict(stride=2, padding=1))
        got = _host(pool_backward(gpu.asarray(dy), gpu.asarray(x), None, 3, **opts))
        monkeypatch.setattr(pooling, "ROLLED_BACKWARD", False)
        _fresh_plans(monkeypatch)
        want = _host(pool_backward(gpu.asarray(dy), gpu.asarray(x), None, 3, **opts))
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_rolled_settings_by_type(monkeypatch):
    """_rolled_settings: the SHARES switch by type where that kernel is compiled (two blocks
    per SM, no hint; 2 for bfloat16 only), else 0; ROLLED_BFLOAT16 overrides bfloat16's
    steps and waves only; every expression it can make is declared in the family."""
    from dnnprims import pooling
    for name, value in (("_ROLLED_STEPS", 2), ("_ROLLED_WAVES", None), ("_ROLLED_BLOCKS", 2),
                        ("_ROLLED_HINT", False), ("ROLLED_SHARES_HALF", 1), ("ROLLED_SHARES_BFLOAT16", 2),
                        ("ROLLED_BFLOAT16", (1, 1))):
        monkeypatch.setattr(pooling, name, value)
    assert pooling._rolled_settings("half_t") == (2, None, 1)
    assert pooling._rolled_settings("bfloat16_t") == (1, 1, 2)
    declared = set(pooling.FAMILY.name_expressions)
    for problem_dtype in (np.float16, _dtypes.BFLOAT16):
        for shares in (0, 1, 2):
            monkeypatch.setattr(pooling, "ROLLED_SHARES_HALF", shares)
            monkeypatch.setattr(pooling, "ROLLED_SHARES_BFLOAT16", shares)
            for steps in pooling._ROLLED_STEPS_CHOICES:
                monkeypatch.setattr(pooling, "_ROLLED_STEPS", steps)
                monkeypatch.setattr(pooling, "ROLLED_BFLOAT16", None)
                t = "bfloat16_t" if problem_dtype == _dtypes.BFLOAT16 else "half_t"
                _, _, k = pooling._rolled_settings(t)
                assert k == (shares if shares in pooling._ROLLED_SHARES_CHOICES[t]
                             and steps in pooling._ROLLED_SHARES_STEPS else 0)
                for i in ("int", "long long"):
                    assert f"pool_k3s2_backward_rolled<{t}, {i}, {steps}, 2, false, {k}>" in declared
    monkeypatch.setattr(pooling, "ROLLED_SHARES_HALF", 2)  # not compiled for float16
    assert pooling._rolled_settings("half_t")[2] == 0
    monkeypatch.setattr(pooling, "ROLLED_SHARES_BFLOAT16", 1)
    monkeypatch.setattr(pooling, "_ROLLED_HINT", True)
    assert pooling._rolled_settings("bfloat16_t")[2] == 0
    monkeypatch.setattr(pooling, "_ROLLED_HINT", False)
    monkeypatch.setattr(pooling, "_ROLLED_BLOCKS", 3)
    assert pooling._rolled_settings("bfloat16_t")[2] == 0


@pytest.mark.parametrize("dtype", [p for p in FLOAT_DTYPES if np.dtype(p.values[0]).itemsize == 2])
def test_rolled_switches_key_the_calls(gpu, rng, monkeypatch, dtype):
    """ROLLED_SHARES_HALF / ROLLED_SHARES_BFLOAT16 / ROLLED_BFLOAT16 are in the call keys:
    switched between calls without forgetting the memo, each setting runs its own kernel
    (a new fast-table entry) and dx stays bitwise the same."""
    from dnnprims import pooling
    _fresh_plans(monkeypatch)
    monkeypatch.setattr(pooling, "ROLLED_BACKWARD", True)
    opts = dict(mode="max", stride=2, padding=1)
    shape = (2, 5, 30, 24)
    x = gpu.asarray(random_array(rng, shape, dtype))
    dy = gpu.asarray(random_array(rng, pool(_host(x).astype(np.float64), 3, **opts).shape, dtype))
    got, entries = [], []
    for half, bf16, override in ((0, 0, None), (1, 1, None), (1, 2, None), (1, 1, (1, 1e-9)), (0, 0, None)):
        monkeypatch.setattr(pooling, "ROLLED_SHARES_HALF", half)
        monkeypatch.setattr(pooling, "ROLLED_SHARES_BFLOAT16", bf16)
        monkeypatch.setattr(pooling, "ROLLED_BFLOAT16", override)
        got.append(_host(pool_backward(dy, x, None, 3, **opts)).view(np.uint16))
        entries.append(len(pooling._MEMO.fast))
    for g in got[1:]:
        np.testing.assert_array_equal(g, got[0])
    assert entries[:4] == [1, 2, 3, 4] and entries[4] == 4  # the last setting is the first's


@pytest.mark.parametrize("slots", [4, 8])
@pytest.mark.parametrize("blocks", [1, 2, 3])
def test_nhwc_k3s2_backward_shfl_variants(gpu, rng, monkeypatch, blocks, slots):
    """pool_nhwc_k3s2_backward_shfl (NHWC float32 max 3x3 / 2 / 1 backward, window
    rows exchanged by warp shuffles), every slots / blocks choice: edge sizes,
    several slot groups (group seams), segment seams (cols 3 and 32), random data
    against the reference, integer data (ties, NaN, +-inf, -0.0) exactly, and dx
    bitwise equal to pool_nhwc_k3s2_backward's."""
    from dnnprims import pooling
    assert slots in pooling._SHFL_SLOTS_CHOICES and blocks in pooling._SHFL_BLOCKS_CHOICES
    monkeypatch.setattr(pooling, "_SHFL_SLOTS", slots)
    monkeypatch.setattr(pooling, "_SHFL_BLOCKS", blocks)
    monkeypatch.setattr(pooling, "NHWC_WALK_BACKWARD", False)  # this kernel, not the walk
    monkeypatch.setitem(pooling._NHWC_K3S2_BACKWARD_ROWS, 4, 1)
    opts = dict(mode="max", stride=2, padding=1, layout="NHWC")
    for cols in (3, 32):
        monkeypatch.setattr(pooling, "_NHWC_K3S2_COLS", {"forward": cols, "backward": cols})
        for hw, c in zip(NHWC_K3S2_SIZES + [(30, 9), (57, 16)], (32, 64, 32, 96, 32, 64, 32, 32, 64)):
            shape = (2, *hw, c)
            monkeypatch.setattr(pooling, "SHUFFLE_BACKWARD", True)
            _fresh_plans(monkeypatch)
            bwd = _k3s2_expressions(shape, np.float32, "max", "NHWC")[1]
            assert bwd.startswith("pool_nhwc_k3s2_backward_shfl<") and bwd.endswith(f", {slots}, {blocks}>")
            x = random_array(rng, shape, np.float32)
            y_shape = pool(x.astype(np.float64), 3, **opts).shape
            dy = random_array(rng, y_shape, np.float32)
            _check_against_reference(gpu, x, dy, 3, {k: v for k, v in opts.items() if k != "layout"}, "NHWC")
            data = np.concatenate([_nhwc_integer_data(rng, np.float32, hw)] * (c // 8), axis=-1)
            _check_integer_data_exactly(gpu, rng, data, dict(stride=2, padding=1, layout="NHWC"))
            got = _host(pool_backward(gpu.asarray(dy), gpu.asarray(x), None, 3, **opts))
            monkeypatch.setattr(pooling, "SHUFFLE_BACKWARD", False)
            _fresh_plans(monkeypatch)
            assert _k3s2_expressions(shape, np.float32, "max", "NHWC")[1].startswith("pool_nhwc_k3s2_backward<")
            want = _host(pool_backward(gpu.asarray(dy), gpu.asarray(x), None, 3, **opts))
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


# (steps, blocks, prefetch, one-block grid) of pool_k3s2_backward_walk: every compiled
# choice, and a grid of one block striding over every item
_WALK_VARIANTS = [(s, b, pf, False) for s in (2, 4, 8) for b in (3, 4) for pf in (False, True)] + [
    (4, 4, True, True), (2, 3, False, True)]
# NCHW float32 (W a multiple of 4): odd / even heights, one and several segments of
# every S, W = 4 (one vector a row: no left / right neighbour), > 256 items
WALK_SIZES = K3S2_SIZES + [(4, 4), (5, 12), (17, 4), (30, 24), (33, 12), (57, 16), (60, 8), (57, 64)]


@pytest.mark.parametrize("steps, blocks, prefetch, one_block", _WALK_VARIANTS)
def test_k3s2_backward_walk_variants(gpu, rng, monkeypatch, steps, blocks, prefetch, one_block):
    """pool_k3s2_backward_walk (NCHW float32 max 3x3 / 2 / 1 backward walking down the
    plane one window row a step), every S / MINB / PF choice and a one-block grid: odd
    and even heights, segment seams, random data against the reference, integer data
    (ties, NaN, +-inf, -0.0) exactly, NaN rows at every step's rows, and dx bitwise
    equal to pool_k3s2_backward's (WALK_BACKWARD = False)."""
    from dnnprims import pooling
    assert steps in pooling._WALK_STEPS_CHOICES and blocks in pooling._WALK_BLOCKS_CHOICES
    monkeypatch.setattr(pooling, "_WALK_STEPS", steps)
    monkeypatch.setattr(pooling, "_WALK_BLOCKS", blocks)
    monkeypatch.setattr(pooling, "_WALK_PREFETCH", prefetch)
    _fresh_plans(monkeypatch)  # _MAX_ITEMS_BLOCKS is not in the call keys
    if one_block:
        monkeypatch.setattr(pooling, "_MAX_ITEMS_BLOCKS", 1)
    opts = dict(mode="max", stride=2, padding=1)
    for hw in WALK_SIZES:
        shape = (2, 3, *hw)
        monkeypatch.setattr(pooling, "WALK_BACKWARD", True)
        bwd = _k3s2_expressions(shape, np.float32, "max")[1]
        assert bwd.startswith("pool_k3s2_backward_walk<float, ")
        assert bwd.endswith(f", {steps}, {blocks}, {'true' if prefetch else 'false'}>")
        x = random_array(rng, shape, np.float32)
        y_shape = pool(x.astype(np.float64), 3, **opts).shape
        dy = random_array(rng, y_shape, np.float32)
        _check_against_reference(gpu, x, dy, 3, opts, "NCHW")
        data = _nchw_integer_data(rng, np.float32, hw)
        _check_integer_data_exactly(gpu, rng, data, dict(stride=2, padding=1))
        # NaN rows at each residue mod 4 (a step's top, mid and bottom rows, the tail
        # steps' rows of every S) and a NaN column
        data[0, 0, 1::4, :] = data[0, 3, 3::4, 1::3] = data[1, 1, 2::4, hw[1] // 2] = np.nan
        data[1, 3, ::4, :] = np.nan
        _check_integer_data_exactly(gpu, rng, data, dict(stride=2, padding=1))
        data_y_shape = pool(data.astype(np.float64), 3, **opts).shape
        for a, b in ((x, dy), (data, rng.integers(-4, 5, size=data_y_shape).astype(np.float32))):
            got = _host(pool_backward(gpu.asarray(b), gpu.asarray(a), None, 3, **opts))
            monkeypatch.setattr(pooling, "WALK_BACKWARD", False)
            assert _k3s2_expressions(shape, np.float32, "max")[1].startswith("pool_k3s2_backward<float, ")
            want = _host(pool_backward(gpu.asarray(b), gpu.asarray(a), None, 3, **opts))
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
            monkeypatch.setattr(pooling, "WALK_BACKWARD", True)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_walk_switches_key_the_calls_and_ties_are_deterministic(gpu, rng, monkeypatch, layout):
    """WALK_BACKWARD / _WALK_* are in the call keys: flipped between calls
    without forgetting the memo, each setting runs its own kernel (a new fast-table entry),
    dx is bitwise the same, and repeated calls on data full of ties give the same bits
    (every dx element written by one thread, sums in a fixed order: no atomics)."""
    from dnnprims import pooling
    _fresh_plans(monkeypatch)
    monkeypatch.setattr(pooling, "SHUFFLE_BACKWARD", True)
    monkeypatch.setattr(pooling, "_SHFL_BLOCKS", 2)
    monkeypatch.setattr(pooling, "NHWC_WALK_BACKWARD", False)  # the shfl kernel (the NHWC walk: its own test)
    opts = dict(mode="max", stride=2, padding=1, layout=layout)
    shape = (2, 5, 30, 24) if layout == "NCHW" else (2, 30, 24, 32)
    x = gpu.asarray(rng.integers(-1, 2, size=shape).astype(np.float32))  # ties everywhere
    y_shape = pool(_host(x).astype(np.float64), 3, **opts).shape
    dy = gpu.asarray(rng.integers(-4, 5, size=y_shape).astype(np.float32))
    want = pool_backward(dy.get().astype(np.float64), _host(x).astype(np.float64), None, 3, **opts)
    monkeypatch.setattr(pooling, "_SHFL_SLOTS", 8)
    settings = [(True, 4, 4, True), (False, 4, 4, True), (True, 2, 3, False), (True, 8, 4, True),
                (True, 4, 4, True)]
    got, entries = [], []
    for walk, steps, blocks, prefetch in settings:
        monkeypatch.setattr(pooling, "WALK_BACKWARD", walk)
        monkeypatch.setattr(pooling, "_WALK_STEPS", steps)
        monkeypatch.setattr(pooling, "_WALK_BLOCKS", blocks)
        monkeypatch.setattr(pooling, "_WALK_PREFETCH", prefetch)
        for _ in range(3):
            got.append(_host(pool_backward(dy, x, None, 3, **opts)).view(np.uint32))
        entries.append(len(pooling._MEMO.fast))
    for g in got[1:]:
        np.testing.assert_array_equal(g, got[0])
    np.testing.assert_array_equal(got[0].view(np.float32).astype(np.float64), want)
    assert entries[:4] == [1, 2, 3, 4] and entries[4] == 4  # the last setting is the first's


def test_walk_expressions_declared():
    """Every pool_k3s2_backward_walk expression the tables can ask for is in the
    family (no GPU needed: the plans are made on the CPU), and float32 NCHW max 3x3 / 2 / 1
    backward takes the walk by default, other types and modes do not."""
    from dnnprims import pooling
    declared = set(pooling.FAMILY.name_expressions)
    assert _k3s2_expressions((2, 3, 13, 24), np.float32, "max")[1] == (
        f"pool_k3s2_backward_walk<float, int, {pooling._WALK_STEPS}, {pooling._WALK_BLOCKS}, "
        f"{'true' if pooling._WALK_PREFETCH else 'false'}>")
    assert not _k3s2_expressions((2, 3, 13, 24), np.float64, "max")[1].startswith("pool_k3s2_backward_walk")
    assert not _k3s2_expressions((2, 3, 13, 24), np.float32, "avg")[1].startswith("pool_k3s2_backward_walk")
    for i in ("int", "long long"):
        for s in pooling._WALK_STEPS_CHOICES:
            for b in pooling._WALK_BLOCKS_CHOICES:
                for pf in ("false", "true"):
                    assert f"pool_k3s2_backward_walk<float, {i}, {s}, {b}, {pf}>" in declared


@pytest.mark.parametrize("shape", [(3, 100, 7, 7), (2, 5, 8, 8), (1, 1, 1, 1), (2, 3, 1, 1),
                                   (2, 129, 3, 5), (1, 7, 9, 9)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("max_blocks", [None, 1])
def test_global_average_pool_backward(xp, rng, monkeypatch, shape, dtype, max_blocks):
    """Whole-plane average backward: 16-byte runs of dx that span planes (7x7, 3x5,
    1x1: several planes in one vector), a partial last vector, a capped grid."""
    from dnnprims import pooling
    if max_blocks is not None:
        monkeypatch.setattr(pooling, "_MAX_ITEMS_BLOCKS", max_blocks)
        _fresh_plans(monkeypatch)
    x = random_array(rng, shape, dtype)
    dy = random_array(rng, shape[:2] + (1, 1), dtype)
    window = shape[2:]
    got = pool_backward(xp.asarray(dy), xp.asarray(x), None, window, mode="avg")
    assert_close(got, pool_backward(dy.astype(np.float64), x.astype(np.float64), None, window,
                                    mode="avg"), dtype)


def test_repeated_gpu_calls_reuse_the_validated_plan_and_still_check(gpu, rng):
    from dnnprims import pooling
    x = random_array(rng, (2, 3, 9, 16), np.float32)
    X = gpu.asarray(x)
    first = pool(X, 3, stride=2, padding=(1, 1))
    entries = len(pooling._MEMO._entries)
    again = pool(X, 3, stride=2, padding=(1, 1))
    assert len(pooling._MEMO._entries) == entries and gpu.array_equal(first, again)
    assert_close(again, pool(x.astype(np.float64), 3, stride=2, padding=1), np.float32)
    for kwargs, error, match in [(dict(stride=(2, True)), TypeError, "stride"),
                                 (dict(stride=2, padding=(1, True)), TypeError, "padding"),
                                 (dict(stride=2.0), TypeError, "stride"),
                                 (dict(stride=2, padding=1, mode="min"), ValueError, "mode"),
                                 (dict(stride=2, padding=1, count_include_pad=1), TypeError,
                                  "count_include_pad")]:
        with pytest.raises(error, match=match):
            pool(X, 3, **kwargs)
    with pytest.raises(TypeError, match="window"):
        pool(X, (3, True), stride=2)
    dy = gpu.asarray(random_array(rng, first.shape, np.float32))
    for _ in range(2):
        dx = pool_backward(dy, X, again, 3, stride=2, padding=1)
    assert_close(dx, pool_backward(dy.get().astype(np.float64), x.astype(np.float64), None, 3,
                                   stride=2, padding=1), np.float32)
    with pytest.raises(ValueError, match="dy"):
        pool_backward(dy[:, :-1], X, None, 3, stride=2, padding=1)
    with pytest.raises(TypeError, match="dy"):
        pool_backward(dy.astype(np.float64), X, None, 3, stride=2, padding=1)
    with pytest.raises(ValueError, match="y must have shape"):
        pool_backward(dy, X, again[:, :, :-1], 3, stride=2, padding=1)
    assert not pool_backward(None, X, None, 3, stride=2, padding=1).any()


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_empty_batch(xp, layout):
    shape = (0, 3, 5, 5)
    x = xp.zeros(shape, np.float32)
    y = pool(x, 2, layout=layout)
    assert y.shape == ((0, 3, 2, 2) if layout == "NCHW" else (0, 1, 2, 5))
    dx = pool_backward(y, x, y, 2, layout=layout)
    assert dx.shape == shape


def test_dy_none_is_zero_gradient(xp, rng):
    x = xp.asarray(random_array(rng, (1, 2, 4, 4)))
    dx = pool_backward(None, x, None, 2, mode="avg")
    assert dx.shape == x.shape and not _host(dx).any()


# ---------------------------------------------------------------------- bad inputs

def _x():
    return np.ones((1, 2, 5, 5), np.float32)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(window=0), ValueError, "window"),
    (dict(window=(2, 2, 2)), TypeError, "window"),
    (dict(window=2.0), TypeError, "window"),
    (dict(window=2, stride=0), ValueError, "stride"),
    (dict(window=2, stride=(1, -1)), ValueError, "stride"),
    (dict(window=2, padding=-1), ValueError, "padding"),
    (dict(window=3, padding=2), ValueError, "padding"),
    (dict(window=(3, 2), padding=(1, 2)), ValueError, "padding"),
    (dict(window=8, padding=1), ValueError, "window"),
    (dict(window=2, mode="min"), ValueError, "mode"),
    (dict(window=2, layout="NCWH"), ValueError, "layout"),
    (dict(window=2, count_include_pad="yes"), TypeError, "count_include_pad"),
])
def test_bad_options(kwargs, error, match):
    window = kwargs.pop("window")
    with pytest.raises(error, match=match):
        pool(_x(), window, **kwargs)
    with pytest.raises(error, match=match):
        pool_backward(None, _x(), None, window, **kwargs)


def test_bad_x():
    with pytest.raises(ValueError, match="x must be 4-D"):
        pool(np.ones((2, 5, 5), np.float32), 2)
    with pytest.raises(TypeError, match="x must have a floating dtype"):
        pool(np.ones((1, 1, 4, 4), np.int32), 2)
    with pytest.raises(TypeError, match="x must be a numpy.ndarray or cupy.ndarray"):
        pool([[[[1.0]]]], 1)


def test_bad_backward_arrays():
    x = _x()
    y = pool(x, 2)
    with pytest.raises(ValueError, match="dy must have shape"):
        pool_backward(np.ones((1, 2, 3, 3), np.float32), x, None, 2)
    with pytest.raises(ValueError, match="y must have shape"):
        pool_backward(y, x, np.ones((1, 2, 3, 3), np.float32), 2)
    with pytest.raises(TypeError, match="dy has dtype float64"):
        pool_backward(y.astype(np.float64), x, y, 2)
    with pytest.raises(TypeError, match="y has dtype float16"):
        pool_backward(y, x, y.astype(np.float16), 2)


def test_mixing_numpy_and_cupy(gpu):
    x = _x()
    y = pool(x, 2)
    with pytest.raises(TypeError, match="cannot mix NumPy and CuPy"):
        pool_backward(gpu.asarray(y), x, None, 2)


# ---------------------------------------------------------------------- review6g: the user's side (CPU)

@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape", [(1, 2, 0, 5), (1, 2, 5, 0)])
@pytest.mark.parametrize("mode", ["max", "avg"])
def test_zero_height_or_width_is_refused(layout, shape, mode):
    """With padding, a zero-height (or -width) input has windows of padding only: the
    NumPy path returned -inf (max) or NaN (avg without padding counted) and the GPU path
    an uninitialised array of that shape.  PyTorch refuses such inputs; so do we."""
    x = np.ones(shape if layout == "NCHW" else (shape[0], shape[2], shape[3], shape[1]), np.float32)
    with pytest.raises(ValueError, match="x must have a non-zero height and width"):
        pool(x, 2, mode=mode, padding=1, count_include_pad=False, layout=layout)
    with pytest.raises(ValueError, match="x must have a non-zero height and width"):
        pool_backward(None, x, None, 2, mode=mode, padding=1, layout=layout)
    # An empty batch or no channels stay fine (an empty result, as in NumPy).
    assert pool(np.ones((0, 2, 5, 5), np.float32), 2, mode=mode, layout=layout).size == 0


def test_none_x_names_the_argument():
    with pytest.raises(TypeError, match="x must be a numpy.ndarray or cupy.ndarray, got None"):
        pool(None, 2)
    with pytest.raises(TypeError, match="x must be a numpy.ndarray or cupy.ndarray, got None"):
        pool_backward(np.ones((1, 1, 2, 2), np.float32), None, None, 2)


# (slots, steps, blocks, prefetch, one-block grid) of pool_nhwc_k3s2_backward_walk: every
# compiled S x (MINB, PF) with 8 slots, most with 4, and grids of one block striding over every item
_NHWC_WALK_VARIANTS = [(8, s, b, pf, False) for s in (1, 2, 4) for b, pf in ((4, False), (3, False), (2, True))] + [
    (4, s, b, pf, False) for s, b, pf in ((1, 3, False), (2, 4, False), (2, 2, True), (4, 4, False))] + [
    (8, 2, 4, False, True), (8, 4, 2, True, True), (4, 2, 4, False, True)]
# (H, W, C) of the NHWC walk: edge sizes, one and several column groups (7 owned window
# columns a warp: W 13 .. 16 two groups, 29 .. 32 three; 3 owned with 4 slots), odd / even
# H and W, segment seams of every S, C 16 .. 96 (one to six warps across the channels;
# 4 slots take C 32 .. 192: C doubled where it is not a multiple of 32)
NHWC_WALK_SIZES = [(1, 1, 16), (2, 3, 32), (3, 7, 16), (7, 13, 48), (14, 14, 16), (13, 20, 32), (6, 35, 16),
                   (30, 9, 64), (4, 31, 16), (9, 32, 32), (17, 60, 96), (57, 16, 16)]


def _nhwc_walk_case(xp, rng, monkeypatch, hw, c):
    """One shape of the NHWC walk's test (xp = cupy on the GPU; numpy checks the shape logic):
    random data against the reference, integer data (ties, NaN, +-inf, -0.0) exactly, NaN
    rows at every residue mod 4 and NaN columns, and dx bitwise the shfl kernel's."""
    from dnnprims import pooling
    shape = (2, *hw, c)
    opts = dict(mode="max", stride=2, padding=1, layout="NHWC")
    monkeypatch.setattr(pooling, "NHWC_WALK_BACKWARD", True)
    assert _k3s2_expressions(shape, np.float32, "max", "NHWC")[1].startswith("pool_nhwc_k3s2_backward_walk<float, ")
    x = random_array(rng, shape, np.float32)
    y_shape = pool(x.astype(np.float64), 3, **opts).shape
    assert y_shape == (2, (hw[0] - 1) // 2 + 1, (hw[1] - 1) // 2 + 1, c)
    dy = random_array(rng, y_shape, np.float32)
    _check_against_reference(xp, x, dy, 3, {k: v for k, v in opts.items() if k != "layout"}, "NHWC")
    data = np.concatenate([_nhwc_integer_data(rng, np.float32, hw)] * (c // 8), axis=-1)
    assert data.shape == (3, *hw, c)
    _check_integer_data_exactly(xp, rng, data, dict(stride=2, padding=1, layout="NHWC"))
    # NaN rows at each residue mod 4 (a step's top, mid and bottom rows, the tail steps' rows
    # of every S), a NaN column, and a NaN pixel in every channel of the last column
    data[0, 1::4, :, :3] = data[2, 3::4, 1::3, 5:9] = data[1, 2::4, hw[1] // 2, :] = np.nan
    data[1, ::4, :, -2:] = np.nan
    data[2, :, hw[1] - 1, c // 2:] = np.nan
    _check_integer_data_exactly(xp, rng, data, dict(stride=2, padding=1, layout="NHWC"))
    data_y_shape = pool(data.astype(np.float64), 3, **opts).shape
    assert data_y_shape == (3, *y_shape[1:])
    for a, b in ((x, dy), (data, rng.integers(-4, 5, size=data_y_shape).astype(np.float32))):
        got = _host(pool_backward(xp.asarray(b), xp.asarray(a), None, 3, **opts))
        monkeypatch.setattr(pooling, "NHWC_WALK_BACKWARD", False)
        assert _k3s2_expressions(shape, np.float32, "max", "NHWC")[1].startswith(
            "pool_nhwc_k3s2_backward_shfl<float, ")
        want = _host(pool_backward(xp.asarray(b), xp.asarray(a), None, 3, **opts))
        assert got.shape == want.shape == a.shape
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        monkeypatch.setattr(pooling, "NHWC_WALK_BACKWARD", True)


@pytest.mark.parametrize("slots, steps, blocks, prefetch, one_block", _NHWC_WALK_VARIANTS)
def test_nhwc_k3s2_backward_walk_variants(gpu, rng, monkeypatch, slots, steps, blocks, prefetch, one_block):
    """pool_nhwc_k3s2_backward_walk (NHWC float32 max 3x3 / 2 / 1 backward walking down the
    image one window row a step), every slots / S / MINB / PF choice and one-block grids: edge
    sizes, column groups and segment seams, random data against the reference, integer data
    (ties, NaN, +-inf, -0.0) exactly, and dx bitwise pool_nhwc_k3s2_backward_shfl's."""
    from dnnprims import pooling
    assert steps in pooling._NHWC_WALK_STEPS_CHOICES and (blocks, prefetch) in pooling._NHWC_WALK_COMPILED
    assert slots in pooling._NHWC_WALK_SLOTS_CHOICES
    monkeypatch.setattr(pooling, "SHUFFLE_BACKWARD", True)
    monkeypatch.setattr(pooling, "_SHFL_SLOTS", 8)
    monkeypatch.setattr(pooling, "_NHWC_WALK_SLOTS", slots)
    monkeypatch.setattr(pooling, "_NHWC_WALK_STEPS", steps)
    monkeypatch.setattr(pooling, "_NHWC_WALK_BLOCKS", blocks)
    monkeypatch.setattr(pooling, "_NHWC_WALK_PREFETCH", prefetch)
    _fresh_plans(monkeypatch)  # _MAX_ITEMS_BLOCKS is not in the call keys
    if one_block:
        monkeypatch.setattr(pooling, "_MAX_ITEMS_BLOCKS", 1)
    for h, w, c in NHWC_WALK_SIZES:
        c = c if c % (128 // slots) == 0 else 2 * c
        bwd = _k3s2_expressions((2, h, w, c), np.float32, "max", "NHWC")[1]
        assert bwd.endswith(f", {slots}, {steps}, {blocks}, {'true' if prefetch else 'false'}>")
        _nhwc_walk_case(gpu, rng, monkeypatch, (h, w), c)


def test_nhwc_walk_case_shape_logic_on_numpy(rng, monkeypatch):
    """The GPU test's body on NumPy (the reference on both sides): its shapes, dtypes and
    plan expressions are right before it meets a GPU."""
    from dnnprims import pooling
    monkeypatch.setattr(pooling, "SHUFFLE_BACKWARD", True)
    monkeypatch.setattr(pooling, "_SHFL_SLOTS", 8)
    for slots in pooling._NHWC_WALK_SLOTS_CHOICES:
        monkeypatch.setattr(pooling, "_NHWC_WALK_SLOTS", slots)
        for h, w, c in (NHWC_WALK_SIZES[1], NHWC_WALK_SIZES[3], NHWC_WALK_SIZES[7]):
            _nhwc_walk_case(np, rng, monkeypatch, (h, w), c if c % (128 // slots) == 0 else 2 * c)


def test_nhwc_walk_switches_key_the_calls_and_ties_are_deterministic(gpu, rng, monkeypatch):
    """NHWC_WALK_BACKWARD / _NHWC_WALK_* are in the call keys: flipped between calls without
    forgetting the memo, each setting runs its own kernel (a new fast-table entry), dx is
    bitwise the same, and repeated calls on data full of ties give the same bits."""
    from dnnprims import pooling
    _fresh_plans(monkeypatch)
    monkeypatch.setattr(pooling, "SHUFFLE_BACKWARD", True)
    monkeypatch.setattr(pooling, "_SHFL_SLOTS", 8)
    monkeypatch.setattr(pooling, "_SHFL_BLOCKS", 2)
    opts = dict(mode="max", stride=2, padding=1, layout="NHWC")
    shape = (2, 30, 24, 32)
    x = gpu.asarray(rng.integers(-1, 2, size=shape).astype(np.float32))  # ties everywhere
    y_shape = pool(_host(x).astype(np.float64), 3, **opts).shape
    assert y_shape == (2, 15, 12, 32)
    dy = gpu.asarray(rng.integers(-4, 5, size=y_shape).astype(np.float32))
    want = pool_backward(_host(dy).astype(np.float64), _host(x).astype(np.float64), None, 3, **opts)
    settings = [(True, 8, 2, 4, False), (False, 8, 2, 4, False), (True, 8, 1, 3, False), (True, 8, 4, 2, True),
                (True, 4, 2, 4, False), (True, 8, 2, 4, False)]
    got, entries = [], []
    for walk, slots, steps, blocks, prefetch in settings:
        monkeypatch.setattr(pooling, "NHWC_WALK_BACKWARD", walk)
        monkeypatch.setattr(pooling, "_NHWC_WALK_SLOTS", slots)
        monkeypatch.setattr(pooling, "_NHWC_WALK_STEPS", steps)
        monkeypatch.setattr(pooling, "_NHWC_WALK_BLOCKS", blocks)
        monkeypatch.setattr(pooling, "_NHWC_WALK_PREFETCH", prefetch)
        for _ in range(3):
            got.append(_host(pool_backward(dy, x, None, 3, **opts)).view(np.uint32))
        entries.append(len(pooling._MEMO.fast))
    for g in got[1:]:
        np.testing.assert_array_equal(g, got[0])
    np.testing.assert_array_equal(got[0].view(np.float32).astype(np.float64), want)
    assert entries[:5] == [1, 2, 3, 4, 5] and entries[5] == 5  # the last setting is the first's


def test_nhwc_walk_expressions_declared(monkeypatch):
    """Every pool_nhwc_k3s2_backward_walk expression the tables can ask for is in the family
    (plans made on the CPU); float32 NHWC max 3x3 / 2 / 1 backward with C % 16 == 0 takes the
    walk by default, C % 16 != 0, float64, float16 and avg do not, nor the switch off."""
    from dnnprims import pooling
    declared = set(pooling.FAMILY.name_expressions)
    assert _k3s2_expressions((2, 13, 24, 32), np.float32, "max", "NHWC")[1] == (
        f"pool_nhwc_k3s2_backward_walk<float, int, {pooling._NHWC_WALK_SLOTS}, {pooling._NHWC_WALK_STEPS}, "
        f"{pooling._NHWC_WALK_BLOCKS}, {'true' if pooling._NHWC_WALK_PREFETCH else 'false'}>")
    for shape, dtype, mode in (((2, 13, 24, 24), np.float32, "max"), ((2, 13, 24, 32), np.float64, "max"),
                               ((2, 13, 24, 32), np.float16, "max"), ((2, 13, 24, 32), np.float32, "avg")):
        assert "backward_walk" not in _k3s2_expressions(shape, dtype, mode, "NHWC")[1]
    assert _k3s2_expressions((2, 13, 24, 32), np.float32, "max")[1].startswith("pool_k3s2_")  # NCHW: not this one
    monkeypatch.setattr(pooling, "_NHWC_WALK_SLOTS", 4)  # C a multiple of 32
    assert _k3s2_expressions((2, 13, 24, 32), np.float32, "max", "NHWC")[1].startswith(
        "pool_nhwc_k3s2_backward_walk<float, int, 4, ")
    assert _k3s2_expressions((2, 13, 24, 16), np.float32, "max", "NHWC")[1].startswith(
        "pool_nhwc_k3s2_backward_shfl<")
    monkeypatch.setattr(pooling, "NHWC_WALK_BACKWARD", False)
    assert _k3s2_expressions((2, 13, 24, 32), np.float32, "max", "NHWC")[1].startswith(
        "pool_nhwc_k3s2_backward_shfl<")
    for i in ("int", "long long"):
        for k in pooling._NHWC_WALK_SLOTS_CHOICES:
            for s in pooling._NHWC_WALK_STEPS_CHOICES:
                for b, pf in pooling._NHWC_WALK_COMPILED:
                    assert (f"pool_nhwc_k3s2_backward_walk<float, {i}, {k}, {s}, {b}, {'true' if pf else 'false'}>"
                            in declared)


def _at_allocation_end(cp, a):
    """A copy of host array a placed at the very END of its own cudaMalloc, the size rounded up to
    2 MiB pages (as r50's [32, 112, 112, 64] float32 x, 49 pages exactly): a read past a's last
    element crosses the allocation's end, where the A/B's K 4 run met cudaErrorIllegalAddress."""
    page = 2 << 20
    size = -(-a.nbytes // page) * page
    mem = cp.cuda.Memory(size)
    out = cp.ndarray(a.shape, a.dtype, memptr=cp.cuda.MemoryPointer(mem, size - a.nbytes))
    out.set(np.ascontiguousarray(a))
    return out


@pytest.mark.parametrize("hw", [(112, 112), (113, 113), (111, 111)])
def test_nhwc_walk_r50_class_stays_in_bounds(gpu, rng, monkeypatch, hw):
    """The r50 NHWC pool's shape class ([2, H, W, 64], H = W = 111 .. 113, and C 32 / 128 at
    W 113): every A/B variant of pool_nhwc_k3s2_backward_walk with x, dy at the end of their
    own allocations, dx bitwise the shfl kernel's, which matches the reference.  Before the fix
    a slot past the last window column (ow >= Wo) loaded x column 2ow - 1 >= W (K 4 on W 112:
    column 113; every K on odd W): past x's end on the last image row (notes/mpnhwc.md)."""
    from dnnprims import pooling
    monkeypatch.setattr(pooling, "SHUFFLE_BACKWARD", True)
    monkeypatch.setattr(pooling, "_SHFL_SLOTS", 8)
    opts = dict(mode="max", stride=2, padding=1, layout="NHWC")
    variants = [dict(), dict(_NHWC_WALK_STEPS=1), dict(_NHWC_WALK_STEPS=4), dict(_NHWC_WALK_BLOCKS=3),
                dict(_NHWC_WALK_BLOCKS=2, _NHWC_WALK_PREFETCH=True), dict(_NHWC_WALK_SLOTS=4),
                dict(_NHWC_WALK_SLOTS=4, _NHWC_WALK_STEPS=4)]
    defaults = dict(_NHWC_WALK_SLOTS=8, _NHWC_WALK_STEPS=2, _NHWC_WALK_BLOCKS=4, _NHWC_WALK_PREFETCH=False)
    for c in ((64,) if hw[1] != 113 else (64, 32, 128)):
        shape = (2, *hw, c)
        x_host = random_array(rng, shape, np.float32)
        y_shape = (2, (hw[0] - 1) // 2 + 1, (hw[1] - 1) // 2 + 1, c)
        dy_host = random_array(rng, y_shape, np.float32)
        x, dy = _at_allocation_end(gpu, x_host), _at_allocation_end(gpu, dy_host)
        monkeypatch.setattr(pooling, "NHWC_WALK_BACKWARD", False)
        assert _k3s2_expressions(shape, np.float32, "max", "NHWC")[1].startswith("pool_nhwc_k3s2_backward_shfl<")
        want = _host(pool_backward(dy, x, None, 3, **opts))
        assert_close(want, pool_backward(dy_host.astype(np.float64), x_host.astype(np.float64), None, 3, **opts),
                     np.float32, what="pool_backward")
        monkeypatch.setattr(pooling, "NHWC_WALK_BACKWARD", True)
        for v in variants:
            settings = {**defaults, **v}
            for k, val in settings.items():
                monkeypatch.setattr(pooling, k, val)
            if c % (128 // settings["_NHWC_WALK_SLOTS"]):
                continue
            bwd = _k3s2_expressions(shape, np.float32, "max", "NHWC")[1]
            assert bwd.startswith(f"pool_nhwc_k3s2_backward_walk<float, int, {settings['_NHWC_WALK_SLOTS']}, "
                                  f"{settings['_NHWC_WALK_STEPS']}, {settings['_NHWC_WALK_BLOCKS']}, "), bwd
            got = _host(pool_backward(dy, x, None, 3, **opts))
            gpu.cuda.Device().synchronize()  # an illegal address surfaces here, named by the variant
            assert got.shape == shape
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=str(v))


def test_nhwc_walk_r50_class_launch_on_cpu(monkeypatch):
    """The launch the GPU test above gets (plans made on the CPU): the walk with the variant's
    settings, items a multiple of 32 (a warp's lanes stay together in the grid-stride loop), one
    warp per (image, segment, column group, 4 * 32 / SLOTS channels), the grid ceil(items / 256)
    capped by _MAX_ITEMS_BLOCKS, int indices; and the column groups reach past the last window
    column (idle slots, ow >= Wo, the ones that read past x before the fix) in this shape class."""
    from dnnprims import pooling
    monkeypatch.setattr(pooling, "SHUFFLE_BACKWARD", True)
    monkeypatch.setattr(pooling, "NHWC_WALK_BACKWARD", True)
    idle = set()
    for n, h, w, c in ((2, 112, 112, 64), (2, 113, 113, 64), (2, 111, 111, 64), (2, 113, 113, 32),
                       (2, 113, 113, 128), (32, 112, 112, 64)):
        for slots in pooling._NHWC_WALK_SLOTS_CHOICES:
            for steps in pooling._NHWC_WALK_STEPS_CHOICES:
                monkeypatch.setattr(pooling, "_NHWC_WALK_SLOTS", slots)
                monkeypatch.setattr(pooling, "_NHWC_WALK_STEPS", steps)
                problem = pooling._check_problem(np.empty((n, h, w, c), np.float32), 3, "max", 2, 1, True, "NHWC")
                if c % (128 // slots):
                    assert "backward_shfl<" in pooling._make_plan(problem, "backward", True)[1]
                    continue
                expr, grid, args = pooling._nhwc_walk_launch(problem)
                assert pooling._make_plan(problem, "backward", True)[1] == expr
                items, cc, hh, ww, ho, wo, groups, segments = (int(a) for a in args)
                assert (cc, hh, ww, ho, wo) == (c, h, w, (h - 1) // 2 + 1, (w - 1) // 2 + 1)
                assert segments == -(-ho // steps) and groups == -(-wo // (slots - 1))
                assert items == n * segments * groups * (c // (4 * 32 // slots)) * 32 and items % 32 == 0
                assert grid == (min(-(-items // 256), pooling._MAX_ITEMS_BLOCKS),)
                assert expr.startswith(f"pool_nhwc_k3s2_backward_walk<float, int, {slots}, {steps}, ")
                if 2 * ((slots - 1) * groups) - 1 >= w:  # the last group's last slot: column 2ow - 1 past W
                    idle.add((w, slots))
    assert {(112, 4), (113, 8), (113, 4), (111, 8), (111, 4)} <= idle and (112, 8) not in idle
