"""Every public function against PyTorch, the semantics the library promises.

PyTorch is an optional oracle: tests/conftest.py leaves this file uncollected
where torch is not installed.  Problems are drawn here from a fixed seed (odd
sizes, asymmetric stride/padding/dilation, groups, depthwise, NHWC, ...), not
taken from the other test files.  Each test body runs on both paths through
the ``xp`` fixture: NumPy arrays against CPU torch, CuPy arrays against CUDA
torch (through DLPack; through the host where torch has no CUDA).

PyTorch always computes in float64, from our inputs as they are stored, so it
is the float64 reference for both dtypes checked: float64 results must agree
to 1e-10 of the largest reference value or of 1 (elementwise), float32 results within the
tolerance table (``dnnprims.testing.assert_close``).  Gradients come from
torch's autograd, never from our formulas.
"""
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import dnnprims as dp
from dnnprims import algos
from dnnprims.testing.tolerances import assert_close, tolerance

DTYPES = [pytest.param(np.float64, id="float64"), pytest.param(np.float32, id="float32")]
FLOAT64_BOUND = 1e-10


# ---------------------------------------------------------------------- conversions

def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


# The oracle is always float64 torch on the CPU, for both of our paths.  Torch's
# CUDA kernels are not a safe oracle: on the H100 (torch 2.11, 2026-11-23),
# avg_pool2d backward on a channels-last (NHWC) input gave dx off by up to 0.8
# where torch's CPU path, our NumPy reference and our GPU kernel all agree
# (notes/probe_avgpool_nhwc.py).
def _torch_device(xp):
    return "cpu"


def _t(a, grad=False):
    """A float64 torch tensor of an array of ours (None stays None)."""
    if a is None:
        return None
    t = torch.from_numpy(np.array(_host(a), dtype=np.float64))
    return t.requires_grad_(grad)


def _seed(*parts):
    """A reproducible seed from a case's description (hash() of str varies by process)."""
    return zlib.crc32(repr(parts).encode())


def _draw(xp, rng, shape, dtype, scale=1.0):
    """Fresh random data in storage dtype on the xp path (never zeros)."""
    return xp.asarray((rng.standard_normal(shape) * scale).astype(dtype))


def check(ours, expected, dtype, what):
    """ours (our dtype) against torch's float64 result."""
    assert ours is not None, f"{what}: got None"
    if isinstance(expected, torch.Tensor):
        expected = expected.detach().cpu().numpy()
    got = _host(ours)
    assert got.dtype == np.dtype(dtype), f"{what}: dtype {got.dtype}, expected {np.dtype(dtype)}"
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != torch's {expected.shape}"
    if np.dtype(dtype) == np.float64:
        if got.size == 0:
            return
        worst = np.max(np.abs(got - expected))
        # a floor of 1, the size of the inputs here: results that are pure cancellation
        # (a softmax gradient where y saturates) are only good to eps * |inputs|
        scale = max(1.0, float(np.max(np.abs(expected))))
        assert worst <= FLOAT64_BOUND * scale, (
            f"{what}: worst error {worst:.3g} against torch exceeds {FLOAT64_BOUND:g} x {scale:.3g}")
    else:
        assert_close(got, expected, dtype, what=what)


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _pair_or_int(rng, pair):
    """Pass an int where both entries agree, half of the time (both spellings are API)."""
    return pair[0] if pair[0] == pair[1] and rng.random() < 0.5 else pair


# ---------------------------------------------------------------------- convolution

def _conv_cases(count, seed):
    rng = np.random.default_rng(seed)
    cases = []
    while len(cases) < count:
        kind = rng.choice(["plain", "plain", "grouped", "depthwise"])
        if kind == "depthwise":
            c = int(rng.integers(2, 7))
            groups, k = c, c * int(rng.integers(1, 3))
        else:
            groups = 1 if kind == "plain" else int(rng.integers(2, 4))
            c = groups * int(rng.integers(1, 4))
            k = groups * int(rng.integers(1, 4))
        r, s = (int(v) for v in rng.integers(1, 5, size=2))
        stride = tuple(int(v) for v in rng.integers(1, 4, size=2))
        padding = tuple(int(v) for v in rng.integers(0, 4, size=2))
        dilation = tuple(int(v) for v in rng.integers(1, 4, size=2))
        h, w = (int(v) for v in rng.integers(1, 14, size=2))
        if dilation[0] * (r - 1) + 1 > h + 2 * padding[0] or dilation[1] * (s - 1) + 1 > w + 2 * padding[1]:
            continue
        cases.append(dict(n=int(rng.integers(1, 4)), c=c, h=h, w=w, k=k, r=r, s=s,
                          stride=_pair_or_int(rng, stride), padding=_pair_or_int(rng, padding),
                          dilation=_pair_or_int(rng, dilation), groups=groups,
                          layout=str(rng.choice(["NCHW", "NHWC"])), bias=bool(rng.random() < 0.6)))
    return cases


CONV_CASES = _conv_cases(14, seed=20240601)


def _conv_id(p):
    return (f"{p['layout']}-n{p['n']}c{p['c']}h{p['h']}w{p['w']}-k{p['k']}r{p['r']}s{p['s']}"
            f"-st{p['stride']}-pad{p['padding']}-dil{p['dilation']}-g{p['groups']}"
            f"{'-bias' if p['bias'] else ''}").replace(" ", "")


def _algos_for(xp, problem, direction):
    """"auto" on NumPy (the reference runs whatever is chosen); on CuPy every
    registered algorithm that supports the problem as well."""
    if xp is np:
        return ["auto"]
    return ["auto"] + [name for name, a in algos.REGISTRY.items() if a.supports(problem, direction)[0]]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", CONV_CASES, ids=_conv_id)
