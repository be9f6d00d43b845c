"""The "polyphase" algorithm (dnnprims/algos/polyphase.py): the decomposition on
NumPy against the reference, its refusals, how ``auto`` / ``find`` / the options
see it, and the GPU path against the float64 reference in every dtype, layout
and direction (tolerance: the inner algorithm's row)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import dnnprims
from dnnprims import algos, conv
from dnnprims.algos import find as find_mode
from dnnprims.algos import polyphase
from dnnprims.conv import (conv2d_backward_bias, conv2d_backward_data, conv2d_backward_filter,
                           conv2d_forward)
from dnnprims.testing import assert_close
from dnnprims.testing.strategies import polyphase_conv_problems

from conftest import FLOAT_DTYPES, random_array

F64 = np.float64
POLY = algos.REGISTRY["polyphase"]
HYPOTHESIS = settings(max_examples=40, deadline=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture])


def _problem(x_shape, w_shape, padding, dilation, groups=1, layout="NCHW", dtype="float32", stride=1):
    return conv._describe(x_shape, w_shape, stride, padding, dilation, groups, layout, np.dtype(dtype))


def _x_shape(N, C, H, W, layout):
    return (N, C, H, W) if layout == "NCHW" else (N, H, W, C)


# (N, C, H, W, K, R, S, padding, dilation, groups): every one meets the conditions.
# Sizes of the phase sub-image 1, 3, 7, 13; dilations (2, 2), (2, 3), (3, 1);
# odd channel counts; N = 1; groups, depthwise (multiplier 1 and 2).
CASES = [
    pytest.param((2, 3, 6, 6, 5, 3, 3, (2, 2), (2, 2), 1), id="d2-3x3-same"),
    pytest.param((1, 5, 14, 21, 3, 3, 3, (2, 3), (2, 3), 1), id="d2x3-N1-sub7"),
    pytest.param((2, 3, 39, 7, 4, 2, 3, (3, 0), (3, 1), 1), id="d3x1-sub13x7-even-filter"),
    pytest.param((3, 1, 2, 3, 1, 1, 1, (0, 0), (2, 3), 1), id="1x1-sub1"),
    pytest.param((1, 2, 6, 9, 3, 3, 3, (0, 0), (2, 3), 1), id="no-padding-sub3"),
    pytest.param((2, 4, 26, 14, 6, 3, 1, (4, 0), (2, 2), 2), id="groups2-pad2dil"),
    pytest.param((2, 3, 6, 14, 3, 3, 3, (2, 2), (2, 2), 3), id="depthwise"),
    pytest.param((1, 3, 9, 9, 6, 3, 3, (3, 3), (3, 3), 3), id="depthwise-x2-d3"),
]


def _operands(rng, case, layout, dtype=F64):
    N, C, H, W, K, R, S, padding, dilation, groups = case
    x = random_array(rng, _x_shape(N, C, H, W, layout), dtype)
    w = random_array(rng, (K, C // groups, R, S), dtype)
    b = random_array(rng, (K,), dtype)
    opts = dict(padding=padding, dilation=dilation, groups=groups, layout=layout)
    return x, w, b, opts, _problem(x.shape, w.shape, padding, dilation, groups, layout, np.dtype(dtype).name)


# --- the decomposition on NumPy ------------------------------------------------------

def _check_emulation(rng, x, w, b, opts, p):
    assert POLY.supports(p, "forward") == (True, "")
    y = conv2d_forward(x, w, b, **opts)
    assert_close(polyphase.emulate(p, "forward", x, w, b), y, F64, what="forward")
    dy = random_array(rng, y.shape)
    assert_close(polyphase.emulate(p, "backward_data", dy, w),
                 conv2d_backward_data(dy, w, x.shape, **opts), F64, what="backward_data")
    assert_close(polyphase.emulate(p, "backward_filter", x, dy),
                 conv2d_backward_filter(x, dy, w.shape, **opts), F64, what="backward_filter")


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_decomposition_on_numpy_equals_the_reference(rng, case, layout):
    x, w, b, opts, p = _operands(rng, case, layout)
    _check_emulation(rng, x, w, b, opts, p)


@HYPOTHESIS
@given(problem=polyphase_conv_problems(), seed=st.integers(0, 2**32 - 1))
def test_decomposition_on_numpy_equals_the_reference_drawn(problem, seed):
    rng = np.random.default_rng(seed)
    problem = dict(problem)
    x = random_array(rng, problem.pop("x_shape"))
    w = random_array(rng, problem.pop("w_shape"))
    b = random_array(rng, (w.shape[0],))
    problem.pop("stride")
    p = _problem(x.shape, w.shape, problem["padding"], problem["dilation"], problem["groups"],
                 problem["layout"], "float64")
    _check_emulation(rng, x, w, b, problem, p)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_phases_go_to_the_documented_batch_index_and_back(rng, layout):
    N, C, H, W, (dh, dw) = 2, 3, 6, 9, (2, 3)
    x = random_array(rng, _x_shape(N, C, H, W, layout))
    stacked = polyphase.split_phases(np, x, layout, (dh, dw))
    assert stacked.flags.c_contiguous and stacked.shape == _x_shape(dh * dw * N, C, H // dh, W // dw, layout)
    for a in range(dh):
        for b in range(dw):
            for n in range(N):
                phase = x[n, :, a::dh, b::dw] if layout == "NCHW" else x[n, a::dh, b::dw, :]
                np.testing.assert_array_equal(stacked[(a * dw + b) * N + n], phase)
    back = np.full_like(x, np.nan)
    np.testing.assert_array_equal(polyphase.merge_phases(stacked, back, layout, (dh, dw)), x)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_split_and_merge_move_the_bits_in_every_dtype(xp, rng, layout, dtype):
    x = random_array(rng, _x_shape(3, 5, 6, 3, layout), dtype)
    stacked = polyphase.split_phases(xp, xp.asarray(x), layout, (3, 1))
    assert stacked.dtype == x.dtype and stacked.shape[0] == 9
    back = polyphase.merge_phases(stacked, xp.zeros_like(xp.asarray(x)), layout, (3, 1))
    got = back.get() if xp is not np else back
    np.testing.assert_array_equal(got.view(np.uint8), x.view(np.uint8))


def test_sub_problem_is_the_stacked_dilation_1_problem():
    p = _problem((4, 8, 28, 30), (16, 8, 3, 3), (2, 3), (2, 3))
    sub = polyphase.sub_problem(p)
    assert (sub.N, sub.C, sub.H, sub.W, sub.K, sub.P, sub.Q) == (24, 8, 14, 10, 16, 14, 10)
    assert (sub.padding, sub.dilation, sub.stride) == ((1, 1), (1, 1), (1, 1))
    assert (sub.P, sub.Q) == (p.P // 2, p.Q // 3)
    assert POLY.stacked_bytes(p) == (p.N * p.C * p.H * p.W + p.N * p.K * p.P * p.Q) * 4


# --- refusals --------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,match", [
    (dict(dilation=1, padding=1), r"dilation is \(1, 1\)"),
    (dict(dilation=2, padding=2, stride=2), "stride 1"),
    (dict(dilation=2, padding=1), r"padding \(1, 1\) is not a multiple of dilation \(2, 2\)"),
    (dict(dilation=(2, 3), padding=(2, 2)), "not a multiple of dilation"),
    (dict(dilation=2, padding=2, x_shape=(2, 4, 7, 8)), r"input size 7x8 is not a multiple"),
    (dict(dilation=(1, 3), padding=(1, 3), x_shape=(2, 4, 7, 8)), r"input size 7x8 is not a multiple"),
])
def test_refuses_what_it_cannot_decompose_and_says_why(kwargs, match):
    kwargs = dict(kwargs)
    x_shape = kwargs.pop("x_shape", (2, 4, 8, 12))
    w_shape = (5, 4, 3, 3)
    p = _problem(x_shape, w_shape, kwargs["padding"], kwargs["dilation"], stride=kwargs.get("stride", 1))
    for direction in algos.DIRECTIONS:
        ok, reason = POLY.supports(p, direction)
        assert not ok and reason
        with pytest.raises(ValueError, match=match):
            algos.choose(p, direction, "polyphase")
    # ... and through the public functions, before anything runs.
    x, w = np.ones(x_shape, np.float32), np.ones(w_shape, np.float32)
    with pytest.raises(ValueError, match="algo .polyphase. does not support this forward problem: .*" + match):
        conv2d_forward(x, w, algo="polyphase", **kwargs)
    assert algos.auto_rule(p, "forward") != "polyphase"


def test_workspace_is_the_stacked_buffers_plus_the_inner_algorithms_and_limits_the_choice():
    p = _problem((8, 64, 28, 28), (64, 64, 3, 3), 2, 2)
    sub = polyphase.sub_problem(p)
    stacked = POLY.stacked_bytes(p)
    for direction in algos.DIRECTIONS:
        inner, _ = POLY.inner(p, direction)
        assert POLY.workspace_bytes(p, direction) == stacked + inner.workspace_bytes(sub, direction)
        # Under a limit, the inner choice gets what the stacked buffers leave.
        limit = stacked + 1000
        bound = POLY.under(algos.ConvOptions(workspace_limit=limit))
        assert bound.workspace_bytes(p, direction) <= limit
        assert algos.admits(POLY, p, direction, algos.ConvOptions(workspace_limit=limit))[0]
        ok, reason = algos.admits(POLY, p, direction, algos.ConvOptions(workspace_limit=stacked - 1))
        assert not ok and "workspace_limit" in reason
    assert POLY.workspace_bytes(_problem((2, 4, 7, 8), (5, 4, 3, 3), 2, 2), "forward") == 0  # refused


# --- under the caller's options, auto, find ---------------------------------------------

def test_each_options_get_their_own_instance_whose_inner_choice_obeys_them():
    p = _problem((32, 256, 28, 28), (256, 256, 3, 3), 2, 2)
    assert POLY.under(algos.DEFAULT_OPTIONS) is POLY
    strict = algos.ConvOptions(precision="strict", deterministic=True)
    bound = POLY.under(strict)
    assert bound is POLY.under(algos.ConvOptions(precision="strict", deterministic=True))
    assert bound.strict and bound.deterministic and bound.name == "polyphase"
    assert algos.choose(p, "backward_filter", "polyphase", options=strict) is bound
    sub = polyphase.sub_problem(p)
    for direction in algos.DIRECTIONS:
        inner, _ = bound.inner(p, direction)
        assert inner.strict and inner.deterministic
        assert algos.admits(inner, sub, direction, strict)[0]


@pytest.mark.parametrize("table", [True, False], ids=["shipped-table", "rule-only"])
def test_auto_takes_polyphase_for_the_dilated_public_problem_at_batch_32_and_says_why(table):
    from dnnprims.algos import table as table_module
    previous = None if table else table_module.use(None)
    try:
        p = _problem((32, 256, 28, 28), (256, 256, 3, 3), 2, 2)
        for direction in algos.DIRECTIONS:
            name, reason = dnnprims.conv2d_choose((32, 256, 28, 28), (256, 256, 3, 3), padding=2,
                                                  dilation=2, direction=direction)
            assert name == "polyphase", reason
            assert reason.startswith("rule: dilation (2, 2)") and "phase sub-images" in reason
            assert "AUTO_POLYPHASE_MIN_FLOPS" in reason
            inner, _ = POLY.inner(p, direction)
            assert f"inner algorithm for the 128 x 14x14 dilation-1 sub-problem: {inner.name}" in reason
            assert inner.name.startswith("winograd")   # what the decomposition is for
    finally:
        if not table:
            table_module.use(previous)


def test_auto_keeps_the_previous_picks_under_the_work_threshold():
    # dilated_3x3_d2 at batch 1 (0.92 GFLOP): the two CuPy copies' host time made polyphase
    # slower there on the H100 (notes/polyphase.md).  Without a table the rule's picks stand.
    from dnnprims.algos import table as table_module
    p = _problem((1, 256, 28, 28), (256, 256, 3, 3), 2, 2)
    assert p.flops < algos.AUTO_POLYPHASE_MIN_FLOPS
    assert POLY.inner(p, "forward")[0].name.startswith("winograd")
    previous = table_module.use(None)
    try:
        assert [algos.auto_rule(p, d) for d in algos.DIRECTIONS] == ["gemm", "gemm", "implicit_gemm_wgrad"]
    finally:
        table_module.use(previous)
    big = _problem((32, 256, 28, 28), (256, 256, 3, 3), 2, 2)
    assert big.flops >= algos.AUTO_POLYPHASE_MIN_FLOPS


def test_auto_ranks_a_dilated_problem_polyphase_passes_by_its_undilated_twin_in_the_table():
    # With the shipped table, batch 1 takes the fastest algorithm measured at the problem's
    # dilation-1 twin (same shapes, same P and Q) among those that run the dilated filter
    # themselves (session 9: gemm 0.10 ms, implicit_gemm_splitk 0.060, cuDNN 0.060).
    from dataclasses import replace
    from dnnprims.algos import table as table_module
    p = _problem((1, 256, 28, 28), (256, 256, 3, 3), 2, 2)
    measured = table_module.current()
    for direction in algos.DIRECTIONS:
        ranked = measured.ranking(replace(p, dilation=(1, 1)), direction)[0]
        runs_dilated = [n for _, n in ranked if algos.admits(algos.REGISTRY[n], p, direction)[0]]
        assert runs_dilated and len(runs_dilated) < len(ranked)   # the twin's Winograd picks drop out
        name, reason = algos.explain_auto(p, direction)
        assert name == runs_dilated[0], reason
        assert reason.startswith("rule: dilated: the table's ranking at the undilated twin"), reason
        assert name not in ("polyphase", "gemm") and not name.startswith("winograd")
        options = algos.ConvOptions(deterministic=True)    # the caller's options still filter
        name = algos.explain_auto(p, direction, options)[0]
        assert algos.admits(algos.REGISTRY[name], p, direction, options)[0]


def test_the_undilated_twin_ranking_keeps_the_tuners_workspace_bound():
    # Without a caller's limit the table admits no algorithm needing more workspace than the
    # tuner measured with (FIND_WORKSPACE_LIMIT); the twin's ranking is judged the same way on the
    # dilated problem.  Here polyphase does not apply (padding 1 is no multiple of dilation 2).
    from dnnprims.algos.find import FIND_WORKSPACE_LIMIT
    for shape in ((1, 256, 28, 28), (64, 512, 56, 56)):
        p = _problem(shape, (shape[1], shape[1], 3, 3), 1, 2)
        assert not algos.REGISTRY["polyphase"].supports(p, "forward")[0]
        for direction in algos.DIRECTIONS:
            name, reason = algos.explain_auto(p, direction)
            assert algos.REGISTRY[name].workspace_bytes(p, direction) <= FIND_WORKSPACE_LIMIT, reason
            assert algos.admits(algos.REGISTRY[name], p, direction)[0]


# (x shape, w shape, stride, padding = dilation): DeepLab's ASPP branches (3x3 dilation 6 / 12 /
# 18 on 33x33 or 65x65: "polyphase" refuses the image size), a stride-2 dilated layer (polyphase
# refuses stride 2) and a large stride-1 one (polyphase's inner pick is direct).
_TWIN_CASES = [((16, 2048, 65, 65), (256, 2048, 3, 3), 1, 12), ((16, 2048, 33, 33), (256, 2048, 3, 3), 1, 18),
               ((8, 2048, 33, 33), (256, 2048, 3, 3), 1, 6), ((64, 1024, 112, 112), (512, 1024, 3, 3), 2, 2),
               ((8, 512, 129, 129), (256, 512, 3, 3), 1, 2)]


@pytest.mark.parametrize("x_shape,w_shape,stride,dilation", _TWIN_CASES)
def test_the_undilated_twin_never_picks_more_work_or_workspace_than_the_twin_measured(x_shape, w_shape, stride,
                                                                                    dilation):
    # The twin's times hold only for algorithms whose work the dilation leaves alone: the FFT family
    # transforms the dilated extent (DeepLab 3x3 dilation 12: fft 23 GB, dft 20 GB of workspace
    # against 13 / 11 at the twin) and was picked; and without a workspace_limit nothing over the
    # FIND_WORKSPACE_LIMIT the tuner measured with (gemm took 7 GB of im2col at batch 64, stride 2).
    from dataclasses import replace
    from dnnprims.algos import table as table_module
    p = _problem(x_shape, w_shape, dilation, dilation, stride=stride)
    twin = replace(p, dilation=(1, 1))
    for direction in algos.DIRECTIONS:
        for name, _ in algos._undilated_twin_preferences(p, direction, algos.DEFAULT_OPTIONS):
            need = algos.REGISTRY[name].workspace_bytes(p, direction)
            assert need <= algos.REGISTRY[name].workspace_bytes(twin, direction), (direction, name)
            assert need <= table_module.FIND_WORKSPACE_LIMIT, (direction, name)
        name, reason = algos.explain_auto(p, direction)
        assert algos.REGISTRY[name].workspace_bytes(p, direction) <= table_module.FIND_WORKSPACE_LIMIT, reason
        assert name not in ("fft", "fft_tiled", "dft"), reason
        # a caller's limit still decides alone (here one that admits everything)
        options = algos.ConvOptions(workspace_limit=1 << 40)
        for name, _ in algos._undilated_twin_preferences(p, direction, options):
            assert algos.REGISTRY[name].workspace_bytes(p, direction) <= \
                algos.REGISTRY[name].workspace_bytes(twin, direction), (direction, name)


def test_auto_runs_the_sub_problems_pick_itself_where_that_takes_dilated_filters():
    # NHWC float32: the table picks gemm / implicit GEMM for the dilation-1 sub-problem,
    # which run the dilated filter as it is: no layout copies.
    p = _problem((2, 28, 28, 256), (256, 256, 3, 3), 2, 2, layout="NHWC")
    for direction in algos.DIRECTIONS:
        inner, _ = POLY.inner(p, direction)
        name, reason = algos.explain_auto(p, direction)
        if inner.supports(p, direction)[0]:
            assert name == inner.name and "no layout copies" in reason
        else:   # polyphase from AUTO_POLYPHASE_MIN_FLOPS (this one has less)
            assert name != "polyphase" and p.flops < algos.AUTO_POLYPHASE_MIN_FLOPS


def test_auto_keeps_depthwise_and_tight_workspace_limits_off_polyphase():
    dw = _problem((2, 32, 28, 28), (32, 1, 3, 3), 2, 2, groups=32)
    assert POLY.supports(dw, "forward")[0]
    assert [algos.auto_rule(dw, d) for d in algos.DIRECTIONS] == ["depthwise"] * 3
    p = _problem((32, 256, 28, 28), (256, 256, 3, 3), 2, 2)
    # The stacked buffers fit, but little fits beside them: the deterministic backward
    # filter's inner choice is "direct" (no polyphase), forward's a zero-workspace
    # implicit GEMM, which runs the dilated problem itself.
    tight = algos.ConvOptions(workspace_limit=POLY.stacked_bytes(p) + 1024, deterministic=True)
    inner = {d: POLY.under(tight).inner(p, d)[0] for d in algos.DIRECTIONS}
    assert inner["backward_filter"].name == "direct"
    for direction in algos.DIRECTIONS:
        name = algos.explain_auto(p, direction, tight)[0]
        assert name != "polyphase"
        if inner[direction].name != "direct":
            assert name == inner[direction].name
    # An explicit name still runs it.
    assert algos.choose(p, "forward", "polyphase", options=tight).name == "polyphase"


def test_find_includes_polyphase_where_it_applies():
    p = _problem((2, 16, 28, 28), (16, 16, 3, 3), 2, 2)
    for direction in algos.DIRECTIONS:
        assert "polyphase" in find_mode.candidates(p, direction)
    assert "polyphase" not in find_mode.candidates(_problem((2, 16, 28, 28), (16, 16, 3, 3), 1, 1), "forward")


# --- the GPU path --------------------------------------------------------------------------

def _tiny(dtype):
    try:
        return float(np.finfo(dtype).smallest_normal)
    except ValueError:  # bfloat16 (ml_dtypes)
        import ml_dtypes
        return float(ml_dtypes.finfo(dtype).smallest_normal)


def _check_gpu(cp, rng, x, w, b, opts, options=None):
    """All three directions by algo="polyphase" on the GPU against the float64
    reference, each at the tolerance of its inner algorithm; returns the inner names."""
    options = options or {}
    dtype = x.dtype
    p = _problem(x.shape, w.shape, opts["padding"], opts["dilation"], opts["groups"], opts["layout"],
                 np.dtype(dtype).name)
    limit, precision = options.get("workspace_limit"), options.get("precision", "default")
    inner = {d: POLY.under(conv._options(limit, precision, d == "backward_filter" and
                                         options.get("deterministic", False))).inner(p, d)[0].name
             for d in algos.DIRECTIONS}
    x64, w64, b64 = x.astype(F64), w.astype(F64), b.astype(F64)
    y64 = conv2d_forward(x64, w64, b64, **opts)
    dy = random_array(rng, y64.shape, dtype)
    dy64 = dy.astype(F64)
    X, Wt, B, DY = (cp.asarray(a) for a in (x, w, b, dy))
    no_det = {k: v for k, v in options.items() if k != "deterministic"}
    floor = lambda a: np.maximum(np.abs(a), _tiny(dtype))  # noqa: E731
    for _ in range(2):   # the second call takes the fast path (prepared launches)
        y = conv2d_forward(X, Wt, B, algo="polyphase", **opts, **no_det)
        dx = conv2d_backward_data(DY, Wt, x.shape, algo="polyphase", **opts, **no_det)
        dw = conv2d_backward_filter(X, DY, w.shape, algo="polyphase", **opts, **options)
        for out in (y, dx, dw):
            assert isinstance(out, cp.ndarray) and out.dtype == dtype
        assert_close(y, y64, dtype, algorithm=inner["forward"], what="forward",
                     magnitude=floor(conv2d_forward(np.abs(x64), np.abs(w64), np.abs(b64), **opts)))
        assert_close(dx, conv2d_backward_data(dy64, w64, x.shape, **opts), dtype,
                     algorithm=inner["backward_data"], what="backward_data",
                     magnitude=floor(conv2d_backward_data(np.abs(dy64), np.abs(w64), x.shape, **opts)))
        assert_close(dw, conv2d_backward_filter(x64, dy64, w.shape, **opts), dtype,
                     algorithm=inner["backward_filter"], what="backward_filter",
                     magnitude=floor(conv2d_backward_filter(np.abs(x64), np.abs(dy64), w.shape, **opts)))
    db = conv2d_backward_bias(DY, layout=opts["layout"])
    assert db.shape == (w.shape[0],)
    return inner


@pytest.mark.gpu   # the `gpu` fixture alone does not mark it: gpu_suite.sh selects -m gpu
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_gpu_matches_reference(gpu, rng, case, layout, dtype):
    x, w, b, opts, _ = _operands(rng, case, layout, dtype)
    _check_gpu(gpu, rng, x, w, b, opts)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_gpu_wide_channels_with_winograd_inside(gpu, rng, layout):
    # dilated_3x3_d2's channels at batch 1 (NCHW: Winograd runs the 4 x 14x14 sub-problem).
    x, w, b, opts, _ = _operands(rng, (1, 256, 28, 28, 256, 3, 3, (2, 2), (2, 2), 1), layout, np.float32)
    inner = _check_gpu(gpu, rng, x, w, b, opts)
    if layout == "NCHW":
        assert all(name.startswith("winograd") for name in inner.values()), inner


@pytest.mark.gpu
@pytest.mark.parametrize("options", [dict(precision="strict"), dict(deterministic=True),
                                     dict(workspace_limit=3 * 2**20)], ids=["strict", "deterministic", "limit"])
def test_gpu_under_options(gpu, rng, options):
    x, w, b, opts, _ = _operands(rng, (4, 64, 28, 28, 64, 3, 3, (2, 2), (2, 2), 1), "NCHW", np.float32)
    _check_gpu(gpu, rng, x, w, b, opts, options)


@pytest.mark.gpu
def test_gpu_deterministic_backward_filter_gives_the_same_bits(gpu, rng):
    x, w, b, opts, _ = _operands(rng, (4, 64, 28, 28, 64, 3, 3, (2, 2), (2, 2), 1), "NCHW", np.float32)
    y = conv2d_forward(x, w, **opts)
    X, DY = gpu.asarray(x), gpu.asarray(random_array(rng, y.shape, np.float32))
    first = conv2d_backward_filter(X, DY, w.shape, algo="polyphase", deterministic=True, **opts).copy()
    for _ in range(3):
        again = conv2d_backward_filter(X, DY, w.shape, algo="polyphase", deterministic=True, **opts)
        assert gpu.array_equal(first.view(np.uint32), again.view(np.uint32))
    # "auto" (polyphase, or the sub-problem's pick run directly) agrees with the named call.
    auto = conv2d_backward_filter(X, DY, w.shape, deterministic=True, **opts)
    assert float(gpu.abs(auto - first).max()) <= 1e-3 * float(gpu.abs(first).max())


# --- the index math over dilations 2-4, paddings 0-3, odd and prime sizes (review6b) -----

# Image sizes that are mostly not multiples of the dilation (odd, prime), and 0 (an
# empty image whose padding alone holds the filter: every phase empty, y = bias).
_ODD_SIZES = (0, 1, 2, 3, 5, 7, 11, 13)


@st.composite
def _dilated_problems(draw):
    """(x_shape, w_shape, padding, dilation, groups, layout) of a stride-1 problem
    (possibly invalid: the filter may not fit) with dilation 2-4 on at least one
    axis (1-4 on the other).  Each axis is, three times in four, "aligned" --
    padding 0 or d, size d times 1, 3 or 7 -- else padding 0-3 and a size odd,
    prime or d times 1, 3 or 7 (so either condition can fail alone)."""
    dilation = (draw(st.integers(1, 4)), draw(st.integers(2, 4)))
    if draw(st.booleans()):
        dilation = dilation[::-1]

    def axis(d):
        if draw(st.integers(0, 3)):
            return d * draw(st.sampled_from((0, 1))), d * draw(st.sampled_from((1, 3, 7)))
        sizes = _ODD_SIZES + tuple(d * n for n in (1, 3, 7))
        return draw(st.integers(0, 3)), draw(st.sampled_from(sizes))

    (ph, H), (pw, W) = axis(dilation[0]), axis(dilation[1])
    R, S = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    groups = draw(st.sampled_from((1, 2)))
    C, K = groups * draw(st.integers(1, 2)), groups * draw(st.integers(1, 2))
    N = draw(st.integers(1, 2))
    layout = draw(st.sampled_from(("NCHW", "NHWC")))
    return _x_shape(N, C, H, W, layout), (K, C // groups, R, S), (ph, pw), dilation, groups, layout


@HYPOTHESIS
@given(drawn=_dilated_problems(), seed=st.integers(0, 2**32 - 1))
def test_supports_exactly_the_decomposable_problems_and_computes_them(drawn, seed):
    """For any stride-1 dilated problem (dilation 2-4, padding 0-3, odd / prime /
    multiple sizes): polyphase supports it exactly when the padding and the image
    are multiples of the dilation, says which condition fails otherwise (and
    algo="polyphase" is refused with it), and where it supports it the
    decomposition equals the reference in every direction -- with the bias, and
    with the phase sub-images' sizes and paddings the NumPy emulation derives."""
    x_shape, w_shape, padding, dilation, groups, layout = drawn
    N, C, H, W = (x_shape if layout == "NCHW" else (x_shape[0], x_shape[3], x_shape[1], x_shape[2]))
    R, S = w_shape[2:]
    if any(d * (k - 1) + 1 > n + 2 * p for d, k, n, p in zip(dilation, (R, S), (H, W), padding)):
        return   # the dilated filter does not fit the padded image: not a valid problem
    p = _problem(x_shape, w_shape, padding, dilation, groups, layout, "float64")
    (dh, dw), (ph, pw) = dilation, padding
    decomposable = ph % dh == 0 and pw % dw == 0 and H % dh == 0 and W % dw == 0
    for direction in algos.DIRECTIONS:
        ok, reason = POLY.supports(p, direction)
        assert ok == decomposable, (p, reason)
        if not ok:
            assert "not a multiple of dilation" in reason, reason
            assert POLY.workspace_bytes(p, direction) == 0
    if not decomposable:
        with pytest.raises(ValueError, match="algo .polyphase. does not support"):
            conv2d_forward(np.ones(x_shape), np.ones(w_shape), padding=padding, dilation=dilation,
                           groups=groups, layout=layout, algo="polyphase")
        return
    sub = polyphase.sub_problem(p)
    assert (sub.P * dh, sub.Q * dw, sub.H * dh, sub.W * dw) == (p.P, p.Q, p.H, p.W)
    assert sub.y_shape[0] == sub.x_shape[0] == dh * dw * N
    rng = np.random.default_rng(seed)
    x, w, b = random_array(rng, x_shape), random_array(rng, w_shape), random_array(rng, (w_shape[0],))
    opts = dict(padding=padding, dilation=dilation, groups=groups, layout=layout)
    _check_emulation(rng, x, w, b, opts, p)


