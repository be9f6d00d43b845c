"""Batch normalization: the reference against the formula and loops, finite
differences; both paths against the reference; running statistics; bad inputs."""
import types

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import dnnprims
from dnnprims import _dtypes, batchnorm, batchnorm_backward
from dnnprims.testing.strategies import batchnorm_problems
from dnnprims.testing.tolerances import assert_close

from conftest import FLOAT_DTYPES, random_array

HYPOTHESIS = settings(max_examples=30, deadline=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture])


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _channel_axis(x, layout):
    return 1 if layout == "NCHW" else x.ndim - 1


def loop_batchnorm(x, gamma, beta, eps, layout):
    """Channel by channel, straight from the formula; also the biased variance."""
    axis = _channel_axis(x, layout)
    y = np.empty_like(x)
    means, variances = [], []
    for c in range(x.shape[axis]):
        v = np.take(x, c, axis=axis)
        mean = v.sum() / v.size
        var = ((v - mean) ** 2).sum() / v.size
        out = (v - mean) / np.sqrt(var + eps) * gamma[c] + beta[c]
        idx = [slice(None)] * x.ndim
        idx[axis] = c
        y[tuple(idx)] = out
        means.append(mean)
        variances.append(var)
    return y, np.array(means), np.array(variances)


SHAPES = [((4, 3), "NCHW"), ((3, 5), "NHWC"), ((2, 3, 7, 5), "NCHW"), ((3, 13, 1, 4), "NHWC"),
          ((1, 3, 3, 7), "NCHW"), ((2, 7, 3, 1), "NHWC"), ((2, 4, 6), "NCHW")]


def _params(rng, x_shape, layout, dtype=np.float64):
    c = x_shape[1 if layout == "NCHW" else -1]
    return random_array(rng, (c,), dtype, 0.5, 1.5), random_array(rng, (c,), dtype)


# ---------------------------------------------------------------------- reference vs formula

