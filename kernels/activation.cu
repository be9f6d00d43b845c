// Pointwise activations, forward and backward.
//
// Elementwise kernels move 16-byte packs (pack_width<T> values, packs.cuh):
// thread t of a block handles packs t, t + blockDim, ... UNROLL of them per
// grid-stride step, all loads issued before any math, so each thread keeps
// UNROLL (backward: 2 x UNROLL) 16-byte loads in flight.  Python passes the
// number of packs (0 when a pointer is not 16-byte aligned); the elements
// past the last pack take a scalar grid-stride loop.  The mode is a template
// parameter, so each specialisation is a branch-free elementwise kernel.
// Backward takes the forward *input* x.
//
// bias_activation (y = act(x + bias[c])) views x as (outer, C, inner): NCHW
// has inner = H*W, NHWC inner = 1.  A pack never straddles two channels in
// NCHW (Python packs only when inner % VEC == 0) and holds VEC consecutive
// channels in NHWC (only when C % VEC == 0).  Its backward writes dx and a
// per-block partial sum of dx per channel into a workspace, reduced over the
// blocks in a fixed order by bias_grad_reduce (deterministic, no atomics):
//   *_planes  (NCHW) one block per chunk of one (n, c) plane;
//   *_rows    (NHWC) blockDim (32, 8): 32 consecutive channels by 8 rows.
//
// Math is in acc_t<T> (float for the half types).  Derivatives at the kinks
// follow PyTorch: relu/clipped_relu pass nothing at x == 0 (clipped_relu also
// nothing at x == alpha, like hardtanh), leaky_relu alpha, elu alpha.  NaN
// inputs propagate through relu/leaky_relu/clipped_relu (comparisons are
// written so that NaN takes the identity branch); backward, a NaN x passes dy
// through relu (PyTorch's threshold_backward), alpha * dy through leaky_relu.
#include "common.cuh"
#include "packs.cuh"

enum ActivationMode {
    RELU = 0,
    SIGMOID = 1,
    TANH = 2,
    ELU = 3,
    GELU = 4,        // x * Phi(x), with erf
    GELU_TANH = 5,   // the tanh approximation of GELU
    SILU = 6,
    LEAKY_RELU = 7,  // alpha = negative slope
    CLIPPED_RELU = 8 // alpha = ceiling
};

__device__ __forceinline__ float exp_acc(float v) { return expf(v); }
__device__ __forceinline__ double exp_acc(double v) { return exp(v); }
__device__ __forceinline__ float expm1_acc(float v) { return expm1f(v); }
__device__ __forceinline__ double expm1_acc(double v) { return expm1(v); }
__device__ __forceinline__ float tanh_acc(float v) { return tanhf(v); }
__device__ __forceinline__ double tanh_acc(double v) { return tanh(v); }
__device__ __forceinline__ float erf_acc(float v) { return erff(v); }
__device__ __forceinline__ double erf_acc(double v) { return erf(v); }

// exp(-|v|) never overflows, so neither branch does.
template <typename A> __device__ __forceinline__ A sigmoid_acc(A v) {
    const A e = exp_acc(-fabs(v));
    return v >= A(0) ? A(1) / (A(1) + e) : e / (A(1) + e);
}

template <typename A> __device__ __forceinline__ A gelu_tanh_inner(A v) {
    return tanh_acc(A(0.7978845608028654) * (v + A(0.044715) * v * v * v));  // sqrt(2/pi)
}

