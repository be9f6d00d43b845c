"""Layer, RMS, group and instance norm: the reference against loops over rows and
hand cases, backward by the adjoint identity and finite differences (float64),
both paths against the reference in every dtype, bad inputs."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from dnnprims import (_dtypes, group_norm, group_norm_backward, instance_norm, instance_norm_backward,
                      layer_norm, layer_norm_backward, rms_norm, rms_norm_backward)
from dnnprims.testing.gradcheck import numerical_gradient
from dnnprims.testing.strategies import group_norm_problems, layer_norm_problems
from dnnprims.testing.tolerances import assert_close

from conftest import random_array

HYPOTHESIS = settings(max_examples=30, deadline=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture])


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _f64(a):
    return None if a is None else _host(a).astype(np.float64)


def _param_dtypes():
    """(x dtype, parameter dtype): x's own, and float32 for half x."""
    pairs = [pytest.param(d, d, id=d.name) for d in _dtypes.SUPPORTED]
    pairs += [pytest.param(d, _dtypes.FLOAT32, id=f"{d.name}-float32-params")
              for d in _dtypes.SUPPORTED if _dtypes.is_half(d)]
    return pairs


# ---------------------------------------------------------------------- loops (independent of the reference)

def loop_layer_norm(x, k, gamma, beta, eps, rms=False):
    """Row by row over the last k axes, straight from the formula."""
    lead = x.shape[:x.ndim - k]
    y, means, rstds = np.empty_like(x), np.empty(lead), np.empty(lead)
    for idx in np.ndindex(*lead):
        v = x[idx]
        mean = 0.0 if rms else v.sum() / v.size
        var = ((v - mean) ** 2).sum() / v.size
        rstd = 1 / np.sqrt(var + eps)
        out = (v - mean) * rstd
        out = out * (1 if gamma is None else gamma) + (0 if beta is None else beta)
        y[idx], means[idx], rstds[idx] = out, mean, rstd
    return y, means, rstds


