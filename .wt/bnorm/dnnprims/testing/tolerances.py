"""Tolerances for comparing a result with the float64 NumPy reference, written once.

The comparison is normwise, as in METHOD.md: ``||out - ref|| / ||ref||`` must
not exceed the bound, plus an elementwise check ``|out - ref| <= bound *
max|ref| * 8`` so that one wild element cannot hide in a large norm.  NaN never
passes.

Keys are ``(dtype name, algorithm family)``; the family ``"default"`` covers
every primitive computed in the storage dtype's accumulation type.  Bounds
come from the rounding of the *storage* type: float16 keeps 11 significant
bits (2^-11 ~ 4.9e-4 per rounding), bfloat16 8 bits (2^-8 ~ 3.9e-3), float32
24 bits; a result passes through one storage rounding of the inputs and one of
the output, plus accumulation error that grows like sqrt(terms) * eps.
"""
import numpy as np

TOLERANCES = {
    ("float64", "default"): 1e-11,
    ("float32", "default"): 2e-5,
    ("float16", "default"): 3e-3,
    ("bfloat16", "default"): 2e-2,
    # Winograd F(m x m, 3 x 3) in float32 (transforms and GEMMs in float32):
    # measured with dnnprims.algos.winograd.emulate (the same three stages on
    # NumPy, float32) against the float64 reference over N(0, 1) data, C = K in
    # 16..512, padding 1, forward and backward data (notes/conv_wino.md).  Worst
    # normwise error: F(2x2) 5.1e-7 (direct float32: 3.7e-7), F(4x4) 3.4e-6 at
    # C = 512, growing like sqrt(C); the rows leave 3-4x for the GPU's summation
    # order.  Both stay within the float32 direct bound above (2e-5), so both
    # count as strict; F(4x4) is 9x less accurate than F(2x2).
    ("float32", "winograd_f2x2_3x3"): 2e-6,
    ("float32", "winograd_f4x4_3x3"): 1e-5,
    # Winograd backward filter F(3x3, m x m) in float32 (dnnprims/algos/winograd.py,
    # WinogradBackwardFilter): each dw element is a sum over N*P*Q products, done
    # as float32 GEMMs over the transformed tiles, run in splits of at most
    # WGRAD_MAX_SPLIT_DEPTH = 1024 tiles (a cuBLAS thread sums its split
    # sequentially) added in order.  Emulated on NumPy with sequential float32
    # sums in 1024-tile splits, N(0, 1) data, 56 x 56 images, batch 16-32
    # (depth 3136-25088 tiles): F(3x3, 2x2) 9.6e-7, F(3x3, 4x4) 5.8e-6.
    # On the H100 (cuBLAS), the nine batch-32 3x3 public layers: F(3x3, 2x2)
    # 6.4e-7 .. 9.7e-7, F(3x3, 4x4) 1.6e-6 .. 6.0e-6 (implicit_gemm_wgrad 4.6e-7
    # .. 2.6e-6; cuDNN's own float32 2.2e-6 .. 6.1e-5; notes/wino_wgrad.md).
    # The rows leave 2.5-4x; both stay within the float32 direct bound (2e-5):
    # strict.
    ("float32", "winograd_wgrad_f3x3_2x2"): 4e-6,
    ("float32", "winograd_wgrad_f3x3_4x4"): 1.5e-5,
    # Winograd for 5x5 filters in float32: F(2x2, 5x5) forward / backward data
    # and the backward-filter F(5x5, 2x2), both on the points 0, +-1, +-2, inf of
    # F(4x4, 3x3) (the same 6 x 6 input transform, so a similar error).  Emulated
    # on NumPy (notes/wino5_accuracy.py: float32 transforms and GEMMs vs the
    # float64 reference, N(0, 1) data): forward 2.0e-6 (C = 64, K = 192, 27 x 27,
    # alex_conv2_5x5's channels), 3.7e-6 (256 ch), 3.7e-6 (512 ch); backward data
    # 3.2e-6 .. 3.8e-6 (helper conv_large measured 2e-6 .. 3.6e-6 independently);
    # backward filter 4.3e-6 (1568-tile sums) and 4.6e-6 (6272 tiles in one
    # unsplit sum; the GPU sums at most WGRAD_MAX_SPLIT_DEPTH = 1024 tiles in a
    # run).  Rows as for F(4x4, 3x3) / F(3x3, 4x4) (2.5-4x margin for the GPU's
    # summation order); both within the float32 direct bound (2e-5): strict.
    ("float32", "winograd_f2x2_5x5"): 1e-5,
    ("float32", "winograd_wgrad_f5x5_2x2"): 1.5e-5,
    # Backward filter F(5x5, 4x4) (alpha = 8, points 0, +-1, +-2, +-1/2, inf): 4x4
    # dy tiles, a larger input transform (entries up to 21).  Emulated with
    # sequential float32 sums in 1024-tile splits (the model that reproduces the
    # H100's 6.4e-6 for F(5x5, 2x2) to two digits) on alex_conv2_5x5 at batch 32:
    # 9.8e-6 (F(5x5, 2x2) 6.4e-6); NumPy's blocked float32 GEMM, batch 4: 5.1e-6.
    # H100 (cuBLAS, 3 splits of 524 tiles; notes/large2.md): 7.9e-6 (F(5x5, 2x2)
    # 6.4e-6, cuDNN's own float32 1.9e-3).
    # The row leaves 2x and equals the float32 direct bound (2e-5): strict.
    ("float32", "winograd_wgrad_f5x5_4x4"): 2e-5,
    # FFT convolution (dnnprims/algos/fft.py): rounding in the transforms grows
    # like eps * log2(T T') of the FFT size and is spread evenly over the
    # outputs, so it is bounded normwise.  Measured on the H100 (cuFFT, fp32)
    # against PyTorch float64, N(0, 1) data, C up to 512, FFT sizes 16..240,
    # per-channel scales 10^U(-3, 3) and a +100 offset, all three directions:
    # worst 7.5e-7 (notes/conv_fft.md).  5e-6 leaves ~7x margin and stays
    # below the float32 direct bound, so FFT is admitted by precision="strict".
    ("float32", "fft"): 5e-6,
    ("float32", "fft_tiled"): 5e-6,
    ("float64", "fft"): 1e-11,
    ("float64", "fft_tiled"): 1e-11,
    # "dft" (dnnprims/algos/dft.py): the same spectra as "fft", but each
    # transform is a dense DFT matrix product (sums of up to ~60 terms per axis
    # instead of log2(T) butterfly stages), so its rounding grows like
    # sqrt(H) * eps per axis rather than log2(T) * eps.  Measured on the H100
    # (cuBLAS, fp32, TF32 off) against PyTorch float64, N(0, 1) data, batch 32,
    # all three directions: big_7x7_s1 (C = K = 64, T = 59) 4.0e-7 / 4.0e-7 /
    # 4.2e-7, alex_conv2_5x5 (C = 64, K = 192, T = 29) 3.2e-7 / 4.2e-7 / 3.1e-7
    # (cuFFT "fft" 2.5e-7 .. 3.8e-7 in the same problems; notes/conv_large.md).
    # 5e-6 as for "fft" (>10x margin; a CPU test re-measures a 64-channel case
    # at half the bound); below the float32 direct bound, so "dft" is admitted
    # by precision="strict".
    ("float32", "dft"): 5e-6,
    ("float64", "dft"): 1e-11,
}


