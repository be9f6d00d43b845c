// Batch normalization: statistics, normalize + affine, backward.
//
// x is viewed as (outer, C, inner): NCHW is (N, C, H*W), NHWC is (N*H*W, C, 1),
// a 2-D (N, C) input is (N, C, 1).  Element j of channel c's n = outer*inner
// values lives at (j / inner * C + c) * inner + j % inner.
//
// T is the storage type of x, y, dy, dx; P that of gamma, beta, the running
// statistics, dgamma and dbeta (T, or float when T is a half type -- the cuDNN
// rule); A = acc_t<T> holds every intermediate, the saved mean and invstd.
//
// Reductions: one block per channel.  Each thread sums a fixed strided subset
// of the channel's elements, then block_sum combines them in a fixed tree, so
// results are bitwise reproducible.  Statistics are two-pass (mean first, then
// the sum of squared deviations) -- exact enough for any data, unlike
// E[x^2] - E[x]^2.  NHWC reads are strided by C within a block; the coalesced
// and single-read variants come with issue 5.
//
// Elementwise kernels: one thread per element, grid-stride loop.
#include "common.cuh"

#define GRID_STRIDE_LOOP(i, total)                                              \
    for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < (total); \
         i += (index_t)blockDim.x * gridDim.x)

template <typename index_t>
__device__ __forceinline__ index_t channel_offset(index_t j, index_t c, index_t C, index_t inner) {
    const index_t o = j / inner;
    return (o * C + c) * inner + (j - o * inner);
}

// Per-channel mean and 1/sqrt(var + eps) with the biased variance; when
// update_running is set, also running = (1 - momentum) * running + momentum * batch,
// the variance made unbiased by the factor `unbias` = n / (n - 1).
template <typename T, typename P, typename index_t>
__global__ void batchnorm_statistics(const T* __restrict__ x, acc_t<T>* __restrict__ mean_out,
                                     acc_t<T>* __restrict__ invstd_out, P* __restrict__ running_mean,
                                     P* __restrict__ running_var, index_t outer, index_t C,
                                     index_t inner, acc_t<T> eps, acc_t<T> momentum,
                                     acc_t<T> unbias, int update_running) {
    typedef acc_t<T> A;
    __shared__ A scratch[32];
    const index_t c = blockIdx.x;
    const index_t n = outer * inner;
    A sum = 0;
    for (index_t j = threadIdx.x; j < n; j += blockDim.x) sum += load(x[channel_offset(j, c, C, inner)]);
    const A mean = block_sum(sum, scratch) / A(n);
    A squares = 0;
    for (index_t j = threadIdx.x; j < n; j += blockDim.x) {
        const A d = load(x[channel_offset(j, c, C, inner)]) - mean;
        squares += d * d;
    }
    const A var = block_sum(squares, scratch) / A(n);
    if (threadIdx.x == 0) {
        mean_out[c] = mean;
        invstd_out[c] = A(1) / sqrt(var + eps);
        if (update_running) {
            running_mean[c] = store<P>((A(1) - momentum) * load(running_mean[c]) + momentum * mean);
            running_var[c] = store<P>((A(1) - momentum) * load(running_var[c]) + momentum * (var * unbias));
        }
    }
}

// Inference: the running statistics as the mean and invstd the normalize kernel takes.
template <typename T, typename P, typename index_t>
__global__ void batchnorm_inference_statistics(const P* __restrict__ running_mean,
                                               const P* __restrict__ running_var,
                                               acc_t<T>* __restrict__ mean_out,
                                               acc_t<T>* __restrict__ invstd_out, index_t C,
                                               acc_t<T> eps) {
    typedef acc_t<T> A;
    GRID_STRIDE_LOOP(c, C) {
        mean_out[c] = load(running_mean[c]);
        invstd_out[c] = A(1) / sqrt(A(load(running_var[c])) + eps);
    }
}

// y = (x - mean[c]) * invstd[c] * gamma[c] + beta[c]
template <typename T, typename P, typename index_t>
__global__ void batchnorm_forward(const T* __restrict__ x, T* __restrict__ y,
                                  const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ invstd,
                                  const P* __restrict__ gamma, const P* __restrict__ beta,
                                  index_t total, index_t C, index_t inner) {
    typedef acc_t<T> A;
    GRID_STRIDE_LOOP(i, total) {
        const index_t c = (i / inner) % C;
        const A xhat = (load(x[i]) - mean[c]) * invstd[c];
        y[i] = store<T>(xhat * A(load(gamma[c])) + A(load(beta[c])));
    }
}

// dbeta[c] = sum(dy), dgamma[c] = sum(dy * xhat) over the channel; the sums are
// also kept in A for batchnorm_backward_data.
template <typename T, typename P, typename index_t>
__global__ void batchnorm_backward_reduce(const T* __restrict__ x, const T* __restrict__ dy,
                                          const acc_t<T>* __restrict__ mean,
                                          const acc_t<T>* __restrict__ invstd,
                                          acc_t<T>* __restrict__ sum_dy, acc_t<T>* __restrict__ sum_dy_xhat,
                                          P* __restrict__ dgamma, P* __restrict__ dbeta,
                                          index_t outer, index_t C, index_t inner) {
    typedef acc_t<T> A;
    __shared__ A scratch[32];
    const index_t c = blockIdx.x;
    const index_t n = outer * inner;
    const A m = mean[c], s = invstd[c];
    A g = 0, gx = 0;
    for (index_t j = threadIdx.x; j < n; j += blockDim.x) {
        const index_t off = channel_offset(j, c, C, inner);
        const A d = load(dy[off]);
        g += d;
        gx += d * ((load(x[off]) - m) * s);
    }
    g = block_sum(g, scratch);
    gx = block_sum(gx, scratch);
    if (threadIdx.x == 0) {
        sum_dy[c] = g;
        sum_dy_xhat[c] = gx;
        dbeta[c] = store<P>(g);
        dgamma[c] = store<P>(gx);
    }
}

// dx = gamma * invstd * (dy - sum(dy) / n - xhat * sum(dy * xhat) / n)
template <typename T, typename P, typename index_t>
__global__ void batchnorm_backward_data(const T* __restrict__ x, const T* __restrict__ dy,
                                        const acc_t<T>* __restrict__ mean,
                                        const acc_t<T>* __restrict__ invstd,
                                        const P* __restrict__ gamma,
                                        const acc_t<T>* __restrict__ sum_dy,
                                        const acc_t<T>* __restrict__ sum_dy_xhat, T* __restrict__ dx,
                                        index_t total, index_t C, index_t inner, acc_t<T> n) {
    typedef acc_t<T> A;
    GRID_STRIDE_LOOP(i, total) {
        const index_t c = (i / inner) % C;
        const A s = invstd[c];
        const A xhat = (load(x[i]) - mean[c]) * s;
        const A scale = A(load(gamma[c])) * s;
        dx[i] = store<T>(scale * (load(dy[i]) - sum_dy[c] / n - xhat * (sum_dy_xhat[c] / n)));
    }
}
