// The data movement of the FFT convolution (dnnprims/algos/fft.py, "fft", one
// tile per sample): everything around cuFFT and cuBLAS, one launch each, so
// that a call is a handful of launches instead of ~15 CuPy operations.
//
// Buffer layouts (SPATIAL = 0 / 1, a runtime argument: a uniform branch):
//   0 "strided": real buffers (B, T0, T1), B = samples x channels, one
//     contiguous T0 x T1 image per transform;
//   1 "spatial_first": real buffers (T0, T1, B), the batch innermost.
//
// fft_window: buf[b = (n, j), t0, t1] = a[n, j, t0 + row0, t1 + col0], zero
// outside a (the padding; row0 / col0 = -pad may be positive for backward
// data's negative padding).  a is any strided (N, J, H, W) view (NCHW or the
// NCHW view of NHWC).  One thread per buffer element, consecutive threads on
// consecutive buffer elements (coalesced writes; reads coalesced along W in
// layout 0).
//
// fft_crop: out[n, k, p, q] = y[b = (n, k), p, q] + bias[k] for p < P, q < Q
// (the kept outputs of the cyclic correlation); out any strided (N, K, P, Q)
// view.  One thread per output element, q fastest.
//
// fft_filter_complex: the filter as complex (E0, E1, J, Ko) values, ready for
// the two DFT GEMMs of the filter spectrum: out[r, s, j, k] = f[k, j, r', s']
// with r' = (flip ? E0 - 1 - r : r) / d0 when that divides (dilation inserts
// zeros), else 0; f any strided view given by its strides along (k, j, r, s)
// (backward data passes the filter's two channel strides swapped and flip = 1:
// the rotated, channel-swapped filter).  Complex values are written as
// (re, im) pairs of T, cuBLAS's cuComplex / cuDoubleComplex layout.
#include "common.cuh"

template <typename T, typename index_t>
__global__ void fft_window(const T* __restrict__ a, T* __restrict__ buf, index_t total, int N, int J,
                           int H, int W, int T0, int T1, int row0, int col0, long long sn, long long sj,
                           long long sh, long long sw, int spatial) {
    const index_t e = (index_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= total) return;
    int n, j, t0, t1;
    if (spatial) {  // (T0, T1, N, J)
        index_t r = e;
        j = (int)(r % J); r /= J;
        n = (int)(r % N); r /= N;
        t1 = (int)(r % T1);
        t0 = (int)(r / T1);
    } else {        // (N, J, T0, T1)
        index_t r = e;
        t1 = (int)(r % T1); r /= T1;
        t0 = (int)(r % T0); r /= T0;
        j = (int)(r % J);
        n = (int)(r / J);
    }
    const int h = t0 + row0, w = t1 + col0;
    T v = T(0);
    if (h >= 0 && h < H && w >= 0 && w < W) v = a[n * sn + j * sj + h * sh + w * sw];
    buf[e] = v;
}

template <typename T, typename index_t>
__global__ void fft_crop(const T* __restrict__ y, const T* __restrict__ bias, T* __restrict__ out,
                         index_t total, int N, int K, int P, int Q, int T0, int T1, long long sn,
                         long long sk, long long sp, long long sq, long long sb, int has_bias,
                         int spatial) {
    const index_t e = (index_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= total) return;
    index_t r = e;
    const int q = (int)(r % Q); r /= Q;
    const int p = (int)(r % P); r /= P;
    const int k = (int)(r % K);
    const int n = (int)(r / K);
    const index_t b = (index_t)n * K + k;
    const index_t src = spatial ? ((index_t)p * T1 + q) * ((index_t)N * K) + b
                                : (b * T0 + p) * T1 + q;
    T v = y[src];
    if (has_bias) v += bias[k * sb];
    out[n * sn + k * sk + p * sp + q * sq] = v;
}

template <typename T, typename index_t>
__global__ void fft_filter_complex(const T* __restrict__ f, T* __restrict__ out, index_t total, int E0,
                                   int E1, int J, int Ko, int d0, int d1, int flip, long long sk,
                                   long long sj, long long sr, long long ss) {
    const index_t e = (index_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= total) return;
    index_t r_ = e;
    const int k = (int)(r_ % Ko); r_ /= Ko;
    const int j = (int)(r_ % J); r_ /= J;
    const int s = (int)(r_ % E1);
    const int r = (int)(r_ / E1);
    const int rr = flip ? E0 - 1 - r : r;
    const int ssi = flip ? E1 - 1 - s : s;
    T v = T(0);
    if (rr % d0 == 0 && ssi % d1 == 0) v = f[k * sk + j * sj + (rr / d0) * sr + (ssi / d1) * ss];
    out[2 * e] = v;
    out[2 * e + 1] = T(0);
}
