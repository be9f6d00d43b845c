// WORK IN PROGRESS -- not compiled, not wired in, never run on a GPU.
// Warp-per-row variants of norm_rows_forward / norm_rows_backward (kernels/row_normalization.cu)
// for rows of at most NORM_WARP_VECTORS * 32 16-byte vectors (1024 float / 2048 half values):
// one warp per row, 8 rows per 256-thread block, the row in registers as raw packs, warp
// shuffles only.  Motivation: block-per-row layer norm on 65536 x 1024 took 0.199 ms in both
// float and half on the H100 (latency per block).  To use: append to kernels/row_normalization.cu
// with '#define NORM_WARP_VECTORS 8', declare norm_rows_{forward,backward}_warp<T, P, index_t, VEC>,
// launch grid ceil(rows / (block / 32)) with the row count as the argument after rms.  With all
// 48 extra specialisations NVRTC took ~38 s for the family here (vs ~6 s), too slow for the GPU
// call: declare fewer (e.g. int index only) before wiring it in.

// One warp per row of at most NORM_WARP_VECTORS * 32 vectors; lane l holds
// vectors l, l + 32, ... in registers.  Same arguments as norm_rows_forward
// (no cache), plus the number of rows.
template <typename T, typename P, typename index_t, int VEC>
__global__ void norm_rows_forward_warp(const T* __restrict__ x, T* __restrict__ y,
                                       const P* __restrict__ gamma, const P* __restrict__ beta,
                                       acc_t<T>* __restrict__ mean_out, acc_t<T>* __restrict__ rstd_out,
                                       index_t K, index_t S, int G, int nhwc, acc_t<T> eps, int rms,
                                       index_t rows, int write_y) {
    typedef acc_t<T> A;
    const RowGeometry<index_t> geo{K, S, K * S, G, nhwc};
    const index_t row = (index_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;  // the whole warp leaves: only warp-level syncs follow
    const int lane = threadIdx.x & 31;
    const index_t Mv = geo.M / VEC;
    const A count = A(geo.M);
    NormPack<T, VEC> pk[NORM_WARP_VECTORS];
#pragma unroll
    for (int k = 0; k < NORM_WARP_VECTORS; ++k) {
        const index_t vi = lane + 32 * k;
        if (vi < Mv) pk[k] = *reinterpret_cast<const NormPack<T, VEC>*>(x + geo.template offset<VEC>(row, vi));
    }
    A s1 = 0;
#pragma unroll
    for (int k = 0; k < NORM_WARP_VECTORS; ++k) {
        if (lane + 32 * k < Mv) {
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const A v = load(pk[k].v[e]);
                s1 += rms ? v * v : v;
            }
        }
    }
    s1 = warp_sum(s1);
    A mean = 0, rstd;
    if (rms) {
        rstd = A(1) / sqrt(s1 / count + eps);
    } else {
        mean = s1 / count;
        A s2 = 0;
#pragma unroll
        for (int k = 0; k < NORM_WARP_VECTORS; ++k) {
            if (lane + 32 * k < Mv) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    const A d = A(load(pk[k].v[e])) - mean;
                    s2 += d * d;
                }
            }
        }
        s2 = warp_sum(s2);
        rstd = A(1) / sqrt(s2 / count + eps);
    }
    if (lane == 0) {
        if (!rms) mean_out[row] = mean;
        rstd_out[row] = rstd;
    }
    if (!write_y) return;
    const int step = geo.step();
#pragma unroll
    for (int k = 0; k < NORM_WARP_VECTORS; ++k) {
        const index_t vi = lane + 32 * k;
        if (vi < Mv) {
            const index_t c0 = geo.template channel<VEC>(row, vi);
            A v[VEC];
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const index_t c = c0 + (step ? e : 0);
                v[e] = (A(load(pk[k].v[e])) - mean) * rstd * param_or(gamma, c, A(1)) + param_or(beta, c, A(0));
            }
            norm_store<T, VEC>(y, geo.template offset<VEC>(row, vi), v);
        }
    }
}

template <typename T, typename P, typename index_t, int VEC>
__global__ void norm_rows_backward_warp(const T* __restrict__ dy, const T* __restrict__ x,
                                        const P* __restrict__ gamma, const acc_t<T>* __restrict__ mean_in,
                                        const acc_t<T>* __restrict__ rstd_in, T* __restrict__ dx,
                                        index_t K, index_t S, int G, int nhwc, int rms, index_t rows) {
    typedef acc_t<T> A;
    const RowGeometry<index_t> geo{K, S, K * S, G, nhwc};
    const index_t row = (index_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const int lane = threadIdx.x & 31;
    const index_t Mv = geo.M / VEC;
    const A count = A(geo.M);
    const A mean = rms ? A(0) : mean_in[row];
    const A rstd = rstd_in[row];
    const int step = geo.step();
    NormPack<T, VEC> xk[NORM_WARP_VECTORS], dk[NORM_WARP_VECTORS];
#pragma unroll
    for (int k = 0; k < NORM_WARP_VECTORS; ++k) {
        const index_t vi = lane + 32 * k;
        if (vi < Mv) {
            const index_t off = geo.template offset<VEC>(row, vi);
            xk[k] = *reinterpret_cast<const NormPack<T, VEC>*>(x + off);
            dk[k] = *reinterpret_cast<const NormPack<T, VEC>*>(dy + off);
        }
    }
    A sum_g = 0, sum_gx = 0;
#pragma unroll
    for (int k = 0; k < NORM_WARP_VECTORS; ++k) {
        const index_t vi = lane + 32 * k;
        if (vi < Mv) {
            const index_t c0 = geo.template channel<VEC>(row, vi);
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const A gdy = A(load(dk[k].v[e])) * param_or(gamma, c0 + (step ? e : 0), A(1));
                sum_g += gdy;
                sum_gx += gdy * (A(load(xk[k].v[e])) - mean) * rstd;
            }
        }
    }
    sum_g = warp_sum(sum_g);
    sum_gx = warp_sum(sum_gx);
    const A mean_g = rms ? A(0) : sum_g / count;
    const A mean_gx = sum_gx / count;
#pragma unroll
    for (int k = 0; k < NORM_WARP_VECTORS; ++k) {
        const index_t vi = lane + 32 * k;
        if (vi < Mv) {
            const index_t c0 = geo.template channel<VEC>(row, vi);
            A v[VEC];
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const A gdy = A(load(dk[k].v[e])) * param_or(gamma, c0 + (step ? e : 0), A(1));
                v[e] = rstd * (gdy - mean_g - (A(load(xk[k].v[e])) - mean) * rstd * mean_gx);
            }
            norm_store<T, VEC>(dx, geo.template offset<VEC>(row, vi), v);
        }
    }
}
