"""Activations forward and backward: reference checks, GPU vs reference, bad inputs."""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from conftest import FLOAT_DTYPES, random_array
from dnnprims.activations import (ACTIVATION_MODES, DEFAULT_ALPHA, activation, activation_backward,
                                  bias_activation, bias_activation_backward)
from dnnprims.reference import activations as ref
from dnnprims.testing import assert_close
from dnnprims.testing.gradcheck import numerical_gradient
from dnnprims.testing.strategies import activation_problems, bias_activation_problems

SETTINGS = settings(max_examples=30, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _sigmoid(v):
    return 1 / (1 + math.exp(-v)) if v >= 0 else math.exp(v) / (1 + math.exp(v))


# Independent scalar formulas (Python math), written from the definitions.
SCALAR = {
    "relu": lambda v, a, approx: max(v, 0.0),
    "sigmoid": lambda v, a, approx: _sigmoid(v),
    "tanh": lambda v, a, approx: math.tanh(v),
    "elu": lambda v, a, approx: v if v > 0 else a * (math.exp(v) - 1),
    "gelu": lambda v, a, approx: (
        0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))) if approx == "tanh"
        else v * 0.5 * math.erfc(-v / math.sqrt(2))),
    "silu": lambda v, a, approx: v * _sigmoid(v),
    "leaky_relu": lambda v, a, approx: v if v > 0 else a * v,
    "clipped_relu": lambda v, a, approx: min(max(v, 0.0), a),
}

VARIANTS = [("relu", {}), ("sigmoid", {}), ("tanh", {}), ("elu", {}), ("elu", {"alpha": 0.5}),
            ("gelu", {}), ("gelu", {"approximate": "tanh"}), ("silu", {}), ("leaky_relu", {}),
            ("leaky_relu", {"alpha": 0.2}), ("clipped_relu", {}), ("clipped_relu", {"alpha": 2.5})]
VARIANT_IDS = [m + "".join(f"-{k}={v}" for k, v in o.items()) for m, o in VARIANTS]


def scalar_forward(x, mode, options):
    alpha = options.get("alpha", DEFAULT_ALPHA.get(mode))
    f = SCALAR[mode]
    return np.array([f(float(v), alpha, options.get("approximate", "none")) for v in np.ravel(x)]).reshape(
        np.shape(x))


def to_numpy(a):
    return np.asarray(a.get() if hasattr(a, "get") else a)


# ---- the reference against hand cases and independent formulas -----------------

def test_hand_values():
    f = lambda mode, v, **o: activation(np.array(v, np.float64), mode, **o)  # noqa: E731
    np.testing.assert_array_equal(f("relu", [-1.0, 0.0, 2.0]), [0, 0, 2])
    np.testing.assert_allclose(f("sigmoid", [0.0, math.log(3)]), [0.5, 0.75], rtol=1e-15)
    np.testing.assert_allclose(f("tanh", [math.log(2)]), [0.6], rtol=1e-15)
    np.testing.assert_allclose(f("elu", [-math.log(2), 3.0]), [-0.5, 3.0], rtol=1e-15)
    np.testing.assert_allclose(f("elu", [-math.log(2)], alpha=2.0), [-1.0], rtol=1e-15)
    np.testing.assert_allclose(f("gelu", [0.0, 1.0, -1.0]), [0.0, 0.8413447460685429, -0.15865525393145707],
                               rtol=1e-15)
    np.testing.assert_allclose(f("silu", [math.log(3)]), [0.75 * math.log(3)], rtol=1e-15)
    np.testing.assert_allclose(f("leaky_relu", [-2.0, 2.0]), [-0.02, 2.0], rtol=1e-15)
    np.testing.assert_array_equal(f("clipped_relu", [-1.0, 3.0, 7.0]), [0.0, 3.0, 6.0])
    np.testing.assert_array_equal(f("clipped_relu", [-1.0, 1.5, 7.0], alpha=2), [0.0, 1.5, 2.0])


@pytest.mark.parametrize("mode,options", VARIANTS, ids=VARIANT_IDS)
def test_reference_matches_scalar_formulas(rng, mode, options):
    x = random_array(rng, (4, 33), low=-8, high=8)
    np.testing.assert_allclose(activation(x, mode, **options), scalar_forward(x, mode, options),
                               rtol=1e-13, atol=1e-15)


def test_gelu_tanh_approximates_erf():
    x = np.linspace(-4, 4, 801)
    gap = activation(x, "gelu", approximate="tanh") - activation(x, "gelu")
    assert 1e-5 < np.max(np.abs(gap)) < 1e-3


def test_extreme_inputs_do_not_overflow():
    x = np.array([-1000.0, -80.0, 80.0, 1000.0])
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        np.testing.assert_allclose(activation(x, "sigmoid"), [0.0, math.exp(-80), 1.0, 1.0], rtol=1e-14)
        np.testing.assert_allclose(activation(x, "elu"), [-1.0, -1.0, 80.0, 1000.0])
        activation_backward(np.ones(4), x, "silu")


