"""Winograd F(2x2, 3x3), F(4x4, 3x3), F(2x2, 5x5), F(3x3, 5x5) and F(4x4, 5x5) (and
the backward-filter F(3x3, 2x2), F(3x3, 4x4), F(5x5, 2x2), F(5x5, 3x3), F(5x5, 4x4)):
the transforms against their
definition, the three stages on NumPy against the reference, the accuracy
bounds of the tolerance table, and the GPU kernels (the registry-wide checks
of tests/test_conv.py run them too, on the small CASES)."""
import random
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dnnprims
from dnnprims import algos
from dnnprims.algos import winograd
from dnnprims._kernels import KERNEL_DIR, ceil_div
from dnnprims.conv import conv2d_backward_data, conv2d_backward_filter, conv2d_forward
from dnnprims.testing import assert_close
from dnnprims.testing.tolerances import TOLERANCES, relative_error

from conftest import FLOAT_DTYPES, random_array

F64 = np.float64
# (m, r) -> name: forward / backward data F(m x m, r x r).
NAMES = {(2, 3): "winograd_f2x2_3x3", (4, 3): "winograd_f4x4_3x3", (2, 5): "winograd_f2x2_5x5",
         (3, 5): "winograd_f3x3_5x5", (4, 5): "winograd_f4x4_5x5"}
VARIANTS = winograd.VARIANTS


def _fraction(rng):
    return Fraction(rng.randint(-50, 50), rng.randint(1, 9))


@pytest.mark.parametrize("m,r", VARIANTS)
def test_transforms_compute_the_correlation_exactly(m, r):
    # 1-D: A^T [(G g) * (B^T d)] == sum_j d[i + j] g[j], in exact arithmetic.
    rng = random.Random(m * 10 + r)
    alpha = m + r - 1
    for _ in range(30):
        d = [_fraction(rng) for _ in range(alpha)]
        g = [_fraction(rng) for _ in range(r)]
        assert winograd.apply_1d(m, d, g) == winograd.correlate_1d(d, g)
    # On unit vectors the identity pins every entry: A^T diag(G e_j) B^T == the
    # correlation matrix of filter tap j (row i selects d[i + j]).
    at, g, bt = winograd.toom_cook(m, r)
    for j in range(r):
        for k in range(alpha):
            got = [sum(at[i][a] * g[a][j] * bt[a][k] for a in range(alpha)) for i in range(m)]
            assert got == [Fraction(int(k == i + j)) for i in range(m)]


def test_transforms_have_the_documented_shapes_and_integer_input_transform():
    for m, r in VARIANTS:
        at, g, bt = winograd.toom_cook(m, r)
        alpha = m + r - 1
        assert (len(at), len(at[0]), len(g), len(g[0]), len(bt), len(bt[0])) == (m, alpha, alpha, r, alpha, alpha)
        assert all(v.denominator == 1 for row in bt for v in row)   # B^T: small integers
    # The input transform depends on the points only: F(2, 5) shares F(4, 3)'s.
    assert winograd.toom_cook(2, 5)[2] == winograd.toom_cook(4, 3)[2]
    # The points nest: alpha 7 is alpha 6's plus 1/2, alpha 8 adds -1/2 (docs in POINTS).
    assert set(winograd.POINTS[6]) < set(winograd.POINTS[7]) < set(winograd.POINTS[8])
    assert [[int(v) for v in row] for row in winograd.toom_cook(2)[2]] == [
        [1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, -1, 0, 1]]   # Lavin & Gray's B^T


def test_other_points_also_satisfy_the_definition():
    # The construction is general: F(3, 3) on 0, 1, -1, 1/2, inf.
    rng = random.Random(3)
    at, g, bt = winograd.toom_cook(3, points=(0, 1, -1, Fraction(1, 2), None))
    d = [_fraction(rng) for _ in range(5)]
    w = [_fraction(rng) for _ in range(3)]
    u = [sum(r[j] * w[j] for j in range(3)) for r in g]
    v = [sum(r[j] * d[j] for j in range(5)) for r in bt]
    assert [sum(r[a] * u[a] * v[a] for a in range(5)) for r in at] == winograd.correlate_1d(d, w)
    with pytest.raises(ValueError, match="distinct points"):
        winograd.toom_cook(2, points=(0, 1, 1, None))


def test_generated_header_is_current():
    assert (KERNEL_DIR / winograd.MATRICES_HEADER).read_text() == winograd.matrices_header()


def _reference(x, w, padding, direction):
    if direction == "forward":
        return conv2d_forward(x, w, padding=padding)
    r = w.shape[2]
    shape = (x.shape[0], w.shape[1], x.shape[2] - 2 * padding + r - 1, x.shape[3] - 2 * padding + r - 1)
    return conv2d_backward_data(x, w, shape, padding=padding)


@settings(max_examples=40, deadline=None)
@given(mr=st.sampled_from(VARIANTS), n=st.integers(1, 2), c=st.integers(1, 4),
       k=st.integers(1, 4), h=st.sampled_from((1, 3, 7, 13)), w_=st.sampled_from((1, 3, 7, 13)),
       padding=st.integers(0, 5), direction=st.sampled_from(("forward", "backward_data")),
       seed=st.integers(0, 2**32 - 1))