def test_bounding_the_options_cache_keeps_the_registered_instance(monkeypatch):
    """under() keeps one instance per options in a dict it clears at 256 entries
    (workspace limits are free-form).  Clearing must not drop the registered
    instance's own entry: before the fix, after 256 distinct limits
    under(DEFAULT_OPTIONS) built a second default instance -- no longer the one
    in REGISTRY (a fresh prepared-call cache, and `is` checks on the registered
    instance failed)."""
    monkeypatch.setattr(POLY, "_variants", {algos.DEFAULT_OPTIONS: POLY})
    for limit in range(300):
        POLY.under(algos.ConvOptions(workspace_limit=limit))
    assert len(POLY._variants) <= 256
    assert POLY.under(algos.DEFAULT_OPTIONS) is POLY
    bound = POLY.under(algos.ConvOptions(workspace_limit=7))
    assert bound.options.workspace_limit == 7 and bound._variants is POLY._variants


def test_find_weighs_the_workspace_of_polyphase_as_it_runs_under_the_options(monkeypatch):
    """find's candidates: an algorithm whose workspace is over FIND_WORKSPACE_LIMIT
    is not timed.  For polyphase that must be the workspace of the instance that
    would run (under the caller's options: a workspace limit picks a leaner inner
    algorithm), not the registered default instance's.  Before the fix, under a
    workspace limit polyphase was dropped from find for the default instance's
    inner workspace although the instance that runs fits."""
    p = _problem((32, 256, 28, 28), (256, 256, 3, 3), 2, 2)
    limited = algos.ConvOptions(workspace_limit=POLY.stacked_bytes(p) + 1024)
    lean = POLY.under(limited).workspace_bytes(p, "forward")
    assert lean < POLY.workspace_bytes(p, "forward")    # the default inner (Winograd) needs more
    monkeypatch.setattr(find_mode, "FIND_WORKSPACE_LIMIT", lean)
    assert algos.admits(POLY, p, "forward", limited)[0]
    assert "polyphase" in find_mode.candidates(p, "forward", limited)
    assert "polyphase" not in find_mode.candidates(p, "forward")   # the default instance is over it