@pytest.mark.parametrize("mode,options", VARIANTS, ids=VARIANT_IDS)
def test_backward_by_finite_differences(rng, mode, options):
    x = random_array(rng, (5, 7), low=-4, high=4)
    x[np.abs(x) < 1e-3] = 0.5  # keep clear of the kinks at 0 ...
    alpha = options.get("alpha", DEFAULT_ALPHA.get(mode))
    if mode == "clipped_relu":
        x[np.abs(x - alpha) < 1e-3] = 0.5  # ... and at the ceiling
    dy = random_array(rng, x.shape)
    eps = 1e-6
    numeric = dy * (activation(x + eps, mode, **options) - activation(x - eps, mode, **options)) / (2 * eps)
    np.testing.assert_allclose(activation_backward(dy, x, mode, **options), numeric, rtol=1e-6, atol=1e-9)


def test_derivatives_at_the_kinks(xp):
    """PyTorch's choices: relu and clipped_relu pass nothing at 0 (and at the ceiling),
    leaky_relu its slope, elu alpha."""
    x = xp.asarray(np.array([0.0, 6.0]))
    dy = xp.ones(2)
    np.testing.assert_array_equal(to_numpy(activation_backward(dy, x, "relu")), [0.0, 1.0])
    np.testing.assert_array_equal(to_numpy(activation_backward(dy, x, "clipped_relu")), [0.0, 0.0])
    np.testing.assert_allclose(to_numpy(activation_backward(dy, x, "leaky_relu", alpha=0.3)), [0.3, 1.0])
    np.testing.assert_allclose(to_numpy(activation_backward(dy, x, "elu", alpha=0.7)), [0.7, 1.0])


@pytest.mark.parametrize("mode", ["relu", "leaky_relu", "clipped_relu", "sigmoid", "gelu"])
def test_nan_propagates(xp, mode):
    y = to_numpy(activation(xp.asarray(np.array([np.nan, 1.0], np.float32)), mode))
    assert np.isnan(y[0]) and not np.isnan(y[1])


# ---- every path against the float64 reference, in every dtype --------------------

@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("mode,options", VARIANTS, ids=VARIANT_IDS)
def test_forward_and_backward_against_reference(xp, rng, dtype, mode, options):
    # A lone element is drawn where every derivative is well away from zero, so
    # that the normwise comparison is not a relative one at a root.
    for shape, low in [((4099,), -7), ((2, 3, 7, 13), -7), ((13,), -7), ((1,), 0.1)]:
        x = random_array(rng, shape, dtype, low=low, high=7 if low < 0 else 1)
        dy = random_array(rng, shape, dtype)
        x64 = x.astype(np.float64)
        y = activation(xp.asarray(x), mode, **options)
        assert y.dtype == dtype and y.shape == shape and isinstance(y, xp.ndarray)
        alpha = options.get("alpha", DEFAULT_ALPHA.get(mode))
        approximate = options.get("approximate", "none")
        assert_close(y, ref.activation(x64, mode, alpha, approximate), dtype, what=f"{mode} forward")
        dx = activation_backward(xp.asarray(dy), xp.asarray(x), mode, **options)
        assert dx.dtype == dtype and dx.shape == shape
        assert_close(dx, ref.activation_backward(dy.astype(np.float64), x64, mode, alpha, approximate), dtype,
                     what=f"{mode} backward")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_non_contiguous_input(xp, rng, dtype):
    base = random_array(rng, (6, 10), dtype, low=-3, high=3)
    x = xp.asarray(base)[::2, 1::3].T
    x_view = base[::2, 1::3].T.astype(np.float64)
    dy = random_array(rng, x_view.shape, dtype)
    for mode in ACTIVATION_MODES:
        assert_close(activation(x, mode), ref.activation(x_view, mode, DEFAULT_ALPHA.get(mode)), dtype)
        assert_close(activation_backward(xp.asarray(np.asfortranarray(dy)), x, mode),
                     ref.activation_backward(dy.astype(np.float64), x_view, mode, DEFAULT_ALPHA.get(mode)),
                     dtype)


# Significant bits kept by each 16-bit storage dtype, less one: 1 ulp = 2^-bits * |v| at most.
_ULP_BITS = {"float16": 10, "bfloat16": 7}


