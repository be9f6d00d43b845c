"""LSTM and GRU cells forward and backward: reference checks, GPU vs reference, bad inputs."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from conftest import FLOAT_DTYPES, random_array
from dnnprims.recurrent import gru_cell, gru_cell_backward, lstm_cell, lstm_cell_backward
from dnnprims.reference import recurrent as ref
from dnnprims.testing import assert_close
from dnnprims.testing.gradcheck import numerical_gradient
from dnnprims.testing.strategies import recurrent_cell_problems

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _sig(v):
    return 1 / (1 + np.exp(-v))


def lstm_step(x, h, c, w_ih, w_hh, b_ih, b_hh):
    """nn.LSTMCell written out gate by gate (float64)."""
    H = h.shape[1]

    def gate(k):
        rows = slice(k * H, (k + 1) * H)
        return x @ w_ih[rows].T + b_ih[rows] + h @ w_hh[rows].T + b_hh[rows]

    i, f, g, o = _sig(gate(0)), _sig(gate(1)), np.tanh(gate(2)), _sig(gate(3))
    c1 = f * c + i * g
    return o * np.tanh(c1), c1


def gru_step(x, h, w_ih, w_hh, b_ih, b_hh):
    """nn.GRUCell written out gate by gate (float64)."""
    H = h.shape[1]
    part = lambda w, v, b, k: v @ w[k * H:(k + 1) * H].T + b[k * H:(k + 1) * H]  # noqa: E731
    r = _sig(part(w_ih, x, b_ih, 0) + part(w_hh, h, b_hh, 0))
    z = _sig(part(w_ih, x, b_ih, 1) + part(w_hh, h, b_hh, 1))
    n = np.tanh(part(w_ih, x, b_ih, 2) + r * part(w_hh, h, b_hh, 2))
    return (1 - z) * n + z * h


def make_cell(rng, gates, batch, input_size, hidden, dtype=np.float64, bias=(True, True), state=True):
    """Arrays of one cell problem; batch None gives an unbatched (1-D) step."""
    lead = () if batch is None else (batch,)
    scale = 1 / np.sqrt(hidden)
    arrays = {
        "x": random_array(rng, lead + (input_size,), dtype),
        "h": random_array(rng, lead + (hidden,), dtype) if state else None,
        "c": random_array(rng, lead + (hidden,), dtype) if state else None,
        "w_ih": random_array(rng, (gates * hidden, input_size), dtype, -scale, scale),
        "w_hh": random_array(rng, (gates * hidden, hidden), dtype, -scale, scale),
        "b_ih": random_array(rng, (gates * hidden,), dtype, -scale, scale) if bias[0] else None,
        "b_hh": random_array(rng, (gates * hidden,), dtype, -scale, scale) if bias[1] else None,
    }
    if gates == 3:
        del arrays["c"]
    return arrays


def on(xp, arrays):
    return {k: None if v is None else xp.asarray(v) for k, v in arrays.items()}


def as64(arrays):
    return {k: None if v is None else v.astype(np.float64) for k, v in arrays.items()}


# ---- the reference against plain steps and finite differences -------------------

def test_lstm_matches_plain_step(rng):
    a = make_cell(rng, 4, 3, 5, 4)
    h1, c1 = lstm_cell(**a)
    eh, ec = lstm_step(**a)
    np.testing.assert_allclose(h1, eh, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(c1, ec, rtol=1e-13, atol=1e-14)


def test_gru_matches_plain_step(rng):
    a = make_cell(rng, 3, 3, 5, 4)
    np.testing.assert_allclose(gru_cell(**a), gru_step(**a), rtol=1e-13, atol=1e-14)


def test_none_state_and_bias_mean_zeros(rng):
    a = make_cell(rng, 4, 2, 3, 3, bias=(False, False), state=False)
    zeros_h, zeros_b = np.zeros((2, 3)), np.zeros(12)
    eh, ec = lstm_step(a["x"], zeros_h, zeros_h, a["w_ih"], a["w_hh"], zeros_b, zeros_b)
    h1, c1 = lstm_cell(**a)
    np.testing.assert_allclose(h1, eh, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(c1, ec, rtol=1e-13, atol=1e-14)
    g = make_cell(rng, 3, 2, 3, 3, bias=(False, False), state=False)
    np.testing.assert_allclose(gru_cell(**g), gru_step(g["x"], zeros_h, g["w_ih"], g["w_hh"], zeros_b[:9],
                                                       zeros_b[:9]), rtol=1e-13, atol=1e-14)


def test_lstm_backward_by_finite_differences(rng):
    a = make_cell(rng, 4, 2, 3, 2)
    dh1, dc1 = random_array(rng, (2, 2)), random_array(rng, (2, 2))
    grads = lstm_cell_backward(dh1, dc1, **a)
    loss = lambda: float(np.sum(dh1 * lstm_step(**a)[0]) + np.sum(dc1 * lstm_step(**a)[1]))  # noqa: E731
    for name, g in zip(("x", "h", "c", "w_ih", "w_hh", "b_ih", "b_hh"), grads):
        np.testing.assert_allclose(g, numerical_gradient(loss, a[name]), rtol=1e-6, atol=1e-9, err_msg=name)


def test_gru_backward_by_finite_differences(rng):
    a = make_cell(rng, 3, 2, 3, 2)
    dh1 = random_array(rng, (2, 2))
    grads = gru_cell_backward(dh1, **a)
    loss = lambda: float(np.sum(dh1 * gru_step(**a)))  # noqa: E731
    for name, g in zip(("x", "h", "w_ih", "w_hh", "b_ih", "b_hh"), grads):
        np.testing.assert_allclose(g, numerical_gradient(loss, a[name]), rtol=1e-6, atol=1e-9, err_msg=name)


def _directional_derivative(step, arrays, direction, h=1e-30):
    """J v of ``step`` at ``arrays`` along ``direction`` by the complex step: Im f(a + i h v) / h
    has no subtractive cancellation, so it matches the exact derivative to rounding (the plain
    gate-by-gate steps take complex arrays; the library's backward never sees them)."""
    shifted = {k: a + 1j * h * direction[k] for k, a in arrays.items()}
    out = step(**shifted)
    return tuple(o.imag / h for o in out) if isinstance(out, tuple) else (out.imag / h,)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_backward_is_the_adjoint_of_the_forward_derivative(rng, cell):
    """<dy, J v> == <J^T dy, v> over every input at once, J v from the complex step."""
    gates, step, backward = (4, lstm_step, lstm_cell_backward) if cell == "lstm" else \
        (3, gru_step, gru_cell_backward)
    a = make_cell(rng, gates, 3, 5, 4)
    v = {k: random_array(rng, x.shape) for k, x in a.items()}
    jv = _directional_derivative(step, a, v)
    dys = tuple(random_array(rng, o.shape) for o in jv)
    grads = backward(*dys, **a)
    names = ("x", "h", "c", "w_ih", "w_hh", "b_ih", "b_hh") if cell == "lstm" else \
        ("x", "h", "w_ih", "w_hh", "b_ih", "b_hh")
    lhs = sum(float(np.vdot(dy, o)) for dy, o in zip(dys, jv))
    rhs = sum(float(np.vdot(g, v[k])) for k, g in zip(names, grads))
    scale = sum(float(np.vdot(np.abs(g), np.abs(v[k]))) for k, g in zip(names, grads))
    np.testing.assert_allclose(rhs, lhs, rtol=1e-12, atol=1e-13 * scale)


def test_none_output_gradients_are_zeros(xp, rng):
    a = on(xp, make_cell(rng, 4, 3, 4, 5))
    dh1 = xp.asarray(random_array(rng, (3, 5)))
    only_h = lstm_cell_backward(dh1, None, **a)
    explicit = lstm_cell_backward(dh1, xp.zeros((3, 5)), **a)
    for g, e in zip(only_h, explicit):
        assert_close(g, e.get() if hasattr(e, "get") else e, np.float64)
    for g in lstm_cell_backward(None, None, **a):
        assert not bool((g != 0).any())
    g = on(xp, make_cell(rng, 3, 3, 4, 5))
    for grad in gru_cell_backward(None, **g):
        assert not bool((grad != 0).any())


def test_bias_gradients_none_without_bias(xp, rng):
    a = on(xp, make_cell(rng, 4, 3, 4, 5, bias=(False, True)))
    grads = lstm_cell_backward(xp.ones((3, 5)), None, **a)
    assert grads[5] is None and grads[6].shape == (20,)
    g = on(xp, make_cell(rng, 3, 3, 4, 5, bias=(True, False)))
    grads = gru_cell_backward(xp.ones((3, 5)), **g)
    assert grads[4].shape == (15,) and grads[5] is None


# ---- every path against the float64 reference, in every dtype --------------------

def _as_2d64(a, hidden):
    """float64 2-D copies of a cell's arrays, zeros for a missing state / bias."""
    x = np.atleast_2d(a["x"].astype(np.float64))
    out = {k: (np.zeros((x.shape[0], hidden)) if k in ("h", "c") else np.zeros(a["w_ih"].shape[0]))
           if v is None else np.atleast_2d(v.astype(np.float64)) if k in ("x", "h", "c") else v.astype(np.float64)
           for k, v in a.items()}
    return out


def lstm_magnitudes(dh1, dc1, a):
    """Each output of lstm_cell / lstm_cell_backward computed on the absolute values of
    its terms: a sum that cancels (c1 = f c + i g; dx = dgates @ w_ih) is rounded
    relative to its terms, not to itself, so assert_close(..., magnitude=) takes its
    bound from these (1x1x1 draws cancel often enough to matter)."""
    hidden = a["w_hh"].shape[1]
    v = _as_2d64(a, hidden)
    gate = lambda k: v["x"] @ v["w_ih"][k * hidden:(k + 1) * hidden].T + v["h"] @ v["w_hh"][k * hidden:(k + 1) * hidden].T \
        + v["b_ih"][k * hidden:(k + 1) * hidden] + v["b_hh"][k * hidden:(k + 1) * hidden]  # noqa: E731
    i, f, g, o = _sig(gate(0)), _sig(gate(1)), np.tanh(gate(2)), _sig(gate(3))
    c1 = np.abs(f * v["c"]) + np.abs(i * g)
    tc = np.tanh(f * v["c"] + i * g)
    dh1, dc1 = (np.abs(np.atleast_2d(d.astype(np.float64))) for d in (dh1, dc1))
    dct = dc1 + dh1 * o * (1 - tc * tc)
    dg = np.concatenate([dct * np.abs(g) * i * (1 - i), dct * np.abs(v["c"]) * f * (1 - f),
                         dct * i * (1 - g * g), dh1 * np.abs(tc) * o * (1 - o)], axis=1)
    lead = a["x"].shape[:-1]
    out = {"h1": np.abs(o * tc) + o * c1, "c1": c1, "dx": dg @ np.abs(v["w_ih"]), "dh": dg @ np.abs(v["w_hh"]),
           "dc": dct * f, "dw_ih": dg.T @ np.abs(v["x"]), "dw_hh": dg.T @ np.abs(v["h"]), "db_ih": dg.sum(axis=0)}
    out["db_hh"] = out["db_ih"]
    return {k: m.reshape(lead + m.shape[1:]) if k in ("h1", "c1", "dx", "dh", "dc") else m for k, m in out.items()}


def gru_magnitudes(dh1, a):
    """gru_cell / gru_cell_backward on the absolute values of their terms (as lstm_magnitudes)."""
    hidden = a["w_hh"].shape[1]
    v = _as_2d64(a, hidden)
    gx, gh = v["x"] @ v["w_ih"].T + v["b_ih"], v["h"] @ v["w_hh"].T + v["b_hh"]
    gh_m = np.abs(v["h"]) @ np.abs(v["w_hh"]).T + np.abs(v["b_hh"])
    r = _sig(gx[:, :hidden] + gh[:, :hidden])
    z = _sig(gx[:, hidden:2 * hidden] + gh[:, hidden:2 * hidden])
    n = np.tanh(gx[:, 2 * hidden:] + r * gh[:, 2 * hidden:])
    dh1 = np.abs(np.atleast_2d(dh1.astype(np.float64)))
    dn = dh1 * (1 - z) * (1 - n * n)
    dr = dn * gh_m[:, 2 * hidden:] * r * (1 - r)
    dz = dh1 * (np.abs(v["h"]) + np.abs(n)) * z * (1 - z)
    dgx, dgh = np.concatenate([dr, dz, dn], axis=1), np.concatenate([dr, dz, dn * r], axis=1)
    lead = a["x"].shape[:-1]
    out = {"h1": np.abs((1 - z) * n) + np.abs(z * v["h"]) + (1 - z) * r * gh_m[:, 2 * hidden:],
           "dx": dgx @ np.abs(v["w_ih"]), "dh": dh1 * z + dgh @ np.abs(v["w_hh"]),
           "dw_ih": dgx.T @ np.abs(v["x"]), "dw_hh": dgh.T @ np.abs(v["h"]),
           "db_ih": dgx.sum(axis=0), "db_hh": dgh.sum(axis=0)}
    return {k: m.reshape(lead + m.shape[1:]) if k in ("h1", "dx", "dh") else m for k, m in out.items()}



# (batch, input_size, hidden_size, (b_ih?, b_hh?), states given?); batch None = unbatched.
CASES = [(3, 5, 7, (True, True), True), (1, 1, 1, (True, True), True), (13, 7, 3, (False, False), False),
         (2, 33, 130, (True, False), True), (None, 4, 5, (True, True), True), (0, 3, 4, (True, True), True),
         (4, 6, 9, (False, True), False), (None, 3, 4, (False, False), False), (2, 0, 3, (True, True), True)]
CASE_IDS = ["3x5x7", "1x1x1", "13x7x3-nobias-nostate", "2x33x130", "unbatched", "empty-batch",
            "4x6x9-bhh-only-nostate", "unbatched-nobias-nostate", "no-input"]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_lstm_against_reference(xp, rng, dtype, case):
    batch, input_size, hidden, bias, state = case
    a = make_cell(rng, 4, batch, input_size, hidden, dtype, bias, state)
    lead = () if batch is None else (batch,)
    dh1, dc1 = random_array(rng, lead + (hidden,), dtype), random_array(rng, lead + (hidden,), dtype)
    h1, c1 = lstm_cell(**on(xp, a))
    assert h1.dtype == dtype and h1.shape == lead + (hidden,) and isinstance(h1, xp.ndarray)
    eh, ec = lstm_cell(**as64(a))
    mag = lstm_magnitudes(dh1, dc1, a)
    assert_close(h1, eh, dtype, what="h1", magnitude=mag["h1"])
    assert_close(c1, ec, dtype, what="c1", magnitude=mag["c1"])
    grads = lstm_cell_backward(xp.asarray(dh1), xp.asarray(dc1), **on(xp, a))
    expected = lstm_cell_backward(dh1.astype(np.float64), dc1.astype(np.float64), **as64(a))
    for name, g, e in zip(("dx", "dh", "dc", "dw_ih", "dw_hh", "db_ih", "db_hh"), grads, expected):
        if e is None:
            assert g is None, name
        else:
            assert g.dtype == dtype and g.shape == e.shape, name
            assert_close(g, e, dtype, what=name, magnitude=mag[name])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_gru_against_reference(xp, rng, dtype, case):
    batch, input_size, hidden, bias, state = case
    a = make_cell(rng, 3, batch, input_size, hidden, dtype, bias, state)
    lead = () if batch is None else (batch,)
    dh1 = random_array(rng, lead + (hidden,), dtype)
    h1 = gru_cell(**on(xp, a))
    assert h1.dtype == dtype and h1.shape == lead + (hidden,) and isinstance(h1, xp.ndarray)
    mag = gru_magnitudes(dh1, a)
    assert_close(h1, gru_cell(**as64(a)), dtype, what="h1", magnitude=mag["h1"])
    grads = gru_cell_backward(xp.asarray(dh1), **on(xp, a))
    expected = gru_cell_backward(dh1.astype(np.float64), **as64(a))
    for name, g, e in zip(("dx", "dh", "dw_ih", "dw_hh", "db_ih", "db_hh"), grads, expected):
        if e is None:
            assert g is None, name
        else:
            assert g.dtype == dtype and g.shape == e.shape, name
            assert_close(g, e, dtype, what=name, magnitude=mag[name])


def test_non_contiguous_inputs(xp, rng):
    a = make_cell(rng, 4, 3, 5, 6)
    # Transposed copies (2-D) and every-other-element views (1-D): strided on either path.
    strided = {k: xp.asarray(np.ascontiguousarray(v.T)).T if v.ndim == 2 else xp.asarray(np.repeat(v, 2))[::2]
               for k, v in a.items()}
    assert not strided["x"].flags.c_contiguous
    for g, e in zip(lstm_cell(**strided), lstm_cell(**a)):
        assert_close(g, e, np.float64)
    dh1 = random_array(rng, (3, 6))
    for g, e in zip(lstm_cell_backward(xp.asarray(np.ascontiguousarray(dh1.T)).T, None, **strided), lstm_cell_backward(dh1, None, **a)):
        assert_close(g, e, np.float64)
    gs = {k: v for k, v in strided.items() if k != "c"}
    g64 = {k: v for k, v in a.items() if k != "c"}
    g64["w_ih"], g64["w_hh"], g64["b_ih"], g64["b_hh"] = (g64[k][:18] for k in ("w_ih", "w_hh", "b_ih", "b_hh"))
    gs["w_ih"], gs["w_hh"], gs["b_ih"], gs["b_hh"] = (gs[k][:18] for k in ("w_ih", "w_hh", "b_ih", "b_hh"))
    assert_close(gru_cell(**gs), gru_cell(**g64), np.float64)
    for g, e in zip(gru_cell_backward(xp.asarray(dh1), **gs), gru_cell_backward(dh1, **g64)):
        assert_close(g, e, np.float64)


@SETTINGS
@given(problem=recurrent_cell_problems())
def test_hypothesis_sizes_against_plain_steps(xp, problem):
    rng = np.random.default_rng(problem["input_size"] * 100 + problem["hidden_size"])
    batch, input_size, hidden = problem["batch"], problem["input_size"], problem["hidden_size"]
    bias, state = (problem["bias_ih"], problem["bias_hh"]), problem["initial_state"]
    a = make_cell(rng, 4, batch, input_size, hidden, np.float32, bias, state)
    full = {k: (np.zeros((batch or 1, hidden)) if k in ("h", "c") else np.zeros(4 * hidden)) if v is None
            else np.atleast_2d(v.astype(np.float64)) if k in ("x", "h", "c") else v.astype(np.float64)
            for k, v in a.items()}
    h1, c1 = lstm_cell(**on(xp, a))
    eh, ec = lstm_step(**full)
    shape = eh.shape if batch is not None else eh.shape[1:]
    assert_close(h1, eh.reshape(shape), np.float32, what="h1")
    assert_close(c1, ec.reshape(shape), np.float32, what="c1")
    g = {k: v for k, v in a.items() if k != "c"}
    for k in ("w_ih", "w_hh", "b_ih", "b_hh"):
        g[k] = None if g[k] is None else g[k][:3 * hidden]
    gfull = {k: (v if k in ("x", "h") else v[:3 * hidden]) for k, v in full.items() if k != "c"}
    assert_close(gru_cell(**on(xp, g)), gru_step(**gfull).reshape(shape), np.float32, what="gru h1")


# ---- bad inputs --------------------------------------------------------------

def lstm_args(rng, **changes):
    a = make_cell(rng, 4, 2, 3, 4)
    a.update(changes)
    return a


def test_bad_w_hh_shape(rng):
    with pytest.raises(ValueError, match=r"w_hh must have shape \(16, 4\)"):
        lstm_cell(**lstm_args(rng, w_hh=np.ones((12, 4))))
    with pytest.raises(ValueError, match="w_hh must be 2-D"):
        lstm_cell(**lstm_args(rng, w_hh=np.ones(16)))
    g = make_cell(rng, 4, 2, 3, 4)  # LSTM weights given to a GRU
    del g["c"]
    with pytest.raises(ValueError, match=r"w_hh must have shape \(12, 4\)"):
        gru_cell(**g)


def test_bad_w_ih_shape(rng):
    with pytest.raises(ValueError, match=r"w_ih must have shape \(16, 3\)"):
        lstm_cell(**lstm_args(rng, w_ih=np.ones((16, 5))))
    with pytest.raises(ValueError, match="w_ih must be 2-D"):
        gru_cell_backward(None, np.ones((2, 3)), None, np.ones((12, 3, 1)), np.ones((12, 4)))


def test_bad_state_shapes(rng):
    with pytest.raises(ValueError, match=r"h must have shape \(2, 4\)"):
        lstm_cell(**lstm_args(rng, h=np.ones((3, 4))))
    with pytest.raises(ValueError, match=r"c must have shape \(2, 4\)"):
        lstm_cell(**lstm_args(rng, c=np.ones((2, 5))))
    with pytest.raises(ValueError, match=r"dh1 must have shape \(2, 4\)"):
        lstm_cell_backward(np.ones((2, 3)), None, **lstm_args(rng))
    with pytest.raises(ValueError, match=r"dc1 must have shape \(2, 4\)"):
        lstm_cell_backward(None, np.ones(4), **lstm_args(rng))


def test_bad_bias_shapes(rng):
    with pytest.raises(ValueError, match=r"b_ih must have shape \(16,\)"):
        lstm_cell(**lstm_args(rng, b_ih=np.ones(4)))
    with pytest.raises(ValueError, match=r"b_hh must have shape \(16,\)"):
        lstm_cell(**lstm_args(rng, b_hh=np.ones((1, 16))))


def test_bad_x_ndim(rng):
    with pytest.raises(ValueError, match="x must be 2-D"):
        lstm_cell(**lstm_args(rng, x=np.ones((1, 2, 3))))


def test_mismatched_dtypes(rng):
    with pytest.raises(TypeError, match="w_ih has dtype float32 but x has dtype float64"):
        lstm_cell(**lstm_args(rng, w_ih=np.ones((16, 3), np.float32)))
    with pytest.raises(TypeError, match="must have a floating dtype"):
        lstm_cell(**lstm_args(rng, h=np.ones((2, 4), np.int32)))


def test_missing_weights(rng):
    with pytest.raises(TypeError, match="w_hh must be an array"):
        lstm_cell(**lstm_args(rng, w_hh=None))


def test_mixing_numpy_and_cupy(gpu, rng):
    a = lstm_args(rng)
    a["h"] = gpu.asarray(a["h"])
    with pytest.raises(TypeError, match="cannot mix NumPy and CuPy arrays"):
        lstm_cell(**a)
