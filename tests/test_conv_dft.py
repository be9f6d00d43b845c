"""The "dft" convolution (dnnprims/algos/dft.py): transform matrices against
their definition, the whole bookkeeping on NumPy in float64, the GPU against
the float64 reference, refusals, workspace and the auto rule.  (The registry
test in test_conv.py runs it on every generic case, dtype and layout too.)"""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import dnnprims
from dnnprims import algos
from dnnprims.algos import dft as dft_algo
from dnnprims.conv import conv2d_backward_data, conv2d_backward_filter, conv2d_forward
from dnnprims.testing.strategies import fft_conv_problems

from conftest import random_array
from test_conv import (CASES, FFT_CASES, HYPOTHESIS, _check_all_directions, _options, _problem_of,
                       _random_problem)

F64 = np.float64
DFT = algos.REGISTRY["dft"]

# Extra shapes for "dft": the two public large-filter layers at a small batch
# (T = 59 and 29: odd transform lengths), a filter larger than the image,
# negative backward-data padding (padding > E - 1), a 1-pixel image.
DFT_CASES = FFT_CASES + [
    pytest.param((2, 3, 27, 27, 5, 5, 5, 1, 2, 1, 1), id="alex-5x5-shape"),
    pytest.param((1, 2, 20, 17, 3, 7, 7, 1, 3, 1, 1), id="7x7-odd-T"),
    pytest.param((2, 2, 7, 9, 3, 3, 3, 1, (4, 3), 1, 1), id="3x3-pad4-negative-bwd-pad"),
    pytest.param((1, 2, 1, 1, 3, 1, 1, 1, 0, 1, 1), id="one-pixel"),
]


@st.composite
def _odd_problems(draw):
    """Stride-1 problems with odd and prime sizes, filters 1..13, padding 0..3."""
    R, S = draw(st.integers(1, 13)), draw(st.integers(1, 13))
    dilation = draw(st.sampled_from([1, 2]))
    padding = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
    sizes = [n for n in (1, 2, 3, 5, 7, 11, 13, 17, 19, 23) if n + 2 * padding[0] >= dilation * (R - 1) + 1]
    H = draw(st.sampled_from(sizes or [dilation * (R - 1) + 1]))
    sizes = [n for n in (1, 2, 3, 5, 7, 11, 13, 17, 19, 23) if n + 2 * padding[1] >= dilation * (S - 1) + 1]
    W = draw(st.sampled_from(sizes or [dilation * (S - 1) + 1]))
    N = draw(st.integers(1, 3))
    C, K = draw(st.sampled_from([1, 3, 16, 24])), draw(st.sampled_from([1, 5, 16, 24]))
    return (N, C, H, W, K, R, S, 1, padding, dilation, 1)


def _run_on_numpy(rng, case, layout):
    x, w, b, opts = _random_problem(rng, case, layout, F64)
    p = _problem_of(x, w, opts)
    y = DFT._run(np, p, "forward", x, w, np.empty(p.y_shape), b)
    np.testing.assert_allclose(y, conv2d_forward(x, w, b, **opts), rtol=1e-11, atol=1e-11)
    dy = random_array(rng, p.y_shape, F64)
    dx = DFT._run(np, p, "backward_data", dy, w, np.empty(p.x_shape))
    np.testing.assert_allclose(dx, conv2d_backward_data(dy, w, x.shape, **opts), rtol=1e-11, atol=1e-11)
    dw = DFT._run(np, p, "backward_filter", x, dy, np.empty(p.w_shape))
    np.testing.assert_allclose(dw, conv2d_backward_filter(x, dy, w.shape, **opts), rtol=1e-11,
                               atol=1e-11)
    return p


# --- transform matrices against their definition ---------------------------------