def test_a_new_auto_choice_reaches_the_prepared_calls_of_polyphase(monkeypatch):
    """run() goes through prepared(), a per-instance cache of prepare(), and
    prepare() fixes the inner algorithm (auto's choice for the sub-problem then).
    When the choices change (a new table: table.use -> forget_choices), that
    cache must go too, as conv.py's call caches do (CHOICE_HOLDERS); before the
    fix run() -- conv.py's path for non-contiguous arrays, and find's timing --
    kept the old inner algorithm while the fast path took the new one."""
    import cupy
    from dnnprims.algos import table
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 0)
    monkeypatch.setattr(POLY, "_prepared_cache", {}, raising=False)
    monkeypatch.setattr(POLY, "prepare", lambda problem, direction, has_bias=False, activation=None:
                        POLY.inner(problem, direction)[0].name)
    p = _problem((1, 64, 28, 28), (64, 64, 3, 3), 2, 2)
    sub = polyphase.sub_problem(p)

    def measured(winner):   # a one-entry table at the sub-problem that ranks `winner` first
        entry = dict(table.features(sub, "forward"), winner=winner, ms={winner: 1.0, "implicit_gemm": 2.0},
                     problem={"N": sub.N, "C": sub.C, "H": sub.H, "W": sub.W, "K": sub.K,
                              "padding": list(sub.padding), "groups": 1, "dtype": "float32"})
        return {"version": table.VERSION, "entries": [entry]}

    previous = table.use(measured("direct"))
    try:
        assert POLY.prepared(p, "forward") == "direct"
        table.use(measured("gemm"))
        assert POLY.inner(p, "forward")[0].name == "gemm"
        assert POLY.prepared(p, "forward") == "gemm"
    finally:
        table.use(previous)