template <int MODE, typename A> __device__ __forceinline__ A activate(A v, A alpha) {
    if constexpr (MODE == RELU) return v < A(0) ? A(0) : v;
    if constexpr (MODE == SIGMOID) return sigmoid_acc(v);
    if constexpr (MODE == TANH) return tanh_acc(v);
    if constexpr (MODE == ELU) return v > A(0) ? v : alpha * expm1_acc(v);
    if constexpr (MODE == GELU) return A(0.5) * v * (A(1) + erf_acc(v * A(0.7071067811865476)));  // sqrt(1/2)
    if constexpr (MODE == GELU_TANH) return A(0.5) * v * (A(1) + gelu_tanh_inner(v));
    if constexpr (MODE == SILU) return v * sigmoid_acc(v);
    if constexpr (MODE == LEAKY_RELU) return v < A(0) ? alpha * v : v;
    // CLIPPED_RELU
    return v < A(0) ? A(0) : (v > alpha ? alpha : v);
}

template <int MODE, typename A> __device__ __forceinline__ A derivative(A v, A alpha) {
    // "x <= 0", as PyTorch's threshold_backward tests: a NaN x passes dy.
    if constexpr (MODE == RELU) return v <= A(0) ? A(0) : A(1);
    // s (1 - s) and 1 - t^2 cancel badly where s or |t| is near 1; these exp(-|x|)
    // forms are accurate everywhere and never overflow.
    if constexpr (MODE == SIGMOID) {
        const A e = exp_acc(-fabs(v));
        return e / ((A(1) + e) * (A(1) + e));
    }
    if constexpr (MODE == TANH) {
        const A e = exp_acc(A(-2) * fabs(v));
        return A(4) * e / ((A(1) + e) * (A(1) + e));
    }
    if constexpr (MODE == ELU) return v > A(0) ? A(1) : alpha * exp_acc(v);
    if constexpr (MODE == GELU) {
        const A cdf = A(0.5) * (A(1) + erf_acc(v * A(0.7071067811865476)));
        return cdf + v * A(0.3989422804014327) * exp_acc(A(-0.5) * v * v);  // 1/sqrt(2 pi)
    }
    if constexpr (MODE == GELU_TANH) {
        const A t = gelu_tanh_inner(v);
        return A(0.5) * (A(1) + t) +
               A(0.5) * v * (A(1) - t * t) * A(0.7978845608028654) * (A(1) + A(3 * 0.044715) * v * v);
    }
    if constexpr (MODE == SILU) {
        const A s = sigmoid_acc(v);
        return s * (A(1) + v * (A(1) - s));
    }
    if constexpr (MODE == LEAKY_RELU) return v > A(0) ? A(1) : alpha;
    // CLIPPED_RELU
    return (v > A(0) && v < alpha) ? A(1) : A(0);
}

#define UNROLL 4

template <typename T, typename index_t, int MODE>
__global__ void activation_forward(const T* __restrict__ x, T* __restrict__ y, index_t n, index_t packs,
                                   acc_t<T> alpha) {
    constexpr int VEC = pack_width<T>::value;
    const index_t step = (index_t)blockDim.x;
    const index_t stride = (index_t)gridDim.x * step * UNROLL;
    for (index_t base = (index_t)blockIdx.x * step * UNROLL + (index_t)threadIdx.x; base < packs; base += stride) {
        Pack<T, VEC> in[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
            if (base + u * step < packs) in[u] = load_pack<T, VEC>(x + (base + u * step) * VEC);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (base + u * step < packs) {
                Pack<T, VEC> out;
#pragma unroll
                for (int e = 0; e < VEC; ++e) out.v[e] = store<T>(activate<MODE>(load(in[u].v[e]), alpha));
                store_pack<T, VEC>(y + (base + u * step) * VEC, out);
            }
        }
    }
    const index_t flat_stride = (index_t)gridDim.x * step;
    for (index_t i = packs * VEC + (index_t)blockIdx.x * step + (index_t)threadIdx.x; i < n; i += flat_stride)
        y[i] = store<T>(activate<MODE>(load(x[i]), alpha));
}