@pytest.mark.parametrize("dtype", [d for d in FLOAT_DTYPES if d.values[0].itemsize == 2])
def test_gelu_backward_every_16bit_input(xp, rng, dtype):
    """Every finite float16 x (every bfloat16 with |x| <= 16, and a few beyond),
    dy in [0.5, 2): dx within one unit in the last place of dy * gelu'(x) in
    float64 -- with erfc, exact in the tail where 1 + erf(x) cancels -- plus 2^-21
    |dy| for the sum of two terms that cancel near x = -0.75.  The 16-bit GPU
    kernel computes gelu' with one shared exponential and a fitted erfc
    (activation_math.cuh, gelu_derivative_fast; notes/half16.md); a wrong
    coefficient or sign fails here, where the normwise bound would not see it."""
    dtype = np.dtype(dtype)
    x = np.arange(65536, dtype=np.uint16).view(dtype)
    x = x[np.isfinite(x.astype(np.float32))]
    if dtype.name == "bfloat16":
        x = np.concatenate([x[np.abs(x.astype(np.float32)) <= 16],
                            np.array([-1e30, -100, 20, 1e4, 3e38], np.float32).astype(dtype)])
    dy = rng.uniform(0.5, 2.0, x.size).astype(dtype)
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    erfc = np.frompyfunc(math.erfc, 1, 1)
    with np.errstate(over="ignore"):
        d64 = (0.5 * erfc(-x64 / math.sqrt(2)).astype(np.float64)
               + x64 / math.sqrt(2 * math.pi) * np.exp(-0.5 * x64 * x64))
    want = dy64 * d64
    with np.errstate(over="ignore", invalid="ignore"):  # the NumPy reference squares 65504 in float16
        got = to_numpy(activation_backward(xp.asarray(dy), xp.asarray(x), "gelu")).astype(np.float64)
    err = np.abs(got - want)
    limit = 2.0 ** -_ULP_BITS[dtype.name] * np.abs(want) + 2.0 ** -21 * dy64
    bad = np.flatnonzero(~(err <= limit))
    assert bad.size == 0, (f"{bad.size} of {x.size}: x {x64[bad[:5]]} dy {dy64[bad[:5]]} "
                           f"got {got[bad[:5]]} want {want[bad[:5]]}")


@pytest.mark.parametrize("one_exp", [True, False])
@pytest.mark.parametrize("dtype", [d for d in FLOAT_DTYPES if d.values[0].itemsize == 2])
def test_gelu_forward_every_16bit_input(xp, monkeypatch, one_exp, dtype):
    """Every finite float16 x (every bfloat16 with |x| <= 16, and a few beyond): gelu(x)
    within one unit in the last place of x Phi(x) in float64 (with erfc), plus 2^-23 |x|
    for the float rounding of 1 + erf(x / sqrt 2) in the erf form (the NumPy path, and
    the kernel with GELU_ONE_EXP_16BIT off).  The 16-bit kernel computes Phi from one
    exponential and the fitted erfc of gelu_derivative_fast (activation_math.cuh,
    gelu_one_exp); a wrong coefficient or branch fails here."""
    from dnnprims import activations
    monkeypatch.setattr(activations, "GELU_ONE_EXP_16BIT", one_exp)
    dtype = np.dtype(dtype)
    x = np.arange(65536, dtype=np.uint16).view(dtype)
    x = x[np.isfinite(x.astype(np.float32))]
    if dtype.name == "bfloat16":
        x = np.concatenate([x[np.abs(x.astype(np.float32)) <= 16],
                            np.array([-1e30, -100, 20, 1e4, 3e38], np.float32).astype(dtype)])
    x64 = x.astype(np.float64)
    erfc = np.frompyfunc(math.erfc, 1, 1)
    want = x64 * 0.5 * erfc(-x64 / math.sqrt(2)).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        got = to_numpy(activation(xp.asarray(x), "gelu")).astype(np.float64)
    err = np.abs(got - want)
    # + the spacing of the storage's subnormals, where one unit is not 2^-bits |want|
    limit = (2.0 ** -_ULP_BITS[dtype.name] * np.abs(want) + 2.0 ** -23 * np.abs(x64)
             + {"float16": 2.0 ** -24, "bfloat16": 2.0 ** -133}[dtype.name])
    if xp is not np and dtype.name == "bfloat16":
        # bfloat16's subnormals are float32's, and CuPy compiles with -ftz=true: the GPU
        # kernels (both formulas, H100 session 10) flush a float32 result below 2^-126
        # to zero -- also where the exact result is 2^-126 itself (x = -2^-125: the
        # float32 product rounds under it).  An absolute error of at most 2^-126 (1 + 2^-7),
        # accepted there and nowhere else.
        tiny = np.abs(want) <= 2.0 ** -126 * (1 + 2.0 ** -_ULP_BITS["bfloat16"])
        limit = np.where(tiny, np.maximum(limit, np.abs(want)), limit)
    bad = np.flatnonzero(~(err <= limit))
    assert bad.size == 0, f"{bad.size} of {x.size}: x {x64[bad[:5]]} got {got[bad[:5]]} want {want[bad[:5]]}"
    assert to_numpy(activation(xp.asarray(np.array([np.inf, -np.inf, np.nan], dtype)), "gelu")).astype(
        np.float64)[0] == np.inf