# Dilated problems: the measured table has no dilated entries, so the rule and
# polyphase's preferences decide all of them.
_DILATED = [((2, 28, 28, 256), "NHWC"), ((2, 256, 28, 28), "NCHW"), ((32, 256, 28, 28), "NCHW"),
            ((8, 28, 28, 256), "NHWC"), ((4, 64, 56, 56), "NCHW"), ((2, 28, 28, 64), "NHWC")]


@pytest.mark.parametrize("x_shape,layout", _DILATED)
def test_under_a_workspace_limit_the_sub_problems_pick_runs_as_it_is(x_shape, layout):
    """The rule's dilated case: auto's pick for the dilation-1 sub-problem under
    the caller's options, where it runs the dilated filter itself, runs the
    problem as it is (no layout copies).  Under a workspace limit that pick must
    be made under the caller's limit: a direct run allocates no stacked buffers.
    Before the fix it was made under the limit less polyphase's stacked buffers,
    and not at all where those alone were over the limit.  Example: NCHW
    2x256x28x28, dilation 2, forward under workspace_limit = gemm's im2col
    workspace: gemm (auto's pick without a limit, and the sub-problem's under
    it), was implicit_gemm_64x64."""
    C = x_shape[1] if layout == "NCHW" else x_shape[3]
    p = _problem(x_shape, (C, C, 3, 3), 2, 2, layout=layout)
    sub = polyphase.sub_problem(p)
    limits = {0, 2**20, POLY.stacked_bytes(p) - 1}
    for direction in algos.DIRECTIONS:
        limits.add(algos.REGISTRY[algos.auto_rule(p, direction)].workspace_bytes(p, direction))
    checked = 0
    for limit in sorted(limits):
        options = algos.ConvOptions(workspace_limit=limit)
        for direction in algos.DIRECTIONS:
            pick = algos.choose(sub, direction, options=options)
            if pick.name != "direct" and algos.admits(pick, p, direction, options)[0]:
                name, reason = algos.explain_auto(p, direction, options)
                assert name == pick.name, (limit, direction, reason)
                assert "runs the dilated filter itself" in reason
                checked += 1
    assert checked
    # A limit equal to what auto's own pick needs leaves that pick standing (the example of the
    # fix: NCHW 2x256x28x28 forward, gemm under gemm's im2col workspace, was implicit_gemm_64x64).
    for direction in algos.DIRECTIONS:
        name = algos.auto_rule(p, direction)
        need = algos.REGISTRY[name].workspace_bytes(p, direction)
        assert algos.auto_rule(p, direction, algos.ConvOptions(workspace_limit=need)) == name