template <typename T, typename index_t, int MODE>
__global__ void activation_backward(const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dx,
                                    index_t n, index_t packs, acc_t<T> alpha) {
    constexpr int VEC = pack_width<T>::value;
    const index_t step = (index_t)blockDim.x;
    const index_t stride = (index_t)gridDim.x * step * UNROLL;
    for (index_t base = (index_t)blockIdx.x * step * UNROLL + (index_t)threadIdx.x; base < packs; base += stride) {
        Pack<T, VEC> g[UNROLL], in[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (base + u * step < packs) {
                g[u] = load_pack<T, VEC>(dy + (base + u * step) * VEC);
                in[u] = load_pack<T, VEC>(x + (base + u * step) * VEC);
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (base + u * step < packs) {
                Pack<T, VEC> out;
#pragma unroll
                for (int e = 0; e < VEC; ++e)
                    out.v[e] = store<T>(load(g[u].v[e]) * derivative<MODE>(load(in[u].v[e]), alpha));
                store_pack<T, VEC>(dx + (base + u * step) * VEC, out);
            }
        }
    }
    const index_t flat_stride = (index_t)gridDim.x * step;
    for (index_t i = packs * VEC + (index_t)blockIdx.x * step + (index_t)threadIdx.x; i < n; i += flat_stride)
        dx[i] = store<T>(load(dy[i]) * derivative<MODE>(load(x[i]), alpha));
}

// ---- bias + activation ---------------------------------------------------------

template <typename T, typename index_t, int MODE>
__global__ void bias_activation_forward(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ y,
                                        index_t n, index_t packs, index_t inner, index_t channels,
                                        acc_t<T> alpha) {
    constexpr int VEC = pack_width<T>::value;
    const index_t step = (index_t)blockDim.x;
    const index_t stride = (index_t)gridDim.x * step * UNROLL;
    const int lane_step = inner == 1 ? 1 : 0;  // NHWC packs hold consecutive channels
    for (index_t base = (index_t)blockIdx.x * step * UNROLL + (index_t)threadIdx.x; base < packs; base += stride) {
        Pack<T, VEC> in[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
            if (base + u * step < packs) in[u] = load_pack<T, VEC>(x + (base + u * step) * VEC);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const index_t at = (base + u * step) * VEC;
            if (base + u * step < packs) {
                const index_t c0 = (at / inner) % channels;
                Pack<T, VEC> out;
#pragma unroll
                for (int e = 0; e < VEC; ++e)
                    out.v[e] = store<T>(activate<MODE>(load(in[u].v[e]) + load(bias[c0 + e * lane_step]), alpha));
                store_pack<T, VEC>(y + at, out);
            }
        }
    }
    const index_t flat_stride = (index_t)gridDim.x * step;
    for (index_t i = packs * VEC + (index_t)blockIdx.x * step + (index_t)threadIdx.x; i < n; i += flat_stride)
        y[i] = store<T>(activate<MODE>(load(x[i]) + load(bias[(i / inner) % channels]), alpha));
}

// NCHW backward: block b owns chunk j of plane p = (n, c), elements
// [p * inner + j * chunk, min(.. + chunk, (p + 1) * inner)); partial[(n * chunks
// + j) * channels + c] gets the block's sum of dx.  `vector` is 1 when inner
// and chunk are multiples of VEC and the pointers are aligned.
template <typename T, typename index_t, int MODE>
__global__ void bias_activation_backward_planes(const T* __restrict__ dy, const T* __restrict__ x,
                                                const T* __restrict__ bias, T* __restrict__ dx,
                                                acc_t<T>* __restrict__ partial, index_t planes, index_t channels,
                                                index_t inner, index_t chunks, index_t chunk, int vector,
                                                acc_t<T> alpha) {
    typedef acc_t<T> A;
    constexpr int VEC = pack_width<T>::value;
    __shared__ A scratch[32];
    const index_t blocks = planes * chunks;
    for (index_t b = blockIdx.x; b < blocks; b += (index_t)gridDim.x) {
        const index_t p = b / chunks, j = b - p * chunks;
        const index_t c = p % channels;
        const A bc = load(bias[c]);
        const index_t start = p * inner + j * chunk;
        const index_t len = min(chunk, inner - j * chunk);
        A acc = A(0);
        if (vector) {
            const index_t plen = len / VEC;
            for (index_t q = threadIdx.x; q < plen; q += (index_t)blockDim.x * 2) {
                const index_t q2 = q + (index_t)blockDim.x;
                Pack<T, VEC> g0 = load_pack<T, VEC>(dy + start + q * VEC), x0 = load_pack<T, VEC>(x + start + q * VEC);
                Pack<T, VEC> g1, x1;
                if (q2 < plen) {
                    g1 = load_pack<T, VEC>(dy + start + q2 * VEC);
                    x1 = load_pack<T, VEC>(x + start + q2 * VEC);
                }
                Pack<T, VEC> out;
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    const A d = load(g0.v[e]) * derivative<MODE>(load(x0.v[e]) + bc, alpha);
                    out.v[e] = store<T>(d);
                    acc += d;
                }
                store_pack<T, VEC>(dx + start + q * VEC, out);
                if (q2 < plen) {
#pragma unroll
                    for (int e = 0; e < VEC; ++e) {
                        const A d = load(g1.v[e]) * derivative<MODE>(load(x1.v[e]) + bc, alpha);
                        out.v[e] = store<T>(d);
                        acc += d;
                    }
                    store_pack<T, VEC>(dx + start + q2 * VEC, out);
                }
            }
        } else {
            for (index_t q = threadIdx.x; q < len; q += (index_t)blockDim.x) {
                const A d = load(dy[start + q]) * derivative<MODE>(load(x[start + q]) + bc, alpha);
                dx[start + q] = store<T>(d);
                acc += d;
            }
        }
        acc = block_sum(acc, scratch);
        if (threadIdx.x == 0) partial[((p / channels) * chunks + j) * channels + c] = acc;
    }
}