def _dtype_name(dtype):
    return np.dtype(dtype).name


def tolerance(dtype, algorithm="default"):
    """The normwise relative error bound for a dtype and algorithm family."""
    name = _dtype_name(dtype)
    return TOLERANCES.get((name, algorithm), TOLERANCES[(name, "default")])


def _to_numpy64(a):
    if hasattr(a, "get"):
        a = a.get()
    return np.asarray(a).astype(np.float64)


def relative_error(actual, expected):
    """||actual - expected|| / ||expected|| in float64 (0 when both are zero)."""
    a, e = _to_numpy64(actual), _to_numpy64(expected)
    denom = np.linalg.norm(e.ravel())
    num = np.linalg.norm((a - e).ravel())
    if denom == 0:
        return float(num)
    return float(num / denom)


def assert_close(actual, expected, dtype=None, algorithm="default", what="result", magnitude=None):
    """Assert ``actual`` matches ``expected`` (float64 reference) within the table's bound.

    ``magnitude`` (optional, same shape): the result computed on the absolute
    values of the terms (e.g. ``conv(|x|, |w|) + |b|``).  Rounding error is
    proportional to it, not to the result, so where terms can cancel -- a
    convolution with one product per output plus a bias -- the bound is taken
    relative to ``magnitude`` instead of ``expected``.  Without cancellation the
    two agree up to the usual sqrt(terms) factor."""
    a, e = _to_numpy64(actual), _to_numpy64(expected)
    scale_ref = e if magnitude is None else _to_numpy64(magnitude)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != expected {e.shape}"
    if dtype is None:
        dtype = np.asarray(actual).dtype if not hasattr(actual, "get") else actual.dtype
    bound = tolerance(dtype, algorithm)
    assert not np.isnan(a).any() or np.isnan(e).any(), f"{what}: NaN in result"
    if a.size == 0:
        return
    denom = np.linalg.norm(scale_ref.ravel())
    err = float(np.linalg.norm((a - e).ravel()) / denom) if denom else relative_error(a, e)
    assert err <= bound, f"{what}: relative error {err:.3g} exceeds {bound:.3g} ({np.dtype(dtype).name}, {algorithm})"
    scale = np.max(np.abs(scale_ref)) if e.size else 0.0
    worst = np.max(np.abs(a - e))
    assert worst <= 8 * bound * max(scale, np.finfo(np.float64).tiny), (
        f"{what}: worst element error {worst:.3g} exceeds {8 * bound:.3g} x max|ref| ({scale:.3g})")
