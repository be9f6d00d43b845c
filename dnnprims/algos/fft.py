"""The "fft" and "fft_tiled" algorithms: convolution as a product of spectra,
through cuFFT (``cupy.fft``) and a batched complex GEMM per frequency (cuBLAS
through ``cupy.matmul``).  Stride 1, ungrouped, float32 (complex64) and float64
(complex128); dilation by a zero-inserted filter.

The one computation.  A filter ``g`` (Ko, J, E, E') placed *reversed* in a
T x T' buffer (``g[r, s]`` at ``(-r mod T, -s mod T')``) turns the cyclic
convolution of a T x T' input tile ``a`` with it into the cross-correlation

    c[u, v] = sum_{r, s} a[(u + r) mod T, (v + s) mod T'] g[r, s]

so in the frequency domain (rfft2 over the last two axes, F = T * (T'/2 + 1)
frequencies) every frequency is an independent (B x J) @ (J x Ko) complex
product, B = tiles: one ``matmul`` of shape (F, B, J) @ (F, J, Ko).  No
conjugation is needed anywhere: the reversal is folded into where data is
placed.

Tiles (overlap-save).  The padded input is cut into tiles of T rows that start
``step`` rows apart; a tile's outputs u < step = T - E + 1 read rows
u + r <= T - 1 of the tile, never wrapped, so they are exact.  "fft" uses one
tile per sample, and a smaller T: with padding ``pad`` >= 0 the tile starts
``pad`` rows above the image and only needs T >= H + pad rows, because the
positions that wrap (u + r >= T) land in the tile's leading ``pad`` zero rows,
where the true padded input is zero too.  "fft_tiled" uses T from
:func:`tile_size` (4 (E - 1) rounded up to 16, 32 or 64): the filter spectrum
is (T / image)^2 smaller and the tiles are processed in chunks of at most
TILED_CHUNK_BYTES, so the workspace is bounded whatever the batch and image.
FFT sizes have only the prime factors 2, 3, 5, 7 (:func:`good_fft_size`).

Directions.  Forward: ``a`` = x tiles, ``g`` = w.  Backward data is a forward
convolution of dy with the filter rotated by 180 degrees, channels swapped,
and padding E - 1 - pad (possibly negative: the tile then starts inside dy).
Backward filter is the same bilinear form read the other way: ``a`` = x tiles,
the output-gradient tile placed reversed, and the product (F, K, B) @ (F, B, C)
sums over the tiles (and the batch) in the frequency domain; one inverse FFT
at the end, of which the first E x E' taps are the (dilated) filter gradient.

Filter spectrum.  The reversed filter buffer would be almost all zeros, so
its 2-D DFT is taken directly, as two small complex GEMMs over the E x E'
taps (:func:`_filter_spectrum`); it comes out frequency-major, ready for the
per-frequency GEMM, with the inverse transform's 1 / (T T') folded in.

Plans.  The default "strided" layout runs cuFFT plans of our own
(``cupy.cuda.cufft.PlanNd``: contiguous real tiles in, frequency-major
spectra out, and back), made once per (device, stream, host thread,
direction, dtype, FFT size, batch) and kept in ``_plans`` (least recently used
dropped beyond PLAN_CACHE_SIZE): a plan holds one cuFFT work area, so it is
never run on two streams (or by two threads) at once.  The other layouts go
through ``cupy.fft``, whose plans CuPy caches per device and thread
(``cupy.fft.config.get_plan_cache()``, keyed by shape, strides, type and
batch).

Every step is written against ``xp`` so that the tiling, placement and GEMM
bookkeeping run (and are tested) on NumPy too.
"""
import threading

import numpy as np

from . import ConvAlgorithm, register
from .. import _cublas, _dtypes, _kernels
from .._kernels import KernelFamily, ceil_div, index_type

# kernels/conv_fft.cu: window (pad + layout), crop (+ bias), filter to complex.
FAMILY = KernelFamily("conv_fft.cu", [
    f"{name}<{t}, {i}>"
    for name in ("fft_window", "fft_crop", "fft_filter_complex")
    for t in ("float", "double") for i in ("int", "long long")])
_THREADS = 256

SUPPORTED_DTYPES = ("float32", "float64")
# FFT tile sizes of "fft_tiled", smallest first (powers of two: cuFFT's fastest).
TILE_SIZES = (16, 32, 64)
# "fft_tiled" processes at most this many bytes of per-tile buffers at a time.
TILED_CHUNK_BYTES = 64 * 2**20


def good_fft_size(n):
    """The smallest even m >= n whose prime factors are all in (2, 3, 5, 7)."""
    m = max(2, n + (n & 1))
    while True:
        r = m
        for f in (2, 3, 5, 7):
            while r % f == 0:
                r //= f
        if r == 1:
            return m
        m += 2