@pytest.mark.parametrize("x_shape,layout", SHAPES)
def test_training_forward_and_running_stats_match_formula(rng, x_shape, layout):
    x = random_array(rng, x_shape, low=-2, high=3)
    gamma, beta = _params(rng, x_shape, layout)
    c = gamma.size
    rm0, rv0 = random_array(rng, (c,)), random_array(rng, (c,), low=0.5, high=2)
    rm, rv = rm0.copy(), rv0.copy()
    y, mean, invstd = batchnorm(x, gamma, beta, rm, rv, momentum=0.3, eps=1e-3, layout=layout,
                                return_stats=True)
    expect, mean_loop, var_loop = loop_batchnorm(x, gamma, beta, 1e-3, layout)
    np.testing.assert_allclose(y, expect, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(mean, mean_loop, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(invstd, 1 / np.sqrt(var_loop + 1e-3), rtol=1e-12)
    n = x.size // c
    np.testing.assert_allclose(rm, 0.7 * rm0 + 0.3 * mean_loop, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(rv, 0.7 * rv0 + 0.3 * var_loop * n / (n - 1), rtol=1e-12)


def test_by_hand():
    x = np.array([[1.0, 10.0], [3.0, 20.0]])  # (N=2, C=2)
    rm, rv = np.zeros(2), np.ones(2)
    y = batchnorm(x, None, None, rm, rv, eps=0.0, momentum=0.5)
    np.testing.assert_allclose(y, [[-1, -1], [1, 1]])
    np.testing.assert_allclose(rm, [1.0, 7.5])             # 0.5 * 0 + 0.5 * mean
    np.testing.assert_allclose(rv, [0.5 + 1.0, 0.5 + 25])  # unbiased var of (1, 3) is 2, of (10, 20) is 50


@pytest.mark.parametrize("x_shape,layout", SHAPES)
def test_inference_uses_running_stats(rng, x_shape, layout):
    x = random_array(rng, x_shape)
    gamma, beta = _params(rng, x_shape, layout)
    rm, rv = random_array(rng, gamma.shape), random_array(rng, gamma.shape, low=0.5, high=2)
    rm0, rv0 = rm.copy(), rv.copy()
    y = batchnorm(x, gamma, beta, rm, rv, training=False, eps=0.01, layout=layout)
    shape = [1] * x.ndim
    shape[_channel_axis(x, layout)] = -1
    r = lambda v: v.reshape(shape)  # noqa: E731
    scaled = (x - r(rm)) / np.sqrt(r(rv) + 0.01) * r(gamma)
    # y can cancel to ~0 (scaled ~ -beta): rounding is relative to the terms, not to y.
    np.testing.assert_allclose(y, scaled + r(beta), rtol=1e-12, atol=1e-12 * np.max(np.abs(scaled) + np.abs(r(beta))))
    np.testing.assert_array_equal(rm, rm0)
    np.testing.assert_array_equal(rv, rv0)


@pytest.mark.parametrize("x_shape,layout", SHAPES[:5])
@pytest.mark.parametrize("saved", [False, True])
def test_backward_by_finite_differences(rng, x_shape, layout, saved):
    x = random_array(rng, x_shape)
    gamma, beta = _params(rng, x_shape, layout)
    dy = random_array(rng, x_shape)
    _, mean, invstd = batchnorm(x, gamma, beta, eps=1e-3, layout=layout, return_stats=True)
    stats = dict(mean=mean, invstd=invstd) if saved else {}
    dx, dgamma, dbeta = batchnorm_backward(dy, x, gamma, eps=1e-3, layout=layout, **stats)

    def loss(x_, g_, b_):
        return np.vdot(batchnorm(x_, g_, b_, eps=1e-3, layout=layout), dy)

    def numeric(a, which):
        h, out = 1e-6, np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            args_p, args_m = [x.copy(), gamma.copy(), beta.copy()], [x.copy(), gamma.copy(), beta.copy()]
            args_p[which][idx] += h
            args_m[which][idx] -= h
            out[idx] = (loss(*args_p) - loss(*args_m)) / (2 * h)
        return out

    np.testing.assert_allclose(dx, numeric(x, 0), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dgamma, numeric(gamma, 1), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dbeta, numeric(beta, 2), rtol=1e-6, atol=1e-8)


@HYPOTHESIS
@given(problem=batchnorm_problems())
def test_reference_matches_loops_hypothesis(problem):
    rng = np.random.default_rng(0)
    x = random_array(rng, problem["x_shape"])
    gamma, beta = _params(rng, problem["x_shape"], problem["layout"])
    y = batchnorm(x, gamma, beta, eps=problem["eps"], layout=problem["layout"])
    expect, _, _ = loop_batchnorm(x, gamma, beta, problem["eps"], problem["layout"])
    np.testing.assert_allclose(y, expect, rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------- both paths vs the reference

def _param_dtypes():
    """(x dtype, parameter dtype) pairs: x's own, and float32 for half x."""
    pairs = [pytest.param(d, d, id=d.name) for d in _dtypes.SUPPORTED]
    pairs += [pytest.param(d, _dtypes.FLOAT32, id=f"{d.name}-float32-params")
              for d in _dtypes.SUPPORTED if _dtypes.is_half(d)]
    return pairs


@pytest.mark.parametrize("dtype,pdtype", _param_dtypes())
@pytest.mark.parametrize("x_shape,layout", SHAPES)
@pytest.mark.parametrize("affine", [True, False])
def test_matches_reference(xp, rng, dtype, pdtype, x_shape, layout, affine):
    x = random_array(rng, x_shape, dtype, low=-1, high=3)
    gamma, beta = _params(rng, x_shape, layout, pdtype)
    if not affine:
        gamma = beta = None
    c = x_shape[_channel_axis(x, layout)]
    rm, rv = random_array(rng, (c,), pdtype), random_array(rng, (c,), pdtype, 0.5, 2)
    dy = random_array(rng, x_shape, dtype)
    on = lambda a: None if a is None else xp.array(a)  # noqa: E731  (a copy)
    f64 = lambda a: None if a is None else a.astype(np.float64)  # noqa: E731
    rm_x, rv_x = on(rm), on(rv)
    y, mean, invstd = batchnorm(on(x), on(gamma), on(beta), rm_x, rv_x, momentum=0.2, layout=layout,
                                return_stats=True)
    rm64, rv64 = f64(rm), f64(rv)
    y64, mean64, invstd64 = batchnorm(f64(x), f64(gamma), f64(beta), rm64, rv64, momentum=0.2,
                                      layout=layout, return_stats=True)
    acc = _dtypes.accumulate_dtype(dtype)
    assert y.dtype == dtype and mean.dtype == acc and invstd.dtype == acc
    assert rm_x.dtype == pdtype and rv_x.dtype == pdtype
    assert_close(y, y64, dtype, what="y")
    assert_close(mean, mean64, dtype, what="mean")
    assert_close(invstd, invstd64, dtype, what="invstd")
    assert_close(rm_x, rm64, pdtype, what="running_mean")
    assert_close(rv_x, rv64, pdtype, what="running_var")

    y_inf = batchnorm(on(x), on(gamma), on(beta), rm_x, rv_x, training=False, layout=layout)
    assert_close(y_inf, batchnorm(f64(x), f64(gamma), f64(beta), f64(_host(rm_x)), f64(_host(rv_x)),
                                  training=False, layout=layout), dtype, what="inference y")

    for stats in ({}, dict(mean=mean, invstd=invstd)):
        dx, dgamma, dbeta = batchnorm_backward(on(dy), on(x), on(gamma), layout=layout, **stats)
        dx64, dgamma64, dbeta64 = batchnorm_backward(f64(dy), f64(x), f64(gamma), layout=layout)
        assert dx.dtype == dtype and dgamma.dtype == (pdtype if affine else dtype)
        assert_close(dx, dx64, dtype, what="dx")
        assert_close(dgamma, dgamma64, dtype, what="dgamma")
        assert_close(dbeta, dbeta64, dtype, what="dbeta")


@HYPOTHESIS
@given(problem=batchnorm_problems())
def test_matches_reference_hypothesis(xp, problem):
    rng = np.random.default_rng(2)
    layout = problem["layout"]
    x = random_array(rng, problem["x_shape"], np.float32)
    gamma, beta = _params(rng, x.shape, layout, np.float32)
    if not problem["affine"]:
        gamma = beta = None
    c_axis = _channel_axis(x, layout)
    c = x.shape[c_axis]
    rm, rv = np.zeros(c, np.float32), np.ones(c, np.float32)
    rm_x, rv_x = xp.array(rm), xp.array(rv)
    on = lambda a: None if a is None else xp.array(a)  # noqa: E731  (a copy)
    f64 = lambda a: None if a is None else a.astype(np.float64)  # noqa: E731
    opts = dict(momentum=problem["momentum"], eps=problem["eps"], layout=layout)
    y = batchnorm(on(x), on(gamma), on(beta), rm_x, rv_x, **opts)
    rm64, rv64 = f64(rm), f64(rv)
    assert_close(y, batchnorm(f64(x), f64(gamma), f64(beta), rm64, rv64, **opts), np.float32)
    # A channel's mean cancels (x uniform in [-1, 1)): its rounding error is proportional to
    # mean(|x|), not to the mean -- the H100 run drew a 1x1x7x13 x whose mean is 1.4e-4 of
    # mean(|x|), where float32 is off by 4.6e-5 of the mean and 6e-9 of mean(|x|).
    axes = tuple(a for a in range(x.ndim) if a != c_axis)
    magnitude = problem["momentum"] * np.abs(x.astype(np.float64)).mean(axis=axes) \
        + (1 - problem["momentum"]) * np.abs(rm.astype(np.float64))
    assert_close(rm_x, rm64, np.float32, what="running_mean", magnitude=magnitude)
    assert_close(rv_x, rv64, np.float32, what="running_var")
    dy = random_array(rng, x.shape, np.float32)
    dx, dgamma, dbeta = batchnorm_backward(on(dy), on(x), on(gamma), eps=problem["eps"], layout=layout)
    dx64, dgamma64, dbeta64 = batchnorm_backward(f64(dy), f64(x), f64(gamma), eps=problem["eps"],
                                                 layout=layout)
    assert_close(dx, dx64, np.float32, what="dx")
    assert_close(dgamma, dgamma64, np.float32, what="dgamma")
    assert_close(dbeta, dbeta64, np.float32, what="dbeta")


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("x_shape,offset", [((3, 4, 40, 48), 0), ((3, 4, 40, 48), 1),
                                            ((5, 3, 7, 7), 0), ((9000, 3), 0)])
@pytest.mark.parametrize("cluster", [True, False])
def test_several_chunks_per_channel(xp, rng, monkeypatch, dtype, x_shape, offset, cluster):
    """More values per channel than one block's chunk (4096), 16-byte vector loads
    (inner % 8 == 0), and the same data at a misaligned address (offset); the
    training forward and the backward with and without the cluster kernels."""
    from dnnprims import normalization
    monkeypatch.setattr(normalization, "CLUSTER", cluster)
    monkeypatch.setattr(normalization, "CLUSTER_BACKWARD", cluster)
    monkeypatch.setattr(normalization, "CLUSTER_MIN_BYTES", 0)
    monkeypatch.setattr(normalization, "CLUSTER_MIN_PLANE_BYTES", 16)
    x_host = random_array(rng, x_shape, dtype, low=-1, high=3)
    dy_host = random_array(rng, x_shape, dtype)
    gamma, beta = _params(rng, x_shape, "NCHW", np.float32 if dtype == np.float16 else dtype)

    def placed(a):  # a copy of a whose data starts `offset` elements into a buffer
        buf = xp.empty(a.size + offset, a.dtype)
        buf[offset:] = xp.asarray(a).ravel()
        return buf[offset:].reshape(a.shape)

    c = x_shape[1]
    rm, rv = np.zeros(c, gamma.dtype), np.ones(c, gamma.dtype)
    rm_x, rv_x = xp.array(rm), xp.array(rv)
    f64 = lambda a: a.astype(np.float64)  # noqa: E731
    rm64, rv64 = f64(rm), f64(rv)
    y, mean, invstd = batchnorm(placed(x_host), xp.asarray(gamma), xp.asarray(beta), rm_x, rv_x,
                                return_stats=True)
    y64 = batchnorm(f64(x_host), f64(gamma), f64(beta), rm64, rv64)
    assert_close(y, y64, dtype, what="y")
    assert_close(rm_x, rm64, gamma.dtype, what="running_mean")
    assert_close(rv_x, rv64, gamma.dtype, what="running_var")
    expect = batchnorm_backward(f64(dy_host), f64(x_host), f64(gamma))
    for stats in ({}, dict(mean=mean, invstd=invstd)):
        got = batchnorm_backward(placed(dy_host), placed(x_host), xp.asarray(gamma), **stats)
        for a, b, what in zip(got, expect, ("dx", "dgamma", "dbeta")):
            assert_close(a, b, dtype, what=what)


def _grad_magnitudes(x64, dy64, axes):
    """dgamma / dbeta are sums over the reduced axes that may cancel to ~0: the
    magnitudes of their terms, which their rounding is relative to."""
    centred = np.abs(x64 - x64.mean(axis=axes, keepdims=True))
    return dict(dgamma=(np.abs(dy64) * centred).sum(axis=axes) / np.sqrt(x64.var(axis=axes) + 1e-5),
                dbeta=np.abs(dy64).sum(axis=axes))


def _fresh_plans(monkeypatch):
    """Forget the memoised GPU calls and their prepared plans (grids sized by a patched
    _RESIDENT).  The switches FUSED, FUSED_PREFETCH, FUSED_FORWARD_MIN_BYTES and
    FLAT_INFERENCE need not: they are part of the plan and fast-table keys."""
    from dnnprims import _validate, normalization
    monkeypatch.setattr(normalization, "_MEMO", _validate.CallMemo())
    monkeypatch.setattr(normalization, "_PLANS", {})


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("resident", [None, "small"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("x_shape,layout", [((3, 5, 40, 48), "NCHW"), ((2, 7, 13, 13), "NCHW"),
                                            ((9000, 3), "NCHW"), ((5, 1, 3, 7), "NCHW"),
                                            ((2, 3, 5, 11), "NHWC")])
def test_single_read_path_matches_two_pass_path(xp, rng, monkeypatch, prefetch, resident, dtype, x_shape,
                                                layout):
    """The fused (single-read) training forward and backward give bitwise the
    two-pass results (the same partials merged in the same order), also with few
    resident blocks (many rounds of channels; `small` = two channels' chunks)."""
    from dnnprims import normalization
    monkeypatch.setattr(normalization, "CLUSTER", False)  # the fused and two-pass kernels
    monkeypatch.setattr(normalization, "FUSED_PREFETCH", prefetch)
    monkeypatch.setattr(normalization, "FUSED_FORWARD_MIN_BYTES", 0)
    monkeypatch.setattr(normalization, "FUSED_BACKWARD_16BIT_SPLITS", True)  # the fused 16-bit backward too
    if xp is not np and resident == "small":
        _fresh_plans(monkeypatch)  # the prepared plans hold grids sized by _RESIDENT
        monkeypatch.setattr(normalization, "_RESIDENT", {})
        splits = -(-int(np.prod(x_shape)) // x_shape[1 if layout == "NCHW" else -1] // 4096)
        monkeypatch.setattr(normalization, "_resident_blocks", lambda cp, kernel: 2 * splits)
    pdtype = np.float32 if dtype in (np.float16, _dtypes.BFLOAT16) else dtype
    x = xp.asarray(random_array(rng, x_shape, dtype, low=-1, high=3))
    dy = xp.asarray(random_array(rng, x_shape, dtype))
    gamma, beta = (xp.asarray(a) for a in _params(rng, x_shape, layout, pdtype))
    c = gamma.shape[0]
    results = []
    for fused in (True, False):
        monkeypatch.setattr(normalization, "FUSED", fused)
        rm, rv = xp.zeros(c, pdtype), xp.ones(c, pdtype)
        y, mean, invstd = batchnorm(x, gamma, beta, rm, rv, layout=layout, return_stats=True)
        grads = batchnorm_backward(dy, x, gamma, mean=mean, invstd=invstd, layout=layout)
        results.append([_host(a) for a in (y, mean, invstd, rm, rv, *grads)])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
    f64 = lambda a: _host(a).astype(np.float64)  # noqa: E731
    y64 = batchnorm(f64(x), f64(gamma), f64(beta), layout=layout)
    assert_close(results[0][0], y64, dtype, what="y")
    expect = batchnorm_backward(f64(dy), f64(x), f64(gamma), layout=layout)
    # dgamma / dbeta are sums over N*H*W that may cancel to ~0 (105 values a channel in one
    # case): rounding is relative to the sums of the terms' magnitudes.
    axes = (0, 2, 3)[:x.ndim - 1] if layout == "NCHW" else tuple(range(x.ndim - 1))
    x64, dy64 = f64(x), f64(dy)
    magnitudes = _grad_magnitudes(x64, dy64, axes)
    for a, b, what in zip(results[0][5:], expect, ("dx", "dgamma", "dbeta")):
        assert_close(a, b, dtype, what=what, magnitude=magnitudes.get(what))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_two_pass_finishes_each_channel_in_its_last_block(gpu, rng, monkeypatch, dtype):
    """The two-pass backward's pass 1 (batchnorm_backward_reduce, and
    batchnorm_statistics<FINISH> when the statistics are recomputed) finishes each
    channel in the last of its blocks to arrive (arrival counters); the forward's
    pass 2 merges in every block: statistics, running statistics and gradients
    (saved and recomputed statistics) match the float64 reference, bitwise the same
    on every repeat (the counters are back to zero after every launch), for
    channels of 1, 2 and 5 chunks."""
    from dnnprims import normalization
    monkeypatch.setattr(normalization, "FUSED", False)
    monkeypatch.setattr(normalization, "CLUSTER", False)
    cp = gpu
    pdtype = np.float32 if dtype in (np.float16, _dtypes.BFLOAT16) else dtype
    f64 = lambda a: _host(a).astype(np.float64)  # noqa: E731
    for x_shape in ((3, 4, 7, 9), (2, 3, 64, 64), (5, 2, 64, 64)):
        x = cp.asarray(random_array(rng, x_shape, dtype, low=-1, high=3))
        dy = cp.asarray(random_array(rng, x_shape, dtype))
        gamma, beta = (cp.asarray(a) for a in _params(rng, x_shape, "NCHW", pdtype))
        c = x_shape[1]
        results = []
        for _ in range(3):
            rm, rv = cp.zeros(c, pdtype), cp.ones(c, pdtype)
            y, mean, invstd = batchnorm(x, gamma, beta, rm, rv, return_stats=True)
            saved = batchnorm_backward(dy, x, gamma, mean=mean, invstd=invstd)
            recomputed = batchnorm_backward(dy, x, gamma)
            assert not _host(normalization._stream_workspace(cp).arrive).any()
            results.append([_host(a) for a in (y, mean, invstd, rm, rv, *saved, *recomputed)])
        for later in results[1:]:
            for a, b in zip(results[0], later):
                np.testing.assert_array_equal(a, b)
        rm64, rv64 = np.zeros(c), np.ones(c)
        y64 = batchnorm(f64(x), f64(gamma), f64(beta), rm64, rv64)
        assert_close(results[0][0], y64, dtype, what="y")
        assert_close(results[0][3], rm64, pdtype, what="running_mean")
        assert_close(results[0][4], rv64, pdtype, what="running_var")
        expect = batchnorm_backward(f64(dy), f64(x), f64(gamma))
        x64, dy64 = f64(x), f64(dy)
        centred = np.abs(x64 - x64.mean(axis=(0, 2, 3), keepdims=True))
        magnitudes = dict(dgamma=(np.abs(dy64) * centred).sum(axis=(0, 2, 3)) / np.sqrt(x64.var(axis=(0, 2, 3)) + 1e-5),
                          dbeta=np.abs(dy64).sum(axis=(0, 2, 3)))
        for got in (results[0][5:8], results[0][8:11]):
            for a, b, what in zip(got, expect, ("dx", "dgamma", "dbeta")):
                assert_close(a, b, dtype, what=what, magnitude=magnitudes.get(what))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("x_shape,offset", [((3, 5, 7, 16), 0), ((3, 5, 7, 16), 1), ((2, 3, 3, 1100), 0),
                                            ((5000, 8), 0), ((1, 13, 3, 24), 0), ((7, 1, 1, 3), 0)])
def test_channel_last_paths(xp, rng, dtype, x_shape, offset):
    """The channel-last (rows) kernels: vectors along C (C % VEC == 0), more than 256
    vectors per row (two column groups), many rows, and a misaligned copy (offset)."""
    layout = "NHWC" if len(x_shape) == 4 else "NCHW"
    pdtype = np.float32 if dtype in (np.float16, _dtypes.BFLOAT16) else dtype
    x_host = random_array(rng, x_shape, dtype, low=-1, high=3)
    dy_host = random_array(rng, x_shape, dtype)
    gamma, beta = _params(rng, x_shape, layout, pdtype)

    def placed(a):
        buf = xp.empty(a.size + offset, a.dtype)
        buf[offset:] = xp.asarray(a).ravel()
        return buf[offset:].reshape(a.shape)

    c = gamma.shape[0]
    f64 = lambda a: _host(a).astype(np.float64)  # noqa: E731
    rm, rv = xp.zeros(c, pdtype), xp.ones(c, pdtype)
    rm64, rv64 = np.zeros(c), np.ones(c)
    y, mean, invstd = batchnorm(placed(x_host), xp.asarray(gamma), xp.asarray(beta), rm, rv,
                                layout=layout, return_stats=True)
    assert_close(y, batchnorm(f64(x_host), f64(gamma), f64(beta), rm64, rv64, layout=layout), dtype,
                 what="y")
    assert_close(rm, rm64, pdtype, what="running_mean")
    assert_close(rv, rv64, pdtype, what="running_var")
    y_inf = batchnorm(placed(x_host), xp.asarray(gamma), xp.asarray(beta), rm, rv, training=False,
                      layout=layout)
    assert_close(y_inf, batchnorm(f64(x_host), f64(gamma), f64(beta), rm64, rv64, training=False,
                                  layout=layout), dtype, what="y (inference)")
    expect = batchnorm_backward(f64(dy_host), f64(x_host), f64(gamma), layout=layout)
    for stats in ({}, dict(mean=mean, invstd=invstd)):
        got = batchnorm_backward(placed(dy_host), placed(x_host), xp.asarray(gamma), layout=layout,
                                 **stats)
        for a, b, what in zip(got, expect, ("dx", "dgamma", "dbeta")):
            assert_close(a, b, dtype, what=what)


def _placed(xp, a, offset):
    """A copy of host array a whose data starts `offset` elements into a buffer."""
    buf = xp.empty(a.size + offset, a.dtype)
    buf[offset:] = xp.asarray(a).ravel()
    return buf[offset:].reshape(a.shape)


def _small_channel_problem(xp, rng, dtype, x_shape, offset):
    """(parameter dtype, x on the host, x placed at `offset`, gamma, beta, running
    mean, running var) of an NCHW problem; the vectors on the host."""
    pdtype = np.float32 if dtype in (np.float16, _dtypes.BFLOAT16) else dtype
    x_host = random_array(rng, x_shape, dtype, low=-1, high=3)
    gamma, beta = _params(rng, x_shape, "NCHW", pdtype)
    c = x_shape[1]
    rm, rv = random_array(rng, (c,), pdtype), random_array(rng, (c,), pdtype, 0.5, 2)
    return pdtype, x_host, _placed(xp, x_host, offset), gamma, beta, rm, rv


@pytest.mark.parametrize("flat", [True, False])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("x_shape,offset", [((2, 5, 7, 7), 0), ((2, 5, 7, 7), 1), ((3, 4, 3), 0),
                                            ((2, 3, 13), 0), ((2, 3, 1, 3, 7), 0), ((3, 5, 7), 0),
                                            ((1, 1, 1, 3), 0), ((4, 3, 1, 2), 1), ((1, 2, 5, 5), 3)])
def test_inference_flat_path(xp, rng, monkeypatch, flat, dtype, x_shape, offset):
    """Inference with an inner size not a multiple of the vector width: the flat
    kernel (16-byte vectors that cross channel boundaries; 4-byte accesses when
    x.size % VEC != 0 or the data is misaligned) against the chunk kernel and the
    float64 reference; the returned mean/invstd are the running statistics."""
    from dnnprims import normalization
    monkeypatch.setattr(normalization, "FLAT_INFERENCE", flat)
    monkeypatch.setattr(normalization, "PACKED_INFERENCE", False)  # (test_inference_packs_path: the packs)
    pdtype, x_host, x, gamma, beta, rm, rv = _small_channel_problem(xp, rng, dtype, x_shape, offset)
    y, mean, invstd = batchnorm(x, xp.asarray(gamma), xp.asarray(beta), xp.asarray(rm), xp.asarray(rv),
                                training=False, return_stats=True)
    f64 = lambda a: _host(a).astype(np.float64)  # noqa: E731
    y64, mean64, invstd64 = batchnorm(f64(x_host), f64(gamma), f64(beta), f64(rm), f64(rv), training=False,
                                      return_stats=True)
    assert y.dtype == dtype and y.shape == x_shape
    assert_close(y, y64, dtype, what="y")
    assert_close(mean, mean64, dtype, what="mean")
    assert_close(invstd, invstd64, dtype, what="invstd")


# Planes of 1, 3, 7x7, 13 and whole packs (4x4, 8x8, 2x5), aligned or not (offset),
# C = 1, 3, 2048; channel-last and 2-D (batchnorm_infer_rows_packs: C a multiple of
# VEC or not, misaligned; C = 5000 > the shared table: batchnorm_rows_normalize).
_PACKS_CASES = [((2, 3, 7, 7), "NCHW", 0), ((2, 3, 7, 7), "NCHW", 1), ((3, 1, 13), "NCHW", 0),
                ((2, 5, 3), "NCHW", 0), ((2, 2048, 7, 7), "NCHW", 0), ((2, 3, 4, 4), "NCHW", 0),
                ((3, 3, 8, 8), "NCHW", 3), ((5, 3, 1, 1), "NCHW", 0), ((3, 7, 2, 5), "NCHW", 0),
                ((2, 3, 1, 3, 7), "NCHW", 0), ((1, 1, 9, 9), "NCHW", 2), ((2, 3, 7, 7), "NHWC", 0),
                ((2, 7, 7, 2048), "NHWC", 0), ((3, 5, 5, 8), "NHWC", 1), ((4, 3, 3, 16), "NHWC", 0),
                ((6, 1), "NCHW", 0), ((7, 3), "NCHW", 1), ((3, 1, 1, 5000), "NHWC", 0), ((2, 13, 1, 1), "NHWC", 0)]


@pytest.mark.parametrize("variant", ["default", "unroll1", "unroll4", "capped", "int64"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("x_shape,layout,offset", _PACKS_CASES)
def test_inference_packs_path(xp, rng, monkeypatch, variant, dtype, x_shape, layout, offset):
    """Inference through batchnorm_infer_packs (NCHW planes of at least VEC values;
    the others take the flat / rows kernels) against the float64 reference, and on
    the GPU bitwise against the chunk / flat kernels it replaces (the same
    expressions); the returned mean/invstd are the running statistics, which stay
    untouched.  Variants: one or four packs a thread, a grid capped at one block
    (the grid stride), 64-bit indices."""
    from dnnprims import normalization
    if variant in ("unroll1", "unroll4"):
        for name in ("PACKED_UNROLL", "PACKED_ROWS_UNROLL"):
            monkeypatch.setattr(normalization, name, int(variant[-1]))
    elif variant == "capped":
        _fresh_plans(monkeypatch)
        monkeypatch.setattr(normalization, "_PACKS_MAX_BLOCKS", 1)
    elif variant == "int64":
        _fresh_plans(monkeypatch)
        monkeypatch.setattr(normalization, "index_type", lambda *sizes: "long long")
    pdtype = np.float32 if dtype in (np.float16, _dtypes.BFLOAT16) else dtype
    x_host = random_array(rng, x_shape, dtype, low=-1, high=3)
    gamma, beta = _params(rng, x_shape, layout, pdtype)
    c = gamma.shape[0]
    rm, rv = random_array(rng, (c,), pdtype), random_array(rng, (c,), pdtype, 0.5, 2)
    x = _placed(xp, x_host, offset)
    args = [xp.asarray(v) for v in (gamma, beta, rm, rv)]
    y, mean, invstd = batchnorm(x, *args, training=False, return_stats=True, layout=layout)
    f64 = lambda a: _host(a).astype(np.float64)  # noqa: E731
    y64, mean64, invstd64 = batchnorm(f64(x_host), f64(gamma), f64(beta), f64(rm), f64(rv), training=False,
                                      return_stats=True, layout=layout)
    assert y.dtype == dtype and y.shape == x_shape
    assert_close(y, y64, dtype, what="y")
    assert_close(mean, mean64, dtype, what="mean")
    assert_close(invstd, invstd64, dtype, what="invstd")
    assert np.array_equal(_host(args[2]), rm) and np.array_equal(_host(args[3]), rv)
    if xp is not np:
        monkeypatch.setattr(normalization, "PACKED_INFERENCE", False)
        y_old, mean_old, invstd_old = batchnorm(x, *args, training=False, return_stats=True, layout=layout)
        bits = f"u{np.dtype(dtype).itemsize}"
        assert np.array_equal(_host(y).view(bits), _host(y_old).view(bits))
        assert np.array_equal(_host(mean), _host(mean_old)) and np.array_equal(_host(invstd), _host(invstd_old))


def test_inference_packs_launch_shapes(monkeypatch):
    """CPU: which inference kernel each NCHW call plans (packs for planes of at least
    VEC values, split where a pack can cross planes; flat below VEC; 1-value packs
    when misaligned), the grid (one-shot, capped, at least C threads) and the index type."""
    from dnnprims import normalization
    cases = [((32, 2048, 7, 7), np.float32, True, "batchnorm_infer_packs<float, float, int, 4, 1, true>", 3136),
             ((64, 256, 56, 56), np.float32, True, "batchnorm_infer_packs<float, float, int, 4, 1, false>", 50176),
             ((64, 256, 56, 56), np.float16, True, "batchnorm_infer_packs<half_t, float, int, 8, 1, false>", 25088),
             ((32, 64, 112, 112), np.float32, True, "batchnorm_infer_packs<float, float, int, 4, 1, false>", 25088),
             ((2, 3, 7, 7), np.float64, False, "batchnorm_infer_packs<double, double, int, 1, 1, false>", 2),
             ((1, 5000, 2, 2), np.float32, True, "batchnorm_infer_packs<float, float, int, 4, 1, false>", 20),
             ((2, 3, 3), np.float32, True, "batchnorm_infer_flat<float, float, int, 4>", None)]
    for shape, dtype, aligned, spec, grid in cases:
        x = _fake_device_array(shape, dtype)
        t = _dtypes.cuda_type(np.dtype(dtype))
        inner = int(np.prod(shape[2:]))
        if inner >= normalization._VECTOR[t]:
            got, g, scalars = normalization._packs_launch(x, aligned, shape[1], inner, "double" if t == "double"
                                                          else "float")
            assert (got, g[0]) == (spec, grid), (shape, got, g)
            assert [int(s) for s in scalars] == [x.size, x.size // int(spec.split(", ")[3]), shape[1], inner]
            assert spec in normalization.FAMILY.name_expressions
        else:
            assert spec.startswith("batchnorm_infer_flat")
    rows = [((64, 56, 56, 256), np.float32, True, "batchnorm_infer_rows_packs<float, float, int, 4, 4>", 12544),
            ((64, 56, 56, 256), np.float16, True, "batchnorm_infer_rows_packs<half_t, float, int, 8, 4>", 6272),
            ((5, 7), np.float32, True, "batchnorm_infer_rows_packs<float, float, int, 1, 1>", 1),
            ((2, 4096), np.float32, False, "batchnorm_infer_rows_packs<float, float, int, 1, 1>", 32),
            ((2, 2048), np.float64, True, "batchnorm_infer_rows_packs<double, double, int, 2, 4>", 8)]
    for shape, dtype, aligned, spec, grid in rows:
        x = _fake_device_array(shape, dtype)
        pt = "double" if dtype == np.float64 else "float"
        got, g, scalars, shared = normalization._rows_packs_launch(x, aligned, shape[-1], pt)
        assert (got, g[0], shared) == (spec, grid, 3 * shape[-1] * (8 if dtype == np.float64 else 4)), got
        assert [int(s) for s in scalars] == [x.size // int(spec.split(", ")[3]), shape[-1]]
        assert spec in normalization.FAMILY.name_expressions
    assert normalization._rows_packs_launch(_fake_device_array((2, 2049), np.float64), True, 2049, "double") is None
    for switch in ("PACKED_INFERENCE_ROWS", "PACKED_INFERENCE"):
        monkeypatch.setattr(normalization, switch, False)
        assert normalization._rows_packs_launch(_fake_device_array((2, 8), np.float32), True, 8, "float") is None
    monkeypatch.setattr(normalization, "PACKED_INFERENCE_ROWS", True)
    big = types.SimpleNamespace(dtype=np.dtype(np.float16), itemsize=2, size=64 * 1024 * 192 * 192)  # 64-bit
    assert ", long long, 8, 1, false>" in normalization._packs_launch(big, True, 1024, 192 * 192, "float")[0]
    monkeypatch.setattr(normalization, "PACKED_INFERENCE", True)
    # 1-value packs, a capped grid: the index one grid stride past the last must fit (int up to 2**31 - 1)
    for size, index_t in ((2**31 - 1 - 65536 * 256, "int"), (2**31 - 65536 * 256, "long long")):
        odd = types.SimpleNamespace(dtype=np.dtype(np.float32), itemsize=4, size=size)
        assert f"<float, float, {index_t}, 1, 1, false>" in normalization._packs_launch(odd, False, 1, 8, "float")[0]
        assert f"<float, float, {index_t}, 1, 1>" in normalization._rows_packs_launch(odd, False, 1, "float")[0]


@pytest.mark.parametrize("path", ["resident", "fused", "launches", "narrow", "launches16"])
@pytest.mark.parametrize("resident", [None, 1, 6])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("x_shape,offset", [((8, 5, 7, 32), 0), ((8, 5, 7, 32), 1), ((3, 4, 4, 13), 0),
                                            ((3, 1, 1, 8), 0), ((16, 7, 7, 520), 0), ((4, 4, 4, 2100), 0),
                                            ((3000, 24), 0)])
def test_channel_last_fused_paths(xp, rng, monkeypatch, path, resident, dtype, x_shape, offset):
    """batchnorm_rows_{train,backward}_resident (ROWS_RESIDENT) and _fused (one
    launch each, grid barriers, the last rows of each lane kept in registers and
    shared memory) against the three-launch rows paths and the float64 reference,
    running statistics included; the backward with recomputed and (twice)
    saved statistics.  `resident` fakes
    the occupancy API: 1 or 6 blocks make each lane own hundreds of rows (every
    batch, the cache and the reverse walk run; a block merges many channels);
    1 block with several column groups (2100 channels) falls back.  `narrow`: the
    16-bit resident launches at 4 channels a thread (ROWS_16BIT_NARROW);
    `launches16`: 16-bit calls on the three-launch path (ROWS_16BIT_LAUNCHES)."""
    from dnnprims import normalization
    both = ("train", "backward")
    monkeypatch.setattr(normalization, "ROWS_FUSED", path != "launches")
    monkeypatch.setattr(normalization, "ROWS_RESIDENT", path in ("resident", "narrow", "launches16"))
    monkeypatch.setattr(normalization, "ROWS_16BIT_NARROW", both if path == "narrow" else ())
    monkeypatch.setattr(normalization, "ROWS_16BIT_LAUNCHES", both if path == "launches16" else ())
    monkeypatch.setattr(normalization, "ROWS_16BIT_LAUNCHES_MIN_BYTES", 0)
    _fresh_plans(monkeypatch)  # the prepared plans hold grids sized by _RESIDENT
    monkeypatch.setattr(normalization, "_RESIDENT", {})
    if resident is not None:
        monkeypatch.setattr(normalization, "_resident_blocks", lambda cp, kernel: resident)
    layout = "NHWC" if len(x_shape) == 4 else "NCHW"
    pdtype = np.float32 if dtype in (np.float16, _dtypes.BFLOAT16) else dtype
    x_host = random_array(rng, x_shape, dtype, low=-1, high=3)
    gamma, beta = _params(rng, x_shape, layout, pdtype)
    x = _placed(xp, x_host, offset)
    c = gamma.shape[0]
    f64 = lambda a: _host(a).astype(np.float64)  # noqa: E731
    rm, rv = xp.asarray(random_array(rng, (c,), pdtype)), xp.asarray(random_array(rng, (c,), pdtype, 0.5, 2))
    rm64, rv64 = f64(rm), f64(rv)
    for _ in range(2):  # the barrier counters are back at zero for the second launch
        y, mean, invstd = batchnorm(x, xp.asarray(gamma), xp.asarray(beta), rm, rv, momentum=0.3, layout=layout,
                                    return_stats=True)
        y64, mean64, invstd64 = batchnorm(f64(x_host), f64(gamma), f64(beta), rm64, rv64, momentum=0.3,
                                          layout=layout, return_stats=True)
        assert_close(y, y64, dtype, what="y")
        assert_close(mean, mean64, dtype, what="mean")
        assert_close(invstd, invstd64, dtype, what="invstd")
        assert_close(rm, rm64, pdtype, what="running_mean")
        assert_close(rv, rv64, pdtype, what="running_var")
    y = batchnorm(x, None, None, layout=layout)
    assert_close(y, batchnorm(f64(x_host), None, None, layout=layout), dtype, what="y")
    dy_host = random_array(rng, x_shape, dtype)
    dy = _placed(xp, dy_host, offset)
    expect = batchnorm_backward(f64(dy_host), f64(x_host), f64(gamma), layout=layout)
    for stats in ({}, dict(mean=mean, invstd=invstd), dict(mean=mean, invstd=invstd)):
        got = batchnorm_backward(dy, x, xp.asarray(gamma), layout=layout, **stats)
        for a, b, what in zip(got, expect, ("dx", "dgamma", "dbeta")):
            assert_close(a, b, dtype, what=what)


def test_channel_last_l2_window_table(monkeypatch):
    """CPU: ROWS_L2_WINDOW as one fraction for every call or (direction, itemsize,
    fraction) rows, no row meaning no hints."""
    from dnnprims import normalization
    for value in (None, 0.5):
        monkeypatch.setattr(normalization, "ROWS_L2_WINDOW", value)
        assert normalization._rows_l2_window("backward", 4) == value
    monkeypatch.setattr(normalization, "ROWS_L2_WINDOW", (("train", 4, 0.25), ("backward", 2, 0.5)))
    assert normalization._rows_l2_window("train", 4) == 0.25
    assert normalization._rows_l2_window("backward", 2) == 0.5
    assert normalization._rows_l2_window("backward", 4) is None
    assert normalization._rows_l2_window("train", 8) is None


@pytest.mark.parametrize("cache_bytes,window", [(None, "default"), (None, 0.5), (None, None), (0, 0.0), (32768, 2.0)])
@pytest.mark.parametrize("resident", [1, 6, None])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("x_shape", [(8, 5, 7, 32), (3, 4, 4, 13), (3000, 40), (1, 3, 1, 16)])
def test_channel_last_resident_kernels_equal_the_fused_ones(gpu, rng, monkeypatch, cache_bytes, window, resident,
                                                            dtype, x_shape):
    """batchnorm_rows_{train,backward}_resident with any number of cached batches
    (ROWS_CACHE_BYTES: none, 32 KB = one or two batches of a block, what fits), with and
    without the L2 hints (ROWS_L2_WINDOW None / 0 / a window / more than every
    batch) give BITWISE the results of the _fused kernels (same lanes, batches,
    partials and merge), which match the float64 reference; the resident kernels
    really ran (plans hold their launches); counters reset (two calls)."""
    from dnnprims import normalization
    monkeypatch.setattr(normalization, "ROWS_16BIT_NARROW", ())  # the 16-byte mapping (its own test below)
    monkeypatch.setattr(normalization, "ROWS_16BIT_LAUNCHES", ())
    monkeypatch.setattr(normalization, "_RESIDENT", {})
    if resident is not None:
        monkeypatch.setattr(normalization, "_resident_blocks", lambda cp, kernel: resident)
    monkeypatch.setattr(normalization, "ROWS_CACHE_BYTES", cache_bytes)
    if window != "default":
        monkeypatch.setattr(normalization, "ROWS_L2_WINDOW", window)
    pdtype = np.float32 if dtype in (np.float16, _dtypes.BFLOAT16) else dtype
    x_host = random_array(rng, x_shape, dtype, low=-1, high=3)
    dy_host = random_array(rng, x_shape, dtype)
    gamma, beta = _params(rng, x_shape, "NHWC", pdtype)
    c = gamma.shape[0]
    x, dy, g, b = (gpu.asarray(a) for a in (x_host, dy_host, gamma, beta))
    rm0, rv0 = random_array(rng, (c,), pdtype), random_array(rng, (c,), pdtype, 0.5, 2)
    got = {}
    for on in (True, False):
        monkeypatch.setattr(normalization, "ROWS_RESIDENT", on)
        _fresh_plans(monkeypatch)
        rm, rv = gpu.asarray(rm0), gpu.asarray(rv0)
        for _ in range(2):
            y, mean, invstd = batchnorm(x, g, b, rm, rv, momentum=0.3, layout="NHWC", return_stats=True)
        dx, dg, db = batchnorm_backward(dy, x, g, layout="NHWC", mean=mean, invstd=invstd)
        dx2 = batchnorm_backward(dy, x, g, layout="NHWC")[0]
        got[on] = [_host(a) for a in (y, mean, invstd, rm, rv, dx, dg, db, dx2)]
        kinds = {spec.split("<")[0].rsplit("_", 1)[-1] for plan in normalization._PLANS.values()
                 for spec in _plan_specs(plan)}
        assert ("resident" in kinds) == on, kinds
    for a, b_, what in zip(got[True], got[False], ("y", "mean", "invstd", "rm", "rv", "dx", "dg", "db", "dx2")):
        np.testing.assert_array_equal(a.view(np.uint8), b_.view(np.uint8), err_msg=what)
    f64 = lambda a: _host(a).astype(np.float64)  # noqa: E731
    y64 = batchnorm(f64(x_host), f64(gamma), f64(beta), None, None, layout="NHWC")
    assert_close(got[True][0], y64, dtype, what="y")
    for a, e, what in zip(got[True][5:8], batchnorm_backward(f64(dy_host), f64(x_host), f64(gamma), layout="NHWC"),
                          ("dx", "dgamma", "dbeta")):
        assert_close(a, e, dtype, what=what)


@pytest.mark.parametrize("resident,window", [(1, "default"), (6, None), (None, "default")])
@pytest.mark.parametrize("dtype", [np.float16, _dtypes.BFLOAT16, np.float32])
@pytest.mark.parametrize("x_shape", [(8, 5, 7, 32), (3, 4, 4, 13), (3000, 40), (1, 3, 1, 16), (5, 7, 9, 24)])
def test_channel_last_resident_flags_are_bitwise(gpu, rng, monkeypatch, resident, window, dtype, x_shape):
    """The resident kernels' flags (ROWS_TRAIN_ONE_COUNT: one count and nb / n per
    thread's channels, 1 / B for whole batches; ROWS_16BIT_WORDS: 16-bit rows as
    32-bit words) give BITWISE the results of the kernels without them, whole and
    partial batches (5x7x9 rows: lanes end mid-batch), every cached batch and the
    reverse walk (1 / 6 resident blocks), with and without hints; the plans hold
    the flagged expressions exactly when they are on (WORDS: vectorised 16-bit only)."""
    from dnnprims import normalization
    monkeypatch.setattr(normalization, "ROWS_16BIT_NARROW", ())
    monkeypatch.setattr(normalization, "ROWS_16BIT_LAUNCHES", ())
    monkeypatch.setattr(normalization, "_RESIDENT", {})
    if resident is not None:
        monkeypatch.setattr(normalization, "_resident_blocks", lambda cp, kernel: resident)
    if window != "default":
        monkeypatch.setattr(normalization, "ROWS_L2_WINDOW", window)
    pdtype = np.float32
    x_host = random_array(rng, x_shape, dtype, low=-1, high=3)
    dy_host = random_array(rng, x_shape, dtype)
    gamma, beta = _params(rng, x_shape, "NHWC", pdtype)
    c = gamma.shape[0]
    x, dy, g, b = (gpu.asarray(a) for a in (x_host, dy_host, gamma, beta))
    rm0, rv0 = random_array(rng, (c,), pdtype), random_array(rng, (c,), pdtype, 0.5, 2)
    got = {}
    for on in (True, False):
        monkeypatch.setattr(normalization, "ROWS_TRAIN_ONE_COUNT", (2, 4) if on else ())
        monkeypatch.setattr(normalization, "ROWS_16BIT_WORDS", on)
        _fresh_plans(monkeypatch)
        rm, rv = gpu.asarray(rm0), gpu.asarray(rv0)
        for _ in range(2):
            y, mean, invstd = batchnorm(x, g, b, rm, rv, momentum=0.3, layout="NHWC", return_stats=True)
        dx, dg, db = batchnorm_backward(dy, x, g, layout="NHWC", mean=mean, invstd=invstd)
        got[on] = [_host(a) for a in (y, mean, invstd, rm, rv, dx, dg, db)]
        specs = [spec for plan in normalization._PLANS.values() for spec in _plan_specs(plan)]
        resident_specs = [spec for spec in specs if "_resident<" in spec]
        assert resident_specs, specs
        words = on and c % 8 == 0 and np.dtype(dtype).itemsize == 2
        for spec in resident_specs:
            flags = [a.strip() for a in spec.rstrip(">").split(",")[4:]]
            expect = (["true"] if on and "train" in spec else []) + (["true"] if words else [])
            assert flags == expect, spec
    for a, b_, what in zip(got[True], got[False], ("y", "mean", "invstd", "rm", "rv", "dx", "dg", "db")):
        np.testing.assert_array_equal(a.view(np.uint8), b_.view(np.uint8), err_msg=what)
    f64 = lambda a: _host(a).astype(np.float64)  # noqa: E731
    y64 = batchnorm(f64(x_host), f64(gamma), f64(beta), None, None, layout="NHWC")
    assert_close(got[True][0], y64, dtype, what="y")
    for a, e, what in zip(got[True][5:8], batchnorm_backward(f64(dy_host), f64(x_host), f64(gamma), layout="NHWC"),
                          ("dx", "dgamma", "dbeta")):
        assert_close(a, e, dtype, what=what)


@pytest.mark.parametrize("resident,window", [(1, "default"), (6, None), (None, "default")])
@pytest.mark.parametrize("dtype", [np.float16, _dtypes.BFLOAT16, np.float32])
@pytest.mark.parametrize("x_shape", [(8, 5, 7, 32), (3, 4, 4, 13), (3000, 40), (1, 3, 1, 16), (5, 7, 9, 24),
                                     (2, 3, 5, 520), (64, 7, 7, 256)])
def test_channel_last_16bit_narrow_and_launches(gpu, rng, monkeypatch, resident, window, dtype, x_shape):
    """ROWS_16BIT_NARROW (batchnorm_rows_{train,backward}_narrow: the resident kernels at
    4 channels a thread) and ROWS_16BIT_LAUNCHES (16-bit on the three launches), each
    on and off: training forward twice (running statistics, counters reset), backward
    with saved and recomputed statistics, against float64 at the dtype's tolerance;
    whole and partial batches (5x7x9 rows), 13 channels (VEC 1: the switches leave it
    alone), 520 channels (130 columns: one lane a block), every cached batch and the
    reverse walk (1 / 6 resident blocks), hints on / off.  The plans hold the _narrow
    kernels exactly when NARROW is on and the call is vectorised 16-bit, no one-launch
    kernel under LAUNCHES; float32 (the control) runs the same kernels either way."""
    from dnnprims import normalization
    monkeypatch.setattr(normalization, "_RESIDENT", {})
    monkeypatch.setattr(normalization, "ROWS_16BIT_LAUNCHES_MIN_BYTES", 0)
    if resident is not None:
        monkeypatch.setattr(normalization, "_resident_blocks", lambda cp, kernel: resident)
    if window != "default":
        monkeypatch.setattr(normalization, "ROWS_L2_WINDOW", window)
    pdtype = np.float32
    x_host = random_array(rng, x_shape, dtype, low=-1, high=3)
    dy_host = random_array(rng, x_shape, dtype)
    gamma, beta = _params(rng, x_shape, "NHWC", pdtype)
    c = gamma.shape[0]
    x, dy, g, b = (gpu.asarray(a) for a in (x_host, dy_host, gamma, beta))
    rm0, rv0 = random_array(rng, (c,), pdtype), random_array(rng, (c,), pdtype, 0.5, 2)
    f64 = lambda a: _host(a).astype(np.float64)  # noqa: E731
    rm64, rv64 = f64(rm0), f64(rv0)
    for _ in range(2):
        y64 = batchnorm(f64(x_host), f64(gamma), f64(beta), rm64, rv64, momentum=0.3, layout="NHWC")
    expect = batchnorm_backward(f64(dy_host), f64(x_host), f64(gamma), layout="NHWC")
    vectorised_16bit = np.dtype(dtype).itemsize == 2 and c % 8 == 0
    both = ("train", "backward")
    got = {}
    for mode in ("off", "narrow", "launches"):
        monkeypatch.setattr(normalization, "ROWS_16BIT_NARROW", both if mode == "narrow" else ())
        monkeypatch.setattr(normalization, "ROWS_16BIT_LAUNCHES", both if mode == "launches" else ())
        _fresh_plans(monkeypatch)
        rm, rv = gpu.asarray(rm0), gpu.asarray(rv0)
        for _ in range(2):
            y, mean, invstd = batchnorm(x, g, b, rm, rv, momentum=0.3, layout="NHWC", return_stats=True)
        dx, dg, db = batchnorm_backward(dy, x, g, layout="NHWC", mean=mean, invstd=invstd)
        dx2 = batchnorm_backward(dy, x, g, layout="NHWC")[0]
        got[mode] = [_host(a) for a in (y, mean, invstd, rm, rv, dx, dg, db, dx2)]
        specs = [spec for plan in normalization._PLANS.values() for spec in _plan_specs(plan)]
        narrow = [spec for spec in specs if "_narrow<" in spec]
        one_launch = [spec for spec in specs if spec.split("<")[0].rsplit("_", 1)[-1] in ("resident", "fused")]
        if mode == "narrow" and vectorised_16bit:
            # train, backward with saved and with recomputed statistics: two expressions
            assert len(set(narrow)) == 2 and not one_launch, specs
            assert any("train_narrow" in spec and spec.endswith(", true>") for spec in narrow), narrow  # ONE_COUNT
        elif mode == "launches" and np.dtype(dtype).itemsize == 2:
            assert not narrow and not one_launch, specs
        else:
            assert not narrow and one_launch, specs
        assert_close(got[mode][0], y64, dtype, what="y")
        assert_close(got[mode][3], rm64, pdtype, what="running_mean")
        assert_close(got[mode][4], rv64, pdtype, what="running_var")
        for a, e, what in zip(got[mode][5:8], expect, ("dx", "dgamma", "dbeta")):
            assert_close(a, e, dtype, what=what)
        assert_close(got[mode][8], expect[0], dtype, what="dx recomputed")
    if not vectorised_16bit:  # the switches change nothing for these calls
        for a, b_, what in zip(got["narrow"], got["off"], ("y", "mean", "invstd", "rm", "rv", "dx", "dg", "db")):
            np.testing.assert_array_equal(a.view(np.uint8), b_.view(np.uint8), err_msg=what)


def test_channel_last_16bit_switches_select_kernels(monkeypatch):
    """CPU: which prepared launches the 16-bit switches give: ROWS_16BIT_NARROW per
    direction (the _narrow expressions with ONE_COUNT as ROWS_TRAIN_ONE_COUNT says,
    index type kept, 4 channels a thread: float32's lanes), nothing for float32 or a
    VEC-1 call (13 channels); ROWS_16BIT_LAUNCHES per direction (no cooperative
    launch) for x of at least ROWS_16BIT_LAUNCHES_MIN_BYTES; every expression declared."""
    from dnnprims import normalization
    captured = []

    def capture(expression, grid, block, args, shared_mem=0, cooperative=False, fallback=None):
        captured.append((expression, grid, cooperative))

    for name in ("_RESIDENT", "_WORKSPACES", "_SMS", "_LAUNCHES", "_CONSTANTS", "_PLANS", "_DEVICE"):
        monkeypatch.setattr(normalization, name, {})
    monkeypatch.setattr(normalization, "_REFUSED", set())
    monkeypatch.setattr(normalization.FAMILY, "prepare", capture)
    monkeypatch.setattr(normalization.FAMILY, "function", lambda expression: None)
    monkeypatch.setattr(normalization, "_resident_blocks", lambda cp, kernel: 264)
    cp = _FakeCupy
    declared = set(normalization.FAMILY.name_expressions)
    monkeypatch.setattr(normalization, "ROWS_16BIT_LAUNCHES_MIN_BYTES", 4096 * 256 * 2)  # x of 4096 x 256 16-bit

    def build(dtype, c, narrow=(), launches=()):
        monkeypatch.setattr(normalization, "ROWS_16BIT_NARROW", narrow)
        monkeypatch.setattr(normalization, "ROWS_16BIT_LAUNCHES", launches)
        captured.clear()
        x = _fake_device_array((4096, c), dtype)
        pdtype = np.dtype(np.float32)
        normalization._build_rows_forward_plan(cp, x, pdtype, c, 4096, True, True, 0.1, 1e-5, False, False, True)
        normalization._build_rows_backward_plan(cp, x, pdtype, c, 4096, False, 1e-5, False, True)
        for expression, _, _ in captured:
            assert expression in declared, expression
        return [(e.split("<")[0], e, grid, coop) for e, grid, coop in captured]

    both = ("train", "backward")
    for dtype, t in ((np.float16, "half_t"), (_dtypes.BFLOAT16, "bfloat16_t")):
        got = build(dtype, 256, narrow=both)
        assert [g[1] for g in got] == [f"batchnorm_rows_train_narrow<{t}, float, int, true>",
                                       f"batchnorm_rows_backward_narrow<{t}, float, int>"]
        # 4 lanes a block (64 columns of 4 channels) own >= ROWS_FUSED_MIN_ROWS rows: 4096 / 32 blocks
        assert [g[2] for g in got] == [(128, 1), (128, 1)] and all(g[3] for g in got)
        assert [g[2] for g in build(dtype, 256)] == [(64, 1), (64, 1)]  # 8 lanes a block at 8 channels
        monkeypatch.setattr(normalization, "ROWS_TRAIN_ONE_COUNT", ())
        assert build(dtype, 256, narrow=("train",))[0][1] == f"batchnorm_rows_train_narrow<{t}, float, int, false>"
        monkeypatch.setattr(normalization, "ROWS_TRAIN_ONE_COUNT", (2,))
        assert [g[0] for g in build(dtype, 256, narrow=("backward",))] == [
            "batchnorm_rows_train_resident", "batchnorm_rows_backward_narrow"]
        assert [g[0] for g in build(dtype, 13, narrow=both)] == [
            "batchnorm_rows_train_resident", "batchnorm_rows_backward_resident"]
        got = build(dtype, 256, launches=both)
        assert [g[0] for g in got] == ["batchnorm_rows_statistics", "batchnorm_rows_merge_statistics",
                                       "batchnorm_rows_normalize", "batchnorm_rows_backward_reduce",
                                       "batchnorm_rows_backward_merge", "batchnorm_rows_backward_data"]
        assert not any(g[3] for g in got)
        assert [g[0] for g in build(dtype, 256, launches=("backward",))][0] == "batchnorm_rows_train_resident"
        assert [g[0] for g in build(dtype, 248, launches=both)] == [  # under the threshold: one launch each
            "batchnorm_rows_train_resident", "batchnorm_rows_backward_resident"]
    for narrow, launches in ((both, ()), ((), both)):
        assert [g[0] for g in build(np.float32, 256, narrow, launches)] == [
            "batchnorm_rows_train_resident", "batchnorm_rows_backward_resident"]
    # the three switches are part of both fast keys
    monkeypatch.setattr(normalization, "_current_device", lambda: 0)
    monkeypatch.setattr(normalization, "_current_stream", lambda: type("Stream", (), {"ptr": 77})())
    x = _fake_device_array((4096, 256), np.float16)
    keys = []
    for narrow, launches, min_bytes in (((), (), 1), (both, (), 1), ((), both, 1), ((), both, 2)):
        monkeypatch.setattr(normalization, "ROWS_16BIT_NARROW", narrow)
        monkeypatch.setattr(normalization, "ROWS_16BIT_LAUNCHES", launches)
        monkeypatch.setattr(normalization, "ROWS_16BIT_LAUNCHES_MIN_BYTES", min_bytes)
        keys.append((normalization._forward_key(x, None, None, None, None, True, 0.1, 1e-5, "NHWC"),
                     normalization._backward_key(x, x, None, None, None, 1e-5, "NHWC")))
    assert all(k[0] is not None and k[1] is not None for k in keys)
    assert len({k[0] for k in keys}) == 4 and len({k[1] for k in keys}) == 4


def _plan_specs(plan):
    """Kernel expressions of a prepared plan's launches (for asserting which kernels run)."""
    return [getattr(launch, "expression", "") for launch in getattr(plan, "launches", ())]


@pytest.mark.parametrize("min_rows", [1, 5, 64])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("x_shape", [(32, 7, 7, 64), (3, 5, 7, 24), (2, 3, 2, 13)])
def test_channel_last_plans_and_rows_per_lane(gpu, rng, monkeypatch, min_rows, dtype, x_shape):
    """Channel-last calls run prepared plans (the second call takes the fast
    table) with the fused rows kernels' lanes owning at least ROWS_FUSED_MIN_ROWS
    rows (fewer blocks, more batches a lane): forward with running statistics,
    inference, backward with saved and recomputed statistics, against float64."""
    from dnnprims import normalization
    monkeypatch.setattr(normalization, "ROWS_FUSED_MIN_ROWS", min_rows)
    _fresh_plans(monkeypatch)
    pdtype = np.float32 if dtype in (np.float16, _dtypes.BFLOAT16) else dtype
    x_host = random_array(rng, x_shape, dtype, low=-1, high=3)
    dy_host = random_array(rng, x_shape, dtype)
    gamma, beta = _params(rng, x_shape, "NHWC", pdtype)
    c = gamma.shape[0]
    f64 = lambda a: _host(a).astype(np.float64)  # noqa: E731
    x, dy, g, b = (gpu.asarray(a) for a in (x_host, dy_host, gamma, beta))
    rm, rv = gpu.asarray(random_array(rng, (c,), pdtype)), gpu.asarray(random_array(rng, (c,), pdtype, 0.5, 2))
    rm64, rv64 = f64(rm), f64(rv)
    expect = batchnorm_backward(f64(dy_host), f64(x_host), f64(gamma), layout="NHWC")
    for _ in range(2):
        y, mean, invstd = batchnorm(x, g, b, rm, rv, momentum=0.3, layout="NHWC", return_stats=True)
        y64 = batchnorm(f64(x_host), f64(gamma), f64(beta), rm64, rv64, momentum=0.3, layout="NHWC")
        assert_close(y, y64, dtype, what="y")
        assert_close(rm, rm64, pdtype, what="running_mean")
        assert_close(rv, rv64, pdtype, what="running_var")
        y = batchnorm(x, g, b, rm, rv, training=False, layout="NHWC")
        assert_close(y, batchnorm(f64(x_host), f64(gamma), f64(beta), rm64, rv64, training=False, layout="NHWC"),
                     dtype, what="inference y")
        for stats in ({}, dict(mean=mean, invstd=invstd)):
            got = batchnorm_backward(dy, x, g, layout="NHWC", **stats)
            for a, e, what in zip(got, expect, ("dx", "dgamma", "dbeta")):
                assert_close(a, e, dtype, what=what)
    assert len(normalization._PLANS) == 4  # training, inference, backward saved / recomputed


# ---------------------------------------------------------------------- grid-barrier kernels:
# cooperative launches (dnnprims/_kernels.py: every block resident at once, or refused)

_C_TYPES = {"half_t": np.float16, "bfloat16_t": _dtypes.BFLOAT16, "float": np.float32, "double": np.float64}
_COOPERATIVE_KERNELS = ("batchnorm_train_fused", "batchnorm_backward_fused", "batchnorm_rows_train_fused",
                        "batchnorm_rows_backward_fused", "batchnorm_rows_train_resident",
                        "batchnorm_rows_backward_resident", "batchnorm_rows_train_narrow",
                        "batchnorm_rows_backward_narrow")


def _kernel_signature(name):
    """(template parameter names, [(C type, parameter name)]) of a __global__ kernel
    of kernels/batchnorm.cu, its macros (BN_SHAPE, BN_FUSED_PARAMS) expanded."""
    import re
    from dnnprims import normalization
    source = normalization.FAMILY.source
    macros = dict(re.findall(r"^#define (BN_[A-Z_]+) (.+)$", source, re.M))
    match = re.search(r"template <([^>]*)>\s*__global__ void (?:BN_CLUSTER_DIMS\(\w+\)\s*)?__launch_bounds__\([^)]*\)\s*"
                      + name
                      + r"\((.*?)\)\s*\{", source, re.S)
    template = [t.split()[-1] for t in match.group(1).split(",")]
    text = match.group(2)
    for _ in range(3):
        for macro, body in macros.items():
            text = re.sub(r"\b" + macro + r"\b", body, text)
    params = []
    for p in text.split(","):
        words = p.replace("*", " * ").replace("__restrict__", "").replace("const", "").split()
        params.append(("".join(words[:-1]), words[-1]))
    return template, params


def _fake_device_array(shape, dtype):
    """A CuPy ndarray over host memory: the argument builders only read pointers."""
    cupy = pytest.importorskip("cupy")
    from cupy.cuda.memory import MemoryPointer, UnownedMemory
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    host = np.zeros(size + 256, np.uint8)
    start = -host.ctypes.data % 256  # 16-byte (here 256) aligned, as CuPy's pool
    memory = UnownedMemory(host.ctypes.data + start, size, host, device_id=0)
    return cupy.ndarray(shape, dtype, memptr=MemoryPointer(memory, 0))


class _FakeCupy:
    """What the launch builders of dnnprims.normalization call on the cupy module."""

    class cuda:
        class runtime:
            getDevice = staticmethod(lambda: 0)

        get_current_stream = staticmethod(lambda: type("Stream", (), {"ptr": 77})())
        Device = staticmethod(lambda *a: type("Device", (), {
            "attributes": {"MultiProcessorCount": 4, "MaxSharedMemoryPerBlockOptin": 232448, "L2CacheSize": 100},
            "compute_capability": "90"})())

    @staticmethod
    def empty(shape, dtype):
        return _fake_device_array(shape, dtype)

    zeros = empty

    @staticmethod
    def full(shape, value, dtype):
        return _fake_device_array(shape, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_grid_barrier_kernels_are_launched_cooperatively_with_arguments_of_their_signature(monkeypatch, dtype):
    """CPU: every kernel with a grid barrier is launched (or prepared) with
    cooperative=True, and its argument list matches the C signature parameter by
    parameter: a CuPy array of the pointee's dtype for a pointer (unsigned* the
    uint32 barrier counters), the exact NumPy scalar type for int / index_t /
    acc_t<T>; its kernelParams then hold each value with the C type's size."""
    from dnnprims import _kernels, normalization
    captured = []

    def capture(expression, grid, block, args, shared_mem=0, cooperative=False, fallback=None):
        captured.append((expression, tuple(args), cooperative))

    for name in ("_RESIDENT", "_WORKSPACES", "_SMS", "_LAUNCHES", "_CONSTANTS", "_PLANS", "_DEVICE"):
        monkeypatch.setattr(normalization, name, {})
    monkeypatch.setattr(normalization, "_REFUSED", set())
    monkeypatch.setattr(normalization, "CLUSTER", False)  # the fused kernels, not the cluster one
    monkeypatch.setattr(normalization.FAMILY, "prepare", capture)
    monkeypatch.setattr(normalization.FAMILY, "launch", capture)
    monkeypatch.setattr(normalization.FAMILY, "function", lambda expression: None)
    monkeypatch.setattr(normalization, "_resident_blocks", lambda cp, kernel: 64)
    monkeypatch.setattr(normalization, "FUSED_FORWARD_MIN_BYTES", 0)
    cp = _FakeCupy
    pdtype = np.dtype(np.float32 if dtype in (np.float16, _dtypes.BFLOAT16) else dtype)
    acc = np.dtype(_dtypes.accumulate_dtype(np.dtype(dtype)))
    c, outer, inner = 8, 3, 40
    x, y = (_fake_device_array((outer, c, inner), dtype) for _ in range(2))
    normalization._build_forward_plan(cp, x, y, pdtype, c, outer, inner, True, True, 0.1, 1e-5, False, False,
                                      True)
    normalization._build_backward_plan(cp, x, y, y, pdtype, c, outer, inner, False, 1e-5, False, True)
    rows_x = _fake_device_array((outer * inner, c), dtype)
    monkeypatch.setattr(normalization, "ROWS_16BIT_LAUNCHES", ())
    for resident, narrow in ((False, ()), (True, ()), (True, ("train", "backward"))):
        # batchnorm_rows_*_fused, batchnorm_rows_*_resident, then (16-bit) batchnorm_rows_*_narrow
        monkeypatch.setattr(normalization, "ROWS_RESIDENT", resident)
        monkeypatch.setattr(normalization, "ROWS_16BIT_NARROW", narrow)
        normalization._build_rows_forward_plan(cp, rows_x, pdtype, c, outer * inner, True, True, 0.1, 1e-5, False,
                                               False, True)
        normalization._build_rows_backward_plan(cp, rows_x, pdtype, c, outer * inner, False, 1e-5, False, True)
    # The call's arrays (ARRAY0...) of a prepared forward / backward plan, by dtype.
    marked = {"batchnorm_train_fused": (dtype, dtype, acc, acc, pdtype, pdtype, pdtype, pdtype),
              "batchnorm_backward_fused": (dtype, dtype, acc, acc, pdtype, dtype, pdtype, pdtype)}
    marked["batchnorm_rows_train_fused"] = marked["batchnorm_train_fused"]
    marked["batchnorm_rows_backward_fused"] = marked["batchnorm_backward_fused"]
    marked["batchnorm_rows_train_resident"] = marked["batchnorm_train_fused"]
    marked["batchnorm_rows_backward_resident"] = marked["batchnorm_backward_fused"]
    marked["batchnorm_rows_train_narrow"] = marked["batchnorm_train_fused"]
    marked["batchnorm_rows_backward_narrow"] = marked["batchnorm_backward_fused"]
    seen = set()
    for expression, args, cooperative in captured:
        name, inside = expression.rstrip(">").split("<", 1)
        if name not in _COOPERATIVE_KERNELS:
            assert not cooperative, expression
            continue
        seen.add(name)
        assert cooperative, expression
        template, params = _kernel_signature(name)
        bound = dict(zip(template, (a.strip() for a in inside.split(","))))
        ctype = {"T": _C_TYPES[bound["T"]], "P": _C_TYPES[bound["P"]], "acc_t<T>": acc.type,
                 "index_t": np.int32 if bound["index_t"] == "int" else np.int64, "int": np.int32,
                 "unsigned": np.uint32}
        args = tuple(_fake_device_array((1,), marked[name][a.index]) if isinstance(a, _kernels._ArrayArgument)
                     else a for a in args)
        assert len(args) == len(params), expression
        sizes = []
        for (c_type, param), a in zip(params, args):
            if c_type.endswith("*"):
                assert isinstance(a, _kernels._NDARRAY), (expression, param)
                assert a.dtype == np.dtype(ctype[c_type[:-1]]), (expression, param, a.dtype)
                sizes.append(8)
            else:
                assert type(a) is ctype[c_type], (expression, param, type(a))
                sizes.append(np.dtype(ctype[c_type]).itemsize)
        values, kernel_params, _ = _kernels.kernel_parameters(args, expression)
        import ctypes
        addresses = list(kernel_params)
        assert addresses == [values.buffer_info()[0] + 8 * i for i in range(len(args))]
        for address, size, a in zip(addresses, sizes, args):
            expect = (a.data.ptr.to_bytes(8, "little") if isinstance(a, _kernels._NDARRAY)
                      else np.asarray(a).tobytes())
            assert ctypes.string_at(address, size) == expect, expression
    narrow = {"batchnorm_rows_train_narrow", "batchnorm_rows_backward_narrow"}
    assert seen == set(_COOPERATIVE_KERNELS) - (set() if np.dtype(dtype).itemsize == 2 else narrow)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_multi_launch_and_grouped_kernels_get_arguments_of_their_signature(monkeypatch, dtype):
    """CPU: the launches of the two-pass plans (statistics + normalize, inference,
    reduce + data with saved and recomputed statistics) and of the grouped 7x7
    plans match their kernels' C signatures parameter by parameter (pointer ->
    array of the pointee dtype, scalars of the exact C type), none cooperative."""
    from dnnprims import _kernels, normalization
    captured = []

    def capture(expression, grid, block, args, shared_mem=0, cooperative=False, fallback=None):
        captured.append((expression, tuple(args), cooperative))

    for name in ("_RESIDENT", "_WORKSPACES", "_SMS", "_LAUNCHES", "_CONSTANTS", "_PLANS", "_DEVICE"):
        monkeypatch.setattr(normalization, name, {})
    monkeypatch.setattr(normalization.FAMILY, "prepare", capture)
    monkeypatch.setattr(normalization.FAMILY, "function", lambda expression: None)
    monkeypatch.setattr(normalization, "FUSED", False)
    monkeypatch.setattr(normalization, "CLUSTER", False)
    cp = _FakeCupy
    pdtype = np.dtype(np.float32 if dtype in (np.float16, _dtypes.BFLOAT16) else dtype)
    acc = np.dtype(_dtypes.accumulate_dtype(np.dtype(dtype)))
    forward_arrays = (dtype, dtype, acc, acc, pdtype, pdtype, pdtype, pdtype)
    backward_arrays = (dtype, dtype, acc, acc, pdtype, dtype, pdtype, pdtype)
    seen = set()
    monkeypatch.setattr(normalization, "STRIDED_TYPES", _dtypes.CUDA_TYPES)
    for strided in (True, False):  # a 7x7 plane: the strided grouped kernels, or the grouped ones
        monkeypatch.setattr(normalization, "STRIDED", strided)
        for c, outer, inner in ((8, 3, 40 * 120), (8, 16, 49)):  # two chunks a channel; a grouped 7x7 plane
            x = _fake_device_array((outer, c, inner), dtype)
            for training, packed in ((True, True), (False, True), (False, False)):
                monkeypatch.setattr(normalization, "PACKED_INFERENCE", packed)
                start = len(captured)
                normalization._build_forward_plan(cp, x, x, pdtype, c, outer, inner, training, training, 0.1,
                                                  1e-5, False, False, True)
                _check_arguments(captured[start:], forward_arrays, acc, seen)
            for recompute in (False, True):
                start = len(captured)
                normalization._build_backward_plan(cp, x, x, x, pdtype, c, outer, inner, recompute, 1e-5, False,
                                                   True)
                _check_arguments(captured[start:], backward_arrays, acc, seen)
    monkeypatch.setattr(normalization, "PACKED_INFERENCE", True)
    for c, rows in ((8, 40), (7, 3)):  # channel-last inference: the shared-table packs kernel
        x = _fake_device_array((rows, c), dtype)
        start = len(captured)
        normalization._build_rows_forward_plan(cp, x, pdtype, c, rows, False, False, 0.1, 1e-5, False, False, True)
        assert [e.split("<")[0] for e, _, _ in captured[start:]] == ["batchnorm_infer_rows_packs"]
        _check_arguments(captured[start:], forward_arrays, acc, seen)
    # The cluster training forward (a fake sm_90 device): one launch, planes of 16-byte vectors.
    monkeypatch.setattr(normalization, "CLUSTER", True)
    monkeypatch.setattr(normalization, "CLUSTER_MIN_PLANE_BYTES", 16)
    kernels = {}  # expression -> a fake kernel whose shared-memory opt-in the plan sets
    monkeypatch.setattr(normalization.FAMILY, "function",
                        lambda expression: kernels.setdefault(expression, type("Kernel", (), {})()))
    for c, outer, inner, cl in ((8, 3, 40 * 120, 2), (5, 13, 64, 8), (4, 1, 16, 1)):
        x = _fake_device_array((outer, c, inner), dtype)
        start = len(captured)
        normalization._build_forward_plan(cp, x, x, pdtype, c, outer, inner, True, True, 0.1, 1e-5, False, False,
                                          True)
        assert [e for e, _, _ in captured[start:]] == [
            f"batchnorm_train_cluster<{_kernels_type(dtype)}, {_kernels_type(pdtype)}, int, {cl}>"]
        _check_arguments(captured[start:], forward_arrays, acc, seen)
        start = len(captured)
        normalization._build_backward_plan(cp, x, x, x, pdtype, c, outer, inner, False, 1e-5, False, True)
        assert [e for e, _, _ in captured[start:]] == [
            f"batchnorm_backward_cluster<{_kernels_type(dtype)}, {_kernels_type(pdtype)}, int, {cl}>"]
        _check_arguments(captured[start:], backward_arrays, acc, seen)
    x = _fake_device_array((1, 1, 8), dtype)  # 16-byte planes, under the fake device's 100-byte L2
    start = len(captured)
    normalization._build_forward_plan(cp, x, x, pdtype, 1, 1, 8, True, True, 0.1, 1e-5, False, False, True)
    assert not [e for e, _, _ in captured[start:] if e.startswith("batchnorm_train_cluster")]
    shared = 2 * 4800 * np.dtype(dtype).itemsize  # the first case: 3 planes, 2 a block (and x, dy backward)
    for kind, tensors in (("train", 1), ("backward", 2)):
        spec = f"batchnorm_{kind}_cluster<{_kernels_type(dtype)}, {_kernels_type(pdtype)}, int, 2>"
        if tensors * shared > 48 * 1024:  # opted in above the default
            assert kernels[spec].max_dynamic_shared_size_bytes == tensors * shared
        else:
            assert spec not in kernels
    assert {"batchnorm_statistics", "batchnorm_normalize", "batchnorm_backward_reduce", "batchnorm_backward_data",
            "batchnorm_train_grouped", "batchnorm_backward_grouped", "batchnorm_infer_flat",
            "batchnorm_infer_packs", "batchnorm_infer_rows_packs", "batchnorm_train_strided", "batchnorm_backward_strided",
            "batchnorm_train_cluster", "batchnorm_backward_cluster"} <= seen, seen


def test_refused_cluster_launch_takes_the_other_kernels(monkeypatch):
    """CPU: where the driver refuses to place the cluster kernel's clusters
    (CUDA_ERROR_INVALID_CLUSTER_SIZE: a partitioned GPU), the call runs the
    plan's other kernels instead -- on that call and every later one, without
    trying the cluster launch again; any other error is raised as it is."""
    from dnnprims import normalization
    for name in ("_RESIDENT", "_WORKSPACES", "_SMS", "_LAUNCHES", "_CONSTANTS", "_PLANS", "_DEVICE"):
        monkeypatch.setattr(normalization, name, {})
    monkeypatch.setattr(normalization, "CLUSTER", True)
    monkeypatch.setattr(normalization, "FUSED", False)
    ran = []

    class Refused(Exception):
        status = 912

    def prepare(expression, grid, block, args, shared_mem=0, cooperative=False, fallback=None):
        def launch(*arrays):
            ran.append(expression.split("<")[0])
            if expression.startswith("batchnorm_train_cluster<"):
                raise error
        return launch
    monkeypatch.setattr(normalization.FAMILY, "prepare", prepare)
    monkeypatch.setattr(normalization.FAMILY, "function", lambda expression: None)
    x = _fake_device_array((3, 8, 40 * 120), np.float32)
    error = RuntimeError("a launch failure that is not a refusal")
    plan = normalization._build_forward_plan(_FakeCupy, x, x, np.float32, 8, 3, 40 * 120, True, True, 0.1, 1e-5,
                                             False, False, True)
    with pytest.raises(RuntimeError, match="not a refusal"):
        plan.run(x, x)
    error = Refused("cluster refused")
    refusals = normalization.cluster_refusals
    for _ in range(2):
        ran.clear()
        plan.run(x, x, x, x, x, x, x, x)
        assert ran[-2:] == ["batchnorm_statistics", "batchnorm_normalize"], ran
    assert ran == ["batchnorm_statistics", "batchnorm_normalize"]   # the second call: no cluster try
    assert normalization.cluster_refusals == refusals + 1


def _cluster_fakes(monkeypatch):
    """(prepared expressions, fake kernels by expression) with FAMILY.prepare and
    FAMILY.function faked and the plan caches emptied (the fake sm_90 device)."""
    from dnnprims import normalization
    for name in ("_RESIDENT", "_WORKSPACES", "_SMS", "_LAUNCHES", "_CONSTANTS", "_PLANS", "_DEVICE"):
        monkeypatch.setattr(normalization, name, {})
    monkeypatch.setattr(normalization, "CLUSTER", True)
    monkeypatch.setattr(normalization, "CLUSTER_BACKWARD", True)
    monkeypatch.setattr(normalization, "FUSED", False)
    prepared, kernels = [], {}

    def prepare(expression, grid, block, args, shared_mem=0, cooperative=False, fallback=None):
        prepared.append(expression)
        return lambda *arrays: None
    monkeypatch.setattr(normalization.FAMILY, "prepare", prepare)
    monkeypatch.setattr(normalization.FAMILY, "function",
                        lambda expression: kernels.setdefault(expression, type("Kernel", (), {})()))
    return prepared, kernels


def test_cluster_switch_is_part_of_the_backward_plan_and_fast_keys(monkeypatch):
    """CPU (review8a): CLUSTER = False turns the backward's cluster kernel off too
    (_cluster_shape reads it), so it must be part of the backward's plan key and
    fast-path key; before the fix a plan built with CLUSTER = True kept running
    batchnorm_backward_cluster after CLUSTER was set to False."""
    from dnnprims import normalization
    prepared, _ = _cluster_fakes(monkeypatch)
    monkeypatch.setattr(normalization, "_current_device", lambda: 0)
    monkeypatch.setattr(normalization, "_current_stream", lambda: type("Stream", (), {"ptr": 77})())
    x = _fake_device_array((3, 8, 40 * 120), np.float32)
    keys = []
    for cluster in (True, False):
        monkeypatch.setattr(normalization, "CLUSTER", cluster)
        prepared.clear()
        normalization._backward_plan(_FakeCupy, x, x, x, np.float32, 8, 3, 40 * 120, False, 1e-5, False)
        assert any(e.startswith("batchnorm_backward_cluster<") for e in prepared) == cluster, prepared
        keys.append(normalization._backward_key(x, x, None, None, None, 1e-5, "NCHW"))
    assert keys[0] != keys[1]


def test_cluster_opt_in_is_never_lowered_and_counts_static_shared_memory(monkeypatch):
    """CPU (review8a): the dynamic shared-memory limit is a property of the kernel
    (one per specialisation and device), shared by every plan of that kernel.  A
    plan for a shape with fewer bytes a block must not lower the limit an earlier
    plan (more planes a block) still launches with -- before the fix the second
    plan set it to its own smaller size, and the first plan's next launch asked
    for more than the limit.  And 48 KB is the default for static and dynamic
    together: a block of exactly 48 KB of planes (plus the kernel's static
    bytes) must opt in (before: only above 48 KB of planes)."""
    from dnnprims import normalization
    _, kernels = _cluster_fakes(monkeypatch)
    forward = "batchnorm_train_cluster<float, float, int, 8>"
    backward = "batchnorm_backward_cluster<float, float, int, 8>"

    def plans(outer, inner):
        x = _fake_device_array((outer, 1, inner), np.float32)
        normalization._build_forward_plan(_FakeCupy, x, x, np.float32, 1, outer, inner, True, True, 0.1, 1e-5,
                                          False, False, True)
        normalization._build_backward_plan(_FakeCupy, x, x, x, np.float32, 1, outer, inner, False, 1e-5, False,
                                           True)

    plans(24, 8192)      # 3 planes of 32 KB a block: 96 KB (192 KB backward)
    assert kernels[forward].max_dynamic_shared_size_bytes == 3 * 32768
    assert kernels[backward].max_dynamic_shared_size_bytes == 6 * 32768
    plans(8, 14336)      # 1 plane of 56 KB a block: the first shape's plans still need more
    assert kernels[forward].max_dynamic_shared_size_bytes == 3 * 32768
    assert kernels[backward].max_dynamic_shared_size_bytes == 6 * 32768
    kernels.clear()
    plans(8, 12288)      # 1 plane of exactly 48 KB a block (96 KB backward) + static: over the default
    assert kernels[forward].max_dynamic_shared_size_bytes == 49152
    assert kernels[backward].max_dynamic_shared_size_bytes == 2 * 49152


def _kernels_type(dtype):
    from dnnprims import _dtypes
    return _dtypes.cuda_type(np.dtype(dtype))


def test_stream_workspace_and_plans_are_per_thread_on_the_per_thread_default_stream(monkeypatch):
    """CuPy's per-thread default stream has the pointer 2 in every host thread but
    is a stream of its own in each: two threads' calls run concurrently, so they
    must not share the stream workspace (partials, arrival counters: a shared
    counter lets a block finish a channel before its partials are in, and can
    stay non-zero for every later call) nor a plan that holds its pointers.
    Before the fix both were keyed by the pointer alone.  Other streams: one
    workspace and plan per stream, whichever thread calls."""
    import threading
    from dnnprims import normalization

    def fake_cupy(ptr):
        class cuda(_FakeCupy.cuda):
            get_current_stream = staticmethod(lambda: type("Stream", (), {"ptr": ptr})())
        return type("FakeCupy", (_FakeCupy,), {"cuda": cuda})

    monkeypatch.setattr(normalization, "_WORKSPACES", {})
    monkeypatch.setattr(normalization, "_cached_plan", lambda key, build: key)
    x = _fake_device_array((2, 8, 49), np.float32)

    def kinds(cp):
        return (normalization._stream_workspace(cp),
                normalization._backward_plan(cp, x, x, x, np.float32, 8, 2, 49, False, 1e-5, False))

    for ptr, shared in ((2, False), (77, True)):
        cp = fake_cupy(ptr)
        mine = kinds(cp)
        assert kinds(cp)[0] is mine[0] and kinds(cp)[1] == mine[1]
        theirs = []
        thread = threading.Thread(target=lambda: theirs.append(kinds(cp)))
        thread.start()
        thread.join()
        assert (theirs[0][0] is mine[0]) == shared and (theirs[0][1] == mine[1]) == shared


def _check_arguments(captured, arrays, acc, seen):
    """Each captured (expression, args, cooperative) against its kernel's C signature;
    `arrays`: the dtypes of the call's arrays ARRAY0, ARRAY1, ... of the plan."""
    from dnnprims import _kernels
    for expression, args, cooperative in captured:
        assert not cooperative, expression
        name, inside = expression.rstrip(">").split("<", 1)
        seen.add(name)
        template, params = _kernel_signature(name)
        bound = dict(zip(template, (a.strip() for a in inside.split(","))))
        ctype = {"T": _C_TYPES[bound["T"]], "P": _C_TYPES.get(bound.get("P")), "acc_t<T>": acc.type,
                 "index_t": np.int32 if bound["index_t"] == "int" else np.int64, "int": np.int32,
                 "unsigned": np.uint32}
        args = tuple(_fake_device_array((1,), arrays[a.index]) if isinstance(a, _kernels._ArrayArgument) else a
                     for a in args)
        assert len(args) == len(params), expression
        for (c_type, param), a in zip(params, args):
            if c_type.endswith("*"):
                assert isinstance(a, _kernels._NDARRAY), (expression, param)
                assert a.dtype == np.dtype(ctype[c_type[:-1]]), (expression, param, a.dtype)
            else:
                assert type(a) is ctype[c_type], (expression, param, type(a))


def _count_cooperative_launches(monkeypatch):
    """A list that grows by one per cuLaunchCooperativeKernel call (the real one runs)."""
    from dnnprims import _kernels
    calls, real = [], _kernels._launch_cooperative_kernel

    def counted(*args):
        calls.append(args[1:4])
        return real(*args)

    monkeypatch.setattr(_kernels, "_launch_cooperative_kernel", counted)
    return calls


def _barrier_problem(xp, rng, dtype, x_shape, layout):
    pdtype = np.float32 if dtype in (np.float16, _dtypes.BFLOAT16) else dtype
    x_host = random_array(rng, x_shape, dtype, low=-1, high=3)
    dy_host = random_array(rng, x_shape, dtype)
    gamma, beta = _params(rng, x_shape, layout, pdtype)
    return pdtype, x_host, dy_host, gamma, beta


def _check_barrier_paths(xp, rng, dtype, x_shape, layout):
    """Training forward (running statistics, twice: the second call takes the fast
    path) and backward with saved statistics (twice) against the float64 reference."""
    pdtype, x_host, dy_host, gamma, beta = _barrier_problem(xp, rng, dtype, x_shape, layout)
    c = gamma.shape[0]
    f64 = lambda a: _host(a).astype(np.float64)  # noqa: E731
    x, dy = xp.asarray(x_host), xp.asarray(dy_host)
    rm, rv = xp.asarray(random_array(rng, (c,), pdtype)), xp.asarray(random_array(rng, (c,), pdtype, 0.5, 2))
    rm64, rv64 = f64(rm), f64(rv)
    expect = batchnorm_backward(f64(dy_host), f64(x_host), f64(gamma), layout=layout)
    for _ in range(2):
        y, mean, invstd = batchnorm(x, xp.asarray(gamma), xp.asarray(beta), rm, rv, momentum=0.3, layout=layout,
                                    return_stats=True)
        y64 = batchnorm(f64(x_host), f64(gamma), f64(beta), rm64, rv64, momentum=0.3, layout=layout)
        assert_close(y, y64, dtype, what="y")
        assert_close(rm, rm64, pdtype, what="running_mean")
        assert_close(rv, rv64, pdtype, what="running_var")
        got = batchnorm_backward(dy, x, xp.asarray(gamma), mean=mean, invstd=invstd, layout=layout)
        for a, b, what in zip(got, expect, ("dx", "dgamma", "dbeta")):
            assert_close(a, b, dtype, what=what)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("x_shape,offset", [((13, 5, 8, 16), 0), ((1, 3, 4, 8), 0), ((3, 7, 2, 8), 0),
                                            ((7, 2, 40, 48), 0), ((64, 3, 28, 28), 0), ((8, 4, 16), 0),
                                            ((13, 5, 8, 16), 1), ((5, 3, 7, 7), 0)])
def test_cluster_training_forward_and_backward(gpu, rng, monkeypatch, dtype, x_shape, offset):
    """batchnorm_train_cluster (sm_90+; other GPUs check they do not take it): a
    cluster of min(8, N) blocks per channel
    (N = 1, 3 -> 2 blocks, 7 -> 4, 13 / 64 -> 8, so some blocks hold one plane
    more than others, or none), the channel's planes in shared memory: y, the
    saved statistics and the running statistics match the float64 reference,
    bitwise the same on every repeat (a fixed merge order), also on the fast
    path; batchnorm_backward_cluster (saved statistics) likewise for dx, dgamma
    and dbeta.  A misaligned x or planes that are not whole 16-byte vectors (7x7)
    take the other kernels, as do blocks over CLUSTER_BLOCK_BYTES; a 3-D (N, C,
    L) input runs it too."""
    from dnnprims import normalization
    _fresh_plans(monkeypatch)
    monkeypatch.setattr(normalization, "CLUSTER_MIN_BYTES", 0)  # small tensors too (default: beyond L2)
    monkeypatch.setattr(normalization, "CLUSTER_MIN_PLANE_BYTES", 16)  # and small planes
    pdtype = np.float32 if dtype in (np.float16, _dtypes.BFLOAT16) else dtype
    itemsize = np.dtype(dtype).itemsize
    inner = int(np.prod(x_shape[2:]))
    hopper = int(gpu.cuda.Device().compute_capability) >= 90   # below: never the cluster kernel
    expect_cluster = hopper and offset == 0 and inner * itemsize % 16 == 0
    ran = []
    prepare = normalization.FAMILY.prepare
    monkeypatch.setattr(normalization.FAMILY, "prepare",
                        lambda expression, *a, **k: ran.append(expression) or prepare(expression, *a, **k))
    x_host = random_array(rng, x_shape, dtype, low=-1, high=3)
    x = _placed(gpu, x_host, offset)
    c = x_shape[1]
    gamma, beta = _params(rng, x_shape, "NCHW", pdtype)
    f64 = lambda a: _host(a).astype(np.float64)  # noqa: E731
    rm0, rv0 = random_array(rng, (c,), pdtype), random_array(rng, (c,), pdtype, 0.5, 2)
    rm64, rv64 = f64(rm0), f64(rv0)
    y64, mean64, invstd64 = batchnorm(f64(x_host), f64(gamma), f64(beta), rm64, rv64, momentum=0.3,
                                      return_stats=True)
    results = []
    for _ in range(3):  # the later calls take the fast path
        rm, rv = gpu.asarray(rm0), gpu.asarray(rv0)
        y, mean, invstd = batchnorm(x, gpu.asarray(gamma), gpu.asarray(beta), rm, rv, momentum=0.3,
                                    return_stats=True)
        results.append([_host(a) for a in (y, mean, invstd, rm, rv)])
    assert any(e.startswith("batchnorm_train_cluster<") for e in ran) == expect_cluster, ran
    for later in results[1:]:
        for a, b in zip(results[0], later):
            np.testing.assert_array_equal(a, b)
    y, mean, invstd, rm, rv = results[0]
    assert y.dtype == dtype and y.shape == x_shape
    assert_close(y, y64, dtype, what="y")
    assert_close(mean, mean64, dtype, what="mean")
    assert_close(invstd, invstd64, dtype, what="invstd")
    assert_close(rm, rm64, pdtype, what="running_mean")
    assert_close(rv, rv64, pdtype, what="running_var")
    assert_close(batchnorm(x, None, None), batchnorm(f64(x_host), None, None), dtype, what="y (no parameters)")
    # The backward with the saved statistics (batchnorm_backward_cluster: x and dy held).
    dy_host = random_array(rng, x_shape, dtype)
    dy = _placed(gpu, dy_host, offset)
    x64, dy64 = f64(x_host), f64(dy_host)
    axes = (0,) + tuple(range(2, len(x_shape)))
    expect = batchnorm_backward(dy64, x64, f64(gamma))
    magnitudes = _grad_magnitudes(x64, dy64, axes)
    ran.clear()
    grads = []
    for _ in range(3):  # the later calls take the fast path
        got = batchnorm_backward(dy, x, gpu.asarray(gamma), mean=gpu.asarray(mean), invstd=gpu.asarray(invstd))
        grads.append([_host(a) for a in got])
    assert any(e.startswith("batchnorm_backward_cluster<") for e in ran) == expect_cluster, ran
    for later in grads[1:]:
        for a, b in zip(grads[0], later):
            np.testing.assert_array_equal(a, b)
    for a, b, what in zip(grads[0], expect, ("dx", "dgamma", "dbeta")):
        assert a.shape == b.shape
        assert_close(a, b, dtype, what=what, magnitude=magnitudes.get(what))
    if expect_cluster:  # blocks over the limit: the other kernels, the same statistics within rounding
        ran.clear()
        monkeypatch.setattr(normalization, "CLUSTER_BLOCK_BYTES", 16)
        y2, mean2, _ = batchnorm(x, gpu.asarray(gamma), gpu.asarray(beta), return_stats=True)
        assert ran and not any(e.startswith("batchnorm_train_cluster<") for e in ran), ran
        assert_close(y2, y64, dtype, what="y (other kernels)")
        assert_close(mean2, mean64, dtype, what="mean (other kernels)")
        ran.clear()
        dx2 = batchnorm_backward(dy, x, gpu.asarray(gamma), mean=gpu.asarray(mean), invstd=gpu.asarray(invstd))[0]
        assert ran and not any(e.startswith("batchnorm_backward_cluster<") for e in ran), ran
        assert_close(dx2, expect[0], dtype, what="dx (other kernels)")


def test_cluster_plans_of_two_shapes_keep_their_shared_memory_opt_in(gpu, rng, monkeypatch):
    """GPU (review8a): two shapes whose cluster plans use the same kernel with
    different dynamic shared memory (fp32 112x112 planes, CL 8: 2 planes a block
    at N = 16, 1 at N = 8; backward twice that), called A, B, A: the third call
    still runs the cluster kernels and is right (before the fix B's plan lowered
    the kernel's limit under A's launch)."""
    from dnnprims import normalization
    _fresh_plans(monkeypatch)
    monkeypatch.setattr(normalization, "CLUSTER_MIN_BYTES", 0)
    refusals = normalization.cluster_refusals
    f64 = lambda a: _host(a).astype(np.float64)  # noqa: E731
    for shape in ((16, 2, 112, 112), (8, 2, 112, 112), (16, 2, 112, 112)):
        x_host = random_array(rng, shape, np.float32, low=-1, high=3)
        dy_host = random_array(rng, shape, np.float32)
        x = gpu.asarray(x_host)
        y, mean, invstd = batchnorm(x, None, None, return_stats=True)
        dx, dgamma, dbeta = batchnorm_backward(gpu.asarray(dy_host), x, None, mean=mean, invstd=invstd)
        assert_close(_host(y), batchnorm(f64(x_host), None, None), np.float32, what="y")
        dx64, dgamma64, dbeta64 = batchnorm_backward(f64(dy_host), f64(x_host), None, mean=f64(mean),
                                                     invstd=f64(invstd))
        assert_close(_host(dx), dx64, np.float32, what="dx")
        assert_close(_host(dgamma), dgamma64, np.float32, what="dgamma")
        assert_close(_host(dbeta), dbeta64, np.float32, what="dbeta")
    assert normalization.cluster_refusals == refusals


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("x_shape,layout", [((6, 5, 40, 48), "NCHW"), ((4, 3, 16, 16), "NCHW"),
                                            ((8, 5, 7, 32), "NHWC"), ((3000, 24), "NHWC")])
def test_grid_barrier_kernels_run_cooperatively(gpu, rng, monkeypatch, dtype, x_shape, layout):
    """The fused kernels (a barrier across blocks) run through the cooperative
    launch -- none refused -- and match the float64 reference, NCHW (several chunks
    a channel, and one) and NHWC, every dtype."""
    from dnnprims import _kernels, normalization
    monkeypatch.setattr(normalization, "FUSED_FORWARD_MIN_BYTES", 0)
    monkeypatch.setattr(normalization, "FUSED_BACKWARD_16BIT_SPLITS", True)
    monkeypatch.setattr(normalization, "CLUSTER", False)
    _fresh_plans(monkeypatch)
    calls = _count_cooperative_launches(monkeypatch)
    refused = _kernels.cooperative_refusals
    _check_barrier_paths(gpu, rng, dtype, x_shape, layout)
    assert len(calls) == 4  # 2 forward + 2 backward calls, one fused launch each
    assert _kernels.cooperative_refusals == refused


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("kind", ["chunks", "rows"])
def test_refused_cooperative_launch_takes_the_multi_launch_path(gpu, rng, monkeypatch, dtype, kind):
    """A grid larger than the device holds at once (the occupancy helper faked to
    say a million blocks are resident, as when the SMs are shared and the sizing
    was wrong): the driver refuses the cooperative launch, the call takes the
    multi-launch path and the result is right -- never a barrier waiting on a
    block that cannot run, never a wrong answer; later calls (the fast path) too."""
    from dnnprims import _kernels, normalization
    monkeypatch.setattr(normalization, "FUSED_FORWARD_MIN_BYTES", 0)
    monkeypatch.setattr(normalization, "CLUSTER", False)
    monkeypatch.setattr(normalization, "_RESIDENT", {})
    monkeypatch.setattr(normalization, "_REFUSED", set())
    _fresh_plans(monkeypatch)
    vec = normalization._VECTOR[_dtypes.cuda_type(np.dtype(dtype))]
    # No SM holds more than 2048 / 256 = 8 blocks of 256 threads: grids over 8 per SM.
    sms = int(gpu.cuda.Device().attributes["MultiProcessorCount"])
    if kind == "chunks":  # one chunk a channel: a block per channel
        x_shape, layout = (2, 8 * sms + 64, 1, 8), "NCHW"
    else:  # 8 column groups of 256 vectors, one row lane a block: a block per row and group
        x_shape, layout = (sms + 16, 8 * 256 * vec), "NHWC"
    monkeypatch.setattr(normalization, "_resident_blocks", lambda cp, kernel: 1 << 20)
    # One row a lane, so the grid really is a block per row and group (ROWS_FUSED_MIN_ROWS = 8
    # would give 8 rows a lane: a grid small enough for the driver to accept).
    monkeypatch.setattr(normalization, "ROWS_FUSED_MIN_ROWS", 1)
    calls = _count_cooperative_launches(monkeypatch)
    refused = _kernels.cooperative_refusals
    _check_barrier_paths(gpu, rng, dtype, x_shape, layout)
    # Forward and backward each refused once; their fast-path calls go straight to the fallback.
    assert len(calls) == 2 and _kernels.cooperative_refusals == refused + 2


def test_barrier_timeout_writes_nan_not_a_wrong_value(gpu):
    """The last guard: a block whose grid barrier times out (here the kernel is
    launched by hand, NOT cooperatively, with one block for a channel of two
    chunks: the second block never comes) writes NaN -- its outputs, the statistics
    and running statistics or parameter gradients it owns -- instead of values
    merged from a partial set of partials.  (~1 s of spinning per launch.)"""
    from dnnprims import normalization
    cp, f32, i32 = gpu, np.float32, np.int32
    n = 2 * normalization._CHUNK  # one channel, two chunks: splits = 2
    x = cp.asarray(np.linspace(-1, 2, n, dtype=f32))
    dy = cp.asarray(np.linspace(1, -1, n, dtype=f32))
    ones, part = cp.ones(1, f32), cp.zeros(4, f32)
    shape = (i32(1), i32(1), i32(n), i32(2), i32(1))  # outer, C, inner, splits, per_round
    arrive = cp.zeros(2, np.uint32)
    y, mean, invstd, rm, rv = cp.zeros(n, f32), cp.zeros(1, f32), cp.zeros(1, f32), cp.zeros(1, f32), cp.ones(1, f32)
    normalization.FAMILY.launch("batchnorm_train_fused<float, float, int, 4, true>", (1,), (256,),
                                (x, y, part[:2], part[2:], mean, invstd, rm, rv, ones, ones * 0, *shape, arrive,
                                 f32(1e-5), f32(0.1), f32(n / (n - 1)), i32(1)))
    for name, a in (("y", y[:n // 2]), ("mean", mean), ("invstd", invstd), ("running_mean", rm),
                    ("running_var", rv)):
        assert bool(cp.isnan(a).all()), name
    assert not bool(cp.isnan(y[n // 2:]).any())  # the missing block's chunk: never written
    arrive[...] = 0  # the missing block never departs here: no reset
    dx, dgamma, dbeta = cp.zeros(n, f32), cp.zeros(1, f32), cp.zeros(1, f32)
    normalization.FAMILY.launch("batchnorm_backward_fused<float, float, int, 4>", (1,), (256,),
                                (x, dy, ones * 0, ones, ones, part[:2], part[2:], dx, dgamma, dbeta, *shape, arrive))
    for name, a in (("dx", dx[:n // 2]), ("dgamma", dgamma), ("dbeta", dbeta)):
        assert bool(cp.isnan(a).all()), name


@pytest.mark.parametrize("grouped", ["strided", True, False])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("x_shape,offset", [((32, 8, 7, 7), 0), ((40, 4, 7, 7), 0), ((32, 8, 7, 7), 1),
                                            ((3, 8, 2, 3), 0), ((5, 16, 1, 5), 0), ((2, 4, 1, 2), 0),
                                            ((4, 6, 3, 3), 0), ((7, 16, 13), 0), ((1, 8, 3), 0),
                                            ((41, 4, 7, 7), 0), ((13, 8, 5, 5), 0), ((5, 8, 15, 17), 0),
                                            ((33, 16, 3, 3), 0)])
def test_grouped_training_path(xp, rng, monkeypatch, grouped, dtype, x_shape, offset):
    """Training forward and backward (saved statistics) of small channels with an
    inner size not a multiple of the vector width: batchnorm_train_grouped /
    batchnorm_backward_grouped (G channels a block, 16-byte vectors that cross
    channel boundaries; inner 2 < VEC puts several channels in one vector) against
    the fused / two-pass kernels and the float64 reference, with running
    statistics; C % G != 0 (6 channels), misaligned data and channels too large
    for a block fall back to the other kernels.  "strided": the strided grouped
    kernels (batchnorm_{train,backward}_strided) for every storage type where they
    apply (inner > VEC, at most 8 samples' vectors a thread: 41 samples of 7x7 and
    inner <= VEC fall back; 15x17 = 255 takes one sample a block row, 33 x 3x3 in
    float / double 4 / 8 a thread with idle threads in the last warp)."""
    from dnnprims import normalization
    if grouped == "strided":
        monkeypatch.setattr(normalization, "STRIDED_TYPES", _dtypes.CUDA_TYPES)
    else:
        monkeypatch.setattr(normalization, "STRIDED", False)
    monkeypatch.setattr(normalization, "GROUPED", bool(grouped))
    pdtype, x_host, x, gamma, beta, rm, rv = _small_channel_problem(xp, rng, dtype, x_shape, offset)
    f64 = lambda a: _host(a).astype(np.float64)  # noqa: E731
    rm64, rv64 = f64(rm), f64(rv)
    rm_x, rv_x = xp.asarray(rm), xp.asarray(rv)
    for _ in range(2):  # the second call takes the fast path
        y, mean, invstd = batchnorm(x, xp.asarray(gamma), xp.asarray(beta), rm_x, rv_x, momentum=0.3,
                                    return_stats=True)
        y64, mean64, invstd64 = batchnorm(f64(x_host), f64(gamma), f64(beta), rm64, rv64, momentum=0.3,
                                          return_stats=True)
        assert y.dtype == dtype and y.shape == x_shape
        assert_close(y, y64, dtype, what="y")
        assert_close(mean, mean64, dtype, what="mean")
        assert_close(invstd, invstd64, dtype, what="invstd")
        assert_close(rm_x, rm64, pdtype, what="running_mean")
        assert_close(rv_x, rv64, pdtype, what="running_var")
    y = batchnorm(x, None, None)  # no parameters, no running statistics
    assert_close(y, batchnorm(f64(x_host), None, None), dtype, what="y")
    dy_host = random_array(rng, x_shape, dtype)
    dy = _placed(xp, dy_host, offset)
    x64, dy64 = f64(x_host), f64(dy_host)
    axes = (0,) + tuple(range(2, len(x_shape)))
    expect = batchnorm_backward(dy64, x64, f64(gamma))
    magnitudes = _grad_magnitudes(x64, dy64, axes)
    for _ in range(2):  # the second call takes the fast path
        got = batchnorm_backward(dy, x, xp.asarray(gamma), mean=mean, invstd=invstd)
        for a, b, what in zip(got, expect, ("dx", "dgamma", "dbeta")):
            assert a.shape == b.shape
            assert_close(a, b, dtype, what=what, magnitude=magnitudes.get(what))
    got = batchnorm_backward(dy, x, None, mean=mean, invstd=invstd)  # gamma None: ones
    assert_close(got[0], batchnorm_backward(dy64, x64, None)[0], dtype, what="dx (no gamma)")


def test_non_contiguous_inputs(xp, rng):
    base = random_array(rng, (2, 5, 7, 3), np.float32)
    x = xp.asarray(base).transpose(0, 3, 1, 2)  # NCHW view of NHWC memory
    gamma_base = random_array(rng, (6,), np.float32)
    gamma = xp.asarray(gamma_base)[::2]
    rm_base, rv_base = np.zeros(6, np.float32), np.ones(6, np.float32)
    rm_x, rv_x = xp.array(rm_base), xp.array(rv_base)
    y = batchnorm(x, gamma, None, rm_x[::2], rv_x[::2])
    x64 = np.ascontiguousarray(base.transpose(0, 3, 1, 2)).astype(np.float64)
    rm64, rv64 = np.zeros(3), np.ones(3)
    assert_close(y, batchnorm(x64, gamma_base[::2].astype(np.float64), None, rm64, rv64), np.float32)
    assert_close(_host(rm_x)[::2], rm64, np.float32, what="running_mean (strided, in place)")
    assert_close(_host(rv_x)[::2], rv64, np.float32, what="running_var (strided, in place)")
    np.testing.assert_array_equal(_host(rm_x)[1::2], 0)
    dy = xp.asarray(random_array(rng, (2, 5, 7, 3), np.float32)).transpose(0, 3, 1, 2)
    dx, dgamma, dbeta = batchnorm_backward(dy, x, gamma)
    expect = batchnorm_backward(_host(dy).astype(np.float64), x64, gamma_base[::2].astype(np.float64))
    for got, want, what in zip((dx, dgamma, dbeta), expect, ("dx", "dgamma", "dbeta")):
        assert_close(got, want, np.float32, what=what)


def test_empty_batch(xp):
    x = xp.zeros((0, 3, 4, 4), np.float32)
    rm, rv = xp.zeros(3, np.float32), xp.ones(3, np.float32)
    y = batchnorm(x, None, None, rm, rv)
    assert y.shape == x.shape
    np.testing.assert_array_equal(_host(rm), 0)
    dx, dgamma, dbeta = batchnorm_backward(x, x, None)
    assert dx.shape == x.shape and not _host(dgamma).any() and not _host(dbeta).any()


def test_dy_none_is_zero_gradient(xp, rng):
    x = xp.asarray(random_array(rng, (2, 3, 4, 4)))
    gamma = xp.asarray(random_array(rng, (3,)))
    dx, dgamma, dbeta = batchnorm_backward(None, x, gamma)
    assert dx.shape == x.shape and dgamma.shape == (3,) and dbeta.shape == (3,)
    assert not (_host(dx).any() or _host(dgamma).any() or _host(dbeta).any())


# ---------------------------------------------------------------------- bad inputs

def _bn_args():
    x = np.ones((2, 3, 4, 4), np.float32)
    return x, np.ones(3, np.float32), np.zeros(3, np.float32)


@pytest.mark.parametrize("change,error,match", [
    (dict(x=np.ones((2, 3, 4, 4), np.int32)), TypeError, "x must have a floating dtype"),
    (dict(x=np.ones(3, np.float32)), ValueError, "x must be 2-D to 5-D"),
    (dict(gamma=np.ones(4, np.float32)), ValueError, "gamma must have shape"),
    (dict(beta=np.ones((3, 1), np.float32)), ValueError, "beta must have shape"),
    (dict(gamma=np.ones(3, np.float64)), TypeError, "gamma"),
    (dict(beta=np.ones(3, np.int64)), TypeError, "beta must have a floating dtype"),
    (dict(running_mean=np.zeros(2, np.float32), running_var=np.ones(2, np.float32)), ValueError,
     "running_mean must have shape"),
    (dict(running_mean=np.zeros(3, np.float32), running_var=np.ones(4, np.float32)), ValueError,
     "running_var must have shape"),
    (dict(running_mean=np.zeros(3, np.float32)), ValueError, "running_mean was given without running_var"),
    (dict(running_mean=np.zeros(3, np.float64), running_var=np.ones(3, np.float64)), TypeError,
     "running_mean"),
    (dict(training=False), ValueError, "running_mean and running_var are required"),
    (dict(training="yes"), TypeError, "training"),
    (dict(momentum=1.5), ValueError, "momentum"),
    (dict(momentum=None), TypeError, "momentum"),
    (dict(eps=-1.0), ValueError, "eps"),
    (dict(eps="small"), TypeError, "eps"),
    (dict(layout="NWHC"), ValueError, "layout"),
    (dict(x=np.ones((1, 3, 1, 1), np.float32)), ValueError, "more than 1 value per channel"),
    (dict(gamma=[1.0, 1.0, 1.0]), TypeError, "gamma must be a numpy.ndarray"),
])
def test_bad_batchnorm_inputs(change, error, match):
    x, gamma, beta = _bn_args()
    args = dict(x=x, gamma=gamma, beta=beta)
    args.update(change)
    with pytest.raises(error, match=match):
        batchnorm(**args)


def test_float16_x_rejects_float64_params():
    x = np.ones((2, 3), np.float16)
    with pytest.raises(TypeError, match="gamma, beta must have dtype float16 or float32"):
        batchnorm(x, np.ones(3), np.ones(3))
    with pytest.raises(TypeError, match="beta has dtype float16 but gamma has dtype float32"):
        batchnorm(x, np.ones(3, np.float32), np.ones(3, np.float16))


@pytest.mark.parametrize("change,error,match", [
    (dict(dy=np.ones((2, 3, 4, 5), np.float32)), ValueError, "dy must have shape"),
    (dict(dy=np.ones((2, 3, 4, 4), np.float64)), TypeError, "dy has dtype float64"),
    (dict(gamma=np.ones(2, np.float32)), ValueError, "gamma must have shape"),
    (dict(mean=np.zeros(3, np.float32)), ValueError, "mean was given without invstd"),
    (dict(mean=np.zeros(4, np.float32), invstd=np.ones(4, np.float32)), ValueError, "mean must have shape"),
    (dict(mean=np.zeros(3, np.float32), invstd=np.ones(3, np.float64)), TypeError, "invstd must have dtype"),
    (dict(eps=-1e-5), ValueError, "eps"),
    (dict(layout="CHWN"), ValueError, "layout"),
])
def test_bad_backward_inputs(change, error, match):
    x, gamma, _ = _bn_args()
    args = dict(dy=np.ones_like(x), x=x, gamma=gamma)
    args.update(change)
    dy, x, gamma = args.pop("dy"), args.pop("x"), args.pop("gamma")
    with pytest.raises(error, match=match):
        batchnorm_backward(dy, x, gamma, **args)


def test_mixing_numpy_and_cupy(gpu):
    x, gamma, beta = _bn_args()
    with pytest.raises(TypeError, match="cannot mix NumPy and CuPy"):
        batchnorm(gpu.asarray(x), gamma, beta)
    with pytest.raises(TypeError, match="cannot mix NumPy and CuPy"):
        batchnorm_backward(gpu.asarray(x), x, gamma)


@pytest.mark.gpu
def test_repeated_gpu_calls_reuse_the_validated_plan_and_still_check(gpu, rng):
    from dnnprims import normalization
    x = random_array(rng, (3, 5, 7, 7), np.float32)
    g, b = random_array(rng, (5,), np.float32), random_array(rng, (5,), np.float32)
    X, G, B = gpu.asarray(x), gpu.asarray(g), gpu.asarray(b)
    rm, rv = gpu.zeros(5, np.float32), gpu.ones(5, np.float32)
    first = dnnprims.batchnorm(X, G, B, rm, rv, training=True, return_stats=True)
    entries = len(normalization._MEMO._entries)
    again = dnnprims.batchnorm(X, G, B, rm, rv, training=True, return_stats=True)
    assert len(normalization._MEMO._entries) == entries
    for a, c in zip(first, again):
        assert gpu.array_equal(a, c)
    want = dnnprims.batchnorm(x.astype(np.float64), g.astype(np.float64), b.astype(np.float64),
                              training=True)
    assert_close(again[0], want, np.float32)
    with pytest.raises(TypeError, match="training"):
        dnnprims.batchnorm(X, G, B, rm, rv, training=1)
    with pytest.raises(ValueError, match="momentum"):
        dnnprims.batchnorm(X, G, B, rm, rv, momentum=2.0)
    with pytest.raises(ValueError, match="gamma"):
        dnnprims.batchnorm(X, G[:-1], B, rm, rv)
    dy = gpu.asarray(random_array(rng, x.shape, np.float32))
    for _ in range(2):
        dx, dg, db = dnnprims.batchnorm_backward(dy, X, G, mean=first[1], invstd=first[2])
    want = dnnprims.batchnorm_backward(dy.get().astype(np.float64), x.astype(np.float64), g.astype(np.float64))
    for got, ref in zip((dx, dg, db), want):
        assert_close(got, ref, np.float32)
    with pytest.raises(ValueError, match="dy"):
        dnnprims.batchnorm_backward(dy[:, :, :-1], X, G, mean=first[1], invstd=first[2])
    # The fast table (a cached call straight to its prepared launches) still checks:
    # options of another type, vectors of another shape / dtype, NumPy vectors.
    fast = len(normalization._MEMO.fast)
    assert fast >= 2
    dnnprims.batchnorm(X, G, B, rm, rv, training=True)
    assert len(normalization._MEMO.fast) == fast
    with pytest.raises(TypeError, match="momentum"):
        dnnprims.batchnorm(X, G, B, rm, rv, momentum=True)
    with pytest.raises(TypeError, match="eps"):
        dnnprims.batchnorm(X, G, B, rm, rv, eps=[1e-5])
    with pytest.raises(TypeError, match="training"):
        dnnprims.batchnorm(X, G, B, rm, rv, training=np.float64(1))
    with pytest.raises(TypeError, match="dtype"):
        dnnprims.batchnorm(X, G.astype(np.float64), B, rm, rv)
    with pytest.raises(TypeError, match="cannot mix"):
        dnnprims.batchnorm(X, g, B, rm, rv)
    with pytest.raises(ValueError, match="layout"):
        dnnprims.batchnorm(X, G, B, rm, rv, layout="NCWH")
    with pytest.raises(TypeError, match="mean must have dtype"):
        dnnprims.batchnorm_backward(dy, X, G, mean=first[1].astype(np.float64), invstd=first[2])
    with pytest.raises(TypeError, match="eps"):
        dnnprims.batchnorm_backward(dy, X, G, mean=first[1], invstd=first[2], eps=True)
    assert len(normalization._MEMO.fast) == fast


# ---------------------------------------------------------------------- review6g: the user's side (CPU)

def test_read_only_running_statistics_are_refused_before_either_is_updated():
    """Training updates both statistics in place: a read-only one is refused by
    validation, so a failed call never leaves running_mean updated and running_var not
    (the old code wrote running_mean, then NumPy refused running_var)."""
    x, gamma, beta = _bn_args()
    x = x * np.arange(3, dtype=np.float32)[:, None, None]
    rm, rv = np.zeros(3, np.float32), np.ones(3, np.float32)
    rv.flags.writeable = False
    with pytest.raises(ValueError, match="running_var is read-only"):
        batchnorm(x, gamma, beta, rm, rv)
    assert not rm.any()
    with pytest.raises(ValueError, match="running_mean is read-only"):
        batchnorm(x, gamma, beta, np.broadcast_to(np.zeros(1, np.float32), (3,)), np.ones(3, np.float32))
    # Inference only reads them.
    rm.flags.writeable = False
    batchnorm(x, gamma, beta, rm, rv, training=False)


@pytest.mark.parametrize("return_stats", ["no", 1, None])
def test_return_stats_must_be_a_bool(return_stats):
    x, gamma, beta = _bn_args()
    with pytest.raises(TypeError, match="return_stats must be a bool"):
        batchnorm(x, gamma, beta, return_stats=return_stats)
    assert len(batchnorm(x, gamma, beta, return_stats=np.bool_(True))) == 3


def test_none_x_names_the_argument():
    _, gamma, beta = _bn_args()
    with pytest.raises(TypeError, match="x must be a numpy.ndarray or cupy.ndarray, got None"):
        batchnorm(None, gamma, beta)
    with pytest.raises(TypeError, match="x must be a numpy.ndarray or cupy.ndarray, got None"):
        batchnorm_backward(np.ones((2, 3), np.float32), None, gamma)


def test_strided_grouped_plan(monkeypatch):
    """CPU: which calls take batchnorm_{train,backward}_strided, and their (G, SV,
    M, threads): ResNet-50's 32x2048x7x7 in float is 4 channels a block, 49 vectors
    a sample, 5 samples at a time (245 threads -> 256, 7 vectors a thread); inner a multiple of VEC or <= VEC, more than
    8 vectors a thread, C % G, misaligned data and the switches off take None;
    double only when listed in STRIDED_TYPES (float and the 16-bit types are)."""
    from dnnprims import normalization
    assert normalization._strided("float", 2048, 32, 49, True) == (4, 49, 5, 256)
    assert normalization._strided("double", 2048, 32, 49, True) is None  # not in STRIDED_TYPES
    assert normalization._strided("half_t", 2048, 32, 49, True) == (8, 49, 5, 256)
    assert normalization._strided("bfloat16_t", 2048, 32, 49, True) == (8, 49, 5, 256)
    assert normalization._strided("float", 8, 5, 255, True) == (4, 255, 1, 256)
    assert normalization._strided("float", 16, 33, 9, True) == (4, 9, 28, 256)
    assert normalization._strided("float", 16, 40, 49, True) == (4, 49, 5, 256)  # 8 a thread
    for args in (("float", 16, 41, 49, True), ("float", 2048, 32, 48, True), ("float", 16, 32, 3, True),
                 ("float", 6, 32, 49, True), ("float", 16, 32, 49, False), ("float", 16, 2, 257, True)):
        assert normalization._strided(*args) is None, args
    monkeypatch.setattr(normalization, "STRIDED_TYPES", _dtypes.CUDA_TYPES)
    assert normalization._strided("half_t", 2048, 32, 49, True) == (8, 49, 5, 256)
    assert normalization._strided("bfloat16_t", 16, 13, 25, True) == (8, 25, 10, 256)
    assert normalization._strided("double", 2048, 32, 49, True) == (2, 49, 5, 256)
    assert normalization._strided("half_t", 16, 13, 6, True) is None  # inner <= VEC
    monkeypatch.setattr(normalization, "STRIDED", False)
    assert normalization._strided("float", 2048, 32, 49, True) is None
    monkeypatch.setattr(normalization, "STRIDED", True)
    monkeypatch.setattr(normalization, "GROUPED", False)
    assert normalization._strided("float", 2048, 32, 49, True) is None
