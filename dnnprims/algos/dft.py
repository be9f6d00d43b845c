"""The "dft" algorithm: Fourier-domain convolution whose transforms are dense
DFT matrices applied by cuBLAS GEMMs instead of cuFFT.  Stride 1, ungrouped,
float32 (complex64) and float64 (complex128), any padding, any filter size,
dilation; all three directions.

Why.  "fft" (:mod:`.fft`) spends most of its time around cuFFT, not in it:
zero-padding the input into T x T' buffers, a strided R2C/C2R that writes
the frequency-major spectra at a third of the memory bandwidth, and a crop.
For the filters where the Fourier route pays (5x5 .. 11x11 on images of
~27..60 pixels) the transform lengths are small, so a transform is a small
matrix product, and a matrix product does three things an FFT library
cannot:
  * the zero padding is free: the DFT matrix only has columns for the image
    pixels (the padded zeros contribute nothing), so the input is read
    straight from x, no window buffer;
  * the crop is free: the inverse DFT matrix only has rows for the P x Q
    outputs kept, so the last GEMM writes y (NCHW) directly;
  * any transform length works at the same speed, so T is the smallest
    that avoids wrap-around (59 for a 7x7 filter on 56 x 56, pad 3; cuFFT
    wanted 60 or 64), and the layout of every intermediate is ours to pick.
The price is O(T) instead of O(log T) work per output of a transform, which
at T <= ~64 is still far below the per-frequency channel contraction and
runs on cuBLAS at GEMM speed.

The computation (same cyclic-correlation identity as "fft": the tile of the
padded input starts ``pad`` rows/columns above/left of the image, the filter
sits reversed, no conjugation for forward and backward data):

    1. W-axis real DFT:   A1 (NB J H, 2 h) = a (NB J H, W) @ DWf (W, 2 h)
       a real GEMM whose output columns are (frequency, re/im) pairs, i.e. a
       complex (NB J, H, h) array, h = T' / 2 + 1 (half spectrum);
    2. transpose to (H, h, NB, J)                       (kernel dft_transpose)
    3. H-axis DFT:        Z (T, h NB J) = DHf (T, H) @ A1^T (H, h NB J)
       -> Z (F, NB, J), F = T h frequencies, channels innermost;
    4. per frequency:     Y (F, NB, Ko) = Z (F, NB, J) @ G (F, J, Ko)
       G = the filter spectrum with 1 / (T T') folded in, made after step 3
       (fft's conversion kernel + two DFT GEMMs, or from 64 taps on our
       dft_filter_spectrum kernel); a bias is added to Y's zero frequency
       (a constant added to every output of the cyclic correlation);
    5. H-axis inverse for the kept rows only: (P, T) @ Y -> (P, h, NB, Ko);
    6. transpose to (NB Ko, P, h);
    7. W-axis real inverse (C2R weights 1, 2, .., 2, [1]) for the kept
       columns only: (NB Ko P, 2 h) @ DWi (2 h, Q) -> y (NB, Ko, P, Q).

Backward data is step 1-7 on dy with the rotated, channel-swapped filter and
padding E - 1 - pad (negative padding drops the columns outside the tile:
their DFT-matrix rows are zero).  Backward filter transforms x as above and
dy placed at the tile origin with the conjugate DFT (conj(DFT(dy)) of a real
dy), multiplies (F, K, N) @ (F, N, C) per frequency -- the sum over the batch
happens in the frequency domain -- and inverts only the E x E' taps.

Transform matrices are made once per problem in float64 (arguments reduced
mod T in integers first) and cast; see :class:`_Setup`.  Everything is
written against ``xp`` (the transpose's NumPy stand-in is ``ascontiguousarray``
of the transposed view) so the whole bookkeeping is tested on NumPy.
"""
import numpy as np

from . import ConvAlgorithm, register
from .. import _cublas, _dtypes
from .._kernels import KernelFamily, ceil_div, index_type
from . import fft as _fft

# dft_filter_spectrum keeps a filter row's E' taps in registers: SMAX, the
# smallest of FILTER_SMAX that holds E', sizes them (E' > 32: the cuBLAS path).
FILTER_SMAX = (8, 12, 16, 32)
FAMILY = KernelFamily("conv_dft.cu", [f"{k}<{t}, {i}>"
                                      for k in ("dft_transpose", "dft_rows_forward", "dft_rows_inverse",
                                                "dft_rows_inverse64")
                                      for t in ("float", "double") for i in ("int", "long long")]
                      + [f"dft_filter_spectrum<{t}, {i}, {m}>" for t in ("float", "double")
                         for i in ("int", "long long") for m in FILTER_SMAX])