@pytest.mark.parametrize("unroll,one_exp", [(4, True), (1, False), (1, True)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_forward_switches(xp, rng, monkeypatch, dtype, unroll, one_exp):
    """The 16-bit forward's switches (packs a thread, gelu_one_exp) in
    each setting, over several grid-stride steps with a tail, against the reference;
    a repeated call after a switch takes the switched plan."""
    from dnnprims import activations
    x = random_array(rng, (3 * 2**16 + 13,), dtype, low=-6, high=6)
    x64 = x.astype(np.float64)
    activation(xp.asarray(x), "gelu")  # a plan under the default switches first
    monkeypatch.setattr(activations, "FORWARD_UNROLL_16BIT", unroll)
    monkeypatch.setattr(activations, "GELU_ONE_EXP_16BIT", one_exp)
    for mode in ("relu", "gelu", "sigmoid", "clipped_relu"):
        for _ in range(2):
            assert_close(activation(xp.asarray(x), mode), ref.activation(x64, mode, DEFAULT_ALPHA.get(mode)),
                         dtype, what=f"{mode} forward")
    if xp is not np and np.dtype(dtype).itemsize == 2:
        expr = activations._cached_plan("forward", "gelu", "none", None, x.size, dtype, True)[0]
        assert expr.endswith(f", {9 if one_exp else 4}, {unroll}>"), expr
        expr = activations._cached_plan("forward", "relu", "none", None, x.size, dtype, True)[0]
        assert expr.endswith(f", 0, {unroll}>"), expr
    bias = random_array(rng, (13,), dtype)
    xb = x[:13 * 1000].reshape(1000, 13)
    assert_close(bias_activation(xp.asarray(xb), xp.asarray(bias), "gelu", layout="NHWC"),
                 ref.bias_activation(xb.astype(np.float64), bias.astype(np.float64), "gelu", None, "none", "NHWC"),
                 dtype, what="bias gelu forward")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_misaligned_and_long(xp, rng, dtype):
    """A view one element into its buffer (no 16-byte packs), and enough elements
    for several grid-stride steps of the pack loop with a tail."""
    for size, offset in [(4099, 1), (3 * 2**16 + 5, 0)]:
        flat = random_array(rng, (size + offset,), dtype, low=-4, high=4)
        dflat = random_array(rng, (size + offset,), dtype)
        x, dy = xp.asarray(flat)[offset:], xp.asarray(dflat)[offset:]
        x64, dy64 = flat[offset:].astype(np.float64), dflat[offset:].astype(np.float64)
        assert_close(activation(x, "silu"), ref.activation(x64, "silu"), dtype, what="silu forward")
        assert_close(activation_backward(dy, x, "gelu"), ref.activation_backward(dy64, x64, "gelu"), dtype,
                     what="gelu backward")


def test_empty_and_zero_dimensional(xp):
    x = xp.ones((0, 3), np.float32)
    assert activation(x, "gelu").shape == (0, 3)
    assert activation_backward(x, x, "elu").shape == (0, 3)
    y = activation(xp.asarray(np.array(-2.0)), "leaky_relu")
    assert y.shape == () and float(y) == pytest.approx(-0.02)


def test_zero_output_gradient(xp):
    dx = activation_backward(None, xp.ones((2, 3), np.float32), "tanh")
    assert dx.shape == (2, 3) and dx.dtype == np.float32 and not bool((dx != 0).any())


@SETTINGS
@given(problem=activation_problems())
def test_hypothesis_shapes_and_modes(xp, problem):
    shape, mode, options = problem
    rng = np.random.default_rng(len(shape) + len(mode))
    for dtype in (np.float32, np.float64):
        x = random_array(rng, shape, dtype, low=-5, high=5)
        assert_close(activation(xp.asarray(x), mode, **options), scalar_forward(x, mode, options), dtype)


# ---- bad inputs --------------------------------------------------------------

def test_unknown_mode():
    with pytest.raises(ValueError, match="mode must be one of 'relu'"):
        activation(np.ones(3), "swish")
    with pytest.raises(ValueError, match="mode must be one of"):
        activation_backward(np.ones(3), np.ones(3), "RELU")


def test_mode_not_a_string():
    with pytest.raises(TypeError, match="mode must be a string"):
        activation(np.ones(3), 0)


def test_alpha_for_a_mode_without_one():
    with pytest.raises(ValueError, match="alpha is not used by mode 'relu'"):
        activation(np.ones(3), "relu", alpha=0.1)


@pytest.mark.parametrize("alpha", ["0.1", [1.0], True])
def test_alpha_not_a_number(alpha):
    with pytest.raises(TypeError, match="alpha must be a real number"):
        activation(np.ones(3), "elu", alpha=alpha)


@pytest.mark.parametrize("alpha", [float("nan"), float("inf")])
def test_alpha_not_finite(alpha):
    with pytest.raises(ValueError, match="alpha must be finite"):
        activation(np.ones(3), "leaky_relu", alpha=alpha)


@pytest.mark.parametrize("alpha", [0.0, -1.0])
def test_clipped_relu_ceiling_not_positive(alpha):
    with pytest.raises(ValueError, match="alpha .*clipped_relu.* must be positive"):
        activation(np.ones(3), "clipped_relu", alpha=alpha)


def test_bad_approximate():
    with pytest.raises(ValueError, match="approximate must be one of 'none', 'tanh'"):
        activation(np.ones(3), "gelu", approximate="sigmoid")
    with pytest.raises(ValueError, match="approximate='tanh' applies only to mode 'gelu'"):
        activation(np.ones(3), "silu", approximate="tanh")


def test_integer_dtype():
    with pytest.raises(TypeError, match="x must have a floating dtype"):
        activation(np.ones(3, np.int32), "relu")


def test_not_an_array():
    with pytest.raises(TypeError, match="x must be a numpy.ndarray or cupy.ndarray"):
        activation([1.0], "relu")


def test_mismatched_dtypes():
    with pytest.raises(TypeError, match="dy has dtype float32 but x has dtype float64|x has dtype float64 but dy"):
        activation_backward(np.ones(3, np.float32), np.ones(3), "relu")


def test_mismatched_shapes():
    with pytest.raises(ValueError, match=r"dy must have shape \(3,\)"):
        activation_backward(np.ones(4), np.ones(3), "sigmoid")


def test_mixing_numpy_and_cupy(gpu):
    with pytest.raises(TypeError, match="cannot mix NumPy and CuPy arrays"):
        activation_backward(gpu.ones(3), np.ones(3), "relu")


def test_relu_backward_passes_gradient_at_nan(xp):
    # PyTorch's rule (x <= 0 -> 0, else dy): a NaN input lets the gradient through.
    x = xp.asarray(np.array([np.nan, -1.0, 0.0, 2.0]))
    dy = xp.asarray(np.array([3.0, 4.0, 5.0, 6.0]))
    dx = activation_backward(dy, x, "relu")
    np.testing.assert_array_equal(dx.get() if xp is not np else dx, [3.0, 0.0, 0.0, 6.0])


# ---- bias + activation ---------------------------------------------------------

def _channel_axis(ndim, layout):
    return 1 if layout == "NCHW" else ndim - 1


def _other_axes(ndim, layout):
    return tuple(i for i in range(ndim) if i != _channel_axis(ndim, layout))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("mode,options", VARIANTS, ids=VARIANT_IDS)
def test_bias_activation_reference_matches_scalar_formulas(rng, mode, options, layout):
    x = random_array(rng, (2, 3, 4, 5), low=-3, high=3)
    channels = x.shape[_channel_axis(x.ndim, layout)]
    bias = random_array(rng, (channels,))
    alpha = options.get("alpha", DEFAULT_ALPHA.get(mode))
    approximate = options.get("approximate", "none")
    got = ref.bias_activation(x, bias, mode, alpha, approximate, layout)
    moved_x = np.moveaxis(x, _channel_axis(x.ndim, layout), 0)
    moved = np.moveaxis(got, _channel_axis(x.ndim, layout), 0)
    for c in range(channels):
        np.testing.assert_allclose(moved[c], scalar_forward(moved_x[c] + bias[c], mode, options),
                                   rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("mode,options", VARIANTS, ids=VARIANT_IDS)
def test_bias_activation_backward_by_finite_differences(rng, mode, options, layout):
    x = random_array(rng, (2, 3, 2, 3), low=-3, high=3)
    channels = x.shape[_channel_axis(x.ndim, layout)]
    bias = random_array(rng, (channels,), low=-0.5, high=0.5)
    bshape = [1] * x.ndim
    bshape[_channel_axis(x.ndim, layout)] = channels
    alpha = options.get("alpha", DEFAULT_ALPHA.get(mode))
    z = x + bias.reshape(bshape)
    x[np.abs(z) < 1e-3] += 0.01  # keep clear of the kinks at 0 ...
    if mode == "clipped_relu":
        x[np.abs(x + bias.reshape(bshape) - alpha) < 1e-3] += 0.01  # ... and at the ceiling
    dy = random_array(rng, x.shape)
    kw = dict(layout=layout, **options)
    dx, dbias = bias_activation_backward(dy, x, bias, mode, **kw)
    f = lambda: float(np.sum(dy * bias_activation(x, bias, mode, **kw)))  # noqa: E731
    # Central differences with step 1e-6 carry the rounding of f's sum divided by the
    # step: about eps64 * sum|dy * y| / 2e-6 (~1e-9 here, at the size of the smallest
    # leaky_relu gradients); a fixed atol of 1e-9 sat right on that floor.
    floor = 8 * np.finfo(np.float64).eps * float(np.sum(np.abs(dy * bias_activation(x, bias, mode, **kw)))) / 2e-6
    np.testing.assert_allclose(dx, numerical_gradient(f, x), rtol=1e-6, atol=floor)
    np.testing.assert_allclose(dbias, numerical_gradient(f, bias), rtol=1e-6, atol=floor)
    # The adjoint identity for the bias: <dbias, v> = <dx, v broadcast over the channel>.
    v = random_array(rng, (channels,))
    np.testing.assert_allclose(dbias @ v, np.sum(dx * v.reshape(bshape)), rtol=1e-12, atol=1e-12)


# NCHW: packs of one channel (inner % 8 == 0), scalar planes (odd inner), planes of
# several chunks, no spatial axes; NHWC: packs of consecutive channels, odd C.
BIAS_CASES = [((2, 8, 4, 4), "NCHW"), ((2, 5, 3, 7), "NCHW"), ((1, 3, 100, 90), "NCHW"), ((3, 16), "NCHW"),
              ((1, 13, 1, 1), "NCHW"), ((2, 3, 5, 8), "NHWC"), ((2, 4, 3, 13), "NHWC"), ((70, 24), "NHWC"),
              ((3, 2, 136), "NHWC"),
              # NHWC over many row chunks (a partial last one) with packs of channels
              ((2, 40, 30, 64), "NHWC"), ((3, 37, 5, 16), "NHWC")]
BIAS_MODES = [("relu", {}), ("gelu", {}), ("gelu", {"approximate": "tanh"}), ("elu", {"alpha": 0.5}),
              ("silu", {}), ("clipped_relu", {})]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape,layout", BIAS_CASES, ids=[f"{s}-{l}" for s, l in BIAS_CASES])
def test_bias_activation_against_reference(xp, rng, dtype, shape, layout):
    channels = shape[_channel_axis(len(shape), layout)]
    x = random_array(rng, shape, dtype, low=-4, high=4)
    bias = random_array(rng, (channels,), dtype)
    dy = random_array(rng, shape, dtype)
    x64, b64, dy64 = (a.astype(np.float64) for a in (x, bias, dy))
    for mode, options in BIAS_MODES:
        alpha = options.get("alpha", DEFAULT_ALPHA.get(mode))
        approximate = options.get("approximate", "none")
        kw = dict(layout=layout, **options)
        y = bias_activation(xp.asarray(x), xp.asarray(bias), mode, **kw)
        assert y.dtype == dtype and y.shape == shape and isinstance(y, xp.ndarray)
        assert_close(y, ref.bias_activation(x64, b64, mode, alpha, approximate, layout), dtype,
                     what=f"{mode} forward")
        dx, dbias = bias_activation_backward(xp.asarray(dy), xp.asarray(x), xp.asarray(bias), mode, **kw)
        assert dx.dtype == dtype and dbias.dtype == dtype and dbias.shape == (channels,)
        dx_ref, dbias_ref = ref.bias_activation_backward(dy64, x64, b64, mode, alpha, approximate, layout)
        assert_close(dx, dx_ref, dtype, what=f"{mode} dx")
        # dbias sums terms of both signs: bound its error by the sum of their magnitudes.
        assert_close(dbias, dbias_ref, dtype, what=f"{mode} dbias",
                     magnitude=np.abs(dx_ref).sum(axis=_other_axes(len(shape), layout)))


@pytest.mark.parametrize("packed,sweep", [(True, True), (True, False), (False, True)],
                         ids=["rows_sweep", "rows_packed", "rows"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_bias_activation_nhwc_backward_paths(xp, rng, monkeypatch, packed, sweep, dtype):
    """NHWC backward through each kernel (the resident sweep, chunks of rows with and
    without 16-byte packs of channels) over many rows, against the float64
    reference (dx and dbias).  The sweep's grid is cut to 3 row groups, so each
    block takes many slabs and the last slab is partial."""
    from dnnprims import activations
    monkeypatch.setattr(activations, "NHWC_PACKED", packed)
    monkeypatch.setattr(activations, "NHWC_SWEEP", activations._dtypes.CUDA_TYPES if sweep else ())
    monkeypatch.setattr(activations, "_resident_blocks", lambda expression: 3)
    shape = (4, 33, 29, 32)
    x = random_array(rng, shape, dtype, low=-4, high=4)
    bias = random_array(rng, (32,), dtype)
    dy = random_array(rng, shape, dtype)
    x64, b64, dy64 = (a.astype(np.float64) for a in (x, bias, dy))
    for mode in ("relu", "gelu"):
        dx, dbias = bias_activation_backward(xp.asarray(dy), xp.asarray(x), xp.asarray(bias), mode, layout="NHWC")
        dx_ref, dbias_ref = ref.bias_activation_backward(dy64, x64, b64, mode, None, "none", "NHWC")
        assert_close(dx, dx_ref, dtype, what=f"{mode} dx")
        assert_close(dbias, dbias_ref, dtype, what=f"{mode} dbias", magnitude=np.abs(dx_ref).sum(axis=(0, 1, 2)))


@pytest.mark.parametrize("plane_packs", [True, False])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_bias_activation_nchw_backward_paths(xp, rng, monkeypatch, plane_packs, dtype):
    """NCHW backward through bias_activation_backward_plane_packs (one trip to memory a
    block; planes of one chunk, of several with a partial last, and of one pack) and
    through the planes kernel, against the float64 reference (dx and dbias)."""
    from dnnprims import activations
    monkeypatch.setattr(activations, "PLANE_PACKS", plane_packs)
    for shape in [(3, 5, 56, 56), (2, 3, 80, 120), (2, 3, 1, 8), (1, 2, 64, 72)]:
        x = random_array(rng, shape, dtype, low=-4, high=4)
        bias = random_array(rng, (shape[1],), dtype)
        dy = random_array(rng, shape, dtype)
        x64, b64, dy64 = (a.astype(np.float64) for a in (x, bias, dy))
        for mode in ("relu", "gelu"):
            dx, dbias = bias_activation_backward(xp.asarray(dy), xp.asarray(x), xp.asarray(bias), mode)
            dx_ref, dbias_ref = ref.bias_activation_backward(dy64, x64, b64, mode, None, "none", "NCHW")
            assert_close(dx, dx_ref, dtype, what=f"{shape} {mode} dx")
            assert_close(dbias, dbias_ref, dtype, what=f"{shape} {mode} dbias",
                         magnitude=np.abs(dx_ref).sum(axis=(0, 2, 3)))


@SETTINGS
@given(problem=bias_activation_problems())
def test_bias_activation_hypothesis(xp, problem):
    shape, layout, mode, options = problem
    rng = np.random.default_rng(sum(shape) + len(mode))
    channels = shape[_channel_axis(len(shape), layout)]
    alpha = options.get("alpha", DEFAULT_ALPHA.get(mode))
    approximate = options.get("approximate", "none")
    x = random_array(rng, shape, np.float32, low=-5, high=5)
    bias = random_array(rng, (channels,), np.float32)
    dy = random_array(rng, shape, np.float32)
    x64, b64, dy64 = (a.astype(np.float64) for a in (x, bias, dy))
    kw = dict(layout=layout, **options)
    assert_close(bias_activation(xp.asarray(x), xp.asarray(bias), mode, **kw),
                 ref.bias_activation(x64, b64, mode, alpha, approximate, layout), np.float32)
    dx, dbias = bias_activation_backward(xp.asarray(dy), xp.asarray(x), xp.asarray(bias), mode, **kw)
    dx_ref, dbias_ref = ref.bias_activation_backward(dy64, x64, b64, mode, alpha, approximate, layout)
    assert_close(dx, dx_ref, np.float32)
    assert_close(dbias, dbias_ref, np.float32, magnitude=np.abs(dx_ref).sum(axis=_other_axes(len(shape), layout)))


def test_bias_activation_zero_output_gradient_and_empty(xp):
    x, bias = xp.ones((2, 3, 4), np.float32), xp.ones((3,), np.float32)
    dx, dbias = bias_activation_backward(None, x, bias, "tanh")
    assert dx.shape == x.shape and dbias.shape == (3,) and not bool((dx != 0).any()) and not bool((dbias != 0).any())
    e = xp.ones((0, 3, 4), np.float32)
    assert bias_activation(e, bias, "relu").shape == (0, 3, 4)
    dx, dbias = bias_activation_backward(e, e, bias, "relu")
    assert dx.shape == (0, 3, 4) and not bool((dbias != 0).any())


def test_bias_activation_bad_bias_shape():
    with pytest.raises(ValueError, match="bias must have shape"):
        bias_activation(np.ones((2, 3, 4)), np.ones(4), "relu")
    with pytest.raises(ValueError, match="bias must have shape"):
        bias_activation(np.ones((2, 3, 4)), np.ones(3), "relu", layout="NHWC")


def test_bias_activation_bad_layout():
    with pytest.raises(ValueError, match="layout must be one of"):
        bias_activation(np.ones((2, 3)), np.ones(3), "relu", layout="CHWN")


def test_bias_activation_x_needs_a_channel_axis():
    with pytest.raises(ValueError, match="x must have at least 2 dimensions"):
        bias_activation(np.ones(3), np.ones(3), "relu")


def test_bias_activation_mismatched_dtypes():
    with pytest.raises(TypeError, match="bias has dtype float32 but x has dtype float64"):
        bias_activation(np.ones((2, 3)), np.ones(3, np.float32), "relu")


def test_bias_activation_bad_dy_shape():
    with pytest.raises(ValueError, match=r"dy must have shape \(2, 3\)"):
        bias_activation_backward(np.ones((3, 2)), np.ones((2, 3)), np.ones(3), "relu")


def test_bias_activation_bad_mode_and_alpha():
    with pytest.raises(ValueError, match="mode must be one of"):
        bias_activation(np.ones((2, 3)), np.ones(3), "swish")
    with pytest.raises(ValueError, match="alpha is not used by mode 'relu'"):
        bias_activation_backward(np.ones((2, 3)), np.ones((2, 3)), np.ones(3), "relu", alpha=0.1)


def test_bias_activation_mixing_numpy_and_cupy(gpu):
    with pytest.raises(TypeError, match="cannot mix NumPy and CuPy arrays"):
        bias_activation(gpu.ones((2, 3)), np.ones(3), "relu")


@pytest.mark.gpu
def test_repeated_gpu_calls_reuse_the_validated_plan_and_still_check(gpu, rng):
    from dnnprims import activations
    x = random_array(rng, (3, 7, 13), np.float32)
    X = gpu.asarray(x)
    first = activations.activation(X, "leaky_relu", alpha=0.2)
    entries = len(activations._MEMO._entries)
    again = activations.activation(X, "leaky_relu", alpha=0.2)
    assert len(activations._MEMO._entries) == entries and gpu.array_equal(first, again)
    assert_close(again, activations.activation(x.astype(np.float64), "leaky_relu", alpha=0.2), np.float32)
    other = activations.activation(X, "leaky_relu", alpha=0.3)       # another alpha: another plan
    assert_close(other, activations.activation(x.astype(np.float64), "leaky_relu", alpha=0.3), np.float32)
    with pytest.raises(TypeError, match="alpha"):
        activations.activation(X, "leaky_relu", alpha=True)
    with pytest.raises(ValueError, match="mode"):
        activations.activation(X, "swish")
    dy = gpu.asarray(random_array(rng, x.shape, np.float32))
    for _ in range(2):
        dx = activations.activation_backward(dy, X, "gelu")
    assert_close(dx, activations.activation_backward(dy.get().astype(np.float64), x.astype(np.float64), "gelu"),
                 np.float32)
    with pytest.raises(ValueError, match="dy"):
        activations.activation_backward(dy[:, :-1], X, "gelu")


# ---------------------------------------------------------------------- review6g: the user's side (CPU)

@pytest.mark.parametrize("call,match", [
    (lambda x, b: activation(None, "relu"), "x must be a numpy.ndarray or cupy.ndarray, got None"),
    (lambda x, b: activation_backward(x, None, "relu"), "x must be a numpy.ndarray or cupy.ndarray, got None"),
    (lambda x, b: bias_activation(x, None, "relu"), "bias must be a numpy.ndarray or cupy.ndarray, got None"),
    (lambda x, b: bias_activation(None, b, "relu"), "x must be a numpy.ndarray or cupy.ndarray, got None"),
    (lambda x, b: bias_activation_backward(x, x, None, "relu"),
     "bias must be a numpy.ndarray or cupy.ndarray, got None"),
])
def test_none_for_a_required_array_names_it(call, match):
    """A None in place of a required array is a TypeError naming it (was AttributeError)."""
    x, b = np.ones((2, 3, 4), np.float32), np.ones(3, np.float32)
    with pytest.raises(TypeError, match=match):
        call(x, b)


@pytest.mark.parametrize("mode", ["leaky_relu", "elu"])
def test_a_zero_alpha_runs_as_zero_whatever_its_sign(mode):
    # The GPU caches key alpha by value (-0.0 == 0.0): one sign keeps every path alike.
    x, dy = np.array([-2.0, -0.5, 0.0, 3.0]), np.array([1.0, -1.0, 1.0, 1.0])
    b = np.zeros(1)
    for minus, plus in [(activation(x, mode, alpha=-0.0), activation(x, mode, alpha=0.0)),
                        (activation_backward(dy, x, mode, alpha=-0.0), activation_backward(dy, x, mode, alpha=0.0)),
                        (bias_activation(x[:, None], b, mode, alpha=-0.0), bias_activation(x[:, None], b, mode, alpha=0.0))]:
        assert minus.tobytes() == plus.tobytes()
    from dnnprims import conv2d_forward
    xc = x.reshape(1, 1, 1, 4)
    w = np.ones((1, 1, 1, 1))
    assert conv2d_forward(xc, w, activation=mode, alpha=-0.0).tobytes() == \
        conv2d_forward(xc, w, activation=mode, alpha=0.0).tobytes()


def test_elementwise_grid_matches_the_kernels_packs_per_thread():
    """CPU: the packs a thread of the plan's kernel (activation_forward's U template
    argument; activation_backward's U = 1) and the Python grid agree, so the one-shot
    grid covers every pack in one step; the grid is capped and the kernels grid-stride.
    16-bit forward: FORWARD_UNROLL_16BIT packs a thread (float: 1)."""
    from dnnprims import activations, _dtypes
    assert "constexpr int U = 1;" in activations.FAMILY.source
    n = 64 * 256 * 56 * 56
    for dtype in (np.float16, _dtypes.BFLOAT16, np.float32, np.float64):
        if dtype is None:
            continue
        vec = 16 // np.dtype(dtype).itemsize
        half = np.dtype(dtype).itemsize == 2
        for direction in ("forward", "backward"):
            for mode in ("relu", "gelu", "leaky_relu", "sigmoid"):
                expr, grid, scalars = activations._cached_plan(direction, mode, "none", None, n, dtype, True)
                unroll = 1
                if direction == "forward" and half:
                    unroll = activations.FORWARD_UNROLL_16BIT
                    assert expr.endswith(f", {unroll}>")
                assert expr in activations.FAMILY.name_expressions
                assert activations._unroll(direction, dtype, mode) == unroll
                assert grid == (min(-(-(n // vec) // (activations._BLOCK * unroll)), activations._MAX_BLOCKS),)
                assert int(scalars[1]) == n // vec