def loop_group_norm(x, groups, gamma, beta, eps, layout):
    """Group by group: collect the group's channels by index."""
    c_axis = 1 if layout == "NCHW" else x.ndim - 1
    C = x.shape[c_axis]
    y = np.empty_like(x)
    means, rstds = np.empty((x.shape[0], groups)), np.empty((x.shape[0], groups))
    for n in range(x.shape[0]):
        for g in range(groups):
            chans = range(g * C // groups, (g + 1) * C // groups)
            vals = np.concatenate([np.take(x[n], c, axis=c_axis - 1).ravel() for c in chans])
            mean = vals.mean()
            rstd = 1 / np.sqrt(((vals - mean) ** 2).mean() + eps)
            for c in chans:
                sl = [n] + [slice(None)] * (x.ndim - 1)
                sl[c_axis] = c
                gm = 1 if gamma is None else gamma[c]
                bt = 0 if beta is None else beta[c]
                y[tuple(sl)] = (x[tuple(sl)] - mean) * rstd * gm + bt
            means[n, g], rstds[n, g] = mean, rstd
    return y, means, rstds


def _nhwc(x):
    return np.ascontiguousarray(np.moveaxis(x, 1, -1))


# ---------------------------------------------------------------------- reference vs loops and by hand

@pytest.mark.parametrize("x_shape,k", [((4, 5), 1), ((3, 2, 7), 2), ((2, 3, 1, 13), 1), ((7,), 1),
                                       ((2, 3, 4), 3)])
def test_layer_and_rms_norm_match_loops(rng, x_shape, k):
    x = random_array(rng, x_shape, low=-2, high=3)
    gamma, beta = random_array(rng, x_shape[-k:], low=0.5, high=1.5), random_array(rng, x_shape[-k:])
    y, mean, rstd = layer_norm(x, x_shape[-k:], gamma, beta, eps=1e-3, return_stats=True)
    ey, emean, erstd = loop_layer_norm(x, k, gamma, beta, 1e-3)
    np.testing.assert_allclose(y, ey, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(mean, emean, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(rstd, erstd, rtol=1e-12)
    y, rstd = rms_norm(x, x_shape[-k:], gamma, eps=1e-3, return_stats=True)
    ey, _, erstd = loop_layer_norm(x, k, gamma, None, 1e-3, rms=True)
    np.testing.assert_allclose(y, ey, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(rstd, erstd, rtol=1e-12)


def test_layer_norm_by_hand():
    x = np.array([[1.0, 3.0], [10.0, 30.0]])
    np.testing.assert_allclose(layer_norm(x, 2, eps=0.0), [[-1, 1], [-1, 1]])
    np.testing.assert_allclose(rms_norm(np.array([3.0, 4.0]), 2, eps=0.0), np.array([3, 4]) / np.sqrt(12.5))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_rms_norm_default_eps_is_the_accumulation_epsilon(dtype):
    """PyTorch (2.11, probed on the H100) adds float32's epsilon for float16 x too."""
    x = np.zeros((2, 3), dtype)
    x[0, 0] = 1e-3  # mean(x^2) ~ 3.3e-7: eps = 1.19e-7 matters
    y = rms_norm(x, 3)
    want = float(x[0, 0]) / np.sqrt(float(x[0, 0]) ** 2 / 3 + np.finfo(np.float32).eps)
    np.testing.assert_allclose(float(y[0, 0]), want, rtol=1e-3)


@pytest.mark.parametrize("x_shape,groups,layout", [((2, 6, 3, 4), 3, "NCHW"), ((2, 3, 4, 6), 2, "NHWC"),
                                                   ((3, 4, 5), 4, "NCHW"), ((1, 7, 1), 1, "NHWC"),
                                                   ((2, 4), 2, "NCHW")])
def test_group_norm_matches_loops(rng, x_shape, groups, layout):
    x = random_array(rng, x_shape, low=-1, high=2)
    C = x_shape[1 if layout == "NCHW" else -1]
    gamma, beta = random_array(rng, (C,), low=0.5, high=1.5), random_array(rng, (C,))
    y, mean, rstd = group_norm(x, groups, gamma, beta, eps=1e-3, layout=layout, return_stats=True)
    ey, emean, erstd = loop_group_norm(x, groups, gamma, beta, 1e-3, layout)
    np.testing.assert_allclose(y, ey, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(mean, emean, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(rstd, erstd, rtol=1e-12)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_instance_norm_and_running_stats_match_loops(rng, layout):
    x = random_array(rng, (3, 4, 5, 2), low=-1, high=2)
    if layout == "NHWC":
        x = _nhwc(x)
    gamma, beta = random_array(rng, (4,), low=0.5, high=1.5), random_array(rng, (4,))
    rm0, rv0 = random_array(rng, (4,)), random_array(rng, (4,), low=0.5, high=2)
    rm, rv = rm0.copy(), rv0.copy()
    y = instance_norm(x, gamma, beta, rm, rv, momentum=0.3, eps=1e-3, layout=layout)
    ey, emean, erstd = loop_group_norm(x, 4, gamma, beta, 1e-3, layout)
    np.testing.assert_allclose(y, ey, rtol=1e-12, atol=1e-12)
    var = 1 / erstd ** 2 - 1e-3
    np.testing.assert_allclose(rm, 0.7 * rm0 + 0.3 * emean.mean(axis=0), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(rv, 0.7 * rv0 + 0.3 * (var * 10 / 9).mean(axis=0), rtol=1e-10)
    # Running statistics: batch-norm inference, the running values left alone.
    y2 = instance_norm(x, gamma, beta, rm, rv, use_input_stats=False, eps=1e-3, layout=layout)
    shape = [1, -1, 1, 1] if layout == "NCHW" else [1, 1, 1, -1]
    r = lambda v: v.reshape(shape)  # noqa: E731
    # atol: y2 near zero is a difference of O(1) terms, so its rounding is absolute (CI hit 4.8e-12 relative).
    np.testing.assert_allclose(y2, (x - r(rm)) / np.sqrt(r(rv) + 1e-3) * r(gamma) + r(beta), rtol=1e-12,
                               atol=1e-14)


# ---------------------------------------------------------------------- backward in float64

def _norm_cases():
    """(name, forward(x, gamma, beta), backward(dy, x, gamma, saved) -> (dx, dgamma[, dbeta]), x, C-shape)."""
    cases = []
    for saved in (False, True):
        def ln_f(x, g, b):
            return layer_norm(x, (3, 4), g, b, eps=1e-3)

        def ln_b(dy, x, g, saved=saved):
            stats = {}
            if saved:
                _, m, r = layer_norm(x, (3, 4), g, None, eps=1e-3, return_stats=True)
                stats = dict(mean=m, rstd=r)
            return layer_norm_backward(dy, x, (3, 4), g, eps=1e-3, **stats)
        cases.append((f"layer_norm saved={saved}", ln_f, ln_b, (2, 3, 4), (3, 4)))

        def rms_f(x, g, b):
            return rms_norm(x, 4, g, eps=1e-3)

        def rms_b(dy, x, g, saved=saved):
            stats = dict(rstd=rms_norm(x, 4, g, eps=1e-3, return_stats=True)[1]) if saved else {}
            return rms_norm_backward(dy, x, 4, g, eps=1e-3, **stats)
        cases.append((f"rms_norm saved={saved}", rms_f, rms_b, (3, 4), (4,)))
        for layout in ("NCHW", "NHWC"):
            shape = (2, 4, 3, 2) if layout == "NCHW" else (2, 3, 2, 4)

            def gn_f(x, g, b, layout=layout):
                return group_norm(x, 2, g, b, eps=1e-3, layout=layout)

            def gn_b(dy, x, g, saved=saved, layout=layout):
                stats = {}
                if saved:
                    _, m, r = group_norm(x, 2, g, None, eps=1e-3, layout=layout, return_stats=True)
                    stats = dict(mean=m, rstd=r)
                return group_norm_backward(dy, x, 2, g, eps=1e-3, layout=layout, **stats)
            cases.append((f"group_norm {layout} saved={saved}", gn_f, gn_b, shape, (4,)))

            def in_f(x, g, b, layout=layout):
                return instance_norm(x, g, b, eps=1e-3, layout=layout)

            def in_b(dy, x, g, saved=saved, layout=layout):
                stats = {}
                if saved:
                    _, m, r = instance_norm(x, g, None, eps=1e-3, layout=layout, return_stats=True)
                    stats = dict(mean=m, rstd=r)
                return instance_norm_backward(dy, x, g, eps=1e-3, layout=layout, **stats)
            cases.append((f"instance_norm {layout} saved={saved}", in_f, in_b, shape, (4,)))
    return cases


NORM_CASES = _norm_cases()


@pytest.mark.parametrize("case", NORM_CASES, ids=[c[0] for c in NORM_CASES])
def test_backward_by_finite_differences(rng, case):
    _, forward, backward, x_shape, p_shape = case
    x = random_array(rng, x_shape)
    gamma, beta = random_array(rng, p_shape, low=0.5, high=1.5), random_array(rng, p_shape)
    dy = random_array(rng, x_shape)
    grads = backward(dy, x, gamma)
    loss = lambda: np.vdot(forward(x, gamma, beta), dy)  # noqa: E731
    np.testing.assert_allclose(grads[0], numerical_gradient(loss, x), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grads[1], numerical_gradient(loss, gamma), rtol=1e-6, atol=1e-8)
    if len(grads) == 3:
        np.testing.assert_allclose(grads[2], numerical_gradient(loss, beta), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("case", NORM_CASES[::2], ids=[c[0] for c in NORM_CASES[::2]])
def test_backward_adjoint_identity(rng, case):
    """<dy, J v> = <J^T dy, v> with J v by a central difference along a random v."""
    _, forward, backward, x_shape, p_shape = case
    x = random_array(rng, x_shape)
    gamma, beta = random_array(rng, p_shape, low=0.5, high=1.5), random_array(rng, p_shape)
    dy, v = random_array(rng, x_shape), random_array(rng, x_shape)
    h = 1e-6
    jv = (forward(x + h * v, gamma, beta) - forward(x - h * v, gamma, beta)) / (2 * h)
    # Both sides are sums whose terms can cancel: the bound is relative to the sum of |terms|
    # (a wrong backward is off by O(1) of it; an unseeded draw once cancelled to 1e-6 of it).
    np.testing.assert_allclose(np.vdot(dy, jv), np.vdot(backward(dy, x, gamma)[0], v), rtol=1e-6,
                               atol=1e-6 * float(np.abs(dy * jv).sum()))


def test_instance_norm_backward_with_running_stats(rng):
    x = random_array(rng, (2, 3, 4, 2))
    gamma, beta = random_array(rng, (3,), low=0.5, high=1.5), random_array(rng, (3,))
    rm, rv = random_array(rng, (3,)), random_array(rng, (3,), low=0.5, high=2)
    dy = random_array(rng, x.shape)
    dx, dgamma, dbeta = instance_norm_backward(dy, x, gamma, running_mean=rm, running_var=rv,
                                               use_input_stats=False, eps=1e-3)
    loss = lambda: np.vdot(instance_norm(x, gamma, beta, rm, rv, use_input_stats=False, eps=1e-3), dy)  # noqa
    np.testing.assert_allclose(dx, numerical_gradient(loss, x), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dgamma, numerical_gradient(loss, gamma), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dbeta, numerical_gradient(loss, beta), rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------------- both paths vs the reference

@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_instance_norm_with_running_stats_matches_float64(xp, rng, dtype, layout):
    shape = (2, 3, 4, 5) if layout == "NCHW" else (2, 4, 5, 3)
    x, dy = random_array(rng, shape, dtype), random_array(rng, shape, dtype)
    gamma, beta = random_array(rng, (3,), np.float32, 0.5, 1.5), random_array(rng, (3,), np.float32)
    rm, rv = random_array(rng, (3,), np.float32), random_array(rng, (3,), np.float32, 0.5, 2)
    on = xp.asarray
    opts = dict(use_input_stats=False, eps=1e-3, layout=layout)
    y = instance_norm(on(x), on(gamma), on(beta), on(rm), on(rv), **opts)
    assert_close(y, instance_norm(_f64(x), _f64(gamma), _f64(beta), _f64(rm), _f64(rv), **opts), dtype)
    got = instance_norm_backward(on(dy), on(x), on(gamma), running_mean=on(rm), running_var=on(rv), **opts)
    want = instance_norm_backward(_f64(dy), _f64(x), _f64(gamma), running_mean=_f64(rm), running_var=_f64(rv),
                                  **opts)
    _compare(got, want, dtype, ("dx", "dgamma", "dbeta"))


def _placed(xp, a, offset):
    """A copy of a whose data starts `offset` elements into a buffer (misaligned for offset 1)."""
    buf = xp.empty(a.size + offset, a.dtype)
    buf[offset:] = xp.asarray(a).ravel()
    return buf[offset:].reshape(a.shape)


def _compare(got, want, dtype, names, magnitudes=None):
    """Results in x's dtype; parameter gradients in their own (gamma's, or x's without gamma).
    ``magnitudes``: name -> the size of the terms a result is rounded from, where it cancels to ~0."""
    for g, w, what in zip(got, want, names):
        assert_close(g, w, g.dtype if what in ("dgamma", "dbeta") else dtype, what=what,
                     magnitude=(magnitudes or {}).get(what))


def _layer_norm_magnitudes(dy, x, eps=1e-5):
    """Layer norm over one value a row: x - mean = 0, so dgamma = sum dy * xhat is 0 up to the
    rounding of x * rstd and mean * rstd with rstd = 1/sqrt(eps) ~ 316 (a kernel may form xhat as
    x * rstd - mean * rstd).  Its error scales with sum |dy| (|x| + |mean|) rstd, not with the exact
    0; rows of 2 or more values have |xhat| ~ 1 and need no magnitude."""
    if x.shape[-1] != 1:
        return None
    dy64, x64 = (np.asarray(a, np.float64).reshape(-1, 1) for a in (dy, x))
    return {"dgamma": (np.abs(dy64) * 2 * np.abs(x64)).sum(axis=0) / np.sqrt(eps)}


# Rows for the warp kernels (<= 256 vectors: 7, 64, 48, 1, 1024 values) and the block kernels (1032, 2056).
LAYER_SHAPES = [((5, 7), (7,)), ((3, 64), (64,)), ((2, 3, 16), (3, 16)), ((4, 1), (1,)), ((6, 1032), (1032,)),
                ((9, 1024), (1024,)), ((3, 2056), (2056,))]


@pytest.mark.parametrize("dtype,pdtype", _param_dtypes())
@pytest.mark.parametrize("x_shape,norm_shape", LAYER_SHAPES)
@pytest.mark.parametrize("affine", [True, False])
def test_layer_and_rms_norm_match_reference(xp, rng, dtype, pdtype, x_shape, norm_shape, affine):
    x = random_array(rng, x_shape, dtype, low=-1, high=3)
    dy = random_array(rng, x_shape, dtype)
    gamma = random_array(rng, norm_shape, pdtype, 0.5, 1.5) if affine else None
    beta = random_array(rng, norm_shape, pdtype) if affine else None
    on = lambda a: None if a is None else xp.asarray(a)  # noqa: E731
    acc = _dtypes.accumulate_dtype(dtype)
    y, mean, rstd = layer_norm(on(x), norm_shape, on(gamma), on(beta), return_stats=True)
    y64, mean64, rstd64 = layer_norm(_f64(x), norm_shape, _f64(gamma), _f64(beta), return_stats=True)
    assert y.dtype == dtype and mean.dtype == acc and rstd.dtype == acc
    _compare((y, mean, rstd), (y64, mean64, rstd64), dtype, ("y", "mean", "rstd"))
    # With 1 or 2 values per row dx is ~0 up to eps terms (cancellation): no relative error to compare.
    big = int(np.prod(norm_shape)) >= 3
    want = layer_norm_backward(_f64(dy), _f64(x), norm_shape, _f64(gamma))
    for stats in ({}, dict(mean=mean, rstd=rstd)):
        got = layer_norm_backward(on(dy), on(x), norm_shape, on(gamma), **stats)
        assert got[0].dtype == dtype and got[1].dtype == (pdtype if affine else dtype)
        _compare(got[int(not big):], want[int(not big):], dtype, ("dx", "dgamma", "dbeta")[int(not big):],
                 _layer_norm_magnitudes(dy, x))

    eps = float(np.finfo(_dtypes.accumulate_dtype(dtype)).eps)  # eps=None: PyTorch's default
    y, rstd = rms_norm(on(x), norm_shape, on(gamma), return_stats=True)
    y64, rstd64 = rms_norm(_f64(x), norm_shape, _f64(gamma), eps=eps, return_stats=True)
    _compare((y, rstd), (y64, rstd64), dtype, ("y", "rstd"))
    want = rms_norm_backward(_f64(dy), _f64(x), norm_shape, _f64(gamma), eps=eps)
    for stats in ({}, dict(rstd=rstd)):
        got = rms_norm_backward(on(dy), on(x), norm_shape, on(gamma), **stats)
        _compare(got[int(not big):], want[int(not big):], dtype, ("dx", "dgamma")[int(not big):])


@pytest.mark.parametrize("dtype,pdtype", _param_dtypes())
@pytest.mark.parametrize("x_shape,offset", [((3, 1), 0), ((5, 3), 0), ((4, 7), 0), ((6, 13), 1), ((3000, 8), 0),
                                            ((700, 96), 1), ((5, 1024), 0), ((3, 5000), 0), ((2, 40000), 0),
                                            ((37, 64), 0)])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_and_rms_norm_fused_backward(xp, rng, monkeypatch, dtype, pdtype, x_shape, offset, affine):
    """dx and dgamma/dbeta from one read of x and dy (norm_rows_backward_fused:
    rows of 1 to 5000 values, more rows than the resident blocks so a block
    walks many rows, misaligned data) against the separate kernels (fused off)
    and the float64 reference; a row too long for the registers (40000) falls
    back to the separate kernels.  "pipelined": norm_rows_backward_fused_pipelined
    on the 16-byte rows (8, 64, 1024, 5000 values; the misaligned ones take the
    unpipelined kernel), its grid capped at 7 blocks so each walks its ring
    of NORM_STAGES rows many times (37 rows: 5 or 6 a block, ending at every
    stage).  The three GPU modes in one test (NumPy: the reference path once)."""
    from dnnprims import row_normalization
    L = x_shape[-1]
    x = random_array(rng, x_shape, dtype, low=-1, high=3)
    dy = random_array(rng, x_shape, dtype)
    gamma = random_array(rng, (L,), pdtype, 0.5, 1.5) if affine else None
    on = lambda a: None if a is None else _placed(xp, a, offset)  # noqa: E731
    big = L >= 3  # 1 or 2 values a row: dx ~0 up to eps terms, no relative error to compare
    names = ("dx", "dgamma", "dbeta")[int(not big):]
    want = layer_norm_backward(_f64(dy), _f64(x), L, _f64(gamma))
    eps = float(np.finfo(_dtypes.accumulate_dtype(dtype)).eps)
    want_rms = rms_norm_backward(_f64(dy), _f64(x), L, _f64(gamma), eps=eps)
    for mode in ("pipelined", "fused", "separate") if xp is not np else ("pipelined",):
        monkeypatch.setattr(row_normalization, "FUSED_BACKWARD", mode != "separate")
        monkeypatch.setattr(row_normalization, "LAYER_BACKWARD_PIPELINED", mode == "pipelined")
        monkeypatch.setattr(row_normalization, "_PIPELINE_GRID_CAP", 7 if mode == "pipelined" else None)
        _, mean, rstd = layer_norm(on(x), L, on(gamma), return_stats=True)
        for stats in ({}, dict(mean=mean, rstd=rstd)):
            got = layer_norm_backward(on(dy), on(x), L, on(gamma), **stats)
            assert got[0].dtype == dtype and got[1].dtype == (pdtype if affine else dtype)
            _compare(got[int(not big):], want[int(not big):], dtype, names, _layer_norm_magnitudes(dy, x))
        got = rms_norm_backward(on(dy), on(x), L, on(gamma))
        _compare(got[int(not big):], want_rms[int(not big):], dtype, ("dx", "dgamma")[int(not big):])


@pytest.mark.parametrize("dtype,pdtype", _param_dtypes())
@pytest.mark.parametrize("x_shape,offset", [((3, 1), 0), ((5, 3), 0), ((6, 13), 1), ((3000, 8), 0),
                                            ((700, 96), 1), ((37, 64), 0), ((5, 1024), 0), ((3, 5000), 0),
                                            ((2, 40000), 0)])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_and_rms_norm_pipelined_forward(xp, rng, monkeypatch, dtype, pdtype, x_shape, offset, affine):
    """norm_rows_forward_pipelined (16-byte rows of at most 2 vectors a thread:
    8, 64, 1024, 5000 values; the misaligned and the 40000-value rows take
    norm_rows_forward) with its grid capped at 7 blocks, so each walks its ring
    of NORM_STAGES rows many times (3000 and 37 rows), and norm_rows_forward
    (switch off), against the float64 reference: y and the saved statistics of
    layer norm, RMS norm, and group norm with one group on (N, C) x (the same
    rows).  Both GPU modes in one test (NumPy: the reference path once)."""
    from dnnprims import row_normalization
    L = x_shape[-1]
    x = random_array(rng, x_shape, dtype, low=-1, high=3)
    gamma = random_array(rng, (L,), pdtype, 0.5, 1.5) if affine else None
    beta = random_array(rng, (L,), pdtype) if affine else None
    on = lambda a: None if a is None else _placed(xp, a, offset)  # noqa: E731
    eps = float(np.finfo(_dtypes.accumulate_dtype(dtype)).eps)
    want_layer = layer_norm(_f64(x), L, _f64(gamma), _f64(beta), return_stats=True)
    want_rms = rms_norm(_f64(x), L, _f64(gamma), eps=eps, return_stats=True)
    want_group = group_norm(_f64(x), 1, _f64(gamma), _f64(beta), return_stats=True)
    for pipelined in (True, False) if xp is not np else (True,):
        monkeypatch.setattr(row_normalization, "LAYER_FORWARD_PIPELINED", row_normalization._X_TYPES if pipelined
                            else ())
        monkeypatch.setattr(row_normalization, "_PIPELINE_GRID_CAP", 7 if pipelined else None)
        _compare(layer_norm(on(x), L, on(gamma), on(beta), return_stats=True), want_layer, dtype,
                 ("y", "mean", "rstd"))
        _compare(rms_norm(on(x), L, on(gamma), return_stats=True), want_rms, dtype, ("y", "rstd"))
        _compare(group_norm(on(x), 1, on(gamma), on(beta), return_stats=True), want_group, dtype,
                 ("y", "mean", "rstd"))


@pytest.mark.parametrize("dtype,pdtype", _param_dtypes())
@pytest.mark.parametrize("x_shape,offset", [((1, 12), 0), ((5, 8), 0), ((37, 1000), 0), ((9, 1024), 0),
                                            ((7, 5000), 0), ((4, 8192), 0), ((3, 4097), 0), ((6, 1000), 1),
                                            ((2, 40000), 0), ((3, 3), 0)])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_and_rms_norm_register_forward(xp, rng, monkeypatch, dtype, pdtype, x_shape, offset, affine):
    """norm_rows_forward_regs (LAYER_FORWARD_REGISTERS: 16-byte rows of at most 2 vectors a
    thread, the row in registers, one barrier a row) with 1 and 2 rows a block (odd row
    counts: the last block's second row is empty), and with the switch off, against the
    float64 reference: y and the saved statistics of layer and RMS norm, every dtype (the
    16-bit pipelined forward switched off so they reach it).  Rows of 12, 8, 1000 (partial
    warps), 1024, 5000, 8192 values take it where they fit; 4097 and 3 values (not 16-byte
    vectors) and the misaligned rows take norm_rows_forward_odd (LAYER_FORWARD_ODD), 40000
    values norm_rows_forward.  The GPU modes
    in one test (NumPy: the reference path once); on the GPU the path taken is checked."""
    from dnnprims import row_normalization
    L = x_shape[-1]
    x = random_array(rng, x_shape, dtype, low=-1, high=3)
    gamma = random_array(rng, (L,), pdtype, 0.5, 1.5) if affine else None
    beta = random_array(rng, (L,), pdtype) if affine else None
    on = lambda a: None if a is None else _placed(xp, a, offset)  # noqa: E731
    eps = float(np.finfo(_dtypes.accumulate_dtype(dtype)).eps)
    want_layer = layer_norm(_f64(x), L, _f64(gamma), _f64(beta), return_stats=True)
    want_rms = rms_norm(_f64(x), L, _f64(gamma), eps=eps, return_stats=True)
    monkeypatch.setattr(row_normalization, "LAYER_FORWARD_PIPELINED", ())
    taken = []
    launch = row_normalization._layer_forward_registers
    monkeypatch.setattr(row_normalization, "_layer_forward_registers",
                        lambda *a: taken.append(launch(*a)) or taken[-1])
    vectors = L * dtype.itemsize // 16
    fits = offset == 0 and L * dtype.itemsize % 16 == 0 and vectors <= 2048
    for rows_a_block in (1, 2, None) if xp is not np else (None,):
        monkeypatch.setattr(row_normalization, "LAYER_FORWARD_REGISTERS",
                            row_normalization._X_TYPES if rows_a_block else ())
        monkeypatch.setattr(row_normalization, "LAYER_FORWARD_ROWS", rows_a_block or 1)
        taken.clear()
        _compare(layer_norm(on(x), L, on(gamma), on(beta), return_stats=True), want_layer, dtype,
                 ("y", "mean", "rstd"))
        _compare(rms_norm(on(x), L, on(gamma), return_stats=True), want_rms, dtype, ("y", "rstd"))
        if xp is not np:
            assert taken == [bool(rows_a_block) and fits] * 2, taken


@pytest.mark.parametrize("dtype", _dtypes.SUPPORTED, ids=lambda d: d.name)
@pytest.mark.parametrize("x_shape", [(65536, 1024), (37, 1000), (7, 8), (5, 6), (2, 40000), (4, 16384)])
@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("rows_a_block", [1, 2])
def test_register_forward_launch_matches_its_signature(monkeypatch, dtype, x_shape, rms, rows_a_block):
    """CPU: norm_rows_forward_regs' launch against its C signature (pointers of the
    pointee dtype, scalars of the exact C type), one block per LAYER_FORWARD_ROWS rows of
    the host's row block, no dynamic shared memory; rows it cannot take (not 16-byte
    vectors, more than 2 vectors a thread) launch nothing; an unknown row count is refused."""
    from test_normalization import _C_TYPES, _fake_device_array
    from dnnprims import row_normalization as rn
    captured, expressions, FakeCupy = _capture_row_launches(monkeypatch)
    monkeypatch.setattr(rn, "LAYER_FORWARD_REGISTERS", rn._X_TYPES)
    monkeypatch.setattr(rn, "LAYER_FORWARD_ROWS", rows_a_block)
    monkeypatch.setattr(rn, "_MAX_BLOCK", {})
    dtype = np.dtype(dtype)
    acc = np.dtype(_dtypes.accumulate_dtype(dtype))
    x, y = (_fake_device_array(x_shape, dtype) for _ in range(2))
    mean, rstd = (_fake_device_array((x_shape[0],), acc) for _ in range(2))
    rows = rn._Rows(x, 1, "NCHW", (x, y), 1)
    pt = _dtypes.cuda_type(dtype)
    done = rn._layer_forward_registers(FakeCupy, x, y, None, None, mean, rstd, rows, pt, acc.type(1e-5), rms)
    if rows.vec == 1 or rows.block * rn._FUSED_ITEMS * rows.vec < rows.M:
        assert not done and not captured
        return
    assert done and len(captured) == 1
    (grid,), (block,), args, shared = captured[0]
    assert grid == -(-x_shape[0] // rows_a_block) and block == rows.block and shared == 0
    assert expressions[-1] == f"norm_rows_forward_regs<{rows.t}, {pt}, {rows.index_t}, {rows.vec}, {rows_a_block}>"
    assert expressions[-1] in rn.FAMILY.name_expressions
    template, params = _row_kernel_signature("norm_rows_forward_regs")
    assert template == ["T", "P", "index_t", "VEC", "R"] and len(args) == len(params)
    ctype = {"T": _C_TYPES[rows.t], "P": _C_TYPES[pt], "acc_t<T>": acc.type,
             "index_t": np.int32 if rows.index_t == "int" else np.int64, "int": np.int32}
    for (c_type, param), a in zip(params, args):
        if param in ("gamma", "beta"):
            assert a is rn._NULL
        elif c_type.endswith("*"):
            assert a.dtype == np.dtype(ctype[c_type[:-1]]), (param, a.dtype)
        else:
            assert type(a) is ctype[c_type], (param, type(a))
    values = dict(zip((p for _, p in params), args))
    assert values["rows"] == x_shape[0] and values["M"] == x_shape[1] and values["rms"] == int(rms)
    assert values["mean_out"] is mean and values["rstd_out"] is rstd
    monkeypatch.setattr(rn, "LAYER_FORWARD_ROWS", 3)
    with pytest.raises(ValueError, match="LAYER_FORWARD_ROWS"):
        rn._layer_forward_registers(FakeCupy, x, y, None, None, mean, rstd, rows, pt, acc.type(1e-5), rms)


@pytest.mark.parametrize("dtype,pdtype", _param_dtypes())
@pytest.mark.parametrize("x_shape,offset", [((3, 1), 0), ((5, 3), 0), ((4, 7), 0), ((6, 13), 1), ((37, 1000), 1),
                                            ((9, 1001), 0), ((3, 4097), 0), ((2, 4097), 1), ((3, 5001), 0),
                                            ((2, 9001), 0), ((2, 20000), 1), ((5, 1024), 1), ((4, 1024), 0)])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_and_rms_norm_odd_forward(xp, rng, monkeypatch, dtype, pdtype, x_shape, offset, affine):
    """norm_rows_forward_odd (LAYER_FORWARD_ODD: rows that are not 16-byte vectors -- odd
    lengths 1, 3, 7, 13, 1001, 4097, 5001, 9001 (1024 threads), misaligned views -- the row
    in registers, scalar loads) on and off, against the float64 reference: y and the saved
    statistics of layer and RMS norm, every dtype.  20000 values (more than 16 a thread of
    1024) and the aligned 1024-value rows do not take it.  On the GPU the path taken is
    checked (NumPy: the reference path once)."""
    from dnnprims import row_normalization
    L = x_shape[-1]
    x = random_array(rng, x_shape, dtype, low=-1, high=3)
    gamma = random_array(rng, (L,), pdtype, 0.5, 1.5) if affine else None
    beta = random_array(rng, (L,), pdtype) if affine else None
    on = lambda a: None if a is None else _placed(xp, a, offset)  # noqa: E731
    eps = float(np.finfo(_dtypes.accumulate_dtype(dtype)).eps)
    want_layer = layer_norm(_f64(x), L, _f64(gamma), _f64(beta), return_stats=True)
    want_rms = rms_norm(_f64(x), L, _f64(gamma), eps=eps, return_stats=True)
    taken = []
    launch = row_normalization._layer_forward_odd
    monkeypatch.setattr(row_normalization, "_layer_forward_odd", lambda *a: taken.append(launch(*a)) or taken[-1])
    vector_rows = offset == 0 and L * dtype.itemsize % 16 == 0
    fits = not vector_rows and L <= 16 * 1024
    for mode in ("on", "off") if xp is not np else ("on",):
        monkeypatch.setattr(row_normalization, "LAYER_FORWARD_ODD", row_normalization._X_TYPES if mode == "on" else ())
        taken.clear()
        _compare(layer_norm(on(x), L, on(gamma), on(beta), return_stats=True), want_layer, dtype,
                 ("y", "mean", "rstd"))
        _compare(rms_norm(on(x), L, on(gamma), return_stats=True), want_rms, dtype, ("y", "rstd"))
        if xp is not np and not vector_rows:
            assert taken == [mode == "on" and fits] * 2, taken


@pytest.mark.parametrize("dtype,pdtype", _param_dtypes())
@pytest.mark.parametrize("x_shape,offset", [((3, 4097), 0), ((2, 4097), 1), ((3, 5001), 0), ((600, 2049), 0),
                                            ((4, 3000), 1), ((2, 9001), 0), ((5, 13), 1), ((3, 4096), 0)])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_and_rms_norm_odd_backward(xp, rng, monkeypatch, dtype, pdtype, x_shape, offset, affine):
    """norm_rows_backward_odd (LAYER_BACKWARD_ODD: rows that are not 16-byte vectors and
    longer than norm_rows_backward_fused's 2 values a thread -- 2049, 3000 misaligned, 4097,
    5001 values; 600 rows: more than the resident blocks, so each block walks several rows
    and its partials add many rows) on and off, with and without saved statistics, against
    the float64 reference: dx, dgamma, dbeta of layer norm, dx, dgamma of RMS norm.  9001
    values (1024 threads: beyond its 512-thread bound), 13 values (the fused kernel) and
    the aligned 4096 (16-byte vectors) do not take it; on the GPU the path taken is checked."""
    from dnnprims import row_normalization
    L = x_shape[-1]
    x = random_array(rng, x_shape, dtype, low=-1, high=3)
    dy = random_array(rng, x_shape, dtype)
    gamma = random_array(rng, (L,), pdtype, 0.5, 1.5) if affine else None
    on = lambda a: None if a is None else _placed(xp, a, offset)  # noqa: E731
    want = layer_norm_backward(_f64(dy), _f64(x), L, _f64(gamma))
    eps = float(np.finfo(_dtypes.accumulate_dtype(dtype)).eps)
    want_rms = rms_norm_backward(_f64(dy), _f64(x), L, _f64(gamma), eps=eps)
    taken = []
    launch = row_normalization._odd_backward
    _last_odd = [None]

    def record(*a):
        _last_odd[0] = launch(*a)
        taken.append(_last_odd[0] is not None)
        return _last_odd[0]
    monkeypatch.setattr(row_normalization, "_odd_backward", record)
    vector_rows = offset == 0 and L * dtype.itemsize % 16 == 0
    applies = not vector_rows and 2048 < L <= 8192
    for mode in ("on", "off") if xp is not np else ("on",):
        monkeypatch.setattr(row_normalization, "LAYER_BACKWARD_ODD", row_normalization._X_TYPES if mode == "on" else ())
        taken.clear()
        _, mean, rstd = layer_norm(on(x), L, on(gamma), return_stats=True)
        for stats in ({}, dict(mean=mean, rstd=rstd)):
            got = layer_norm_backward(on(dy), on(x), L, on(gamma), **stats)
            assert got[0].dtype == dtype and got[1].dtype == (pdtype if affine else dtype)
            _compare(got, want, dtype, ("dx", "dgamma", "dbeta"), _layer_norm_magnitudes(dy, x))
        got = rms_norm_backward(on(dy), on(x), L, on(gamma))
        _compare(got, want_rms, dtype, ("dx", "dgamma"))
        if xp is not np:
            assert taken == [True] * 3 if mode == "on" and applies else not any(taken), (mode, taken)


@pytest.mark.parametrize("M", [1, 3, 7, 13, 1000, 1001, 4097, 5001, 8192, 8193, 16384, 16385])
def test_odd_forward_shape(M):
    """CPU: norm_rows_forward_odd's block covers the row with I values a thread, whole warps,
    at most _ODD_BLOCK threads while a larger I fits, never more than 1024 (else None)."""
    from dnnprims import row_normalization as rn
    shape = rn._odd_shape(M)
    if M > 16 * 1024:
        assert shape is None
        return
    items, block = shape
    assert items in rn._ODD_ITEMS and block % 32 == 0 and items * block >= M and block - 32 < -(-M // items)
    assert block <= rn._ODD_BLOCK or items == rn._ODD_ITEMS[-1]
    assert all(-(-M // i) > rn._ODD_BLOCK for i in rn._ODD_ITEMS if i < items)


@pytest.mark.parametrize("dtype", _dtypes.SUPPORTED, ids=lambda d: d.name)
@pytest.mark.parametrize("x_shape", [(8192, 4097), (37, 1001), (7, 3), (5, 1), (2, 20000), (4, 1024)])
@pytest.mark.parametrize("rms", [False, True])
def test_odd_forward_launch_matches_its_signature(monkeypatch, dtype, x_shape, rms):
    """CPU: norm_rows_forward_odd's launch against its C signature (pointers of the pointee
    dtype, scalars of the exact C type), one block a row of _odd_shape's threads, no dynamic
    shared memory, the expression declared; rows it cannot take launch nothing."""
    from test_normalization import _C_TYPES, _fake_device_array
    from dnnprims import row_normalization as rn
    captured, expressions, FakeCupy = _capture_row_launches(monkeypatch)
    monkeypatch.setattr(rn, "LAYER_FORWARD_ODD", rn._X_TYPES)
    monkeypatch.setattr(rn, "_MAX_BLOCK", {})
    dtype = np.dtype(dtype)
    acc = np.dtype(_dtypes.accumulate_dtype(dtype))
    x, y = (_fake_device_array(x_shape, dtype) for _ in range(2))
    mean, rstd = (_fake_device_array((x_shape[0],), acc) for _ in range(2))
    rows = rn._Rows(x, 1, "NCHW", (x, y), 1)
    pt = _dtypes.cuda_type(dtype)
    done = rn._layer_forward_odd(FakeCupy, x, y, None, None, mean, rstd, rows, pt, acc.type(1e-5), rms)
    if rows.vec > 1 or x_shape[1] > 16 * 1024:
        assert not done and not captured
        return
    assert done and len(captured) == 1
    (grid,), (block,), args, shared = captured[0]
    items, want_block = rn._odd_shape(x_shape[1])
    assert grid == x_shape[0] and block == want_block and shared == 0
    assert expressions[-1] == f"norm_rows_forward_odd<{rows.t}, {pt}, {rows.index_t}, {items}>"
    assert expressions[-1] in rn.FAMILY.name_expressions
    template, params = _row_kernel_signature("norm_rows_forward_odd")
    assert template == ["T", "P", "index_t", "I"] and len(args) == len(params)
    ctype = {"T": _C_TYPES[rows.t], "P": _C_TYPES[pt], "acc_t<T>": acc.type,
             "index_t": np.int32 if rows.index_t == "int" else np.int64, "int": np.int32}
    for (c_type, param), a in zip(params, args):
        if param in ("gamma", "beta"):
            assert a is rn._NULL
        elif c_type.endswith("*"):
            assert a.dtype == np.dtype(ctype[c_type[:-1]]), (param, a.dtype)
        else:
            assert type(a) is ctype[c_type], (param, type(a))
    values = dict(zip((p for _, p in params), args))
    assert values["M"] == x_shape[1] and values["rms"] == int(rms)
    assert values["mean_out"] is mean and values["rstd_out"] is rstd


GROUP_SHAPES = [((2, 6, 3, 5), 3, "NCHW"), ((2, 8, 4, 4), 2, "NCHW"), ((3, 4, 7), 4, "NCHW"),
                ((2, 3, 5, 6), 2, "NHWC"), ((2, 4, 4, 16), 2, "NHWC"), ((1, 13, 4), 4, "NHWC"),
                ((2, 4, 40, 40), 2, "NCHW")]


@pytest.mark.parametrize("dtype,pdtype", _param_dtypes())
@pytest.mark.parametrize("x_shape,groups,layout", GROUP_SHAPES)
def test_group_and_instance_norm_match_reference(xp, rng, dtype, pdtype, x_shape, groups, layout):
    x = random_array(rng, x_shape, dtype, low=-1, high=3)
    dy = random_array(rng, x_shape, dtype)
    C = x_shape[1 if layout == "NCHW" else -1]
    gamma, beta = random_array(rng, (C,), pdtype, 0.5, 1.5), random_array(rng, (C,), pdtype)
    on = lambda a: None if a is None else xp.asarray(a)  # noqa: E731
    opts = dict(layout=layout, eps=1e-4)
    y, mean, rstd = group_norm(on(x), groups, on(gamma), on(beta), return_stats=True, **opts)
    want = group_norm(_f64(x), groups, _f64(gamma), _f64(beta), return_stats=True, **opts)
    _compare((y, mean, rstd), want, dtype, ("y", "mean", "rstd"))
    want = group_norm_backward(_f64(dy), _f64(x), groups, _f64(gamma), **opts)
    for stats in ({}, dict(mean=mean, rstd=rstd)):
        got = group_norm_backward(on(dy), on(x), groups, on(gamma), **stats, **opts)
        _compare(got, want, dtype, ("dx", "dgamma", "dbeta"))

    rm, rv = np.zeros(C, pdtype), np.ones(C, pdtype)
    rm_x, rv_x = xp.array(rm), xp.array(rv)
    rm64, rv64 = _f64(rm), _f64(rv)
    y = instance_norm(on(x), on(gamma), on(beta), rm_x, rv_x, **opts)
    _compare((y,), (instance_norm(_f64(x), _f64(gamma), _f64(beta), rm64, rv64, **opts),), dtype, ("y",))
    assert_close(rm_x, rm64, pdtype, what="running_mean")
    assert_close(rv_x, rv64, pdtype, what="running_var")
    got = instance_norm_backward(on(dy), on(x), on(gamma), **opts)
    _compare(got, instance_norm_backward(_f64(dy), _f64(x), _f64(gamma), **opts), dtype,
             ("dx", "dgamma", "dbeta"))


@pytest.mark.parametrize("gn_backward,plane_sums", [("x", True), ("both", True), (None, True), (None, False)])
@pytest.mark.parametrize("cache", ["default", "none"])
@pytest.mark.parametrize("dtype", _dtypes.SUPPORTED, ids=lambda d: d.name)
@pytest.mark.parametrize("x_shape,groups,offset", [
    ((2, 6, 12, 12), 3, 0), ((2, 6, 12, 12), 3, 1), ((2, 4, 20, 20), 2, 0), ((3, 5, 33), 5, 0),
    ((2, 64, 16, 16), 2, 0), ((1, 8, 56, 56), 1, 0), ((3, 8, 7, 7), 2, 0)])
def test_group_norm_backward_plane_sums_and_caches(xp, rng, monkeypatch, gn_backward, plane_sums, cache, dtype,
                                                   x_shape, groups, offset):
    """Group norm NCHW backward with the parameter-gradient partials from the row
    kernel's own read (plane_sums: a warp's vectors straddle two planes at 12x12,
    one plane per group at 33 values, 32 planes a group, planes of 49 values too
    short for it) against the separate planes kernel and the float64 reference;
    rows cached in shared memory (200 KB fp32 rows at 8x56x56 take the
    one-block-per-SM cache) and not cached (cache "none").  gn_backward "x" /
    "both": gn_rows_backward (contiguous warp ranges; "x" caches x only at
    8x56x56, both tensors for the small rows, and falls back at 32 planes a
    group when 512 threads would put a warp across three planes)."""
    from dnnprims import row_normalization
    monkeypatch.setattr(row_normalization, "CLUSTER_BACKWARD", False)  # the kernels named here
    monkeypatch.setattr(row_normalization, "PIPELINED_BACKWARD", None)
    monkeypatch.setattr(row_normalization, "GN_BACKWARD", gn_backward)
    monkeypatch.setattr(row_normalization, "PLANE_SUMS", plane_sums)
    if cache == "none":
        monkeypatch.setattr(row_normalization, "CACHE_BYTES", 0)
        monkeypatch.setattr(row_normalization, "BIG_CACHE", False)
    x = random_array(rng, x_shape, dtype, low=-1, high=3)
    dy = random_array(rng, x_shape, dtype)
    pdtype = np.float32 if _dtypes.is_half(dtype) else dtype
    gamma = random_array(rng, (x_shape[1],), pdtype, 0.5, 1.5)
    want = group_norm_backward(_f64(dy), _f64(x), groups, _f64(gamma), eps=1e-4)
    _, mean, rstd = group_norm(_placed(xp, x, offset), groups, xp.asarray(gamma), eps=1e-4, return_stats=True)
    for stats in ({}, dict(mean=mean, rstd=rstd)):
        got = group_norm_backward(_placed(xp, dy, offset), _placed(xp, x, offset), groups, xp.asarray(gamma),
                                  eps=1e-4, **stats)
        _compare(got, want, dtype, ("dx", "dgamma", "dbeta"))


@pytest.mark.parametrize("pipelined", [True, False])
@pytest.mark.parametrize("grid_cap", [None, 3])
@pytest.mark.parametrize("dtype", _dtypes.SUPPORTED, ids=lambda d: d.name)
@pytest.mark.parametrize("x_shape,groups,offset,affine", [
    ((2, 6, 12, 12), 3, 0, True), ((2, 6, 12, 12), 3, 1, True), ((5, 8, 56, 56), 1, 0, True),
    ((7, 12, 8, 8), 12, 0, False), ((3, 4, 2, 4), 2, 0, True), ((13, 6, 4, 6), 3, 0, True)])
def test_group_norm_pipelined_forward(xp, rng, monkeypatch, pipelined, grid_cap, dtype, x_shape, groups, offset,
                                      affine):
    """Group / instance norm NCHW forward through gn_rows_forward_pipelined (two
    row buffers, the next row's copies in flight): a 100 KB fp32 row (8x56x56,
    two buffers take the per-block opt-in), instance norm, 8-value planes, a
    grid capped at 3 blocks so each walks many rows (odd row counts: the last
    block has fewer), misaligned data (falls back), against the float64
    reference and the saved statistics."""
    from dnnprims import row_normalization
    monkeypatch.setattr(row_normalization, "CLUSTER_FORWARD", False)  # this test is about the kernels below it
    monkeypatch.setattr(row_normalization, "PIPELINED_FORWARD", pipelined)
    monkeypatch.setattr(row_normalization, "_PIPELINE_GRID_CAP", grid_cap)
    x = random_array(rng, x_shape, dtype, low=-1, high=3)
    pdtype = np.float32 if _dtypes.is_half(dtype) else dtype
    gamma = random_array(rng, (x_shape[1],), pdtype, 0.5, 1.5) if affine else None
    beta = random_array(rng, (x_shape[1],), pdtype) if affine else None
    want = group_norm(_f64(x), groups, None if gamma is None else _f64(gamma),
                      None if beta is None else _f64(beta), eps=1e-4, return_stats=True)
    got = group_norm(_placed(xp, x, offset), groups, None if gamma is None else xp.asarray(gamma),
                     None if beta is None else xp.asarray(beta), eps=1e-4, return_stats=True)
    _compare(got, want, dtype, ("y", "mean", "rstd"))


@pytest.mark.parametrize("dtype", _dtypes.SUPPORTED, ids=lambda d: d.name)
@pytest.mark.parametrize("x_shape,groups,cl,offset,affine", [
    ((1, 16, 56, 56), 2, 2, 0, True), ((1, 16, 56, 56), 2, 8, 0, True), ((3, 8, 2, 4), 2, 4, 0, True),
    ((13, 6, 4, 6), 3, 2, 0, True), ((3, 8, 1, 8), 1, 8, 0, False), ((13, 12, 4, 6), 3, 1, 0, True),
    ((3, 4, 1, 24), 1, 2, 0, True), ((3, 8, 2, 4), 2, 2, 1, True), ((5, 3, 8, 4), 3, 1, 0, True),
    ((7, 40, 5, 8), 4, 2, 0, True), ((2, 20, 16, 16), 1, 4, 0, False)])
def test_group_norm_cluster_forward(gpu, rng, monkeypatch, dtype, x_shape, groups, cl, offset, affine):
    """gn_rows_forward_cluster (sm_90+; other GPUs check they do not take it): a
    cluster of `cl` blocks per row (forced through CLUSTER_FORWARD_BYTES = exactly
    one block's x share at that size), each block holding K / cl whole channels:
    K 2, 4, 8, 10, 20 split over 1, 2, 4, 8 blocks (one channel a block too),
    planes of 8, 24, 32, 40, 256 and 3136 values (the 56x56 rows: 6 vectors a
    thread of 512, blocks of 64 threads with 2 vectors), N 1, 2, 3, 5, 7, 13,
    instance norm (K 1, cl 1), no gamma / beta; both block sizes
    (CLUSTER_FORWARD_ITEMS 8 and 2).  y, mean, rstd against the float64
    reference, bitwise the same on every repeat (the shares are merged in rank
    order); a budget under one channel takes the largest cluster; a misaligned
    input or the switch off takes the other kernels."""
    from dnnprims import row_normalization as rn
    monkeypatch.setattr(rn, "CLUSTER_FORWARD", True)
    monkeypatch.setattr(rn, "CLUSTER_FORWARD_MIN_ROW_BYTES", 0)
    itemsize = np.dtype(dtype).itemsize
    K, S = x_shape[1] // groups, int(np.prod(x_shape[2:]))
    monkeypatch.setattr(rn, "CLUSTER_FORWARD_BYTES", K // cl * S * itemsize)
    hopper = int(gpu.cuda.Device().compute_capability) >= 90   # below: never the cluster kernel
    expect = hopper and offset == 0
    ran = []
    function = rn.FAMILY.function
    monkeypatch.setattr(rn.FAMILY, "function", lambda expression: ran.append(expression) or function(expression))
    x = random_array(rng, x_shape, dtype, low=-1, high=3)
    pdtype = np.float32 if _dtypes.is_half(dtype) else dtype
    gamma = random_array(rng, (x_shape[1],), pdtype, 0.5, 1.5) if affine else None
    beta = random_array(rng, (x_shape[1],), pdtype) if affine else None
    on = lambda a: None if a is None else gpu.asarray(a)  # noqa: E731
    want = group_norm(_f64(x), groups, _f64(gamma), _f64(beta), eps=1e-4, return_stats=True)
    xs = _placed(gpu, x, offset)
    for items in (8, 2):
        monkeypatch.setattr(rn, "CLUSTER_FORWARD_ITEMS", items)
        ran.clear()
        results = [[_host(a) for a in group_norm(xs, groups, on(gamma), on(beta), eps=1e-4, return_stats=True)]
                   for _ in range(3)]
        param = pdtype if affine else dtype  # no gamma: the parameter type is x's
        spec = f"gn_rows_forward_cluster<{_dtypes.cuda_type(dtype)}, {_dtypes.cuda_type(param)}, int, {cl}>"
        assert (spec in ran) == expect and (expect or not any("cluster" in e for e in ran)), ran
        for later in results[1:]:
            for a, b in zip(results[0], later):
                np.testing.assert_array_equal(a, b)
        _compare(results[0], want, dtype, ("y", "mean", "rstd"))
    if groups == x_shape[1]:  # instance norm: the same kernel with one channel a row
        ran.clear()
        got = instance_norm(xs, on(gamma), on(beta), eps=1e-4)
        assert any(e.startswith("gn_rows_forward_cluster<") for e in ran) == expect, ran
        _compare((got,), (instance_norm(_f64(x), _f64(gamma), _f64(beta), eps=1e-4),), dtype, ("y",))
    if expect:  # a budget below one channel: the largest cluster (the smallest shares) runs
        ran.clear()
        monkeypatch.setattr(rn, "CLUSTER_FORWARD_BYTES", S * itemsize - 16)
        got = group_norm(xs, groups, on(gamma), on(beta), eps=1e-4, return_stats=True)
        largest = max(c for c in rn._CLUSTER_SIZES if K % c == 0)
        assert any(e.startswith("gn_rows_forward_cluster<") and e.endswith(f", {largest}>") for e in ran), ran
        _compare(got, want, dtype, ("y", "mean", "rstd"))
        ran.clear()   # rows under the minimum: the other kernels
        monkeypatch.setattr(rn, "CLUSTER_FORWARD_MIN_ROW_BYTES", K * S * itemsize + 1)
        got = group_norm(xs, groups, on(gamma), on(beta), eps=1e-4, return_stats=True)
        assert ran and not any("cluster" in e for e in ran), ran
        _compare(got, want, dtype, ("y", "mean", "rstd"))
        monkeypatch.setattr(rn, "CLUSTER_FORWARD_MIN_ROW_BYTES", K * S * itemsize)
        t = _dtypes.cuda_type(dtype)
        for switch, cluster in ((False, False), (tuple(o for o in rn._X_TYPES if o != t), False), ((t,), True)):
            ran.clear()   # off (for this type): the other kernels, the same results within rounding
            monkeypatch.setattr(rn, "CLUSTER_FORWARD", switch)
            got = group_norm(xs, groups, on(gamma), on(beta), eps=1e-4, return_stats=True)
            assert ran and any(e.startswith("gn_rows_forward_cluster<") for e in ran) == cluster, (switch, ran)
            _compare(got, want, dtype, ("y", "mean", "rstd"))


@pytest.mark.parametrize("mode,late,bulk", [("x", False, False), ("xl2", False, False), ("both", False, False),
                                            ("x", True, False), ("x", False, True), ("both", True, True),
                                            ("both", False, True)])
@pytest.mark.parametrize("grid_cap", [None, 3])
@pytest.mark.parametrize("dtype", _dtypes.SUPPORTED, ids=lambda d: d.name)
@pytest.mark.parametrize("x_shape,groups,offset,affine,runs", [
    ((2, 6, 12, 12), 3, 0, True, "float32 float64"), ((2, 6, 12, 12), 3, 1, True, ""),
    ((2, 4, 20, 20), 2, 0, True, "all"), ((2, 64, 16, 16), 2, 0, True, "all"),
    ((1, 8, 56, 56), 1, 0, True, "float32 float16 bfloat16"), ((5, 6, 16, 16), 3, 0, True, "all"),
    ((3, 4, 16, 16), 4, 0, False, "all"), ((7, 4, 1, 256), 2, 0, True, "all"),
    ((3, 8, 7, 7), 2, 0, True, "")])
def test_group_norm_pipelined_backward(xp, rng, monkeypatch, mode, late, bulk, grid_cap, dtype, x_shape, groups,
                                       offset, affine, runs):
    """Group / instance norm NCHW backward through gn_rows_backward_pipelined
    (next row's x, and with "both" its dy, copied by cp.async while this row
    runs; "xl2" prefetches the next dy into L2; `late` issues the copies after
    pass 1, `bulk` through cp.async.bulk + mbarrier) against the float64 reference:
    warps straddling two planes (12x12 fp32: 36 vectors a plane), 32 planes a
    group, a 100 KB fp32 row (two buffers) / 50 KB half row (four with "both"),
    a grid capped at 3 blocks walking 5 rows each, instance norm without
    gamma, and cases that must fall back (misaligned data, 49-value planes).
    `runs`: the dtypes for which the kernel must have been launched."""
    from dnnprims import row_normalization
    monkeypatch.setattr(row_normalization, "CLUSTER_BACKWARD", False)  # the kernel named here
    monkeypatch.setattr(row_normalization, "PIPELINED_BACKWARD", mode)
    monkeypatch.setattr(row_normalization, "PIPELINED_BACKWARD_LATE", late)
    monkeypatch.setattr(row_normalization, "PIPELINED_BACKWARD_BULK", bulk)
    monkeypatch.setattr(row_normalization, "_PIPELINE_GRID_CAP", grid_cap)
    launched = []
    real = row_normalization._pipelined_backward

    def spy(*args):
        out = real(*args)
        launched.append(out is not None)
        return out

    monkeypatch.setattr(row_normalization, "_pipelined_backward", spy)
    x = random_array(rng, x_shape, dtype, low=-1, high=3)
    dy = random_array(rng, x_shape, dtype)
    pdtype = np.float32 if _dtypes.is_half(dtype) else dtype
    gamma = random_array(rng, (x_shape[1],), pdtype, 0.5, 1.5) if affine else None
    want = group_norm_backward(_f64(dy), _f64(x), groups, None if gamma is None else _f64(gamma), eps=1e-4)
    _, mean, rstd = group_norm(_placed(xp, x, offset), groups, eps=1e-4, return_stats=True)
    for stats in ({}, dict(mean=mean, rstd=rstd)):
        got = group_norm_backward(_placed(xp, dy, offset), _placed(xp, x, offset), groups,
                                  None if gamma is None else xp.asarray(gamma), eps=1e-4, **stats)
        _compare(got, want, dtype, ("dx", "dgamma", "dbeta"))
    if xp is not np:
        assert launched == [runs == "all" or np.dtype(dtype).name in runs.split()] * 2


@pytest.mark.parametrize("dtype", _dtypes.SUPPORTED, ids=lambda d: d.name)
@pytest.mark.parametrize("x_shape,groups,cl,offset,affine", [
    ((1, 16, 56, 56), 2, 2, 0, True), ((1, 16, 56, 56), 2, 4, 0, True), ((3, 8, 2, 4), 2, 4, 0, True),
    ((13, 6, 4, 6), 3, 2, 0, True), ((3, 8, 1, 8), 1, 8, 0, False), ((13, 12, 4, 6), 3, 1, 0, True),
    ((3, 4, 1, 24), 1, 2, 0, True), ((3, 8, 2, 4), 2, 2, 1, True), ((5, 3, 8, 4), 3, 1, 0, True)])
def test_group_norm_cluster_backward(gpu, rng, monkeypatch, dtype, x_shape, groups, cl, offset, affine):
    """gn_rows_backward_cluster (sm_90+; other GPUs check they do not take it): a
    cluster of `cl` blocks per row (forced through CLUSTER_BLOCK_BYTES = exactly
    one block's x and dy share at that size), each block holding K / cl whole
    channels: K 2, 4, 8 split over 1, 2, 4, 8 blocks (one channel a block too),
    planes of 8, 24 and 3136 values (100 KB fp32 blocks at 8x56x56 split in two;
    200 KB fp64), N 1, 3, 13, 5 rows of one channel (instance norm: K 1, cl 1),
    no gamma.  dx, dgamma, dbeta against the float64 reference, with saved and
    recomputed statistics, bitwise the same on every repeat (fixed orders: the
    cluster's shares are added in rank order); a budget under one channel takes
    the largest cluster; a misaligned input or the switch off takes the other
    kernels."""
    from dnnprims import row_normalization as rn
    monkeypatch.setattr(rn, "CLUSTER_BACKWARD", True)
    monkeypatch.setattr(rn, "CLUSTER_MIN_ROW_BYTES", 0)
    monkeypatch.setattr(rn, "REGISTER_BACKWARD", False)  # the kernel named here
    itemsize = np.dtype(dtype).itemsize
    K, S = x_shape[1] // groups, int(np.prod(x_shape[2:]))
    monkeypatch.setattr(rn, "CLUSTER_BLOCK_BYTES", 2 * K // cl * S * itemsize)
    hopper = int(gpu.cuda.Device().compute_capability) >= 90   # below: never the cluster kernel
    expect = hopper and offset == 0
    ran = []
    function = rn.FAMILY.function
    monkeypatch.setattr(rn.FAMILY, "function", lambda expression: ran.append(expression) or function(expression))
    x = random_array(rng, x_shape, dtype, low=-1, high=3)
    dy = random_array(rng, x_shape, dtype)
    pdtype = np.float32 if _dtypes.is_half(dtype) else dtype
    gamma = random_array(rng, (x_shape[1],), pdtype, 0.5, 1.5) if affine else None
    on_gamma = None if gamma is None else gpu.asarray(gamma)
    want = group_norm_backward(_f64(dy), _f64(x), groups, _f64(gamma), eps=1e-4)
    xs, dys = _placed(gpu, x, offset), _placed(gpu, dy, offset)
    _, mean, rstd = group_norm(xs, groups, eps=1e-4, return_stats=True)
    for stats in ({}, dict(mean=mean, rstd=rstd)):
        ran.clear()
        results = [[_host(a) for a in group_norm_backward(dys, xs, groups, on_gamma, eps=1e-4, **stats)]
                   for _ in range(3)]
        param = pdtype if affine else dtype  # no gamma: the parameter gradients take x's type
        spec = f"gn_rows_backward_cluster<{_dtypes.cuda_type(dtype)}, {_dtypes.cuda_type(param)}, int, {cl}>"
        assert (spec in ran) == expect and (expect or not any("cluster" in e for e in ran)), ran
        for later in results[1:]:
            for a, b in zip(results[0], later):
                np.testing.assert_array_equal(a, b)
        _compare(results[0], want, dtype, ("dx", "dgamma", "dbeta"))
    if groups == x_shape[1]:  # instance norm: the same kernel with one channel a row
        ran.clear()
        got = instance_norm_backward(dys, xs, on_gamma, eps=1e-4)
        assert any(e.startswith("gn_rows_backward_cluster<") for e in ran) == expect, ran
        _compare(got, instance_norm_backward(_f64(dy), _f64(x), _f64(gamma), eps=1e-4), dtype,
                 ("dx", "dgamma", "dbeta"))
    if expect:  # a budget below one channel's x and dy: the largest cluster (the smallest shares) runs
        ran.clear()
        monkeypatch.setattr(rn, "CLUSTER_BLOCK_BYTES", 2 * S * itemsize - 16)
        got = group_norm_backward(dys, xs, groups, on_gamma, eps=1e-4)
        largest = max(c for c in rn._CLUSTER_SIZES if K % c == 0)
        assert any(e.startswith("gn_rows_backward_cluster<") and e.endswith(f", {largest}>") for e in ran), ran
        _compare(got, want, dtype, ("dx", "dgamma", "dbeta"))
        ran.clear()   # switched off: the other kernels, the same results within rounding
        monkeypatch.setattr(rn, "CLUSTER_BACKWARD", False)
        got = group_norm_backward(dys, xs, groups, on_gamma, eps=1e-4)
        assert ran and not any("cluster" in e for e in ran), ran
        _compare(got, want, dtype, ("dx", "dgamma", "dbeta"))


@pytest.mark.parametrize("dtype", _dtypes.SUPPORTED, ids=lambda d: d.name)
@pytest.mark.parametrize("x_shape,groups,cl,items,offset,affine", [
    ((2, 16, 56, 56), 2, 8, 4, 0, True), ((2, 16, 56, 56), 2, 4, 8, 0, True), ((3, 8, 16, 16), 2, 1, 4, 0, True),
    ((13, 6, 16, 24), 3, 2, 8, 0, True), ((3, 8, 33, 32), 1, 8, 4, 0, False), ((3, 20, 20, 40), 1, 4, 8, 0, True),
    ((5, 3, 40, 40), 3, 1, 8, 0, True), ((2, 16, 56, 56), 2, 8, 8, 1, True), ((1, 4, 30, 80), 1, 2, 4, 0, True)])
def test_group_norm_register_backward(gpu, rng, monkeypatch, dtype, x_shape, groups, cl, items, offset, affine):
    """gn_rows_backward_registers (sm_90+; other GPUs check they do not take it):
    a cluster of `cl` blocks per row (forced through REGISTER_BACKWARD_BYTES =
    exactly one block's x and dy share at that size), each block holding K / cl
    whole channels in registers, ITEMS 4 and 8 (the host's choice where the
    switch's does not fit): K 2, 4, 8, 20 over 1, 2, 4, 8 blocks; planes of 256
    (the smallest: 32 half vectors), 384, 800, 1056 (33 x 32: partly filled
    warps, threads with fewer vectors than ITEMS), 1600, 2400 (fp64: a larger
    cluster than the budget's, for 512 threads at most) and 3136 values (fp64
    56x56: 416-thread blocks); N 1, 2, 3, 5, 13; instance norm (K 1); no gamma.  dx, dgamma, dbeta against the float64
    reference with saved and recomputed statistics, bitwise the same on every
    repeat, with the wide and the serial parameter-gradient finish; a budget
    under one channel takes the largest cluster; a misaligned input, the switch
    off, or a tuple without x's storage type takes the other kernels."""
    from dnnprims import row_normalization as rn
    monkeypatch.setattr(rn, "CLUSTER_BACKWARD", True)   # the register kernel is tried first by its path
    monkeypatch.setattr(rn, "REGISTER_BACKWARD", True)
    monkeypatch.setattr(rn, "REGISTER_BACKWARD_MIN_ROW_BYTES", 0)
    monkeypatch.setattr(rn, "REGISTER_BACKWARD_ITEMS", items)
    itemsize = np.dtype(dtype).itemsize
    K, S = x_shape[1] // groups, int(np.prod(x_shape[2:]))
    monkeypatch.setattr(rn, "REGISTER_BACKWARD_BYTES", 2 * K // cl * S * itemsize)

    class Rows:  # what _register_shape reads
        pass
    geometry = Rows()
    geometry.K, geometry.S = K, S
    shape = rn._register_shape(geometry, itemsize)
    assert shape is not None and shape[0] >= cl, shape
    hopper = int(gpu.cuda.Device().compute_capability) >= 90   # below: never the register kernel
    expect = hopper and offset == 0
    ran, finishes = [], []
    function = rn.FAMILY.function
    monkeypatch.setattr(rn.FAMILY, "function", lambda expression: ran.append(expression) or function(expression))
    for name in ("_finish_wide", "_finish_param_grads"):  # (FAMILY.launch skips `function` once cached)
        monkeypatch.setattr(rn, name, (lambda real, name: lambda *a: finishes.append(name) or real(*a))(
            getattr(rn, name), name))
    x = random_array(rng, x_shape, dtype, low=-1, high=3)
    dy = random_array(rng, x_shape, dtype)
    pdtype = np.float32 if _dtypes.is_half(dtype) else dtype
    gamma = random_array(rng, (x_shape[1],), pdtype, 0.5, 1.5) if affine else None
    on_gamma = None if gamma is None else gpu.asarray(gamma)
    want = group_norm_backward(_f64(dy), _f64(x), groups, _f64(gamma), eps=1e-4)
    xs, dys = _placed(gpu, x, offset), _placed(gpu, dy, offset)
    _, mean, rstd = group_norm(xs, groups, eps=1e-4, return_stats=True)
    param = pdtype if affine else dtype  # no gamma: the parameter gradients take x's type
    t = _dtypes.cuda_type(dtype)
    spec = f"gn_rows_backward_registers<{t}, {_dtypes.cuda_type(param)}, int, {shape[0]}, {shape[1]}>"
    for wide in (True, False):
        monkeypatch.setattr(rn, "REGISTER_BACKWARD_WIDE_FINISH", wide)
        for stats in ({}, dict(mean=mean, rstd=rstd)):
            ran.clear()
            finishes.clear()
            results = [[_host(a) for a in group_norm_backward(dys, xs, groups, on_gamma, eps=1e-4, **stats)]
                       for _ in range(3)]
            assert (spec in ran) == expect and (expect or not any("registers" in e for e in ran)), ran
            if expect:
                assert finishes == ["_finish_wide" if wide else "_finish_param_grads"] * 3, finishes
                assert not any("cluster" in e for e in ran), ran
            for later in results[1:]:
                for a, b in zip(results[0], later):
                    np.testing.assert_array_equal(a, b)
            _compare(results[0], want, dtype, ("dx", "dgamma", "dbeta"))
    if groups == x_shape[1]:  # instance norm: the same kernel with one channel a row
        ran.clear()
        got = instance_norm_backward(dys, xs, on_gamma, eps=1e-4)
        assert any(e.startswith("gn_rows_backward_registers<") for e in ran) == expect, ran
        _compare(got, instance_norm_backward(_f64(dy), _f64(x), _f64(gamma), eps=1e-4), dtype,
                 ("dx", "dgamma", "dbeta"))
    if expect:
        ran.clear()  # a budget below one channel's x and dy: the largest cluster
        monkeypatch.setattr(rn, "REGISTER_BACKWARD_BYTES", 2 * S * itemsize - 16)
        got = group_norm_backward(dys, xs, groups, on_gamma, eps=1e-4)
        largest = max(c for c in rn._CLUSTER_SIZES if K % c == 0)
        assert rn._register_shape(geometry, itemsize)[0] == largest
        assert any(e.startswith("gn_rows_backward_registers<") and f", {largest}, " in e for e in ran), ran
        _compare(got, want, dtype, ("dx", "dgamma", "dbeta"))
        for switch in (False, tuple(o for o in rn._X_TYPES if o != t)):  # off: the other kernels
            ran.clear()
            monkeypatch.setattr(rn, "REGISTER_BACKWARD", switch)
            got = group_norm_backward(dys, xs, groups, on_gamma, eps=1e-4)
            assert ran and not any("registers" in e for e in ran), (switch, ran)
            _compare(got, want, dtype, ("dx", "dgamma", "dbeta"))
        ran.clear()
        monkeypatch.setattr(rn, "REGISTER_BACKWARD", (t,))
        group_norm_backward(dys, xs, groups, on_gamma, eps=1e-4)
        assert any(e.startswith("gn_rows_backward_registers<") for e in ran), ran
        ran.clear()  # rows under the minimum: the other kernels
        monkeypatch.setattr(rn, "REGISTER_BACKWARD_MIN_ROW_BYTES", 2 * K * S * itemsize + 16)
        group_norm_backward(dys, xs, groups, on_gamma, eps=1e-4)
        assert ran and not any("registers" in e for e in ran), ran


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("offset", [0, 1])
def test_vector_paths_and_misaligned_data(xp, rng, dtype, offset):
    """Rows of 16-byte vectors (and the same data at a misaligned address), a row
    too large for the shared-memory cache (the re-reading path), NHWC vectors."""
    cases = [((4, 256), None, "rows"), ((2, 4, 72, 72), 1, "NCHW"), ((2, 6, 6, 16), 2, "NHWC"),
             ((3, 40000), None, "rows")]
    for x_shape, groups, kind in cases:
        x = random_array(rng, x_shape, dtype, low=-1, high=3)
        dy = random_array(rng, x_shape, dtype)
        C = x_shape[-1] if kind != "NCHW" else x_shape[1]
        pdtype = np.float32 if dtype == np.float16 else dtype
        gamma, beta = random_array(rng, (C,), pdtype, 0.5, 1.5), random_array(rng, (C,), pdtype)
        xs, dys = _placed(xp, x, offset), _placed(xp, dy, offset)
        if kind == "rows":
            got = (layer_norm(xs, C, xp.asarray(gamma), xp.asarray(beta)),
                   *layer_norm_backward(dys, xs, C, xp.asarray(gamma)))
            want = (layer_norm(_f64(x), C, _f64(gamma), _f64(beta)),
                    *layer_norm_backward(_f64(dy), _f64(x), C, _f64(gamma)))
        else:
            got = (group_norm(xs, groups, xp.asarray(gamma), xp.asarray(beta), layout=kind),
                   *group_norm_backward(dys, xs, groups, xp.asarray(gamma), layout=kind))
            want = (group_norm(_f64(x), groups, _f64(gamma), _f64(beta), layout=kind),
                    *group_norm_backward(_f64(dy), _f64(x), groups, _f64(gamma), layout=kind))
        _compare(got, want, dtype, ("y", "dx", "dgamma", "dbeta"))


@HYPOTHESIS
@given(problem=layer_norm_problems())
def test_layer_norm_hypothesis(xp, problem):
    rng = np.random.default_rng(3)
    x = random_array(rng, problem["x_shape"], np.float32)
    ns = problem["normalized_shape"]
    gamma = random_array(rng, ns, np.float32, 0.5, 1.5) if problem["affine"] else None
    beta = random_array(rng, ns, np.float32) if problem["affine"] else None
    on = lambda a: None if a is None else xp.asarray(a)  # noqa: E731
    eps = problem["eps"]
    assert_close(layer_norm(on(x), ns, on(gamma), on(beta), eps=eps),
                 loop_layer_norm(_f64(x), len(ns), _f64(gamma), _f64(beta), eps)[0], np.float32)
    assert_close(rms_norm(on(x), ns, on(gamma), eps=eps),
                 loop_layer_norm(_f64(x), len(ns), _f64(gamma), None, eps, rms=True)[0], np.float32)
    dy = random_array(rng, x.shape, np.float32)
    if int(np.prod(ns)) >= 3:
        got = layer_norm_backward(on(dy), on(x), ns, on(gamma), eps=eps)
        want = layer_norm_backward(_f64(dy), _f64(x), ns, _f64(gamma), eps=eps)
        _compare(got, want, np.float32, ("dx", "dgamma", "dbeta"))
        got = rms_norm_backward(on(dy), on(x), ns, on(gamma), eps=eps)
        want = rms_norm_backward(_f64(dy), _f64(x), ns, _f64(gamma), eps=eps)
        _compare(got, want, np.float32, ("dx", "dgamma"))


@HYPOTHESIS
@given(problem=group_norm_problems())
def test_group_norm_hypothesis(xp, problem):
    rng = np.random.default_rng(4)
    x = random_array(rng, problem["x_shape"], np.float32)
    layout, groups, eps = problem["layout"], problem["num_groups"], problem["eps"]
    C = x.shape[1 if layout == "NCHW" else -1]
    gamma = random_array(rng, (C,), np.float32, 0.5, 1.5) if problem["affine"] else None
    beta = random_array(rng, (C,), np.float32) if problem["affine"] else None
    on = lambda a: None if a is None else xp.asarray(a)  # noqa: E731
    y = group_norm(on(x), groups, on(gamma), on(beta), eps=eps, layout=layout)
    assert_close(y, loop_group_norm(_f64(x), groups, _f64(gamma), _f64(beta), eps, layout)[0], np.float32)
    if x.size // (x.shape[0] * groups) >= 3:
        dy = random_array(rng, x.shape, np.float32)
        got = group_norm_backward(on(dy), on(x), groups, on(gamma), eps=eps, layout=layout)
        want = group_norm_backward(_f64(dy), _f64(x), groups, _f64(gamma), eps=eps, layout=layout)
        _compare(got, want, np.float32, ("dx", "dgamma", "dbeta"))


def test_empty_batch(xp):
    x = xp.zeros((0, 4, 3), np.float32)
    y, mean, rstd = layer_norm(x, 3, return_stats=True)
    assert y.shape == x.shape and mean.shape == (0, 4)
    dx, dgamma, dbeta = layer_norm_backward(x, x, 3)
    assert dx.shape == x.shape and dgamma.shape == (3,) and not _host(dgamma).any()
    y = group_norm(x, 2)
    assert y.shape == x.shape
    dx, dgamma, _ = group_norm_backward(x, x, 2)
    assert dx.shape == x.shape and dgamma.shape == (4,)


def test_non_contiguous_inputs(xp, rng):
    base = random_array(rng, (3, 8, 5), np.float32)
    x = xp.asarray(base).transpose(0, 2, 1)  # (3, 5, 8) view
    y = layer_norm(x, 8)
    assert_close(y, layer_norm(np.ascontiguousarray(base.transpose(0, 2, 1)).astype(np.float64), 8), np.float32)


# ---------------------------------------------------------------------- bad inputs

@pytest.mark.parametrize("call,error,match", [
    (lambda x: layer_norm(x, 5), ValueError, "normalized_shape"),
    (lambda x: layer_norm(x, (3, 4, 5, 6)), ValueError, "normalized_shape"),
    (lambda x: layer_norm(x, "4"), TypeError, "normalized_shape"),
    (lambda x: layer_norm(x, 4, gamma=np.ones(3, np.float32)), ValueError, "gamma must have shape"),
    (lambda x: layer_norm(x, 4, beta=np.ones(4, np.float64)), TypeError, "beta"),
    (lambda x: layer_norm(x, 4, eps=-1.0), ValueError, "eps"),
    (lambda x: layer_norm(x.astype(np.int32), 4), TypeError, "x must have a floating dtype"),
    (lambda x: layer_norm(x, 4, gamma=[1.0] * 4), TypeError, "gamma must be a numpy.ndarray"),
    (lambda x: layer_norm_backward(x[:1], x, 4), ValueError, "dy must have shape"),
    (lambda x: layer_norm_backward(x.astype(np.float64), x, 4), TypeError, "dy has dtype"),
    (lambda x: layer_norm_backward(x, x, 4, mean=np.zeros((2, 3), np.float32)), ValueError,
     "mean was given without rstd"),
    (lambda x: layer_norm_backward(x, x, 4, mean=np.zeros(2, np.float32), rstd=np.ones(2, np.float32)),
     ValueError, "mean must have shape"),
    (lambda x: layer_norm_backward(x, x, 4, mean=np.zeros((2, 3)), rstd=np.ones((2, 3))), TypeError,
     "mean must have dtype"),
    (lambda x: rms_norm(x, 4, eps="tiny"), TypeError, "eps"),
    (lambda x: rms_norm(x, 4, gamma=np.ones((2, 2), np.float32)), ValueError, "gamma must have shape"),
    (lambda x: rms_norm_backward(x, x, 4, rstd=np.ones(3, np.float32)), ValueError, "rstd must have shape"),
    (lambda x: group_norm(x, 2), ValueError, "num_groups"),
    (lambda x: group_norm(x, 1.5), TypeError, "num_groups"),
    (lambda x: group_norm(x, 3, layout="NWHC"), ValueError, "layout"),
    (lambda x: group_norm(x, 3, gamma=np.ones(4, np.float32)), ValueError, "gamma must have shape"),
    (lambda x: group_norm(x[0, 0], 1), ValueError, "x must be 2-D to 5-D"),
    (lambda x: group_norm_backward(x, x, 3, mean=np.zeros((2, 2), np.float32),
                                   rstd=np.ones((2, 2), np.float32)), ValueError, "mean must have shape"),
    (lambda x: instance_norm(x[0]), ValueError, "x must be 3-D to 5-D"),
    (lambda x: instance_norm(x, running_mean=np.zeros(3, np.float32)), ValueError,
     "running_mean was given without running_var"),
    (lambda x: instance_norm(x, use_input_stats=False), ValueError, "running_mean and running_var are required"),
    (lambda x: instance_norm(x, use_input_stats=1), TypeError, "use_input_stats"),
    (lambda x: instance_norm(x, momentum=2.0), ValueError, "momentum"),
    (lambda x: instance_norm(x[:, :, :1], running_mean=np.zeros(3, np.float32),
                             running_var=np.ones(3, np.float32)), ValueError, "more than 1 spatial value"),
    (lambda x: instance_norm_backward(x, x, use_input_stats=False), ValueError,
     "running_mean and running_var are required"),
    (lambda x: instance_norm_backward(x, x, running_mean=np.zeros(4, np.float32), running_var=np.ones(4, np.float32),
                                      use_input_stats=False), ValueError, "running_mean must have shape"),
])
def test_bad_inputs(call, error, match):
    x = np.ones((2, 3, 4), np.float32)
    with pytest.raises(error, match=match):
        call(x)


def test_mixing_numpy_and_cupy(gpu):
    x = np.ones((2, 3, 4), np.float32)
    with pytest.raises(TypeError, match="cannot mix NumPy and CuPy"):
        layer_norm(gpu.asarray(x), 4, gamma=np.ones(4, np.float32))
    with pytest.raises(TypeError, match="cannot mix NumPy and CuPy"):
        group_norm_backward(gpu.asarray(x), x, 3)


# ---------------------------------------------------------------------- launch arguments (CPU, review6b)

def _row_kernel_signature(name):
    """(template parameter names, [(C type, parameter name)]) of a __global__ kernel
    of kernels/row_normalization.cu."""
    import re
    from dnnprims import row_normalization
    match = re.search(r"template <([^>]*)>\s*__global__ void (?:\w+\([^()]*\)\s*)*" + name
                      + r"\((.*?)\)\s*\{", row_normalization.FAMILY.source, re.S)
    template = [t.split()[-1] for t in match.group(1).split(",")]
    params = []
    for p in match.group(2).split(","):
        words = p.replace("*", " * ").replace("__restrict__", "").replace("const", "").split()
        params.append(("".join(words[:-1]), words[-1]))
    return template, params


def _launch_args_by_parameter(expression, args, acc, nulls=("gamma",)):
    """Check a captured launch's arguments against the kernel's C parameter list, one
    by one (pointers by dtype, scalars by their exact numpy type, the parameters named in
    `nulls` as the null pointer); return (template arguments by name, {parameter:
    argument})."""
    from dnnprims import row_normalization as rn
    from test_normalization import _C_TYPES
    name, inside = expression.rstrip(">").split("<", 1)
    template, params = _row_kernel_signature(name)
    bound = dict(zip(template, (a.strip() for a in inside.split(","))))
    ctype = {"T": _C_TYPES[bound["T"]], "P": _C_TYPES[bound["P"]], "acc_t<T>": acc.type,
             "index_t": np.int32 if bound["index_t"] == "int" else np.int64, "int": np.int32}
    assert len(args) == len(params)
    for (c_type, param), a in zip(params, args):
        if param in nulls:
            assert a is rn._NULL   # no gamma / beta: null pointers
        elif c_type.endswith("*"):
            assert a.dtype == np.dtype(ctype[c_type[:-1]]), (param, a.dtype)
        else:
            assert type(a) is ctype[c_type], (param, type(a))
    return bound, dict(zip((p for _, p in params), args))


def _fake_group_arrays(x_shape, groups, dtype, count, offset=False):
    """(dtype, accumulate dtype, `count` fake device tensors of x_shape -- the first, x,
    one element into its buffer when offset --, mean, rstd, parameter C type) for the
    launch tests of the group-norm kernels (no GPU: the plans are made on the CPU)."""
    from test_normalization import _fake_device_array
    dtype = np.dtype(dtype)
    acc = np.dtype(_dtypes.accumulate_dtype(dtype))
    arrays = [_fake_device_array(x_shape, dtype) for _ in range(count)]
    if offset:  # x one element into its buffer
        arrays[0] = _fake_device_array((int(np.prod(x_shape)) + 1,), dtype)[1:].reshape(x_shape)
    mean, rstd = (_fake_device_array((x_shape[0], groups), acc) for _ in range(2))
    return dtype, acc, arrays, mean, rstd, _dtypes.cuda_type(dtype)


def _capture_row_launches(monkeypatch):
    """CPU: row_normalization's kernels faked. Returns (launches: (grid, block,
    args, shared_mem) each, the expressions asked for, a cupy stand-in)."""
    from test_normalization import _fake_device_array
    from dnnprims import row_normalization as rn
    captured, expressions = [], []

    class Kernel:
        max_threads_per_block = 1024
        max_dynamic_shared_size_bytes = 48 * 1024

        def __call__(self, grid, block, args, shared_mem=0):
            captured.append((grid, block, tuple(args), shared_mem))

    class FakeCupy:
        class cuda:
            class runtime:
                getDevice = staticmethod(lambda: 0)

        empty = staticmethod(_fake_device_array)

    monkeypatch.setattr(rn.FAMILY, "function", lambda expr: expressions.append(expr) or Kernel())
    return captured, expressions, FakeCupy


@pytest.mark.parametrize("dtype", _dtypes.SUPPORTED, ids=lambda d: d.name)
@pytest.mark.parametrize("x_shape,groups", [((1, 256, 56, 56), 32), ((2, 8, 16, 16), 2), ((3, 4, 1, 256), 4)])
@pytest.mark.parametrize("mode,late,bulk", [("both", False, True), ("x", False, False), ("xl2", True, False)])
def test_pipelined_backward_launch_matches_its_signature_and_shared_memory_layout(
        monkeypatch, dtype, x_shape, groups, mode, late, bulk):
    """CPU: gn_rows_backward_pipelined's launch against its C signature (pointer ->
    array of the pointee dtype, scalars of the exact C type), the flag bits
    (xl2 1, late 2, bulk 4), and its dynamic shared memory against the kernel's
    layout: two (four with dy_smem) row buffers of ceil16(M * sizeof(T)) bytes,
    then warps * 4K + 3K accumulators; at least 1 KB of the opt-in left for the
    kernel's static shared memory (the bulk path's two mbarriers: 16 bytes).
    The bulk copies need each row's bytes a multiple of 16 and 16-byte aligned
    rows: what rows.vec > 1 (S % VEC == 0, aligned arrays) guarantees."""
    from dnnprims import row_normalization as rn
    optin = 232448   # H100: 227 KB
    captured, expressions, FakeCupy = _capture_row_launches(monkeypatch)
    monkeypatch.setattr(rn, "_optin", lambda cp: optin)
    monkeypatch.setattr(rn, "_RAISED", {})
    monkeypatch.setattr(rn, "_resident_blocks", lambda cp, kernel, expr, block, shared: 132)
    monkeypatch.setattr(rn, "_finish_param_grads", lambda *args: ("dgamma", "dbeta"))
    monkeypatch.setattr(rn, "PIPELINED_BACKWARD", mode)
    monkeypatch.setattr(rn, "PIPELINED_BACKWARD_LATE", late)
    monkeypatch.setattr(rn, "PIPELINED_BACKWARD_BULK", bulk)
    dtype, acc, (x, dy, dx), mean, rstd, pt = _fake_group_arrays(x_shape, groups, dtype, 3)
    gamma = None
    rows = rn._Rows(x, groups, "NCHW", (x, dy, dx), 2, rn._cache_limit(FakeCupy))
    done = rn._pipelined_backward(FakeCupy, dy, x, gamma, mean, rstd, dx, rows, pt, dtype, acc)
    M = rows.K * rows.S
    row_bytes = -(-M * dtype.itemsize // 16) * 16
    two_rows = 2 * row_bytes + (min(rows.block, 1024) // 32 * 4 + 3) * rows.K * acc.itemsize
    if rows.vec == 1 or rows.S < 32 * rows.vec or two_rows > optin - 1024:   # not this kernel's problem
        assert done is None and not captured
        return
    assert done == ("dgamma", "dbeta") and len(captured) == 1
    (grid,), (block,), args, shared = captured[0]
    assert 1 <= grid <= min(rows.rows, 132) and block % 32 == 0
    # The arguments, parameter by parameter.
    name, inside = expressions[-1].rstrip(">").split("<", 1)
    assert name == "gn_rows_backward_pipelined"
    bound, values = _launch_args_by_parameter(expressions[-1], args, acc, ("gamma",))
    assert values["flags"] == (mode == "xl2") | late << 1 | bulk << 2
    assert int(bound["VEC"]) * dtype.itemsize == 16   # bulk pieces: whole 16-byte vectors
    assert (M * dtype.itemsize) % 16 == 0 and rows.S % int(bound["VEC"]) == 0
    assert all(a.data.ptr % 16 == 0 for a in (x, dy, dx))
    # The shared memory, as the kernel lays it out.
    buffers = 4 if values["dy_smem"] else 2
    assert values["dy_smem"] == (mode == "both" and 4 * row_bytes + (block // 32 * 4 + 3) * rows.K * acc.itemsize
                                 <= optin - 1024)
    assert shared == buffers * row_bytes + (block // 32 * 4 * rows.K + 3 * rows.K) * acc.itemsize
    assert shared <= optin - 1024
    # Half rows of the benchmark shape are double-buffered with dy ("both"): bulk copies of 2 x 50 KB a phase.
    if mode == "both" and dtype.itemsize == 2 and x_shape[1] == 256:
        assert values["dy_smem"] == 1 and 2 * M * dtype.itemsize < 2**20   # the mbarrier tx-count limit


@pytest.mark.parametrize("dtype", _dtypes.SUPPORTED, ids=lambda d: d.name)
@pytest.mark.parametrize("x_shape", [(65536, 1024), (3, 5000), (7, 8), (5, 6), (2, 40000), (4, 16384)])
@pytest.mark.parametrize("rms", [False, True])
def test_pipelined_layer_norm_launches_match_their_signatures_and_shared_memory_layouts(
        monkeypatch, dtype, x_shape, rms):
    """CPU: norm_rows_backward_fused_pipelined's launch against its C signature
    (pointer -> array of the pointee dtype, scalars of the exact C type), its ring
    of NORM_STAGES x (x, dy) x NORM_FUSED_ITEMS 16-byte slots per thread (the .cu
    constants as Python counts them), within the opt-in less 1 KB of static shared
    memory, a grid of at most the resident blocks, and the finish over `grid`
    splits with 32 split lanes; rows the kernel cannot take (misaligned / not
    16-byte vectors, more than 2 vectors a thread) go to the unpipelined kernel."""
    import re
    from test_normalization import _fake_device_array
    from dnnprims import row_normalization as rn
    source = rn.FAMILY.source
    assert int(re.search(r"#define NORM_STAGES (\d+)", source).group(1)) == rn._FUSED_STAGES
    assert int(re.search(r"#define NORM_FUSED_ITEMS (\d+)", source).group(1)) == rn._FUSED_ITEMS
    optin = 232448   # H100: 227 KB
    captured, expressions, FakeCupy = _capture_row_launches(monkeypatch)
    monkeypatch.setattr(rn, "_optin", lambda cp: optin)
    monkeypatch.setattr(rn, "LAYER_FORWARD_PIPELINED", rn._X_TYPES)  # every type, whatever the default
    monkeypatch.setattr(rn, "_RAISED", {})
    monkeypatch.setattr(rn, "_resident_blocks", lambda cp, kernel, expr, block, shared: 1056)
    finishes = []
    monkeypatch.setattr(rn, "_finish_wide", lambda cp, part, splits, channels, rows, pt, pdtype, lanes:
                        finishes.append((part.shape, splits, channels, lanes)) or ("dgamma", "dbeta"))
    dtype = np.dtype(dtype)
    acc = np.dtype(_dtypes.accumulate_dtype(dtype))
    x, dy, dx = (_fake_device_array(x_shape, dtype) for _ in range(3))
    mean, rstd = (_fake_device_array((x_shape[0],), acc) for _ in range(2))
    rows = rn._Rows(x, 1, "NCHW", (x, dy, dx), 2)
    pt = _dtypes.cuda_type(dtype)
    done = rn._fused_backward(FakeCupy, dy, x, None, mean, rstd, dx, rows, pt, dtype, acc, rms)
    if rows.block * rn._FUSED_ITEMS * rows.vec < rows.M:   # too long a row for the fused kernels
        assert done is None and not captured
        return
    shared_needed = rn._FUSED_STAGES * 2 * rn._FUSED_ITEMS * rows.block * 16
    if rows.vec == 1 or shared_needed > optin - 1024:   # the unpipelined kernel (its occupancy: a GPU)
        assert not any(e.startswith("norm_rows_backward_fused_pipelined") for e in expressions)
        return
    name = expressions[-1].split("<", 1)[0]
    assert name == "norm_rows_backward_fused_pipelined"
    assert done == ("dgamma", "dbeta") and len(captured) == 1 and len(finishes) == 1
    (grid,), (block,), args, shared = captured[0]
    assert block == rows.block and 1 <= grid <= min(rows.rows, 1056)
    assert shared == shared_needed and shared <= optin - 1024
    assert int(expressions[-1].rstrip(">").split(",")[-1]) * dtype.itemsize == 16   # 16-byte slots
    assert (rows.M * dtype.itemsize) % 16 == 0 and all(a.data.ptr % 16 == 0 for a in (x, dy, dx))
    bound, values = _launch_args_by_parameter(expressions[-1], args, acc, ("gamma",))
    assert values["rows"] == x_shape[0] and values["M"] == x_shape[1] and values["rms"] == int(rms)
    assert values["part_dgamma"].shape == (grid, rows.M)
    assert finishes[0] == ((2, grid, rows.M), grid, rows.M, 32)

    # The forward's ring: NORM_STAGES x NORM_FUSED_ITEMS slots a thread (x only).
    captured.clear()
    y = _fake_device_array(x_shape, dtype)
    rows = rn._Rows(x, 1, "NCHW", (x, y), 1)
    assert rn._layer_forward_pipelined(FakeCupy, x, y, None, None, mean, rstd, rows, pt, acc.type(1e-5), rms)
    (grid,), (block,), args, shared = captured[0]
    assert block == rows.block and 1 <= grid <= min(rows.rows, 1056)
    assert shared == rn._FUSED_STAGES * rn._FUSED_ITEMS * block * 16 <= optin - 1024
    assert expressions[-1].startswith("norm_rows_forward_pipelined<")
    _, values = _launch_args_by_parameter(expressions[-1], args, acc, ("gamma", "beta"))
    assert values["rows"] == x_shape[0] and values["M"] == x_shape[1] and values["rms"] == int(rms)


@pytest.mark.parametrize("dtype", _dtypes.SUPPORTED, ids=lambda d: d.name)
@pytest.mark.parametrize("x_shape,groups,offset", [
    ((2, 256, 56, 56), 32, 0), ((3, 8, 2, 4), 2, 0), ((13, 6, 4, 6), 3, 0), ((2, 5, 6, 6), 5, 0),
    ((2, 64, 1, 8), 1, 0), ((2, 8, 7, 7), 2, 0), ((2, 8, 4, 4), 2, 1), ((3, 4, 1, 256), 4, 0),
    ((2, 8, 112, 112), 1, 0)])
@pytest.mark.parametrize("budget", [112 * 1024, 227 * 1024, 28 * 1024])
@pytest.mark.parametrize("cc", [90, 80])
def test_cluster_backward_launch_matches_its_signature_and_shared_memory_layout(
        monkeypatch, dtype, x_shape, groups, offset, budget, cc):
    """CPU: gn_rows_backward_cluster's launch against its C signature (pointer ->
    array of the pointee dtype, scalars of the exact C type), its cluster size
    (the smallest of 1, 2, 4, 8 dividing K whose x and dy shares fit the budget),
    grid (CL blocks a row), block (<= NORM_CLUSTER_THREADS, whole warps) and its
    dynamic shared memory against the kernel's layout: x and dy runs of K / CL *
    S * itemsize bytes (a multiple of 16: one bulk copy each), then 2 max(K /
    CL, warps) slots and K / CL coefficients, within the opt-in less the static
    shared memory.  Below sm_90, planes that are not whole 16-byte vectors
    (7x7) and misaligned data: nothing launched; shares over the budget: the
    largest cluster."""
    from dnnprims import row_normalization as rn
    optin = 232448   # H100: 227 KB
    captured, expressions, FakeCupy = _capture_row_launches(monkeypatch)
    monkeypatch.setattr(rn, "_cluster_facts", lambda cp: (cc, optin))
    monkeypatch.setattr(rn, "_RAISED", {})
    monkeypatch.setattr(rn, "_finish_param_grads", lambda *args: ("dgamma", "dbeta"))
    monkeypatch.setattr(rn, "CLUSTER_BLOCK_BYTES", budget)
    monkeypatch.setattr(rn, "REGISTER_BACKWARD", False)  # the kernel named here
    dtype, acc, (x, dy, dx), mean, rstd, pt = _fake_group_arrays(x_shape, groups, dtype, 3, offset)
    rows = rn._Rows(x, groups, "NCHW", (x, dy, dx), 2, rn._cache_limit(FakeCupy))
    done = rn._cluster_backward(FakeCupy, dy, x, None, mean, rstd, dx, rows, pt, dtype, acc)
    K, S = x_shape[1] // groups, int(np.prod(x_shape[2:]))
    plane = S * dtype.itemsize
    sizes = [c for c in (1, 2, 4, 8) if K % c == 0]
    fits = [c for c in sizes if 2 * K // c * plane <= budget]
    cl = fits[0] if fits else sizes[-1]   # over the budget: the largest cluster, the smallest shares
    if cc < 90 or offset or plane % 16 or 2 * K // cl * plane > optin - rn._CLUSTER_STATIC_BYTES:
        assert done is None and not captured
        return
    assert done == ("dgamma", "dbeta") and len(captured) == 1
    (grid,), (block,), args, shared = captured[0]
    name, inside = expressions[-1].rstrip(">").split("<", 1)
    assert name == "gn_rows_backward_cluster"
    bound, values = _launch_args_by_parameter(expressions[-1], args, acc, ("gamma",))
    assert int(bound["CL"]) == cl and grid == x_shape[0] * groups * cl
    assert block % 32 == 0 and 64 <= block <= 512
    assert (values["K_"], values["S_"], values["G"]) == (K, S, groups)
    kb = K // cl
    run = kb * plane
    assert run % 16 == 0 and 2 * run < 2**20   # bulk copies: 16-byte multiples; the mbarrier tx-count limit
    assert shared == 2 * run + (2 * max(kb, block // 32) + kb) * acc.itemsize
    assert shared <= optin - rn._CLUSTER_STATIC_BYTES
    assert values["part_dgamma"].shape == values["part_dbeta"].shape == (x_shape[0], x_shape[1])
    if x_shape[1:] == (256, 56, 56) and budget == 112 * 1024:   # the benchmark's rows: CL 2 fp32, 1 half types
        assert cl == {4: 2, 2: 1, 8: 4}[dtype.itemsize]


@pytest.mark.parametrize("dtype", _dtypes.SUPPORTED, ids=lambda d: d.name)
@pytest.mark.parametrize("x_shape,groups,offset", [
    ((2, 256, 56, 56), 32, 0), ((3, 8, 2, 4), 2, 0), ((13, 6, 16, 24), 3, 0), ((2, 5, 40, 40), 5, 0),
    ((2, 8, 7, 7), 2, 0), ((2, 8, 16, 16), 2, 1), ((3, 4, 1, 256), 4, 0), ((2, 8, 112, 112), 1, 0),
    ((2, 640, 40, 40), 32, 0), ((2, 4, 256, 256), 2, 0), ((1024, 128, 16, 16), 32, 0)])
@pytest.mark.parametrize("budget,items,min_row", [(28 * 1024, 4, 0), (28 * 1024, 8, 8 * 1024), (56 * 1024, 8, 0)])
@pytest.mark.parametrize("cc", [90, 80])
def test_register_backward_launch_matches_its_signature(monkeypatch, dtype, x_shape, groups, offset, budget, items,
                                                        min_row, cc):
    """CPU: gn_rows_backward_registers' launch against its C signature (pointer ->
    array of the pointee dtype, scalars of the exact C type), its cluster size
    (the smallest of 1, 2, 4, 8 dividing K whose x and dy shares fit the budget,
    else the largest; then larger while the block exceeds 512 threads), ITEMS
    (the switch's, else the other; 4 where a plane has <= 128 vectors), threads a
    plane (whole warps holding the plane in at most ITEMS vectors a thread) and
    block (K / CL planes of them, <= NORM_CLUSTER_THREADS, so warp 0 has a lane
    a plane), grid (CL blocks a row), no dynamic shared memory, the wide finish
    with 8 split lanes (32 over 256 samples).  Nothing launched below sm_90, for
    planes that are not whole 16-byte vectors (7x7) or under 32 of them,
    misaligned data, rows under the minimum, or planes no block holds (256x256
    fp32 and wider: 4096+ vectors)."""
    from dnnprims import row_normalization as rn
    captured, expressions, FakeCupy = _capture_row_launches(monkeypatch)
    monkeypatch.setattr(rn, "_cluster_facts", lambda cp: (cc, 232448))
    finishes = []
    monkeypatch.setattr(rn, "_finish_wide", lambda cp, part, splits, channels, rows, pt, pdtype, lanes:
                        finishes.append((part.shape, splits, channels, pt, lanes)) or ("dgamma", "dbeta"))
    monkeypatch.setattr(rn, "REGISTER_BACKWARD_BYTES", budget)
    monkeypatch.setattr(rn, "REGISTER_BACKWARD_ITEMS", items)
    monkeypatch.setattr(rn, "REGISTER_BACKWARD_MIN_ROW_BYTES", min_row)
    monkeypatch.setattr(rn, "REGISTER_BACKWARD_WIDE_FINISH", True)
    dtype, acc, (x, dy, dx), mean, rstd, pt = _fake_group_arrays(x_shape, groups, dtype, 3, offset)
    rows = rn._Rows(x, groups, "NCHW", (x, dy, dx), 2, rn._cache_limit(FakeCupy))
    done = rn._register_backward(FakeCupy, dy, x, None, mean, rstd, dx, rows, pt, dtype, acc)
    K, S = x_shape[1] // groups, int(np.prod(x_shape[2:]))
    plane = S * dtype.itemsize
    pv = plane // 16
    sizes = [c for c in (1, 2, 4, 8) if K % c == 0]
    fits = [c for c in sizes if 2 * K // c * plane <= budget]
    cl0 = fits[0] if fits else sizes[-1]
    shape = None
    for n in ((4,) if pv <= 128 else (items, 12 - items)):   # the switch's ITEMS, then the other
        tpp = 32 * -(-(-(-pv // n)) // 32)
        fit = [c for c in sizes if c >= cl0 and K // c * tpp <= 512]
        if fit:
            shape = (fit[0], n, tpp, K // fit[0] * tpp)
            break
    if (cc < 90 or offset or plane % 16 or pv < 32 or 2 * K * plane < min_row or shape is None):
        assert done is None and not captured, (shape, captured)
        return
    assert done == ("dgamma", "dbeta") and len(captured) == 1
    (grid,), (block,), args, shared = captured[0]
    name, inside = expressions[-1].rstrip(">").split("<", 1)
    assert name == "gn_rows_backward_registers" and shared == 0
    bound, values = _launch_args_by_parameter(expressions[-1], args, acc, ("gamma",))
    cl, n, tpp, threads = shape
    assert (int(bound["CL"]), int(bound["ITEMS"])) == (cl, n) and grid == x_shape[0] * groups * cl
    assert block == threads and block % 32 == 0 and tpp % 32 == 0 and block <= 512 and K // cl <= 32
    assert tpp * n >= pv > (tpp - 32) * n   # whole warps a plane, the fewest that hold it
    assert (values["K_"], values["S_"], values["G"], values["tpp"]) == (K, S, groups, tpp)
    assert values["part_dgamma"].shape == values["part_dbeta"].shape == (x_shape[0], x_shape[1])
    assert finishes == [((2, x_shape[0], x_shape[1]), x_shape[0], x_shape[1], pt, 8 if x_shape[0] <= 256 else 32)]
    if x_shape[1:] == (256, 56, 56) and budget == 28 * 1024:   # the benchmark's rows
        assert (cl, n, block) == {4: (8, items, {4: 224, 8: 128}[items]), 2: (4, items, {4: 256, 8: 128}[items]),
                                  8: (8, items, {4: 416, 8: 224}[items])}[dtype.itemsize]


def test_register_backward_switch_takes_a_bool_or_storage_types(monkeypatch):
    """CPU: REGISTER_BACKWARD True / False, or a tuple of storage types (those only);
    an ITEMS the kernel was not compiled for is refused."""
    from dnnprims import row_normalization as rn
    for switch, on in ((True, set(rn._X_TYPES)), (False, set()), (("float",), {"float"}), ((), set())):
        monkeypatch.setattr(rn, "REGISTER_BACKWARD", switch)
        assert {t for t in rn._X_TYPES if rn._register_backward_on(t)} == on, switch
    monkeypatch.setattr(rn, "REGISTER_BACKWARD_ITEMS", 6)
    rows = type("Rows", (), {"K": 8, "S": 3136})()
    with pytest.raises(ValueError, match="REGISTER_BACKWARD_ITEMS"):
        rn._register_shape(rows, 4)


@pytest.mark.parametrize("dtype", _dtypes.SUPPORTED, ids=lambda d: d.name)
@pytest.mark.parametrize("x_shape,groups,offset", [
    ((2, 256, 56, 56), 32, 0), ((3, 8, 2, 4), 2, 0), ((13, 6, 4, 6), 3, 0), ((2, 5, 6, 6), 5, 0),
    ((2, 64, 1, 8), 1, 0), ((2, 8, 7, 7), 2, 0), ((2, 8, 4, 4), 2, 1), ((3, 4, 1, 256), 4, 0),
    ((2, 8, 112, 112), 1, 0), ((2, 640, 40, 40), 32, 0)])
@pytest.mark.parametrize("budget,items", [(16 * 1024, 8), (32 * 1024, 4), (7 * 1024, 8)])
@pytest.mark.parametrize("cc", [90, 80])
def test_cluster_forward_launch_matches_its_signature_and_shared_memory_layout(
        monkeypatch, dtype, x_shape, groups, offset, budget, items, cc):
    """CPU: gn_rows_forward_cluster's launch against its C signature (pointer ->
    array of the pointee dtype, scalars of the exact C type), its cluster size
    (the smallest of 1, 2, 4, 8 dividing K whose x share fits the budget, else
    the largest), grid (CL blocks a row), block (a power of two >= the share's
    vectors / CLUSTER_FORWARD_ITEMS in [64, 512]) and its dynamic shared memory
    against the kernel's layout: an x run of K / CL * S * itemsize bytes (a
    multiple of 16: one bulk copy, under the mbarrier tx-count limit), then 2 K /
    CL values (gamma, beta), within the opt-in less the static shared memory.
    Below sm_90, planes that are not whole 16-byte vectors (7x7) and misaligned
    data: nothing launched."""
    from dnnprims import row_normalization as rn
    optin = 232448   # H100: 227 KB
    captured, expressions, FakeCupy = _capture_row_launches(monkeypatch)
    monkeypatch.setattr(rn, "_cluster_facts", lambda cp: (cc, optin))
    monkeypatch.setattr(rn, "_RAISED", {})
    monkeypatch.setattr(rn, "CLUSTER_FORWARD_BYTES", budget)
    monkeypatch.setattr(rn, "CLUSTER_FORWARD_ITEMS", items)
    monkeypatch.setattr(rn, "CLUSTER_FORWARD_MIN_ROW_BYTES", 0)
    dtype, acc, (x, y), mean, rstd, pt = _fake_group_arrays(x_shape, groups, dtype, 2, offset)
    rows = rn._Rows(x, groups, "NCHW", (x, y), 1)
    real = np.float32 if acc == np.float32 else np.float64
    done = rn._cluster_forward(FakeCupy, x, y, None, None, mean, rstd, rows, pt, real(1e-5))
    K, S = x_shape[1] // groups, int(np.prod(x_shape[2:]))
    plane = S * dtype.itemsize
    sizes = [c for c in (1, 2, 4, 8) if K % c == 0]
    fits = [c for c in sizes if K // c * plane <= budget]
    cl = fits[0] if fits else sizes[-1]   # over the budget: the largest cluster, the smallest share
    if cc < 90 or offset or plane % 16 or S < 2 or K // cl * plane > optin - rn._CLUSTER_STATIC_BYTES:
        assert done is False and not captured
        return
    assert done is True and len(captured) == 1
    (grid,), (block,), args, shared = captured[0]
    name, inside = expressions[-1].rstrip(">").split("<", 1)
    assert name == "gn_rows_forward_cluster"
    assert expressions[-1] in rn.FAMILY.name_expressions
    bound, values = _launch_args_by_parameter(expressions[-1], args, acc, ("gamma", "beta"))
    assert int(bound["CL"]) == cl and grid == x_shape[0] * groups * cl
    kb = K // cl
    run = kb * plane
    vectors = run // 16
    assert block % 32 == 0 and 64 <= block <= 512 and block & (block - 1) == 0
    assert block == 512 or block * items >= vectors and (block == 64 or block // 2 * items < vectors)
    assert (values["K_"], values["S_"], values["G"]) == (K, S, groups)
    assert values["x"] is x and values["y"] is y and values["mean_out"] is mean and values["rstd_out"] is rstd
    assert run % 16 == 0 and run < 2**20   # the bulk copy: 16-byte multiples; the mbarrier tx-count limit
    assert shared == run + 2 * kb * acc.itemsize
    assert shared <= optin - rn._CLUSTER_STATIC_BYTES
    if x_shape[1:] == (256, 56, 56) and budget == 16 * 1024:   # the benchmark's rows: 12.5 KB blocks, 128 threads
        assert cl == {4: 8, 2: 4, 8: 8}[dtype.itemsize]
        assert block == 128 if dtype.itemsize < 8 else 256


def test_cluster_forward_switch_takes_a_bool_or_storage_types(monkeypatch):
    """CPU: CLUSTER_FORWARD True / False, or a tuple of storage types (those only)."""
    from dnnprims import row_normalization as rn
    for switch, on in ((True, set(rn._X_TYPES)), (False, set()), (("half_t", "bfloat16_t"), {"half_t", "bfloat16_t"}),
                       ((), set())):
        monkeypatch.setattr(rn, "CLUSTER_FORWARD", switch)
        assert {t for t in rn._X_TYPES if rn._cluster_forward_on(t)} == on, switch


def test_shared_memory_opt_in_counts_the_static_bytes(monkeypatch):
    """CPU (review8a): without opting in a block has 48 KB of shared memory for
    static and dynamic together, so dynamic bytes just under 48 KB plus a
    kernel's static bytes (gn_rows_backward_cluster: mbarrier and shares) need
    the opt-in too; before the fix only dynamic bytes above 48 KB opted in.  The
    limit is only ever raised."""
    from dnnprims import row_normalization as rn
    monkeypatch.setattr(rn, "_RAISED", {})
    kernel = type("Kernel", (), {})()
    rn._raise_shared(kernel, (0, "k"), 48 * 1024 - 16)
    assert kernel.max_dynamic_shared_size_bytes == 48 * 1024 - 16
    rn._raise_shared(kernel, (0, "k"), 40 * 1024)     # a smaller launch later: the limit stays
    assert kernel.max_dynamic_shared_size_bytes == 48 * 1024 - 16
    small = type("Kernel", (), {})()
    rn._raise_shared(small, (0, "small"), 16 * 1024)  # far below the default: nothing to do
    assert not hasattr(small, "max_dynamic_shared_size_bytes")


# ---------------------------------------------------------------------- review6g: the user's side (CPU)

def test_backward_accepts_none_for_a_zero_output_gradient(xp, rng):
    """The README's rule for every backward function: dy=None is a zero gradient (these
    raised AttributeError); the other arguments are still checked."""
    x = xp.asarray(random_array(rng, (2, 3, 4), np.float32))
    gamma = xp.ones(3, np.float32)
    rm, rv = xp.zeros(3, np.float32), xp.ones(3, np.float32)
    calls = {
        "layer_norm": (layer_norm_backward(None, x, 4), ((2, 3, 4), (4,), (4,))),
        "rms_norm": (rms_norm_backward(None, x, (3, 4)), ((2, 3, 4), (3, 4))),
        "group_norm": (group_norm_backward(None, x, 3, gamma), ((2, 3, 4), (3,), (3,))),
        "instance_norm": (instance_norm_backward(None, x, gamma), ((2, 3, 4), (3,), (3,))),
        "instance_norm running": (instance_norm_backward(None, x, gamma, running_mean=rm, running_var=rv,
                                                         use_input_stats=False), ((2, 3, 4), (3,), (3,))),
    }
    for name, (got, shapes) in calls.items():
        assert tuple(g.shape for g in got) == shapes, name
        assert all(g.dtype == np.float32 and not _host(g).any() for g in got), name
    with pytest.raises(ValueError, match="mean was given without rstd"):
        layer_norm_backward(None, x, 4, mean=xp.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="num_groups"):
        group_norm_backward(None, x, 2)


def test_instance_norm_read_only_running_statistics_are_refused_before_either_is_updated():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    rm, rv = np.zeros(3, np.float32), np.ones(3, np.float32)
    rv.flags.writeable = False
    with pytest.raises(ValueError, match="running_var is read-only"):
        instance_norm(x, running_mean=rm, running_var=rv)
    assert not rm.any()  # (the old code had updated running_mean, then failed on running_var)
    # Without input statistics nothing is written: read-only statistics are fine.
    rm.flags.writeable = False
    instance_norm(x, running_mean=rm, running_var=rv, use_input_stats=False)


@pytest.mark.parametrize("call,error,match", [
    (lambda x: instance_norm_backward(x, x, use_input_stats="no"), TypeError, "use_input_stats"),
    (lambda x: instance_norm_backward(x, x, running_mean=np.zeros(4, np.float32),
                                      running_var=np.ones(4, np.float32)), ValueError, "running_mean must have shape"),
    (lambda x: instance_norm_backward(x, x, running_mean=np.zeros(3, np.float32)), ValueError,
     "running_mean was given without running_var"),
    (lambda x: instance_norm_backward(x, x, running_mean=np.zeros(3), running_var=np.ones(3)), TypeError,
     "running_mean"),
    (lambda x: layer_norm(x, 4, return_stats="no"), TypeError, "return_stats"),
    (lambda x: rms_norm(x, 4, return_stats=None), TypeError, "return_stats"),
    (lambda x: group_norm(x, 3, return_stats=1), TypeError, "return_stats"),
    (lambda x: instance_norm(x, return_stats="no"), TypeError, "return_stats"),
    (lambda x: layer_norm(None, 4), TypeError, "x must be a numpy.ndarray or cupy.ndarray, got None"),
    (lambda x: rms_norm_backward(x, None, 4), TypeError, "x must be a numpy.ndarray or cupy.ndarray, got None"),
    (lambda x: group_norm(None, 1), TypeError, "x must be a numpy.ndarray or cupy.ndarray, got None"),
    (lambda x: instance_norm_backward(x, None), TypeError, "x must be a numpy.ndarray or cupy.ndarray, got None"),
])
def test_bad_inputs_review6g(call, error, match):
    """Refused as the forward refuses them (these were accepted, or raised AttributeError)."""
    x = np.ones((2, 3, 4), np.float32)
    with pytest.raises(error, match=match):
        call(x)


@pytest.mark.parametrize("layout,shape", [("NCHW", (0, 3, 5)), ("NHWC", (0, 5, 3)), ("NCHW", (2, 3, 0, 4))])
def test_instance_norm_empty_input_with_running_statistics(layout, shape):
    """An empty x leaves the running statistics as they are (as batchnorm does); the
    'more than 1 spatial value' check counted spatial values as x.size // (N * C) = 0
    and refused an empty batch, naming a shape with 5 of them."""
    x = np.ones(shape, np.float32)
    rm, rv = np.full(3, 0.5, np.float32), np.full(3, 2.0, np.float32)
    assert instance_norm(x, running_mean=rm, running_var=rv, layout=layout).shape == shape
    assert (rm == 0.5).all() and (rv == 2.0).all()
    with pytest.raises(ValueError, match="more than 1 spatial value"):
        instance_norm(np.ones((2, 3, 1), np.float32), running_mean=rm, running_var=rv)