# The fused kernels (kernels/conv_dft.cu): the W-axis transforms as our own kernels
# fused with the transposes (dft_rows_forward / dft_rows_inverse) instead of cuBLAS
# GEMM + transpose, and the filter spectrum in one kernel (dft_filter_spectrum)
# instead of a conversion kernel + two cuBLAS GEMMs: the steps the H100 stage
# profile showed slowest for the GPU work they do (notes/conv_large.md).  Index
# arithmetic checked by a line-by-line NumPy port of each kernel
# (notes/conv_large_emulate.py); tests/test_conv_dft.py's fused tests run every flag
# combination on the GPU.  History: FUSED_ROWS on since helper wino5 (big_7x7_s1
# forward 0.553 -> 0.324 ms, notes/wino5.md); dft_rows_inverse reworked by large2;
# dft_filter_spectrum rewritten twice (large2, then dft7: offset table, 8 loads in
# flight while staging, SMAX registers, 128 / 64 / 32 pairs a block; 0.178 -> 0.052
# ms on big_11x11_s1) and on where it measured faster (FUSED_FILTER_MIN_TAPS below);
# dft_rows_inverse64 by dft7b (INVERSE_B64 below).
# Where a shape does not fit the kernels' shared memory (48 KB) or grid, the
# cuBLAS path runs whatever the flags say.
# FUSED_ROWS: dft_rows_forward + dft_rows_inverse; FUSED_FILTER: dft_filter_spectrum ...
FUSED_ROWS = True
FUSED_FILTER = True
# ... for filters of at least this many taps (E E'): helper dft7 measured the new
# kernel against the cuBLAS path on the H100 (batch 32, whole call, notes/dft7.md):
# 11x11 (121 taps) forward 0.279 vs 0.312 ms, backward data 0.280 vs 0.315 (there the
# cuBLAS path's (11 x 35) @ (11 x 1024) batched GEMM alone takes 0.053 ms); 7x7
# (49 taps) forward 0.346 vs 0.318, backward data 0.322 vs 0.319 (the kernel, 0.054 ms
# for 58 MB, writes at ~1 TB/s, no faster than conversion + 2 GEMMs).  9x9 (81) is
# not measured: 64 puts it on the kernel.
FUSED_FILTER_MIN_TAPS = 64
# The filter spectrum (F, J, Ko) is the largest buffer of forward / backward data
# (58 MB on big_7x7_s1, more than x): it can be made in chunks of rows u of at most
# this many bytes, each consumed by its per-frequency GEMMs right after, so that it
# could stay in the H100's 50 MB L2 (0: one chunk).  Measured by helper dft7
# (notes/dft7.md): slower at 8, 16 and 32 MB on big_7x7_s1 and big_11x11_s1 (the
# smaller batched GEMMs lose more than L2 gives back), so it is off.
FILTER_CHUNK_BYTES = 0
# Helper dft7b (notes/dft7b.md) measured the W-axis row kernels on the H100 (batch 32,
# whole calls, each setting in turn with cuDNN, median of 3 rounds).  big_7x7_s1
# forward / backward data, ms: dft7's kernels 0.313 / 0.314; shipped 0.297 / 0.299
# (cuDNN 0.306 / 0.310).  Its variants of dft_rows_forward with 2 image rows a block
# or the matrix read through L1 measured slower and were removed by helper dft7c.
# INVERSE_B64: dft_rows_inverse64 (64 b a block, 8 consecutive b a warp: broadcast
# 16-byte loads of y; stage 0.058 -> 0.043 ms on big_7x7_s1, 0.041 -> 0.031 on 11x11)
# where it fits, else dft_rows_inverse.
INVERSE_B64 = True
_SMEM_LIMIT = 48 * 1024

SUPPORTED_DTYPES = _fft.SUPPORTED_DTYPES   # the same spectra, the same dtypes
SETUP_CACHE_SIZE = 32
_setups = {}   # key -> _Setup, least recently used first


def transform_size(n_out, extent, pad):
    """The smallest cyclic length T along one axis with no wrong wrap-around:
    outputs 0..n_out-1 read tile positions up to n_out + extent - 2; those past
    T wrap into the tile's leading ``pad`` positions, which hold padding zeros."""
    return max(n_out + extent - 1 - max(pad, 0), n_out, extent)


class Geometry:
    """One direction of one problem.  The "input" is what is transformed with
    the DFT (x, or dy for backward data), ``pad`` its padding (negative: the
    tile starts inside it), ``out`` the computed output size."""

    def __init__(self, p, direction):
        E = (p.dilation[0] * (p.R - 1) + 1, p.dilation[1] * (p.S - 1) + 1)
        if direction == "backward_data":
            self.pad = (E[0] - 1 - p.padding[0], E[1] - 1 - p.padding[1])
            self.size_in, self.out = (p.P, p.Q), (p.H, p.W)
            self.channels_in, self.channels_out = p.K, p.C
        else:
            self.pad = tuple(p.padding)
            self.size_in, self.out = (p.H, p.W), (p.P, p.Q)
            self.channels_in, self.channels_out = p.C, p.K
        self.extent = E
        self.T = tuple(transform_size(self.out[i], E[i], self.pad[i]) for i in range(2))
        self.half = self.T[1] // 2 + 1
        self.frequencies = self.T[0] * self.half


def _angles(k, pos, T):
    """2 pi (k * pos mod T) / T for integer vectors k (rows) and pos (columns),
    reduced exactly in integers before the float64 multiply."""
    return 2 * np.pi * np.mod(np.outer(k, pos), T) / T


