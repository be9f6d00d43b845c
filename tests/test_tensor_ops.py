"""Tensor operations (add, scale, layout transform, reduce): the reference against
loops and hand cases, both paths against the reference in every dtype, bad inputs."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from dnnprims import add_tensor, reduce_tensor, scale_tensor, transform_layout
from dnnprims.testing.strategies import broadcast_problems, reduce_problems
from dnnprims.testing.tolerances import assert_close

from conftest import FLOAT_DTYPES, random_array

HYPOTHESIS = settings(max_examples=40, deadline=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture])
OPS = ("sum", "mean", "max", "min", "amax", "norm1", "norm2")


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _f64(a):
    return _host(a).astype(np.float64)


# ---------------------------------------------------------------------- reference vs loops

def test_add_tensor_matches_loops(rng):
    a = random_array(rng, (2, 3, 4, 5))
    c = random_array(rng, (1, 3, 1, 1))
    out = add_tensor(a, c, alpha=0.5, beta=-2.0)
    expect = np.empty_like(a)
    for idx in np.ndindex(a.shape):
        expect[idx] = 0.5 * a[idx] - 2.0 * c[0, idx[1], 0, 0]
    np.testing.assert_allclose(out, expect, rtol=1e-15)
    np.testing.assert_allclose(scale_tensor(a, 3.0), 3.0 * a, rtol=1e-15)


def test_transform_layout_matches_loops(rng):
    x = random_array(rng, (2, 3, 4, 5))
    y = transform_layout(x, "NCHW", "NHWC")
    assert y.shape == (2, 4, 5, 3)
    for n, c, h, w in np.ndindex(x.shape):
        assert y[n, h, w, c] == x[n, c, h, w]
    np.testing.assert_array_equal(transform_layout(y, "NHWC", "NCHW"), x)


def _loop_reduce(x, axes, op):
    """One output at a time: gather its values with explicit index loops."""
    kept = [i for i in range(x.ndim) if i not in axes]
    out = np.empty([x.shape[i] for i in kept])
    for oidx in np.ndindex(*out.shape):
        vals = []
        for ridx in np.ndindex(*[x.shape[i] for i in axes]):
            full = [0] * x.ndim
            for i, v in zip(kept, oidx):
                full[i] = v
            for i, v in zip(axes, ridx):
                full[i] = v
            vals.append(x[tuple(full)])
        vals = np.array(vals)
        out[oidx] = {"sum": vals.sum(), "mean": vals.mean(), "max": vals.max(), "min": vals.min(),
                     "amax": np.abs(vals).max(), "norm1": np.abs(vals).sum(),
                     "norm2": np.sqrt((vals ** 2).sum())}[op]
    return out


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("axes", [(1,), (0, 2), (0, 1, 2), (2,)])
def test_reduce_matches_loops(rng, op, axes):
    x = random_array(rng, (3, 4, 5))
    np.testing.assert_allclose(reduce_tensor(x, axes, op), _loop_reduce(x, axes, op), rtol=1e-13, atol=1e-14)


def test_reduce_by_hand():
    x = np.array([[3.0, -4.0], [1.0, 2.0]])
    np.testing.assert_allclose(reduce_tensor(x, 1, "norm2"), [5.0, np.sqrt(5.0)])
    np.testing.assert_allclose(reduce_tensor(x, 0, "amax", keepdims=True), [[3.0, 4.0]])
    np.testing.assert_allclose(reduce_tensor(x, None, "norm1"), 10.0)


# ---------------------------------------------------------------------- both paths vs the reference

BROADCASTS = [((2, 8, 4, 4), (1, 8, 1, 1)), ((3, 5, 7), (5, 1)), ((4, 16), (16,)), ((4, 16), (4, 1)),
              ((2, 3, 4, 8), (2, 1, 4, 1)), ((2, 3, 2, 3, 2, 4), (2, 1, 2, 1, 2, 1)), ((13,), (1,)),
              ((5, 6), (5, 6))]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("a_shape,c_shape", BROADCASTS)
def test_add_and_scale_match_reference(xp, rng, dtype, a_shape, c_shape):
    a, c = random_array(rng, a_shape, dtype), random_array(rng, c_shape, dtype)
    out = add_tensor(xp.asarray(a), xp.asarray(c), alpha=1.5, beta=-0.75)
    assert out.dtype == dtype and out.shape == a_shape
    assert_close(out, add_tensor(_f64(a), _f64(c), alpha=1.5, beta=-0.75), dtype,
                 magnitude=add_tensor(np.abs(_f64(a)), np.abs(_f64(c)), alpha=1.5, beta=0.75))
    assert_close(scale_tensor(xp.asarray(a), -2.5), scale_tensor(_f64(a), -2.5), dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (2, 64, 8, 8), (1, 40, 33), (3, 2, 2, 3, 5), (2, 1, 1, 1)])
def test_transform_layout_matches_reference(xp, rng, dtype, shape):
    x = random_array(rng, shape, dtype)
    y = transform_layout(xp.asarray(x), "NCHW", "NHWC")
    np.testing.assert_array_equal(_host(y), transform_layout(x, "NCHW", "NHWC"))
    back = transform_layout(y, "NHWC", "NCHW")
    np.testing.assert_array_equal(_host(back), x)
    same = transform_layout(xp.asarray(x), "NCHW", "NCHW")
    np.testing.assert_array_equal(_host(same), x)


REDUCTIONS = [((4, 300), (1,)), ((300, 5), (0,)), ((3, 70, 9), (1,)), ((2, 3, 4, 5), (0, 2)),
              ((2, 3, 4, 5), (1, 3)), ((6, 5000), None), ((3, 4), ()), ((5, 1, 7), (1,)), ((20000, 3), (0,)),
              ((6, 5, 7), (0, 2)), ((64, 3, 700), (0, 2)), ((2, 1, 3), (0, 2))]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape,axes", REDUCTIONS)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduce_matches_reference(xp, rng, dtype, shape, axes, keepdims):
    x = random_array(rng, shape, dtype, low=-1, high=2)
    for op in OPS:
        got = reduce_tensor(xp.asarray(x), axes, op, keepdims=keepdims)
        want = reduce_tensor(_f64(x), axes, op, keepdims=keepdims)
        assert got.dtype == dtype and got.shape == want.shape
        # Sums of mixed signs: rounding error scales with the sum of |x|.
        magnitude = reduce_tensor(np.abs(_f64(x)), axes, op, keepdims=keepdims) if op in ("sum", "mean") else None
        assert_close(got, want, dtype, what=op, magnitude=magnitude)


@pytest.mark.parametrize("path", ["rows", "planes"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape,axes,offset", [((7, 13), (1,), 0), ((3, 16), (1,), 0), ((3, 16), (1,), 1),
                                               ((5, 1), (1,), 0), ((2, 3, 7, 7), (0, 2, 3), 0),
                                               ((3, 4, 8, 8), (0, 2, 3), 0), ((3, 4, 8, 8), (0, 2, 3), 3),
                                               ((2, 5, 300), (2,), 0), ((4, 2, 3, 1), (0, 2, 3), 0),
                                               ((7, 13, 3), (0, 2), 0), ((1, 3, 1, 1), (0, 2, 3), 0),
                                               ((3, 2, 40, 50), (0, 2, 3), 0)])
def test_reduce_planes_and_rows_paths(xp, rng, monkeypatch, path, dtype, shape, axes, offset):
    """The one-launch (R1, O, R2) planes kernel (forced for any number of
    outputs) and the rows / columns kernels agree with the reference: 16-byte
    loads when the contiguous run is a multiple of the vector width and x is
    aligned, scalar otherwise; a repeated call (the memoised plan) gives the
    same bits."""
    from dnnprims import tensor_ops
    monkeypatch.setattr(tensor_ops, "PLANES_MIN_OUTPUTS", 1 if path == "planes" else 10**18)
    monkeypatch.setattr(tensor_ops, "_MEMO", type(tensor_ops._MEMO)())
    x_host = random_array(rng, shape, dtype, low=-1, high=2)
    buf = xp.empty(x_host.size + offset, dtype)
    buf[offset:] = xp.asarray(x_host).ravel()
    x = buf[offset:].reshape(shape)
    for op in OPS:
        got = reduce_tensor(x, axes, op)
        want = reduce_tensor(_f64(x_host), axes, op)
        assert got.dtype == dtype and got.shape == want.shape
        magnitude = reduce_tensor(np.abs(_f64(x_host)), axes, op) if op in ("sum", "mean") else None
        assert_close(got, want, dtype, what=op, magnitude=magnitude)
        np.testing.assert_array_equal(_host(reduce_tensor(x, axes, op)), _host(got))
    kept = reduce_tensor(x, axes, "sum", keepdims=True)
    assert kept.shape == tuple(1 if i in axes else d for i, d in enumerate(shape))


@HYPOTHESIS
@given(problem=broadcast_problems())
def test_add_tensor_hypothesis(xp, problem):
    rng = np.random.default_rng(5)
    a = random_array(rng, problem["a_shape"], np.float32)
    c = random_array(rng, problem["c_shape"], np.float32)
    got = add_tensor(xp.asarray(a), xp.asarray(c), alpha=2.0, beta=0.5)
    want = np.broadcast_to(2.0 * _f64(a) + 0.5 * _f64(c), a.shape)
    assert_close(got, want, np.float32, magnitude=np.broadcast_to(2 * np.abs(_f64(a)) + 0.5 * np.abs(_f64(c)),
                                                                 a.shape))


@HYPOTHESIS
@given(problem=reduce_problems())
def test_reduce_hypothesis(xp, problem):
    rng = np.random.default_rng(6)
    x = random_array(rng, problem["x_shape"], np.float32, low=0.5, high=2)  # no cancellation in sums
    got = reduce_tensor(xp.asarray(x), problem["axes"], problem["op"], keepdims=problem["keepdims"])
    axes = problem["axes"]
    axes = tuple(range(x.ndim)) if axes is None else ((axes % x.ndim,) if isinstance(axes, int) else axes)
    want = _loop_reduce(_f64(x), tuple(sorted(axes)), problem["op"])
    if problem["keepdims"]:
        want = want.reshape([1 if i in axes else d for i, d in enumerate(x.shape)])
    assert_close(got, want, np.float32, what=problem["op"])


def test_empty_and_size_one(xp):
    x = xp.zeros((0, 3), np.float32)
    assert reduce_tensor(x, 0, "sum").shape == (3,) and not _host(reduce_tensor(x, 0, "sum")).any()
    assert np.isnan(_host(reduce_tensor(x, 0, "mean"))).all()
    assert reduce_tensor(x, 1, "max").shape == (0,)
    assert transform_layout(xp.zeros((0, 3, 2, 2), np.float32)).shape == (0, 2, 2, 3)
    assert add_tensor(x, xp.ones((1, 3), np.float32)).shape == (0, 3)
    one = xp.full((1, 1), 2.0, np.float32)
    assert float(_host(reduce_tensor(one, None, "norm2"))) == 2.0


# ---------------------------------------------------------------------- bad inputs

@pytest.mark.parametrize("call,error,match", [
    (lambda x: add_tensor(x, np.ones((3, 1), np.float32)), ValueError, "c must broadcast"),
    (lambda x: add_tensor(x, np.ones((1, 2, 3, 4, 5), np.float32)), ValueError, "c must broadcast"),
    (lambda x: add_tensor(x, np.ones(5, np.float64)), TypeError, "c has dtype"),
    (lambda x: add_tensor(x, x, alpha="2"), TypeError, "alpha"),
    (lambda x: add_tensor(x, x, beta=None), TypeError, "beta"),
    (lambda x: add_tensor(x, [1.0]), TypeError, "c must be a numpy.ndarray"),
    (lambda x: scale_tensor(x.astype(np.int16), 2.0), TypeError, "x must have a floating dtype"),
    (lambda x: scale_tensor(x, True), TypeError, "alpha"),
    (lambda x: transform_layout(x, "NCHW", "CHWN"), ValueError, "dst"),
    (lambda x: transform_layout(x, "NCWH", "NHWC"), ValueError, "src"),
    (lambda x: transform_layout(x[0, 0]), ValueError, "x must be 3-D to 5-D"),
    (lambda x: reduce_tensor(x, 4), ValueError, "axes"),
    (lambda x: reduce_tensor(x, (0, 0)), ValueError, "axes"),
    (lambda x: reduce_tensor(x, 1.0), TypeError, "axes"),
    (lambda x: reduce_tensor(x, 0, "prod"), ValueError, "op"),
    (lambda x: reduce_tensor(x, 0, keepdims=1), TypeError, "keepdims"),
    (lambda x: reduce_tensor(x[:0], 0, "max"), ValueError, "zero-size reduction"),
])
def test_bad_inputs(call, error, match):
    x = np.ones((2, 3, 4, 5), np.float32)
    with pytest.raises(error, match=match):
        call(x)


def test_mixing_numpy_and_cupy(gpu):
    a = np.ones((2, 3), np.float32)
    with pytest.raises(TypeError, match="cannot mix NumPy and CuPy"):
        add_tensor(gpu.asarray(a), a)


# ---------------------------------------------------------------------- review6g: the user's side (CPU)

@pytest.mark.parametrize("call,match", [
    (lambda x: add_tensor(x, None), "c must be a numpy.ndarray or cupy.ndarray, got None"),
    (lambda x: add_tensor(None, x), "a must be a numpy.ndarray or cupy.ndarray, got None"),
    (lambda x: scale_tensor(None, 2.0), "x must be a numpy.ndarray or cupy.ndarray, got None"),
    (lambda x: transform_layout(None), "x must be a numpy.ndarray or cupy.ndarray, got None"),
    (lambda x: reduce_tensor(None), "x must be a numpy.ndarray or cupy.ndarray, got None"),
])
def test_none_for_a_required_array_names_it(call, match):
    """A None in place of a required array is a TypeError naming it (was AttributeError)."""
    with pytest.raises(TypeError, match=match):
        call(np.ones((2, 3, 4), np.float32))