def tile_size(extent):
    """FFT tile size of "fft_tiled" for a (dilated) filter extent: at least
    4 (E - 1), so that at least 3/4 of each tile's outputs are kept."""
    for t in TILE_SIZES:
        if t >= 4 * (extent - 1):
            return t
    return good_fft_size(4 * (extent - 1))


def _extents(p):
    return (p.dilation[0] * (p.R - 1) + 1, p.dilation[1] * (p.S - 1) + 1)


def _dim_plan(n_out, extent, pad, tile):
    """(FFT size T, output step per tile, tiles) along one axis."""
    single = good_fft_size(max(n_out + extent - 1 - max(pad, 0), n_out, extent))
    if tile is None or single <= tile:
        return single, n_out, 1
    step = tile - extent + 1
    return tile, step, -(-n_out // step)


def spectral_support(p, transform):
    """(ok, reason) for what a frequency-domain convolution (``fft``, ``dft``)
    needs: float32/float64 (``transform`` names what it transforms in),
    no groups, stride 1."""
    if p.dtype not in SUPPORTED_DTYPES:
        return False, f"it transforms in {transform}: float32 and float64 only, not {p.dtype}"
    if p.groups != 1:
        return False, f"it computes ungrouped convolutions only, not groups={p.groups}"
    if p.stride != (1, 1):
        return False, f"it computes stride 1 only, not stride={p.stride}"
    return True, ""


class Geometry:
    """The tiling of one direction of one problem.

    The "input" is what the tiles are cut from: x (forward, backward filter) or
    dy (backward data, computed as a forward convolution); ``pad`` is that
    convolution's padding, ``out`` its output size."""

    def __init__(self, p, direction, tiled):
        E = _extents(p)
        if direction == "backward_data":
            self.pad = (E[0] - 1 - p.padding[0], E[1] - 1 - p.padding[1])
            self.out = (p.H, p.W)
            self.channels_in, self.channels_out = p.K, p.C
        else:
            self.pad = p.padding
            self.out = (p.P, p.Q)
            self.channels_in, self.channels_out = p.C, p.K
        self.extent = E
        dims = [_dim_plan(self.out[i], E[i], self.pad[i], tile_size(E[i]) if tiled else None)
                for i in range(2)]
        self.T = (dims[0][0], dims[1][0])
        self.step = (dims[0][1], dims[1][1])
        self.tiles = (dims[0][2], dims[1][2])
        self.frequencies = self.T[0] * (self.T[1] // 2 + 1)


def _chunks(N, tiles, chunk_tiles):
    """(n0, n1, i0, i1): samples n0:n1, tile rows i0:i1, each at most
    ``chunk_tiles`` tiles (at least one tile row); None: everything at once."""
    th, tw = tiles
    if chunk_tiles is None:
        yield 0, N, 0, th
        return
    if chunk_tiles >= th * tw:
        samples = chunk_tiles // (th * tw)
        for n0 in range(0, N, samples):
            yield n0, min(N, n0 + samples), 0, th
        return
    rows = max(1, chunk_tiles // tw)
    for n in range(N):
        for i0 in range(0, th, rows):
            yield n, n + 1, i0, min(th, i0 + rows)


def _largest_chunk(N, tiles, chunk_tiles):
    th, tw = tiles
    if chunk_tiles is None:
        return N * th * tw
    if chunk_tiles >= th * tw:
        return min(N, chunk_tiles // (th * tw)) * th * tw
    return min(th, max(1, chunk_tiles // tw)) * tw


def _buffer_bytes(p, direction, g):
    """(bytes fixed per call, bytes per tile): an upper bound of the buffers
    alive at once -- real tiles, spectra (plus the transposed copies of the
    "plain" layout), the filter spectrum or the filter-gradient sum."""
    real = np.dtype(p.dtype).itemsize
    cplx = 2 * real
    tt, F = g.T[0] * g.T[1], g.frequencies
    J, Ko = g.channels_in, g.channels_out
    out_tile = g.step[0] * g.step[1]
    copies = 2 if LAYOUT == "plain" else 1
    a_side = J * (2 * tt * real + copies * F * cplx)         # window (+ tiles), spectrum
    if direction == "backward_filter":
        fixed = Ko * J * (2 * F * cplx + tt * real)          # sum, product; inverse
        per_tile = a_side + Ko * (out_tile * real + tt * real + copies * F * cplx)
    else:
        E = g.extent
        fixed = Ko * J * (F + E[0] * (g.T[1] // 2 + 1) + E[0] * E[1]) * cplx  # filter spectrum
        per_tile = a_side + Ko * (copies * F * cplx + tt * real + out_tile * real)
    return fixed, per_tile


def _chunk_tiles(p, direction, g, tiled):
    if not tiled:
        return None
    return max(1, TILED_CHUNK_BYTES // _buffer_bytes(p, direction, g)[1])


# --- the steps, against xp ---------------------------------------------------------

def _nchw(a, layout):
    """An NCHW view of an array stored in ``layout``."""
    return a if layout == "NCHW" else a.transpose(0, 3, 1, 2)


def _window(xp, a, n0, n1, row0, rows, col0, cols, spatial_first=False):
    """a[n0:n1, :, row0:row0+rows, col0:col0+cols], zero outside ``a`` (row0 and
    col0 may be negative), as a new C-contiguous array (nb, J, rows, cols), or
    (rows, cols, nb, J) when ``spatial_first``."""
    H, W = a.shape[2:]
    nb, J = n1 - n0, a.shape[1]
    out = xp.zeros((rows, cols, nb, J) if spatial_first else (nb, J, rows, cols), dtype=a.dtype)
    r0, r1 = max(row0, 0), min(row0 + rows, H)
    c0, c1 = max(col0, 0), min(col0 + cols, W)
    if r0 < r1 and c0 < c1:
        src = a[n0:n1, :, r0:r1, c0:c1]
        if spatial_first:
            out[r0 - row0:r1 - row0, c0 - col0:c1 - col0] = src.transpose(2, 3, 0, 1)
        else:
            out[:, :, r0 - row0:r1 - row0, c0 - col0:c1 - col0] = src
    return out


def _input_tiles(xp, a, g, n0, n1, i0, i1, spatial_first):
    """(B, J, T, T') tiles of the padded input for samples n0:n1, tile rows
    i0:i1 (all tile columns), B = samples x rows x columns, in that order;
    (T, T', B, J) when ``spatial_first``."""
    (T0, T1), (s0, s1), (_, tw) = g.T, g.step, g.tiles
    rows = i1 - i0
    one = rows == 1 and tw == 1
    strip = _window(xp, a, n0, n1, i0 * s0 - g.pad[0], (rows - 1) * s0 + T0, -g.pad[1],
                    (tw - 1) * s1 + T1, spatial_first and one)
    if one:
        return strip
    nb, J = strip.shape[:2]
    st = strip.strides
    view = xp.lib.stride_tricks.as_strided(strip, (nb, rows, tw, J, T0, T1),
                                           (st[0], s0 * st[2], s1 * st[3], st[1], st[2], st[3]))
    if spatial_first:
        return xp.ascontiguousarray(view.transpose(4, 5, 0, 1, 2, 3)).reshape(T0, T1, nb * rows * tw, J)
    return xp.ascontiguousarray(view).reshape(nb * rows * tw, J, T0, T1)


def _reversed_pieces(length, size):
    """(source, destination) slices putting index i of ``length`` at -i mod ``size``."""
    pieces = [(slice(0, 1), slice(0, 1))]
    if length > 1:
        pieces.append((slice(length - 1, 0, -1), slice(size - length + 1, size)))
    return pieces


def _place_reversed(xp, src, T, spatial_first):
    """A zero (batch..., T, T') buffer -- (T, T', batch...) when ``spatial_first``
    -- with src[..., i, j] at (-i mod T, -j mod T')."""
    batch = tuple(src.shape[:-2])
    buf = xp.zeros(tuple(T) + batch if spatial_first else batch + tuple(T), dtype=src.dtype)
    for si, di in _reversed_pieces(src.shape[-2], T[0]):
        for sj, dj in _reversed_pieces(src.shape[-1], T[1]):
            piece = src[..., si, sj]
            if spatial_first:
                buf[di, dj] = xp.moveaxis(piece, (-2, -1), (0, 1))
            else:
                buf[..., di, dj] = piece
    return buf


# Spectra are laid out frequency-major, (F, b0, b1): each frequency's matrix
# is then contiguous for the batched GEMM.  How the real buffers are laid out
# and transformed (chosen by measurement, notes/conv_fft.md):
#   "spatial_first": buffers (T, T', b0, b1); cupy.fft transforms the first two
#       axes with the batch innermost (cuFFT stride b0*b1, distance 1), which
#       reads and writes the frequency-major layout directly;
#   "strided": buffers (b0, b1, T, T'); our own cuFFT plans read them
#       contiguously and write (F, b0, b1) with stride b0*b1;
#   "plain": buffers (b0, b1, T, T'); contiguous cupy.fft + a transposed copy.
# H100, big_7x7_s1 batch 32 forward, end to end: strided 0.55 ms, plain 0.74,
# spatial_first 0.73; strided is best or tied on all 18 measured cases.
LAYOUT = "strided"
LAYOUTS = ("spatial_first", "strided", "plain")
PLAN_CACHE_SIZE = 32
_plans = {}   # (device, stream, thread, kind, T, batch) -> cupy.cuda.cufft.PlanNd, least recently used first


def _plan_user():
    """(current stream pointer, host thread): who runs a cached plan.  A PlanNd
    keeps one work area for its life and is put on the caller's stream per call,
    so one plan run on two streams at once would share that scratch memory;
    cuFFT plans are also not to be shared between host threads (CuPy's own plan
    cache is per thread)."""
    return _kernels._current_stream().ptr, threading.get_ident()


def _plan(cupy, inverse, real_dtype, T, batch):
    """A cached cuFFT plan: batched 2-D R2C (D2Z) from contiguous (batch, T, T')
    to frequency-major (F, batch), or the C2R (Z2D) inverse."""
    from cupy.cuda import cufft
    key = (cupy.cuda.runtime.getDevice(), *_plan_user(), inverse, real_dtype == np.float64, T, batch)
    plan = _plans.pop(key, None)
    if plan is None:
        half = T[1] // 2 + 1
        if inverse:
            kind = cufft.CUFFT_Z2D if real_dtype == np.float64 else cufft.CUFFT_C2R
            plan = cufft.PlanNd(list(T), [T[0], half], batch, 1, list(T), 1, T[0] * T[1],
                                kind, batch, "C", -1, T[1])
        else:
            kind = cufft.CUFFT_D2Z if real_dtype == np.float64 else cufft.CUFFT_R2C
            plan = cufft.PlanNd(list(T), list(T), 1, T[0] * T[1], [T[0], half], batch, 1,
                                kind, batch, "C", -1, half)
        while len(_plans) >= PLAN_CACHE_SIZE:
            _plans.pop(next(iter(_plans)))
    _plans[key] = plan
    return plan


def _spectrum(xp, buf):
    """Unnormalised rfft2 of real (b0, b1, T, T') -- (T, T', b0, b1) for the
    "spatial_first" layout -- as complex (F, b0, b1)."""
    if LAYOUT == "spatial_first":
        T0, T1, b0, b1 = buf.shape
        return xp.fft.rfft2(buf, axes=(0, 1)).reshape(-1, b0, b1)
    b0, b1, T0, T1 = buf.shape
    if xp is np or LAYOUT == "plain":
        s = xp.fft.rfft2(buf).reshape(b0, b1, -1)
        return xp.ascontiguousarray(s.transpose(2, 0, 1))
    from cupy.cuda import cufft
    buf = xp.ascontiguousarray(buf)
    out = xp.empty((T0 * (T1 // 2 + 1), b0, b1), dtype=np.result_type(buf.dtype, np.complex64))
    _plan(xp, False, buf.dtype, (T0, T1), b0 * b1).fft(buf, out, cufft.CUFFT_FORWARD)
    return out


def _inverse(xp, spectrum, T, real_dtype):
    """Unnormalised inverse of :func:`_spectrum`: complex (F, b0, b1) to a real
    (b0, b1, T, T') array or view.  Overwrites ``spectrum`` (cuFFT's C2R does)."""
    F, b0, b1 = spectrum.shape
    if LAYOUT == "spatial_first":
        s = spectrum.reshape(T[0], T[1] // 2 + 1, b0, b1)
        if xp is np:
            out = np.fft.irfft2(s, s=T, axes=(0, 1), norm="forward")
        else:
            import cupyx.scipy.fft
            out = cupyx.scipy.fft.irfft2(s, s=T, axes=(0, 1), norm="forward", overwrite_x=True)
        out = out if out.dtype == real_dtype else out.astype(real_dtype)
        return out.transpose(2, 3, 0, 1)
    if xp is np or LAYOUT == "plain":
        s = xp.ascontiguousarray(spectrum.transpose(1, 2, 0)).reshape(b0, b1, T[0], T[1] // 2 + 1)
        if xp is np:
            out = np.fft.irfft2(s, s=T, norm="forward")
        else:  # s is our own copy: let cuFFT's C2R overwrite it instead of copying it again
            import cupyx.scipy.fft
            out = cupyx.scipy.fft.irfft2(s, s=T, norm="forward", overwrite_x=True)
        return out if out.dtype == real_dtype else out.astype(real_dtype)
    from cupy.cuda import cufft
    out = xp.empty((b0, b1) + tuple(T), dtype=real_dtype)
    _plan(xp, True, np.dtype(real_dtype), tuple(T), b0 * b1).fft(spectrum, out, cufft.CUFFT_INVERSE)
    return out


_twiddles = {}   # (device, T, E, complex dtype) -> (Ds, Dr), least recently used first


def _twiddle_matrices(xp, T, E, cdtype):
    """Ds (T'/2+1, E') = exp(+2 pi i v s / T') and Dr (T, E) = exp(+2 pi i u r / T) / (T T'),
    computed in float64, cached on the device."""
    key = (None if xp is np else xp.cuda.runtime.getDevice(), T, E, np.dtype(cdtype).name)
    pair = _twiddles.pop(key, None)
    if pair is None:
        v, s = np.arange(T[1] // 2 + 1), np.arange(E[1])
        u, r = np.arange(T[0]), np.arange(E[0])
        Ds = np.exp(2j * np.pi * np.outer(v, s) / T[1])
        Dr = np.exp(2j * np.pi * np.outer(u, r) / T[0]) / (T[0] * T[1])
        pair = (xp.asarray(Ds.astype(cdtype)), xp.asarray(Dr.astype(cdtype)))
        while len(_twiddles) >= PLAN_CACHE_SIZE:
            _twiddles.pop(next(iter(_twiddles)))
    _twiddles[key] = pair
    return pair


def _filter_spectrum(xp, filt, T, cdtype):
    """The spectrum (F, J, Ko) of filt (Ko, J, E, E') placed reversed in a T x T'
    buffer, scaled by 1 / (T T') (the inverse transform is unnormalised).

    The buffer would be almost all zeros, so the 2-D DFT is taken directly as
    two small GEMMs over the E x E' taps, rows last:
        G[u, v] = sum_r Dr[u, r] sum_s Ds[v, s] g[r, s]
    (reversed placement: g[r, s] sits at (-r, -s), hence the + sign), which
    writes the frequency-major layout at once."""
    Ko, J, E0, E1 = filt.shape
    Ds, Dr = _twiddle_matrices(xp, T, (E0, E1), cdtype)
    w = xp.ascontiguousarray(filt.transpose(2, 3, 1, 0)).astype(cdtype)       # (E, E', J, Ko)
    A = xp.matmul(Ds, w.reshape(E0, E1, J * Ko))                               # (E, T'/2+1, J Ko)
    G = xp.matmul(Dr, A.reshape(E0, -1))                                       # (T, (T'/2+1) J Ko)
    return G.reshape(-1, J, Ko)


def _filter_dft(xp, w, Ds, Dr):
    """The two DFT GEMMs of :func:`_filter_spectrum` on complex w (E, E', J, Ko),
    straight to cuBLAS (the fast path)."""
    E0, E1, J, Ko = w.shape
    A = xp.empty((E0, Ds.shape[0], J * Ko), dtype=w.dtype)
    _cublas.gemm(xp, Ds, w.reshape(E0, E1, J * Ko), A)                         # (E, T'/2+1, J Ko)
    G = xp.empty((Dr.shape[0], A.shape[1] * J * Ko), dtype=w.dtype)
    _cublas.gemm(xp, Dr, A.reshape(E0, -1), G)                                 # (T, (T'/2+1) J Ko)
    return G.reshape(-1, J, Ko)


def _dilated(xp, w, dilation, extent):
    if dilation == (1, 1):
        return w
    out = xp.zeros(w.shape[:2] + tuple(extent), dtype=w.dtype)
    out[:, :, ::dilation[0], ::dilation[1]] = w
    return out


def _correlate(xp, a, filt, out, g, chunk_tiles, bias):
    """out (N, Ko, P, Q view) = cross-correlation of a (N, J, H, W view), padded
    by g.pad, with filt (Ko, J, E, E'), plus bias."""
    N, J = a.shape[:2]
    Ko = filt.shape[0]
    T = g.T
    G = _filter_spectrum(xp, filt, T, np.result_type(out.dtype, np.complex64))  # (F, J, Ko)
    sf = LAYOUT == "spatial_first"
    (s0, s1), tw = g.step, g.tiles[1]
    P, Q = out.shape[2:]
    b4 = None if bias is None else bias.reshape(1, Ko, 1, 1)
    for n0, n1, i0, i1 in _chunks(N, g.tiles, chunk_tiles):
        X = _spectrum(xp, _input_tiles(xp, a, g, n0, n1, i0, i1, sf))          # (F, B, J)
        Y = xp.matmul(X, G)                                                    # (F, B, Ko)
        del X
        y = _inverse(xp, Y, T, out.dtype)                                      # (B, Ko, T, T')
        del Y
        rows = i1 - i0
        r0, r1 = i0 * s0, min(P, i1 * s0)
        if rows == 1 and tw == 1:
            block = y[:, :, :r1 - r0, :Q]
        else:
            block = (y[:, :, :s0, :s1].reshape(n1 - n0, rows, tw, Ko, s0, s1)
                     .transpose(0, 3, 1, 4, 2, 5).reshape(n1 - n0, Ko, rows * s0, tw * s1))
            block = block[:, :, :r1 - r0, :Q]
        dst = out[n0:n1, :, r0:r1, :]
        if b4 is None:
            dst[...] = block
        else:
            xp.add(block, b4, out=dst)
        del y, block
    return out


def _filter_gradient(xp, a, d, g, chunk_tiles):
    """The dilated filter gradient (K, C, E, E'): a = x (N, C, H, W view), d =
    dy (N, K, P, Q view), summed over the batch and the tiles."""
    N = a.shape[0]
    K = d.shape[1]
    T = g.T
    (s0, s1), tw = g.step, g.tiles[1]
    total = None
    sf = LAYOUT == "spatial_first"
    for n0, n1, i0, i1 in _chunks(N, g.tiles, chunk_tiles):
        X = _spectrum(xp, _input_tiles(xp, a, g, n0, n1, i0, i1, sf))          # (F, B, C)
        rows = i1 - i0
        B = (n1 - n0) * rows * tw
        if rows == 1 and tw == 1:
            tiles = d[n0:n1, :, i0 * s0:i1 * s0, :].transpose(1, 0, 2, 3)      # (K, B, P, Q)
        else:
            strip = _window(xp, d, n0, n1, i0 * s0, rows * s0, 0, tw * s1)
            tiles = strip.reshape(n1 - n0, K, rows, s0, tw, s1).transpose(1, 0, 2, 4, 3, 5)
        placed = _place_reversed(xp, tiles, T, sf)
        D = _spectrum(xp, placed.reshape(T + (K, B) if sf else (K, B) + T))
        del tiles                                                              # D: (F, K, B)
        product = xp.matmul(D, X)                                              # (F, K, C)
        del D, X
        if total is None:
            total = product
        else:
            total += product
        del product
    dw = _inverse(xp, total, T, d.dtype)[:, :, :g.extent[0], :g.extent[1]]
    return dw * (1.0 / (T[0] * T[1]))


# --- the fast path of "fft" (one tile per sample) -------------------------------
# A cached call is 7 launches: filter to complex (kernel), two filter-DFT GEMMs,
# window (kernel), R2C, the per-frequency GEMM, C2R, crop + bias (kernel); the
# twiddles and launch shapes are made once per problem and kept in ``_setups``,
# the cuFFT plans once per problem, stream and thread in ``_plans``.  On NumPy
# the same steps run with NumPy stand-ins for the kernels and cuFFT
# (:func:`_emulate_window` ...), so the layout bookkeeping is tested without a
# GPU.
# On since the H100 run of 2026-11-23 (114 FFT GPU tests pass, both layouts):
# with the "strided" layout it matches the generic path on big_7x7_s1
# (0.549 vs 0.557 ms forward: that layer is GPU-bound) and cuts big_11x11_s1
# backward data from 0.552 to 0.372 ms (notes/conv_fft.md, "fft_fast").
# "spatial_first" measured 20-30 % slower, so LAYOUT stays "strided".
FAST = True
_setups = {}   # key -> _Setup, least recently used first


class _Setup:
    """Everything about one (device, geometry, batch, dtype, layout) that does
    not depend on the data; its cuFFT plans are the current stream's
    (:meth:`plans`)."""

    def __init__(self, xp, g, N, dtype, spatial):
        self.spatial = spatial
        self.dtype = np.dtype(dtype)
        self.cdtype = np.result_type(self.dtype, np.complex64)
        T0, T1 = g.T
        self.half = T1 // 2 + 1
        J, Ko = g.channels_in, g.channels_out
        self.B_in, self.B_out = N * J, N * Ko
        self.Ds, self.Dr = _twiddle_matrices(xp, g.T, g.extent, self.cdtype)
        self.T = g.T
        ct = _dtypes.cuda_type(self.dtype)
        E0, E1 = g.extent
        it = index_type(2 * g.frequencies * max(self.B_in, self.B_out), T0 * T1 * max(self.B_in, self.B_out),
                        2 * E0 * E1 * J * Ko)
        self.exprs = {k: f"{k}<{ct}, {it}>" for k in ("fft_window", "fft_crop", "fft_filter_complex")}
        self.index = np.int64 if it == "long long" else np.int32

    def plans(self, xp):
        """(forward, inverse) cuFFT plans on the current stream (per stream: see _plan)."""
        if self.spatial:
            return (_spatial_plan(False, self.dtype, self.T, self.B_in),
                    _spatial_plan(True, self.dtype, self.T, self.B_out))
        return _plan(xp, False, self.dtype, self.T, self.B_in), _plan(xp, True, self.dtype, self.T, self.B_out)


def _spatial_plan(inverse, real_dtype, T, batch):
    """cuFFT plans for the "spatial_first" layout: real (T0, T1, batch) and
    complex (T0, T1/2+1, batch), batch innermost (stride batch, distance 1)."""
    from cupy.cuda import cufft
    import cupy
    key = (cupy.cuda.runtime.getDevice(), *_plan_user(), "spatial", inverse, real_dtype == np.float64, T,
           batch)
    plan = _plans.pop(key, None)
    if plan is None:
        half = T[1] // 2 + 1
        if inverse:
            kind = cufft.CUFFT_Z2D if real_dtype == np.float64 else cufft.CUFFT_C2R
            plan = cufft.PlanNd(list(T), [T[0], half], batch, 1, list(T), batch, 1,
                                kind, batch, "C", -1, T[1])
        else:
            kind = cufft.CUFFT_D2Z if real_dtype == np.float64 else cufft.CUFFT_R2C
            plan = cufft.PlanNd(list(T), list(T), batch, 1, [T[0], half], batch, 1,
                                kind, batch, "C", -1, half)
        while len(_plans) >= PLAN_CACHE_SIZE:
            _plans.pop(next(iter(_plans)))
    _plans[key] = plan
    return plan


def _setup(xp, g, N, dtype):
    spatial = LAYOUT == "spatial_first"
    key = (None if xp is np else xp.cuda.runtime.getDevice(), g.T, g.extent, g.channels_in,
           g.channels_out, N, np.dtype(dtype).name, spatial)
    st = _setups.pop(key, None)
    if st is None:
        st = _Setup(xp, g, N, dtype, spatial)
        while len(_setups) >= PLAN_CACHE_SIZE:
            _setups.pop(next(iter(_setups)))
    _setups[key] = st
    return st


def _elements(a):
    return [s // a.itemsize for s in a.strides]


def _emulate_filter_complex(f, out, dilation, flip, channels_swapped):
    """NumPy stand-in for fft_filter_complex."""
    E0, E1 = out.shape[:2]
    w = f.transpose(1, 0, 2, 3) if channels_swapped else f                   # (Ko, J, R, S)
    full = np.zeros(w.shape[:2] + (E0, E1), dtype=f.dtype)
    full[:, :, ::dilation[0], ::dilation[1]] = w
    if flip:
        full = full[:, :, ::-1, ::-1]
    out[...] = full.transpose(2, 3, 1, 0)


def _emulate_window(a, buf, row0, col0, spatial):
    N, J, H, W = a.shape
    T0, T1 = buf.shape[:2] if spatial else buf.shape[2:]
    win = _window(np, a, 0, N, row0, T0, col0, T1)                          # (N, J, T0, T1)
    buf[...] = win.transpose(2, 3, 0, 1) if spatial else win


def _fast_correlate(xp, a, f, out, g, bias, dilation, flip):
    """out (N, Ko, P, Q view) = cross-correlation of a (N, J, H, W view), padded
    by g.pad, with the (dilated) filter f (Ko, J, R, S), or for backward data
    (``flip``) with f (J, Ko, R, S) rotated by 180 degrees and channels
    swapped; plus bias."""
    N, J, H, W = a.shape
    Ko = g.channels_out
    P, Q = out.shape[2:]
    T0, T1 = g.T
    E0, E1 = g.extent
    F = g.frequencies
    st = _setup(xp, g, N, out.dtype)
    gpu = xp is not np
    # 1. the filter spectrum (F, J, Ko), 1 / (T T') folded in.
    wc = xp.empty((E0, E1, J, Ko), dtype=st.cdtype)
    if gpu:
        fs = _elements(f)
        sk, sj = (fs[1], fs[0]) if flip else (fs[0], fs[1])
        total = wc.size
        FAMILY.launch(st.exprs["fft_filter_complex"], (ceil_div(total, _THREADS),), (_THREADS,),
                      (f, wc, st.index(total), np.int32(E0), np.int32(E1), np.int32(J), np.int32(Ko),
                       np.int32(dilation[0]), np.int32(dilation[1]), np.int32(flip),
                       np.int64(sk), np.int64(sj), np.int64(fs[2]), np.int64(fs[3])))
    else:
        _emulate_filter_complex(f, wc, dilation, flip, flip)
    G = _filter_dft(xp, wc, st.Ds, st.Dr)
    del wc
    # 2. the input window, zero-padded, in the FFT layout.
    buf = xp.empty((T0, T1, N, J) if st.spatial else (N, J, T0, T1), dtype=out.dtype)
    row0, col0 = -g.pad[0], -g.pad[1]
    if gpu:
        sa = _elements(a)
        total = buf.size
        FAMILY.launch(st.exprs["fft_window"], (ceil_div(total, _THREADS),), (_THREADS,),
                      (a, buf, st.index(total), np.int32(N), np.int32(J), np.int32(H), np.int32(W),
                       np.int32(T0), np.int32(T1), np.int32(row0), np.int32(col0),
                       np.int64(sa[0]), np.int64(sa[1]), np.int64(sa[2]), np.int64(sa[3]),
                       np.int32(st.spatial)))
    else:
        _emulate_window(a, buf, row0, col0, st.spatial)
    # 3. spectra, product, inverse.
    X = xp.empty((F, N, J), dtype=st.cdtype)
    if gpu:   # the plans per call: they are kept per stream and thread (_plan_user), a setup is not
        from cupy.cuda import cufft
        plans = st.plans(xp)
        plans[0].fft(buf, X, cufft.CUFFT_FORWARD)
    elif st.spatial:
        X[...] = np.fft.rfft2(buf, axes=(0, 1)).reshape(F, N, J)
    else:
        X[...] = np.fft.rfft2(buf).reshape(N * J, F).T.reshape(F, N, J)
    del buf
    Y = _cublas.gemm(xp, X, G, xp.empty((F, N, Ko), dtype=st.cdtype))
    del X, G
    y = xp.empty((T0, T1, N * Ko) if st.spatial else (N * Ko, T0, T1), dtype=out.dtype)
    if gpu:
        plans[1].fft(Y, y, cufft.CUFFT_INVERSE)
    elif st.spatial:
        y[...] = np.fft.irfft2(Y.reshape(T0, st.half, N * Ko), s=g.T, axes=(0, 1), norm="forward")
    else:
        y[...] = np.fft.irfft2(Y.reshape(F, N * Ko).T.reshape(N * Ko, T0, st.half), s=g.T,
                               norm="forward")
    del Y
    # 4. crop (+ bias) into out.
    if gpu:
        so = _elements(out)
        total = out.size
        has_bias = bias is not None
        FAMILY.launch(st.exprs["fft_crop"], (ceil_div(total, _THREADS),), (_THREADS,),
                      (y, bias if has_bias else y, out, st.index(total), np.int32(N), np.int32(Ko),
                       np.int32(P), np.int32(Q), np.int32(T0), np.int32(T1),
                       np.int64(so[0]), np.int64(so[1]), np.int64(so[2]), np.int64(so[3]),
                       np.int64(_elements(bias)[0] if has_bias else 0), np.int32(has_bias),
                       np.int32(st.spatial)))
    else:
        block = (y.transpose(2, 0, 1) if st.spatial else y).reshape(N, Ko, T0, T1)[:, :, :P, :Q]
        out[...] = block if bias is None else block + bias.reshape(1, Ko, 1, 1)
    return out


class FFTConvolution(ConvAlgorithm):
    """One tile per sample ("fft") or bounded tiles ("fft_tiled")."""

    def __init__(self, name, tiled):
        self.name = name
        self.tiled = tiled
        self._geometries = {}   # (problem, direction, TILE_SIZES) -> Geometry (host time per call)

    def supports(self, problem, direction):
        ok, reason = super().supports(problem, direction)
        if not ok:
            return ok, reason
        return spectral_support(problem, "complex64/complex128 (cuFFT)")

    def geometry(self, problem, direction):
        key = (problem, direction, TILE_SIZES)
        g = self._geometries.get(key)
        if g is None:
            if len(self._geometries) >= 4 * PLAN_CACHE_SIZE:
                self._geometries.clear()
            g = self._geometries[key] = Geometry(problem, direction, self.tiled)
        return g

    def workspace_bytes(self, problem, direction):
        g = self.geometry(problem, direction)
        fixed, per_tile = _buffer_bytes(problem, direction, g)
        chunk = _largest_chunk(problem.N, g.tiles, _chunk_tiles(problem, direction, g, self.tiled))
        # cuFFT's work area: about one spectrum of the chunk (an estimate).
        cufft_work = chunk * max(g.channels_in, g.channels_out) * g.frequencies * 2 * np.dtype(problem.dtype).itemsize
        return fixed + chunk * per_tile + cufft_work

    def run(self, problem, direction, a, b, out, bias=None, activation=None):
        import cupy
        return self._run(cupy, problem, direction, a, b, out, bias)

    def _run(self, xp, p, direction, a, b, out, bias=None):
        g = self.geometry(p, direction)
        if FAST and not self.tiled and direction != "backward_filter" and LAYOUT != "plain":
            _fast_correlate(xp, _nchw(a, p.layout), b, _nchw(out, p.layout), g,
                            bias if direction == "forward" else None, p.dilation,
                            direction == "backward_data")
            return out
        chunk_tiles = _chunk_tiles(p, direction, g, self.tiled)
        if direction == "forward":
            w = _dilated(xp, b, p.dilation, g.extent)
            _correlate(xp, _nchw(a, p.layout), w, _nchw(out, p.layout), g, chunk_tiles, bias)
        elif direction == "backward_data":
            w = _dilated(xp, b, p.dilation, g.extent)[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)
            _correlate(xp, _nchw(a, p.layout), w, _nchw(out, p.layout), g, chunk_tiles, None)
        else:
            dw = _filter_gradient(xp, _nchw(a, p.layout), _nchw(b, p.layout), g, chunk_tiles)
            out[...] = dw[:, :, ::p.dilation[0], ::p.dilation[1]]
        return out


FFT = register(FFTConvolution("fft", tiled=False))
FFT_TILED = register(FFTConvolution("fft_tiled", tiled=True))
