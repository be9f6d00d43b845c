"""Convolution: the NumPy reference against independent implementations, every
registered algorithm against the reference on both paths, and the input checks."""
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import dnnprims
from dnnprims import _dtypes, algos
from dnnprims.algos import depthwise as depthwise_algo
from dnnprims.algos import fft as fft_algo
from dnnprims.algos import gemm as gemm_algo
from dnnprims.conv import (ConvProblem, conv2d_backward_bias, conv2d_backward_data,
                           conv2d_backward_filter, conv2d_forward, conv2d_output_shape)
from dnnprims.testing import assert_close
from dnnprims.testing.strategies import conv_problems, fft_conv_problems

from conftest import FLOAT_DTYPES, random_array

F64 = np.float64
HYPOTHESIS = settings(max_examples=30, deadline=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture])


def _to_nhwc(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def _to_nchw(a):
    return np.ascontiguousarray(a.transpose(0, 3, 1, 2))


def _options(stride, padding, dilation, groups, layout="NCHW"):
    return dict(stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout)


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


# --- an independent implementation: the definition, as loops ---------------------

def naive_conv2d(x, w, bias, stride, padding, dilation, groups):
    """NCHW float64 convolution written straight from the definition."""
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    N, C, H, W = x.shape
    K, Cg, R, S = w.shape
    Kg = K // groups
    P = (H + 2 * ph - dh * (R - 1) - 1) // sh + 1
    Q = (W + 2 * pw - dw * (S - 1) - 1) // sw + 1
    y = np.zeros((N, K, P, Q))
    for n in range(N):
        for k in range(K):
            g = k // Kg
            for p in range(P):
                for q in range(Q):
                    total = 0.0 if bias is None else float(bias[k])
                    for c in range(Cg):
                        for r in range(R):
                            for s in range(S):
                                h, wi = p * sh - ph + r * dh, q * sw - pw + s * dw
                                if 0 <= h < H and 0 <= wi < W:
                                    total += x[n, g * Cg + c, h, wi] * w[k, c, r, s]
                    y[n, k, p, q] = total
    return y


# (N, C, H, W, K, R, S, stride, padding, dilation, groups)
CASES = [
    pytest.param((2, 3, 7, 7, 4, 3, 3, 1, 1, 1, 1), id="3x3"),
    pytest.param((1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1), id="all-ones"),
    pytest.param((3, 4, 13, 7, 6, 3, 5, 2, (1, 2), 1, 2), id="groups2-stride2"),
    pytest.param((2, 6, 13, 13, 6, 3, 3, 1, 1, 1, 6), id="depthwise"),
    pytest.param((2, 4, 8, 6, 8, 3, 3, 2, 1, 1, 4), id="depthwise-x2-stride2"),
    pytest.param((2, 4, 13, 13, 5, 3, 3, 3, 0, 2, 1), id="stride3-dilation2"),
    pytest.param((1, 3, 7, 13, 5, 1, 1, 1, 0, 1, 1), id="1x1"),
    pytest.param((2, 6, 7, 7, 12, 3, 2, (2, 1), (0, 1), (2, 1), 3), id="groups3-mixed"),
    pytest.param((2, 3, 5, 5, 2, 1, 1, 3, 0, 1, 1), id="stride-skips-pixels"),
    pytest.param((4, 16, 13, 13, 16, 3, 3, 1, 1, 1, 1), id="wide"),
    # Depthwise (groups == C) shapes for the "depthwise" algorithm: multipliers
    # 1, 2 and 3, strides, dilations, paddings, sizes 1, 3, 7, 13.
    pytest.param((2, 3, 13, 7, 6, 3, 3, 1, 2, 2, 3), id="depthwise-x2-dilation2-pad2"),
    pytest.param((1, 4, 13, 13, 4, 7, 7, 2, 3, 1, 4), id="depthwise-7x7-stride2"),
    pytest.param((3, 2, 7, 1, 6, 1, 1, 1, 0, 1, 2), id="depthwise-x3-1x1-width1"),
    pytest.param((2, 8, 7, 6, 8, 3, 3, (2, 1), (1, 0), (1, 2), 8), id="depthwise-mixed"),
]

TINY_CASES = CASES[:4] + CASES[5:6] + CASES[7:9]


def _random_problem(rng, case, layout, dtype):
    N, C, H, W, K, R, S, stride, padding, dilation, groups = case
    x = random_array(rng, (N, C, H, W), dtype)
    w = random_array(rng, (K, C // groups, R, S), dtype)
    b = random_array(rng, (K,), dtype)
    if layout == "NHWC":
        x = _to_nhwc(x)
    return x, w, b, _options(stride, padding, dilation, groups, layout)


# --- (1) the reference against independent implementations -----------------------

@pytest.mark.parametrize("case", TINY_CASES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_reference_forward_matches_loops(rng, case, layout):
    x, w, b, opts = _random_problem(rng, case, layout, F64)
    y = conv2d_forward(x, w, b, **opts)
    x_nchw = x if layout == "NCHW" else _to_nchw(x)
    expected = naive_conv2d(x_nchw, w, b, opts["stride"], opts["padding"], opts["dilation"],
                            opts["groups"])
    if layout == "NHWC":
        expected = _to_nhwc(expected)
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)


def test_reference_hand_computed():
    x = np.arange(9, dtype=F64).reshape(1, 1, 3, 3)   # [[0 1 2] [3 4 5] [6 7 8]]
    w = np.ones((1, 1, 2, 2))
    np.testing.assert_array_equal(conv2d_forward(x, w)[0, 0], [[8, 12], [20, 24]])
    # padding 1 adds a zero border; stride 2 keeps windows at padded rows/cols 0 and 2
    np.testing.assert_array_equal(conv2d_forward(x, w, stride=2, padding=1)[0, 0], [[0, 3], [9, 24]])
    # dilation 2 with a 2x2 filter reads the four corners
    np.testing.assert_array_equal(conv2d_forward(x, w, np.array([0.5]), dilation=2)[0, 0], [[16.5]])
    # cross-correlation, not convolution: the filter is not flipped
    w_corner = np.zeros((1, 1, 2, 2))
    w_corner[0, 0, 0, 0] = 1
    np.testing.assert_array_equal(conv2d_forward(x, w_corner)[0, 0], [[0, 1], [3, 4]])
    # backward data of a single output gradient spreads the filter onto its window
    dy = np.zeros((1, 1, 2, 2))
    dy[0, 0, 1, 0] = 1
    w_taps = np.array([[[[1.0, 2.0], [3.0, 4.0]]]])
    np.testing.assert_array_equal(conv2d_backward_data(dy, w_taps, (1, 1, 3, 3))[0, 0],
                                  [[0, 0, 0], [1, 2, 0], [3, 4, 0]])
    # backward filter of that dy picks out the window of x at output (1, 0)
    np.testing.assert_array_equal(conv2d_backward_filter(x, dy, (1, 1, 2, 2))[0, 0], [[3, 4], [6, 7]])
    np.testing.assert_array_equal(conv2d_backward_bias(np.ones((2, 3, 4, 5))), [40, 40, 40])


def _adjoint_check(rng, x_shape, w_shape, **opts):
    x, w = random_array(rng, x_shape, F64), random_array(rng, w_shape, F64)
    y = conv2d_forward(x, w, **opts)
    dy = random_array(rng, y.shape, F64)
    dx = conv2d_backward_data(dy, w, x.shape, **opts)
    dw = conv2d_backward_filter(x, dy, w.shape, **opts)
    lhs = np.vdot(y, dy)
    scale = np.linalg.norm(y) * np.linalg.norm(dy)
    assert abs(lhs - np.vdot(x, dx)) <= 1e-12 * scale, "<conv(x,w), dy> != <x, backward_data(dy,w)>"
    assert abs(lhs - np.vdot(w, dw)) <= 1e-12 * scale, "<conv(x,w), dy> != <w, backward_filter(x,dy)>"


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_reference_adjoint_identities(rng, case, layout):
    x, w, _, opts = _random_problem(rng, case, layout, F64)
    _adjoint_check(rng, x.shape, w.shape, **opts)


@settings(max_examples=40, deadline=None)
@given(problem=conv_problems(), seed=st.integers(0, 2**32 - 1))
def test_reference_adjoint_identities_drawn(problem, seed):
    problem = dict(problem)
    _adjoint_check(np.random.default_rng(seed), problem.pop("x_shape"), problem.pop("w_shape"),
                   **problem)


@settings(max_examples=25, deadline=None)
@given(problem=conv_problems(max_channels=4, max_size=7, max_filter=3, layouts=("NCHW",)),
       seed=st.integers(0, 2**32 - 1))
def test_reference_forward_matches_loops_drawn(problem, seed):
    rng = np.random.default_rng(seed)
    x = random_array(rng, problem["x_shape"], F64)
    w = random_array(rng, problem["w_shape"], F64)
    opts = {k: problem[k] for k in ("stride", "padding", "dilation", "groups")}
    np.testing.assert_allclose(conv2d_forward(x, w, **opts), naive_conv2d(x, w, None, **opts),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", [CASES[2], CASES[4], CASES[7]])
def test_reference_filter_and_bias_gradients_by_finite_differences(rng, case):
    # L(w, b) = <conv(x, w) + b, dy>; central differences are exact for a linear L
    # up to rounding, so a step of 1e-3 leaves only float64 rounding error.
    x, w, b, opts = _random_problem(rng, case, "NCHW", F64)
    dy = random_array(rng, conv2d_forward(x, w, b, **opts).shape, F64)

    def loss(w_, b_):
        return np.vdot(conv2d_forward(x, w_, b_, **opts), dy)

    eps = 1e-3
    numeric_dw = np.zeros_like(w)
    for i in np.ndindex(w.shape):
        step = np.zeros_like(w)
        step[i] = eps
        numeric_dw[i] = (loss(w + step, b) - loss(w - step, b)) / (2 * eps)
    numeric_db = np.array([(loss(w, b + eps * e) - loss(w, b - eps * e)) / (2 * eps)
                           for e in np.eye(len(b))])
    np.testing.assert_allclose(conv2d_backward_filter(x, dy, w.shape, **opts), numeric_dw,
                               rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(conv2d_backward_bias(dy), numeric_db, rtol=1e-7, atol=1e-8)


# --- (2) every algorithm against the float64 reference, on both paths --------------

def _problem_of(x, w, opts):
    return dnnprims.conv._describe(x.shape, w.shape, opts["stride"], opts["padding"],
                                   opts["dilation"], opts["groups"], opts["layout"], x.dtype)


def _smallest_normal(dtype):
    try:
        return float(np.finfo(dtype).smallest_normal)
    except ValueError:  # bfloat16 (ml_dtypes)
        import ml_dtypes
        return float(ml_dtypes.finfo(dtype).smallest_normal)


def _check_all_directions(xp, rng, x, w, b, opts, algo, directions=algos.DIRECTIONS):
    """Forward, both backward passes and the bias gradient of ``algo`` in x's dtype
    against the float64 reference on the same (storage-rounded) inputs (only the
    ``directions`` given run ``algo``; the others run "auto")."""
    dtype = x.dtype
    x64, w64, b64 = x.astype(F64), w.astype(F64), b.astype(F64)
    y64 = conv2d_forward(x64, w64, b64, **opts)
    dy = random_array(rng, y64.shape, dtype)
    dy64 = dy.astype(F64)
    dx64 = conv2d_backward_data(dy64, w64, x.shape, **opts)
    dw64 = conv2d_backward_filter(x64, dy64, w.shape, **opts)
    db64 = conv2d_backward_bias(dy64, layout=opts["layout"])

    X, Wt, B, DY = (xp.asarray(a) for a in (x, w, b, dy))
    use = {d: algo if d in directions else "auto" for d in algos.DIRECTIONS}
    # A direction left to "auto" is held to the tolerance of what auto runs there (the table
    # may pick e.g. Winograd F(4x4,5x5), whose bound is wider than ``algo``'s).
    choose_opts = {k: v for k, v in opts.items()
                   if k in ("stride", "padding", "dilation", "groups", "layout")}
    bound_of = {d: algo if d in directions else
                (dnnprims.conv2d_choose(x.shape, w.shape, dtype=dtype, direction=d, **choose_opts)[0]
                 if xp is not np else algo)
                for d in algos.DIRECTIONS}
    y = conv2d_forward(X, Wt, B, algo=use["forward"], **opts)
    dx = conv2d_backward_data(DY, Wt, x.shape, algo=use["backward_data"], **opts)
    dw = conv2d_backward_filter(X, DY, w.shape, algo=use["backward_filter"], **opts)
    db = conv2d_backward_bias(DY, layout=opts["layout"])
    for out in (y, dx, dw, db):
        assert isinstance(out, type(X)) and out.dtype == dtype
    # The bias can cancel the sum of products: bound against the terms' magnitude.  Below the
    # dtype's smallest normal number the stored result has absolute, not relative, precision (a
    # float16 product of one random tap can land there): the scale never drops under it.
    tiny = _smallest_normal(dtype)
    floor = lambda a: np.maximum(np.abs(a), tiny)  # noqa: E731
    y_magnitude = conv2d_forward(np.abs(x64), np.abs(w64), np.abs(b64), **opts)
    assert_close(y, y64, dtype, algorithm=bound_of["forward"], what="forward", magnitude=floor(y_magnitude))
    assert_close(dx, dx64, dtype, algorithm=bound_of["backward_data"], what="backward_data", magnitude=floor(dx64))
    assert_close(dw, dw64, dtype, algorithm=bound_of["backward_filter"], what="backward_filter",
                 magnitude=floor(dw64))
    assert_close(db, db64, dtype, what="backward_bias", magnitude=floor(db64))


@pytest.mark.parametrize("algo", sorted(algos.REGISTRY))
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_algorithm_matches_reference(xp, rng, algo, case, layout, dtype):
    x, w, b, opts = _random_problem(rng, case, layout, dtype)
    problem = _problem_of(x, w, opts)
    unsupported = [d for d in algos.DIRECTIONS if not algos.REGISTRY[algo].supports(problem, d)[0]]
    if unsupported:
        # An algorithm for part of the problems must refuse the others clearly.
        y = conv2d_forward(x, w, **opts)
        calls = {"forward": lambda: conv2d_forward(xp.asarray(x), xp.asarray(w), algo=algo, **opts),
                 "backward_data": lambda: conv2d_backward_data(xp.asarray(y), xp.asarray(w), x.shape,
                                                               algo=algo, **opts),
                 "backward_filter": lambda: conv2d_backward_filter(xp.asarray(x), xp.asarray(y),
                                                                   w.shape, algo=algo, **opts)}
        for direction in unsupported:
            with pytest.raises(ValueError, match=f"algo '{algo}' does not support this {direction}"):
                calls[direction]()
    supported = [d for d in algos.DIRECTIONS if d not in unsupported]
    if supported:  # the directions it does support are still checked
        _check_all_directions(xp, rng, x, w, b, opts, algo, supported)


@HYPOTHESIS
@given(problem=conv_problems(), dtype=st.sampled_from(_dtypes.SUPPORTED), seed=st.integers(0, 2**32 - 1))
def test_auto_matches_reference_drawn(xp, problem, dtype, seed):
    rng = np.random.default_rng(seed)
    problem = dict(problem)
    x = random_array(rng, problem.pop("x_shape"), dtype)
    w = random_array(rng, problem.pop("w_shape"), dtype)
    b = random_array(rng, (w.shape[0],), dtype)
    _check_all_directions(xp, rng, x, w, b, problem, "auto")


def test_auto_rule(rule_only):
    def auto(x_shape, w_shape, dtype=np.float32, groups=1):
        problem = _problem_of(np.zeros(x_shape, dtype), np.zeros(w_shape, dtype), _options(1, 1, 1, groups))
        return tuple(algos.choose(problem, d, "auto").name for d in algos.DIRECTIONS)

    # (forward, backward_data, backward_filter)
    wgrad = "implicit_gemm_wgrad"
    assert auto((2, 4, 7, 7), (8, 4, 3, 3)) == ("implicit_gemm", "implicit_gemm", wgrad)
    assert auto((2, 4, 7, 7), (8, 4, 3, 3), np.float64) == ("gemm",) * 3     # implicit_gemm: no float64
    assert auto((2, 4, 7, 7), (8, 4, 3, 3), np.float16) == ("implicit_gemm", "implicit_gemm", wgrad)
    assert auto((2, 4, 7, 7), (8, 2, 3, 3), groups=2) == ("direct",) * 3     # 4 filters a group
    assert auto((2, 64, 7, 7), (64, 32, 3, 3), groups=2) == ("direct", "direct", wgrad)
    assert auto((2, 4, 7, 7), (4, 1, 3, 3), groups=4) == ("depthwise",) * 3  # depthwise
    assert auto((2, 4, 7, 7), (8, 1, 3, 3), groups=4) == ("depthwise",) * 3  # multiplier 2
    assert auto((2, 4, 7, 7), (4, 1, 3, 3), np.float16, groups=4) == ("depthwise",) * 3
    deep = auto((2, 512, 7, 7), (512, 512, 3, 3))                         # GEMM depth 4608: cuBLAS
    assert deep == ("gemm", "gemm", wgrad)                                # too small for Winograd
    # Column matrix 64*576*4096 floats = 604 MB: backward filter still takes gemm,
    # in batch chunks that fit gemm.FILTER_CHUNK_BYTES.
    big = (64, 64, 64, 64)
    assert auto(big, (64, 64, 3, 3)) == ("winograd_f4x4_3x3", "winograd_f4x4_3x3",       # 19 GFLOP
                                         "winograd_wgrad_f3x3_4x4")
    assert algos.REGISTRY["gemm"].workspace_bytes(
        _problem_of(np.empty(big, np.float32), np.empty((64, 64, 3, 3), np.float32), _options(1, 1, 1, 1, "NCHW")),
        "backward_filter") <= gemm_algo.FILTER_CHUNK_BYTES


def test_conv2d_choose_says_what_auto_runs_and_why(rule_only):
    name, reason = dnnprims.conv2d_choose((2, 4, 7, 7), (8, 4, 3, 3), padding=1)
    assert name == "implicit_gemm" and "depth" in reason
    name, reason = dnnprims.conv2d_choose((2, 4, 7, 7), (8, 4, 3, 3), padding=1,
                                          direction="backward_filter")
    assert name == "implicit_gemm_wgrad" and "split-K" in reason
    name, reason = dnnprims.conv2d_choose((2, 64, 7, 7), (8, 64, 3, 3), padding=1, stride=2,
                                          direction="backward_data")
    assert name == "implicit_gemm_subpixel" and "phase" in reason
    # Few channels, or phases without taps (1x1, stride 2): im2col + cuBLAS.
    for x_shape, w_shape in (((2, 4, 7, 7), (8, 4, 3, 3)), ((2, 64, 7, 7), (8, 64, 1, 1))):
        assert dnnprims.conv2d_choose(x_shape, w_shape, stride=2, direction="backward_data")[0] == "gemm"
    assert dnnprims.conv2d_choose((2, 4, 7, 7), (8, 4, 1, 1), stride=2, direction="backward_data",
                                  dtype="float16")[0] == "implicit_gemm_subpixel"
    assert dnnprims.conv2d_choose((2, 4, 7, 7), (8, 4, 3, 3), algo="direct")[0] == "direct"
    with pytest.raises(ValueError, match="direction must be one of"):
        dnnprims.conv2d_choose((2, 4, 7, 7), (8, 4, 3, 3), direction="sideways")


@pytest.mark.parametrize("mode,alpha", [("relu", None), ("gelu", None), ("leaky_relu", 0.2),
                                        ("clipped_relu", 0.5)])
@pytest.mark.parametrize("algo", ["auto", "direct"])
def test_forward_activation_is_act_of_conv_plus_bias(xp, rng, mode, alpha, algo):
    x, w, b, opts = _random_problem(rng, CASES[0].values[0], "NCHW", np.float64)
    want = dnnprims.activation(conv2d_forward(x, w, b, **opts), mode, alpha=alpha)
    got = conv2d_forward(xp.asarray(x), xp.asarray(w), xp.asarray(b), activation=mode, alpha=alpha,
                         algo=algo, **opts)
    assert_close(got, want, np.float64)


# implicit_gemm: P*Q = 49 (scalar stores) and 64 (float4 stores along p*q in NCHW).
FUSED_PATHS = [pytest.param(algo, dtype, case, id=f"{algo}-{np.dtype(dtype).name}-{case_id}")
               for algo, case, case_id in (("implicit_gemm", CASES[0].values[0], "7x7"),
                                           ("implicit_gemm", (2, 3, 8, 8, 8, 3, 3, 1, 1, 1, 1), "8x8"),
                                           ("depthwise", CASES[3].values[0], "13x13"),
                                           ("depthwise", (2, 8, 9, 20, 16, 3, 3, 1, 1, 1, 8), "x2"),
                                           ("depthwise", (2, 4, 9, 11, 4, 3, 3, 2, 1, 1, 4), "stride2"))
               for dtype in _dtypes.SUPPORTED if not (algo == "implicit_gemm" and np.dtype(dtype) == F64)]


@pytest.mark.parametrize("mode", dnnprims.ACTIVATION_MODES)
@pytest.mark.parametrize("algo,dtype,case", FUSED_PATHS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_fused_activation_epilogue(xp, rng, mode, algo, dtype, case, layout):
    """activation=mode in the epilogue equals activation(conv + bias): against the
    float64 reference, and against the unfused pass on the same path."""
    assert mode in algos.REGISTRY[algo].fused_activations
    alpha = {"elu": 0.7, "leaky_relu": 0.2, "clipped_relu": 0.5}.get(mode)
    x, w, b, opts = _random_problem(rng, case, layout, dtype)
    x64, w64, b64 = x.astype(F64), w.astype(F64), b.astype(F64)
    want = dnnprims.activation(conv2d_forward(x64, w64, b64, **opts), mode, alpha=alpha)
    magnitude = conv2d_forward(np.abs(x64), np.abs(w64), np.abs(b64), **opts)
    X, Wt, B = xp.asarray(x), xp.asarray(w), xp.asarray(b)
    got = conv2d_forward(X, Wt, B, activation=mode, alpha=alpha, algo=algo, **opts)
    assert got.dtype == x.dtype
    assert_close(got, want, dtype, algorithm=algo, what=f"forward+{mode}", magnitude=magnitude)
    unfused = dnnprims.activation(conv2d_forward(X, Wt, B, algo=algo, **opts), mode, alpha=alpha)
    assert_close(got, unfused.astype(F64) if xp is np else unfused.astype(xp.float64), dtype,
                 algorithm=algo, what=f"fused vs unfused {mode}", magnitude=magnitude)


def test_options_constrain_the_choice():
    problem = _problem_of(np.empty((2, 4, 7, 7), np.float32), np.empty((8, 4, 3, 3), np.float32),
                          _options(1, 1, 1, 1))
    # deterministic=True and a zero workspace limit each still leave an
    # algorithm for every direction (the atomic backward filter is refused).
    for direction in algos.DIRECTIONS:
        name, _ = algos.explain_auto(problem, direction, algos.ConvOptions(workspace_limit=0))
        assert algos.REGISTRY[name].workspace_bytes(problem, direction) == 0
        assert algos.explain_auto(problem, direction, algos.ConvOptions(deterministic=True))[0]
    gemm = algos.REGISTRY["gemm"]
    assert gemm.workspace_bytes(problem, "backward_filter") > 0
    ok, reason = algos.admits(gemm, problem, "backward_filter", algos.ConvOptions(workspace_limit=0))
    assert not ok and "workspace_limit=0" in reason
    with pytest.raises(ValueError, match="workspace_limit"):
        algos.choose(problem, "backward_filter", "gemm", options=algos.ConvOptions(workspace_limit=0))
    name, _ = dnnprims.conv2d_choose((2, 4, 7, 7), (8, 4, 3, 3), padding=1, direction="backward_filter",
                                     workspace_limit=0, deterministic=True, precision="strict")
    assert algos.REGISTRY[name].workspace_bytes(problem, "backward_filter") == 0


def test_algorithms_that_break_options_are_refused(monkeypatch):
    class Racy(algos.ConvAlgorithm):
        name = "racy_test_algorithm"
        deterministic = False
        strict = False
    racy = Racy()
    monkeypatch.setitem(algos.REGISTRY, racy.name, racy)
    problem = _problem_of(np.empty((2, 4, 7, 7), np.float32), np.empty((8, 4, 3, 3), np.float32),
                          _options(1, 1, 1, 1))
    assert algos.admits(racy, problem, "forward")[0]
    assert "deterministic" in algos.admits(racy, problem, "forward", algos.ConvOptions(deterministic=True))[1]
    assert "strict" in algos.admits(racy, problem, "forward", algos.ConvOptions(precision="strict"))[1]


@pytest.mark.parametrize("kwargs,match", [
    (dict(workspace_limit=-1), "workspace_limit"), (dict(workspace_limit=1.5), "workspace_limit"),
    (dict(precision="loose"), "precision"), (dict(activation="swish"), "mode"),
    (dict(alpha=0.1), "alpha"), (dict(activation="relu", alpha=0.1), "alpha")])
def test_rejects_bad_forward_options(kwargs, match):
    x, w = np.ones((1, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32)
    with pytest.raises((TypeError, ValueError), match=match):
        conv2d_forward(x, w, **kwargs)


def test_rejects_bad_backward_options():
    x, dy = np.ones((1, 2, 5, 5), np.float32), np.ones((1, 3, 3, 3), np.float32)
    with pytest.raises(TypeError, match="deterministic"):
        conv2d_backward_filter(x, dy, (3, 2, 3, 3), deterministic="yes")
    with pytest.raises(ValueError, match="precision"):
        conv2d_backward_data(dy, np.ones((3, 2, 3, 3), np.float32), x.shape, precision="fast")
    with pytest.raises(ValueError, match="workspace_limit"):
        conv2d_backward_filter(x, None, (3, 2, 3, 3), workspace_limit=-5)


@pytest.mark.gpu
def test_repeated_gpu_calls_reuse_the_validated_plan_and_still_check(gpu, rng):
    from dnnprims import conv as conv_module
    x, w, b, opts = _random_problem(rng, CASES[0].values[0], "NCHW", np.float32)
    gx, gw, gb = gpu.asarray(x), gpu.asarray(w), gpu.asarray(b)
    first = conv2d_forward(gx, gw, gb, **opts)
    entries = len(conv_module._MEMO._entries)
    again = conv2d_forward(gx, gw, gb, **opts)
    assert len(conv_module._MEMO._entries) == entries          # the second call took the memo
    assert gpu.array_equal(first, again)
    assert_close(again, conv2d_forward(x.astype(F64), w.astype(F64), b.astype(F64), **opts), np.float32)
    # A call that differs only in what validation checks is still refused.
    with pytest.raises(TypeError, match="stride"):
        conv2d_forward(gx, gw, gb, **{**opts, "stride": True})
    with pytest.raises(TypeError, match="dtype"):
        conv2d_forward(gx, gw.astype(gpu.float64), gb, **opts)
    with pytest.raises(ValueError, match="bias"):
        conv2d_forward(gx, gw, gb[:-1], **opts)
    with pytest.raises(TypeError, match="cannot mix"):
        conv2d_forward(gx, w, gb, **opts)
    dy = gpu.asarray(random_array(rng, first.shape, np.float32))
    for _ in range(2):
        dx = conv2d_backward_data(dy, gw, x.shape, **opts)
        dw = conv2d_backward_filter(gx, dy, w.shape, **opts)
    assert_close(dx, conv2d_backward_data(dy.get().astype(F64), w.astype(F64), x.shape, **opts), np.float32)
    assert_close(dw, conv2d_backward_filter(x.astype(F64), dy.get().astype(F64), w.shape, **opts), np.float32)
    with pytest.raises(ValueError, match="dy has shape"):
        conv2d_backward_data(dy[:, :, :-1], gw, x.shape, **opts)


def test_find_caches_the_winner_in_memory_and_on_disk(monkeypatch, tmp_path):
    from dnnprims.algos import find as find_mode
    monkeypatch.setenv("DNNPRIMS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(find_mode, "gpu_name", lambda: "Test GPU")
    timed = []

    def fake_times(problem, direction, names, options=None, failed=None):
        timed.append(direction)
        return {name: (0.5 if name == "direct" else 1.0) for name in names}

    monkeypatch.setattr(find_mode, "time_algorithms", fake_times)
    find_mode.forget()
    problem = _problem_of(np.zeros((2, 4, 7, 7), np.float32), np.zeros((8, 4, 3, 3), np.float32),
                          _options(1, 1, 1, 1))
    assert algos.choose(problem, "forward", "find", gpu=True).name == "direct"
    assert algos.choose(problem, "forward", "find", gpu=True).name == "direct"
    assert timed == ["forward"]                     # timed once, then from memory
    find_mode.forget()
    assert find_mode.find(problem, "forward") == "direct"
    assert timed == ["forward"]                     # then from the file
    entries = __import__("json").loads((tmp_path / "conv_find.json").read_text())
    assert entries["version"] == find_mode.VERSION
    (key, entry), = entries["entries"].items()
    assert key.startswith("TestGPU|forward|") and entry["algo"] == "direct"
    assert set(entry["ms"]) == set(find_mode.candidates(problem, "forward"))
    # NumPy path: "find" means "auto", no timing
    assert algos.choose(problem, "backward_data", "find").name == algos.auto_rule(problem, "backward_data")
    find_mode.forget()


@pytest.mark.gpu
def test_find_runs_on_the_gpu(gpu, rng, monkeypatch, tmp_path):
    from dnnprims.algos import find as find_mode
    monkeypatch.setenv("DNNPRIMS_CACHE_DIR", str(tmp_path))
    find_mode.forget()
    x, w, b, opts = _random_problem(rng, CASES[9].values[0], "NCHW", np.float32)
    _check_all_directions(gpu, rng, x, w, b, opts, "find")
    assert (tmp_path / "conv_find.json").exists()
    find_mode.forget()


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_implicit_gemm_tap_table_on_numpy(rng, case, layout):
    # The kernel's GEMM, written out on NumPy from the tap table and the same
    # per-row decoding: A[m, k] gathered through the table, B[k, n] through
    # w_off, out = A @ B.  Checks the table and the rotated-filter backward data.
    from dnnprims.algos import implicit_gemm
    x, w, _, opts = _random_problem(rng, case, layout, F64)
    p = _problem_of(x, w, opts)
    nhwc = layout == "NHWC"
    directions = [("forward", x, conv2d_forward(x, w, **opts))]
    if p.stride == (1, 1):
        dy = random_array(rng, p.y_shape, F64)
        directions.append(("backward_data", dy, conv2d_backward_data(dy, w, x.shape, **opts)))
    for direction, a, expected in directions:
        table, g = implicit_gemm.tap_table(p, direction)
        g = {k: int(v) for k, v in g.items()}
        H, W, Cx, P, Q, Ky, Kg = (g[k] for k in ("H", "W", "Cx", "P", "Q", "Ky", "Kg"))
        M, kgemm = p.N * P * Q, g["Kgemm"]
        assert len(table) % implicit_gemm.TAP_TABLE_MULTIPLE == 0 and len(table) >= kgemm
        out = np.full(expected.size, np.nan)
        image, pq = np.divmod(np.arange(M), P * Q)
        h0 = pq // Q * g["sh"] - g["ph"]
        w0 = pq % Q * g["sw"] - g["pw"]
        base = image * Cx * H * W + ((h0 * W + w0) * Cx if nhwc else h0 * W + w0)
        for group in range(p.groups):
            x_off = group * g["x_group_channels"] * (1 if nhwc else H * W)
            hh, ww = h0[:, None] + table[None, :, 1], w0[:, None] + table[None, :, 2]
            inside = (hh >= 0) & (hh < H) & (ww >= 0) & (ww < W)
            index = np.where(inside, x_off + base[:, None] + table[None, :, 0], 0)
            A = np.where(inside, a.ravel()[index], 0.0)
            B = w.ravel()[group * g["w_group_stride"] + np.arange(Kg)[None, :] * g["w_n_stride"]
                          + table[:kgemm, 3][:, None]]
            Y = A[:, :kgemm] @ B
            channel = group * Kg + np.arange(Kg)[None, :]
            where = (np.arange(M)[:, None] * Ky + channel if nhwc
                     else (image[:, None] * Ky + channel) * P * Q + pq[:, None])
            out[where] = Y
        np.testing.assert_allclose(out.reshape(expected.shape), expected, rtol=1e-12, atol=1e-12,
                                   err_msg=direction)


def _emulated_column_view(p, col, strides):
    """col seen as [n, c, r, s, p, q] through the kernels' element strides."""
    sn, sj, spq = (st_ * col.itemsize for st_ in strides)
    return np.lib.stride_tricks.as_strided(
        col, (p.N, p.C, p.R, p.S, p.P, p.Q),
        (sn, p.R * p.S * sj, p.S * sj, sj, p.Q * spq, spq), writeable=True)


def _emulated_im2col(p, x, col, strides):
    """kernels/conv_im2col.cu's conv_im2col, from its definition."""
    x = x if p.layout == "NCHW" else x.transpose(0, 3, 1, 2)
    ph, pw = p.padding
    xpad = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    view = _emulated_column_view(p, col, strides)
    for r in range(p.R):
        for s in range(p.S):
            h0, w0 = r * p.dilation[0], s * p.dilation[1]
            view[:, :, r, s] = xpad[:, :, h0:h0 + p.stride[0] * (p.P - 1) + 1:p.stride[0],
                                    w0:w0 + p.stride[1] * (p.Q - 1) + 1:p.stride[1]]


def _emulated_col2im(p, col, dx, strides):
    """kernels/conv_im2col.cu's conv_col2im, from its definition."""
    ph, pw = p.padding
    dxpad = np.zeros((p.N, p.C, p.H + 2 * ph, p.W + 2 * pw))
    view = _emulated_column_view(p, col, strides)
    for r in range(p.R):
        for s in range(p.S):
            h0, w0 = r * p.dilation[0], s * p.dilation[1]
            dxpad[:, :, h0:h0 + p.stride[0] * (p.P - 1) + 1:p.stride[0],
                  w0:w0 + p.stride[1] * (p.Q - 1) + 1:p.stride[1]] += view[:, :, r, s]
    dxpad = dxpad[:, :, ph:ph + p.H, pw:pw + p.W]
    dx[...] = dxpad if p.layout == "NCHW" else dxpad.transpose(0, 2, 3, 1)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_gemm_bookkeeping_on_numpy(monkeypatch, rng, case, layout):
    # The gemm algorithm's reshapes, transposes and strides, run on NumPy with
    # im2col / col2im emulated; the kernels themselves are checked on the GPU.
    monkeypatch.setattr(gemm_algo, "im2col", _emulated_im2col)
    monkeypatch.setattr(gemm_algo, "col2im", _emulated_col2im)
    x, w, b, opts = _random_problem(rng, case, layout, F64)
    p = _problem_of(x, w, opts)
    algorithm = algos.REGISTRY["gemm"]
    y = algorithm._forward(np, p, x, w, np.empty(p.y_shape), b)
    np.testing.assert_allclose(y, conv2d_forward(x, w, b, **opts), rtol=1e-12, atol=1e-12)
    dy = random_array(rng, p.y_shape, F64)
    dx = algorithm._backward_data(np, p, dy, w, np.empty(p.x_shape))
    np.testing.assert_allclose(dx, conv2d_backward_data(dy, w, x.shape, **opts), rtol=1e-12, atol=1e-12)
    dw = algorithm._backward_filter(np, p, x, dy, np.empty(p.w_shape))
    np.testing.assert_allclose(dw, conv2d_backward_filter(x, dy, w.shape, **opts), rtol=1e-12,
                               atol=1e-12)
    # No workspace exactly for a plain GEMM: pointwise, and not grouped NHWC (whose per-group
    # products are allocated next to y: review6h item 5).
    plain_gemm = gemm_algo.is_pointwise(p) and not (p.layout == "NHWC" and p.groups > 1)
    assert (algorithm.workspace_bytes(p, "forward") == 0) == plain_gemm
    # One sample per chunk: the batch-chunked backward filter sums the same terms.
    monkeypatch.setattr(gemm_algo, "FILTER_CHUNK_BYTES", 1)
    dw_chunked = algorithm._backward_filter(np, p, x, dy, np.empty(p.w_shape))
    np.testing.assert_allclose(dw_chunked, dw, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk_bytes", [None, 1, 20000])
@pytest.mark.parametrize("case", [
    pytest.param((3, 4, 13, 7, 6, 3, 5, 2, (1, 2), 1, 2), id="groups2-stride2"),
    pytest.param((7, 8, 9, 9, 16, 3, 3, 1, 1, 1, 1), id="3x3-batch7"),
    pytest.param((5, 8, 9, 9, 16, 1, 1, 1, 0, 1, 1), id="pointwise"),
    pytest.param((3, 8, 9, 9, 16, 3, 3, 1, 1, 1, 4), id="groups4"),
    pytest.param((13, 8, 9, 9, 16, 1, 1, 1, 0, 1, 4), id="pointwise-groups4-batch13"),
])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_gemm_buffers_of_a_call_fit_workspace_bytes(monkeypatch, rng, case, layout, chunk_bytes):
    # The NumPy path allocates the buffers CuPy's does (columns, transposed copies,
    # matmul results); im2col / col2im write in place and allocate nothing, so they
    # are left out.  NumPy's beta != 0 GEMM allocates a dw-sized product that
    # cuBLAS does not: one dw of slack, plus 4 KiB of Python objects.
    import tracemalloc
    monkeypatch.setattr(gemm_algo, "im2col", lambda p, x, col, strides: None)
    monkeypatch.setattr(gemm_algo, "col2im", lambda p, col, dx, strides: None)
    if chunk_bytes is not None:
        monkeypatch.setattr(gemm_algo, "FILTER_CHUNK_BYTES", chunk_bytes)
    x, w, _, opts = _random_problem(rng, case, layout, F64)
    p = _problem_of(x, w, opts)
    dy = random_array(rng, p.y_shape, F64)
    algorithm = algos.REGISTRY["gemm"]
    calls = {"forward": (algorithm._forward, x, w, p.y_shape),
             "backward_data": (algorithm._backward_data, dy, w, p.x_shape),
             "backward_filter": (algorithm._backward_filter, x, dy, p.w_shape)}
    for direction, (call, a, b, shape) in calls.items():
        out = np.empty(shape)
        call(np, p, a, b, out, None)
        tracemalloc.start()
        try:
            call(np, p, a, b, out, None)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak <= algorithm.workspace_bytes(p, direction) + w.nbytes + 4096, (direction, peak)


@pytest.mark.parametrize("N", [1, 3, 7, 13])
@pytest.mark.parametrize("chunk", [1, 2, 4, 5, 14])
def test_gemm_backward_filter_chunks_cover_each_sample_once(monkeypatch, N, chunk):
    seen = []
    monkeypatch.setattr(gemm_algo.GemmConvolution, "_backward_filter_chunk", staticmethod(
        lambda xp, p, x, dy, dw, accumulate=False: seen.append((p.N, list(x[:, 0, 0, 0]), accumulate))))
    p = dnnprims.conv._describe((N, 2, 5, 5), (3, 2, 3, 3), (1, 1), (1, 1), (1, 1), 1, "NCHW", F64)
    per_sample = (2 * 9 + 3) * 25 * 8     # columns and the copy of dy, a sample
    monkeypatch.setattr(gemm_algo, "FILTER_CHUNK_BYTES", chunk * per_sample)
    x = np.arange(N, dtype=F64)[:, None, None, None] * np.ones(p.x_shape)
    assert gemm_algo.filter_chunk(p) == min(chunk, N)
    gemm_algo.GemmConvolution._backward_filter(np, p, x, np.zeros(p.y_shape), np.empty(p.w_shape))
    assert [n for n, _, _ in seen] == [min(chunk, N - n0) for n0 in range(0, N, chunk)]
    assert sum((images for _, images, _ in seen), []) == list(range(N))
    assert [accumulate for _, _, accumulate in seen] == [False] + [True] * (len(seen) - 1)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_gemm_backward_filter_in_batch_chunks_on_the_gpu(gpu, rng, monkeypatch, layout):
    monkeypatch.setattr(gemm_algo, "FILTER_CHUNK_BYTES", 20000)  # two samples per chunk
    x, w, b, opts = _random_problem(rng, (7, 3, 9, 8, 5, 3, 3, 1, 1, 1, 1), layout, np.float32)
    dy = random_array(rng, conv2d_output_shape(x.shape, w.shape, **opts), np.float32)
    p = _problem_of(x, w, opts)
    assert 1 < gemm_algo.filter_chunk(p) < p.N
    dw = conv2d_backward_filter(gpu.asarray(x), gpu.asarray(dy), w.shape, algo="gemm", **opts)
    expected = conv2d_backward_filter(x.astype(F64), dy.astype(F64), w.shape, **opts)
    assert_close(dw, expected, np.float32, algorithm="gemm", what="backward_filter")


# --- FFT convolution (dnnprims/algos/fft.py) --------------------------------------

FFT_ALGOS = ("fft", "fft_tiled")
# (N, C, H, W, K, R, S, stride, padding, dilation, groups): large filters, odd
# sizes, padding 0..5 (more than the filter's half: wrapped placements), dilation.
FFT_CASES = [
    pytest.param((1, 3, 13, 13, 4, 5, 5, 1, 2, 1, 1), id="5x5-pad2"),
    pytest.param((3, 2, 13, 7, 3, 5, 5, 1, (0, 1), 1, 1), id="5x5-13x7-pad0"),
    pytest.param((3, 4, 13, 13, 5, 7, 7, 1, 3, 1, 1), id="7x7-pad3-batch3"),
    pytest.param((1, 2, 7, 7, 3, 7, 7, 1, 5, 1, 1), id="7x7-on-7x7-pad5"),
    pytest.param((1, 3, 13, 13, 2, 11, 11, 1, 5, 1, 1), id="11x11-pad5"),
    pytest.param((3, 2, 13, 13, 3, 11, 11, 1, (4, 0), 1, 1), id="11x11-pad4-0"),
    pytest.param((2, 3, 13, 7, 2, 3, 3, 1, (5, 1), 2, 1), id="3x3-dilation2-pad5"),
]


def _fft_run_on_numpy(rng, case, layout, algo):
    """The FFT algorithm's placements, tiles and GEMM bookkeeping on NumPy in
    float64, against the reference."""
    x, w, b, opts = _random_problem(rng, case, layout, F64)
    p = _problem_of(x, w, opts)
    algorithm = algos.REGISTRY[algo]
    y = algorithm._run(np, p, "forward", x, w, np.empty(p.y_shape), b)
    np.testing.assert_allclose(y, conv2d_forward(x, w, b, **opts), rtol=1e-11, atol=1e-11)
    dy = random_array(rng, p.y_shape, F64)
    dx = algorithm._run(np, p, "backward_data", dy, w, np.empty(p.x_shape))
    np.testing.assert_allclose(dx, conv2d_backward_data(dy, w, x.shape, **opts), rtol=1e-11, atol=1e-11)
    dw = algorithm._run(np, p, "backward_filter", x, dy, np.empty(p.w_shape))
    np.testing.assert_allclose(dw, conv2d_backward_filter(x, dy, w.shape, **opts), rtol=1e-11,
                               atol=1e-11)
    return p


@pytest.mark.parametrize("algo", FFT_ALGOS)
@pytest.mark.parametrize("case", FFT_CASES + [CASES[0], CASES[1], CASES[6], CASES[9]])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("buffers", ["spatial_first", "plain"])
def test_fft_bookkeeping_on_numpy(monkeypatch, rng, case, layout, algo, buffers):
    monkeypatch.setattr(fft_algo, "LAYOUT", buffers)
    _fft_run_on_numpy(rng, case, layout, algo)


@pytest.mark.parametrize("case", FFT_CASES + [CASES[0], CASES[1], CASES[6], CASES[9]])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("buffers", ["strided", "spatial_first"])
def test_fft_fast_path_on_numpy(monkeypatch, rng, case, layout, buffers):
    # The fast path's buffer layouts and GEMM shapes with NumPy stand-ins for its
    # kernels and cuFFT ("plain" and "fft_tiled" always take the generic path).
    monkeypatch.setattr(fft_algo, "FAST", True)
    monkeypatch.setattr(fft_algo, "LAYOUT", buffers)
    _fft_run_on_numpy(rng, case, layout, "fft")


def test_fft_fast_setup_is_cached(monkeypatch, rng):
    monkeypatch.setattr(fft_algo, "FAST", True)
    monkeypatch.setattr(fft_algo, "_setups", {})
    _fft_run_on_numpy(rng, FFT_CASES[1].values[0], "NCHW", "fft")
    _fft_run_on_numpy(rng, FFT_CASES[1].values[0], "NCHW", "fft")
    assert len(fft_algo._setups) == 2      # forward and backward data: one setup each


def test_fft_plans_are_kept_per_stream_and_host_thread(monkeypatch):
    # review6f: a cuFFT plan (cupy.cuda.cufft.PlanNd) keeps one work area for its
    # life and is put on the caller's stream per call, and cuFFT plans are not to be
    # shared between host threads.  _plans (and the fast path's setups, which held
    # two plans) were keyed by device, kind, size and batch only: two streams or
    # threads running one problem shared a plan, so two transforms in flight at once
    # shared its scratch memory.  cuFFT, the device query and the stream are faked.
    import threading
    import types
    cupy = pytest.importorskip("cupy")

    class Plan:
        def __init__(self, *args):
            self.args = args
    fake = types.SimpleNamespace(PlanNd=Plan, CUFFT_R2C=0x2a, CUFFT_C2R=0x2c, CUFFT_D2Z=0x6a, CUFFT_Z2D=0x6c)
    monkeypatch.setitem(vars(cupy.cuda), "cufft", fake)
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 0)
    stream = types.SimpleNamespace(ptr=77)
    monkeypatch.setattr(dnnprims._kernels, "_current_stream", lambda: stream)
    monkeypatch.setattr(fft_algo, "_plans", {})

    def plans():
        return ([fft_algo._plan(cupy, inverse, np.float32, (8, 10), 6) for inverse in (False, True)]
                + [fft_algo._spatial_plan(inverse, np.float32, (8, 10), 6) for inverse in (False, True)])
    first = plans()
    assert len(set(map(id, first))) == 4 and plans() == first     # kept for this stream and thread
    stream.ptr = 78
    assert not set(map(id, plans())) & set(map(id, first))       # another stream: plans of its own
    stream.ptr = 77
    seen = []
    thread = threading.Thread(target=lambda: seen.extend(plans()))
    thread.start()
    thread.join()
    assert len(seen) == 4 and not set(map(id, seen)) & set(map(id, first))   # another thread too
    assert plans() == first


@pytest.mark.parametrize("buffers", ["strided", "spatial_first"])
def test_fft_fast_path_on_a_faked_device_takes_its_plans_per_stream(monkeypatch, buffers):
    # The fast path's GPU branch with CuPy arrays over host memory and the kernels,
    # cuBLAS and cuFFT faked: it runs a forward plan over N J transforms and an
    # inverse over N K, takes them per stream (review6f: they were held by the
    # per-problem setup), and allocates no more than workspace_bytes.
    import types
    import weakref
    cupy = pytest.importorskip("cupy")
    from cupy.cuda.memory import MemoryPointer, UnownedMemory
    live, peak = [0], [0]

    def allocate(nbytes):
        host = np.zeros(max(nbytes, 1), np.uint8)
        memory = UnownedMemory(host.ctypes.data, host.nbytes, host, device_id=0)
        live[0] += nbytes
        peak[0] = max(peak[0], live[0])
        weakref.finalize(host, lambda: live.__setitem__(0, live[0] - nbytes))   # dies with memory
        return MemoryPointer(memory, 0)

    runs = []

    class Plan:
        def __init__(self, *args):
            self.batch = args[8]

        def fft(self, a, out, direction):
            runs.append((self, self.batch, direction))
    fake = types.SimpleNamespace(PlanNd=Plan, CUFFT_R2C=0x2a, CUFFT_C2R=0x2c, CUFFT_D2Z=0x6a, CUFFT_Z2D=0x6c,
                                 CUFFT_FORWARD=-1, CUFFT_INVERSE=1)
    monkeypatch.setitem(vars(cupy.cuda), "cufft", fake)
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 0)
    stream = types.SimpleNamespace(ptr=77)
    monkeypatch.setattr(dnnprims._kernels, "_current_stream", lambda: stream)
    monkeypatch.setattr(fft_algo, "_plans", {})
    monkeypatch.setattr(fft_algo, "_setups", {})
    monkeypatch.setattr(fft_algo, "LAYOUT", buffers)
    monkeypatch.setattr(fft_algo.FAMILY, "launch", lambda *args, **kwargs: None)
    monkeypatch.setattr(fft_algo._cublas, "gemm", lambda xp, a, b, c, **kwargs: c)
    monkeypatch.setattr(fft_algo, "_twiddle_matrices", lambda xp, T, E, cdtype: (
        cupy.empty((T[1] // 2 + 1, E[1]), cdtype), cupy.empty((T[0], E[0]), cdtype)))
    N, C, H, W, K, R, S = 3, 4, 13, 11, 5, 5, 3
    p = _problem_of(np.empty((N, C, H, W), np.float32), np.empty((K, C, R, S), np.float32),
                    _options(1, (2, 1), 1, 1))
    g = fft_algo.FFT.geometry(p, "forward")
    with cupy.cuda.using_allocator(allocate):
        x, w, y = cupy.empty((N, C, H, W), np.float32), cupy.empty((K, C, R, S), np.float32), \
            cupy.empty(p.y_shape, np.float32)
        fft_algo._fast_correlate(cupy, x, w, y, g, None, (1, 1), False)
        first = runs[:]
        assert [(batch, direction) for _, batch, direction in first] == [(N * C, -1), (N * K, 1)]
        del runs[:]
        base = peak[0] = live[0]
        fft_algo._fast_correlate(cupy, x, w, y, g, None, (1, 1), False)
        assert runs == first                                  # the same plans on the same stream
        assert peak[0] - base <= fft_algo.FFT.workspace_bytes(p, "forward")
        stream.ptr = 78
        del runs[:]
        fft_algo._fast_correlate(cupy, x, w, y, g, None, (1, 1), False)
        assert not {id(plan) for plan, _, _ in runs} & {id(plan) for plan, _, _ in first}


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("buffers", fft_algo.LAYOUTS)
@pytest.mark.parametrize("case", [FFT_CASES[2], FFT_CASES[5], FFT_CASES[6]])
@pytest.mark.gpu
def test_fft_buffer_layouts_on_the_gpu(gpu, rng, monkeypatch, case, buffers, fast):
    monkeypatch.setattr(fft_algo, "LAYOUT", buffers)
    monkeypatch.setattr(fft_algo, "FAST", fast)
    monkeypatch.setattr(fft_algo, "TILE_SIZES", (16,))
    for algo in FFT_ALGOS:
        x, w, b, opts = _random_problem(rng, case, "NHWC", np.float32)
        _check_all_directions(gpu, rng, x, w, b, opts, algo)


@pytest.mark.parametrize("chunk_bytes", [1, 40000, 10**6])
@pytest.mark.parametrize("case", [FFT_CASES[0], FFT_CASES[3], FFT_CASES[5], FFT_CASES[6]])
def test_fft_tiles_and_chunks_on_numpy(monkeypatch, rng, case, chunk_bytes):
    # 8x8 (or 16x16) FFT tiles on 13x13 images: several tiles per axis, the
    # last one partly outside; small chunk budgets split the batch, then the
    # tile rows of one sample.
    monkeypatch.setattr(fft_algo, "TILE_SIZES", (8, 16))
    monkeypatch.setattr(fft_algo, "TILED_CHUNK_BYTES", chunk_bytes)
    monkeypatch.setattr(fft_algo, "LAYOUT", "spatial_first" if chunk_bytes > 1 else "plain")
    p = _fft_run_on_numpy(rng, case, "NCHW", "fft_tiled")
    g = algos.REGISTRY["fft_tiled"].geometry(p, "forward")
    assert max(g.tiles) > 1 or max(p.R, p.S) > 4


@HYPOTHESIS
@given(problem=fft_conv_problems(), algo=st.sampled_from(FFT_ALGOS),
       buffers=st.sampled_from(["spatial_first", "plain"]), seed=st.integers(0, 2**32 - 1))
def test_fft_bookkeeping_on_numpy_drawn(monkeypatch, problem, algo, buffers, seed):
    # Tiles of 8 and 16: the drawn 13x13 images with small filters get several.
    monkeypatch.setattr(fft_algo, "LAYOUT", buffers)
    monkeypatch.setattr(fft_algo, "TILE_SIZES", (8, 16))
    rng = np.random.default_rng(seed)
    (N, *rest), (K, C, R, S) = problem["x_shape"], problem["w_shape"]
    H, W = rest[1:] if problem["layout"] == "NCHW" else rest[:2]
    case = (N, C, H, W, K, R, S, 1, problem["padding"], problem["dilation"], 1)
    _fft_run_on_numpy(rng, case, problem["layout"], algo)


@pytest.mark.parametrize("algo", FFT_ALGOS)
@pytest.mark.parametrize("case", FFT_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fft_matches_reference(xp, rng, algo, case, dtype):
    x, w, b, opts = _random_problem(rng, case, "NCHW", dtype)
    _check_all_directions(xp, rng, x, w, b, opts, algo)


@pytest.mark.parametrize("buffers", ["strided", "spatial_first"])
@pytest.mark.parametrize("case", FFT_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_fft_fast_path_matches_reference(xp, rng, monkeypatch, buffers, case, dtype, layout):
    monkeypatch.setattr(fft_algo, "FAST", True)
    monkeypatch.setattr(fft_algo, "LAYOUT", buffers)
    x, w, b, opts = _random_problem(rng, case, layout, dtype)
    _check_all_directions(xp, rng, x, w, b, opts, "fft")


@pytest.mark.gpu
def test_fft_tiled_runs_on_the_gpu_with_many_tiles_and_chunks(gpu, rng, monkeypatch):
    monkeypatch.setattr(fft_algo, "TILED_CHUNK_BYTES", 300000)
    x, w, b, opts = _random_problem(rng, (3, 4, 70, 45, 5, 7, 7, 1, 3, 1, 1), "NHWC", np.float32)
    p = _problem_of(x, w, opts)
    g = algos.REGISTRY["fft_tiled"].geometry(p, "forward")
    assert g.tiles == (3, 2) and fft_algo._chunk_tiles(p, "forward", g, True) < 6
    _check_all_directions(gpu, rng, x, w, b, opts, "fft_tiled")


def test_fft_sizes_and_tile_rule():
    assert [fft_algo.good_fft_size(n) for n in (1, 7, 13, 59, 62, 69, 97)] == [2, 8, 14, 60, 64, 70, 98]
    assert [fft_algo.tile_size(e) for e in (1, 3, 5, 7, 11, 17, 23)] == [16, 16, 16, 32, 64, 64, 90]


_ODD_SIZES = (1, 2, 3, 5, 7, 11, 13, 17, 19, 23, 31, 37)


@st.composite
def spectral_problems(draw):
    """(ConvProblem, direction) of a stride-1 ungrouped problem: odd and prime
    image sizes, filters 1..13 (also larger than the image), padding 0..3,
    dilation 1 or 2 -- shapes only, nothing allocated."""
    R, S = draw(st.integers(1, 13)), draw(st.integers(1, 13))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
    H = draw(st.sampled_from([n for n in _ODD_SIZES if n + 2 * padding[0] > dilation[0] * (R - 1)] or [37]))
    W = draw(st.sampled_from([n for n in _ODD_SIZES if n + 2 * padding[1] > dilation[1] * (S - 1)] or [37]))
    assume(H + 2 * padding[0] > dilation[0] * (R - 1) and W + 2 * padding[1] > dilation[1] * (S - 1))
    N, C, K = draw(st.integers(1, 3)), draw(st.integers(1, 70)), draw(st.integers(1, 70))
    p = dnnprims.conv._describe((N, C, H, W), (K, C, R, S), 1, padding, dilation, 1, "NCHW", np.dtype(np.float32))
    return p, draw(st.sampled_from(algos.DIRECTIONS))


@settings(HYPOTHESIS, max_examples=300)   # shapes only: about 3 ms an example
@given(problem=spectral_problems(), tiles=st.sampled_from([(16, 32, 64), (8, 16)]), tiled=st.booleans(),
       chunk_tiles=st.sampled_from([None, 1, 2, 3, 7, 1000]))
def test_fft_tiles_cover_each_output_once_and_wrap_only_onto_zeros(monkeypatch, problem, tiles, tiled,
                                                                   chunk_tiles):
    # review6f: the tile arithmetic of "fft" / "fft_tiled" (_dim_plan, _chunks,
    # _largest_chunk) checked position by position.  Along each axis every output u
    # of a tile reads tile positions u + r, r < E: one that passes the FFT size T
    # wraps around, which is right only where it lands in the tile's leading
    # padding (a zero) and the true padded input there is zero too.  The chunks
    # cover every (sample, tile row) once, their output rows cover the output once.
    p, direction = problem
    monkeypatch.setattr(fft_algo, "TILE_SIZES", tiles)
    g = fft_algo.Geometry(p, direction, tiled)
    size_in = (p.P, p.Q) if direction == "backward_data" else (p.H, p.W)
    for T, step, count, E, pad, out, size in zip(g.T, g.step, g.tiles, g.extent, g.pad, g.out, size_in):
        assert T % 2 == 0 and T >= E and 1 <= step <= out and (count - 1) * step < out <= count * step
        if count > 1:
            assert tiled and T in tiles + (fft_algo.good_fft_size(4 * (E - 1)),) and step == T - E + 1
            continue   # outputs u < step read u + r <= T - 1: inside the tile
        assert step == out
        for u in range(out):
            for r in range(E):
                if u + r >= T:                      # wrapped onto tile position u + r - T
                    assert u + r - T < max(pad, 0)  # a leading padding zero of the tile ...
                    assert not 0 <= u + r - pad < size   # ... where the padded input is zero too
    rows = {}
    for n0, n1, i0, i1 in fft_algo._chunks(p.N, g.tiles, chunk_tiles):
        assert 0 <= n0 < n1 <= p.N and 0 <= i0 < i1 <= g.tiles[0]
        if chunk_tiles is not None:
            assert (n1 - n0) * (i1 - i0) * g.tiles[1] <= max(chunk_tiles, g.tiles[1])
        for n in range(n0, n1):
            for i in range(i0, i1):
                rows[n, i] = rows.get((n, i), 0) + 1
    assert rows == {(n, i): 1 for n in range(p.N) for i in range(g.tiles[0])}
    largest = max((n1 - n0) * (i1 - i0) * g.tiles[1] for n0, n1, i0, i1 in
                  fft_algo._chunks(p.N, g.tiles, chunk_tiles))
    assert fft_algo._largest_chunk(p.N, g.tiles, chunk_tiles) == largest


def test_fft_workspace_is_bounded_when_tiled_and_the_limit_forces_tiles():
    p = _problem_of(np.empty((64, 64, 512, 512), np.float32), np.empty((64, 64, 7, 7), np.float32),
                    _options(1, 3, 1, 1))
    whole, tiled = (algos.REGISTRY[a].workspace_bytes(p, "forward") for a in FFT_ALGOS)
    assert whole > 8 * 2**30 and tiled < 256 * 2**20
    for direction in algos.DIRECTIONS:
        assert algos.REGISTRY["fft_tiled"].workspace_bytes(p, direction) < 256 * 2**20
    limit = algos.ConvOptions(workspace_limit=256 * 2**20)
    ok, reason = algos.admits(algos.REGISTRY["fft"], p, "forward", limit)
    assert not ok and "workspace_limit" in reason
    assert algos.admits(algos.REGISTRY["fft_tiled"], p, "forward", limit)[0]
    # "auto" takes "fft" only where its spectra fit AUTO_FFT_WORKSPACE_LIMIT.
    assert algos.explain_auto(p, "forward")[0] != "fft"


def test_fft_tiled_forced_by_workspace_limit(xp, rng, monkeypatch):
    monkeypatch.setattr(fft_algo, "TILED_CHUNK_BYTES", 1)  # one row of tiles at a time
    x, w, b, opts = _random_problem(rng, (2, 3, 40, 40, 4, 7, 7, 1, 3, 1, 1), "NCHW", np.float32)
    p = _problem_of(x, w, opts)
    whole, tiled = (algos.REGISTRY[a].workspace_bytes(p, "forward") for a in FFT_ALGOS)
    assert tiled < whole and algos.REGISTRY["fft_tiled"].geometry(p, "forward").tiles == (2, 2)
    limit = (tiled + whole) // 2
    with pytest.raises(ValueError, match="workspace_limit"):
        conv2d_forward(xp.asarray(x), xp.asarray(w), algo="fft", workspace_limit=limit, **opts)
    assert dnnprims.conv2d_choose(x.shape, w.shape, workspace_limit=limit, algo="fft_tiled",
                                  **opts)[0] == "fft_tiled"
    y = conv2d_forward(xp.asarray(x), xp.asarray(w), xp.asarray(b), workspace_limit=limit,
                       algo="fft_tiled", **opts)
    x64, w64, b64 = x.astype(F64), w.astype(F64), b.astype(F64)
    assert_close(y, conv2d_forward(x64, w64, b64, **opts), np.float32, algorithm="fft_tiled",
                 magnitude=conv2d_forward(np.abs(x64), np.abs(w64), np.abs(b64), **opts))


def test_auto_takes_fft_for_large_stride1_filters_with_enough_work(rule_only):
    def auto(N, C, H, K, R, dtype=np.float32, stride=1):
        problem = _problem_of(np.empty((N, C, H, H), dtype), np.empty((K, C, R, R), dtype),
                              _options(stride, R // 2, 1, 1))
        return tuple(algos.choose(problem, d, "auto").name for d in algos.DIRECTIONS)

    assert auto(32, 64, 56, 64, 7) == ("dft",) * 3                  # big_7x7_s1: 40 GFLOP
    assert auto(32, 32, 64, 32, 11) == ("dft",) * 3                 # big_11x11_s1
    for fourier in ("fft", "dft"):
        assert fourier not in auto(1, 64, 56, 64, 7)                # batch 1: 1.3 GFLOP
        assert fourier not in auto(32, 64, 56, 64, 3)               # 3x3
        assert fourier not in auto(32, 64, 56, 64, 7, np.float16)
        assert fourier not in auto(32, 64, 112, 64, 7, stride=2)


@pytest.mark.parametrize("algo", FFT_ALGOS)
@pytest.mark.parametrize("kwargs,dtype,match", [
    (dict(stride=2), np.float32, "stride 1 only"),
    (dict(groups=2), np.float32, "ungrouped"),
    ({}, np.float16, "float32 and float64 only"),
])
def test_fft_refuses_what_it_does_not_compute(xp, algo, kwargs, dtype, match):
    x, w = np.ones((1, 4, 9, 9), dtype), np.ones((4, 4 // kwargs.get("groups", 1), 5, 5), dtype)
    with pytest.raises(ValueError, match=match):
        conv2d_forward(xp.asarray(x), xp.asarray(w), algo=algo, **kwargs)


def test_problem_is_a_hashable_key():
    p = conv2d_output_shape((2, 3, 7, 7), (4, 3, 3, 3), padding=1)
    assert p == (2, 4, 7, 7)
    problem = _problem_of(np.zeros((2, 7, 7, 3), np.float32), np.zeros((4, 3, 3, 3), np.float32),
                          _options(2, 1, 1, 1, "NHWC"))
    assert problem == ConvProblem(N=2, C=3, H=7, W=7, K=4, R=3, S=3, P=4, Q=4, stride=(2, 2),
                                  padding=(1, 1), dilation=(1, 1), groups=1, layout="NHWC",
                                  dtype="float32")
    assert hash(problem) == hash(_problem_of(np.ones((2, 7, 7, 3), np.float32),
                                             np.ones((4, 3, 3, 3), np.float32),
                                             _options((2, 2), (1, 1), 1, 1, "NHWC")))
    assert problem.x_shape == (2, 7, 7, 3) and problem.y_shape == (2, 4, 4, 4)
    assert problem.w_shape == (4, 3, 3, 3)
    with pytest.raises(Exception):
        problem.N = 3


def test_noncontiguous_inputs_give_the_same_result(xp, rng):
    x, w, b, opts = _random_problem(rng, CASES[2].values[0], "NCHW", np.float32)
    X, Wt, B = xp.asarray(x), xp.asarray(w), xp.asarray(b)
    y = conv2d_forward(X, Wt, B, **opts)
    # the same values through strided views: every other element of larger arrays
    X2 = xp.zeros(x.shape[:3] + (2 * x.shape[3],), x.dtype)
    X2[..., ::2] = X
    W2 = xp.asfortranarray(Wt)
    B2 = xp.zeros(2 * len(b), b.dtype)
    B2[::2] = B
    assert not X2[..., ::2].flags.c_contiguous and not W2.flags.c_contiguous
    xp.testing.assert_array_equal(conv2d_forward(X2[..., ::2], W2, B2[::2], **opts), y)
    dy = xp.asarray(random_array(rng, y.shape, np.float32))
    dyT = xp.asfortranarray(dy)
    xp.testing.assert_array_equal(conv2d_backward_data(dyT, W2, x.shape, **opts),
                                  conv2d_backward_data(dy, Wt, x.shape, **opts))
    xp.testing.assert_array_equal(conv2d_backward_filter(X2[..., ::2], dyT, w.shape, **opts),
                                  conv2d_backward_filter(X, dy, w.shape, **opts))
    xp.testing.assert_array_equal(conv2d_backward_bias(dyT), conv2d_backward_bias(dy))


def test_empty_batch_and_zero_gradients(xp, rng):
    x = xp.asarray(random_array(rng, (0, 4, 7, 7), np.float32))
    w = xp.asarray(random_array(rng, (6, 2, 3, 3), np.float32))
    y = conv2d_forward(x, w, groups=2, padding=1)
    assert y.shape == (0, 6, 7, 7) and isinstance(y, type(x))
    dy = xp.zeros((0, 6, 7, 7), np.float32)
    assert conv2d_backward_data(dy, w, (0, 4, 7, 7), groups=2, padding=1).shape == (0, 4, 7, 7)
    dw = conv2d_backward_filter(x, dy, (6, 2, 3, 3), groups=2, padding=1)
    assert dw.shape == (6, 2, 3, 3) and not dw.any()
    db = conv2d_backward_bias(dy)
    assert db.shape == (6,) and not db.any()
    x1 = xp.asarray(random_array(rng, (2, 7, 7, 4), np.float32))
    dx = conv2d_backward_data(None, w, (2, 7, 7, 4), groups=2, layout="NHWC")
    assert dx.shape == (2, 7, 7, 4) and dx.dtype == np.float32 and not dx.any()
    dw = conv2d_backward_filter(x1, None, (6, 2, 3, 3), groups=2, layout="NHWC")
    assert dw.shape == (6, 2, 3, 3) and not dw.any()


def test_backward_data_accepts_every_consistent_input_size(xp, rng):
    # stride 2, 3x3, no padding: H = 7 and H = 8 both give P = 3
    w = xp.asarray(random_array(rng, (2, 3, 3, 3)))
    dy = xp.asarray(random_array(rng, (1, 2, 3, 3)))
    dx7 = conv2d_backward_data(dy, w, (1, 3, 7, 7), stride=2)
    dx8 = conv2d_backward_data(dy, w, (1, 3, 8, 8), stride=2)
    xp.testing.assert_allclose(dx8[:, :, :7, :7], dx7, rtol=1e-12, atol=1e-14)
    assert not dx8[:, :, 7, :].any() and not dx8[:, :, :, 7].any()  # never read by the forward pass
    with pytest.raises(ValueError, match="x_shape"):
        conv2d_backward_data(dy, w, (1, 3, 9, 9), stride=2)


# --- (4) bad input: one test each ------------------------------------------------

def _xw(dtype=np.float32, x_shape=(2, 4, 7, 7), w_shape=(6, 4, 3, 3)):
    return np.ones(x_shape, dtype), np.ones(w_shape, dtype)


def test_rejects_wrong_ndim():
    x, w = _xw()
    with pytest.raises(ValueError, match="x must be 4-D"):
        conv2d_forward(x[0], w)
    with pytest.raises(ValueError, match="w must be 4-D"):
        conv2d_forward(x, w[0])
    with pytest.raises(ValueError, match="dy must be 4-D"):
        conv2d_backward_data(x[0], w, x.shape)
    with pytest.raises(ValueError, match="dy must be 4-D"):
        conv2d_backward_bias(x[0])


def test_rejects_channels_not_divisible_by_groups():
    x, w = _xw(w_shape=(6, 4, 3, 3))
    with pytest.raises(ValueError, match="x has 4 channels, which groups=3"):
        conv2d_forward(x, w, groups=3)


def test_rejects_filters_not_divisible_by_groups():
    x, w = _xw(w_shape=(5, 2, 3, 3))
    with pytest.raises(ValueError, match="w has 5 filters"):
        conv2d_forward(x, w, groups=2)


def test_rejects_filter_channels_not_matching():
    x, w = _xw(w_shape=(6, 4, 3, 3))
    with pytest.raises(ValueError, match=r"w must have shape\[1\] == channels / groups"):
        conv2d_forward(x, w, groups=2)
    with pytest.raises(ValueError, match=r"w_shape must have shape\[1\]"):
        conv2d_backward_filter(x, np.ones((2, 6, 5, 5), np.float32), (6, 3, 3, 3))


def test_rejects_filter_larger_than_padded_input():
    x, w = _xw(x_shape=(1, 4, 3, 3), w_shape=(2, 4, 3, 3))
    with pytest.raises(ValueError, match="dilated filter size 5 x 5 is larger than the padded input"):
        conv2d_forward(x, w, dilation=2)
    conv2d_forward(x, w, dilation=2, padding=1)  # fits once padded
    with pytest.raises(ValueError, match="w's dilated filter size 3 x 3"):
        conv2d_forward(np.ones((1, 4, 2, 2), np.float32), w)


@pytest.mark.parametrize("name,value", [("stride", 0), ("stride", (1, -1)), ("dilation", 0),
                                        ("dilation", (0, 1)), ("padding", -1)])
def test_rejects_bad_geometry_values(name, value):
    x, w = _xw()
    with pytest.raises(ValueError, match=name):
        conv2d_forward(x, w, **{name: value})


@pytest.mark.parametrize("name,value", [("stride", 1.5), ("padding", (1, 2, 3)), ("dilation", "2"),
                                        ("groups", 1.0)])
def test_rejects_geometry_of_wrong_type(name, value):
    x, w = _xw()
    with pytest.raises(TypeError, match=name):
        conv2d_forward(x, w, **{name: value})


def test_rejects_nonpositive_groups():
    x, w = _xw()
    with pytest.raises(ValueError, match="groups must be positive"):
        conv2d_forward(x, w, groups=0)


def test_rejects_mismatched_dtypes():
    x, w = _xw()
    with pytest.raises(TypeError, match="w has dtype float64 but x has dtype float32"):
        conv2d_forward(x, w.astype(np.float64))
    with pytest.raises(TypeError, match="bias has dtype float16"):
        conv2d_forward(x, w, np.ones(6, np.float16))
    with pytest.raises(TypeError, match="dy has dtype"):
        conv2d_backward_filter(x, np.ones((2, 6, 5, 5)), w.shape)


def test_rejects_integer_dtypes():
    x, w = _xw()
    with pytest.raises(TypeError, match="x must have a floating dtype"):
        conv2d_forward(x.astype(np.int32), w.astype(np.int32))
    with pytest.raises(TypeError, match="dy must have a floating dtype"):
        conv2d_backward_bias(np.ones((1, 2, 3, 3), np.int64))


def test_rejects_non_arrays():
    x, w = _xw()
    with pytest.raises(TypeError, match="x must be a numpy.ndarray or cupy.ndarray"):
        conv2d_forward(x.tolist(), w)


def test_rejects_numpy_mixed_with_cupy(gpu):
    x, w = _xw()
    with pytest.raises(TypeError, match="cannot mix NumPy and CuPy"):
        conv2d_forward(x, gpu.asarray(w))
    with pytest.raises(TypeError, match="cannot mix NumPy and CuPy"):
        conv2d_backward_data(gpu.ones((2, 6, 5, 5), np.float32), w, x.shape)


def test_rejects_bias_of_wrong_length():
    x, w = _xw()
    with pytest.raises(ValueError, match=r"bias must have shape \(6,\)"):
        conv2d_forward(x, w, np.ones(4, np.float32))


def test_rejects_bad_layout():
    x, w = _xw()
    with pytest.raises(ValueError, match="layout must be one of"):
        conv2d_forward(x, w, layout="CHWN")
    with pytest.raises(ValueError, match="layout must be one of"):
        conv2d_backward_bias(x, layout="nchw")


def test_rejects_unknown_algo():
    x, w = _xw()
    with pytest.raises(ValueError, match="algo must be 'auto', 'find' or one of 'direct'.*got 'winograd9'"):
        conv2d_forward(x, w, algo="winograd9")
    with pytest.raises(TypeError, match="algo must be a string"):
        conv2d_forward(x, w, algo=None)


def test_rejects_algo_that_does_not_support_the_problem(monkeypatch):
    class ForwardOnly1x1(algos.ConvAlgorithm):
        name = "test_forward_only_1x1"
        directions = ("forward",)

        def supports(self, problem, direction):
            ok, reason = super().supports(problem, direction)
            if ok and (problem.R, problem.S) != (1, 1):
                return False, "it handles 1x1 filters only"
            return ok, reason

    monkeypatch.setitem(algos.REGISTRY, ForwardOnly1x1.name, ForwardOnly1x1())
    x, w = _xw()
    with pytest.raises(ValueError, match="algo 'test_forward_only_1x1' does not support this forward "
                                         "problem: it handles 1x1 filters only"):
        conv2d_forward(x, w, algo="test_forward_only_1x1")
    with pytest.raises(ValueError, match="no backward_data implementation"):
        conv2d_backward_data(np.ones((2, 6, 7, 7), np.float32), np.ones((6, 4, 1, 1), np.float32),
                             x.shape, algo="test_forward_only_1x1")


def test_rejects_x_shape_inconsistent_with_dy():
    x, w = _xw()
    dy = np.ones((2, 6, 5, 5), np.float32)
    with pytest.raises(ValueError, match=r"dy has shape \(2, 6, 5, 5\) but x_shape and w"):
        conv2d_backward_data(dy, w, (2, 4, 9, 9))
    with pytest.raises(ValueError, match="x_shape and w"):
        conv2d_backward_data(dy, w, (3, 4, 7, 7))  # batch differs
    with pytest.raises(ValueError, match="x_shape and w"):
        conv2d_backward_data(np.ones((2, 5, 5, 5), np.float32), w, x.shape)  # channels differ
    with pytest.raises(TypeError, match="x_shape must be a tuple of 4 ints"):
        conv2d_backward_data(dy, w, (2, 4, 7))
    with pytest.raises(TypeError, match="x_shape must be a tuple of 4 ints"):
        conv2d_backward_data(dy, w, 7)
    with pytest.raises(ValueError, match="x_shape must not have negative sizes"):
        conv2d_backward_data(dy, w, (2, 4, -7, 7))


def test_rejects_w_shape_inconsistent_with_dy():
    x, w = _xw()
    dy = np.ones((2, 6, 5, 5), np.float32)
    with pytest.raises(ValueError, match=r"dy has shape \(2, 6, 5, 5\) but x and w_shape"):
        conv2d_backward_filter(x, dy, (6, 4, 2, 2))
    with pytest.raises(ValueError, match="x and w_shape"):
        conv2d_backward_filter(x, dy, (5, 4, 3, 3))
    with pytest.raises(TypeError, match="w_shape must be a tuple of 4 ints"):
        conv2d_backward_filter(x, dy, (6, 4, 3.0, 3))


def test_rejects_none_dy_for_bias():
    with pytest.raises(TypeError, match="dy must be an array"):
        conv2d_backward_bias(None)


@pytest.mark.parametrize("call,name", [
    (lambda x, w, dy: conv2d_forward(None, w), "x"),
    (lambda x, w, dy: conv2d_forward(x, None), "w"),
    (lambda x, w, dy: conv2d_backward_data(dy, None, x.shape, padding=1), "w"),
    (lambda x, w, dy: conv2d_backward_filter(None, dy, w.shape, padding=1), "x"),
])
def test_rejects_none_for_a_required_array(call, name):
    x, w, dy = np.ones((1, 2, 5, 5)), np.ones((3, 2, 3, 3)), np.ones((1, 3, 5, 5))
    with pytest.raises(TypeError, match=f"^{name} must be a numpy.ndarray or cupy.ndarray, got None"):
        call(x, w, dy)


# --- the depthwise algorithm: launch geometry on NumPy, larger planes on the GPU -----

def _depthwise_problem(N, C, H, W, mult, R, S, stride, padding, dilation, layout="NCHW", dtype=np.float32):
    x_shape = (N, C, H, W) if layout == "NCHW" else (N, H, W, C)
    return dnnprims.conv._describe(x_shape, (C * mult, 1, R, S), stride, padding, dilation, C,
                                   layout, np.dtype(dtype))


@pytest.mark.parametrize("geometry", [(1, 1, 1, 1, 1, 1, 1, 1, 0, 1), (2, 3, 13, 7, 2, 3, 3, 1, 1, 2),
                                      (32, 96, 112, 112, 1, 3, 3, 1, 1, 1), (1, 4, 200, 300, 1, 5, 5, 2, 2, 1),
                                      (2, 2, 40, 40, 3, 11, 11, 1, 5, 3), (1, 8, 3, 700, 1, 3, 7, 1, 3, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_depthwise_tiles_fit_and_cover(geometry, dtype):
    """The NCHW tile: threads a multiple of 32 and at most 256, shared memory
    within the limit, and the staged input tile large enough for every tap."""
    p = _depthwise_problem(*geometry, dtype=dtype)
    acc = np.dtype(dtype).itemsize
    for direction in algos.DIRECTIONS:
        assert depthwise_algo.DEPTHWISE.supports(p, direction)[0]
        tqt, tp, in_rows, in_cols, pitch, shared, group_taps = depthwise_algo._nchw_tile(p, direction, acc)
        assert (tqt * tp) % 32 == 0 and tqt * tp <= 256 and pitch >= in_cols
        assert shared <= depthwise_algo.SHARED_LIMIT
        (sh, sw), (dh, dw) = p.stride, p.dilation
        tq = tqt * depthwise_algo.V
        if direction == "backward_data":
            # offsets h + ph - r*dh - p_lo*sh of the tile's rows, over every alignment h0
            for h0 in range(0, 2 * sh * dh + 1):
                p_lo = (h0 + p.padding[0] - (p.R - 1) * dh) // sh
                offsets = [h + p.padding[0] - r * dh - p_lo * sh for h in range(h0, h0 + tp) for r in range(p.R)]
                assert min(offsets) >= 0 and max(offsets) // sh < in_rows
            for w0 in range(0, 2 * sw * dw + 1):
                q_lo = (w0 + p.padding[1] - (p.S - 1) * dw) // sw
                offsets = [w + p.padding[1] - s * dw - q_lo * sw for w in range(w0, w0 + tq) for s in range(p.S)]
                assert min(offsets) >= 0 and max(offsets) // sw < in_cols
        else:
            assert (tp - 1) * sh + (p.R - 1) * dh < in_rows and (tq - 1) * sw + (p.S - 1) * dw < in_cols
        if direction == "backward_filter":
            assert 1 <= group_taps <= p.R * p.S
            assert depthwise_algo.DEPTHWISE.workspace_bytes(p, direction) > 0
        else:
            assert depthwise_algo.DEPTHWISE.workspace_bytes(p, direction) == 0


def test_depthwise_refuses_other_problems():
    problem = _problem_of(np.empty((2, 4, 7, 7), np.float32), np.empty((8, 2, 3, 3), np.float32),
                          _options(1, 1, 1, 2))
    ok, reason = depthwise_algo.DEPTHWISE.supports(problem, "forward")
    assert not ok and "groups == C" in reason
    with pytest.raises(ValueError, match="algo 'depthwise' does not support"):
        conv2d_forward(np.ones((2, 4, 7, 7), np.float32), np.ones((8, 2, 3, 3), np.float32), groups=2,
                       algo="depthwise")


@HYPOTHESIS
@given(N=st.integers(1, 3), C=st.sampled_from([1, 3, 4, 16]), mult=st.integers(1, 3),
       H=st.sampled_from(_ODD_SIZES), W=st.sampled_from(_ODD_SIZES), R=st.integers(1, 13), S=st.integers(1, 13),
       stride=st.integers(1, 2), padding=st.integers(0, 3), dilation=st.integers(1, 2),
       layout=st.sampled_from(["NCHW", "NHWC"]), dtype=st.sampled_from([np.float32, np.float64, np.float16]),
       vec=st.booleans())
def test_depthwise_plans_use_the_workspace_they_report(N, C, mult, H, W, R, S, stride, padding, dilation,
                                                      layout, dtype, vec):
    # review6f: backward filter's partials (the one allocation of a depthwise call)
    # are the workspace_bytes it reports, and every plan's launches are declared
    # specialisations within the shared memory limit (no device needed: float32 3x3
    # "same" forward with 8 rows a lane, whose grid cap asks the device, is skipped).
    assume(H + 2 * padding > dilation * (R - 1) and W + 2 * padding > dilation * (S - 1))
    p = _depthwise_problem(N, C, H, W, mult, R, S, stride, padding, dilation, layout=layout, dtype=dtype)
    partial = 8 if dtype == np.float64 else 4
    for direction in algos.DIRECTIONS:
        if not depthwise_algo.DEPTHWISE.supports(p, direction)[0]:
            continue
        if depthwise_algo.is_same_nchw(p) and direction != "backward_filter" and \
                depthwise_algo.same_variant(p, direction)[0] == 8:
            continue
        launches, workspace = depthwise_algo.DEPTHWISE._make_plan(p, direction, vec)
        assert workspace * partial == depthwise_algo.DEPTHWISE.workspace_bytes(p, direction)
        for expr, grid, block, shared, _ in launches:
            assert expr in depthwise_algo.FAMILY.name_expressions and shared <= depthwise_algo.SHARED_LIMIT
            assert all(1 <= v < 2**31 for v in grid) and all(len(grid) < 2 or v <= 65535 for v in grid[1:])


def test_depthwise_small_path_slot_arithmetic_stays_in_32_bits():
    # dw_small_nchw decodes slots in 32-bit ints: base + grid step must stay below
    # 2^31 for every problem it takes (N K H < 2^30); past that, dw_same_nchw (64-bit).
    for N, K, H in ((2**30 // (64 * 28) - 1, 64, 28), (1, 2**30 // 8 - 1, 8), (2**30 // 28 + 1, 1, 28)):
        p = _depthwise_problem(N, K, H, 28, 1, 3, 3, 1, 1, 1)
        small = depthwise_algo.is_small_nchw(p, "forward")
        assert small == (N * K * H < 2**30)
        if small:
            (expr, grid, block, _, scalars), = depthwise_algo.DEPTHWISE._make_plan(p, "forward", True)[0]
            slots, groups = int(scalars[-1]), int(scalars[6])
            step = grid[0] * (block[0] // 32) * (32 // groups)
            assert expr.startswith("dw_small_nchw") and slots + step < 2**31


@pytest.mark.parametrize("dtype,size", [(np.float32, 56), (np.float16, 56), (np.float64, 40),
                                        (np.float32, 55)])
def test_depthwise_nhwc_vector_plan_takes_scalar_loads_where_its_filter_slice_does_not_fit(dtype, size):
    # review6f: supports() admits an NHWC problem whose filter slice fits the shared
    # memory at one channel a lane, but the plan with 16-byte loads (C % 4 == 0, K == C,
    # aligned arrays: what every fresh CuPy array is) wanted 4 channels a lane and,
    # past 48 KiB (56 x 56 float32 taps, 40 x 40 float64), crashed unpacking None (a
    # TypeError from conv2d_forward / backward data on a supported problem).  Now it
    # takes the scalar kernel there; 55 x 55 still fits the vector one.
    p = _depthwise_problem(1, 4, size, size, 1, size, size, 1, 0, 1, layout="NHWC", dtype=dtype)
    for direction in algos.DIRECTIONS:
        assert depthwise_algo.DEPTHWISE.supports(p, direction)[0]
        launches, _ = depthwise_algo.DEPTHWISE._make_plan(p, direction, True)
        assert all(expr in depthwise_algo.FAMILY.name_expressions for expr, *_ in launches)
        assert all(shared <= depthwise_algo.SHARED_LIMIT for _, _, _, shared, _ in launches)
        if direction != "backward_filter":
            vec = 4 if size == 55 else 1
            assert launches[0][0].endswith(f", {vec}>")


@pytest.mark.gpu  # the `gpu` fixture alone does not mark: scripts/gpu_suite.sh runs -m gpu
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("mult,stride,dilation", [(1, 1, 1), (2, 2, 1), (1, 2, 2), (3, 1, 1)])
def test_depthwise_large_planes_on_the_gpu(gpu, rng, layout, dtype, mult, stride, dilation):
    """Planes of several tiles in both directions (rows and columns), odd sizes."""
    x, w, b, opts = _random_problem(rng, (2, 4, 37, 150, 4 * mult, 3, 3, stride, 1, dilation, 4), layout, dtype)
    _check_all_directions(gpu, rng, x, w, b, opts, "depthwise")


@pytest.mark.gpu  # the `gpu` fixture alone does not mark: scripts/gpu_suite.sh runs -m gpu
def test_depthwise_tap_groups_and_determinism_on_the_gpu(gpu, rng, monkeypatch):
    """With little shared memory the filter gradient runs in groups of taps; the
    result still matches, and two runs give the same bits."""
    monkeypatch.setattr(depthwise_algo, "SHARED_LIMIT", 6 * 1024)
    monkeypatch.setattr(depthwise_algo.DEPTHWISE, "_plans", {})
    _reset_depthwise_caches()
    for layout in ("NCHW", "NHWC"):
        # padding 1, not 2: the shared-memory tile kernels, not the "same" path
        x, w, b, opts = _random_problem(rng, (2, 3, 21, 19, 6, 5, 5, 1, 1, 1, 3), layout, np.float32)
        problem = _problem_of(x, w, opts)
        assert not depthwise_algo.is_same_nchw(problem)
        acc = 4
        group_taps = (depthwise_algo._nchw_tile(problem, "backward_filter", acc)[-1] if layout == "NCHW"
                      else depthwise_algo._nhwc_block(problem, "backward_filter", 1, acc)[-1])
        assert group_taps < problem.R * problem.S
        _check_all_directions(gpu, rng, x, w, b, opts, "depthwise")
        dy = gpu.asarray(random_array(rng, problem.y_shape, np.float32))
        X = gpu.asarray(x)
        first = conv2d_backward_filter(X, dy, w.shape, algo="depthwise", deterministic=True, **opts)
        second = conv2d_backward_filter(X, dy, w.shape, algo="depthwise", deterministic=True, **opts)
        assert bool((first == second).all())


# --- the depthwise "same" NCHW path (stride 1, KS x KS, padding KS // 2) ----------

def _reset_depthwise_caches():
    """Forget every launch worked out for depthwise calls (plans, prepared
    launches, the public functions' fast path), so that a monkeypatched launch
    choice takes effect on the next call."""
    depthwise_algo.DEPTHWISE._plans.clear()
    depthwise_algo.DEPTHWISE.__dict__.get("_prepared_cache", {}).clear()
    dnnprims.conv._MEMO.clear()


def _depthwise_launched():
    """The kernel names of every depthwise plan made since the last reset."""
    return {launch[0] for launches, _ in depthwise_algo.DEPTHWISE._plans.values() for launch in launches}


def _emulate_dw_same(p, direction, a, b, rows, vec):
    """A literal NumPy transliteration of dw_same_nchw / dw_same_filter_nchw
    (lanes, clamped loads, shuffles, segment edges, masks), warp by warp: it
    checks the kernels' index arithmetic on the CPU (`vec` changes only how the
    own columns are loaded, not which).  Returns y, dx or dw."""
    G, Gs, segs, spw, bands = depthwise_algo.same_geometry(p, rows)
    KS, HC = p.R, p.R // 2
    IN = rows + 2 * HC
    Hs, Ws, mult = p.H, p.W, p.K // p.C

    def window(plane, row0, g, lg, active, n_rows, hc):
        """win[lane] for one warp: plane/row0/g/lg/active are per-lane lists."""
        win = np.zeros((32, n_rows, 4 + 2 * hc))
        for lane in range(32):
            col = 4 * g[lane]
            col_c = min(col, 4 * (G - 1))
            for i in range(n_rows):
                h = row0[lane] + i
                hcl = min(max(h, 0), Hs - 1)
                row_in = active[lane] and 0 <= h < Hs
                for j in range(4):
                    v = plane[lane][hcl, min(col_c + j, Ws - 1)]  # the vector load reads the same columns
                    win[lane, i, hc + j] = v if (row_in and col + j < Ws) else 0.0
        if hc:
            own = win.copy()
            for lane in range(32):
                up, down = (lane - 1 if lane >= 1 else lane), (lane + 1 if lane <= 30 else lane)
                for j in range(hc):
                    win[lane, :, j] = own[up, :, 4 + j]
                    win[lane, :, hc + 4 + j] = own[down, :, hc + j]
            for lane in range(32):
                left, right = lg[lane] == 0, lg[lane] == Gs - 1 or g[lane] >= G - 1
                for i in range(n_rows):
                    h = row0[lane] + i
                    row_in = active[lane] and 0 <= h < Hs
                    for j in range(hc):
                        c = 4 * g[lane] - hc + j
                        if left:
                            win[lane, i, j] = plane[lane][h, c] if (row_in and c >= 0) else 0.0
                        c = 4 * g[lane] + 4 + j
                        if right:
                            win[lane, i, hc + 4 + j] = plane[lane][h, c] if (row_in and c < Ws) else 0.0
        return win

    def lanes(base, slots):
        out = []
        for lane in range(32):
            sl = lane // Gs
            lg = lane - sl * Gs
            slot = base + sl
            s_c = min(slot, slots - 1)
            band, rest = s_c % bands, s_c // bands
            seg, outer = rest % segs, rest // segs
            g = seg * Gs + lg
            out.append((lg, g, outer, band * rows, sl < spw and slot < slots and g < G))
        return out

    if direction == "backward_filter":
        x, dy = a, b
        dw = np.zeros((p.K, 1, KS, KS))
        slots = p.N * segs * bands
        for k in range(p.K):
            for base in range(0, slots, spw):
                info = lanes(base, slots)
                lg, g, n, row0, active = (list(v) for v in zip(*info))
                d = window([dy[ni, k] for ni in n], row0, g, lg, active, rows, 0)
                win = window([x[ni, k // mult] for ni in n], [r - HC for r in row0], g, lg, active, IN, HC)
                for r in range(KS):
                    for s in range(KS):
                        dw[k, 0, r, s] += (d * win[:, r:r + rows, s:s + 4]).sum()
        return dw
    if direction == "forward":
        cin, cout, terms, div, flip, src = p.C, p.K, 1, mult, False, a
    else:
        cin, cout, terms, div, flip, src = p.K, p.C, mult, 1, True, a
    out = np.full((p.N, cout, Hs, Ws), np.nan)
    slots = p.N * cout * segs * bands
    for base in range(0, slots, spw):
        info = lanes(base, slots)
        lg, g, plane, row0, active = (list(v) for v in zip(*info))
        acc = np.zeros((32, rows, 4))
        for t in range(terms):
            f = [pl % cout * terms + t for pl in plane]
            wt = [b[fi, 0][::-1, ::-1] if flip else b[fi, 0] for fi in f]
            win = window([src[pl // cout, fi // div] for pl, fi in zip(plane, f)], [r - HC for r in row0],
                          g, lg, active, IN, HC)
            for lane in range(32):
                for r in range(KS):
                    for s in range(KS):
                        acc[lane] += win[lane, r:r + rows, s:s + 4] * wt[lane][r, s]
        for lane in range(32):
            if active[lane]:
                for i in range(rows):
                    h = row0[lane] + i
                    for j in range(4):
                        if h < Hs and 4 * g[lane] + j < Ws:
                            out[plane[lane] // cout, plane[lane] % cout, h, 4 * g[lane] + j] = acc[lane, i, j]
    return out


# (N, C, H, W, multiplier, KS): one segment with several slots per warp (W 5..28),
# segment edges (W 150: 38 groups in 2 segments of 19), W % 4 != 0, planes
# shorter than a band, sizes 1, 3, 7, 13.
SAME_GEOMETRIES = [(1, 1, 1, 1, 1, 3), (2, 3, 7, 13, 1, 3), (1, 2, 13, 28, 2, 3), (1, 2, 3, 150, 1, 5),
                   (2, 2, 9, 8, 3, 5), (1, 1, 13, 7, 1, 5)]


@pytest.mark.parametrize("geometry", SAME_GEOMETRIES)
@pytest.mark.parametrize("rows", [2, 4, 8])
def test_depthwise_same_kernel_emulation_matches_reference(rng, geometry, rows):
    N, C, H, W, mult, ks = geometry
    p = _depthwise_problem(N, C, H, W, mult, ks, ks, 1, ks // 2, 1)
    assert depthwise_algo.is_same_nchw(p)
    x = random_array(rng, p.x_shape, F64)
    w = random_array(rng, p.w_shape, F64)
    dy = random_array(rng, p.y_shape, F64)
    opts = _options(1, ks // 2, 1, C)
    vec = W % 4 == 0
    np.testing.assert_allclose(_emulate_dw_same(p, "forward", x, w, rows, vec), conv2d_forward(x, w, **opts),
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(_emulate_dw_same(p, "backward_data", dy, w, rows, vec),
                               conv2d_backward_data(dy, w, x.shape, **opts), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(_emulate_dw_same(p, "backward_filter", x, dy, rows, vec),
                               conv2d_backward_filter(x, dy, w.shape, **opts), rtol=1e-12, atol=1e-12)


def test_depthwise_same_path_selection():
    """Which problems take the dw_same_* kernels, the rows per lane, and the
    backward-filter workspace (one partial per (k, tap, chunk))."""
    same = _depthwise_problem(32, 96, 112, 112, 1, 3, 3, 1, 1, 1)
    assert depthwise_algo.is_same_nchw(same)
    assert depthwise_algo.same_geometry(same, 4) == (28, 28, 1, 1, 28)
    assert depthwise_algo.same_variant(same, "forward") == (8, 1)
    assert depthwise_algo.same_variant(same, "backward_filter") == (4, 1)
    assert depthwise_algo.same_variant(_depthwise_problem(32, 192, 28, 28, 1, 3, 3, 1, 1, 1), "forward") == (2, 3)
    assert depthwise_algo.same_variant(_depthwise_problem(1, 8, 28, 28, 1, 5, 5, 1, 2, 1), "forward") == (2, 1)
    # every choice is a declared specialisation
    for geometry in ((32, 96, 112, 112), (1, 96, 112, 112), (32, 192, 28, 28), (1, 1, 1, 1), (4, 8, 300, 300)):
        for ks in (3, 5):
            for dtype in _dtypes.SUPPORTED:
                p = _depthwise_problem(*geometry, 1, ks, ks, 1, ks // 2, 1, dtype=dtype)
                for direction in algos.DIRECTIONS:
                    rows, minb = depthwise_algo.same_variant(p, direction)
                    kernel = "same_filter_nchw" if direction == "backward_filter" else "same_nchw"
                    expr = f"dw_{kernel}<{_dtypes.cuda_type(p.dtype)}, {ks}, {rows}, {minb}>"
                    assert expr in depthwise_algo.FAMILY.name_expressions
    chunks = depthwise_algo.DEPTHWISE._chunks(same)
    assert depthwise_algo.DEPTHWISE.workspace_bytes(same, "backward_filter") == 96 * 9 * chunks * 4
    for other in (_depthwise_problem(2, 4, 13, 13, 1, 3, 3, 2, 1, 1),       # stride 2
                  _depthwise_problem(2, 4, 13, 13, 1, 3, 3, 1, 2, 2),       # dilation 2
                  _depthwise_problem(2, 4, 13, 13, 1, 3, 3, 1, 0, 1),       # no padding
                  _depthwise_problem(2, 4, 13, 13, 1, 7, 7, 1, 3, 1),       # 7x7
                  _depthwise_problem(2, 4, 13, 13, 1, 3, 3, 1, 1, 1, layout="NHWC")):
        assert not depthwise_algo.is_same_nchw(other)


@pytest.mark.gpu  # the `gpu` fixture alone does not mark: scripts/gpu_suite.sh runs -m gpu
@pytest.mark.parametrize("geometry", SAME_GEOMETRIES + [(2, 8, 28, 28, 1, 3), (1, 3, 21, 260, 1, 3)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_depthwise_same_path_on_the_gpu(gpu, rng, monkeypatch, geometry, dtype):
    """dw_same_* against the float64 reference in every direction and dtype, at
    each (rows, MINB) specialisation the dtype and size have, with 64-thread
    blocks in a capped grid and 256-thread blocks in the default and a full one."""
    N, C, H, W, mult, ks = geometry
    x, w, b, opts = _random_problem(rng, (N, C, H, W, C * mult, ks, ks, 1, ks // 2, 1, C), "NCHW", dtype)
    assert depthwise_algo.is_same_nchw(_problem_of(x, w, opts))
    t = _dtypes.cuda_type(np.dtype(dtype).name)
    for rows, minb in depthwise_algo.SAME_VARIANTS:
        if f"dw_same_nchw<{t}, {ks}, {rows}, {minb}>" not in depthwise_algo.FAMILY.name_expressions:
            continue
        # cap 3 blocks: every warp loops over bands; None: one resident wave for 8 rows
        for threads, cap in ((64, 3), (256, None), (256, 0)):
            monkeypatch.setattr(depthwise_algo, "same_variant", lambda p, d: (rows, minb))
            monkeypatch.setattr(depthwise_algo, "SAME_THREADS", threads)
            monkeypatch.setattr(depthwise_algo, "SAME_GRID_CAP", cap)
            monkeypatch.setattr(depthwise_algo, "SMALL_PATH", False)   # dw_small_nchw has its own test
            _reset_depthwise_caches()
            _check_all_directions(gpu, rng, x, w, b, opts, "depthwise")
            assert f"dw_same_nchw<{t}, {ks}, {rows}, {minb}>" in _depthwise_launched()
    _reset_depthwise_caches()


@pytest.mark.gpu  # the `gpu` fixture alone does not mark: scripts/gpu_suite.sh runs -m gpu
def test_depthwise_same_path_misaligned_and_deterministic_on_the_gpu(gpu, rng):
    """W % 4 == 0 but the arrays start 4 bytes off a 16-byte boundary: the
    scalar loads run and agree with the vector path to the bit; backward
    filter gives the same bits twice."""
    x, w, b, opts = _random_problem(rng, (2, 4, 13, 28, 4, 3, 3, 1, 1, 1, 4), "NCHW", np.float32)
    dy = random_array(rng, x.shape, np.float32)

    def offset(a):
        buf = gpu.empty(a.size + 1, a.dtype)
        view = buf[1:].reshape(a.shape)
        view[...] = gpu.asarray(a)
        return view

    X, Wt, DY = gpu.asarray(x), gpu.asarray(w), gpu.asarray(dy)
    Xo, DYo = offset(x), offset(dy)
    assert Xo.data.ptr % 16 != 0
    for aligned, shifted in ((conv2d_forward(X, Wt, algo="depthwise", **opts),
                              conv2d_forward(Xo, Wt, algo="depthwise", **opts)),
                             (conv2d_backward_data(DY, Wt, x.shape, algo="depthwise", **opts),
                              conv2d_backward_data(DYo, Wt, x.shape, algo="depthwise", **opts)),
                             (conv2d_backward_filter(X, DY, w.shape, algo="depthwise", **opts),
                              conv2d_backward_filter(Xo, DYo, w.shape, algo="depthwise", **opts))):
        assert bool((aligned == shifted).all())
    first = conv2d_backward_filter(X, DY, w.shape, algo="depthwise", deterministic=True, **opts)
    second = conv2d_backward_filter(X, DY, w.shape, algo="depthwise", deterministic=True, **opts)
    assert bool((first == second).all())


# --- dw_small_nchw: 3x3 "same" planes of one row segment (W <= 64) ---------------

def _emulate_dw_small(p, direction, a, b, rows, vec):
    """A literal NumPy transliteration of dw_small_nchw, warp by warp: slots,
    clamped and predicated loads, halo rows by shuffles of G lanes from the
    neighbour slots (memory only at a warp's first / last slot), halo columns
    by shuffles of one lane, the row-by-row accumulation.  Returns y or dx."""
    G = -(-p.W // 4)
    KS, HC = 3, 1
    IN = rows + 2 * HC
    Hs, Ws, mult = p.H, p.W, p.K // p.C
    spw = 32 // G
    bands = -(-Hs // rows)
    if direction == "forward":
        cin, cout, div, flip, src = p.C, p.K, mult, False, a
    else:
        assert mult == 1
        cin, cout, div, flip, src = p.K, p.C, 1, True, a

    def shfl_up(v, d):      # lane L <- lane L - d (own value if L - d < 0)
        return np.stack([v[L - d] if L >= d else v[L] for L in range(32)])

    def shfl_down(v, d):    # lane L <- lane L + d (own value if L + d > 31)
        return np.stack([v[L + d] if L + d <= 31 else v[L] for L in range(32)])

    out = np.full((p.N, cout, Hs, Ws), np.nan)
    slots = p.N * cout * bands
    for base in range(0, slots, spw):
        raw = np.zeros((32, IN, 4))
        lanes = []
        for L in range(32):
            sl, g = L // G, L % G
            col, col_c = 4 * g, min(4 * g, 4 * (G - 1))
            slot = base + sl
            s_c = min(slot, slots - 1)
            band, plane = s_c % bands, s_c // bands
            co, n = plane % cout, plane // cout
            active = sl < spw and slot < slots
            row0 = band * rows - HC
            top_mem = sl == 0 and band > 0
            bottom_mem = sl == spw - 1 and band < bands - 1
            lanes.append((sl, g, col, band, plane, co, n, active, row0))
            img = src[n, co // div]
            for r in range(IN):
                h = row0 + r
                want = active and 0 <= h < Hs and (top_mem if r < HC else bottom_mem if r >= HC + rows else True)
                hc = min(max(h, 0), Hs - 1)
                for j in range(4):
                    # the vector load reads columns col_c..col_c + 3 (in the row when vec)
                    v = img[hc, col_c + j] if vec else img[hc, min(col_c + j, Ws - 1)]
                    raw[L, r, j] = v if (want and (vec or col + j < Ws)) else 0.0
        for r in range(HC):
            up, down = shfl_up(raw[:, r + rows], G), shfl_down(raw[:, HC + r], G)
            for L, (sl, g, col, band, plane, co, n, active, row0) in enumerate(lanes):
                if sl > 0 and band > 0:
                    raw[L, r] = up[L]
                if sl < spw - 1 and band < bands - 1:
                    raw[L, HC + rows + r] = down[L]
        acc = np.zeros((32, rows, 4))
        for r in range(IN):
            left, right = shfl_up(raw[:, r, 4 - HC], 1), shfl_down(raw[:, r, 0], 1)
            for L, (sl, g, col, band, plane, co, n, active, row0) in enumerate(lanes):
                wt = b[co, 0][::-1, ::-1] if flip else b[co, 0]
                win = np.concatenate([[left[L] if g > 0 else 0.0], raw[L, r], [right[L] if g < G - 1 else 0.0]])
                for a_ in range(KS):
                    i = r - a_
                    if 0 <= i < rows:
                        for s in range(KS):
                            acc[L, i] += win[s:s + 4] * wt[a_, s]
                i = r - (KS - 1)
                h = band * rows + i
                if i >= 0 and active and h < Hs:
                    for j in range(4):
                        if col + j < Ws:
                            out[n, co, h, col + j] = acc[L, i, j]
    return out


# (N, C, H, W, multiplier): 28 x 28 (a warp = one plane at 7 rows), W % 4 != 0
# (scalar loads), a partial last band, sizes 1, 3, 7, 13, W 64 (16 lanes per slot).
SMALL_GEOMETRIES = [(1, 1, 1, 1, 1), (2, 3, 7, 13, 1), (1, 2, 28, 28, 1), (2, 2, 13, 9, 2), (1, 2, 3, 64, 1),
                    (2, 3, 10, 20, 3)]


@pytest.mark.parametrize("geometry", SMALL_GEOMETRIES)
@pytest.mark.parametrize("rows", [4, 7, 8])
def test_depthwise_small_kernel_emulation_matches_reference(rng, geometry, rows):
    N, C, H, W, mult = geometry
    p = _depthwise_problem(N, C, H, W, mult, 3, 3, 1, 1, 1)
    assert depthwise_algo.is_small_nchw(p, "forward")
    assert depthwise_algo.is_small_nchw(p, "backward_data") == (mult == 1)
    x = random_array(rng, p.x_shape, F64)
    w = random_array(rng, p.w_shape, F64)
    dy = random_array(rng, p.y_shape, F64)
    opts = _options(1, 1, 1, C)
    for vec in {False, W % 4 == 0}:
        np.testing.assert_allclose(_emulate_dw_small(p, "forward", x, w, rows, vec), conv2d_forward(x, w, **opts),
                                   rtol=1e-12, atol=1e-12)
        if mult == 1:
            np.testing.assert_allclose(_emulate_dw_small(p, "backward_data", dy, w, rows, vec),
                                       conv2d_backward_data(dy, w, x.shape, **opts), rtol=1e-12, atol=1e-12)


def test_depthwise_small_path_selection():
    """Which problems take dw_small_nchw, with which rows, threads and grid;
    every choice is a declared specialisation."""
    small = _depthwise_problem(32, 192, 28, 28, 1, 3, 3, 1, 1, 1)
    assert depthwise_algo.is_small_nchw(small, "forward") and depthwise_algo.is_small_nchw(small, "backward_data")
    assert not depthwise_algo.is_small_nchw(small, "backward_filter")
    assert depthwise_algo.small_variant(small, "forward", True) == (7, 3)
    assert depthwise_algo.small_variant(small, "forward", False) == (7, 1)
    (expr, grid, block, shared, scalars), = depthwise_algo.DEPTHWISE._make_plan(small, "forward", True)[0]
    assert expr == "dw_small_nchw<float, 3, 7, 3, true>" and block == (256,) and shared == 0
    assert grid == (32 * 192 // 8,) and int(scalars[-1]) == 32 * 192 * 4   # a warp per plane, 4 slots of 7 rows
    one = _depthwise_problem(1, 192, 28, 28, 1, 3, 3, 1, 1, 1)
    (expr, grid, block, shared, scalars), = depthwise_algo.DEPTHWISE._make_plan(one, "forward", True)[0]
    assert block == (64,) and grid == (96,)     # batch 1: smaller blocks, more SMs
    assert not depthwise_algo.is_small_nchw(_depthwise_problem(32, 96, 112, 112, 1, 3, 3, 1, 1, 1), "forward")
    assert not depthwise_algo.is_small_nchw(_depthwise_problem(2, 4, 28, 65, 1, 3, 3, 1, 1, 1), "forward")
    assert not depthwise_algo.is_small_nchw(_depthwise_problem(2, 4, 28, 28, 1, 5, 5, 1, 2, 1), "forward")
    assert not depthwise_algo.is_small_nchw(_depthwise_problem(2, 4, 28, 28, 2, 3, 3, 1, 1, 1), "backward_data")
    assert not depthwise_algo.is_small_nchw(_depthwise_problem(2, 4, 28, 28, 1, 3, 3, 2, 1, 1), "forward")
    for H, W in ((1, 1), (3, 7), (13, 13), (14, 14), (28, 28), (56, 56), (32, 64), (7, 61)):
        for dtype in _dtypes.SUPPORTED:
            for N in (1, 32):
                p = _depthwise_problem(N, 16, H, W, 1, 3, 3, 1, 1, 1, dtype=dtype)
                for direction in ("forward", "backward_data"):
                    assert depthwise_algo.is_small_nchw(p, direction)
                    for vec in (False, True):
                        rows, minb = depthwise_algo.small_variant(p, direction, vec)
                        assert rows * -(-H // rows) - H < 4
                        expr = depthwise_algo.DEPTHWISE._make_plan(p, direction, vec)[0][0][0]
                        assert expr in depthwise_algo.FAMILY.name_expressions
                        assert expr.endswith(f"{rows}, {minb}, {'true' if vec else 'false'}>")


@pytest.mark.gpu  # the `gpu` fixture alone does not mark: scripts/gpu_suite.sh runs -m gpu
@pytest.mark.parametrize("geometry", SMALL_GEOMETRIES + [(2, 8, 28, 28, 1), (3, 5, 14, 14, 1), (2, 4, 56, 56, 1)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_depthwise_small_path_on_the_gpu(gpu, rng, monkeypatch, geometry, dtype):
    """dw_small_nchw against the float64 reference (forward with bias, backward
    data; backward filter runs dw_same_filter_nchw) in every dtype, at each
    (rows, MINB) specialisation the dtype has, in 256- and 64-thread blocks and
    a grid capped at 2 blocks (warps loop over slots)."""
    N, C, H, W, mult = geometry
    x, w, b, opts = _random_problem(rng, (N, C, H, W, C * mult, 3, 3, 1, 1, 1, C), "NCHW", dtype)
    p = _problem_of(x, w, opts)
    assert depthwise_algo.is_small_nchw(p, "forward")
    t = _dtypes.cuda_type(np.dtype(dtype).name)
    vec = "true" if W % 4 == 0 else "false"
    for rows, minb in depthwise_algo.SMALL_VARIANTS:
        if f"dw_small_nchw<{t}, 3, {rows}, {minb}, {vec}>" not in depthwise_algo.FAMILY.name_expressions:
            continue
        for threads, cap in ((256, 0), (64, 2)):
            monkeypatch.setattr(depthwise_algo, "small_variant", lambda p, d, v: (rows, minb))
            monkeypatch.setattr(depthwise_algo, "SMALL_THREADS", threads)
            monkeypatch.setattr(depthwise_algo, "_SMALL_MIN_BLOCKS", 0)
            monkeypatch.setattr(depthwise_algo, "SMALL_GRID_CAP", cap)
            _reset_depthwise_caches()
            _check_all_directions(gpu, rng, x, w, b, opts, "depthwise")
            assert f"dw_small_nchw<{t}, 3, {rows}, {minb}, {vec}>" in _depthwise_launched()
    _reset_depthwise_caches()


@pytest.mark.gpu  # the `gpu` fixture alone does not mark: scripts/gpu_suite.sh runs -m gpu
def test_depthwise_small_path_agrees_with_the_same_kernel_on_the_gpu(gpu, rng, monkeypatch):
    """dw_small_nchw gives the same bits as dw_same_nchw (the same products
    summed in the same order), with every activation fused, vector and scalar
    (misaligned) loads."""
    from dnnprims.activations import ACTIVATION_MODES

    x, w, b, opts = _random_problem(rng, (3, 6, 28, 28, 6, 3, 3, 1, 1, 1, 6), "NCHW", np.float32)
    dy = random_array(rng, x.shape, np.float32)
    X, Wt, B, DY = (gpu.asarray(a) for a in (x, w, b, dy))
    buf = gpu.empty(x.size + 1, x.dtype)
    Xo = buf[1:].reshape(x.shape)
    Xo[...] = X
    assert Xo.data.ptr % 16 != 0
    for small in (True, False):
        monkeypatch.setattr(depthwise_algo, "SMALL_PATH", small)
        _reset_depthwise_caches()
        got = [conv2d_backward_data(DY, Wt, x.shape, algo="depthwise", **opts)]
        for inp in (X, Xo):
            got += [conv2d_forward(inp, Wt, B, algo="depthwise", activation=mode,
                                   alpha={"elu": 0.7, "leaky_relu": 0.2, "clipped_relu": 0.5}.get(mode), **opts)
                    for mode in (None, *ACTIVATION_MODES)]
        if small:
            first = got
    _reset_depthwise_caches()
    for a, c in zip(first, got):
        assert bool((a == c).all())


# --- implicit-GEMM backward passes: split-K backward filter, sub-pixel backward data --

# (N, C, H, W, K, R, S, stride, padding, dilation, groups): long reductions over
# N*P*Q with small filters (several split-K chunks), a K and C*R*S wide enough
# for the 128x128 tile, strides 2 and 3 with dilation, phases without taps,
# sizes 1, 3, 7, 13.
BACKWARD_CASES = [
    pytest.param((4, 3, 32, 32, 5, 3, 3, 1, 1, 1, 1), id="splitk-small-filter"),
    pytest.param((2, 13, 23, 29, 7, 1, 1, 1, 0, 1, 1), id="splitk-1x1-odd"),
    pytest.param((2, 16, 9, 9, 130, 3, 3, 1, 1, 1, 1), id="wide-128x128"),
    pytest.param((3, 7, 13, 13, 13, 3, 3, 2, 1, 2, 1), id="stride2-dilation2"),
    pytest.param((2, 6, 13, 7, 9, 3, 3, 3, 2, 2, 3), id="stride3-dilation2-groups3"),
    pytest.param((1, 1, 7, 7, 1, 7, 7, 3, 3, 1, 1), id="7x7-stride3"),
    pytest.param((2, 3, 13, 13, 7, 1, 3, (3, 2), (0, 1), (1, 3), 1), id="phases-without-taps"),
]

BACKWARD_ALGOS = ["implicit_gemm_wgrad", "implicit_gemm_wgrad_atomic", "implicit_gemm_wgrad_64x64",
                  "implicit_gemm_wgrad_128x128", "implicit_gemm_subpixel", "implicit_gemm_subpixel_128x128",
                  "implicit_gemm_subpixel_128x64"]


def _backward_algorithm(monkeypatch, name):
    """The registered algorithm, or a tile variant registered for this test."""
    from dnnprims.algos import implicit_gemm_backward as igb
    if name not in algos.REGISTRY:
        base, tile = name.rsplit("_", 1)
        algorithm = (igb.ImplicitGemmBackwardFilter(tile=tile) if "wgrad" in base
                     else igb.SubpixelBackwardData(tile=tile))
        assert algorithm.name == name
        monkeypatch.setitem(algos.REGISTRY, name, algorithm)
    return algos.REGISTRY[name]


@pytest.mark.parametrize("algo", BACKWARD_ALGOS)
@pytest.mark.parametrize("case", BACKWARD_CASES + [CASES[2], CASES[5], CASES[7], CASES[8]])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_implicit_gemm_backward_matches_reference(xp, rng, monkeypatch, algo, case, layout, dtype):
    algorithm = _backward_algorithm(monkeypatch, algo)
    x, w, b, opts = _random_problem(rng, case, layout, dtype)
    problem = _problem_of(x, w, opts)
    (direction,) = algorithm.directions
    if not algorithm.supports(problem, direction)[0]:
        assert dtype == np.float64
        return
    _check_all_directions(xp, rng, x, w, b, opts, algo, [direction])


@HYPOTHESIS
@given(problem=conv_problems(), dtype=st.sampled_from(["float32", "float16"]),
       algo=st.sampled_from(["implicit_gemm_wgrad", "implicit_gemm_wgrad_atomic", "implicit_gemm_subpixel"]),
       seed=st.integers(0, 2**32 - 1))
def test_implicit_gemm_backward_matches_reference_drawn(xp, problem, dtype, algo, seed):
    rng = np.random.default_rng(seed)
    problem = dict(problem)
    x = random_array(rng, problem.pop("x_shape"), dtype)
    w = random_array(rng, problem.pop("w_shape"), dtype)
    b = random_array(rng, (w.shape[0],), dtype)
    _check_all_directions(xp, rng, x, w, b, problem, algo, algos.REGISTRY[algo].directions)


def test_wgrad_tile_rule():
    from dnnprims.algos import implicit_gemm_backward as igb

    def tile(C, K, R, groups=1):
        return igb.wgrad_tile(_problem_of(np.empty((32, C, 28, 28)), np.empty((K, C // groups, R, R)),
                                          _options(1, R // 2, 1, groups)))
    assert tile(256, 256, 3) == "128x128"          # r50_4_3x3: 144 tiles of 64x64
    assert tile(512, 512, 3) == "64x64"            # r50_5_3x3: 576 tiles, 64x64 won
    assert tile(64, 192, 5) == "64x64"             # K = 192 leaves a 128-row tile a quarter empty
    assert tile(64, 256, 1) == "64x64"             # 64 taps: half of a 128-wide tile


def test_wgrad_splits_cover_the_reduction_in_whole_k_steps():
    from dnnprims.algos import implicit_gemm_backward as igb
    for case in BACKWARD_CASES + CASES + [pytest.param((32, 64, 56, 56, 64, 1, 1, 1, 0, 1, 1))]:
        x_shape, w_shape = case.values[0][:4], None
        N, C, H, W, K, R, S, stride, padding, dilation, groups = case.values[0]
        p = _problem_of(np.empty((N, C, H, W)), np.empty((K, C // groups, R, S)),
                        _options(stride, padding, dilation, groups))
        for tile, (_, _, bk, _, _) in igb.WGRAD_TILES.items():
            splits, chunk = igb.wgrad_splits(p, tile)
            L = p.N * p.P * p.Q
            assert splits >= 1 and chunk % bk == 0
            assert (splits - 1) * chunk < L <= splits * chunk, (tile, splits, chunk, L)
            assert p.groups * splits <= igb.MAX_GRID_Z
    # A batch-32 1x1 layer: one 64x64 tile of dw, so the depth is split many ways.
    assert splits > 100


@pytest.mark.parametrize("case", BACKWARD_CASES + CASES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_subpixel_tables_on_numpy(rng, case, layout):
    # The sub-pixel kernel's GEMM written out on NumPy from the phase tables:
    # per group and phase, rows (image, i, j) gather dy through the table,
    # B[k, n] = w through .w for k < depth, and the result lands on the
    # phase's pixels (a + sh*i, b + sw*j).  Every pixel is written exactly once.
    from dnnprims.algos import implicit_gemm_backward as igb
    x, w, _, opts = _random_problem(rng, case, layout, F64)
    p = _problem_of(x, w, opts)
    dy = random_array(rng, p.y_shape, F64)
    expected = conv2d_backward_data(dy, w, x.shape, **opts)
    table, depth, per_phase = igb.subpixel_tables(p)
    assert per_phase % 16 == 0 and len(table) == per_phase * len(depth)
    nhwc = layout == "NHWC"
    (sh, sw), Kg, Cg = p.stride, p.K // p.groups, p.C // p.groups
    out = np.full(expected.size, np.nan)
    for phase, (a, b) in enumerate((a, b) for a in range(sh) for b in range(sw)):
        Hp, Wp = len(range(a, p.H, sh)), len(range(b, p.W, sw))
        image, ij = np.divmod(np.arange(p.N * Hp * Wp), Hp * Wp)
        i, j = np.divmod(ij, Wp)
        base = image * p.K * p.P * p.Q + ((i * p.Q + j) * p.K if nhwc else i * p.Q + j)
        taps = table[phase * per_phase:(phase + 1) * per_phase]
        k = int(depth[phase])
        for group in range(p.groups):
            dy_off = group * Kg * (1 if nhwc else p.P * p.Q)
            ii, jj = i[:, None] + taps[None, :, 1], j[:, None] + taps[None, :, 2]
            inside = (ii >= 0) & (ii < p.P) & (jj >= 0) & (jj < p.Q)
            A = np.where(inside, dy.ravel()[np.where(inside, dy_off + base[:, None] + taps[None, :, 0], 0)], 0.0)
            B = w.ravel()[group * Kg * Cg * p.R * p.S + np.arange(Cg)[None, :] * p.R * p.S
                          + taps[:k, 3][:, None]] if k else np.zeros((0, Cg))
            Y = A[:, :k] @ B
            h, wi = a + sh * i, b + sw * j
            channel = group * Cg + np.arange(Cg)[None, :]
            where = ((((image * p.H + h) * p.W + wi)[:, None] * p.C + channel) if nhwc
                     else ((image[:, None] * p.C + channel) * p.H + h[:, None]) * p.W + wi[:, None])
            assert np.isnan(out[where]).all()
            out[where] = Y
    np.testing.assert_allclose(out.reshape(expected.shape), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_wgrad_split_k_is_bit_reproducible(gpu, rng, layout, dtype):
    x, w, _, opts = _random_problem(rng, BACKWARD_CASES[0].values[0], layout, dtype)
    X, DY = gpu.asarray(x), gpu.asarray(random_array(rng, conv2d_forward(x, w, **opts).shape, dtype))
    p = _problem_of(x, w, opts)
    assert algos.REGISTRY["implicit_gemm_wgrad"].mode_and_splits(p)[2] > 1
    first = conv2d_backward_filter(X, DY, w.shape, algo="implicit_gemm_wgrad", **opts)
    for _ in range(3):
        again = conv2d_backward_filter(X, DY, w.shape, algo="implicit_gemm_wgrad", **opts)
        assert gpu.array_equal(first.view(np.uint16 if dtype == np.float16 else np.uint32),
                               again.view(np.uint16 if dtype == np.float16 else np.uint32))
    auto = conv2d_backward_filter(X, DY, w.shape, deterministic=True, **opts)
    assert auto.shape == first.shape


def test_deterministic_excludes_the_atomic_backward_filter():
    problem = _problem_of(np.empty((4, 3, 32, 32), np.float32), np.empty((5, 3, 3, 3), np.float32),
                          _options(1, 1, 1, 1))
    atomic = algos.REGISTRY["implicit_gemm_wgrad_atomic"]
    assert not atomic.deterministic and algos.admits(atomic, problem, "backward_filter")[0]
    ok, reason = algos.admits(atomic, problem, "backward_filter", algos.ConvOptions(deterministic=True))
    assert not ok and "deterministic" in reason
    name, _ = algos.explain_auto(problem, "backward_filter", algos.ConvOptions(deterministic=True))
    assert algos.REGISTRY[name].deterministic
    with pytest.raises(ValueError, match="deterministic"):
        conv2d_backward_filter(np.ones((4, 3, 32, 32), np.float32), np.ones((4, 5, 32, 32), np.float32),
                               (5, 3, 3, 3), padding=1, algo="implicit_gemm_wgrad_atomic", deterministic=True)
    # The deterministic split-K reports its float partials as workspace.
    wgrad = algos.REGISTRY["implicit_gemm_wgrad"]
    _, _, splits, _ = wgrad.mode_and_splits(problem)
    assert wgrad.workspace_bytes(problem, "backward_filter") == 4 * splits * 5 * 3 * 3 * 3


@pytest.mark.parametrize("case", BACKWARD_CASES[:4] + CASES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_wgrad_index_math_on_numpy(rng, case, layout):
    # conv_wgrad_implicit_gemm's addressing written out on NumPy: per split and
    # group, each position l decodes to (image, p, q); A[m, l] from dy, B[l, n]
    # gathered from x through the padded forward tap table; the partial tiles
    # land at (g*Kg + m) * Ntaps + table.w and are summed in split order.
    from dnnprims.algos import implicit_gemm_backward as igb
    x, w, _, opts = _random_problem(rng, case, layout, F64)
    p = _problem_of(x, w, opts)
    dy = random_array(rng, p.y_shape, F64)
    expected = conv2d_backward_filter(x, dy, w.shape, **opts)
    nhwc = layout == "NHWC"
    table = igb.wgrad_table(p)
    Kg, Cg, ntaps = p.K // p.groups, p.C // p.groups, (p.C // p.groups) * p.R * p.S
    assert len(table) % igb.WGRAD_TABLE_MULTIPLE == 0
    L, PQ = p.N * p.P * p.Q, p.P * p.Q
    splits, chunk = igb.wgrad_splits(p, igb.wgrad_tile(p))
    partial = np.full((splits, p.K * ntaps), np.nan)
    for split in range(splits):
        l = np.arange(split * chunk, min(L, (split + 1) * chunk))
        image, pq = np.divmod(l, PQ)
        h0, w0 = pq // p.Q * p.stride[0] - p.padding[0], pq % p.Q * p.stride[1] - p.padding[1]
        dy_base = l * p.K if nhwc else image * p.K * PQ + pq
        x_base = image * p.C * p.H * p.W + ((h0 * p.W + w0) * p.C if nhwc else h0 * p.W + w0)
        for g in range(p.groups):
            m = np.arange(Kg)
            A = dy.ravel()[g * Kg * (1 if nhwc else PQ) + dy_base[None, :] + (m[:, None] if nhwc else m[:, None] * PQ)]
            hh, ww = h0[:, None] + table[None, :, 1], w0[:, None] + table[None, :, 2]
            inside = (hh >= 0) & (hh < p.H) & (ww >= 0) & (ww < p.W)
            x_off = g * Cg * (1 if nhwc else p.H * p.W)
            B = np.where(inside, x.ravel()[np.where(inside, x_off + x_base[:, None] + table[None, :, 0], 0)], 0.0)
            tile = A @ B[:, :ntaps]
            where = (g * Kg + m[:, None]) * ntaps + table[None, :ntaps, 3]
            partial[split, where] = tile
    np.testing.assert_allclose(partial.sum(axis=0).reshape(expected.shape), expected, rtol=1e-12, atol=1e-12)


# --- implicit GEMM grids and 32-bit offsets at the limits (review6h) ---------------

def _big_problem(x_shape, w_shape, groups=1, stride=1, padding=0, dtype=np.float32):
    """A ConvProblem of these shapes (NCHW); nothing is allocated."""
    return dnnprims.conv._describe(x_shape, w_shape, stride, padding, 1, groups, "NCHW", dtype)


_GRID_LIMIT_CASES = [
    # (name, x shape, w shape, groups, stride): each over a grid or int32 limit of some
    # implicit GEMM kernel while x and y stay far below 2^31 elements.
    pytest.param((1, 65536, 1, 1), (65536, 65536, 1, 1), 1, 1, id="filter-2^32-elements"),
    pytest.param((1, 70000, 1, 1), (70000, 1, 1, 1), 70000, 1, id="groups-70000"),
    pytest.param((1, 1, 1, 1), (1 << 23, 1, 1, 1), 1, 1, id="K-2^23"),
    pytest.param((1, 1, 1, 1), (1 << 22, 1, 1, 1), 1, 1, id="K-2^22"),
    pytest.param((1, 1 << 23, 1, 1), (1, 1 << 23, 1, 1), 1, 1, id="C-2^23"),
    pytest.param((1, 1 << 22, 1, 1), (1, 1 << 22, 1, 1), 1, 1, id="C-2^22"),
    pytest.param((1, 1 << 22, 2, 2), (1, 1 << 22, 1, 1), 1, 2, id="C-2^22-stride2"),
    pytest.param((1, 64, 3, 3), (64, 64, 3, 3), 1, 1, id="small"),
]


@pytest.mark.parametrize("x_shape, w_shape, groups, stride", _GRID_LIMIT_CASES)
def test_implicit_gemm_problems_it_accepts_launch_within_cuda_limits(x_shape, w_shape, groups, stride):
    # supports() either refuses, or the plan's grid has y, z <= 65535 and x < 2^31
    # and every 32-bit kernel argument fits (np.int32 of a Python int raises past it).
    from dnnprims.algos import implicit_gemm as ig
    from dnnprims.algos import implicit_gemm_backward as igb
    p = _big_problem(x_shape, w_shape, groups, stride)

    def within(grid):
        return grid[0] < 2**31 and max(grid[1:]) <= 65535
    for name, algorithm in algos.REGISTRY.items():
        if not name.startswith("implicit_gemm"):
            continue
        for direction in algorithm.directions:
            if not algorithm.supports(p, direction)[0]:
                continue
            if isinstance(algorithm, ig.ImplicitGemmConvolution):
                ig.tap_table(p, direction)   # its int32 geometry
                assert within(ig.launch_grid(p, direction, algorithm.tile or ig.pick_tile(p, direction))), name
            elif isinstance(algorithm, igb.ImplicitGemmBackwardFilter):
                igb.wgrad_table(p)
                np.int32(p.K * (p.C // p.groups) * p.R * p.S)   # the split sum's total
                assert within(algorithm.launch_grid(p)), name
            else:
                assert within(algorithm.launch_grid(p)), name
    # The fallback still takes it.
    assert algos.REGISTRY["direct"].supports(p, "forward")[0]


def test_implicit_gemm_refuses_past_its_grid_and_filter_limits():
    p = _big_problem((1, 65536, 1, 1), (65536, 65536, 1, 1))
    for name in ("implicit_gemm", "implicit_gemm_wgrad", "implicit_gemm_subpixel"):
        algorithm = algos.REGISTRY[name]
        ok, reason = algorithm.supports(p, algorithm.directions[0])
        assert not ok and "32-bit" in reason, name
    p = _big_problem((1, 70000, 1, 1), (70000, 1, 1, 1), groups=70000)
    assert not algos.REGISTRY["implicit_gemm"].supports(p, "forward")[0]
    assert algos.REGISTRY["implicit_gemm"].supports(_big_problem((1, 1, 1, 1), (1 << 22, 1, 1, 1)), "forward")[0]
    assert not algos.REGISTRY["implicit_gemm_64x64"].supports(_big_problem((1, 1, 1, 1), (1 << 22, 1, 1, 1)),
                                                             "forward")[0]


@pytest.mark.parametrize("direction", algos.DIRECTIONS)
def test_an_empty_batch_under_a_workspace_limit(direction):
    # admits() asks every candidate's workspace_bytes when a limit is set; the
    # split-K weight gradient divided by its zero-length depth (ZeroDivisionError).
    p = _big_problem((0, 4, 7, 7), (8, 4, 3, 3), padding=1)
    for algorithm in algos.REGISTRY.values():
        algos.admits(algorithm, p, direction, algos.ConvOptions(workspace_limit=1 << 20))
    x, dy = np.zeros((0, 4, 7, 7), np.float32), np.zeros((0, 8, 7, 7), np.float32)
    dw = conv2d_backward_filter(x, dy, (8, 4, 3, 3), padding=1, workspace_limit=1 << 20)
    assert dw.shape == (8, 4, 3, 3) and not dw.any()


@pytest.mark.parametrize("H", [2**29 - 3, 2**29 - 2, 2**29, 2**29 + 5, 2**30])
def test_implicit_gemm_out_of_range_marker_stays_outside(H):
    # The kernels mark padded taps and rows past M with dh = -2^29 and test
    # (unsigned)(h0 + dh) < Hin.  For a problem it accepts, that test must fail
    # for every marked pair: h0 - 2^29 < 0 for every output row's h0, and
    # -2^29 + dh < 0 for every tap (here: forward and backward data over an
    # H x 1 image, 3x1 filter, padding 1; x stays below 2^31 elements).
    from dnnprims.algos import implicit_gemm as ig
    p = _big_problem((1, 1, H, 1), (1, 1, 3, 1), padding=(1, 0))
    for name, algorithm in algos.REGISTRY.items():
        if not name.startswith("implicit_gemm"):
            continue
        for direction in algorithm.directions:
            if not algorithm.supports(p, direction)[0]:
                continue
            if direction == "forward" or direction == "backward_filter":
                rows, sh, pad, Hin = p.P, p.stride[0], p.padding[0], p.H
            else:   # dy gathered, padding dh (R - 1) - ph (sub-pixel: at most that)
                rows, sh, pad, Hin = p.H, 1, p.dilation[0] * (p.R - 1) - p.padding[0], p.P
            h0_max = (rows - 1) * sh - pad
            dh_max = p.dilation[0] * (p.R - 1)
            assert not 0 <= h0_max + ig._OUTSIDE < Hin, (name, direction)
            assert not 0 <= ig._OUTSIDE + dh_max < Hin, (name, direction)