@pytest.mark.parametrize("x_shape,layout", _DILATED)
@pytest.mark.parametrize("limit", [0, 2**20])
def test_a_tight_workspace_limit_gives_implicit_gemm_not_direct(x_shape, layout, limit):
    """Forward and backward data of ungrouped float32 problems whose GEMM depth is
    at least AUTO_IMPLICIT_GEMM_MAX_DEPTH: the rule prefers gemm where its im2col
    workspace fits AUTO_GEMM_WORKSPACE_LIMIT and then skips implicit GEMM.  Under
    a caller's workspace limit that refuses gemm, implicit GEMM (no workspace)
    must come next -- before the fix "direct" (the slow fallback) did, for every
    dilated problem of 256 channels under any limit below gemm's need."""
    C = x_shape[1] if layout == "NCHW" else x_shape[3]
    p = _problem(x_shape, (C, C, 3, 3), 2, 2, layout=layout)
    options = algos.ConvOptions(workspace_limit=limit)
    for direction in ("forward", "backward_data"):
        name, reason = algos.explain_auto(p, direction, options)
        assert name != "direct", reason
        assert algos.REGISTRY[name].under(options).workspace_bytes(p, direction) <= limit


def test_choose_names_the_inner_algorithm_when_polyphase_is_named_too():
    """conv2d_choose with algo="polyphase" says what runs inside it (the inner
    algorithm under the caller's options and why), as it does when auto picks it;
    before the fix it said only "named by the caller"."""
    for options in (dict(), dict(workspace_limit=60 * 2**20, deterministic=True)):
        for direction in algos.DIRECTIONS:
            opts = dict(options) if direction == "backward_filter" else \
                {k: v for k, v in options.items() if k != "deterministic"}
            name, reason = dnnprims.conv2d_choose((32, 256, 28, 28), (256, 256, 3, 3), padding=2, dilation=2,
                                                  direction=direction, algo="polyphase", **opts)
            p = _problem((32, 256, 28, 28), (256, 256, 3, 3), 2, 2)
            bound = POLY.under(conv._options(opts.get("workspace_limit"), "default",
                                             opts.get("deterministic", False)))
            inner, _ = bound.inner(p, direction)
            assert name == "polyphase" and reason.startswith("named by the caller")
            assert f"inner algorithm for the 128 x 14x14 dilation-1 sub-problem: {inner.name}" in reason


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_gpu_slow_path_and_unfused_activation(gpu, rng, layout):
    """What the other GPU tests do not reach (review6b; not run when written: no GPU
    that session): calls without a fast-path key -- a non-contiguous x / dy and a
    list padding -- go through ConvAlgorithm.run, i.e. polyphase's prepared() cache
    instead of conv.py's runner; and an activation, which polyphase does not fuse
    (one extra pass after the merge)."""
    x, w, b, opts, p = _operands(rng, (2, 3, 6, 14, 5, 3, 3, (2, 2), (2, 2), 1), layout, np.float32)
    inner = {d: POLY.inner(p, d)[0].name for d in algos.DIRECTIONS}
    x64, w64, b64 = x.astype(F64), w.astype(F64), b.astype(F64)
    y64 = conv2d_forward(x64, w64, b64, **opts)
    dy = random_array(rng, y64.shape, np.float32)
    dy64 = dy.astype(F64)

    def strided(a):   # the same values, not C-contiguous (no fast-path key)
        wide = gpu.asarray(np.concatenate([a, a], axis=-1))
        view = wide[..., :a.shape[-1]]
        assert not view.flags.c_contiguous
        return view

    X, DY, Wt, B = strided(x), strided(dy), gpu.asarray(w), gpu.asarray(b)
    listed = dict(opts, padding=list(opts["padding"]))   # unhashable: no fast-path key either
    for _ in range(2):
        y = conv2d_forward(X, Wt, B, algo="polyphase", activation="relu", **opts)
        assert_close(y, np.maximum(y64, 0), np.float32, algorithm=inner["forward"], what="forward relu",
                     magnitude=conv2d_forward(np.abs(x64), np.abs(w64), np.abs(b64), **opts))
        dx = conv2d_backward_data(DY, Wt, x.shape, algo="polyphase", **listed)
        assert_close(dx, conv2d_backward_data(dy64, w64, x.shape, **opts), np.float32,
                     algorithm=inner["backward_data"], what="backward_data",
                     magnitude=conv2d_backward_data(np.abs(dy64), np.abs(w64), x.shape, **opts))
        dw = conv2d_backward_filter(X, DY, w.shape, algo="polyphase", **listed)
        assert_close(dw, conv2d_backward_filter(x64, dy64, w.shape, **opts), np.float32,
                     algorithm=inner["backward_filter"], what="backward_filter",
                     magnitude=conv2d_backward_filter(np.abs(x64), np.abs(dy64), w.shape, **opts))
