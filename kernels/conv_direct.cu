// Direct 2-D convolution, all three directions, plus the bias gradient.
//
// Semantics are PyTorch's conv2d (cross-correlation):
//   y[n, k, p, q] = sum_{c, r, s} x[n, g*Cg + c, p*sh - ph + r*dh, q*sw - pw + s*dw] * w[k, c, r, s]
// with g = k / Kg, Cg = C / groups, Kg = K / groups, out-of-range x reading as 0.
// Filters are always KCRS; x, y, dx, dy are NCHW or NHWC (template flag NHWC).
//
// Thread mapping -- chosen for correctness and determinism first (no atomics
// anywhere, so every run gives the same bits); the fast algorithms live in
// other families:
//   forward          one thread per output element y[n, k, p, q], looping over
//                    the R*S taps (bounds checked once per tap) and, innermost,
//                    the Cg input channels (contiguous in NHWC).
//   backward_data    one thread per input element dx[n, c, h, w], gathering the
//                    taps whose output position is integral: for tap r the
//                    output row is (h + ph - r*dh) / sh, used only when that
//                    division is exact and in [0, P).  Innermost loop: the Kg
//                    output channels of c's group.
//   backward_filter  one block per filter element dw[k, c, r, s]; its threads
//                    stride over the N*P*Q output positions and block_sum
//                    (common.cuh) reduces their partial sums in a fixed order.
//   backward_bias    one block per output channel k, reducing over N*P*Q.
// Elementwise kernels use grid-stride loops (the grid is capped in Python) and
// the reduction kernels loop over blocks, so any size runs with any grid.
// Sizes of single dimensions are int; flattened indices are index_t.
#include "common.cuh"
#include "conv_indexing.cuh"

template <typename T, typename index_t, bool NHWC>
__global__ void conv_direct_forward(const T* __restrict__ x, const T* __restrict__ w,
                                    const T* __restrict__ bias, int has_bias, T* __restrict__ y,
                                    int C, int H, int W, int K, int R, int S, int P, int Q,
                                    int stride_h, int stride_w, int pad_h, int pad_w,
                                    int dil_h, int dil_w, int groups, index_t total) {
    typedef acc_t<T> A;
    const int Cg = C / groups, Kg = K / groups;
    for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (index_t)blockDim.x * gridDim.x) {
        index_t n;
        int k, p, q;
        split4<NHWC>(i, K, P, Q, n, k, p, q);
        const int c0 = (k / Kg) * Cg;
        A acc = has_bias ? load(bias[k]) : A(0);
        for (int r = 0; r < R; ++r) {
            const int h = p * stride_h - pad_h + r * dil_h;
            if (h < 0 || h >= H) continue;
            for (int s = 0; s < S; ++s) {
                const int wi = q * stride_w - pad_w + s * dil_w;
                if (wi < 0 || wi >= W) continue;
                const T* wp = w + ((index_t)k * Cg * R + r) * S + s;  // w[k, 0, r, s]
                for (int c = 0; c < Cg; ++c) {
                    acc += load(x[offset4<NHWC, index_t>(n, c0 + c, h, wi, C, H, W)]) *
                           load(wp[(index_t)c * R * S]);
                }
            }
        }
        y[i] = store<T>(acc);
    }
}

template <typename T, typename index_t, bool NHWC>
__global__ void conv_direct_backward_data(const T* __restrict__ dy, const T* __restrict__ w,
                                          T* __restrict__ dx,
                                          int C, int H, int W, int K, int R, int S, int P, int Q,
                                          int stride_h, int stride_w, int pad_h, int pad_w,
                                          int dil_h, int dil_w, int groups, index_t total) {
    typedef acc_t<T> A;
    const int Cg = C / groups, Kg = K / groups;
    for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (index_t)blockDim.x * gridDim.x) {
        index_t n;
        int c, h, wi;
        split4<NHWC>(i, C, H, W, n, c, h, wi);
        const int g = c / Cg, cl = c - g * Cg, k0 = g * Kg;
        A acc = A(0);
        for_each_tap_reaching(h, wi, R, S, P, Q, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
                              [&](int r, int s, int p, int q) {
            const T* wp = w + (((index_t)k0 * Cg + cl) * R + r) * S + s;  // w[k0, cl, r, s]
            for (int k = 0; k < Kg; ++k) {
                acc += load(dy[offset4<NHWC, index_t>(n, k0 + k, p, q, K, P, Q)]) *
                       load(wp[(index_t)k * Cg * R * S]);
            }
        });
        dx[i] = store<T>(acc);
    }
}

template <typename T, typename index_t, bool NHWC>
__global__ void conv_direct_backward_filter(const T* __restrict__ x, const T* __restrict__ dy,
                                            T* __restrict__ dw, int N,
                                            int C, int H, int W, int K, int R, int S, int P, int Q,
                                            int stride_h, int stride_w, int pad_h, int pad_w,
                                            int dil_h, int dil_w, int groups, index_t filter_total) {
    typedef acc_t<T> A;
    __shared__ A scratch[32];
    const int Cg = C / groups, Kg = K / groups;
    const index_t positions = (index_t)N * P * Q;
    for (index_t f = blockIdx.x; f < filter_total; f += gridDim.x) {
        // f indexes dw[k, c, r, s] (KCRS, row-major).
        const int s = (int)(f % S);
        const int r = (int)((f / S) % R);
        const int c = (int)((f / ((index_t)S * R)) % Cg);
        const int k = (int)(f / ((index_t)S * R * Cg));
        const int cx = (k / Kg) * Cg + c;
        A acc = A(0);
        for (index_t j = threadIdx.x; j < positions; j += blockDim.x) {
            const int q = (int)(j % Q);
            const int p = (int)((j / Q) % P);
            const index_t n = j / ((index_t)Q * P);
            const int h = p * stride_h - pad_h + r * dil_h;
            const int wi = q * stride_w - pad_w + s * dil_w;
            if (h < 0 || h >= H || wi < 0 || wi >= W) continue;
            acc += load(x[offset4<NHWC, index_t>(n, cx, h, wi, C, H, W)]) *
                   load(dy[offset4<NHWC, index_t>(n, k, p, q, K, P, Q)]);
        }
        acc = block_sum(acc, scratch);
        if (threadIdx.x == 0) dw[f] = store<T>(acc);
    }
}

template <typename T, typename index_t, bool NHWC>
__global__ void conv_direct_backward_bias(const T* __restrict__ dy, T* __restrict__ db,
                                          int N, int K, int P, int Q) {
    typedef acc_t<T> A;
    __shared__ A scratch[32];
    const index_t positions = (index_t)N * P * Q;
    for (int k = blockIdx.x; k < K; k += gridDim.x) {
        A acc = A(0);
        for (index_t j = threadIdx.x; j < positions; j += blockDim.x) {
            const int q = (int)(j % Q);
            const int p = (int)((j / Q) % P);
            const index_t n = j / ((index_t)Q * P);
            acc += load(dy[offset4<NHWC, index_t>(n, k, p, q, K, P, Q)]);
        }
        acc = block_sum(acc, scratch);
        if (threadIdx.x == 0) db[k] = store<T>(acc);
    }
}