// NHWC backward: blockDim (32, 8); block (bx, by) owns channels [32 bx, 32 bx + 32)
// of rows [by * rows_per_chunk, ..); partial[by * channels + c] gets its column sums.
template <typename T, typename index_t, int MODE>
__global__ void bias_activation_backward_rows(const T* __restrict__ dy, const T* __restrict__ x,
                                              const T* __restrict__ bias, T* __restrict__ dx,
                                              acc_t<T>* __restrict__ partial, index_t rows, index_t channels,
                                              index_t rows_per_chunk, acc_t<T> alpha) {
    typedef acc_t<T> A;
    __shared__ A scratch[8][33];
    const index_t c = (index_t)blockIdx.x * 32 + threadIdx.x;
    const index_t first = (index_t)blockIdx.y * rows_per_chunk;
    const index_t last = min(first + rows_per_chunk, rows);
    A acc = A(0);
    if (c < channels) {
        const A bc = load(bias[c]);
#pragma unroll 4
        for (index_t r = first + threadIdx.y; r < last; r += blockDim.y) {
            const index_t at = r * channels + c;
            const A d = load(dy[at]) * derivative<MODE>(load(x[at]) + bc, alpha);
            dx[at] = store<T>(d);
            acc += d;
        }
    }
    scratch[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < channels) {
        for (int k = 1; k < 8; ++k) acc += scratch[k][threadIdx.x];
        partial[(index_t)blockIdx.y * channels + c] = acc;
    }
}

// dbias[c] = sum over groups g of partial[g * channels + c], in order g = 0, 1, ...
template <typename T, typename index_t>
__global__ void bias_grad_reduce(const acc_t<T>* __restrict__ partial, T* __restrict__ dbias, index_t groups,
                                 index_t channels) {
    typedef acc_t<T> A;
    for (index_t c = (index_t)blockIdx.x * blockDim.x + threadIdx.x; c < channels;
         c += (index_t)gridDim.x * blockDim.x) {
        A s = A(0);
        for (index_t g = 0; g < groups; ++g) s += partial[g * channels + c];
        dbias[c] = store<T>(s);
    }
}