def test_conv2d_matches_torch(xp, dtype, p):
    rng = np.random.default_rng(_seed(_conv_id(p)))
    nchw = p["layout"] == "NCHW"
    x_shape = (p["n"], p["c"], p["h"], p["w"]) if nchw else (p["n"], p["h"], p["w"], p["c"])
    w_shape = (p["k"], p["c"] // p["groups"], p["r"], p["s"])
    options = dict(stride=p["stride"], padding=p["padding"], dilation=p["dilation"],
                   groups=p["groups"], layout=p["layout"])
    x = _draw(xp, rng, x_shape, dtype)
    w = _draw(xp, rng, w_shape, dtype)
    b = _draw(xp, rng, (p["k"],), dtype) if p["bias"] else None

    xt, wt, bt = _t(x, True), _t(w, True), _t(b, True)
    yt = F.conv2d(xt if nchw else xt.permute(0, 3, 1, 2), wt, bt, stride=p["stride"],
                  padding=p["padding"], dilation=p["dilation"], groups=p["groups"])
    yt = yt if nchw else yt.permute(0, 2, 3, 1)
    dy = _draw(xp, rng, tuple(yt.shape), dtype)
    yt.backward(_t(dy))

    assert dp.conv2d_output_shape(x_shape, w_shape, **options) == tuple(yt.shape)
    problem = dp.ConvProblem(N=p["n"], C=p["c"], H=p["h"], W=p["w"], K=p["k"], R=p["r"], S=p["s"],
                             P=yt.shape[2 if nchw else 1], Q=yt.shape[3 if nchw else 2],
                             stride=_pair(p["stride"]), padding=_pair(p["padding"]),
                             dilation=_pair(p["dilation"]), groups=p["groups"], layout=p["layout"],
                             dtype=np.dtype(dtype).name)
    for algo in _algos_for(xp, problem, "forward"):
        check(dp.conv2d_forward(x, w, b, algo=algo, **options), yt, dtype, f"y ({algo})")
    for algo in _algos_for(xp, problem, "backward_data"):
        check(dp.conv2d_backward_data(dy, w, x_shape, algo=algo, **options), xt.grad, dtype,
              f"dx ({algo})")
    for algo in _algos_for(xp, problem, "backward_filter"):
        check(dp.conv2d_backward_filter(x, dy, w_shape, algo=algo, **options), wt.grad, dtype,
              f"dw ({algo})")
    if p["bias"]:
        check(dp.conv2d_backward_bias(dy, layout=p["layout"]), bt.grad, dtype, "db")


# ---------------------------------------------------------------------- pooling

def _pool_cases(count, seed):
    rng = np.random.default_rng(seed)
    cases = []
    while len(cases) < count:
        window = tuple(int(v) for v in rng.integers(1, 5, size=2))
        padding = tuple(int(rng.integers(0, k // 2 + 1)) for k in window)
        # stride below the window overlaps windows; above it skips input
        stride = None if rng.random() < 0.2 else tuple(int(v) for v in rng.integers(1, 4, size=2))
        h, w = (int(v) for v in rng.integers(1, 14, size=2))
        if h + 2 * padding[0] < window[0] or w + 2 * padding[1] < window[1]:
            continue
        cases.append(dict(n=int(rng.integers(1, 3)), c=int(rng.integers(1, 5)), h=h, w=w,
                          window=_pair_or_int(rng, window),
                          stride=stride if stride is None else _pair_or_int(rng, stride),
                          padding=_pair_or_int(rng, padding), layout=str(rng.choice(["NCHW", "NHWC"]))))
    # always: overlapping max windows with padding, and padding that changes the average's divisor
    cases.append(dict(n=2, c=3, h=9, w=8, window=3, stride=(1, 2), padding=1, layout="NHWC"))
    cases.append(dict(n=1, c=2, h=7, w=11, window=(4, 2), stride=(3, 1), padding=(2, 1), layout="NCHW"))
    return cases


POOL_CASES = _pool_cases(10, seed=777)


def _pool_id(p):
    return (f"{p['layout']}-n{p['n']}c{p['c']}h{p['h']}w{p['w']}-k{p['window']}-st{p['stride']}"
            f"-pad{p['padding']}").replace(" ", "")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode, count_include_pad",
                         [("max", True), ("avg", True), ("avg", False)], ids=["max", "avg-incl", "avg-excl"])
@pytest.mark.parametrize("p", POOL_CASES, ids=_pool_id)
def test_pool_matches_torch(xp, dtype, mode, count_include_pad, p):
    rng = np.random.default_rng(_seed(_pool_id(p)))
    nchw = p["layout"] == "NCHW"
    x_shape = (p["n"], p["c"], p["h"], p["w"]) if nchw else (p["n"], p["h"], p["w"], p["c"])
    options = dict(mode=mode, stride=p["stride"], padding=p["padding"],
                   count_include_pad=count_include_pad, layout=p["layout"])
    x = _draw(xp, rng, x_shape, dtype)
    xt = _t(x, True)
    x4 = xt if nchw else xt.permute(0, 3, 1, 2)
    if mode == "max":
        yt = F.max_pool2d(x4, p["window"], p["stride"], p["padding"])
    else:
        yt = F.avg_pool2d(x4, p["window"], p["stride"], p["padding"], count_include_pad=count_include_pad)
    yt = yt if nchw else yt.permute(0, 2, 3, 1)
    dy = _draw(xp, rng, tuple(yt.shape), dtype)
    yt.backward(_t(dy))

    y = dp.pool(x, p["window"], **options)
    check(y, yt, dtype, "y")
    check(dp.pool_backward(dy, x, y, p["window"], **options), xt.grad, dtype, "dx")


# ---------------------------------------------------------------------- batch normalization

def _bn_cases(count, seed):
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(count):
        ndim = int(rng.integers(2, 6))
        c = int(rng.integers(1, 6))
        spatial = [int(v) for v in rng.integers(1, 6, size=ndim - 2)]
        n = int(rng.integers(1, 4))
        # training needs 2 values per channel; with exactly 2, dx is pure cancellation
        # (xhat = +-1 makes it vanish but for eps), so no relative bound holds in float32
        while n * int(np.prod(spatial)) < 4:
            n += 1
        layout = str(rng.choice(["NCHW", "NHWC"]))
        shape = (n, c, *spatial) if layout == "NCHW" else (n, *spatial, c)
        cases.append(dict(shape=shape, layout=layout, affine=bool(rng.random() < 0.7),
                          momentum=float(np.round(rng.uniform(0.05, 0.9), 3)),
                          eps=float(rng.choice([1e-5, 1e-3, 0.1]))))
    return cases


BN_CASES = _bn_cases(8, seed=31337)


def _bn_id(p):
    return (f"{p['layout']}-{'x'.join(map(str, p['shape']))}-{'affine' if p['affine'] else 'plain'}"
            f"-m{p['momentum']}-eps{p['eps']}")


def _channels_first(t, layout):
    return t if layout == "NCHW" else t.movedim(-1, 1)


def _channels_back(t, layout):
    return t if layout == "NCHW" else t.movedim(1, -1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", BN_CASES, ids=_bn_id)
def test_batchnorm_training_matches_torch(xp, dtype, p):
    rng = np.random.default_rng(_seed(_bn_id(p)))
    layout = p["layout"]
    c = p["shape"][1] if layout == "NCHW" else p["shape"][-1]
    x = _draw(xp, rng, p["shape"], dtype, scale=3.0) + xp.asarray(np.asarray(1.5, dtype))
    gamma = _draw(xp, rng, (c,), dtype) if p["affine"] else None
    beta = _draw(xp, rng, (c,), dtype) if p["affine"] else None
    running_mean = _draw(xp, rng, (c,), dtype)
    running_var = xp.asarray(rng.uniform(0.5, 2.0, c).astype(dtype))
    rm_t, rv_t = _t(running_mean), _t(running_var)
    # dgamma and dbeta exist without affine parameters too: torch's with gamma=1, beta=0
    gt = _t(gamma, True) if p["affine"] else torch.ones(c, dtype=torch.float64, requires_grad=True)
    bt = _t(beta, True) if p["affine"] else torch.zeros(c, dtype=torch.float64, requires_grad=True)
    gt, bt = gt.detach().to(rm_t.device).requires_grad_(), bt.detach().to(rm_t.device).requires_grad_()
    xt = _t(x, True)
    yt, mean_t, invstd_t = torch.native_batch_norm(_channels_first(xt, layout), gt, bt, rm_t, rv_t,
                                                   True, p["momentum"], p["eps"])
    yt = _channels_back(yt, layout)
    dy = _draw(xp, rng, p["shape"], dtype)
    yt.backward(_t(dy))

    y, mean, invstd = dp.batchnorm(x, gamma, beta, running_mean, running_var, training=True,
                                   momentum=p["momentum"], eps=p["eps"], layout=layout, return_stats=True)
    check(y, yt, dtype, "y")
    check(running_mean, rm_t, dtype, "running_mean (updated in place)")
    check(running_var, rv_t, dtype, "running_var (updated in place)")
    check(mean, mean_t, dtype, "saved mean")
    check(invstd, invstd_t, dtype, "saved invstd")
    for stats in ({"mean": mean, "invstd": invstd}, {}):
        dx, dgamma, dbeta = dp.batchnorm_backward(dy, x, gamma, eps=p["eps"], layout=layout, **stats)
        which = "saved" if stats else "recomputed"
        check(dx, xt.grad, dtype, f"dx ({which} statistics)")
        check(dgamma, gt.grad, dtype, f"dgamma ({which} statistics)")
        check(dbeta, bt.grad, dtype, f"dbeta ({which} statistics)")
    # and without running statistics: the same output, nothing else to update
    check(dp.batchnorm(x, gamma, beta, training=True, eps=p["eps"], layout=layout), yt, dtype,
          "y (no running statistics)")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", BN_CASES, ids=_bn_id)
def test_batchnorm_inference_matches_torch(xp, dtype, p):
    rng = np.random.default_rng(_seed(_bn_id(p)) + 1)
    layout = p["layout"]
    c = p["shape"][1] if layout == "NCHW" else p["shape"][-1]
    x = _draw(xp, rng, p["shape"], dtype, scale=2.0)
    gamma = _draw(xp, rng, (c,), dtype) if p["affine"] else None
    beta = _draw(xp, rng, (c,), dtype) if p["affine"] else None
    running_mean = _draw(xp, rng, (c,), dtype)
    running_var = xp.asarray(rng.uniform(0.1, 3.0, c).astype(dtype))
    before = (_host(running_mean).copy(), _host(running_var).copy())
    yt = F.batch_norm(_channels_first(_t(x), layout), _t(running_mean), _t(running_var), _t(gamma),
                      _t(beta), training=False, momentum=p["momentum"], eps=p["eps"])
    y = dp.batchnorm(x, gamma, beta, running_mean, running_var, training=False,
                     momentum=p["momentum"], eps=p["eps"], layout=layout)
    check(y, _channels_back(yt, layout), dtype, "y")
    np.testing.assert_array_equal(_host(running_mean), before[0], "inference changed running_mean")
    np.testing.assert_array_equal(_host(running_var), before[1], "inference changed running_var")


# ---------------------------------------------------------------------- softmax

def _softmax_cases(count, seed):
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(count):
        ndim = int(rng.integers(1, 5))
        shape = tuple(int(v) for v in rng.choice([1, 2, 3, 5, 7, 13, 40], size=ndim))
        axis = int(rng.integers(-ndim, ndim))
        cases.append((shape, axis, float(rng.choice([1.0, 30.0]))))
    cases.append(((3, 1100), -1, 5.0))      # a long row
    cases.append(((2, 9, 3, 4), 1, 5.0))    # the channel axis of NCHW
    return cases


SOFTMAX_CASES = _softmax_cases(8, seed=4242)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape, axis, scale", SOFTMAX_CASES,
                         ids=[f"{'x'.join(map(str, s))}-axis{a}-scale{k:g}" for s, a, k in SOFTMAX_CASES])
def test_softmax_matches_torch(xp, dtype, log, shape, axis, scale):
    rng = np.random.default_rng(_seed((shape, axis, log)))
    x = _draw(xp, rng, shape, dtype, scale=scale)
    dy = _draw(xp, rng, shape, dtype)
    xt = _t(x, True)
    yt = (F.log_softmax if log else F.softmax)(xt, dim=axis)
    yt.backward(_t(dy))
    forward = dp.log_softmax if log else dp.softmax
    backward = dp.log_softmax_backward if log else dp.softmax_backward
    y = forward(x, axis=axis)
    check(y, yt, dtype, "y")
    dx = backward(dy, y, axis=axis)
    if np.dtype(dtype) == np.float32 and scale > 1:
        # Large logits make y round to exactly 1 (or 0) in float32, and dx is then pure
        # cancellation (y_i (dy_i - sum dy y) with y_i = 1): its relative error is
        # unbounded in any float32 implementation, PyTorch's included.  What float32 can
        # promise is an error small against the gradient arriving, |dy|.
        worst = float(np.max(np.abs(_host(dx) - xt.grad.cpu().numpy())))
        assert worst <= tolerance(dtype) * float(np.max(np.abs(_host(dy)))), f"dx: worst error {worst:.3g}"
    else:
        check(dx, xt.grad, dtype, "dx")


# ---------------------------------------------------------------------- activations

def _torch_activation(mode, alpha, approximate):
    """PyTorch's function for one of our modes (alpha None = our default)."""
    if mode == "relu":
        return F.relu
    if mode == "sigmoid":
        return torch.sigmoid
    if mode == "tanh":
        return torch.tanh
    if mode == "elu":
        return lambda t: F.elu(t, alpha=1.0 if alpha is None else alpha)
    if mode == "gelu":
        return lambda t: F.gelu(t, approximate=approximate)
    if mode == "silu":
        return F.silu
    if mode == "leaky_relu":
        return lambda t: F.leaky_relu(t, negative_slope=0.01 if alpha is None else alpha)
    if mode == "clipped_relu":
        return lambda t: F.hardtanh(t, 0.0, 6.0 if alpha is None else alpha)
    raise AssertionError(mode)


# (mode, alpha, approximate); alphas exactly representable in float32 so that the kinks
# (x == 0, x == alpha) fall on the same inputs in both dtypes
ACTIVATION_CASES = [
    ("relu", None, "none"), ("sigmoid", None, "none"), ("tanh", None, "none"),
    ("elu", None, "none"), ("elu", 0.375, "none"), ("elu", 2.5, "none"),
    ("gelu", None, "none"), ("gelu", None, "tanh"), ("silu", None, "none"),
    ("leaky_relu", None, "none"), ("leaky_relu", 0.25, "none"), ("leaky_relu", 1.5, "none"),
    ("clipped_relu", None, "none"), ("clipped_relu", 0.5, "none"), ("clipped_relu", 3.0, "none"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode, alpha, approximate", ACTIVATION_CASES,
                         ids=[f"{m}-{a}-{ap}" for m, a, ap in ACTIVATION_CASES])
def test_activation_matches_torch(xp, dtype, mode, alpha, approximate):
    rng = np.random.default_rng(_seed((mode, alpha, approximate)))
    shape = (3, 7, 13)
    values = rng.standard_normal(shape) * 3
    flat = values.reshape(-1)
    # kinks, the ceiling, and saturation on both sides
    ceiling = 6.0 if alpha is None else alpha
    flat[:12] = [0.0, -0.0, ceiling, -ceiling, 30.0, -30.0, 12.0, -12.0, 1e-8, -1e-8, 5.5, -5.5]
    x = xp.asarray(values.astype(dtype))
    dy = _draw(xp, rng, shape, dtype)
    xt = _t(x, True)
    yt = _torch_activation(mode, alpha, approximate)(xt)
    yt.backward(_t(dy))
    options = dict(alpha=alpha)
    if approximate != "none":
        options["approximate"] = approximate
    check(dp.activation(x, mode, **options), yt, dtype, "y")
    check(dp.activation_backward(dy, x, mode, **options), xt.grad, dtype, "dx")
    # a non-contiguous view gives the same result
    check(dp.activation(x[:, ::2], mode, **options), yt[:, ::2], dtype, "y (strided x)")


# ---------------------------------------------------------------------- LSTM and GRU cells

def _cell_cases(count, seed):
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(count):
        cases.append(dict(batch=int(rng.choice([0, 1, 3, 7])), input=int(rng.choice([1, 5, 13])),
                          hidden=int(rng.choice([1, 4, 9, 33])), bias=bool(rng.random() < 0.7),
                          state=bool(rng.random() < 0.75), grads=str(rng.choice(["both", "h only", "c only"]))))
    return cases


CELL_CASES = _cell_cases(8, seed=99)


def _cell_id(p):
    return (f"{'unbatched' if p['batch'] == 0 else 'b' + str(p['batch'])}-i{p['input']}-h{p['hidden']}"
            f"{'-bias' if p['bias'] else ''}{'' if p['state'] else '-nostate'}-{p['grads'].replace(' ', '')}")


def _cell_tensors(xp, rng, p, gates, dtype):
    """Our arrays, and the torch cell holding the same weights."""
    lead = () if p["batch"] == 0 else (p["batch"],)
    hidden, size = p["hidden"], p["input"]
    arrays = dict(x=_draw(xp, rng, lead + (size,), dtype),
                  w_ih=_draw(xp, rng, (gates * hidden, size), dtype, scale=0.5),
                  w_hh=_draw(xp, rng, (gates * hidden, hidden), dtype, scale=0.5),
                  b_ih=_draw(xp, rng, (gates * hidden,), dtype) if p["bias"] else None,
                  b_hh=_draw(xp, rng, (gates * hidden,), dtype) if p["bias"] else None)
    cell_type = torch.nn.LSTMCell if gates == 4 else torch.nn.GRUCell
    device = _torch_device(xp)
    cell = cell_type(size, hidden, bias=p["bias"], dtype=torch.float64, device=device)
    with torch.no_grad():
        cell.weight_ih.copy_(_t(arrays["w_ih"]))
        cell.weight_hh.copy_(_t(arrays["w_hh"]))
        if p["bias"]:
            cell.bias_ih.copy_(_t(arrays["b_ih"]))
            cell.bias_hh.copy_(_t(arrays["b_hh"]))
    return lead + (hidden,), arrays, cell


def _zeros_t(shape, like):
    return torch.zeros(shape, dtype=torch.float64, device=like.device, requires_grad=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", CELL_CASES, ids=_cell_id)
def test_lstm_cell_matches_torch(xp, dtype, p):
    rng = np.random.default_rng(_seed(_cell_id(p)))
    state_shape, a, cell = _cell_tensors(xp, rng, p, 4, dtype)
    h = _draw(xp, rng, state_shape, dtype) if p["state"] else None
    c = _draw(xp, rng, state_shape, dtype) if p["state"] else None
    xt = _t(a["x"], True).to(cell.weight_ih.device)
    # our None state is the zero state; its gradient is still returned
    ht = _t(h, True) if p["state"] else _zeros_t(state_shape, cell.weight_ih)
    ct = _t(c, True) if p["state"] else _zeros_t(state_shape, cell.weight_ih)
    h1t, c1t = cell(xt, (ht, ct))
    dh1 = _draw(xp, rng, state_shape, dtype) if p["grads"] != "c only" else None
    dc1 = _draw(xp, rng, state_shape, dtype) if p["grads"] != "h only" else None
    zero = torch.zeros_like(h1t)
    inputs = [xt, ht, ct, cell.weight_ih, cell.weight_hh]
    if p["bias"]:
        inputs += [cell.bias_ih, cell.bias_hh]
    expected = torch.autograd.grad((h1t, c1t), inputs,
                                   (zero if dh1 is None else _t(dh1).to(zero.device),
                                    zero if dc1 is None else _t(dc1).to(zero.device)))

    h1, c1 = dp.lstm_cell(a["x"], h, c, a["w_ih"], a["w_hh"], a["b_ih"], a["b_hh"])
    check(h1, h1t, dtype, "h1")
    check(c1, c1t, dtype, "c1")
    grads = dp.lstm_cell_backward(dh1, dc1, a["x"], h, c, a["w_ih"], a["w_hh"], a["b_ih"], a["b_hh"])
    names = ("dx", "dh", "dc", "dw_ih", "dw_hh", "db_ih", "db_hh")
    for name, ours, theirs in zip(names, grads, expected):
        check(ours, theirs, dtype, name)
    if not p["bias"]:
        assert grads[5] is None and grads[6] is None, "bias gradients without biases must be None"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", CELL_CASES, ids=_cell_id)
def test_gru_cell_matches_torch(xp, dtype, p):
    rng = np.random.default_rng(_seed(_cell_id(p)) + 1)
    state_shape, a, cell = _cell_tensors(xp, rng, p, 3, dtype)
    h = _draw(xp, rng, state_shape, dtype) if p["state"] else None
    xt = _t(a["x"], True).to(cell.weight_ih.device)
    ht = _t(h, True) if p["state"] else _zeros_t(state_shape, cell.weight_ih)
    h1t = cell(xt, ht)
    dh1 = _draw(xp, rng, state_shape, dtype)
    inputs = [xt, ht, cell.weight_ih, cell.weight_hh]
    if p["bias"]:
        inputs += [cell.bias_ih, cell.bias_hh]
    expected = torch.autograd.grad(h1t, inputs, _t(dh1).to(h1t.device))

    check(dp.gru_cell(a["x"], h, a["w_ih"], a["w_hh"], a["b_ih"], a["b_hh"]), h1t, dtype, "h1")
    grads = dp.gru_cell_backward(dh1, a["x"], h, a["w_ih"], a["w_hh"], a["b_ih"], a["b_hh"])
    for name, ours, theirs in zip(("dx", "dh", "dw_ih", "dw_hh", "db_ih", "db_hh"), grads, expected):
        check(ours, theirs, dtype, name)
    if not p["bias"]:
        assert grads[4] is None and grads[5] is None, "bias gradients without biases must be None"


# ---------------------------------------------------------------------- bad inputs: both refuse

def _bad(xp, rng, shape, dtype=np.float32):
    return _draw(xp, rng, shape, dtype)


# (id, our call, torch's call, our exception, match naming the argument); each lambda
# takes (xp, rng, T) where T converts our arrays to torch
BAD_INPUTS = [
    ("conv-groups-not-dividing-channels",
     lambda xp, r: dp.conv2d_forward(_bad(xp, r, (1, 6, 5, 5)), _bad(xp, r, (4, 2, 3, 3)), groups=4),
     lambda: F.conv2d(torch.ones(1, 6, 5, 5), torch.ones(4, 2, 3, 3), groups=4),
     ValueError, "groups"),
    ("conv-filters-not-divisible-by-groups",
     lambda xp, r: dp.conv2d_forward(_bad(xp, r, (1, 6, 5, 5)), _bad(xp, r, (5, 3, 3, 3)), groups=2),
     lambda: F.conv2d(torch.ones(1, 6, 5, 5), torch.ones(5, 3, 3, 3), groups=2),
     ValueError, "groups"),
    ("conv-filter-channels-mismatch",
     lambda xp, r: dp.conv2d_forward(_bad(xp, r, (1, 3, 5, 5)), _bad(xp, r, (4, 2, 3, 3))),
     lambda: F.conv2d(torch.ones(1, 3, 5, 5), torch.ones(4, 2, 3, 3)),
     ValueError, "w"),
    ("conv-kernel-larger-than-padded-input",
     lambda xp, r: dp.conv2d_forward(_bad(xp, r, (1, 2, 4, 9)), _bad(xp, r, (3, 2, 3, 3)),
                                     padding=(0, 1), dilation=(2, 1)),
     lambda: F.conv2d(torch.ones(1, 2, 4, 9), torch.ones(3, 2, 3, 3), padding=(0, 1), dilation=(2, 1)),
     ValueError, "padded input"),
    ("conv-zero-stride",
     lambda xp, r: dp.conv2d_forward(_bad(xp, r, (1, 2, 5, 5)), _bad(xp, r, (3, 2, 3, 3)), stride=(1, 0)),
     lambda: F.conv2d(torch.ones(1, 2, 5, 5), torch.ones(3, 2, 3, 3), stride=(1, 0)),
     ValueError, "stride"),
    ("conv-negative-padding",
     lambda xp, r: dp.conv2d_forward(_bad(xp, r, (1, 2, 5, 5)), _bad(xp, r, (3, 2, 3, 3)), padding=-1),
     lambda: F.conv2d(torch.ones(1, 2, 5, 5), torch.ones(3, 2, 3, 3), padding=-1),
     ValueError, "padding"),
    ("conv-zero-dilation",
     lambda xp, r: dp.conv2d_forward(_bad(xp, r, (1, 2, 5, 5)), _bad(xp, r, (3, 2, 3, 3)), dilation=0),
     lambda: F.conv2d(torch.ones(1, 2, 5, 5), torch.ones(3, 2, 3, 3), dilation=0),
     ValueError, "dilation"),
    ("conv-bias-length",
     lambda xp, r: dp.conv2d_forward(_bad(xp, r, (1, 2, 5, 5)), _bad(xp, r, (3, 2, 3, 3)), _bad(xp, r, (4,))),
     lambda: F.conv2d(torch.ones(1, 2, 5, 5), torch.ones(3, 2, 3, 3), torch.ones(4)),
     ValueError, "bias"),
    ("conv-mixed-dtypes",
     lambda xp, r: dp.conv2d_forward(_bad(xp, r, (1, 2, 5, 5)), _bad(xp, r, (3, 2, 3, 3), np.float64)),
     lambda: F.conv2d(torch.ones(1, 2, 5, 5), torch.ones(3, 2, 3, 3, dtype=torch.float64)),
     TypeError, "dtype"),
    ("conv-2d-input",
     lambda xp, r: dp.conv2d_forward(_bad(xp, r, (5, 5)), _bad(xp, r, (3, 2, 3, 3))),
     lambda: F.conv2d(torch.ones(5, 5), torch.ones(3, 2, 3, 3)),
     ValueError, "x"),
    ("pool-padding-over-half-window",
     lambda xp, r: dp.pool(_bad(xp, r, (1, 2, 8, 8)), 3, padding=2),
     lambda: F.max_pool2d(torch.ones(1, 2, 8, 8), 3, padding=2),
     ValueError, "padding"),
    ("pool-window-larger-than-padded-input",
     lambda xp, r: dp.pool(_bad(xp, r, (1, 2, 2, 8)), (5, 2), padding=(1, 0), mode="avg"),
     lambda: F.avg_pool2d(torch.ones(1, 2, 2, 8), (5, 2), padding=(1, 0)),
     ValueError, "window"),
    ("pool-zero-stride",
     lambda xp, r: dp.pool(_bad(xp, r, (1, 2, 8, 8)), 2, stride=0),
     lambda: F.max_pool2d(torch.ones(1, 2, 8, 8), 2, stride=0),
     ValueError, "stride"),
    ("batchnorm-one-value-per-channel",
     lambda xp, r: dp.batchnorm(_bad(xp, r, (1, 3, 1, 1)), None, None, training=True),
     lambda: F.batch_norm(torch.ones(1, 3, 1, 1), None, None, training=True),
     ValueError, "x"),
    ("batchnorm-gamma-length",
     lambda xp, r: dp.batchnorm(_bad(xp, r, (2, 3, 4)), _bad(xp, r, (4,)), _bad(xp, r, (3,))),
     lambda: F.batch_norm(torch.ones(2, 3, 4), None, None, torch.ones(4), torch.ones(3), training=True),
     ValueError, "gamma"),
    ("batchnorm-running-var-length",
     lambda xp, r: dp.batchnorm(_bad(xp, r, (2, 3, 4)), None, None, _bad(xp, r, (3,)), _bad(xp, r, (2,))),
     lambda: F.batch_norm(torch.ones(2, 3, 4), torch.ones(3), torch.ones(2), training=True),
     ValueError, "running_var"),
    ("softmax-axis-out-of-range",
     lambda xp, r: dp.softmax(_bad(xp, r, (2, 3)), axis=2),
     lambda: F.softmax(torch.ones(2, 3), dim=2),
     ValueError, "axis"),
    ("log-softmax-integer-input",
     lambda xp, r: dp.log_softmax(xp.ones((2, 3), dtype=np.int64)),
     lambda: F.log_softmax(torch.ones(2, 3, dtype=torch.int64), dim=-1),
     TypeError, "x"),
    ("lstm-w-hh-shape",
     lambda xp, r: dp.lstm_cell(_bad(xp, r, (2, 5)), None, None, _bad(xp, r, (12, 5)), _bad(xp, r, (12, 4))),
     lambda: torch._VF.lstm_cell(torch.ones(2, 5), (torch.zeros(2, 3), torch.zeros(2, 3)),
                                 torch.ones(12, 5), torch.ones(12, 4)),
     ValueError, "w_hh"),
    ("lstm-input-size",
     lambda xp, r: dp.lstm_cell(_bad(xp, r, (2, 6)), None, None, _bad(xp, r, (12, 5)), _bad(xp, r, (12, 3))),
     lambda: torch.nn.LSTMCell(5, 3)(torch.ones(2, 6)),
     ValueError, "w_ih"),
    ("gru-state-shape",
     lambda xp, r: dp.gru_cell(_bad(xp, r, (2, 5)), _bad(xp, r, (3, 4)), _bad(xp, r, (12, 5)),
                               _bad(xp, r, (12, 4))),
     lambda: torch.nn.GRUCell(5, 4)(torch.ones(2, 5), torch.ones(3, 4)),
     ValueError, "h"),
    ("gru-bias-length",
     lambda xp, r: dp.gru_cell(_bad(xp, r, (2, 5)), None, _bad(xp, r, (12, 5)), _bad(xp, r, (12, 4)),
                               _bad(xp, r, (11,))),
     lambda: torch._VF.gru_cell(torch.ones(2, 5), torch.zeros(2, 4), torch.ones(12, 5),
                                torch.ones(12, 4), torch.ones(11), torch.ones(12)),
     ValueError, "b_ih"),
]


@pytest.mark.parametrize("ours, theirs, error, match", [case[1:] for case in BAD_INPUTS],
                         ids=[case[0] for case in BAD_INPUTS])
def test_bad_input_refused_like_torch(xp, ours, theirs, error, match):
    with pytest.raises(Exception):
        theirs()
    with pytest.raises(error, match=match):
        ours(xp, np.random.default_rng(5))


# ---------------------------------------------------------------------- NaN and infinity

def check_nonfinite(ours, expected, dtype, what):
    """NaN where torch has NaN, the same infinities, the finite rest as check() does."""
    got = _host(ours).astype(np.float64)
    expected = expected.detach().cpu().numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected), f"{what}: NaN positions differ")
    inf = np.isinf(expected)
    np.testing.assert_array_equal(got[inf], expected[inf], f"{what}: infinities differ")
    finite = np.isfinite(expected)
    check(_host(ours)[finite], expected[finite], dtype, f"{what} (finite part)")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode, alpha, approximate", ACTIVATION_CASES,
                         ids=[f"{m}-{a}-{ap}" for m, a, ap in ACTIVATION_CASES])
def test_activation_nonfinite_like_torch(xp, dtype, mode, alpha, approximate):
    # +-1e30 only in float64: its cube overflows float32, where torch's gelu-tanh
    # derivative is NaN as well
    huge = 1e30 if np.dtype(dtype) == np.float64 else 60.0
    values = np.array([np.nan, np.inf, -np.inf, 0.0, 2.0, -2.0, huge, -huge])
    x = xp.asarray(values.astype(dtype))
    dy = xp.asarray(np.linspace(-1.5, 2.0, values.size).astype(dtype))
    xt = _t(x, True)
    yt = _torch_activation(mode, alpha, approximate)(xt)
    yt.backward(_t(dy))
    options = dict(alpha=alpha)
    if approximate != "none":
        options["approximate"] = approximate
    check_nonfinite(dp.activation(x, mode, **options), yt, dtype, "y")
    dx, expected = dp.activation_backward(dy, x, mode, **options), xt.grad
    if mode in ("elu", "clipped_relu"):
        # torch's elu and hardtanh backward at a NaN x depend on its vectorisation (dy
        # in a scalar tail; NaN or 0 in a vector body): no semantics to match there
        dx, expected = dx[1:], expected[1:]
    check_nonfinite(dx, expected, dtype, "dx")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("axis", [0, -1])
def test_softmax_masked_like_torch(xp, dtype, log, axis):
    """-inf entries (masking) get probability 0; a fully masked slice gives NaN."""
    rng = np.random.default_rng(_seed("masked", log, axis))
    values = rng.standard_normal((6, 5))
    values[rng.random(values.shape) < 0.3] = -np.inf
    values[2, :] = values[:, 3] = -np.inf  # a fully masked row and column
    x = xp.asarray(values.astype(dtype))
    dy = _draw(xp, rng, values.shape, dtype)
    xt = _t(x, True)
    yt = (F.log_softmax if log else F.softmax)(xt, dim=axis)
    yt.backward(_t(dy))
    y = (dp.log_softmax if log else dp.softmax)(x, axis=axis)
    check_nonfinite(y, yt, dtype, "y")
    backward = dp.log_softmax_backward if log else dp.softmax_backward
    check_nonfinite(backward(dy, y, axis=axis), xt.grad, dtype, "dx")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_max_pool_nonfinite_like_torch(xp, dtype, layout):
    """A NaN wins its windows and takes their gradient; an all -inf window gives -inf
    and sends its gradient to its first real element."""
    rng = np.random.default_rng(_seed("pool-nonfinite", layout))
    values = rng.standard_normal((2, 3, 7, 8))
    values[0, 1, 3, 4] = np.nan
    values[1, 2, :3, :3] = -np.inf
    values[1, 0, 5, 2] = np.inf
    x_nchw = values.astype(dtype)
    x = xp.asarray(x_nchw if layout == "NCHW" else np.ascontiguousarray(x_nchw.transpose(0, 2, 3, 1)))
    xt = _t(x, True)
    yt = F.max_pool2d(xt if layout == "NCHW" else xt.permute(0, 3, 1, 2), 3, (2, 1), 1)
    yt = yt if layout == "NCHW" else yt.permute(0, 2, 3, 1)
    dy = _draw(xp, rng, tuple(yt.shape), dtype)
    yt.backward(_t(dy))
    options = dict(mode="max", stride=(2, 1), padding=1, layout=layout)
    y = dp.pool(x, 3, **options)
    check_nonfinite(y, yt, dtype, "y")
    check_nonfinite(dp.pool_backward(dy, x, y, 3, **options), xt.grad, dtype, "dx")


# ---------------------------------------------------------------------- empty batches

@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_empty_batch_like_torch(xp, layout):
    """N = 0: every function returns what torch returns (empty results, zero
    parameter gradients, running statistics untouched)."""
    rng = np.random.default_rng(_seed("empty", layout))
    dtype = np.float64
    nchw = layout == "NCHW"
    x = xp.zeros((0, 4, 6, 5) if nchw else (0, 6, 5, 4), dtype)
    w = _draw(xp, rng, (6, 2, 3, 2), dtype)
    b = _draw(xp, rng, (6,), dtype)
    options = dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2, layout=layout)
    xt, wt, bt = _t(x, True), _t(w, True), _t(b, True)
    yt = F.conv2d(_channels_first(xt, layout), wt, bt, stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2)
    yt = _channels_back(yt, layout)
    dy = xp.zeros(tuple(yt.shape), dtype)
    yt.backward(_t(dy))
    check(dp.conv2d_forward(x, w, b, **options), yt, dtype, "conv y")
    check(dp.conv2d_backward_data(dy, w, x.shape, **options), xt.grad, dtype, "conv dx")
    check(dp.conv2d_backward_filter(x, dy, w.shape, **options), wt.grad, dtype, "conv dw")
    check(dp.conv2d_backward_bias(dy, layout=layout), bt.grad, dtype, "conv db")

    pt = _channels_back(F.avg_pool2d(_channels_first(_t(x), layout), 3, 2, 1), layout)
    check(dp.pool(x, 3, mode="avg", stride=2, padding=1, layout=layout), pt, dtype, "pool y")

    running_mean, running_var = _draw(xp, rng, (4,), dtype), xp.asarray(rng.uniform(0.5, 2, 4))
    rm_t, rv_t = _t(running_mean), _t(running_var)
    bn_t = F.batch_norm(_channels_first(_t(x), layout), rm_t, rv_t, training=True, momentum=0.3)
    y = dp.batchnorm(x, None, None, running_mean, running_var, training=True, momentum=0.3, layout=layout)
    check(y, _channels_back(bn_t, layout), dtype, "batchnorm y")
    check(running_mean, rm_t, dtype, "running_mean")
    check(running_var, rv_t, dtype, "running_var")
    dx, dgamma, dbeta = dp.batchnorm_backward(x, x, None, layout=layout)
    check(dx, _t(x), dtype, "batchnorm dx")
    check(dgamma, torch.zeros(4, dtype=torch.float64), dtype, "batchnorm dgamma")
    check(dbeta, torch.zeros(4, dtype=torch.float64), dtype, "batchnorm dbeta")

    check(dp.softmax(x, axis=1), F.softmax(_t(x), dim=1), dtype, "softmax")
    check(dp.activation(x, "gelu"), F.gelu(_t(x)), dtype, "gelu")

    cell = torch.nn.GRUCell(5, 3, dtype=torch.float64, device=_torch_device(xp))
    w_ih, w_hh = (xp.asarray(t.detach().cpu().numpy()) for t in (cell.weight_ih, cell.weight_hh))
    xs = xp.zeros((0, 5), dtype)
    check(dp.gru_cell(xs, None, w_ih, w_hh), cell(_t(xs).to(cell.weight_ih.device)), dtype, "gru h1")
    dw_ih = dp.gru_cell_backward(xp.zeros((0, 3), dtype), xs, None, w_ih, w_hh)[2]
    check(dw_ih, torch.zeros(9, 5, dtype=torch.float64), dtype, "gru dw_ih")


# ---------------------------------------------------------------------- row normalizations and tensor ops

ROW_NORM_CASES = [((3, 5, 7), (7,)), ((2, 3, 4, 6), (4, 6)), ((4, 13), (13,)), ((2, 1, 3), (1, 3))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,norm_shape", ROW_NORM_CASES, ids=str)
def test_layer_and_rms_norm_match_torch(xp, dtype, shape, norm_shape):
    rng = np.random.default_rng(_seed("layer_norm", shape))
    x = _draw(xp, rng, shape, dtype, scale=2.0) + xp.asarray(np.asarray(0.5, dtype))
    gamma, beta, dy = _draw(xp, rng, norm_shape, dtype), _draw(xp, rng, norm_shape, dtype), _draw(xp, rng, shape, dtype)
    xt, gt, bt = _t(x, True), _t(gamma, True), _t(beta, True)
    yt = F.layer_norm(xt, norm_shape, gt, bt, 1e-4)
    yt.backward(_t(dy))
    check(dp.layer_norm(x, norm_shape, gamma, beta, eps=1e-4), yt, dtype, "layer_norm y")
    dx, dgamma, dbeta = dp.layer_norm_backward(dy, x, norm_shape, gamma, eps=1e-4)
    check(dx, xt.grad, dtype, "layer_norm dx")
    check(dgamma, gt.grad, dtype, "layer_norm dgamma")
    check(dbeta, bt.grad, dtype, "layer_norm dbeta")
    xt, gt = _t(x, True), _t(gamma, True)
    yt = F.rms_norm(xt, norm_shape, gt, 1e-4)
    yt.backward(_t(dy))
    check(dp.rms_norm(x, norm_shape, gamma, eps=1e-4), yt, dtype, "rms_norm y")
    dx, dgamma = dp.rms_norm_backward(dy, x, norm_shape, gamma, eps=1e-4)
    check(dx, xt.grad, dtype, "rms_norm dx")
    check(dgamma, gt.grad, dtype, "rms_norm dgamma")
    # eps=None is the dtype's machine epsilon, torch's default: torch computes in our dtype here
    torch_dtype = torch.float32 if dtype == np.float32 else torch.float64
    check(dp.rms_norm(x, norm_shape), F.rms_norm(_t(x).to(torch_dtype), norm_shape).double(), dtype,
          "rms_norm y, default eps")


GROUP_NORM_CASES = [((2, 6, 5, 3), 3, "NCHW"), ((3, 4, 7), 2, "NCHW"), ((2, 5, 3, 4), 4, "NHWC"), ((1, 6, 2, 2), 6, "NCHW")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,groups,layout", GROUP_NORM_CASES, ids=str)
def test_group_and_instance_norm_match_torch(xp, dtype, shape, groups, layout):
    rng = np.random.default_rng(_seed("group_norm", shape, layout))
    c = shape[1] if layout == "NCHW" else shape[-1]
    x = _draw(xp, rng, shape, dtype, scale=2.0) + xp.asarray(np.asarray(0.5, dtype))
    gamma, beta, dy = _draw(xp, rng, (c,), dtype), _draw(xp, rng, (c,), dtype), _draw(xp, rng, shape, dtype)
    xt, gt, bt = _t(x, True), _t(gamma, True), _t(beta, True)
    yt = _channels_back(F.group_norm(_channels_first(xt, layout), groups, gt, bt, 1e-4), layout)
    yt.backward(_t(dy))
    check(dp.group_norm(x, groups, gamma, beta, eps=1e-4, layout=layout), yt, dtype, "group_norm y")
    dx, dgamma, dbeta = dp.group_norm_backward(dy, x, groups, gamma, eps=1e-4, layout=layout)
    check(dx, xt.grad, dtype, "group_norm dx")
    check(dgamma, gt.grad, dtype, "group_norm dgamma")
    check(dbeta, bt.grad, dtype, "group_norm dbeta")

    running_mean, running_var = _draw(xp, rng, (c,), dtype), xp.asarray(rng.uniform(0.5, 2, c).astype(dtype))
    rm_t, rv_t = _t(running_mean), _t(running_var)
    xt, gt, bt = _t(x, True), _t(gamma, True), _t(beta, True)
    yt = _channels_back(F.instance_norm(_channels_first(xt, layout), rm_t, rv_t, gt, bt, True, 0.3, 1e-4), layout)
    yt.backward(_t(dy))
    check(dp.instance_norm(x, gamma, beta, running_mean, running_var, momentum=0.3, eps=1e-4, layout=layout),
          yt, dtype, "instance_norm y")
    check(running_mean, rm_t, dtype, "instance_norm running_mean")
    check(running_var, rv_t, dtype, "instance_norm running_var")
    dx, dgamma, dbeta = dp.instance_norm_backward(dy, x, gamma, eps=1e-4, layout=layout)
    check(dx, xt.grad, dtype, "instance_norm dx")
    check(dgamma, gt.grad, dtype, "instance_norm dgamma")
    check(dbeta, bt.grad, dtype, "instance_norm dbeta")


@pytest.mark.parametrize("dtype", DTYPES)
def test_tensor_ops_match_torch(xp, dtype):
    rng = np.random.default_rng(_seed("tensor_ops"))
    a, c = _draw(xp, rng, (2, 5, 3, 7), dtype), _draw(xp, rng, (1, 5, 1, 1), dtype)
    check(dp.add_tensor(a, c, alpha=0.5, beta=2.0), torch.add(0.5 * _t(a), _t(c), alpha=2.0), dtype, "add_tensor")
    check(dp.scale_tensor(a, -3.0), -3.0 * _t(a), dtype, "scale_tensor")
    check(dp.transform_layout(a, "NCHW", "NHWC"), _t(a).permute(0, 2, 3, 1), dtype, "NCHW -> NHWC")
    check(dp.reduce_tensor(a, (0, 2, 3), "sum"), _t(a).sum(dim=(0, 2, 3)), dtype, "reduce sum")
    check(dp.reduce_tensor(a, (1,), "mean", keepdims=True), _t(a).mean(dim=1, keepdim=True), dtype, "reduce mean")
    check(dp.reduce_tensor(a, (1, 3), "amax"), _t(a).abs().amax(dim=(1, 3)), dtype, "reduce amax")
    check(dp.reduce_tensor(a, None, "norm2"), torch.linalg.vector_norm(_t(a)), dtype, "reduce norm2")