def _forward_w(size, pad, T1, conj):
    """(size, 2 h) real: column pair (2 v, 2 v + 1) = (cos, -+sin) of the angle
    of input column c at tile position c + pad; zero rows outside [0, T')."""
    pos = np.arange(size) + pad
    theta = _angles(pos, np.arange(T1 // 2 + 1), T1)              # (size, h)
    m = np.empty((size, T1 // 2 + 1, 2))
    m[..., 0] = np.cos(theta)
    m[..., 1] = np.sin(theta) if conj else -np.sin(theta)
    m[(pos < 0) | (pos >= T1)] = 0.0
    return m.reshape(size, -1)


def _forward_h(size, pad, T0, conj):
    """(T, size) complex: exp(-+2 pi i k (r + pad) / T), zero columns outside [0, T)."""
    pos = np.arange(size) + pad
    m = np.exp((1j if conj else -1j) * _angles(np.arange(T0), pos, T0))
    m[:, (pos < 0) | (pos >= T0)] = 0.0
    return m


def _inverse_h(n_out, T0):
    """(n_out, T) complex: exp(+2 pi i k u / T) for the kept rows u < n_out."""
    return np.exp(1j * _angles(np.arange(n_out), np.arange(T0), T0))


def _inverse_w(n_out, T1, scale):
    """(2 h, n_out) real: the C2R along W for the kept columns, row pair
    (2 v, 2 v + 1) = c_v (cos, -sin), c_v = 1 at v = 0 and v = T'/2, else 2."""
    h = T1 // 2 + 1
    theta = _angles(np.arange(h), np.arange(n_out), T1)           # (h, n_out)
    c = np.full(h, 2.0)
    c[0] = 1.0
    if T1 % 2 == 0:
        c[-1] = 1.0
    m = np.empty((h, 2, n_out))
    m[:, 0] = c[:, None] * np.cos(theta) * scale
    m[:, 1] = -c[:, None] * np.sin(theta) * scale
    return m.reshape(2 * h, n_out)


class _Setup:
    """The transform matrices of one (device, geometry, batch, dtype, direction)."""

    def __init__(self, xp, g, N, dtype, direction):
        self.dtype = np.dtype(dtype)
        self.cdtype = np.result_type(self.dtype, np.complex64)
        T0, T1 = g.T
        dev = (lambda m, t: xp.asarray(np.ascontiguousarray(m).astype(t)))
        self.DWf = dev(_forward_w(g.size_in[1], g.pad[1], T1, False), self.dtype)
        self.DHf = dev(_forward_h(g.size_in[0], g.pad[0], T0, False), self.cdtype)
        if direction == "backward_filter":
            # dy sits at the tile origin, conjugate transform; only the taps come back.
            self.DWd = dev(_forward_w(g.out[1], 0, T1, True), self.dtype)
            self.DHd = dev(_forward_h(g.out[0], 0, T0, True), self.cdtype)
            self.DHi = dev(_inverse_h(g.extent[0], T0), self.cdtype)
            self.DWi = dev(_inverse_w(g.extent[1], T1, 1.0 / (T0 * T1)), self.dtype)
        else:
            self.DHi = dev(_inverse_h(g.out[0], T0), self.cdtype)
            self.DWi = dev(_inverse_w(g.out[1], T1, 1.0), self.dtype)
            self.Ds, self.Dr = _fft._twiddle_matrices(xp, g.T, g.extent, self.cdtype)
        J, Ko = g.channels_in, g.channels_out
        big = max(N, J, Ko) * max(J, Ko) * max(g.frequencies, g.size_in[0] * g.half,
                                                g.out[0] * g.half) * 2
        it = index_type(big, 2 * g.extent[0] * g.extent[1] * J * Ko,
                        N * J * g.size_in[0] * g.size_in[1], N * Ko * g.out[0] * g.out[1])
        ct = _dtypes.cuda_type(self.dtype)
        self.transpose = f"dft_transpose<{ct}, {it}>"
        self.rows_forward = f"dft_rows_forward<{ct}, {it}>"
        self.rows_inverse = f"dft_rows_inverse<{ct}, {it}>"
        self.rows_inverse64 = f"dft_rows_inverse64<{ct}, {it}>"
        smax = next((m for m in FILTER_SMAX if g.extent[1] <= m), None)
        self.filter_spectrum = None if smax is None else f"dft_filter_spectrum<{ct}, {it}, {smax}>"
        self.filter_complex = f"fft_filter_complex<{ct}, {it}>"
        self.index = np.int64 if it == "long long" else np.int32


def _setup(xp, g, N, dtype, direction):
    key = (None if xp is np else xp.cuda.runtime.getDevice(), g.T, g.pad, g.size_in, g.out, g.extent,
           g.channels_in, g.channels_out, N, np.dtype(dtype).name, direction == "backward_filter")
    st = _setups.pop(key, None)
    if st is None:
        st = _Setup(xp, g, N, dtype, direction)
        while len(_setups) >= SETUP_CACHE_SIZE:
            _setups.pop(next(iter(_setups)))
    _setups[key] = st
    return st


def _transpose(xp, st, a, rows, cols):
    """The complex (rows, cols) matrix a (contiguous) as a new (cols, rows) one."""
    a = a.reshape(rows, cols)
    if xp is np:
        return np.ascontiguousarray(a.T)
    out = xp.empty((cols, rows), dtype=a.dtype)
    grid = (ceil_div(cols, 32), min(ceil_div(rows, 32), 65535))
    FAMILY.launch(st.transpose, grid, (32, 8), (a, out, st.index(rows), st.index(cols)))
    return out


def _spectra(xp, st, a, DW, DH):
    """Z (F, NB, J) complex: the 2-D (half) spectra of real a (NB, J, Hi, Wi),
    contiguous, under the W-axis matrix DW (Wi, 2 h) and H-axis matrix DH (T, Hi)."""
    NB, J, Hi, Wi = a.shape
    h = DW.shape[1] // 2
    T0 = DH.shape[0]
    launch = rows_forward_launch(Hi, Wi, h, NB, J, a.itemsize) if FUSED_ROWS and xp is not np else None
    if launch is not None:
        grid, args, smem = launch
        A1t = xp.empty((Hi * h, NB * J), dtype=st.cdtype)
        FAMILY.launch(st.rows_forward, grid, (256,), (a, DW, A1t, *args), shared_mem=smem)
        Z = _cublas.gemm(xp, DH, A1t.reshape(Hi, h * NB * J), xp.empty((T0, h * NB * J), dtype=st.cdtype))
        return Z.reshape(T0 * h, NB, J)
    A1 = _cublas.gemm(xp, a.reshape(NB * J * Hi, Wi), DW, xp.empty((NB * J * Hi, 2 * h), dtype=a.dtype))
    A1 = A1.view(st.cdtype)                                                  # (NB J Hi, h)
    A1t = _transpose(xp, st, A1, NB * J, Hi * h)                             # (Hi h, NB J)
    del A1
    Z = _cublas.gemm(xp, DH, A1t.reshape(Hi, h * NB * J), xp.empty((T0, h * NB * J), dtype=st.cdtype))
    return Z.reshape(T0 * h, NB, J)


def rows_forward_launch(Hi, Wi, h, NB, J, itemsize):
    """(grid, the int32 arguments after the three arrays, shared-memory bytes) of
    dft_rows_forward, or None where its shared memory or grid does not fit (the
    cuBLAS path)."""
    dpitch, xpitch = 2 * (-(-h // 4) * 4), Wi | 1
    smem = (Wi * dpitch + 64 * xpitch) * itemsize
    if NB > 65535 or Hi > 65535 or smem > _SMEM_LIMIT:
        return None
    args = tuple(np.int32(v) for v in (NB, J, Hi, Wi, h, dpitch, xpitch))
    return (ceil_div(J, 64), Hi, NB), args, smem


def rows_inverse_launch(B, n0, n1, h, itemsize):
    """(b a block, shared-memory bytes) of dft_rows_inverse64 (64) or
    dft_rows_inverse (32), or None for the cuBLAS path."""
    if n0 > 65535:
        return None
    for nb in ((64, 32) if INVERSE_B64 else (32,)):
        smem = (2 * nb * h + 2 * h * n1) * itemsize
        if smem <= _SMEM_LIMIT:
            return nb, smem
    return None


def _inverse(xp, st, Y, DHi, DWi, out):
    """out (B, n0, n1) real, contiguous = the kept outputs of the inverse of
    Y (F, B) complex (frequency-major, F = T h)."""
    n0, T0 = DHi.shape
    F, B = Y.shape
    h = F // T0
    n1 = DWi.shape[1]
    Yp = _cublas.gemm(xp, DHi, Y.reshape(T0, h * B), xp.empty((n0, h * B), dtype=st.cdtype))
    launch = rows_inverse_launch(B, n0, n1, h, out.itemsize) if FUSED_ROWS and xp is not np else None
    if launch is not None:
        nb, smem = launch
        FAMILY.launch(st.rows_inverse64 if nb == 64 else st.rows_inverse, (ceil_div(B, nb), n0), (256,),
                      (Yp, DWi, out, np.int32(B), np.int32(n0), np.int32(n1), np.int32(h)), shared_mem=smem)
        return out
    Ypt = _transpose(xp, st, Yp, n0 * h, B)                                  # (B, n0 h)
    del Yp
    real = Ypt.view(st.dtype).reshape(B * n0, 2 * h)
    _cublas.gemm(xp, real, DWi, out.reshape(B * n0, n1))
    return out


def fused_filter_launch(st, g):
    """(pairs a block, shared-memory bytes) of dft_filter_spectrum for this
    setup and geometry, or None where the cuBLAS path makes the filter spectrum:
    FUSED_FILTER off, fewer than FUSED_FILTER_MIN_TAPS taps, E' > 32, or the taps
    of 32 pairs over the shared memory."""
    E0, E1 = g.extent
    if not FUSED_FILTER or st.filter_spectrum is None or E0 * E1 < FUSED_FILTER_MIN_TAPS:
        return None
    itemsize = np.dtype(st.dtype).itemsize
    for npairs in (128, 64, 32):   # pairs a block: the most whose taps fit the shared memory
        smem = ((npairs * ((E0 * E1) | 1) + 2 * g.half * E1) * itemsize
                + (E0 * E1 + npairs) * np.dtype(st.index).itemsize)
        if smem <= _SMEM_LIMIT:
            return npairs, smem
    return None


def _filter_source(xp, st, g, f, dilation, flip):
    """What :func:`_filter_rows` turns into spectrum rows: the filter itself for
    the fused kernel (with its pairs a block and shared memory, see
    :func:`fused_filter_launch`), else the filter's W-axis spectrum A (E, h, J Ko)
    (fft's conversion kernel + the Ds GEMM), which every chunk of rows shares."""
    E0, E1 = g.extent
    J, Ko = g.channels_in, g.channels_out
    launch = None if xp is np else fused_filter_launch(st, g)
    if launch is not None:
        return ("fused", f, launch)
    wc = xp.empty((E0, E1, J, Ko), dtype=st.cdtype)
    if xp is np:
        _fft._emulate_filter_complex(f, wc, dilation, flip, flip)
    else:
        fs = _fft._elements(f)
        sk, sj = (fs[1], fs[0]) if flip else (fs[0], fs[1])
        total = wc.size
        _fft.FAMILY.launch(st.filter_complex, (ceil_div(total, 256),), (256,),
                           (f, wc, st.index(total), np.int32(E0), np.int32(E1), np.int32(J), np.int32(Ko),
                            np.int32(dilation[0]), np.int32(dilation[1]), np.int32(flip),
                            np.int64(sk), np.int64(sj), np.int64(fs[2]), np.int64(fs[3])))
    A = xp.empty((E0, g.half, J * Ko), dtype=st.cdtype)
    _cublas.gemm(xp, st.Ds, wc.reshape(E0, E1, J * Ko), A)                   # (E, h, J Ko)
    return ("gemm", A, None)


def _filter_rows(xp, st, g, source, dilation, flip, u0, u1, G):
    """G ((u1 - u0) h, J, Ko) = the rows u0 <= u < u1 of the spectrum of the
    (dilated; for ``flip`` rotated and channel-swapped) filter placed reversed,
    1 / (T T') folded in: G[(u, v), j, k] = sum_r Dr[u, r] sum_s Ds[v, s] g[r, s]."""
    kind, src, launch = source
    Dr = st.Dr[u0:u1]                                   # contiguous rows of (T, E)
    if kind == "gemm":
        E0 = src.shape[0]
        _cublas.gemm(xp, Dr, src.reshape(E0, -1), G.reshape(u1 - u0, -1))
        return G
    E0, E1 = g.extent
    J, Ko = g.channels_in, g.channels_out
    rows_total = u1 - u0
    fs = _fft._elements(src)
    sk, sj = (fs[1], fs[0]) if flip else (fs[0], fs[1])
    npairs, smem = launch
    pair_blocks = ceil_div(J * Ko, npairs)
    # Two rows u a block where that still leaves >= 768 blocks (~6 a multiprocessor
    # of the H100: the staging of the taps is paid once a block); grid.y <= 65535.
    per_block = max(ceil_div(rows_total, 65535), 2 if pair_blocks * ceil_div(rows_total, 2) >= 768 else 1)
    FAMILY.launch(st.filter_spectrum, (pair_blocks, ceil_div(rows_total, per_block)), (npairs,),
                  (src, st.Ds, Dr, G, np.int32(rows_total), np.int32(g.half), np.int32(E0), np.int32(E1),
                   np.int32(J), np.int32(Ko), np.int32(dilation[0]), np.int32(dilation[1]), np.int32(flip),
                   np.int64(sk), np.int64(sj), np.int64(fs[2]), np.int64(fs[3])), shared_mem=smem)
    return G


def filter_chunks(g, itemsize):
    """The row ranges [u0, u1) of the filter spectrum made and consumed one at a
    time (each at most FILTER_CHUNK_BYTES, at least one row u; one range when
    FILTER_CHUNK_BYTES is 0)."""
    T0 = g.T[0]
    row_bytes = g.half * g.channels_in * g.channels_out * 2 * itemsize
    rows = T0 if FILTER_CHUNK_BYTES <= 0 else max(1, min(T0, FILTER_CHUNK_BYTES // row_bytes))
    count = ceil_div(T0, rows)
    rows = ceil_div(T0, count)            # even chunks: the last one is not a sliver
    return [(u0, min(u0 + rows, T0)) for u0 in range(0, T0, rows)]


def correlate(xp, g, a, f, out, bias, dilation, flip):
    """out (N, Ko, P, Q) contiguous = correlation of a (N, J, Hi, Wi) contiguous
    with the filter (forward, or backward data when ``flip``), plus bias.

    The filter spectrum is made in chunks of rows u, each multiplied at once
    (per-frequency GEMMs of those rows) while it is still in L2."""
    N = a.shape[0]
    J, Ko = g.channels_in, g.channels_out
    h = g.half
    st = _setup(xp, g, N, out.dtype, "forward")
    Z = _spectra(xp, st, a, st.DWf, st.DHf)                                  # (F, N, J)
    source = _filter_source(xp, st, g, f, dilation, flip)
    Y = xp.empty((g.frequencies, N, Ko), dtype=st.cdtype)
    chunks = filter_chunks(g, np.dtype(st.dtype).itemsize)
    buf = xp.empty((max(u1 - u0 for u0, u1 in chunks) * h, J, Ko), dtype=st.cdtype)
    for u0, u1 in chunks:
        G = _filter_rows(xp, st, g, source, dilation, flip, u0, u1, buf[:(u1 - u0) * h])
        _cublas.gemm(xp, Z[u0 * h:u1 * h], G, Y[u0 * h:u1 * h])
    del Z, buf, G, source
    if bias is not None:  # the zero frequency of a constant: the unnormalised inverse spreads it
        xp.add(Y[0], bias.reshape(1, Ko), out=Y[0])
    return _inverse(xp, st, Y.reshape(g.frequencies, N * Ko), st.DHi, st.DWi, out.reshape(N * Ko, *g.out))


# The prepared path (helper dft7c, notes/dft7c.md).  On the H100 the whole
# forward of big_7x7_s1 takes 0.30 ms of GPU time but took 0.39-0.53 ms of host
# time through correlate(): ~30 CuPy views, 7 allocations and 8 Python-level
# launches a call.  A benchmark that issues calls back to back measures the larger
# of the two, so the call read 0.37-0.51 ms in one process and 0.30 in another,
# as fast or slow as the host.  The prepared path makes the same launches from
# arguments fixed once per problem: one workspace allocation, raw cuBLAS calls on
# pointer offsets, prepared kernel launches.
_ALIGN = 256   # bytes: where every region of the prepared workspace starts


def _options():
    """The module flags a prepared plan was made under (tests change them)."""
    return FUSED_ROWS, FUSED_FILTER, FUSED_FILTER_MIN_TAPS, FILTER_CHUNK_BYTES, INVERSE_B64


def correlate_layout(g, N, itemsize, filter_by_gemm, chunk_rows):
    """(offsets, total) of the prepared forward / backward-data workspace, in complex
    elements: regions "wc" and "A" (filter_by_gemm: the converted filter and its
    W-axis spectrum), "G" (chunk_rows rows u of the filter spectrum), "Z" (the
    input spectra), "A1t" (the W-axis spectra), "Y" (the output spectra), "Yp"
    (after the H-axis inverse).  A1t dies with Z made and Y takes its place; the
    filter region and Z die with Y made, and Yp takes their place where it fits."""
    J, Ko, h = g.channels_in, g.channels_out, g.half
    unit = _ALIGN // (2 * itemsize)
    up = lambda n: -(-n // unit) * unit  # noqa: E731
    off, end = {}, 0
    if filter_by_gemm:
        off["wc"], off["A"] = 0, up(g.extent[0] * g.extent[1] * J * Ko)
        end = off["A"] + up(g.extent[0] * h * J * Ko)
    off["G"] = end
    off["Z"] = end = end + up(chunk_rows * h * J * Ko)
    off["A1t"] = off["Y"] = end = end + up(g.frequencies * N * J)
    y_size = up(g.frequencies * N * Ko)
    inv = g.out[0] * h * N * Ko
    off["Yp"] = 0 if inv <= off["Y"] else end + y_size
    return off, max(end + max(up(g.size_in[0] * h * N * J), y_size), off["Yp"] + inv)


def prepared_correlate(p, g, direction):
    """``run(a, b, out, bias)``: correlate() of this problem on the GPU as fixed
    launches (NCHW, contiguous operands; others take correlate()), or None where
    the row kernels do not fit (FUSED_ROWS off, or their shared memory or grid)."""
    import cupy
    from cupy.cuda import device
    from .._kernels import ARRAY0, ARRAY1, ARRAY2, ARRAY3, ARRAY4, ARRAY5

    N, flip = p.N, direction == "backward_data"
    J, Ko, h, T0 = g.channels_in, g.channels_out, g.half, g.T[0]
    (Hi, Wi), (n0, n1), (E0, E1) = g.size_in, g.out, g.extent
    st = _setup(cupy, g, N, p.dtype, "forward")
    itemsize = st.dtype.itemsize
    rows = rows_forward_launch(Hi, Wi, h, N, J, itemsize)
    inverse = rows_inverse_launch(N * Ko, n0, n1, h, itemsize)
    if not FUSED_ROWS or rows is None or inverse is None or p.layout != "NCHW":
        return None
    fused = fused_filter_launch(st, g)
    chunks = filter_chunks(g, itemsize)
    off, total = correlate_layout(g, N, itemsize, fused is None, max(u1 - u0 for u0, u1 in chunks))
    cd, csize = st.cdtype, 2 * itemsize
    at = {k: v * csize for k, v in off.items()}   # byte offsets
    i32, i64 = np.int32, np.int64
    # Arrays of a launch: ARRAY0 = a, ARRAY1 = the filter, ARRAY2 = out, then views
    # of the workspace made per call: ARRAY3 = A1t, ARRAY4 = wc or G (what the
    # filter kernel writes), ARRAY5 = Yp.
    grid, args, smem = rows
    launches = [FAMILY.prepare(st.rows_forward, grid, (256,), (ARRAY0, st.DWf, ARRAY3, *args), smem)]
    steps = [(_cublas.prepare(cd, T0, h * N * J, Hi), st.DHf.data.ptr, at["A1t"], at["Z"])]
    R, S = p.w_shape[2:]
    fs = (p.w_shape[1] * R * S, R * S, S, 1)     # a C-contiguous filter's element strides
    sk, sj = (fs[1], fs[0]) if flip else (fs[0], fs[1])
    filter_args = (i32(E0), i32(E1), i32(J), i32(Ko), i32(p.dilation[0]), i32(p.dilation[1]), i32(flip),
                   i64(sk), i64(sj), i64(fs[2]), i64(fs[3]))
    filter_launches = []
    if fused is None:
        count = E0 * E1 * J * Ko
        filter_launches.append(_fft.FAMILY.prepare(st.filter_complex, (ceil_div(count, 256),), (256,),
                                                   (ARRAY1, ARRAY4, st.index(count), *filter_args)))
        filter_gemm = (_cublas.prepare(cd, h, J * Ko, E1, batch=E0, a_batched=False), st.Ds.data.ptr,
                       at["wc"], at["A"])
    chunk_steps = []
    for u0, u1 in chunks:
        dr = st.Dr[u0:u1]
        if fused is None:
            rows_gemm = (_cublas.prepare(cd, u1 - u0, h * J * Ko, E0), dr.data.ptr, at["A"], at["G"])
            kernel = None
        else:
            npairs, fsmem = fused
            pair_blocks = ceil_div(J * Ko, npairs)
            per_block = max(ceil_div(u1 - u0, 65535), 2 if pair_blocks * ceil_div(u1 - u0, 2) >= 768 else 1)
            kernel = FAMILY.prepare(st.filter_spectrum, (pair_blocks, ceil_div(u1 - u0, per_block)), (npairs,),
                                    (ARRAY1, st.Ds, dr, ARRAY4, i32(u1 - u0), i32(h), *filter_args), fsmem)
            rows_gemm = None
        chunk_steps.append((kernel, rows_gemm, (_cublas.prepare(cd, N, Ko, J, batch=(u1 - u0) * h),
                                                at["Z"] + u0 * h * N * J * csize, at["G"],
                                                at["Y"] + u0 * h * N * Ko * csize)))
    nb, ismem = inverse
    expression = st.rows_inverse64 if nb == 64 else st.rows_inverse
    inverse_gemm = (_cublas.prepare(cd, n0, h * N * Ko, T0), st.DHi.data.ptr, at["Y"], at["Yp"])
    launch_inverse = FAMILY.prepare(expression, (ceil_div(N * Ko, nb), n0), (256,),
                                    (ARRAY5, st.DWi, ARRAY2, i32(N * Ko), i32(n0), i32(n1), i32(h)), ismem)
    regions = ((at["A1t"], Hi * h * N * J), (at["wc"], E0 * E1 * J * Ko) if fused is None else (at["G"], 1),
               (at["Yp"], n0 * h * N * Ko))
    empty, ndarray, handle = cupy.empty, cupy.ndarray, device.get_cublas_handle

    def run(a, b, out, bias=None):
        if not (a._c_contiguous and b._c_contiguous and out._c_contiguous):
            return correlate(cupy, g, _nchw_contiguous(cupy, a, "NCHW"), _nchw_contiguous(cupy, b, "NCHW"),
                             out, bias, p.dilation, flip)
        ws = empty(total, dtype=cd)
        mem = ws.data
        base = mem.ptr
        arrays = (a, b, out) + tuple(ndarray((n,), cd, memptr=mem + o) for o, n in regions)
        cublas = handle()
        launches[0](*arrays)
        gemm, a_ptr, b_at, c_at = steps[0]
        gemm(cublas, a_ptr, base + b_at, base + c_at)
        if fused is None:
            filter_launches[0](*arrays)
            gemm, a_ptr, b_at, c_at = filter_gemm
            gemm(cublas, a_ptr, base + b_at, base + c_at)
        for kernel, rows_gemm, (gemm, a_at, b_at, c_at) in chunk_steps:
            if kernel is None:
                g_gemm, g_a, g_b, g_c = rows_gemm
                g_gemm(cublas, g_a, base + g_b, base + g_c)
            else:
                kernel(*arrays)
            gemm(cublas, base + a_at, base + b_at, base + c_at)
        if bias is not None:   # the zero frequency of a constant (see correlate)
            y0 = ndarray((N, Ko), cd, memptr=mem + at["Y"])
            cupy.add(y0, bias.reshape(1, Ko), out=y0)
        gemm, a_ptr, b_at, c_at = inverse_gemm
        gemm(cublas, a_ptr, base + b_at, base + c_at)
        launch_inverse(*arrays)
        return out
    run.setup = st   # the transform matrices whose pointers the cuBLAS calls hold
    return run


def filter_gradient(xp, g, a, d, N):
    """The dilated filter gradient (K, C, E, E'): a = x (N, C, H, W), d = dy
    (N, K, P, Q), both contiguous."""
    C, K = g.channels_in, g.channels_out
    st = _setup(xp, g, N, a.dtype, "backward_filter")
    Za = _spectra(xp, st, a, st.DWf, st.DHf)                                 # (F, N, C)
    Zd = _spectra(xp, st, d, st.DWd, st.DHd)                                 # (F, N, K), conjugated
    prod = _cublas.gemm(xp, Zd, Za, xp.empty((g.frequencies, K, C), dtype=st.cdtype), trans_a=True)
    del Za, Zd
    dw = xp.empty((K * C, g.extent[0], g.extent[1]), dtype=a.dtype)
    return _inverse(xp, st, prod.reshape(g.frequencies, K * C), st.DHi, st.DWi, dw).reshape(
        K, C, g.extent[0], g.extent[1])


def _nchw_contiguous(xp, a, layout):
    return xp.ascontiguousarray(a if layout == "NCHW" else a.transpose(0, 3, 1, 2))


class DFTConvolution(ConvAlgorithm):
    """Dense-DFT transforms on cuBLAS, per-frequency complex GEMMs in between."""

    name = "dft"

    def __init__(self):
        self._geometries = {}
        self._runners = {}

    def supports(self, problem, direction):
        ok, reason = super().supports(problem, direction)
        if not ok:
            return ok, reason
        return _fft.spectral_support(problem, "complex64/complex128")

    def geometry(self, problem, direction):
        key = (problem, direction)
        g = self._geometries.get(key)
        if g is None:
            if len(self._geometries) >= 4 * SETUP_CACHE_SIZE:
                self._geometries.clear()
            g = self._geometries[key] = Geometry(problem, direction)
        return g

    def workspace_bytes(self, problem, direction):
        """An upper bound of the buffers alive at once (the largest pair of
        consecutive intermediates plus the spectra kept across them)."""
        p = problem
        g = self.geometry(p, direction)
        real = np.dtype(p.dtype).itemsize
        cplx = 2 * real
        J, Ko, N = g.channels_in, g.channels_out, p.N
        F, h = g.frequencies, g.half
        a1 = N * J * g.size_in[0] * h * cplx                     # A1 and its transpose
        spectrum_in = N * J * F * cplx
        copies = 0 if p.layout == "NCHW" else (N * J * g.size_in[0] * g.size_in[1]
                                                + N * Ko * g.out[0] * g.out[1]) * real
        if direction == "backward_filter":
            d1 = N * Ko * g.out[0] * h * cplx
            spectrum_d = N * Ko * F * cplx
            prod = Ko * J * F * cplx
            inv = Ko * J * g.extent[0] * h * cplx
            dw = Ko * J * g.extent[0] * g.extent[1] * real        # alive with prod and the inverse's two
            return (max(2 * a1, spectrum_in + 2 * d1) + spectrum_in + spectrum_d + prod + 2 * inv + dw
                    + copies)
        spectrum_filter = J * Ko * (F + g.extent[0] * h + g.extent[0] * g.extent[1]) * cplx
        out_spectrum = N * Ko * F * cplx
        inv = N * Ko * g.out[0] * h * cplx
        # + 8 _ALIGN: the prepared path starts each region of its workspace on _ALIGN bytes
        return spectrum_filter + max(2 * a1 + spectrum_in, spectrum_in + out_spectrum,
                                     out_spectrum + 2 * inv) + copies + 8 * _ALIGN

    def _runner(self, problem, direction):
        """The call on the current device under the current flags: the prepared
        path where it applies (forward, backward data), else :meth:`_run`.  One
        runner with or without a bias: both paths take the bias per call."""
        import cupy
        key = (cupy.cuda.runtime.getDevice(), problem, direction, _options())
        runner = self._runners.get(key)
        if runner is None:
            if len(self._runners) >= 4 * SETUP_CACHE_SIZE:
                self._runners.clear()
            runner = None if direction == "backward_filter" else prepared_correlate(
                problem, self.geometry(problem, direction), direction)
            if runner is None:
                def runner(a, b, out, bias=None):
                    return self._run(cupy, problem, direction, a, b, out, bias)
            self._runners[key] = runner
        return runner

    def prepare(self, problem, direction, has_bias=False, activation=None):
        runner, options = self._runner(problem, direction), _options()

        def run(a, b, out, bias=None):
            if _options() != options:   # the module's flags changed since (tests do that)
                return self.run(problem, direction, a, b, out, bias)
            return runner(a, b, out, bias)
        return run

    def run(self, problem, direction, a, b, out, bias=None, activation=None):
        return self._runner(problem, direction)(a, b, out, bias)

    def _run(self, xp, p, direction, a, b, out, bias=None):
        g = self.geometry(p, direction)
        if direction == "backward_filter":
            x = _nchw_contiguous(xp, a, p.layout)
            dy = _nchw_contiguous(xp, b, p.layout)
            dw = filter_gradient(xp, g, x, dy, p.N)
            if p.dilation == (1, 1):
                out[...] = dw
            else:
                out[...] = dw[:, :, ::p.dilation[0], ::p.dilation[1]]
            return out
        src = _nchw_contiguous(xp, a, p.layout)
        nchw = p.layout == "NCHW"
        dst = out if nchw else xp.empty((p.N, g.channels_out) + g.out, dtype=out.dtype)
        correlate(xp, g, src, b, dst, bias if direction == "forward" else None, p.dilation,
                  direction == "backward_data")
        if not nchw:
            out[...] = dst.transpose(0, 2, 3, 1)
        return out


DFT = register(DFTConvolution())