@pytest.mark.parametrize("size,pad,T", [(7, 2, 10), (5, 0, 5), (6, -2, 6), (4, 3, 9), (1, 0, 1)])
@pytest.mark.parametrize("conj", [False, True])
def test_forward_matrices_are_the_dft_of_the_placed_input(rng, size, pad, T, conj):
    # The dense DFT of a length-T buffer holding v at positions c + pad
    # (dropped outside [0, T)), against numpy.fft.
    v = rng.standard_normal(size)
    buf = np.zeros(T)
    for c in range(size):
        if 0 <= c + pad < T:
            buf[c + pad] = v[c]
    full = np.fft.fft(buf)
    expected = np.conj(full) if conj else full
    half = (v @ dft_algo._forward_w(size, pad, T, conj)).view(np.complex128)
    np.testing.assert_allclose(half, expected[:T // 2 + 1], atol=1e-12)
    np.testing.assert_allclose(dft_algo._forward_h(size, pad, T, conj) @ v, expected, atol=1e-12)


@pytest.mark.parametrize("T,n_out", [(8, 5), (9, 9), (1, 1), (59, 56)])
def test_inverse_matrices_are_the_inverse_dft_of_the_kept_outputs(rng, T, n_out):
    c = rng.standard_normal(T)
    spectrum = np.fft.fft(c)
    np.testing.assert_allclose(dft_algo._inverse_h(n_out, T) @ spectrum / T, c[:n_out], atol=1e-12)
    half = np.ascontiguousarray(spectrum[:T // 2 + 1]).view(np.float64)
    np.testing.assert_allclose(half @ dft_algo._inverse_w(n_out, T, 1.0 / T), c[:n_out], atol=1e-12)


def test_transform_sizes():
    # big_7x7_s1 (56, pad 3): 59 (cuFFT's "fft" uses 60); alex_conv2_5x5 (27, pad 2): 29.
    assert dft_algo.transform_size(56, 7, 3) == 59
    assert dft_algo.transform_size(27, 5, 2) == 29
    assert dft_algo.transform_size(11, 7, 5) == 12     # 7x7 image, 7x7 filter, pad 5: 11 outputs
    assert dft_algo.transform_size(9, 3, -2) == 11     # negative padding: no wrap at all
    p = _problem_of(np.empty((32, 64, 56, 56), np.float32), np.empty((64, 64, 7, 7), np.float32),
                    _options(1, 3, 1, 1))
    for d in algos.DIRECTIONS:
        assert DFT.geometry(p, d).T == (59, 59)


# --- the bookkeeping on NumPy, float64 -------------------------------------------

@pytest.mark.parametrize("case", DFT_CASES + [CASES[0], CASES[1], CASES[6], CASES[9]])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_dft_bookkeeping_on_numpy(rng, case, layout):
    _run_on_numpy(rng, case, layout)


@HYPOTHESIS
@given(problem=fft_conv_problems(), seed=st.integers(0, 2**32 - 1))
def test_dft_bookkeeping_on_numpy_drawn(problem, seed):
    rng = np.random.default_rng(seed)
    (N, *rest), (K, C, R, S) = problem["x_shape"], problem["w_shape"]
    H, W = rest[1:] if problem["layout"] == "NCHW" else rest[:2]
    _run_on_numpy(rng, (N, C, H, W, K, R, S, 1, problem["padding"], problem["dilation"], 1),
                  problem["layout"])


def test_dft_setup_is_cached(rng, monkeypatch):
    monkeypatch.setattr(dft_algo, "_setups", {})
    _run_on_numpy(rng, FFT_CASES[1].values[0], "NCHW")
    _run_on_numpy(rng, FFT_CASES[1].values[0], "NCHW")
    assert len(dft_algo._setups) == 3      # forward, backward data, backward filter


def _forward_geometry(rng, case):
    x, w, _, opts = _random_problem(rng, case, "NCHW", F64)
    return dft_algo.Geometry(_problem_of(x, w, opts), "forward")


def test_filter_chunks_cover_the_rows_evenly(rng, monkeypatch):
    # The filter spectrum's row ranges (helper dft7): contiguous, covering [0, T),
    # each within FILTER_CHUNK_BYTES (at least one row), sizes differing by <= 1.
    g = _forward_geometry(rng, (1, 64, 56, 56, 64, 7, 7, 1, 3, 1, 1))
    assert g.T[0] == 59
    row_bytes = g.half * 64 * 64 * 8                         # complex64 rows
    for limit in (0, 1, row_bytes, 2 * row_bytes + 5, 16 << 20, 1 << 40):
        monkeypatch.setattr(dft_algo, "FILTER_CHUNK_BYTES", limit)
        chunks = dft_algo.filter_chunks(g, 4)
        assert chunks[0][0] == 0 and chunks[-1][1] == 59
        assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
        sizes = [u1 - u0 for u0, u1 in chunks]
        assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
        if limit == 0 or limit >= 59 * row_bytes:
            assert len(chunks) == 1
        elif limit >= row_bytes:
            assert max(sizes) * row_bytes <= limit
        else:
            assert max(sizes) == 1


@pytest.mark.parametrize("rows", [1, 2.5])
def test_dft_bookkeeping_in_filter_chunks_on_numpy(rng, monkeypatch, rows):
    # The filter spectrum made and multiplied in chunks of rows u: one row a
    # chunk, and 2.5 rows' bytes of the forward geometry (ragged ranges); all
    # directions (backward data has its own rows, so other splits).
    for case in (FFT_CASES[2].values[0], FFT_CASES[4].values[0], DFT_CASES[-3].values[0]):
        g = _forward_geometry(rng, case)
        monkeypatch.setattr(dft_algo, "FILTER_CHUNK_BYTES",
                            int(rows * g.half * g.channels_in * g.channels_out * 16))
        assert len(dft_algo.filter_chunks(g, 8)) == (g.T[0] if rows == 1 else -(-g.T[0] // 2))
        _run_on_numpy(rng, case, "NCHW")


@pytest.mark.parametrize("case,dtype,expected", [
    ((2, 64, 56, 56, 64, 7, 7, 1, 3, 1, 1), np.float32, None),        # 49 taps: the cuBLAS path
    ((2, 32, 64, 64, 32, 11, 11, 1, 5, 1, 1), np.float32, 64),        # 121 taps: 64 pairs fit 48 KB
    ((2, 32, 64, 64, 32, 11, 11, 1, 5, 1, 1), np.float64, 32),
    ((1, 3, 9, 40, 2, 3, 3, 1, (1, 17), (1, 17), 1), np.float32, None),   # E' = 35 > 32
])
def test_fused_filter_launch_follows_the_measured_rule(rng, monkeypatch, case, dtype, expected):
    # Which filters the fused kernel makes the spectrum of, and its block size
    # (the GPU tests force FUSED_FILTER_MIN_TAPS = 0 to run it on every shape).
    g = _forward_geometry(rng, case)
    st = dft_algo._Setup(np, g, case[0], dtype, "forward")
    launch = dft_algo.fused_filter_launch(st, g)
    assert (launch and launch[0]) == expected
    if launch:
        assert launch[1] <= 48 * 1024
    monkeypatch.setattr(dft_algo, "FUSED_FILTER", False)
    assert dft_algo.fused_filter_launch(st, g) is None
    monkeypatch.setattr(dft_algo, "FUSED_FILTER", True)
    monkeypatch.setattr(dft_algo, "FUSED_FILTER_MIN_TAPS", 0)
    assert (dft_algo.fused_filter_launch(st, g) is None) == (case[6] == 3)


@pytest.mark.parametrize("layer,dtype,b", [
    ((56, 56, 30, 56), np.float32, 64),   # big_7x7_s1: 29 KB a dft_rows_forward block
    ((64, 64, 35, 64), np.float32, 64),   # big_11x11_s1: 35 KB
    ((56, 56, 30, 56), np.float64, 32),   # 58 KB: the cuBLAS path forward
])
def test_rows_kernels_launch_within_the_shared_memory(monkeypatch, layer, dtype, b):
    # dft_rows_forward (the DFT matrix and 64 image rows staged) where its shared
    # memory fits, else the cuBLAS path; the inverse 64 b (dft_rows_inverse64),
    # else 32, else cuBLAS.
    Hi, Wi, h, n1 = layer
    size = np.dtype(dtype).itemsize
    fwd = dft_algo.rows_forward_launch(Hi, Wi, h, 32, 64, size)
    if size == 8:
        assert fwd is None
    else:
        grid, args, smem = fwd
        dpitch, xpitch = int(args[5]), int(args[6])
        assert grid == (1, Hi, 32) and all(a.dtype == np.int32 for a in args)
        assert smem == (Wi * dpitch + 64 * xpitch) * size <= 48 * 1024
        assert dpitch % 8 == 0 and dpitch >= 2 * h and xpitch % 2 == 1   # 16-byte loads, odd pitch
    monkeypatch.setattr(dft_algo, "INVERSE_B64", True)
    inv = dft_algo.rows_inverse_launch(32 * 64, Hi, n1, h, size)
    assert inv[0] == b and inv[1] <= 48 * 1024
    monkeypatch.setattr(dft_algo, "INVERSE_B64", False)
    assert dft_algo.rows_inverse_launch(32 * 64, Hi, n1, h, size)[0] == 32


@pytest.mark.parametrize("case", DFT_CASES + [
    pytest.param((32, 64, 56, 56, 64, 7, 7, 1, 3, 1, 1), id="big_7x7_s1"),
    pytest.param((32, 32, 64, 64, 32, 11, 11, 1, 5, 1, 1), id="big_11x11_s1"),
    pytest.param((3, 70, 9, 66, 5, 3, 3, 1, 1, 1, 1), id="70ch-T67")])
@pytest.mark.parametrize("direction", ["forward", "backward_data"])
@pytest.mark.parametrize("itemsize", [4, 8])
def test_prepared_workspace_regions_fit_the_reported_bound(rng, case, direction, itemsize):
    # The prepared path's workspace (helper dft7c): regions on 256-byte boundaries,
    # no two regions alive at once overlap, the whole within workspace_bytes, for
    # the cuBLAS and fused filter paths and one row u or all rows a chunk.
    x, w, _, opts = _random_problem(rng, case, "NCHW", {4: np.float32, 8: F64}[itemsize])
    p = _problem_of(x, w, opts)
    for by_gemm in (True, False):
        for rows in (1, dft_algo.Geometry(p, direction).T[0]):
            _check_prepared_layout(p, direction, itemsize, by_gemm, rows)


def _check_prepared_layout(p, direction, itemsize, by_gemm, rows):
    """The prepared workspace of one problem: regions on 256-byte boundaries, no
    two regions alive at once overlap, the whole within workspace_bytes."""
    g = dft_algo.Geometry(p, direction)
    J, Ko, h, F, N = g.channels_in, g.channels_out, g.half, g.frequencies, p.N
    off, total = dft_algo.correlate_layout(g, N, itemsize, by_gemm, rows)
    size = {"wc": g.extent[0] * g.extent[1] * J * Ko, "A": g.extent[0] * h * J * Ko,
            "G": rows * h * J * Ko, "Z": F * N * J, "A1t": g.size_in[0] * h * N * J,
            "Y": F * N * Ko, "Yp": g.out[0] * h * N * Ko}
    assert set(off) == set(size) - (set() if by_gemm else {"wc", "A"})
    assert all(o >= 0 and o * 2 * itemsize % 256 == 0 and o + size[k] <= total for k, o in off.items())
    alive = [("A1t", "Z"), ("wc", "A", "Z"), ("A", "G", "Z"), ("G", "Z", "Y"), ("Y", "Yp")]
    for group in alive:
        spans = sorted((off[k], off[k] + size[k]) for k in group if k in off)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), group
    assert total * 2 * itemsize <= DFT.workspace_bytes(p, direction)


@HYPOTHESIS
@given(case=_odd_problems(), direction=st.sampled_from(["forward", "backward_data"]),
       itemsize=st.sampled_from([4, 8]), by_gemm=st.booleans(), rows=st.integers(1, 80))
def test_prepared_workspace_regions_fit_the_reported_bound_drawn(case, direction, itemsize, by_gemm, rows):
    # review6f: test_prepared_workspace_regions_fit_the_reported_bound over drawn
    # problems (odd and prime sizes, filters 1..13, padding 0..3, dilation 2),
    # any rows u a chunk up to T.
    N, C, H, W, K, R, S, _, padding, dilation, _ = case
    dtype = {4: np.float32, 8: F64}[itemsize]
    p = _problem_of(np.empty((N, C, H, W), dtype), np.empty((K, C, R, S), dtype),
                    _options(1, padding, dilation, 1))
    rows = min(rows, dft_algo.Geometry(p, direction).T[0])
    _check_prepared_layout(p, direction, itemsize, by_gemm, rows)


def test_float32_error_within_the_table_row(rng):
    # The same GEMMs in float32 on NumPy (the GPU runs them on cuBLAS): 64
    # channels, the 7x7 layer's transform length, N(0, 1) data.
    from dnnprims.testing.tolerances import tolerance
    case = (1, 64, 30, 30, 16, 7, 7, 1, 3, 1, 1)
    x, w, b, opts = _random_problem(rng, case, "NCHW", np.float32)
    p = _problem_of(x, w, opts)
    y = DFT._run(np, p, "forward", x, w, np.empty(p.y_shape, np.float32), b)
    ref = conv2d_forward(x.astype(F64), w.astype(F64), b.astype(F64), **opts)
    err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    assert err <= tolerance(np.float32, "dft") / 2


# --- GPU (and NumPy through the public API) against the reference -----------------

@pytest.mark.parametrize("case", DFT_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_dft_matches_reference(xp, rng, case, dtype, layout):
    x, w, b, opts = _random_problem(rng, case, layout, dtype)
    _check_all_directions(xp, rng, x, w, b, opts, "dft")


@pytest.mark.gpu
@pytest.mark.parametrize("direction", algos.DIRECTIONS)
def test_dft_on_a_public_shape_at_small_batch(gpu, rng, direction):
    # alex_conv2_5x5 / big_7x7_s1 channel counts, batch 2: transposes of
    # many tiles (64 x 192 channels), int indexing.
    for case in [(2, 64, 27, 27, 192, 5, 5, 1, 2, 1, 1), (2, 64, 56, 56, 64, 7, 7, 1, 3, 1, 1)]:
        x, w, b, opts = _random_problem(rng, case, "NCHW", np.float32)
        _check_all_directions(gpu, rng, x, w, b, opts, "dft", (direction,))


@pytest.mark.parametrize("kwargs,dtype,match", [
    (dict(stride=2), np.float32, "stride 1 only"),
    (dict(groups=2), np.float32, "ungrouped"),
    ({}, np.float16, "float32 and float64 only"),
])
def test_dft_refuses_what_it_does_not_compute(xp, kwargs, dtype, match):
    x, w = np.ones((1, 4, 9, 9), dtype), np.ones((4, 4 // kwargs.get("groups", 1), 5, 5), dtype)
    with pytest.raises(ValueError, match=match):
        conv2d_forward(xp.asarray(x), xp.asarray(w), algo="dft", **kwargs)


def test_dft_workspace_is_reported_and_limits_it():
    p = _problem_of(np.empty((32, 64, 56, 56), np.float32), np.empty((64, 64, 7, 7), np.float32),
                    _options(1, 3, 1, 1))
    for d in algos.DIRECTIONS:
        need = DFT.workspace_bytes(p, d)
        assert 100 * 2**20 < need < 1 << 30
        ok, reason = algos.admits(DFT, p, d, algos.ConvOptions(workspace_limit=need - 1))
        assert not ok and "workspace" in reason
        assert dnnprims.conv2d_choose((32, 64, 56, 56), (64, 64, 7, 7), padding=3,
                                      workspace_limit=need - 1, direction=d)[0] != "dft"


# --- the fused kernels (dft.FUSED_ROWS and dft.FUSED_FILTER on) ---------------------
# Their index arithmetic was checked against the cuBLAS path by a line-by-line
# NumPy port (notes/conv_large_emulate.py); this GPU check passed on the H100 (helper
# wino5, 84 of 84) before FUSED_ROWS was turned on.  Helper dft7 rewrote
# dft_filter_spectrum (offset table, warp-per-pair staging, SMAX registers, 128 / 64
# / 32 pairs a block) and made the filter spectrum in chunks of rows u
# (FILTER_CHUNK_BYTES; "CHUNKS" below: one row u a chunk, the most launches).
# Each combination sets every flag, so the unfused cuBLAS path (the fallback for
# shapes the kernels do not fit) stays tested too.  Shapes: channel counts over
# one 64-chunk (70), half spectra over 32 frequencies (T' = 67), batch not a
# multiple of 32, float64 (twice the shared memory), the public layers at batch 2
# (11x11: 121 taps, 64 pairs a block in float32, the cuBLAS path in float64),
# E' = 13 (SMAX 16), 15x15 (32 pairs a block in float32) and E' = 35 (over 32: the
# cuBLAS path).

FUSED_SMALL = DFT_CASES + [
    pytest.param((3, 70, 9, 66, 5, 3, 3, 1, 1, 1, 1), id="70ch-T67"),
    pytest.param((2, 5, 16, 20, 3, 5, 5, 1, 6, 3, 1), id="5x5-dilation3-E13"),
    pytest.param((1, 3, 20, 20, 2, 15, 15, 1, 7, 1, 1), id="15x15-32-pairs"),
    pytest.param((1, 3, 9, 40, 2, 3, 3, 1, (1, 17), (1, 17), 1), id="E35")]
FUSED_PUBLIC = [  # float64 NumPy references of ~1-4 s each: the shipped flags only
    pytest.param((2, 64, 27, 27, 192, 5, 5, 1, 2, 1, 1), id="alex-batch2"),
    pytest.param((2, 64, 56, 56, 64, 7, 7, 1, 3, 1, 1), id="7x7-batch2"),
    pytest.param((2, 32, 64, 64, 32, 11, 11, 1, 5, 1, 1), id="11x11-batch2")]
ALL_FLAGS = [(), ("FUSED_ROWS",), ("FUSED_FILTER",), ("FUSED_ROWS", "FUSED_FILTER"),
             ("FUSED_ROWS", "FUSED_FILTER", "CHUNKS"), ("CHUNKS",), ("FUSED_ROWS", "INV32")]
# "INV32": dft_rows_inverse (32 b a block), the fallback where dft_rows_inverse64
# does not fit; the other flag sets run the shipped INVERSE_B64.  Every flag set
# with FUSED_ROWS runs the prepared forward / backward-data path
# (DFTConvolution.prepare) where the row kernels fit.


def _check_with_flags(gpu, rng, monkeypatch, case, dtype, flags):
    for flag in ("FUSED_ROWS", "FUSED_FILTER"):
        monkeypatch.setattr(dft_algo, flag, flag in flags)
    monkeypatch.setattr(dft_algo, "FILTER_CHUNK_BYTES", 1 if "CHUNKS" in flags else 0)
    monkeypatch.setattr(dft_algo, "INVERSE_B64", "INV32" not in flags)
    monkeypatch.setattr(dft_algo, "FUSED_FILTER_MIN_TAPS", 0)   # the kernel on every filter it fits
    x, w, b, opts = _random_problem(rng, case, "NCHW", dtype)
    _check_all_directions(gpu, rng, x, w, b, opts, "dft")


@pytest.mark.gpu
@pytest.mark.parametrize("case", FUSED_SMALL)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("flags", ALL_FLAGS, ids=lambda f: "+".join(f) or "unfused")
def test_dft_fused_rows_match_reference(gpu, rng, monkeypatch, case, dtype, flags):
    _check_with_flags(gpu, rng, monkeypatch, case, dtype, flags)


@pytest.mark.gpu
@pytest.mark.parametrize("case", FUSED_PUBLIC)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("flags", [("FUSED_ROWS", "FUSED_FILTER"), ("FUSED_ROWS", "FUSED_FILTER", "CHUNKS")],
                         ids=lambda f: "+".join(f))
def test_dft_fused_public_shapes_match_reference(gpu, rng, monkeypatch, case, dtype, flags):
    _check_with_flags(gpu, rng, monkeypatch, case, dtype, flags)


# --- review6f: what a call allocates against workspace_bytes ------------------------

_PYTHON_SLACK = 64 << 10   # bytes of Python objects a call makes besides its arrays


def _peak_bytes(call):
    """Peak bytes allocated while ``call()`` runs (NumPy reports its array data to
    tracemalloc; Python objects count too, hence _PYTHON_SLACK)."""
    import tracemalloc
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        call()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        if not tracing:
            tracemalloc.stop()


def _check_buffers_within_workspace(case, layout):
    """Every direction of ``case`` on NumPy (float64) allocates at most
    workspace_bytes while it runs (the setup's transform matrices, made by a
    first call, are cached, not workspace)."""
    N, C, H, W, K, R, S, _, padding, dilation, _ = case
    x = np.ones((N, C, H, W) if layout == "NCHW" else (N, H, W, C))
    w = np.ones((K, C, R, S))
    p = _problem_of(x, w, _options(1, padding, dilation, 1, layout))
    dy = np.ones(p.y_shape)
    calls = {"forward": (x, w, np.empty(p.y_shape), np.ones(K)),
             "backward_data": (dy, w, np.empty(p.x_shape), None),
             "backward_filter": (x, dy, np.empty(p.w_shape), None)}
    for direction, (a, b, out, bias) in calls.items():
        DFT._run(np, p, direction, a, b, out, bias)
        peak = _peak_bytes(lambda: DFT._run(np, p, direction, a, b, out, bias))
        assert peak <= DFT.workspace_bytes(p, direction) + _PYTHON_SLACK, (direction, peak)


@pytest.mark.parametrize("case,layout", [
    ((1, 32, 7, 7, 32, 5, 7, 1, (0, 1), 1, 1), "NCHW"),
    ((1, 32, 7, 17, 8, 13, 13, 1, (3, 0), 1, 1), "NHWC"),
])
def test_dft_buffers_of_a_call_fit_workspace_bytes(case, layout):
    # On NumPy a call makes the buffers of the GPU's cuBLAS path (FUSED_ROWS off,
    # which the GPU flag tests run, or shapes whose row kernels do not fit, such as
    # float64 filters with a wide half spectrum): the row kernels only drop A1 and
    # Ypt, so this is the most any path allocates besides cuBLAS's own workspace.
    # Before review6f, backward filter left out the dilated gradient dw (K, C, E, E')
    # that is alive with the product and the inverse's Yp and Ypt, and the NHWC
    # copies of x and dy: 1.68 MB allocated against 1.46 MB reported on the first
    # case (the same gap on the GPU at e.g. N 1, C = K = 64, 96 x 96, 11 x 11 padding 0
    # dilation 3, float64: 538 MB against 528 MB).
    _check_buffers_within_workspace(case, layout)


@HYPOTHESIS
@given(case=_odd_problems(), layout=st.sampled_from(["NCHW", "NHWC"]))
def test_dft_buffers_of_a_call_fit_workspace_bytes_drawn(case, layout):
    _check_buffers_within_workspace(case, layout)


def test_one_runner_per_problem_with_or_without_a_bias(monkeypatch):
    # review5's open item 7: _runner was keyed on has_bias, but the prepared path
    # and _run both take the bias per call, so a problem called with and without
    # one built (and kept) two identical runners.  CuPy's device query and the
    # prepared path are faked: this counts the runners built.
    cupy = pytest.importorskip("cupy")
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 0)
    built = []

    def prepared(problem, g, direction):
        built.append(direction)
        return lambda a, b, out, bias=None: ("ran", bias)
    monkeypatch.setattr(dft_algo, "prepared_correlate", prepared)
    algorithm = dft_algo.DFTConvolution()
    p = _problem_of(np.empty((1, 2, 9, 9)), np.empty((3, 2, 5, 5)), _options(1, 2, 1, 1))
    for direction in ("forward", "backward_data"):
        assert algorithm.prepare(p, direction, has_bias=False)(None, None, None) == ("ran", None)
        assert algorithm.prepare(p, direction, has_bias=True)(None, None, None, "b") == ("ran", "b")
        assert algorithm.run(p, direction, None, None, None, bias="c") == ("ran", "c")
        assert algorithm.run(p, direction, None, None, None) == ("ran", None)
    assert built == ["forward", "backward_data"]


# --- review6f: the prepared path's pointers, followed through its workspace ----------

def _follow_prepared_call(monkeypatch, p, direction, chunk_bytes, min_taps):
    """Run prepared_correlate's ``run`` on CuPy arrays over host memory with the
    kernels and cuBLAS faked, and follow every region it writes and reads through
    its workspace: each read must find, element for element, what the step before
    wrote there (not a region that reused the memory since)."""
    import types
    cupy = pytest.importorskip("cupy")
    from cupy.cuda.memory import MemoryPointer, UnownedMemory
    from dnnprims.algos import fft as fft_algo
    from dnnprims._kernels import _ArrayArgument
    allocations = []

    def allocate(nbytes):
        host = np.zeros(max(nbytes, 1) + 256, np.uint8)
        start = -host.ctypes.data % 256                    # pool blocks are 256-byte aligned
        memory = UnownedMemory(host.ctypes.data + start, nbytes, host, device_id=0)
        allocations.append((memory.ptr, nbytes))
        return MemoryPointer(memory, 0)

    events = []

    class Launch:
        def __init__(self, expression, args):
            self.expression, self.args = expression, args

        def __call__(self, *arrays):
            pointers = [arrays[a.index].data.ptr if isinstance(a, _ArrayArgument) else a.data.ptr
                        for a in self.args if isinstance(a, (_ArrayArgument, cupy.ndarray))]
            events.append(("kernel", self.expression, pointers))

    def prepare_launch(expression, grid, block, args, shared_mem=0, **kwargs):
        assert shared_mem <= 48 * 1024
        return Launch(expression, args)

    def prepare_gemm(dtype, M, N, K, batch=1, a_batched=True, b_batched=True):
        def call(handle, a_ptr, b_ptr, c_ptr):
            events.append(("gemm", (M, N, K, batch, a_batched, b_batched), [a_ptr, b_ptr, c_ptr]))
        return call
    runtime = types.SimpleNamespace(getDevice=lambda: 0)
    fake_xp = types.SimpleNamespace(asarray=lambda a: cupy.empty(a.shape, a.dtype),
                                    cuda=types.SimpleNamespace(runtime=runtime))
    monkeypatch.setattr(dft_algo, "_setup", lambda xp, *args: dft_algo._Setup(fake_xp, *args))
    monkeypatch.setattr(fft_algo, "_twiddles", {})
    monkeypatch.setattr(dft_algo.FAMILY, "prepare", prepare_launch)
    monkeypatch.setattr(fft_algo.FAMILY, "prepare", prepare_launch)
    monkeypatch.setattr(dft_algo._cublas, "prepare", prepare_gemm)
    monkeypatch.setattr(cupy.cuda.device, "get_cublas_handle", lambda: 0)
    monkeypatch.setattr(dft_algo, "FILTER_CHUNK_BYTES", chunk_bytes)
    monkeypatch.setattr(dft_algo, "FUSED_FILTER_MIN_TAPS", min_taps)
    g = dft_algo.Geometry(p, direction)
    with cupy.cuda.using_allocator(allocate):
        run = dft_algo.prepared_correlate(p, g, direction)
        if run is None:
            return None
        shapes = {"forward": (p.x_shape, p.w_shape, p.y_shape),
                  "backward_data": (p.y_shape, p.w_shape, p.x_shape)}
        a, b, out = (cupy.empty(s, p.dtype) for s in shapes[direction])
        del allocations[:]
        run(a, b, out)
    (base, nbytes), = allocations                     # one allocation a call: the workspace
    st = run.setup
    cs = 2 * st.dtype.itemsize
    J, Ko, h, N, T0 = g.channels_in, g.channels_out, g.half, p.N, g.T[0]
    (Hi, _), (n0, _), (E0, E1) = g.size_in, g.out, g.extent
    label = np.full(nbytes // cs, -1)
    index = np.full(nbytes // cs, -1)
    names = {}

    def at(ptr):
        assert (ptr - base) % cs == 0 and 0 <= ptr - base < nbytes, "a workspace region"
        return (ptr - base) // cs

    def outside(ptr):
        assert not base <= ptr < base + nbytes, "a region of the workspace where none belongs"

    def write(ptr, name, count, first=0):
        o = at(ptr)
        assert o + count <= len(label)
        label[o:o + count] = names.setdefault(name, len(names))
        index[o:o + count] = np.arange(first, first + count)

    def read(ptr, name, count, first=0):
        o = at(ptr)
        assert o + count <= len(label)
        same = (label[o:o + count] == names[name]).all() and \
            (index[o:o + count] == first + np.arange(count)).all()
        assert same, f"{name} [{first}, {first + count}) is no longer where it was written"
        return o, o + count

    def step(reads, ptr, name, count, first=0):
        """One GEMM or kernel: its inputs read, then its output written -- which must
        not overlap any of them (they are read while it is written)."""
        spans = [read(*r) for r in reads]
        o = at(ptr)
        assert all(o + count <= a or b <= o for a, b in spans), f"{name} written over its own input"
        write(ptr, name, count, first)

    chunks = dft_algo.filter_chunks(g, st.dtype.itemsize)
    fused = dft_algo.fused_filter_launch(st, g)
    kinds = [e[:2] if e[0] == "gemm" else (e[0], e[1].split("<")[0]) for e in events]
    expected = [("kernel", "dft_rows_forward"), ("gemm", (T0, h * N * J, Hi, 1, True, True))]
    if fused is None:
        expected += [("kernel", "fft_filter_complex"), ("gemm", (h, J * Ko, E1, E0, False, True))]
    for u0, u1 in chunks:
        expected += [("kernel", "dft_filter_spectrum") if fused else
                     ("gemm", (u1 - u0, h * J * Ko, E0, 1, True, True)),
                     ("gemm", (N, Ko, J, (u1 - u0) * h, True, True))]
    expected += [("gemm", (n0, h * N * Ko, T0, 1, True, True)), ("kernel", "dft_rows_inverse")]
    inverse64 = ("kernel", "dft_rows_inverse64")
    assert [("kernel", "dft_rows_inverse") if k == inverse64 else k for k in kinds] == expected
    steps = iter(events)
    _, _, (x_ptr, dwf, a1t) = next(steps)                 # dft_rows_forward: a, DWf, A1t
    outside(x_ptr), outside(dwf)
    write(a1t, "A1t", Hi * h * N * J)
    _, _, (dhf, b_ptr, c_ptr) = next(steps)               # Z = DHf @ A1t
    outside(dhf), step([(b_ptr, "A1t", Hi * h * N * J)], c_ptr, "Z", T0 * h * N * J)
    if fused is None:
        _, _, (f_ptr, wc) = next(steps)                   # the filter as complex
        outside(f_ptr), write(wc, "wc", E0 * E1 * J * Ko)
        _, _, (ds, b_ptr, c_ptr) = next(steps)            # A = Ds @ wc, E0 matrices
        outside(ds), step([(b_ptr, "wc", E0 * E1 * J * Ko)], c_ptr, "A", E0 * h * J * Ko)
    for u0, u1 in chunks:
        rows = u1 - u0
        event = next(steps)
        if fused is None:                                 # G = Dr[u0:u1] @ A
            _, _, (dr, b_ptr, g_ptr) = event
            outside(dr), step([(b_ptr, "A", E0 * h * J * Ko)], g_ptr, ("G", u0), rows * h * J * Ko)
        else:                                             # the fused kernel: f, Ds, Dr rows, G
            _, _, (f_ptr, ds, dr, g_ptr) = event
            outside(f_ptr), outside(ds), outside(dr), write(g_ptr, ("G", u0), rows * h * J * Ko)
        _, _, (a_ptr, b_ptr, c_ptr) = next(steps)         # Y rows = Z rows @ G, per frequency
        step([(a_ptr, "Z", rows * h * N * J, u0 * h * N * J), (b_ptr, ("G", u0), rows * h * J * Ko)],
             c_ptr, "Y", rows * h * N * Ko, u0 * h * N * Ko)
    _, _, (dhi, b_ptr, c_ptr) = next(steps)               # Yp = DHi @ Y
    outside(dhi), step([(b_ptr, "Y", T0 * h * N * Ko)], c_ptr, "Yp", n0 * h * N * Ko)
    _, _, (yp, dwi, out_ptr) = next(steps)                # the W-axis inverse into out
    read(yp, "Yp", n0 * h * N * Ko), outside(dwi), outside(out_ptr)
    return events


@pytest.mark.parametrize("case", DFT_CASES + [
    pytest.param((2, 64, 56, 56, 64, 7, 7, 1, 3, 1, 1), id="big_7x7_s1-batch2"),
    pytest.param((2, 32, 64, 64, 32, 11, 11, 1, 5, 1, 1), id="big_11x11_s1-batch2"),
    pytest.param((3, 70, 9, 66, 5, 3, 3, 1, 1, 1, 1), id="70ch-T67")])
@pytest.mark.parametrize("direction", ["forward", "backward_data"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("chunk_bytes,min_taps", [(0, 64), (1, 0), (3000, 64)])
def test_prepared_call_reads_each_region_where_it_was_written(monkeypatch, case, direction, dtype,
                                                              chunk_bytes, min_taps):
    x, w, _, opts = _random_problem(np.random.default_rng(0), case, "NCHW", dtype)
    _follow_prepared_call(monkeypatch, _problem_of(x, w, opts), direction, chunk_bytes, min_taps)


@HYPOTHESIS
@given(case=_odd_problems(), direction=st.sampled_from(["forward", "backward_data"]),
       dtype=st.sampled_from([np.float32, np.float64]), chunk_bytes=st.sampled_from([0, 1, 5000]),
       min_taps=st.sampled_from([0, 64]))
def test_prepared_call_reads_each_region_where_it_was_written_drawn(case, direction, dtype, chunk_bytes,
                                                                    min_taps):
    N, C, H, W, K, R, S, _, padding, dilation, _ = case
    p = _problem_of(np.empty((N, C, H, W), dtype), np.empty((K, C, R, S), dtype),
                    _options(1, padding, dilation, 1))
    with pytest.MonkeyPatch.context() as monkeypatch:
        _follow_prepared_call(monkeypatch, p, direction, chunk_bytes, min_taps)