def test_three_stages_on_numpy_match_the_reference(mr, n, c, k, h, w_, padding, direction, seed):
    m, r = mr
    rng = np.random.default_rng(seed)
    if direction == "forward":
        if min(h, w_) + 2 * padding < r:
            return
        x, w = random_array(rng, (n, c, h, w_)), random_array(rng, (k, c, r, r))
    else:   # x stands for dy of a forward pass with input h + r - 1 - 2p
        if min(h, w_) + r - 1 - 2 * padding < 1:
            return
        x, w = random_array(rng, (n, k, h, w_)), random_array(rng, (k, c, r, r))
    got = winograd.emulate(x, w, m, (padding, padding), F64, direction)
    np.testing.assert_allclose(got, _reference(x, w, padding, direction), rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("m,r", VARIANTS)
def test_float32_error_is_within_the_tolerance_row(m, r):
    # The measurement behind the table's rows, on one mid-size problem: float32
    # transforms and GEMMs against the float64 reference, N(0, 1) data.
    rng = np.random.default_rng(7)
    pad = (r - 1) // 2
    x, w = rng.standard_normal((1, 128, 12, 12)), rng.standard_normal((128, 128, r, r))
    y = conv2d_forward(x, w, padding=pad)
    err = relative_error(winograd.emulate(x, w, m, (pad, pad), np.float32), y)
    bound = TOLERANCES[("float32", NAMES[m, r])]
    assert err <= bound / 2 and bound <= TOLERANCES[("float32", "default")]
    assert algos.REGISTRY[NAMES[m, r]].strict   # within the float32 direct bound


@pytest.mark.parametrize("m,r", VARIANTS)
def test_strict_follows_the_measured_error_and_the_tolerance_row(m, r):
    # precision="strict" admits a variant exactly when its measured float32 error
    # is within the float32 direct bound; the tolerance row covers the measurement.
    algorithm = algos.REGISTRY[NAMES[m, r]]
    direct = TOLERANCES[("float32", "default")]
    assert winograd.FP32_DIRECT_BOUND == direct
    assert algorithm.strict == (winograd.FP32_ERROR[m, r] <= direct)
    assert 2 * winograd.FP32_ERROR[m, r] <= TOLERANCES[("float32", NAMES[m, r])]
    p = _problem((2, 4, 9, 9), (8, 4, r, r), padding=(r - 1) // 2)
    strict = algos.ConvOptions(precision="strict")
    assert algos.admits(algorithm, p, "forward", strict)[0] == algorithm.strict
    # A variant measured over the bound: refused under "strict", admitted by default.
    loose = winograd.WinogradConvolution(m, r, fp32_error=2 * direct)
    assert not loose.strict
    ok, reason = algos.admits(loose, p, "forward", strict)
    assert not ok and "precision='strict'" in reason
    assert algos.admits(loose, p, "forward") == (True, "")


def _problem(x_shape, w_shape, dtype=np.float32, **opts):
    return dnnprims.conv._describe(x_shape, w_shape, opts.get("stride", 1), opts.get("padding", 1),
                                   opts.get("dilation", 1), opts.get("groups", 1),
                                   opts.get("layout", "NCHW"), dtype)


def _bad_inputs(r):
    """(options, filter shape, reason) that an F(., r x r) algorithm must refuse."""
    other = 5 if r == 3 else 3
    return [(dict(), (8, 4, other, other), f"{r}x{r} filters only"),
            (dict(padding=2), (8, 4, 7, 7), f"{r}x{r} filters only"),
            (dict(stride=2), (8, 4, r, r), "stride 1"),
            (dict(dilation=2), (8, 4, r, r), "dilation 1"),
            (dict(groups=2), (8, 2, r, r), "ungrouped")]


@pytest.mark.parametrize("m,r", VARIANTS)
def test_refuses_what_it_cannot_compute(m, r):
    algorithm = algos.REGISTRY[NAMES[m, r]]
    for opts, w_shape, match in _bad_inputs(r):
        ok, reason = algorithm.supports(_problem((2, 4, 9, 9), w_shape, **opts), "forward")
        assert not ok and match in reason
    good = _problem((2, 4, 9, 9), (8, 4, r, r), padding=(r - 1) // 2)
    ok, reason = algorithm.supports(good, "backward_filter")
    assert not ok and "backward_filter" in reason
    assert algorithm.supports(good, "forward") == (True, "")


def test_workspace_is_reported_bounded_and_limits_the_choice(monkeypatch):
    p = _problem((32, 64, 224, 224), (64, 64, 3, 3))
    f4 = algos.REGISTRY[NAMES[4, 3]]
    need = f4.workspace_bytes(p, "forward")
    assert 0 < need <= winograd.WORKSPACE_BOUND + 36 * 64 * 64 * 4
    # One image of V and M: 36 * (64 + 64) * 56 * 56 floats.
    monkeypatch.setattr(winograd, "WORKSPACE_BOUND", 1)
    assert f4.workspace_bytes(p, "forward") == 36 * 64 * 64 * 4 + 36 * 128 * 56 * 56 * 4
    monkeypatch.setattr(winograd, "WORKSPACE_BOUND", 10 * 2**30)   # the whole batch in one chunk
    assert f4.workspace_bytes(p, "forward") == 36 * 64 * 64 * 4 + 32 * 36 * 128 * 56 * 56 * 4
    monkeypatch.undo()
    assert algos.explain_auto(p, "forward")[0] == NAMES[4, 3]
    assert algos.explain_auto(p, "forward", algos.ConvOptions(workspace_limit=0))[0] == "implicit_gemm"
    small = algos.REGISTRY[NAMES[2, 3]].workspace_bytes(p, "forward")
    assert algos.explain_auto(p, "forward", algos.ConvOptions(workspace_limit=small))[0] in NAMES.values()


def test_auto_takes_winograd_for_wide_large_3x3_float32_only(rule_only):
    def auto(x_shape, w_shape, dtype=np.float32, direction="forward", **opts):
        return algos.explain_auto(_problem(x_shape, w_shape, dtype, **opts), direction)[0]

    big = (32, 64, 56, 56)    # r50_2_3x3: 7.4 GFLOP
    assert auto(big, (64, 64, 3, 3)) == NAMES[4, 3]
    assert auto(big, (64, 64, 3, 3), direction="backward_data", padding=0) == NAMES[4, 3]
    assert auto(big, (64, 64, 3, 3), direction="backward_filter") != NAMES[4, 3]
    assert auto((1, 64, 56, 56), (64, 64, 3, 3)) == "implicit_gemm"      # batch 1: 0.23 GFLOP
    assert auto((32, 32, 56, 56), (64, 32, 3, 3)) == "implicit_gemm"     # C < 64
    assert auto(big, (64, 64, 3, 3), np.float16) == "implicit_gemm"
    assert auto(big, (64, 64, 3, 3), stride=2) == "implicit_gemm"
    name, reason = dnnprims.conv2d_choose(big, (64, 64, 3, 3), padding=1, precision="strict")
    assert name == NAMES[4, 3] and "Winograd" in reason


# --- the GPU kernels --------------------------------------------------------------

GPU_CASES = [
    # (N, C, H, W, K, padding, layout); padding + r - 3 for r x r filters (the
    # same output sizes, and the last case still crops in backward data).
    pytest.param((2, 5, 9, 11, 7, 1, "NCHW"), id="odd"),
    pytest.param((3, 6, 13, 7, 4, 0, "NHWC"), id="nhwc-pad0"),
    pytest.param((1, 3, 7, 7, 2, 2, "NCHW"), id="pad2"),
    pytest.param((2, 4, 6, 5, 3, 3, "NHWC"), id="pad3-crops-in-backward"),
    pytest.param((1, 1, 1, 1, 1, 1, "NCHW"), id="one-pixel"),
    # Q a multiple of 4 (and of 2): the output transform's vector rows (float32
    # NCHW), with a partial last tile row (P = 6) in both directions.
    pytest.param((2, 3, 6, 8, 5, 1, "NCHW"), id="vector-rows"),
]


def _winograd_magnitude(d, w, m, padding, layout, direction):
    """The scale a Winograd result is rounded from: the three stages run in float64 on |d| and |w|
    with the transform matrices' absolute values (the usual forward error bound of the
    algorithm).  Every output of a tile mixes the whole alpha x alpha patch and all r x r taps, so
    a result made of few products (a one-pixel image) can be far smaller than that scale."""
    absolute = winograd.matrices

    def matrices(*args, **kwargs):
        return tuple(np.abs(a) for a in absolute(*args, **kwargs))

    d = np.abs(np.asarray(d, F64))
    if layout == "NHWC":
        d = d.transpose(0, 3, 1, 2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(winograd, "matrices", matrices)
        out = winograd.emulate(d, np.abs(np.asarray(w, F64)), m, (padding, padding), F64, direction)
    return out.transpose(0, 2, 3, 1) if layout == "NHWC" else out


@pytest.mark.gpu   # the `gpu` fixture alone does not mark it: gpu_suite.sh selects -m gpu
@pytest.mark.parametrize("m,r", VARIANTS)
@pytest.mark.parametrize("case", GPU_CASES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_gpu_matches_reference(gpu, rng, m, r, case, dtype):
    N, C, H, W, K, padding, layout = case
    padding += r - 3
    name = NAMES[m, r]
    shape = (N, C, H, W) if layout == "NCHW" else (N, H, W, C)
    x, w, b = random_array(rng, shape, dtype), random_array(rng, (K, C, r, r), dtype), random_array(rng, (K,), dtype)
    opts = dict(padding=padding, layout=layout)
    x64, w64, b64 = x.astype(F64), w.astype(F64), b.astype(F64)
    y64 = conv2d_forward(x64, w64, b64, **opts)
    y = conv2d_forward(gpu.asarray(x), gpu.asarray(w), gpu.asarray(b), algo=name, **opts)
    magnitude = conv2d_forward(np.abs(x64), np.abs(w64), np.abs(b64), **opts)
    assert_close(y, y64, dtype, algorithm=name, what="forward", magnitude=magnitude)
    dy = random_array(rng, y64.shape, dtype)
    dx = conv2d_backward_data(gpu.asarray(dy), gpu.asarray(w), x.shape, algo=name, **opts)
    # A one-pixel dx is one product dy * w[centre], rounded through transforms of all r x r taps:
    # its error follows the Winograd scale, not the (random, possibly tiny) centre tap.  Images of
    # several pixels average over taps and keep the plain normwise bound of the tolerance row.
    one_pixel = H * W == 1
    assert_close(dx, conv2d_backward_data(dy.astype(F64), w64, x.shape, **opts), dtype,
                 algorithm=name, what="backward_data",
                 magnitude=_winograd_magnitude(dy, w, m, padding, layout, "backward_data") if one_pixel else None)


@pytest.mark.gpu   # the `gpu` fixture alone does not mark it: gpu_suite.sh selects -m gpu
@pytest.mark.parametrize("m,r", VARIANTS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_gpu_wide_channels_in_batch_chunks(gpu, rng, monkeypatch, m, r, layout):
    # 128 channels (several GEMM tiles), and a workspace bound of two images so
    # the batch of 5 runs in three chunks (the last one short).
    N, C, H, K = 5, 128, 10, 96
    name = NAMES[m, r]
    tiles = ceil_div(H, m) ** 2
    per_image = (m + r - 1) ** 2 * (C + K) * tiles * 4
    monkeypatch.setattr(winograd, "WORKSPACE_BOUND", 2 * per_image)
    shape = (N, C, H, H) if layout == "NCHW" else (N, H, H, C)
    _check_float32_both_directions(gpu, rng, name, shape, (K, C, r, r), dict(padding=(r - 1) // 2, layout=layout))


def _check_float32_both_directions(gpu, rng, name, x_shape, w_shape, opts):
    """Forward (with a bias) and backward data by ``name`` on the GPU against
    the float64 reference, N(0, 1) float32 data."""
    x, w = rng.standard_normal(x_shape).astype(np.float32), rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32)
    y = conv2d_forward(gpu.asarray(x), gpu.asarray(w), gpu.asarray(b), algo=name, **opts)
    assert_close(y, conv2d_forward(x.astype(F64), w.astype(F64), b.astype(F64), **opts), np.float32,
                 algorithm=name, what="forward")
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dx = conv2d_backward_data(gpu.asarray(dy), gpu.asarray(w), x.shape, algo=name, **opts)
    assert_close(dx, conv2d_backward_data(dy.astype(F64), w.astype(F64), x.shape, **opts), np.float32,
                 algorithm=name, what="backward_data")


@pytest.mark.gpu   # the `gpu` fixture alone does not mark it: gpu_suite.sh selects -m gpu
@pytest.mark.parametrize("m,r", VARIANTS)
@pytest.mark.parametrize("filter_in_input", [True, False])
@pytest.mark.parametrize("vector_rows", [True, False])
def test_gpu_launch_options_match_reference(gpu, rng, monkeypatch, m, r, filter_in_input, vector_rows):
    # The filter transform inside the first input-transform launch or alone, the
    # vector row stores on or off, over three batch chunks (the filter blocks ride
    # on the first only): every combination gives the reference, both directions.
    N, C, H, W, K = 5, 12, 6, 12, 10
    tiles = ceil_div(H, m) * ceil_div(W, m)
    monkeypatch.setattr(winograd, "WORKSPACE_BOUND", 2 * (m + r - 1) ** 2 * (C + K) * tiles * 4)
    monkeypatch.setattr(winograd, "FILTER_IN_INPUT_LAUNCH", filter_in_input)
    monkeypatch.setattr(winograd, "VECTOR_ROWS", vector_rows)
    name = NAMES[m, r]
    opts = dict(padding=(r - 1) // 2)
    plan = algos.REGISTRY[name]._plan(_problem((N, C, H, W), (K, C, r, r), **opts), "forward")
    assert len(plan["chunks"]) == 3 and plan["vec_rows"] == vector_rows
    assert (plan["filter"] is None) == filter_in_input
    _check_float32_both_directions(gpu, rng, name, (N, C, H, W), (K, C, r, r), opts)


@pytest.mark.gpu   # the `gpu` fixture alone does not mark it: gpu_suite.sh selects -m gpu
@pytest.mark.parametrize("m,r", VARIANTS)
@pytest.mark.parametrize("offset", [0, 1, 2])
def test_gpu_output_rows_into_unaligned_memory(gpu, rng, m, r, offset):
    # run() into an output that starts 4 or 8 bytes past an aligned address:
    # the vector rows must fall back to one store per value.
    N, C, H, W, K = 2, 4, 8, 8, 3
    name = NAMES[m, r]
    x, w = rng.standard_normal((N, C, H, W)).astype(np.float32), rng.standard_normal((K, C, r, r)).astype(np.float32)
    opts = dict(padding=(r - 1) // 2)
    p = _problem(x.shape, w.shape, **opts)
    buffer = gpu.full(N * K * H * W + offset, np.nan, dtype=np.float32)
    out = buffer[offset:].reshape(N, K, H, W)
    algos.REGISTRY[name].run(p, "forward", gpu.asarray(x), gpu.asarray(w), out)
    if offset:
        assert bool(gpu.isnan(buffer[:offset]).all())
    assert_close(out, conv2d_forward(x.astype(F64), w.astype(F64), **opts), np.float32,
                 algorithm=name, what="forward")


def _cublas_strided_batched(buffer, head, a_offset, mid, b_offset, tail, c_offset, last, itemsize=None):
    """What cublas<t>gemmStridedBatched(handle, transa, transb, m, n, k, alpha,
    A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC, batch) does with the
    arguments of winograd._gemm_arguments on a flat host buffer (column-major:
    element (i, j) of an operand at i + j * ld; byte offsets from the buffer
    start, in elements of ``itemsize`` bytes, the arguments' element size: the
    buffer's by default; cuBLAS's A is the row-major product's right operand)."""
    import ctypes
    itemsize = itemsize or buffer.itemsize
    op_a, op_b, m, n, k, alpha_ptr = head
    lda, stride_a = mid
    ldb, stride_b, beta_ptr = tail
    ldc, stride_c, batch = last
    scalar = ctypes.c_double if itemsize == 8 else ctypes.c_float
    alpha, beta = scalar.from_address(alpha_ptr).value, scalar.from_address(beta_ptr).value
    assert alpha == 1.0 and beta in (0.0, 1.0)

    def operand(offset, ld, stride, rows, cols, b):
        # rows x cols column-major at ld, batch entry b
        start = offset // itemsize + b * stride
        idx = start + np.arange(rows)[:, None] + np.arange(cols)[None, :] * ld
        return buffer[idx]

    for b in range(batch):
        a = operand(a_offset, lda, stride_a, *((k, m) if op_a else (m, k)), b)
        bb = operand(b_offset, ldb, stride_b, *((n, k) if op_b else (k, n)), b)
        c = (a.T if op_a else a) @ (bb.T if op_b else bb)
        start = c_offset // itemsize + b * stride_c
        idx = start + np.arange(m)[:, None] + np.arange(n)[None, :] * ldc
        buffer[idx] = c + (beta * buffer[idx] if beta else 0)


@pytest.mark.parametrize("nhwc", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("alpha2,Kout,Cin,full,tiles", [(16, 3, 5, 7, 7), (36, 7, 5, 9, 4), (4, 2, 3, 1, 1)])
def test_gemm_arguments_compute_the_row_major_products(nhwc, dtype, alpha2, Kout, Cin, full, tiles, rng):
    # The raw cuBLAS arguments of a (possibly short) batch chunk, run by a NumPy
    # model of cuBLAS on a workspace laid out as the kernels lay it out, give
    # M[a] = U[a] V[a] (NCHW) or V[a] U[a]^T (NHWC).
    workspace = np.full(sum(winograd._workspace_parts(alpha2, Kout, Cin, full)), np.nan, dtype)
    u, v, m = winograd.workspace_views(workspace, alpha2, Kout, Cin, tiles, nhwc, full_tiles=full)
    u[...] = rng.standard_normal(u.shape)
    v[...] = rng.standard_normal(v.shape)
    v_offset, m_offset = winograd._workspace_offsets(alpha2, Kout, Cin, full)
    args = winograd._gemm_arguments(nhwc, alpha2, Kout, Cin, tiles, workspace.itemsize, v_offset, m_offset)
    _cublas_strided_batched(workspace, *args)
    expected = v @ u.transpose(0, 2, 1) if nhwc else u @ v
    # Each entry against the rounding of its own terms (sum |u||v|): an entry that cancels to
    # near zero has no relative precision (an rtol alone flaked on random float32 data).
    magnitude = np.abs(v) @ np.abs(u).transpose(0, 2, 1) if nhwc else np.abs(u) @ np.abs(v)
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    assert np.all(np.abs(m - expected) <= rtol * magnitude), np.max(np.abs(m - expected) / magnitude)


@pytest.mark.parametrize("nhwc", [False, True])
@pytest.mark.parametrize("beta", [0.0, 1.0])
@pytest.mark.parametrize("alpha2,K,C,splits,full,st", [(16, 3, 5, 2, 8, 8), (36, 7, 5, 3, 12, 4), (4, 2, 1, 1, 4, 4)])
def test_wgrad_gemm_arguments_compute_the_row_major_products(nhwc, beta, alpha2, K, C, splits, full, st, rng):
    # Backward filter: Mw[b] = Dt[b] Xt[b]^T (+ Mw[b] after the first batch chunk)
    # from the raw cuBLAS arguments, on a workspace laid out as
    # wgrad_workspace_views lays it out (a short chunk: st < full split tiles).
    workspace = np.full(sum(winograd._wgrad_parts(alpha2, K, C, splits, full)), np.nan, np.float64)
    mw, xt, dt = winograd.wgrad_workspace_views(workspace, alpha2, K, C, splits, full, st, nhwc)
    for view in (mw, xt, dt):
        view[...] = rng.standard_normal(view.shape)
    before = mw.copy()
    xt_offset, dt_offset = winograd._wgrad_offsets(alpha2, K, C, splits, full)
    assert xt.ctypes.data - workspace.ctypes.data == xt_offset * 8
    assert dt.ctypes.data - workspace.ctypes.data == dt_offset * 8
    args = winograd._wgrad_gemm_arguments(nhwc, alpha2 * splits, K, C, st, 8, xt_offset, dt_offset, beta)
    _cublas_strided_batched(workspace, *args)
    product = dt.transpose(0, 2, 1) @ xt if nhwc else dt @ xt.transpose(0, 2, 1)
    np.testing.assert_allclose(mw, product + beta * before, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("nhwc", [False, True])
@pytest.mark.parametrize("alpha2,Kout,Cin,tiles", [(16, 3, 5, 7), (36, 7, 5, 1), (36, 64, 64, 9)])
def test_workspace_views_fit_and_do_not_overlap(nhwc, alpha2, Kout, Cin, tiles):
    # run() carves U, V and M out of one allocation; a short last chunk takes
    # fewer tiles.  Mark each view's elements: no overlap, nothing outside.
    total = sum(winograd._workspace_parts(alpha2, Kout, Cin, tiles))
    for t in (tiles, max(1, tiles // 2)):
        workspace = np.zeros(total)
        u, v, m = winograd.workspace_views(workspace, alpha2, Kout, Cin, t, nhwc, full_tiles=tiles)
        # The offsets the kernels and the GEMM use: the same for a short chunk.
        v_offset, m_offset = winograd._workspace_offsets(alpha2, Kout, Cin, tiles)
        assert v.ctypes.data - workspace.ctypes.data == v_offset * workspace.itemsize
        assert m.ctypes.data - workspace.ctypes.data == m_offset * workspace.itemsize
        assert u.shape == (alpha2, Kout, Cin)
        assert v.shape == ((alpha2, t, Cin) if nhwc else (alpha2, Cin, t))
        assert m.shape == ((alpha2, t, Kout) if nhwc else (alpha2, Kout, t))
        for view in (u, v, m):
            assert np.shares_memory(view, workspace) and view.flags.c_contiguous
            view += 1
        assert workspace.max() == 1 and workspace.sum() == u.size + v.size + m.size
        for view in (v, m):   # 256-byte aligned parts, given an aligned allocation
            assert (view.ctypes.data - workspace.ctypes.data) // workspace.itemsize % 64 == 0


# --- backward filter: F(3x3, 2x2), F(3x3, 4x4), F(5x5, 2x2), F(5x5, 3x3), F(5x5, 4x4) -----

# (m, r) -> name: backward filter F(r x r, m x m).
WGRAD = {(2, 3): "winograd_wgrad_f3x3_2x2", (4, 3): "winograd_wgrad_f3x3_4x4", (2, 5): "winograd_wgrad_f5x5_2x2",
         (3, 5): "winograd_wgrad_f5x5_3x3", (4, 5): "winograd_wgrad_f5x5_4x4"}
WGRAD_VARIANTS = winograd.WGRAD_VARIANTS
WGRAD_3X3 = {m: name for (m, r), name in WGRAD.items() if r == 3}


def _weight_gradient_1d(x, dy):
    """dw[j] = sum_i x[i + j] dy[i], the definition the backward-filter transforms must reproduce."""
    return [sum(x[i + j] * dy[i] for i in range(len(dy))) for j in range(len(x) - len(dy) + 1)]


@pytest.mark.parametrize("m,r", WGRAD_VARIANTS)
def test_wgrad_transforms_compute_the_weight_gradient_exactly(m, r):
    at, g, bt = winograd.wgrad_toom_cook(m, r)
    alpha = m + r - 1
    assert (len(at), len(at[0]), len(g), len(g[0]), len(bt), len(bt[0])) == (r, alpha, alpha, m, alpha, alpha)
    assert bt == winograd.toom_cook(m, r)[2]     # the same points: the forward input transform
    rng = random.Random(10 * r + m)
    for _ in range(30):
        x = [_fraction(rng) for _ in range(alpha)]
        dy = [_fraction(rng) for _ in range(m)]
        u = [sum(row[j] * dy[j] for j in range(m)) for row in g]
        v = [sum(row[j] * x[j] for j in range(alpha)) for row in bt]
        assert [sum(row[a] * u[a] * v[a] for a in range(alpha)) for row in at] == _weight_gradient_1d(x, dy)
    # Unit vectors pin every entry: tap j of dw picks x[i + j] dy[i].
    for i in range(m):
        for k in range(alpha):
            got = [sum(at[j][a] * g[a][i] * bt[a][k] for a in range(alpha)) for j in range(r)]
            assert got == [Fraction(int(k == i + j)) for j in range(r)]
    # Two sums of tiles = the sum of the transformed products (linearity: the
    # sum over tiles moves inside the inverse transform).
    xs = [[_fraction(rng) for _ in range(alpha)] for _ in range(2)]
    dys = [[_fraction(rng) for _ in range(m)] for _ in range(2)]
    prods = [sum(sum(g[a][j] * dy[j] for j in range(m)) * sum(bt[a][j] * x[j] for j in range(alpha))
                 for x, dy in zip(xs, dys)) for a in range(alpha)]
    want = [a + b for a, b in zip(*(_weight_gradient_1d(x, dy) for x, dy in zip(xs, dys)))]
    assert [sum(row[a] * prods[a] for a in range(alpha)) for row in at] == want


def _wgrad_reference(x, dy, padding, layout="NCHW"):
    K = dy.shape[1] if layout == "NCHW" else dy.shape[3]
    C = x.shape[1] if layout == "NCHW" else x.shape[3]
    H, P = (x.shape[2], dy.shape[2]) if layout == "NCHW" else (x.shape[1], dy.shape[1])
    r = H + 2 * padding - P + 1
    return conv2d_backward_filter(x, dy, (K, C, r, r), padding=padding, layout=layout)


@settings(max_examples=40, deadline=None)
@given(mr=st.sampled_from(WGRAD_VARIANTS), n=st.integers(1, 2), c=st.integers(1, 4),
       k=st.integers(1, 4), h=st.sampled_from((1, 3, 7, 13)), w_=st.sampled_from((1, 3, 7, 13)),
       padding=st.integers(0, 5), seed=st.integers(0, 2**32 - 1))
def test_wgrad_stages_on_numpy_match_the_reference(mr, n, c, k, h, w_, padding, seed):
    m, r = mr
    P, Q = h + 2 * padding - r + 1, w_ + 2 * padding - r + 1
    if min(P, Q) < 1:
        return
    rng = np.random.default_rng(seed)
    x, dy = random_array(rng, (n, c, h, w_)), random_array(rng, (n, k, P, Q))
    got = winograd.emulate_wgrad(x, dy, m, (padding, padding), F64)
    np.testing.assert_allclose(got, _wgrad_reference(x, dy, padding), rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("m,r", WGRAD_VARIANTS)
def test_wgrad_float32_error_is_within_the_tolerance_row(m, r):
    # float32 transforms and GEMM against the float64 reference, N(0, 1) data
    # (the long sums are measured on the GPU too: notes/wino_wgrad.md, notes/wino5.md).
    rng = np.random.default_rng(8)
    pad = (r - 1) // 2
    x, dy = rng.standard_normal((4, 32, 24, 24)), rng.standard_normal((4, 48, 24, 24))
    err = relative_error(winograd.emulate_wgrad(x, dy, m, (pad, pad), np.float32), _wgrad_reference(x, dy, pad))
    bound = TOLERANCES[("float32", WGRAD[m, r])]
    assert err <= bound / 2
    assert algos.REGISTRY[WGRAD[m, r]].strict == (bound <= TOLERANCES[("float32", "default")])


def _run_wgrad_kernels_on_numpy(algorithm, p, x, dy):
    """The plan, workspace views and the three kernels' index math of
    WinogradBackwardFilter.run, emulated on NumPy (vectorised over the thread
    index i): catches layout, split, zero-fill and chunking mistakes off the GPU."""
    m, alpha = algorithm.m, algorithm.alpha
    at, g, bt = winograd.matrices(m, F64, wgrad=True, r=algorithm.r)
    plan = algorithm.plan(p)
    nhwc, splits, alpha2 = plan["nhwc"], plan["splits"], plan["alpha2"]
    workspace = np.full(plan["elements"], np.nan)     # uninitialised memory
    xf, dyf = x.ravel(), dy.ravel()
    mw = None

    def transform(src, tile, mat, plane, ch, t, live, index):
        # Gather the tile (zero where masked), apply mat on both sides.
        vals = np.zeros((plane,) + tile)
        for r in range(tile[0]):
            for s in range(tile[1]):
                idx, ok = index(r, s)
                ok = ok & live
                vals[ok, r, s] = src[idx[ok]]
        return np.einsum("ai,tij,bj->tab", mat, vals, mat).reshape(plane, -1)

    for (_, split_tiles, beta, _, x_args, _, dy_args), gemm_args in zip(plan["chunks"], plan["gemms"]):
        mw, xt, dt = winograd.wgrad_workspace_views(workspace, alpha2, p.K, p.C, splits,
                                                    plan["full_split_tiles"], split_tiles, nhwc)
        for args, view, src, is_x in ((x_args, xt, xf, True), (dy_args, dt, dyf, False)):
            if is_x:
                C, H, W, ph, pw, tiles_h, tiles_w, tiles, n0, S, ST = (int(v) for v in args)
            else:
                C, H, W, tiles_h, tiles_w, tiles, n0, S, ST = (int(v) for v in args)
                ph = pw = 0
            plane = C * S * ST
            i = np.arange(plane)
            if nhwc:
                c, t = i % C, i // C
            else:
                c, t = (i // ST) % C, (i // ST // C) * ST + i % ST
            live = t < tiles
            tw, th, n = t % tiles_w, (t // tiles_w) % tiles_h, n0 + t // (tiles_w * tiles_h)
            size = alpha if is_x else m

            def index(r, s):
                h, w = th * m - ph + r, tw * m - pw + s
                ok = (h >= 0) & (h < H) & (w >= 0) & (w < W)
                idx = ((n * H + h) * W + w) * C + c if nhwc else ((n * C + c) * H + h) * W + w
                return np.where(ok, idx, 0), ok

            out = transform(src, (size, size), bt if is_x else g, plane, c, t, live, index)
            flat = view.reshape(-1)
            for a in range(alpha2):
                flat[a * plane + i] = out[:, a]
        # The run's raw cuBLAS arguments (offsets in the plan's accumulation type).
        _cublas_strided_batched(workspace, *gemm_args, itemsize=np.dtype(plan["acc"]).itemsize)
    return _wgrad_output_kernel_on_numpy(mw.reshape(-1), p.K, p.C, splits, alpha, algorithm.r, at)


def _wgrad_output_kernel_on_numpy(mw, K, C, splits, alpha, r, at):
    """winograd_wgrad_output_transform's blocks on NumPy (vectorised over the 32
    lanes): pairs i0 .. i0 + 31 a block, warp w summing the splits of points
    w, w + 8, .., warp r taking output row r, the block's filters written as one run."""
    plane, rr = K * C, r * r
    dw = np.full(plane * rr, np.nan)
    lanes = np.arange(32)
    for i0 in range(0, plane, 32):
        i = i0 + lanes
        ok = i < plane
        mts = np.full((alpha * alpha, 32), np.nan)
        for warp in range(8):
            for a in range(warp, alpha * alpha, 8):
                total = np.zeros(ok.sum())
                for j in range(splits):
                    total += mw[a * splits * plane + j * plane + i[ok]]
                mts[a, ok] = total
        outs = np.full(32 * rr, np.nan)
        for row in range(r):
            am = [sum(at[row, j] * mts[j * alpha + s] for j in range(alpha)) for s in range(alpha)]
            for s in range(r):
                outs[lanes[ok] * rr + row * r + s] = sum(am[j] * at[s, j] for j in range(alpha))[ok]
        pairs = min(32, plane - i0)
        dw[i0 * rr:(i0 + pairs) * rr] = outs[:pairs * rr]
    return dw.reshape(K, C, r, r)


@pytest.mark.parametrize("m,r", WGRAD_VARIANTS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("bound,target,min_depth,max_depth", [
    (None, None, None, None),           # the shipped constants: one chunk, one split
    (1, 1, 1, 5),                        # one image a chunk, several splits with a ragged last one
    ("two", 100, 3, 64),                 # two images a chunk, the last chunk short
])
def test_wgrad_kernel_index_math_on_numpy(monkeypatch, m, r, layout, bound, target, min_depth, max_depth):
    rng = np.random.default_rng(m)
    N, C, H, W, K, padding = 3, 9, 9, 7, 5, (r - 1) // 2   # K * C = 45: two output blocks, one ragged
    p = _problem((N, C, H, W) if layout == "NCHW" else (N, H, W, C), (K, C, r, r), F64,
                 padding=padding, layout=layout)
    if bound is not None:
        per_image = (m + r - 1) ** 2 * (C + K) * ceil_div(H, m) * ceil_div(W, m) * 8
        monkeypatch.setattr(winograd, "WORKSPACE_BOUND", 2 * per_image if bound == "two" else bound)
        monkeypatch.setattr(winograd, "WGRAD_TARGET_BLOCKS", target)
        monkeypatch.setattr(winograd, "WGRAD_MIN_SPLIT_DEPTH", min_depth)
        monkeypatch.setattr(winograd, "WGRAD_MAX_SPLIT_DEPTH", max_depth)
    algorithm = algos.REGISTRY[WGRAD[m, r]]
    plan = algorithm.plan(p)
    if bound is not None:
        assert plan["splits"] > 1 and len(plan["chunks"]) > 1
    x, dy = random_array(rng, p.x_shape), random_array(rng, p.y_shape)
    got = _run_wgrad_kernels_on_numpy(algorithm, p, x, dy)
    np.testing.assert_allclose(got, _wgrad_reference(x, dy, padding, layout), rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("m,r", WGRAD_VARIANTS)
def test_wgrad_refuses_what_it_cannot_compute(m, r):
    algorithm = algos.REGISTRY[WGRAD[m, r]]
    for opts, w_shape, match in _bad_inputs(r):
        ok, reason = algorithm.supports(_problem((2, 4, 9, 9), w_shape, **opts), "backward_filter")
        assert not ok and match in reason
    good = _problem((2, 4, 9, 9), (8, 4, r, r), padding=(r - 1) // 2)
    for direction in ("forward", "backward_data"):
        ok, reason = algorithm.supports(good, direction)
        assert not ok and direction in reason
    assert algorithm.supports(good, "backward_filter") == (True, "")


def test_wgrad_refusals_reach_the_public_functions():
    x, dy = np.ones((2, 4, 9, 9)), np.ones((2, 8, 9, 9))
    with pytest.raises(ValueError, match="does not support this backward_filter problem: it needs stride 1"):
        conv2d_backward_filter(x, np.ones((2, 8, 5, 5)), (8, 4, 3, 3), stride=2, padding=1, algo=WGRAD[2, 3])
    with pytest.raises(ValueError, match="does not support this forward problem"):
        conv2d_forward(x, np.ones((8, 4, 3, 3)), padding=1, algo=WGRAD[4, 3])
    with pytest.raises(ValueError, match="5x5 filters only"):
        conv2d_backward_filter(x, dy, (8, 4, 3, 3), padding=1, algo=WGRAD[2, 5])
    assert conv2d_backward_filter(x, dy, (8, 4, 3, 3), padding=1, algo=WGRAD[2, 3]).shape == (8, 4, 3, 3)
    assert conv2d_backward_filter(x, dy, (8, 4, 5, 5), padding=2, algo=WGRAD[2, 5]).shape == (8, 4, 5, 5)


def test_wgrad_workspace_is_reported_exactly_bounded_and_limits_the_choice(monkeypatch, rule_only):
    p = _problem((32, 256, 56, 56), (256, 256, 3, 3))        # vgg_3_2
    for m, name in WGRAD_3X3.items():
        algorithm = algos.REGISTRY[name]
        alpha2 = (m + 2) ** 2
        tiles, chunk, splits, st = winograd.wgrad_sizes(p, m)
        assert tiles == ceil_div(56, m) ** 2
        per_image = alpha2 * 512 * tiles * 4
        assert chunk * per_image <= winograd.WORKSPACE_BOUND
        assert chunk == 32 or (chunk + 1) * per_image > winograd.WORKSPACE_BOUND
        assert st * splits >= chunk * tiles and st <= winograd.WGRAD_MAX_SPLIT_DEPTH
        need = algorithm.workspace_bytes(p, "backward_filter")
        assert need == 4 * (alpha2 * splits * 256 * 256 + 2 * alpha2 * splits * 256 * st)
        assert need <= winograd.WORKSPACE_BOUND * 1.1 + 4 * alpha2 * splits * 256 * 256
        assert algos.admits(algorithm, p, "backward_filter", algos.ConvOptions(workspace_limit=need))[0]
        ok, reason = algos.admits(algorithm, p, "backward_filter", algos.ConvOptions(workspace_limit=need - 1))
        assert not ok and "workspace_limit" in reason
    monkeypatch.setattr(winograd, "WORKSPACE_BOUND", 1)   # one image a chunk: less workspace
    assert winograd.wgrad_sizes(p, 2)[1] == 1
    assert algos.REGISTRY[WGRAD[2, 3]].workspace_bytes(p, "backward_filter") < need
    monkeypatch.undo()
    assert algos.explain_auto(p, "backward_filter", algos.ConvOptions(workspace_limit=0))[0] not in WGRAD.values()
    needs = {algos.REGISTRY[name].workspace_bytes(p, "backward_filter"): name for name in WGRAD_3X3.values()}
    assert algos.explain_auto(p, "backward_filter", algos.ConvOptions(workspace_limit=min(needs)))[0] == \
        needs[min(needs)]


def test_wgrad_splits_fill_the_gpu_within_the_depth_bounds():
    small = _problem((32, 128, 28, 28), (128, 128, 3, 3))      # r50_3_3x3
    for m in WGRAD_3X3:
        tiles, chunk, splits, st = winograd.wgrad_sizes(small, m)
        assert splits > 1 and winograd.WGRAD_MIN_SPLIT_DEPTH <= st <= winograd.WGRAD_MAX_SPLIT_DEPTH
        assert st % 4 == 0 and (splits - 1) * st < chunk * tiles <= splits * st
    deep = _problem((32, 512, 7, 7), (512, 512, 3, 3))          # r50_5_3x3: K x C fills it already
    assert winograd.wgrad_sizes(deep, 2)[2] == 1


def test_auto_takes_winograd_wgrad_for_wide_large_3x3_float32_only(rule_only):
    def auto(x_shape, w_shape, dtype=np.float32, **opts):
        return algos.explain_auto(_problem(x_shape, w_shape, dtype, **opts), "backward_filter")[0]

    big = (32, 64, 56, 56)    # r50_2_3x3: 7.4 GFLOP
    assert auto(big, (64, 64, 3, 3)) in WGRAD.values()
    assert auto((32, 256, 56, 56), (256, 256, 3, 3)) in WGRAD.values()
    assert auto((1, 64, 56, 56), (64, 64, 3, 3)) == "implicit_gemm_wgrad"       # 0.23 GFLOP
    assert auto((32, 32, 56, 56), (64, 32, 3, 3)) == "implicit_gemm_wgrad"      # C < 64
    assert auto(big, (64, 64, 3, 3), np.float16) == "implicit_gemm_wgrad"
    assert auto(big, (64, 64, 3, 3), stride=2) == "implicit_gemm_wgrad"
    name, reason = dnnprims.conv2d_choose(big, (64, 64, 3, 3), padding=1, direction="backward_filter",
                                          precision="strict")
    assert name in WGRAD.values() and "Winograd" in reason


WGRAD_GPU_CASES = [
    # (N, C, H, W, K, padding, layout)
    pytest.param((2, 5, 9, 11, 7, 1, "NCHW"), id="odd"),
    pytest.param((3, 6, 13, 7, 4, 0, "NHWC"), id="nhwc-pad0"),
    pytest.param((1, 3, 7, 7, 2, 2, "NCHW"), id="pad2"),
    pytest.param((2, 4, 6, 5, 3, 3, "NHWC"), id="pad3"),
    pytest.param((1, 1, 1, 1, 1, 1, "NCHW"), id="one-pixel"),
    pytest.param((1, 13, 3, 13, 7, 1, "NHWC"), id="sizes-1-3-7-13"),
]


@pytest.mark.gpu   # the `gpu` fixture alone does not mark it: gpu_suite.sh selects -m gpu
@pytest.mark.parametrize("m,r", WGRAD_VARIANTS)
@pytest.mark.parametrize("case", WGRAD_GPU_CASES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_gpu_wgrad_matches_reference(gpu, rng, m, r, case, dtype):
    N, C, H, W, K, padding, layout = case
    padding += r - 3     # the same output sizes for r x r filters
    p = _problem((N, C, H, W) if layout == "NCHW" else (N, H, W, C), (K, C, r, r), dtype,
                 padding=padding, layout=layout)
    x, dy = random_array(rng, p.x_shape, dtype), random_array(rng, p.y_shape, dtype)
    opts = dict(padding=padding, layout=layout)
    dw = conv2d_backward_filter(gpu.asarray(x), gpu.asarray(dy), (K, C, r, r), algo=WGRAD[m, r], **opts)
    assert dw.dtype == dtype
    assert_close(dw, _wgrad_reference(x.astype(F64), dy.astype(F64), padding, layout), dtype,
                 algorithm=WGRAD[m, r], what="backward_filter")


@pytest.mark.gpu   # the `gpu` fixture alone does not mark it: gpu_suite.sh selects -m gpu
@pytest.mark.parametrize("m,r", WGRAD_VARIANTS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_gpu_wgrad_wide_channels_in_chunks_and_splits(gpu, rng, monkeypatch, m, r, layout):
    # 128 x 96 channels (several GEMM tiles), a workspace bound of two images so
    # the batch of 5 runs in three chunks (beta = 1 after the first), and
    # splits with a ragged last run.
    N, C, H, K = 5, 128, 10, 96
    pad = (r - 1) // 2
    per_image = (m + r - 1) ** 2 * (C + K) * ceil_div(H, m) ** 2 * 4
    monkeypatch.setattr(winograd, "WORKSPACE_BOUND", 2 * per_image)
    monkeypatch.setattr(winograd, "WGRAD_MIN_SPLIT_DEPTH", 7)
    monkeypatch.setattr(winograd, "WGRAD_MAX_SPLIT_DEPTH", 9)
    p = _problem((N, C, H, H) if layout == "NCHW" else (N, H, H, C), (K, C, r, r), np.float32, layout=layout,
                 padding=pad)
    plan = algos.REGISTRY[WGRAD[m, r]].plan(p)
    assert plan["splits"] > 1 and len(plan["chunks"]) == 3
    x = rng.standard_normal(p.x_shape).astype(np.float32)
    dy = rng.standard_normal(p.y_shape).astype(np.float32)
    dw = conv2d_backward_filter(gpu.asarray(x), gpu.asarray(dy), (K, C, r, r), padding=pad, layout=layout,
                                algo=WGRAD[m, r])
    want = _wgrad_reference(x.astype(F64), dy.astype(F64), pad, layout)
    assert_close(dw, want, np.float32, algorithm=WGRAD[m, r], what="backward_filter")
    again = conv2d_backward_filter(gpu.asarray(x), gpu.asarray(dy), (K, C, r, r), padding=pad, layout=layout,
                                   algo=WGRAD[m, r])
    assert bool((again == dw).all())    # deterministic: splits add in order


# --- 5x5: the auto rule and the workspace ---------------------------------------------

def test_auto_takes_winograd_for_wide_large_5x5_float32_only(rule_only):
    def auto(x_shape, w_shape, dtype=np.float32, direction="forward", options=algos.DEFAULT_OPTIONS, **opts):
        opts.setdefault("padding", 2)
        return algos.explain_auto(_problem(x_shape, w_shape, dtype, **opts), direction, options)[0]

    alex = (32, 64, 27, 27), (192, 64, 5, 5)      # alex_conv2_5x5: 14.3 GFLOP
    # The larger tile first (measured fastest at batch 32: notes/wino5b.md).
    assert auto(*alex) == NAMES[4, 5]
    assert auto(*alex, direction="backward_data") == NAMES[4, 5]
    assert auto(*alex, direction="backward_filter") == WGRAD[4, 5]
    # Batch 1 (0.45 GFLOP): F(2x2, 5x5) first for forward / backward data; backward
    # filter keeps the 4 GFLOP threshold.
    b1 = (1, 64, 27, 27), (192, 64, 5, 5)
    assert auto(*b1) == NAMES[2, 5]
    assert auto(*b1, direction="backward_data") == NAMES[2, 5]
    winograd_5x5 = tuple(NAMES[m, 5] for m in (2, 3, 4)) + tuple(WGRAD[m, 5] for m in (2, 3, 4))
    assert auto(*b1, direction="backward_filter") not in winograd_5x5
    assert auto((1, 64, 7, 7), (64, 64, 5, 5)) not in winograd_5x5      # 10 MFLOP
    for direction in algos.DIRECTIONS:
        assert auto((32, 32, 27, 27), (192, 32, 5, 5), direction=direction) not in winograd_5x5
        assert auto(*alex, np.float16, direction=direction) not in winograd_5x5
        assert auto(*alex, stride=2, direction=direction) not in winograd_5x5
    name, reason = dnnprims.conv2d_choose(*alex, padding=2, precision="strict")
    assert name == NAMES[4, 5] and "Winograd" in reason
    # Every variant in the rule, in order: a workspace limit between them walks it.
    p = _problem(*alex, padding=2)
    for direction, names in (("forward", [NAMES[m, 5] for m in (4, 3, 2)]),
                             ("backward_filter", [WGRAD[m, 5] for m in (4, 3, 2)])):
        assert [n for n, _ in algos._winograd_5x5_preferences(p, direction)] == names
    f4 = algos.REGISTRY[NAMES[4, 5]].workspace_bytes(p, "forward")
    f3 = algos.REGISTRY[NAMES[3, 5]].workspace_bytes(p, "forward")
    assert f4 < f3
    limited = algos.ConvOptions(workspace_limit=f4 - 1)
    assert auto(*alex, options=limited) not in (NAMES[4, 5], NAMES[3, 5])


def test_5x5_workspace_is_reported_exactly_and_limits_the_choice(rule_only):
    p = _problem((32, 64, 27, 27), (192, 64, 5, 5), padding=2)
    tiles = 14 * 14
    f = algos.REGISTRY[NAMES[2, 5]]
    # U, V, M in one allocation (U and V rounded up to 64 elements), the whole batch in one chunk.
    for direction, cin, kout in (("forward", 64, 192), ("backward_data", 192, 64)):
        want = 4 * (ceil_div(36 * 192 * 64, 64) * 64 + ceil_div(36 * cin * 32 * tiles, 64) * 64
                    + 36 * kout * 32 * tiles)
        assert f.workspace_bytes(p, direction) == want
        limit = algos.ConvOptions(workspace_limit=want - 1)
        assert algos.explain_auto(p, direction, limit)[0] != NAMES[2, 5]
    wg = algos.REGISTRY[WGRAD[2, 5]]
    _, chunk, splits, st = winograd.wgrad_sizes(p, 2)
    assert chunk == 32 and splits * st >= 32 * tiles and st <= winograd.WGRAD_MAX_SPLIT_DEPTH
    need = wg.workspace_bytes(p, "backward_filter")
    assert need == 4 * (36 * splits * 192 * 64 + ceil_div(36 * splits * 64 * st, 64) * 64 + 36 * splits * 192 * st)
    limit = algos.ConvOptions(workspace_limit=need - 1)
    assert algos.explain_auto(p, "backward_filter", limit)[0] != WGRAD[2, 5]
    # F(5x5, 4x4): 8 x 8 x tiles, 7 x 7 of them an image; 2.2x less transformed data.
    w4 = algos.REGISTRY[WGRAD[4, 5]]
    _, chunk, splits, st = winograd.wgrad_sizes(p, 4)
    assert chunk == 32 and splits * st >= 32 * 49 and st <= winograd.WGRAD_MAX_SPLIT_DEPTH
    need4 = w4.workspace_bytes(p, "backward_filter")
    assert need4 == 4 * (64 * splits * 192 * 64 + ceil_div(64 * splits * 64 * st, 64) * 64 + 64 * splits * 192 * st)
    assert need4 < need
    assert algos.explain_auto(p, "backward_filter", algos.ConvOptions(workspace_limit=need4 - 1))[0] != WGRAD[4, 5]


@pytest.mark.parametrize("direction", ["forward", "backward_data"])
@pytest.mark.parametrize("N", [1, 3, 7, 13])
@pytest.mark.parametrize("images_a_chunk", [1, 2, 4, 5, None])
def test_batch_chunks_cover_each_image_once_within_the_workspace(monkeypatch, direction, N, images_a_chunk):
    # The forward / backward-data plan on a faked device: its chunks (n0, tiles)
    # cover images 0..N-1 once, in order, each within the full chunk's workspace
    # parts, and the plan's workspace is what workspace_bytes reports.
    import cupy
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 0)
    m, r = 4, 3
    p = _problem((N, 5, 11, 9), (6, 5, r, r), np.float32)
    algorithm = algos.REGISTRY[NAMES[m, r]]
    tiles, _, _, per_image = winograd._sizes(p, direction, m)
    if images_a_chunk is not None:
        monkeypatch.setattr(winograd, "WORKSPACE_BOUND", images_a_chunk * per_image)
    monkeypatch.setattr(algorithm, "_plans", {})
    plan = algorithm._plan(p, direction)
    chunk = min(N, images_a_chunk or N)
    images = []
    for n0, t, in_grid, in_args, out_grid, out_args, _ in plan["chunks"]:
        assert t % tiles == 0 and 0 < t <= plan["max_tiles"] == chunk * tiles
        assert int(in_args[8]) == int(out_args[6]) == n0 and int(in_args[7]) == int(out_args[5]) == t
        assert max(in_grid + out_grid) < 2**31
        images += range(int(n0), int(n0) + t // tiles)
    assert images == list(range(N))
    assert plan["elements"] * plan["acc"].itemsize == algorithm.workspace_bytes(p, direction)
