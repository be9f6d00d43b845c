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
// Work split.  Every kernel runs one block of BN_THREADS threads per *chunk*:
// BN_CHUNK consecutive values j of one channel (the last chunk of a channel
// may be short), so a channel of 200k values gets ~50 blocks and the grid
// fills the 132 SMs for any C.  Block id = channel * splits + chunk.  Thread t
// handles values j = start + (k * BN_THREADS + t) * VEC + v: each warp reads
// 32 * VEC consecutive values, VEC values (16 bytes) per load when inner is a
// multiple of VEC and the pointers are 16-byte aligned (then a vector never
// crosses an (outer) segment), else VEC = 1.
//
// Statistics (training): pass 1 (batchnorm_statistics) keeps its chunk in
// registers and computes the chunk's mean, then the sum of squared deviations
// from it -- two-pass exact per chunk; chunks are merged with Chan's pairwise
// formula in a fixed order (warp 0, lane-strided then a shuffle tree), so
// results are bitwise reproducible and exact enough for any data, unlike
// E[x^2] - E[x]^2.  The merge is redone by every block of pass 2 (a few
// dozen values from L2) instead of a separate launch; the block of chunk 0
// writes mean/invstd and the running statistics.  The backward's pass 1
// (batchnorm_backward_reduce, and batchnorm_statistics when it recomputes the
// statistics) instead finishes each channel in the last of its blocks to
// arrive (an arrival counter: last_to_arrive), so its pass 2 reads two values.
// H100 (notes/bnorm.md): that finish is a win in the backward (bn_big float16
// 0.1875 against 0.1896 ms) and a loss in the training forward (0.1265 against
// 0.1233: the statistics kernel, latency-bound at 1.9 TB/s, pays the fence and
// atomic; the normalize pass runs at copy speed either way).
//
// The floor is: read x twice, write y once (forward); read x and dy twice,
// write dx once (backward).  Pass 2 walks the chunks in the reverse order of
// pass 1 (`reverse`), so its first blocks find the data pass 1 read last still
// in L2 (50 MB on the H100).
//
// Channel-last x (inner == 1: NHWC, 2-D) runs the rows kernels at the end of
// this file instead (vectorised along C).  Small channels whose inner size is
// not a multiple of VEC (7x7 planes) keep 16-byte accesses through
// batchnorm_train_grouped / batchnorm_backward_grouped (training forward /
// backward with saved statistics: G channels per block, one launch) and
// batchnorm_infer_flat (inference: x as one flat array).
//
// The chunk kernels share their passes through the device helpers below
// (load_chunk[_pair], chunk_mean_m2, chunk_grad_sums, store_chunk_normalized,
// store_chunk_dx, merge_statistics / merge_sums, write_statistics): the
// two-pass and the single-read (fused) kernels run the same code per chunk.
#include "common.cuh"
#include "bulk_copy.cuh"

#define BN_THREADS 256
#define BN_PER_THREAD 16
#define BN_CHUNK (BN_THREADS * BN_PER_THREAD)

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
    T v[VEC];
};

template <typename index_t>
__device__ __forceinline__ index_t channel_offset(index_t j, index_t c, index_t C, index_t inner) {
    const index_t o = j / inner;
    return (o * C + c) * inner + (j - o * inner);
}

template <typename T, int VEC, typename index_t>
__device__ __forceinline__ void load_pack(const T* __restrict__ p, index_t off, acc_t<T> (&out)[VEC]) {
    const Pack<T, VEC> pk = *reinterpret_cast<const Pack<T, VEC>*>(p + off);
#pragma unroll
    for (int v = 0; v < VEC; ++v) out[v] = load(pk.v[v]);
}

template <typename T, int VEC, typename index_t>
__device__ __forceinline__ void store_pack(T* __restrict__ p, index_t off, const acc_t<T> (&in)[VEC]) {
    Pack<T, VEC> pk;
#pragma unroll
    for (int v = 0; v < VEC; ++v) pk.v[v] = store<T>(in[v]);
    *reinterpret_cast<Pack<T, VEC>*>(p + off) = pk;
}

// The block's (channel, chunk) pair; pass 2 may walk the grid backwards.
__device__ __forceinline__ void chunk_of_block(int splits, int reverse, int& c, int& split) {
    const int id = reverse ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    c = id / splits;
    split = id - c * splits;
}

// Number of values in chunk `split` of a channel of n values.
template <typename A, typename index_t>
__device__ __forceinline__ A chunk_count(int split, index_t n) {
    const index_t rest = n - (index_t)split * BN_CHUNK;
    return A(rest < BN_CHUNK ? rest : (index_t)BN_CHUNK);
}

// Chan et al.: merge (count, mean, M2) of b into a.
template <typename A>
__device__ __forceinline__ void chan_merge(A& na, A& ma, A& m2a, A nb, A mb, A m2b) {
    if (nb == A(0)) return;
    if (na == A(0)) {
        na = nb; ma = mb; m2a = m2b;
        return;
    }
    const A n = na + nb, delta = mb - ma, f = nb / n;
    ma = ma + delta * f;
    m2a = m2a + m2b + delta * delta * na * f;
    na = n;
}

// Fixed-order Chan merge of the 32 lanes' (count, mean, M2): lane 0 gets the result.
template <typename A>
__device__ __forceinline__ void warp_chan_merge(A& cnt, A& mu, A& m2) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const A ob = __shfl_down_sync(0xffffffffu, cnt, offset);
        const A om = __shfl_down_sync(0xffffffffu, mu, offset);
        const A o2 = __shfl_down_sync(0xffffffffu, m2, offset);
        if (lane + offset < 32) chan_merge(cnt, mu, m2, ob, om, o2);
    }
}

// Fixed-order sum of the 32 lanes' values: lane 0 gets the result.
template <typename A>
__device__ __forceinline__ A warp_down_sum(A v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
    return v;
}

// Writes channel c's mean / invstd and, when update_running is set, running =
// (1 - momentum) * running + momentum * batch (variance made unbiased by
// `unbias` = n / (n - 1)).  One thread per channel calls it.
template <typename A, typename P>
__device__ __forceinline__ void write_statistics(int c, A mean, A var, A invstd, A* __restrict__ mean_out,
                                                 A* __restrict__ invstd_out, P* __restrict__ running_mean,
                                                 P* __restrict__ running_var, A momentum, A unbias,
                                                 int update_running) {
    mean_out[c] = mean;
    invstd_out[c] = invstd;
    if (update_running) {
        running_mean[c] = store<P>((A(1) - momentum) * A(load(running_mean[c])) + momentum * mean);
        running_var[c] = store<P>((A(1) - momentum) * A(load(running_var[c])) + momentum * (var * unbias));
    }
}

// Writes channel c's backward sums g = sum(dy) and gx = sum(dy * xhat): to
// sums[c] / sums[C + c] (what the data pass reads) and as dbeta / dgamma.  One
// thread per channel calls it.
template <typename A, typename P, typename index_t>
__device__ __forceinline__ void write_grad_sums(int c, index_t C, A g, A gx, A* __restrict__ sums,
                                                P* __restrict__ dbeta, P* __restrict__ dgamma) {
    sums[c] = g;
    sums[C + c] = gx;
    dbeta[c] = store<P>(g);
    dgamma[c] = store<P>(gx);
}

// What a fused kernel's block writes instead of a result it could not compute
// (a grid barrier that timed out, see channel_barrier): a quiet NaN, never a
// plausible wrong value.
template <typename A> __device__ __forceinline__ A barrier_failed();
template <> __device__ __forceinline__ float barrier_failed<float>() {
    return __int_as_float(0x7fc00000);
}
template <> __device__ __forceinline__ double barrier_failed<double>() {
    return __longlong_as_double(0x7ff8000000000000ULL);
}

// Mean and biased variance of channel c from its `splits` chunk partials, in a
// fixed order.  Called by every thread of the block; every thread gets the
// result.  Ptr is `const A*`, or `const volatile A*` for partials written by
// other blocks of the same launch (the fused kernels: never a stale L1 line).
template <typename A, typename Ptr, typename index_t>
__device__ __forceinline__ void merge_statistics(Ptr part_mean, Ptr part_m2, int c, int splits, index_t n,
                                                 A& mean, A& var) {
    __shared__ A result[2];
    if (threadIdx.x < 32) {
        A cnt = 0, mu = 0, m2 = 0;
        for (int b = threadIdx.x; b < splits; b += 32) {
            chan_merge(cnt, mu, m2, chunk_count<A>(b, n), A(part_mean[c * splits + b]),
                       A(part_m2[c * splits + b]));
        }
        warp_chan_merge(cnt, mu, m2);
        if (threadIdx.x == 0) {
            result[0] = mu;
            result[1] = m2 / cnt;
        }
    }
    __syncthreads();
    mean = result[0];
    var = result[1];
}

// Channel c's mean and invstd from its chunk partials (merge_statistics);
// the block of chunk 0 writes them and updates the running statistics
// (write_statistics; update_running 0 leaves running_* unread).
template <typename A, typename Ptr, typename P, typename index_t>
__device__ __forceinline__ void channel_statistics(Ptr part_mean, Ptr part_m2, int c, int split, int splits,
                                                   index_t n, A eps, A* __restrict__ mean_out,
                                                   A* __restrict__ invstd_out, P* __restrict__ running_mean,
                                                   P* __restrict__ running_var, A momentum, A unbias,
                                                   int update_running, A& mean, A& invstd, bool valid = true) {
    A var;
    merge_statistics(part_mean, part_m2, c, splits, n, mean, var);
    if (!valid) mean = var = barrier_failed<A>();
    invstd = A(1) / sqrt(var + eps);
    if (split == 0 && threadIdx.x == 0) {
        write_statistics(c, mean, var, invstd, mean_out, invstd_out, running_mean, running_var, momentum, unbias,
                         update_running);
    }
}

// Sums of two per-chunk partials of channel c, in a fixed order, to every
// thread (Ptr as in merge_statistics).
template <typename A, typename Ptr>
__device__ __forceinline__ void merge_sums(Ptr part_a, Ptr part_b, int c, int splits, A& a, A& b) {
    __shared__ A result[2];
    if (threadIdx.x < 32) {
        A sa = 0, sb = 0;
        for (int k = threadIdx.x; k < splits; k += 32) {
            sa += part_a[c * splits + k];
            sb += part_b[c * splits + k];
        }
        sa = warp_down_sum(sa);
        sb = warp_down_sum(sb);
        if (threadIdx.x == 0) {
            result[0] = sa;
            result[1] = sb;
        }
    }
    __syncthreads();
    a = result[0];
    b = result[1];
}

// ---- One chunk in registers (every chunk kernel): thread t holds values
// j = start + (k * BN_THREADS + t) * VEC + v, k < ITEMS, of channel c.

// Load chunk values of channel c into registers, zeros past n.
template <typename T, int VEC, int ITEMS, typename index_t>
__device__ __forceinline__ void load_chunk(const T* __restrict__ x, index_t start, index_t n, int c,
                                           index_t C, index_t inner, acc_t<T> (&vals)[ITEMS][VEC]) {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        const index_t j = start + (index_t)(k * BN_THREADS + threadIdx.x) * VEC;
        if (j < n) {
            load_pack<T, VEC>(x, channel_offset(j, (index_t)c, C, inner), vals[k]);
        } else {
#pragma unroll
            for (int v = 0; v < VEC; ++v) vals[k][v] = 0;
        }
    }
}

// load_chunk of x and dy at once (all loads before any use).
template <typename T, int VEC, int ITEMS, typename index_t>
__device__ __forceinline__ void load_chunk_pair(const T* __restrict__ x, const T* __restrict__ dy,
                                                index_t start, index_t n, int c, index_t C, index_t inner,
                                                acc_t<T> (&xs)[ITEMS][VEC], acc_t<T> (&ds)[ITEMS][VEC]) {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        const index_t j = start + (index_t)(k * BN_THREADS + threadIdx.x) * VEC;
        if (j < n) {
            const index_t off = channel_offset(j, (index_t)c, C, inner);
            load_pack<T, VEC>(x, off, xs[k]);
            load_pack<T, VEC>(dy, off, ds[k]);
        } else {
#pragma unroll
            for (int v = 0; v < VEC; ++v) xs[k][v] = ds[k][v] = 0;
        }
    }
}

// The chunk's mean (of `count` values) and sum of squared deviations from it,
// two-pass exact, to every thread.
template <int VEC, int ITEMS, typename A, typename index_t>
__device__ __forceinline__ void chunk_mean_m2(const A (&vals)[ITEMS][VEC], index_t start, index_t n, A count,
                                              A* scratch, A& mean, A& m2) {
    A sum = 0;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k)
#pragma unroll
        for (int v = 0; v < VEC; ++v) sum += vals[k][v];
    mean = block_sum(sum, scratch) / count;
    A q = 0;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        const index_t j = start + (index_t)(k * BN_THREADS + threadIdx.x) * VEC;
        if (j < n) {
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                const A d = vals[k][v] - mean;
                q += d * d;
            }
        }
    }
    m2 = block_sum(q, scratch);
}

// The chunk's sum(dy) and sum(dy * (x - m)), to every thread.
template <int VEC, int ITEMS, typename A, typename index_t>
__device__ __forceinline__ void chunk_grad_sums(const A (&xs)[ITEMS][VEC], const A (&ds)[ITEMS][VEC],
                                                index_t start, index_t n, A m, A* scratch, A& g, A& gx) {
    A sg = 0, sgx = 0;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        const index_t j = start + (index_t)(k * BN_THREADS + threadIdx.x) * VEC;
        if (j < n) {
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                sg += ds[k][v];
                sgx += ds[k][v] * (xs[k][v] - m);
            }
        }
    }
    g = block_sum(sg, scratch);
    gx = block_sum(sgx, scratch);
}

// y = (x - mean) * scale + shift for the chunk in registers.
template <typename T, int VEC, int ITEMS, typename A, typename index_t>
__device__ __forceinline__ void store_chunk_normalized(T* __restrict__ y, const A (&vals)[ITEMS][VEC],
                                                       index_t start, index_t n, int c, index_t C,
                                                       index_t inner, A mean, A scale, A shift) {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        const index_t j = start + (index_t)(k * BN_THREADS + threadIdx.x) * VEC;
        if (j < n) {
            A out[VEC];
#pragma unroll
            for (int v = 0; v < VEC; ++v) out[v] = (vals[k][v] - mean) * scale + shift;
            store_pack<T, VEC>(y, channel_offset(j, (index_t)c, C, inner), out);
        }
    }
}

// dx = scale * (dy - mean_dy - xhat * mean_dy_xhat), xhat = (x - m) * s, scale
// = gamma * s, for the chunk in registers.
template <typename T, int VEC, int ITEMS, typename A, typename index_t>
__device__ __forceinline__ void store_chunk_dx(T* __restrict__ dx, const A (&xs)[ITEMS][VEC],
                                               const A (&ds)[ITEMS][VEC], index_t start, index_t n, int c,
                                               index_t C, index_t inner, A m, A s, A scale, A mean_dy,
                                               A mean_dy_xhat) {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        const index_t j = start + (index_t)(k * BN_THREADS + threadIdx.x) * VEC;
        if (j < n) {
            A out[VEC];
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                const A xhat = (xs[k][v] - m) * s;
                out[v] = scale * (ds[k][v] - mean_dy - xhat * mean_dy_xhat);
            }
            store_pack<T, VEC>(dx, channel_offset(j, (index_t)c, C, inner), out);
        }
    }
}

#define BN_SHAPE index_t outer, index_t C, index_t inner, int splits

// Whether this block is the last of `count` blocks to arrive at *counter
// (to every thread of the block).  Thread 0 stored the block's partials before
// the call; its fence orders them before the arrival, and the last block's
// fence orders its reads of the others' partials (volatile: L2) after it.  The
// last block zeroes the counter for the next launch.  No block waits for
// another, so unlike channel_barrier this needs no co-residency.
__device__ __forceinline__ bool last_to_arrive(unsigned* __restrict__ counter, int count) {
    __shared__ int last;
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(counter, 1u) == (unsigned)(count - 1);
        if (last) {
            *counter = 0u;
            __threadfence();
        }
    }
    __syncthreads();
    return last != 0;
}

// Pass 1 of the training statistics: each block's chunk mean and sum of
// squared deviations from it into part_mean / part_m2 [C * splits].  FINISH
// (the backward's recomputed statistics): the last block of channel c to
// finish (arrive[c]) merges them (channel_statistics, the fixed order: the
// result does not depend on which block is last) and writes mean / invstd
// (and the running statistics when update_running is set).  The training
// forward does not finish here: its pass 2 (batchnorm_normalize) merges in
// every block, which measured faster (see the file header).
template <typename T, typename P, typename index_t, int VEC, bool FINISH>
__global__ void __launch_bounds__(BN_THREADS)
batchnorm_statistics(const T* __restrict__ x, acc_t<T>* __restrict__ part_mean, acc_t<T>* __restrict__ part_m2,
                     acc_t<T>* __restrict__ mean_out, acc_t<T>* __restrict__ invstd_out,
                     P* __restrict__ running_mean, P* __restrict__ running_var, BN_SHAPE, acc_t<T> eps,
                     acc_t<T> momentum, acc_t<T> unbias, int update_running, unsigned* __restrict__ arrive) {
    typedef acc_t<T> A;
    constexpr int ITEMS = BN_PER_THREAD / VEC;
    __shared__ A scratch[32];
    int c, split;
    chunk_of_block(splits, 0, c, split);
    const index_t n = outer * inner;
    const index_t start = (index_t)split * BN_CHUNK;
    A vals[ITEMS][VEC];
    load_chunk<T, VEC, ITEMS>(x, start, n, c, C, inner, vals);
    A mean, m2;
    chunk_mean_m2(vals, start, n, chunk_count<A>(split, n), scratch, mean, m2);
    if (threadIdx.x == 0) {
        part_mean[blockIdx.x] = mean;
        part_m2[blockIdx.x] = m2;
    }
    if (FINISH && last_to_arrive(arrive + c, splits)) {
        A invstd;
        channel_statistics((const volatile A*)part_mean, (const volatile A*)part_m2, c, 0, splits, n, eps,
                           mean_out, invstd_out, running_mean, running_var, momentum, unbias, update_running,
                           mean, invstd);
    }
}

// y = (x - mean[c]) * invstd[c] * gamma[c] + beta[c].
// TRAINING: the statistics come from pass 1's partials; the block of chunk 0
// writes mean/invstd and, when update_running is set, the running statistics
// (write_statistics).  Inference: mean/invstd come from the running
// statistics; chunk 0 writes them out.
template <typename T, typename P, typename index_t, int VEC, bool TRAINING>
__global__ void __launch_bounds__(BN_THREADS)
batchnorm_normalize(const T* __restrict__ x, T* __restrict__ y, const acc_t<T>* __restrict__ part_mean,
                    const acc_t<T>* __restrict__ part_m2, acc_t<T>* __restrict__ mean_out,
                    acc_t<T>* __restrict__ invstd_out, P* __restrict__ running_mean,
                    P* __restrict__ running_var, const P* __restrict__ gamma,
                    const P* __restrict__ beta, BN_SHAPE, acc_t<T> eps, acc_t<T> momentum,
                    acc_t<T> unbias, int update_running, int reverse) {
    typedef acc_t<T> A;
    constexpr int ITEMS = BN_PER_THREAD / VEC;
    int c, split;
    chunk_of_block(splits, reverse, c, split);
    const index_t n = outer * inner;
    A mean, invstd;
    if (TRAINING) {
        channel_statistics(part_mean, part_m2, c, split, splits, n, eps, mean_out, invstd_out, running_mean,
                           running_var, momentum, unbias, update_running, mean, invstd);
    } else {
        mean = load(running_mean[c]);
        invstd = A(1) / sqrt(A(load(running_var[c])) + eps);
        if (split == 0 && threadIdx.x == 0) {
            mean_out[c] = mean;
            invstd_out[c] = invstd;
        }
    }
    const index_t start = (index_t)split * BN_CHUNK;
    A vals[ITEMS][VEC];
    load_chunk<T, VEC, ITEMS>(x, start, n, c, C, inner, vals);
    store_chunk_normalized(y, vals, start, n, c, C, inner, mean, invstd * A(load(gamma[c])),
                           A(load(beta[c])));
}

// Inference over x viewed flat, for inner sizes that are not a multiple of VEC
// (ResNet's 7x7 = 49: the chunk kernel above would fall back to 4-byte
// accesses and a block per channel of 1568 values).  Thread t of block b
// handles vectors (b * BN_FLAT_UNROLL + u) * BN_THREADS + t of VEC values (16
// bytes when x.size % VEC == 0 and the pointers are aligned), all loads first;
// the channel of a vector's first value costs two divisions, the following
// values step (position, channel) by one, and a channel's scale/shift are
// recomputed only when it changes (from L1: C * 4 parameters).  Threads
// 0..C-1 of the grid write mean/invstd (the running statistics, in A).
#define BN_FLAT_UNROLL 4
template <typename T, typename P, typename index_t, int VEC>
__global__ void __launch_bounds__(BN_THREADS)
batchnorm_infer_flat(const T* __restrict__ x, T* __restrict__ y, acc_t<T>* __restrict__ mean_out,
                     acc_t<T>* __restrict__ invstd_out, const P* __restrict__ running_mean,
                     const P* __restrict__ running_var, const P* __restrict__ gamma,
                     const P* __restrict__ beta, index_t size, index_t C, index_t inner, acc_t<T> eps) {
    typedef acc_t<T> A;
    const index_t tid = (index_t)blockIdx.x * BN_THREADS + threadIdx.x;
    if (tid < C) {
        mean_out[tid] = A(load(running_mean[tid]));
        invstd_out[tid] = A(1) / sqrt(A(load(running_var[tid])) + eps);
    }
    const index_t first = (index_t)blockIdx.x * (BN_FLAT_UNROLL * BN_THREADS) + threadIdx.x;
    A vals[BN_FLAT_UNROLL][VEC];
#pragma unroll
    for (int u = 0; u < BN_FLAT_UNROLL; ++u) {
        const index_t e = (first + (index_t)u * BN_THREADS) * VEC;
        if (e < size) {
            if (VEC > 1) {
                load_pack<T, VEC>(x, e, vals[u]);
            } else {
                vals[u][0] = load(x[e]);
            }
        }
    }
#pragma unroll
    for (int u = 0; u < BN_FLAT_UNROLL; ++u) {
        const index_t e = (first + (index_t)u * BN_THREADS) * VEC;
        if (e < size) {
            const index_t o = e / inner;
            index_t r = e - o * inner;
            index_t c = o % C;
            index_t current = -1;
            A mean = 0, scale = 0, shift = 0;
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                if (c != current) {
                    current = c;
                    mean = A(load(running_mean[c]));
                    scale = (A(1) / sqrt(A(load(running_var[c])) + eps)) * A(load(gamma[c]));
                    shift = A(load(beta[c]));
                }
                vals[u][v] = (vals[u][v] - mean) * scale + shift;
                if (++r == inner) {
                    r = 0;
                    if (++c == C) c = 0;
                }
            }
            if (VEC > 1) {
                store_pack<T, VEC>(y, e, vals[u]);
            } else {
                y[e] = store<T>(vals[u][0]);
            }
        }
    }
}

// Inference, NCHW with planes of at least VEC values (python: PACKED_INFERENCE):
// the elementwise map y = (x - mean[c]) * scale[c] + shift[c] laid out like
// activation_forward (kernels/activation.cu), the launch shape that runs at copy
// speed there: x as flat packs of VEC values (16 bytes; VEC = 1 when a pointer
// is misaligned), thread t of block b takes packs b * U * BN_THREADS + u *
// BN_THREADS + t (u < U: 1 for 4- and 8-byte types, 4 for 16-bit, the
// activation sweep's best), all U loads issued before any use, a one-shot grid
// (capped: then a grid stride); the values past the last whole pack in a scalar
// loop.  The per-channel constants are those of the chunk kernel, in the same
// expressions (mean = running_mean, scale = 1 / sqrt(running_var + eps) *
// gamma, shift = beta; y = (x - mean) * scale + shift): bitwise its output.
// Where they come from (the chunk kernel: a j / inner division a pack and a
// block a chunk of one channel; batchnorm_infer_flat: two divisions a vector
// and the constants recomputed, with a sqrt and a division, whenever a value's
// channel changes inside the vector):
//  !SPLIT (inner % VEC == 0: a pack is inside one plane): plane p = e / inner,
//    c = p % C, the four parameters of c (the warp's lanes mostly share c: L1
//    broadcasts) and one sqrt + division a pack, off the x load's latency.
//  SPLIT (inner % VEC != 0, inner > VEC: a pack spans at most two planes, and a
//    warp's 32 packs at most 32 planes): a warp table -- lane l computes the
//    constants of plane pw + l (pw: the plane of lane 0's first value) once,
//    each thread takes its planes p and p + 1 by shuffles; value v of a pack
//    at position r of plane p is in p when r + v < inner.  Loops run over
//    block-uniform bounds so every lane reaches the shuffles.
// Threads 0..C-1 of the grid write mean/invstd (the running statistics, in A).
// An empty asm that takes v: the load that makes v is issued (and waited for) here.
__device__ __forceinline__ void bn_pin(float& v) { asm volatile("" : "+f"(v)); }
__device__ __forceinline__ void bn_pin(double& v) { asm volatile("" : "+d"(v)); }

template <typename T, bool PIN = true, typename P, typename A>
__device__ __forceinline__ void infer_constants(const P* __restrict__ running_mean,
                                                const P* __restrict__ running_var, const P* __restrict__ gamma,
                                                const P* __restrict__ beta, int c, A eps, A& mean, A& scale,
                                                A& shift) {
    // All four loads before the sqrt and the division, whose slow-path branches
    // would otherwise hold the gamma / beta loads back (one round trip, not two).
    A m = A(load(running_mean[c])), var = A(load(running_var[c]));
    A g = A(load(gamma[c])), b = A(load(beta[c]));
    if (PIN) {  // (else the compiler sinks these loads past the branches; off for the table fill)
        bn_pin(m); bn_pin(g); bn_pin(b);
    }
    mean = m;
    scale = (A(1) / sqrt(var + eps)) * g;
    shift = b;
}

// The packs pack b0 + u * BN_THREADS + thread (u < U) of x, those below `packs`
// (the packs inference kernels: all of a block's loads before any use).
template <typename T, int VEC, int U, typename index_t>
__device__ __forceinline__ void load_block_packs(const T* __restrict__ x, index_t b0, index_t packs,
                                                 Pack<T, VEC> (&in)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const index_t q = b0 + (index_t)(u * BN_THREADS + threadIdx.x);
        if (q < packs) in[u] = *reinterpret_cast<const Pack<T, VEC>*>(x + q * VEC);
    }
}

template <typename T, typename P, typename index_t, int VEC, int U, bool SPLIT>
__global__ void __launch_bounds__(BN_THREADS)
batchnorm_infer_packs(const T* __restrict__ x, T* __restrict__ y, acc_t<T>* __restrict__ mean_out,
                      acc_t<T>* __restrict__ invstd_out, const P* __restrict__ running_mean,
                      const P* __restrict__ running_var, const P* __restrict__ gamma,
                      const P* __restrict__ beta, index_t size, index_t packs, index_t C, index_t inner,
                      acc_t<T> eps) {
    typedef acc_t<T> A;
    const index_t tid = (index_t)blockIdx.x * BN_THREADS + threadIdx.x;
    if (tid < C) {
        mean_out[tid] = A(load(running_mean[tid]));
        invstd_out[tid] = A(1) / sqrt(A(load(running_var[tid])) + eps);
    }
    const index_t stride = (index_t)gridDim.x * (BN_THREADS * U);
    for (index_t b0 = (index_t)blockIdx.x * (BN_THREADS * U); b0 < packs; b0 += stride) {  // block-uniform
        Pack<T, VEC> in[U];
        load_block_packs(x, b0, packs, in);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const index_t q = b0 + (index_t)(u * BN_THREADS + threadIdx.x);
            const index_t e = q * VEC;
            const index_t p = e / inner;
            A out[VEC];
            if (!SPLIT) {
                if (q < packs) {
                    A mean, scale, shift;
                    infer_constants<T>(running_mean, running_var, gamma, beta, (int)(p % C), eps, mean, scale,
                                       shift);
#pragma unroll
                    for (int v = 0; v < VEC; ++v) out[v] = (load(in[u].v[v]) - mean) * scale + shift;
                }
            } else {
                const int lane = threadIdx.x & 31;
                const index_t pw = __shfl_sync(0xffffffffu, p, 0);
                A tm, ts, tb;  // the constants of plane pw + lane (always a valid channel)
                infer_constants<T>(running_mean, running_var, gamma, beta, (int)((pw + lane) % C), eps, tm, ts,
                                   tb);
                const int k = (int)(p - pw);
                const int k1 = k < 31 ? k + 1 : 31;  // 31 only where the pack does not reach plane p + 1
                const A m0 = __shfl_sync(0xffffffffu, tm, k), s0 = __shfl_sync(0xffffffffu, ts, k);
                const A h0 = __shfl_sync(0xffffffffu, tb, k);
                const A m1 = __shfl_sync(0xffffffffu, tm, k1), s1 = __shfl_sync(0xffffffffu, ts, k1);
                const A h1 = __shfl_sync(0xffffffffu, tb, k1);
                const index_t first = inner - (e - p * inner);  // values of the pack in plane p
#pragma unroll
                for (int v = 0; v < VEC; ++v) {
                    const bool lo = (index_t)v < first;
                    out[v] = (load(in[u].v[v]) - (lo ? m0 : m1)) * (lo ? s0 : s1) + (lo ? h0 : h1);
                }
            }
            if (q < packs) {
                Pack<T, VEC> pk;
#pragma unroll
                for (int v = 0; v < VEC; ++v) pk.v[v] = store<T>(out[v]);
                *reinterpret_cast<Pack<T, VEC>*>(y + q * VEC) = pk;
            }
        }
    }
    for (index_t i = packs * VEC + tid; i < size; i += (index_t)gridDim.x * BN_THREADS) {
        A mean, scale, shift;
        infer_constants<T>(running_mean, running_var, gamma, beta, (int)((i / inner) % C), eps, mean, scale,
                           shift);
        y[i] = store<T>((load(x[i]) - mean) * scale + shift);
    }
}

// Inference, channel-last (inner == 1: NHWC, 2-D), python: PACKED_INFERENCE: the
// same flat packs and one-shot grid as batchnorm_infer_packs, a pack = VEC
// consecutive channels c0 = (q % (C / VEC)) * VEC of one row (VEC = 1 when C %
// VEC != 0 or a pointer is misaligned).  A pack's VEC channels differ, so the
// constants are a table per block in shared memory (dynamic: 3 * C values of A):
// the block's threads fill it, channel c by thread c % BN_THREADS, after issuing
// their first loads (the parameter loads and the sqrt overlap them), one
// barrier, then each pack reads its VEC means / scales / shifts as vectors.
// (batchnorm_rows_normalize, the other path: a persistent grid of row lanes, each
// thread's columns fixed, constants in registers.)  Same expressions as every
// other inference kernel.  Threads 0..C-1 of the grid write mean/invstd.
// One pack a thread, float constants: 6 blocks of 256 an SM (<= 40 registers; 48
// unbounded; a bound of 8 spills 16 bytes, and double 68-124 at 6 or 8): unbounded else.
template <typename T, int U> struct rows_packs_min_blocks {
    static constexpr int value = (U == 1 && sizeof(acc_t<T>) == 4) ? 6 : 1;
};
template <typename T, typename P, typename index_t, int VEC, int U>
__global__ void __launch_bounds__(BN_THREADS, rows_packs_min_blocks<T, U>::value)
batchnorm_infer_rows_packs(const T* __restrict__ x, T* __restrict__ y, acc_t<T>* __restrict__ mean_out,
                           acc_t<T>* __restrict__ invstd_out, const P* __restrict__ running_mean,
                           const P* __restrict__ running_var, const P* __restrict__ gamma,
                           const P* __restrict__ beta, index_t packs, int C, acc_t<T> eps) {
    typedef acc_t<T> A;
    extern __shared__ __align__(16) unsigned char bn_infer_table[];
    A* t_mean = reinterpret_cast<A*>(bn_infer_table);  // C % VEC == 0: each array 16-byte aligned
    A* t_scale = t_mean + C;
    A* t_shift = t_scale + C;
    const index_t tid = (index_t)blockIdx.x * BN_THREADS + threadIdx.x;
    if (tid < C) {
        mean_out[tid] = A(load(running_mean[tid]));
        invstd_out[tid] = A(1) / sqrt(A(load(running_var[tid])) + eps);
    }
    const index_t cv = (index_t)(C / VEC);
    const index_t stride = (index_t)gridDim.x * (BN_THREADS * U);
    bool table = false;
    for (index_t b0 = (index_t)blockIdx.x * (BN_THREADS * U); b0 < packs; b0 += stride) {  // block-uniform
        Pack<T, VEC> in[U];
        load_block_packs(x, b0, packs, in);
        if (!table) {
            for (int c = threadIdx.x; c < C; c += BN_THREADS)
                infer_constants<T, false>(running_mean, running_var, gamma, beta, c, eps, t_mean[c], t_scale[c],
                                          t_shift[c]);
            __syncthreads();
            table = true;
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const index_t q = b0 + (index_t)(u * BN_THREADS + threadIdx.x);
            if (q < packs) {
                const int c0 = (int)(q % cv) * VEC;
                const Pack<A, VEC> m = *reinterpret_cast<const Pack<A, VEC>*>(t_mean + c0);
                const Pack<A, VEC> sc = *reinterpret_cast<const Pack<A, VEC>*>(t_scale + c0);
                const Pack<A, VEC> sh = *reinterpret_cast<const Pack<A, VEC>*>(t_shift + c0);
                Pack<T, VEC> pk;
#pragma unroll
                for (int v = 0; v < VEC; ++v) pk.v[v] = store<T>((load(in[u].v[v]) - m.v[v]) * sc.v[v] + sh.v[v]);
                *reinterpret_cast<Pack<T, VEC>*>(y + q * VEC) = pk;
            }
        }
    }
}

// Training forward and backward (saved statistics) in ONE launch with 16-byte
// accesses for small channels whose inner size is not a multiple of VEC
// (ResNet's 7x7 = 49: the chunk and fused kernels fall back to 4-byte
// accesses there).  Block b owns the G channels c0 = b * G .. c0 + G - 1, with
// G * inner % VEC == 0 (the host picks G = VEC / gcd(inner, VEC) and needs
// C % G == 0 and 16-byte aligned tensors), so for each outer index o those
// channels are one contiguous, aligned segment of SV = G * inner / VEC
// vectors.  Thread t loads vectors q = k * BN_THREADS + t (k < ITEMS) of the
// block's outer * SV, all before any use: o = q / SV, p = q % SV, offset
// (o * C + c0) * inner + p * VEC.  A vector's values may belong to two
// channels (several when inner < VEC): value v of vector p is in local
// channel (p * VEC + v) / inner, stepped as in batchnorm_infer_flat
// (GroupTile::each).  Per-thread sums per local channel -> G block sums with
// one pair of barriers.  Forward: the means, then the squared deviations the
// same way (two-pass exact, like a one-chunk channel of the chunk path) ->
// invstd; y from the registers: x is read once.  Backward: sum(dy) and
// sum(dy * (x - mean)) per channel at once -> dbeta, dgamma; dx from the
// registers: x and dy are read once.  The host uses them only when the
// block's G * outer * inner values fit (BN_THREADS * ITEMS * VEC, ITEMS =
// group_items<T>()).
template <typename T>
__host__ __device__ constexpr int group_items() {
    return sizeof(T) == 8 ? 8 : 32 / (16 / (int)sizeof(T));
}

// G block sums at once (every thread gets them); scratch holds 32 * G values.
template <int G, typename A>
__device__ __forceinline__ void block_sums(A (&v)[G], A* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr int warps = BN_THREADS / 32;
#pragma unroll
    for (int g = 0; g < G; ++g) v[g] = warp_sum(v[g]);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) {
#pragma unroll
        for (int g = 0; g < G; ++g) scratch[g * 32 + warp] = v[g];
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < G; ++g) v[g] = warp_sum(lane < warps ? scratch[g * 32 + lane] : A(0));
}

// v[ch] for a runtime ch < G without local memory.
template <int G, typename A>
__device__ __forceinline__ A pick(const A (&v)[G], int ch) {
    A r = v[0];
#pragma unroll
    for (int g = 1; g < G; ++g)
        if (ch == g) r = v[g];
    return r;
}

// The block's vectors of a grouped kernel (see above): where vector k of this
// thread lives (off) and the local channel / position of its first value.
template <int VEC, int ITEMS, int G, typename index_t>
struct GroupTile {
    index_t SV, total, base, C, inner;
    index_t off[ITEMS];
    int ch0[ITEMS], r0[ITEMS];

    __device__ __forceinline__ GroupTile(index_t outer, index_t C_, index_t inner_) {
        C = C_;
        inner = inner_;
        SV = (index_t)G * inner / VEC;
        total = outer * SV;
        base = (index_t)blockIdx.x * G * inner;
    }
    __device__ __forceinline__ bool has(int k) const {
        return (index_t)(k * BN_THREADS + threadIdx.x) < total;
    }
    // Loads the first tensor and works out off / ch0 / r0 as the loads issue
    // (the divisions of vector k after its load, not all before the first).
    template <typename T, typename A>
    __device__ __forceinline__ void load_first(const T* __restrict__ p, A (&vals)[ITEMS][VEC]) {
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
            const index_t q = (index_t)(k * BN_THREADS + threadIdx.x);
            off[k] = 0;
            ch0[k] = 0;
            r0[k] = 0;
            if (q < total) {
                const index_t o = q / SV, pv = q - o * SV;
                off[k] = o * C * inner + base + pv * VEC;
                load_pack<T, VEC>(p, off[k], vals[k]);
                const index_t e = pv * VEC, ch = e / inner;
                ch0[k] = (int)ch;
                r0[k] = (int)(e - ch * inner);
            }
        }
    }
    // Another tensor of the same shape, after load_first.
    template <typename T, typename A>
    __device__ __forceinline__ void load(const T* __restrict__ p, A (&vals)[ITEMS][VEC]) const {
#pragma unroll
        for (int k = 0; k < ITEMS; ++k)
            if (has(k)) load_pack<T, VEC>(p, off[k], vals[k]);
    }
    // f(k, v, ch) for every value this thread holds: vector k, value v, local channel ch.
    template <typename F>
    __device__ __forceinline__ void each(F f) const {
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
            if (has(k)) {
                int ch = ch0[k], r = r0[k];
#pragma unroll
                for (int v = 0; v < VEC; ++v) {
                    f(k, v, ch);
                    if (++r == (int)inner) {
                        r = 0;
                        ++ch;
                    }
                }
            }
        }
    }
    // p[vector k] = f(k, v, ch) for every vector this thread holds.
    template <typename T, typename F>
    __device__ __forceinline__ void store(T* __restrict__ p, F f) const {
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
            if (has(k)) {
                typedef decltype(f(0, 0, 0)) A;
                A out[VEC];
                int ch = ch0[k], r = r0[k];
#pragma unroll
                for (int v = 0; v < VEC; ++v) {
                    out[v] = f(k, v, ch);
                    if (++r == (int)inner) {
                        r = 0;
                        ++ch;
                    }
                }
                store_pack<T, VEC>(p, off[k], out);
            }
        }
    }
};

template <typename T, typename P, typename index_t, int VEC, int G>
__global__ void __launch_bounds__(BN_THREADS)
batchnorm_train_grouped(const T* __restrict__ x, T* __restrict__ y, acc_t<T>* __restrict__ mean_out,
                        acc_t<T>* __restrict__ invstd_out, P* __restrict__ running_mean,
                        P* __restrict__ running_var, const P* __restrict__ gamma, const P* __restrict__ beta,
                        index_t outer, index_t C, index_t inner, acc_t<T> eps, acc_t<T> momentum,
                        acc_t<T> unbias, int update_running) {
    typedef acc_t<T> A;
    constexpr int ITEMS = group_items<T>();
    __shared__ A scratch[32 * G];
    const int c0 = (int)blockIdx.x * G;
    GroupTile<VEC, ITEMS, G, index_t> tile(outer, C, inner);
    A vals[ITEMS][VEC];
    tile.load_first(x, vals);
    A sum[G];
#pragma unroll
    for (int g = 0; g < G; ++g) sum[g] = 0;
    tile.each([&](int k, int v, int ch) {
#pragma unroll
        for (int g = 0; g < G; ++g)
            if (ch == g) sum[g] += vals[k][v];
    });
    block_sums<G>(sum, scratch);
    const A count = A(outer * inner);
    A mean[G], m2[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        mean[g] = sum[g] / count;
        m2[g] = 0;
    }
    tile.each([&](int k, int v, int ch) {
        const A d = vals[k][v] - pick<G>(mean, ch);
#pragma unroll
        for (int g = 0; g < G; ++g)
            if (ch == g) m2[g] += d * d;
    });
    block_sums<G>(m2, scratch);
    A scale[G], shift[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const A var = m2[g] / count;
        const A invstd = A(1) / sqrt(var + eps);
        if ((int)threadIdx.x == g) {
            write_statistics(c0 + g, mean[g], var, invstd, mean_out, invstd_out, running_mean, running_var,
                             momentum, unbias, update_running);
        }
        scale[g] = invstd * A(load(gamma[c0 + g]));
        shift[g] = A(load(beta[c0 + g]));
    }
    tile.store(y, [&](int k, int v, int ch) {
        return (vals[k][v] - pick<G>(mean, ch)) * pick<G>(scale, ch) + pick<G>(shift, ch);
    });
}

template <typename T, typename P, typename index_t, int VEC, int G>
__global__ void __launch_bounds__(BN_THREADS)
batchnorm_backward_grouped(const T* __restrict__ x, const T* __restrict__ dy, const acc_t<T>* __restrict__ mean,
                           const acc_t<T>* __restrict__ invstd, const P* __restrict__ gamma, T* __restrict__ dx,
                           P* __restrict__ dgamma, P* __restrict__ dbeta, index_t outer, index_t C,
                           index_t inner) {
    typedef acc_t<T> A;
    constexpr int ITEMS = group_items<T>();
    __shared__ A scratch[32 * 2 * G];
    const int c0 = (int)blockIdx.x * G;
    GroupTile<VEC, ITEMS, G, index_t> tile(outer, C, inner);
    A xs[ITEMS][VEC], ds[ITEMS][VEC];
    tile.load_first(x, xs);
    tile.load(dy, ds);
    A m[G], s[G], sums[2 * G];  // sums: sum(dy) per channel, then sum(dy * (x - mean))
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m[g] = mean[c0 + g];
        s[g] = invstd[c0 + g];
        sums[g] = sums[G + g] = 0;
    }
    tile.each([&](int k, int v, int ch) {
        const A d = ds[k][v], xc = xs[k][v] - pick<G>(m, ch);
#pragma unroll
        for (int g = 0; g < G; ++g) {
            if (ch == g) {
                sums[g] += d;
                sums[G + g] += d * xc;
            }
        }
    });
    block_sums<2 * G>(sums, scratch);
    const A n = A(outer * inner);
    A scale[G], mean_dy[G], mean_dy_xhat[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const A gx = sums[G + g] * s[g];
        if ((int)threadIdx.x == g) {
            dbeta[c0 + g] = store<P>(sums[g]);
            dgamma[c0 + g] = store<P>(gx);
        }
        scale[g] = A(load(gamma[c0 + g])) * s[g];
        mean_dy[g] = sums[g] / n;
        mean_dy_xhat[g] = gx / n;
    }
    tile.store(dx, [&](int k, int v, int ch) {
        const A xhat = (xs[k][v] - pick<G>(m, ch)) * pick<G>(s, ch);
        return pick<G>(scale, ch) * (ds[k][v] - pick<G>(mean_dy, ch) - xhat * pick<G>(mean_dy_xhat, ch));
    });
}

// Strided grouped kernels (batchnorm_train_strided / batchnorm_backward_strided):
// the grouped kernels' block of G channels (same G, same 16-byte vectors
// crossing channel boundaries), with the thread mapping turned so that all the
// vectors of one thread share their place in the sample.  The block's
// SV = G * inner / VEC vectors of one sample (outer index o) are taken by SV
// consecutive threads, M = BN_THREADS / SV (rounded down) samples at a time:
// thread t holds vector p = t % SV of samples o = t / SV + k * M, k < ITEMS
// (BN_STRIDED_ITEMS; Python needs ceil(outer / M) <= ITEMS, SV <= 256 and
// inner > VEC, and launches 32 * ceil(SV * M / 32) threads; threads past
// SV * M hold nothing).  With inner > VEC a vector spans at most two channels:
// values v < split are in local channel c, the others in c + 1, the same for
// every k, so a thread needs two channels' statistics, never G: its partial
// sums go to shared memory as a (lo, hi) pair, warp g adds channel g's
// contributions over the threads in thread order (then a shuffle tree), and
// each thread reads back its two channels' totals (channel_sums: two barriers,
// deterministic).  The offsets step by M * C * inner.  Values stay raw 16-byte
// packs (4 registers in every type) and are converted where used.
// Why: the grouped kernels take 96-150 registers (G sums, scales and shifts
// per thread, an offset / channel / position per vector), one or two resident
// blocks of 256 threads an SM, so ResNet-50's 32x2048x7x7 (512 blocks of 4
// channels) ran in two waves of load -> block sums -> store (float; float16
// missed them: 8 x 32 x 49 values a block); these are bounded to 64 registers
// (__launch_bounds__(256, 4)): 528 resident blocks, one wave.  The backward
// stages dy in shared memory (cp.async; each thread reads back only its own
// slots, so no barrier) so that x and dy do not both take registers.
#define BN_STRIDED_ITEMS 8

// A 16-bit value converted where it is used, each time: the conversion as
// volatile asm cannot be shared between the passes, so the compiler keeps the
// raw packs (4 registers a 16-byte vector) instead of 8 floats a vector.
template <typename T> __device__ __forceinline__ acc_t<T> fresh(const T& v) { return load(v); }
template <> __device__ __forceinline__ float fresh<half_t>(const half_t& v) {
    float f;
    asm volatile("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
}
template <> __device__ __forceinline__ float fresh<bfloat16_t>(const bfloat16_t& v) {
    unsigned u;
    asm volatile("mov.b32 %0, {%1, %2};" : "=r"(u) : "h"((unsigned short)0), "h"(v.bits));
    return __uint_as_float(u);
}

// Where a strided-kernel thread's vectors are: the first one's offset, the step
// between them, how many it holds; the local channel c of its first values and
// `split`, the count of its values in c (the rest are in c + 1, or none).
template <int VEC, int G, typename index_t>
struct StridedPlace {
    index_t off, step;
    int items, c, split;

    __device__ __forceinline__ StridedPlace(index_t outer, index_t C, index_t inner, int sv, int m) {
        const int t = threadIdx.x;
        const int pv = t % sv, o0 = t / sv;
        items = 0;
        if (t < sv * m && (index_t)o0 < outer) {
            const index_t n = (outer - 1 - (index_t)o0) / (index_t)m + 1;  // o0 + k * m < outer
            items = n < (index_t)BN_STRIDED_ITEMS ? (int)n : BN_STRIDED_ITEMS;
        }
        off = ((index_t)o0 * C + (index_t)blockIdx.x * G) * inner + (index_t)pv * VEC;
        step = (index_t)m * C * inner;
        const int e = pv * VEC, in = (int)inner;
        c = e / in;
        const int left = in - (e - c * in);  // values left in channel c
        split = left < VEC ? left : VEC;
    }
    // Per-value partials -> (the sum of channel c's, the sum of channel c + 1's), value order.
    template <typename A>
    __device__ __forceinline__ void split_sum(const A (&part)[VEC], A& lo, A& hi) const {
        lo = 0;
        hi = 0;
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            if (v < split) lo += part[v];
            else hi += part[v];
        }
    }
};

// Shared memory of channel_sums for K quantities.
template <int K, typename A>
struct ChannelScratch {
    A lo[K][BN_THREADS];
    A hi[K][BN_THREADS];
    A total[K][8];  // G <= 8
    int ch[BN_THREADS];
};

// Block sums of K quantities per local channel: thread t contributes lo[k] to
// its channel c and hi[k] to c + 1; on return lo[k] / hi[k] hold the block
// totals of channels c and c + 1 (hi: of c when c + 1 == G), and s.total[k][g]
// every channel's (for the writers of per-channel outputs).  Warp g adds
// channel g's contributions lane-strided in thread order, then warp_sum: the
// same order in every launch.  Called by all threads; two barriers; s may be
// reused by the next call (its writes follow the first barrier of that call,
// which every reader of this call's totals has passed).
template <int K, int G, typename A>
__device__ __forceinline__ void channel_sums(A (&lo)[K], A (&hi)[K], int c, ChannelScratch<K, A>& s) {
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5, warps = (int)(blockDim.x >> 5);
#pragma unroll
    for (int k = 0; k < K; ++k) {
        s.lo[k][t] = lo[k];
        s.hi[k][t] = hi[k];
    }
    s.ch[t] = c;
    __syncthreads();
    for (int g = warp; g < G; g += warps) {
        A r[K];
#pragma unroll
        for (int k = 0; k < K; ++k) r[k] = 0;
        for (int u = lane; u < (int)blockDim.x; u += 32) {
            const int cu = s.ch[u];
#pragma unroll
            for (int k = 0; k < K; ++k) r[k] += cu == g ? s.lo[k][u] : (cu + 1 == g ? s.hi[k][u] : A(0));
        }
#pragma unroll
        for (int k = 0; k < K; ++k) {
            r[k] = warp_sum(r[k]);
            if (lane == 0) s.total[k][g] = r[k];
        }
    }
    __syncthreads();
    const int c1 = c + 1 < G ? c + 1 : c;
#pragma unroll
    for (int k = 0; k < K; ++k) {
        lo[k] = s.total[k][c];
        hi[k] = s.total[k][c1];
    }
}

template <typename T, typename P, typename index_t, int VEC, int G>
__global__ void __launch_bounds__(BN_THREADS, 4)
batchnorm_train_strided(const T* __restrict__ x, T* __restrict__ y, acc_t<T>* __restrict__ mean_out,
                        acc_t<T>* __restrict__ invstd_out, P* __restrict__ running_mean,
                        P* __restrict__ running_var, const P* __restrict__ gamma, const P* __restrict__ beta,
                        index_t outer, index_t C, index_t inner, acc_t<T> eps, acc_t<T> momentum,
                        acc_t<T> unbias, int update_running, int sv, int m) {
    typedef acc_t<T> A;
    constexpr int ITEMS = BN_STRIDED_ITEMS;
    __shared__ ChannelScratch<1, A> scratch;
    const int c0 = (int)blockIdx.x * G;
    const StridedPlace<VEC, G, index_t> at(outer, C, inner, sv, m);
    Pack<T, VEC> raw[ITEMS];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k)
        if (k < at.items) raw[k] = *reinterpret_cast<const Pack<T, VEC>*>(x + (at.off + (index_t)k * at.step));
    A part[VEC], lo[1], hi[1];
#pragma unroll
    for (int v = 0; v < VEC; ++v) part[v] = 0;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        if (k < at.items) {
#pragma unroll
            for (int v = 0; v < VEC; ++v) part[v] += fresh(raw[k].v[v]);
        }
    }
    at.split_sum(part, lo[0], hi[0]);
    channel_sums<1, G>(lo, hi, at.c, scratch);
    const A count = A(outer * inner);
    const A mlo = lo[0] / count, mhi = hi[0] / count;
    const int mine = (int)threadIdx.x;  // thread g < G writes channel g's statistics
    const A my_mean = mine < G ? scratch.total[0][mine] / count : A(0);
#pragma unroll
    for (int v = 0; v < VEC; ++v) part[v] = 0;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        if (k < at.items) {
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                const A d = fresh(raw[k].v[v]) - (v < at.split ? mlo : mhi);
                part[v] += d * d;
            }
        }
    }
    at.split_sum(part, lo[0], hi[0]);
    channel_sums<1, G>(lo, hi, at.c, scratch);
    if (mine < G) {
        const A var = scratch.total[0][mine] / count;
        write_statistics(c0 + mine, my_mean, var, A(1) / sqrt(var + eps), mean_out, invstd_out, running_mean,
                         running_var, momentum, unbias, update_running);
    }
    const int c1 = at.c + 1 < G ? at.c + 1 : at.c;
    const A slo = A(1) / sqrt(lo[0] / count + eps) * A(load(gamma[c0 + at.c]));
    const A shi = A(1) / sqrt(hi[0] / count + eps) * A(load(gamma[c0 + c1]));
    const A blo = A(load(beta[c0 + at.c])), bhi = A(load(beta[c0 + c1]));
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        if (k < at.items) {
            Pack<T, VEC> out;
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                const bool low = v < at.split;
                out.v[v] = store<T>((fresh(raw[k].v[v]) - (low ? mlo : mhi)) * (low ? slo : shi) + (low ? blo : bhi));
            }
            *reinterpret_cast<Pack<T, VEC>*>(y + (at.off + (index_t)k * at.step)) = out;
        }
    }
}

// 16 bytes global -> shared memory, asynchronously where the GPU can (sm_80+).
__device__ __forceinline__ void bn_copy16_async(void* smem, const void* __restrict__ gmem) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared_address(smem)), "l"(gmem) : "memory");
#else
    *reinterpret_cast<int4*>(smem) = *reinterpret_cast<const int4*>(gmem);
#endif
}

__device__ __forceinline__ void bn_copy_async_wait_all() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

template <typename T, typename P, typename index_t, int VEC, int G>
__global__ void __launch_bounds__(BN_THREADS, 4)
batchnorm_backward_strided(const T* __restrict__ x, const T* __restrict__ dy, const acc_t<T>* __restrict__ mean,
                           const acc_t<T>* __restrict__ invstd, const P* __restrict__ gamma, T* __restrict__ dx,
                           P* __restrict__ dgamma, P* __restrict__ dbeta, index_t outer, index_t C,
                           index_t inner, int sv, int m) {
    typedef acc_t<T> A;
    constexpr int ITEMS = BN_STRIDED_ITEMS;
    __shared__ Pack<T, VEC> dys[ITEMS * BN_THREADS];  // thread t's item k at k * BN_THREADS + t
    __shared__ ChannelScratch<2, A> scratch;
    const int c0 = (int)blockIdx.x * G;
    const StridedPlace<VEC, G, index_t> at(outer, C, inner, sv, m);
    Pack<T, VEC> xs[ITEMS];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        if (k < at.items) {
            const index_t o = at.off + (index_t)k * at.step;
            bn_copy16_async(&dys[k * BN_THREADS + threadIdx.x], dy + o);
            xs[k] = *reinterpret_cast<const Pack<T, VEC>*>(x + o);
        }
    }
    const int c1 = at.c + 1 < G ? at.c + 1 : at.c;
    const A mlo = mean[c0 + at.c], mhi = mean[c0 + c1];
    bn_copy_async_wait_all();  // this thread's dy slots (only it reads them)
    A lo[2], hi[2];  // sum(dy), then sum(dy * (x - mean)), of channels c and c + 1
    {
        // Partials per pair of values (VEC / 2 chains a quantity; a pair that
        // straddles the split is split), then per channel in pair order.
        constexpr int PAIRS = VEC / 2;
        A d_lo[PAIRS], d_hi[PAIRS], dx_lo[PAIRS], dx_hi[PAIRS];
#pragma unroll
        for (int q = 0; q < PAIRS; ++q) d_lo[q] = d_hi[q] = dx_lo[q] = dx_hi[q] = 0;
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
            if (k < at.items) {
                const Pack<T, VEC> d = dys[k * BN_THREADS + threadIdx.x];
#pragma unroll
                for (int v = 0; v < VEC; ++v) {
                    const bool low = v < at.split;
                    const A dv = fresh(d.v[v]);
                    const A p = dv * (fresh(xs[k].v[v]) - (low ? mlo : mhi));
                    if (low) {
                        d_lo[v / 2] += dv;
                        dx_lo[v / 2] += p;
                    } else {
                        d_hi[v / 2] += dv;
                        dx_hi[v / 2] += p;
                    }
                }
            }
        }
        lo[0] = hi[0] = lo[1] = hi[1] = 0;
#pragma unroll
        for (int q = 0; q < PAIRS; ++q) {
            lo[0] += d_lo[q];
            hi[0] += d_hi[q];
            lo[1] += dx_lo[q];
            hi[1] += dx_hi[q];
        }
    }
    channel_sums<2, G>(lo, hi, at.c, scratch);
    const int mine = (int)threadIdx.x;  // thread g < G writes channel g's gradients
    if (mine < G) {
        dbeta[c0 + mine] = store<P>(scratch.total[0][mine]);
        dgamma[c0 + mine] = store<P>(scratch.total[1][mine] * invstd[c0 + mine]);
    }
    const A n = A(outer * inner);
    const A ilo = invstd[c0 + at.c], ihi = invstd[c0 + c1];
    const A slo = A(load(gamma[c0 + at.c])) * ilo, shi = A(load(gamma[c0 + c1])) * ihi;
    const A dlo = lo[0] / n, dhi = hi[0] / n;  // mean of dy
    const A xlo = lo[1] * ilo / n, xhi = hi[1] * ihi / n;  // mean of dy * xhat
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        if (k < at.items) {
            const Pack<T, VEC> d = dys[k * BN_THREADS + threadIdx.x];
            Pack<T, VEC> out;
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                const bool low = v < at.split;
                const A xhat = (fresh(xs[k].v[v]) - (low ? mlo : mhi)) * (low ? ilo : ihi);
                out.v[v] = store<T>((low ? slo : shi) * (fresh(d.v[v]) - (low ? dlo : dhi) - xhat * (low ? xlo : xhi)));
            }
            *reinterpret_cast<Pack<T, VEC>*>(dx + (at.off + (index_t)k * at.step)) = out;
        }
    }
}

// Pass 1 of the backward: per chunk, sum(dy) and sum(dy * xhat) into part_dy /
// part_dy_xhat; the last block of channel c to finish (arrive[c]) sums them in
// a fixed order (merge_sums) into sums[c] / sums[C + c] and writes dbeta[c] /
// dgamma[c].
template <typename T, typename P, typename index_t, int VEC>
__global__ void __launch_bounds__(BN_THREADS)
batchnorm_backward_reduce(const T* __restrict__ x, const T* __restrict__ dy,
                          const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ invstd,
                          acc_t<T>* __restrict__ part_dy, acc_t<T>* __restrict__ part_dy_xhat,
                          acc_t<T>* __restrict__ sums, P* __restrict__ dgamma, P* __restrict__ dbeta,
                          BN_SHAPE, int reverse, unsigned* __restrict__ arrive) {
    typedef acc_t<T> A;
    constexpr int ITEMS = BN_PER_THREAD / VEC;
    __shared__ A scratch[32];
    int c, split;
    chunk_of_block(splits, reverse, c, split);
    const index_t n = outer * inner;
    const A m = mean[c], s = invstd[c];
    const index_t start = (index_t)split * BN_CHUNK;
    A xs[ITEMS][VEC], ds[ITEMS][VEC];
    load_chunk_pair<T, VEC, ITEMS>(x, dy, start, n, c, C, inner, xs, ds);
    A g, gx;
    chunk_grad_sums(xs, ds, start, n, m, scratch, g, gx);
    if (threadIdx.x == 0) {
        part_dy[c * splits + split] = g;  // by (c, split): the grid may run backwards
        part_dy_xhat[c * splits + split] = gx * s;
    }
    if (last_to_arrive(arrive + c, splits)) {
        merge_sums((const volatile A*)part_dy, (const volatile A*)part_dy_xhat, c, splits, g, gx);
        if (threadIdx.x == 0) {
            write_grad_sums(c, C, g, gx, sums, dbeta, dgamma);
        }
    }
}

// Pass 2 of the backward: dx = gamma * invstd * (dy - sum(dy) / n - xhat *
// sum(dy * xhat) / n), the sums from pass 1 (sums[c], sums[C + c]).
template <typename T, typename P, typename index_t, int VEC>
__global__ void __launch_bounds__(BN_THREADS)
batchnorm_backward_data(const T* __restrict__ x, const T* __restrict__ dy,
                        const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ invstd,
                        const P* __restrict__ gamma, const acc_t<T>* __restrict__ sums, T* __restrict__ dx,
                        BN_SHAPE, int reverse) {
    typedef acc_t<T> A;
    constexpr int ITEMS = BN_PER_THREAD / VEC;
    int c, split;
    chunk_of_block(splits, reverse, c, split);
    const index_t n = outer * inner;
    const A m = mean[c], s = invstd[c];
    const index_t start = (index_t)split * BN_CHUNK;
    A xs[ITEMS][VEC], ds[ITEMS][VEC];
    load_chunk_pair<T, VEC, ITEMS>(x, dy, start, n, c, C, inner, xs, ds);
    store_chunk_dx(dx, xs, ds, start, n, c, C, inner, m, s, A(load(gamma[c])) * s, sums[c] / A(n),
                   sums[C + c] / A(n));
}

// ---------------------------------------------------------------------------
// Single-read paths (issue 5, v3): training forward and backward (saved
// statistics given) in ONE launch that reads x (and dy) once.  Measured on the
// H100 the backward wins (bn_big 0.28 vs 0.35 ms) and is the default; the
// forward loses to the two-pass path when a channel spans several chunks
// (round barrier latency > the second read), so Python uses it only for
// one-chunk channels (dnnprims/normalization.py: FUSED_FORWARD_MIN_BYTES).
//
// A persistent grid of G blocks, G = the number of blocks of this kernel that
// are resident at once on the device (Python asks the occupancy API), so
// every block runs concurrently.  The grid works in rounds of `per_round`
// whole channels: block b takes chunk b % splits of channel round * per_round
// + b / splits (blocks past per_round * splits exit).  A block loads its chunk
// into registers (the same BN_CHUNK-value chunks and thread mapping as the
// two-pass kernels), writes its partials (chunk mean and M2; or sum(dy) and
// sum(dy * xhat)), then waits at a per-channel barrier in global memory
// (channel_barrier: arrival and departure counters, reset by the last block
// to leave, so no zeroing launch is needed).  After the barrier every block merges its channel's
// partials in the same fixed order as the two-pass path (bitwise the same
// statistics) and writes its outputs from the registers: x never comes back
// from memory.  The floor drops from 3 passes over the tensor to 2 (forward)
// and from 5 to 3 (backward).
//
// Deadlock freedom needs every block of a channel resident while it waits.
// The host launches every kernel with a grid barrier through the driver's
// COOPERATIVE launch (cuLaunchCooperativeKernel, dnnprims/_kernels.py), which
// guarantees that all blocks of the grid are resident at once -- whatever
// else runs on the device (other streams, MPS clients, a smaller partition)
// -- or refuses the launch (the host then takes the multi-launch path).  So a
// barrier cannot wait forever.  As a last guard (a debugger stopping a
// block, a driver that breaks the guarantee) a block waits at most ~2^21
// polls (~1 s) and then goes on WITHOUT the other blocks' partials:
// channel_barrier returns false and everything that block computes from the
// merged values -- its outputs, the statistics and gradients it writes -- is
// NaN (barrier_failed), never a plausible wrong value.  The counters still
// come back to zero: the late block arrives (the count reaches `splits`, it
// does not wait), departs, and the last departure resets both.  No flag
// outlives the launch (the result is the block's own), so nothing needs a reset.
//
// Partials are read after the barrier with volatile loads (L2, never a stale L1 line).

// Arrive at channel c's barrier and wait for all `splits` blocks of it.
// arrive[c] counts arrivals, arrive[C + c] departures; the last block to
// depart sets both back to zero, so the next launch finds them zeroed.
// Returns (to every thread of the block) false when the wait timed out.
__device__ __forceinline__ bool channel_barrier(unsigned* __restrict__ arrive, int c, int C, int splits) {
    __syncthreads();  // thread 0 stored the partials; its fence below orders them before the arrival
    int arrived = 1;
    if (threadIdx.x == 0 && splits > 1) {
        __threadfence();
        atomicAdd(arrive + c, 1u);
        const volatile unsigned* a = arrive + c;
        int polls = 0;
        while ((int)*a < splits) {
            __nanosleep(64);
            if (++polls > (1 << 21)) {
                arrived = 0;
                break;
            }
        }
        __threadfence();
        if (atomicAdd(arrive + C + c, 1u) == (unsigned)(splits - 1)) {
            arrive[c] = 0u;
            arrive[C + c] = 0u;
        }
    }
    return __syncthreads_and(arrived) != 0;
}

// A fused block's first channel and its chunk; false for blocks past the
// per_round * splits that a round uses.
__device__ __forceinline__ bool fused_block(int per_round, int splits, int& local_c, int& split) {
    if ((int)blockIdx.x >= per_round * splits) return false;
    local_c = (int)blockIdx.x / splits;
    split = (int)blockIdx.x - local_c * splits;
    return true;
}

#define BN_FUSED_PARAMS BN_SHAPE, int per_round, unsigned* __restrict__ arrive

// PREFETCH: the next round's chunk is loaded into a second register set right
// after this round's partials are stored, so its load overlaps the barrier wait
// and this round's stores (more registers: fewer resident blocks).
template <typename T, typename P, typename index_t, int VEC, bool PREFETCH>
__global__ void __launch_bounds__(BN_THREADS)
batchnorm_train_fused(const T* __restrict__ x, T* __restrict__ y, acc_t<T>* __restrict__ part_mean,
                      acc_t<T>* __restrict__ part_m2, acc_t<T>* __restrict__ mean_out,
                      acc_t<T>* __restrict__ invstd_out, P* __restrict__ running_mean,
                      P* __restrict__ running_var, const P* __restrict__ gamma,
                      const P* __restrict__ beta, BN_FUSED_PARAMS, acc_t<T> eps, acc_t<T> momentum,
                      acc_t<T> unbias, int update_running) {
    typedef acc_t<T> A;
    constexpr int ITEMS = BN_PER_THREAD / VEC;
    __shared__ A scratch[32];
    int local_c, split;
    if (!fused_block(per_round, splits, local_c, split)) return;
    const index_t n = outer * inner;
    const index_t start = (index_t)split * BN_CHUNK;
    const A count = chunk_count<A>(split, n);
    A vals[ITEMS][VEC];
    if (PREFETCH && local_c < (int)C) load_chunk<T, VEC, ITEMS>(x, start, n, local_c, C, inner, vals);
    for (int c = local_c; c < (int)C; c += per_round) {
        if (!PREFETCH) load_chunk<T, VEC, ITEMS>(x, start, n, c, C, inner, vals);
        A chunk_mean, m2;
        chunk_mean_m2(vals, start, n, count, scratch, chunk_mean, m2);
        if (threadIdx.x == 0) {
            part_mean[c * splits + split] = chunk_mean;
            part_m2[c * splits + split] = m2;
        }
        A next[PREFETCH ? ITEMS : 1][VEC];
        if (PREFETCH && c + per_round < (int)C) {
            load_chunk<T, VEC, PREFETCH ? ITEMS : 1>(x, start, n, c + per_round, C, inner, next);
        }
        const bool arrived = channel_barrier(arrive, c, (int)C, splits);
        A mean, invstd;
        channel_statistics((const volatile A*)part_mean, (const volatile A*)part_m2, c, split, splits, n, eps,
                           mean_out, invstd_out, running_mean, running_var, momentum, unbias, update_running,
                           mean, invstd, arrived);
        store_chunk_normalized(y, vals, start, n, c, C, inner, mean, invstd * A(load(gamma[c])),
                               A(load(beta[c])));
        if (PREFETCH) {
#pragma unroll
            for (int k = 0; k < ITEMS; ++k)
#pragma unroll
                for (int v = 0; v < VEC; ++v) vals[k][v] = next[k < (PREFETCH ? ITEMS : 1) ? k : 0][v];
        }
    }
}

template <typename T, typename P, typename index_t, int VEC>
__global__ void __launch_bounds__(BN_THREADS)
batchnorm_backward_fused(const T* __restrict__ x, const T* __restrict__ dy,
                         const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ invstd,
                         const P* __restrict__ gamma, acc_t<T>* __restrict__ part_dy,
                         acc_t<T>* __restrict__ part_dy_xhat, T* __restrict__ dx,
                         P* __restrict__ dgamma, P* __restrict__ dbeta, BN_FUSED_PARAMS) {
    typedef acc_t<T> A;
    constexpr int ITEMS = BN_PER_THREAD / VEC;
    __shared__ A scratch[32];
    int local_c, split;
    if (!fused_block(per_round, splits, local_c, split)) return;
    const index_t n = outer * inner;
    const index_t start = (index_t)split * BN_CHUNK;
    for (int c = local_c; c < (int)C; c += per_round) {
        const A m = mean[c], s = invstd[c];
        A xs[ITEMS][VEC], ds[ITEMS][VEC];
        load_chunk_pair<T, VEC, ITEMS>(x, dy, start, n, c, C, inner, xs, ds);
        A g, gx;
        chunk_grad_sums(xs, ds, start, n, m, scratch, g, gx);
        if (threadIdx.x == 0) {
            part_dy[c * splits + split] = g;
            part_dy_xhat[c * splits + split] = gx * s;
        }
        const bool arrived = channel_barrier(arrive, c, (int)C, splits);
        A sg, sgx;
        merge_sums((const volatile A*)part_dy, (const volatile A*)part_dy_xhat, c, splits, sg, sgx);
        if (!arrived) sg = sgx = barrier_failed<A>();
        if (split == 0 && threadIdx.x == 0) {
            dbeta[c] = store<P>(sg);
            dgamma[c] = store<P>(sgx);
        }
        store_chunk_dx(dx, xs, ds, start, n, c, C, inner, m, s, A(load(gamma[c])) * s, sg / A(n), sgx / A(n));
    }
}

// ---------------------------------------------------------------------------
// Cluster kernels (sm_90+; NCHW whose planes are whole 16-byte vectors, 16-byte
// aligned tensors): x (and dy) read from DRAM once.  One cluster of CL blocks
// per channel (blockIdx.x = c * CL + rank); block `rank` takes planes n = rank,
// rank + CL, ... of channel c and bulk-copies them into its dynamic shared
// memory (thread 0, one mbarrier; the backward's dy planes after x's).  From
// there: the block's partial statistics / sums into a shared slot; a cluster
// barrier; every block merges the CL slots through distributed shared memory
// in rank order, so all hold the same, bitwise reproducible result; then each
// writes its planes' outputs from shared memory.  A block exits only after the
// cluster's second barrier (the others may still read its slot).  No grid
// barrier: the hardware co-schedules a cluster's blocks, and clusters are
// independent, so any grid runs.  Why: the two-pass kernels re-read x (and dy),
// from DRAM once the tensors outgrow L2 (bn_big: 205 MB), and the single-read
// fused kernels above pay a global per-round barrier (notes/mem_poolbn.md);
// H100 figures in notes/cluster.md.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define BN_CLUSTER_DIMS(n)
#else
#define BN_CLUSTER_DIMS(n) __cluster_dims__(n, 1, 1)
#endif

// Planes of this cluster block (of `outer`) for channel c of K tensors, bulk
// copied to smem (tensor k's at smem + k * planes * inner), waited for by every
// thread.  Returns the number of planes.
template <int CL, int K, typename T, typename index_t>
__device__ __forceinline__ index_t cluster_fetch_planes(T* smem, const T* const (&src)[K], unsigned long long* bar,
                                                        unsigned rank, index_t c, index_t outer, index_t C,
                                                        index_t inner) {
    const index_t planes = (index_t)rank < outer ? (outer - 1 - (index_t)rank) / CL + 1 : 0;
    if (threadIdx.x == 0) {
        mbarrier_init1(bar);
        const unsigned plane_bytes = (unsigned)(inner * sizeof(T));
        for (int t = 0; t < K; ++t)
            for (index_t k = 0; k < planes; ++k)
                bulk_copy_expect(bar, smem + (t * planes + k) * inner,
                                 src[t] + (((index_t)rank + k * CL) * C + c) * inner, plane_bytes,
                                 t == 0 && k == 0 ? (unsigned)(K * planes * plane_bytes) : 0u);
    }
    __syncthreads();  // the barrier is initialised before anyone waits on it
    if (planes > 0) mbarrier_wait(bar, 0);
    return planes;
}

// `part` (NV values in this block's shared memory, thread 0 wrote them) of every
// block of the cluster, folded in rank order by merge(acc, other) from `init`:
// the same result in every block, to every thread.  Ends with this block's
// arrival at the cluster's second barrier: the caller waits on it
// (cluster_wait) before it exits.
template <int CL, int NV, typename A, typename Merge>
__device__ __forceinline__ void cluster_merge(const A* part, const A (&init)[NV], A (&out)[NV], Merge merge) {
    __shared__ A result[NV];
    cluster_arrive();  // every block's slot is written ...
    cluster_wait();
    if (threadIdx.x == 0) {  // ... and folded in rank order by every block alike
        A acc[NV], other[NV];
        for (int v = 0; v < NV; ++v) acc[v] = init[v];
        for (unsigned r = 0; r < (unsigned)CL; ++r) {
            for (int v = 0; v < NV; ++v) other[v] = cluster_load(part + v, r);
            merge(acc, other);
        }
        for (int v = 0; v < NV; ++v) result[v] = acc[v];
    }
    cluster_arrive();  // done reading the others' slots
    __syncthreads();
    for (int v = 0; v < NV; ++v) out[v] = result[v];
}

template <typename T, typename P, typename index_t, int CL>
__global__ void BN_CLUSTER_DIMS(CL) __launch_bounds__(BN_THREADS)
batchnorm_train_cluster(const T* __restrict__ x, T* __restrict__ y, acc_t<T>* __restrict__ mean_out,
                        acc_t<T>* __restrict__ invstd_out, P* __restrict__ running_mean,
                        P* __restrict__ running_var, const P* __restrict__ gamma, const P* __restrict__ beta,
                        index_t outer, index_t C, index_t inner, acc_t<T> eps, acc_t<T> momentum,
                        acc_t<T> unbias, int update_running) {
#if __CUDA_ARCH__ >= 900
    typedef acc_t<T> A;
    constexpr int VEC = 16 / (int)sizeof(T);
    typedef Pack<T, VEC> V;
    extern __shared__ __align__(16) unsigned char bn_cluster_smem[];
    const V* buf = reinterpret_cast<const V*>(bn_cluster_smem);
    __shared__ __align__(8) unsigned long long bar;
    __shared__ A part[3];  // this block's (count, mean, M2), read by the whole cluster
    __shared__ A scratch[32];
    const unsigned rank = cluster_rank();
    const index_t c = (index_t)(blockIdx.x / CL);
    const T* const src[1] = {x};
    const index_t planes = cluster_fetch_planes<CL, 1>(reinterpret_cast<T*>(bn_cluster_smem), src, &bar, rank, c,
                                                       outer, C, inner);
    const index_t pv = inner / VEC, mv = planes * pv;  // vectors of a plane, of this block
    A sum = 0;
#pragma unroll 4
    for (index_t i = threadIdx.x; i < mv; i += BN_THREADS) {
        const V pk = buf[i];
#pragma unroll
        for (int v = 0; v < VEC; ++v) sum += A(load(pk.v[v]));
    }
    const A count = A(mv * VEC);
    sum = block_sum(sum, scratch);
    const A mu = count > A(0) ? sum / count : A(0);
    A q = 0;
#pragma unroll 4
    for (index_t i = threadIdx.x; i < mv; i += BN_THREADS) {
        const V pk = buf[i];
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            const A d = A(load(pk.v[v])) - mu;
            q += d * d;
        }
    }
    q = block_sum(q, scratch);
    if (threadIdx.x == 0) {
        part[0] = count;
        part[1] = mu;
        part[2] = q;
    }
    const A init[3] = {A(0), A(0), A(0)};
    A merged[3];  // (count, mean, M2) of the channel
    cluster_merge<CL>(part, init, merged,
                      [](A (&a)[3], const A (&b)[3]) { chan_merge(a[0], a[1], a[2], b[0], b[1], b[2]); });
    const A mean = merged[1], var = merged[2] / merged[0];
    const A invstd = A(1) / sqrt(var + eps);
    if (rank == 0 && threadIdx.x == 0) {
        write_statistics((int)c, mean, var, invstd, mean_out, invstd_out, running_mean, running_var, momentum,
                         unbias, update_running);
    }
    const A scale = invstd * A(load(gamma[c])), shift = A(load(beta[c]));
#pragma unroll 4
    for (index_t i = threadIdx.x; i < mv; i += BN_THREADS) {
        const index_t k = i / pv, j = i - k * pv;
        const V pk = buf[i];
        A out[VEC];
#pragma unroll
        for (int v = 0; v < VEC; ++v) out[v] = (A(load(pk.v[v])) - mean) * scale + shift;
        store_pack<T, VEC>(y, (((index_t)rank + k * CL) * C + c) * inner + j * VEC, out);
    }
    cluster_wait();
#else
    __trap();  // Python launches it only on sm_90+
#endif
}

// The backward with saved statistics: dbeta = sum(dy), dgamma = sum(dy * xhat),
// dx = gamma * invstd * (dy - dbeta / n - xhat * dgamma / n) (store_chunk_dx's
// formula), x and dy read once.
template <typename T, typename P, typename index_t, int CL>
__global__ void BN_CLUSTER_DIMS(CL) __launch_bounds__(BN_THREADS)
batchnorm_backward_cluster(const T* __restrict__ x, const T* __restrict__ dy,
                           const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ invstd,
                           const P* __restrict__ gamma, T* __restrict__ dx, P* __restrict__ dgamma,
                           P* __restrict__ dbeta, index_t outer, index_t C, index_t inner) {
#if __CUDA_ARCH__ >= 900
    typedef acc_t<T> A;
    constexpr int VEC = 16 / (int)sizeof(T);
    typedef Pack<T, VEC> V;
    extern __shared__ __align__(16) unsigned char bn_cluster_smem[];
    const V* buf = reinterpret_cast<const V*>(bn_cluster_smem);
    __shared__ __align__(8) unsigned long long bar;
    __shared__ A part[2];  // this block's sum(dy), sum(dy * (x - mean)), read by the whole cluster
    __shared__ A scratch[32];
    const unsigned rank = cluster_rank();
    const index_t c = (index_t)(blockIdx.x / CL);
    const T* const src[2] = {x, dy};
    const index_t planes = cluster_fetch_planes<CL, 2>(reinterpret_cast<T*>(bn_cluster_smem), src, &bar, rank, c,
                                                       outer, C, inner);
    const index_t pv = inner / VEC, mv = planes * pv;  // vectors of a plane, of this block (per tensor)
    const V* dbuf = buf + mv;
    const A m = mean[c], s = invstd[c];
    A g = 0, gx = 0;
#pragma unroll 4
    for (index_t i = threadIdx.x; i < mv; i += BN_THREADS) {
        const V xk = buf[i], dk = dbuf[i];
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            const A d = A(load(dk.v[v]));
            g += d;
            gx += d * (A(load(xk.v[v])) - m);
        }
    }
    g = block_sum(g, scratch);
    gx = block_sum(gx, scratch);
    if (threadIdx.x == 0) {
        part[0] = g;
        part[1] = gx;
    }
    const A init[2] = {A(0), A(0)};
    A sums[2];
    cluster_merge<CL>(part, init, sums, [](A (&a)[2], const A (&b)[2]) {
        a[0] += b[0];
        a[1] += b[1];
    });
    const A sg = sums[0], sgx = sums[1] * s;
    if (rank == 0 && threadIdx.x == 0) {
        dbeta[c] = store<P>(sg);
        dgamma[c] = store<P>(sgx);
    }
    const A n = A(outer * inner), scale = A(load(gamma[c])) * s, mean_dy = sg / n, mean_dy_xhat = sgx / n;
#pragma unroll 4
    for (index_t i = threadIdx.x; i < mv; i += BN_THREADS) {
        const index_t k = i / pv, j = i - k * pv;
        const V xk = buf[i], dk = dbuf[i];
        A out[VEC];
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            const A xhat = (A(load(xk.v[v])) - m) * s;
            out[v] = scale * (A(load(dk.v[v])) - mean_dy - xhat * mean_dy_xhat);
        }
        store_pack<T, VEC>(dx, (((index_t)rank + k * CL) * C + c) * inner + j * VEC, out);
    }
    cluster_wait();
#else
    __trap();  // Python launches it only on sm_90+
#endif
}

// ---------------------------------------------------------------------------
// Channel-last paths (issue 5, v3): inner == 1, i.e. NHWC (and 2-D (N, C)):
// x is M rows of C contiguous channels.  A thread owns VEC consecutive
// channels (one 16-byte vector when C % VEC == 0 and the pointers are
// aligned) and walks rows, so a warp reads 32 consecutive vectors of a row
// (coalesced) and per-channel parameters are loaded once per thread.
//
// Mapping (every rows kernel): a block is `lanes` row lanes x `cols` vector
// columns (lanes * cols <= BN_THREADS); blockIdx.y picks the column group
// (C / VEC > cols).  Row lane g = blockIdx.x * lanes + t / cols of L =
// gridDim.x * lanes lanes; vector column cv = blockIdx.y * cols + t % cols.
//
// Training forward: rows_statistics (lane g takes batches of B contiguous
// rows, rows [(k * L + g) * B, +B); each batch exact two-pass in registers,
// Chan-merged into the lane's (count, mean, M2) per channel; one partial per
// (channel, lane) at [c * L + g]), rows_merge_statistics (a warp per channel,
// the fixed-order merge of merge_statistics: mean, invstd, running stats),
// rows_normalize.  Backward: rows_backward_reduce (per lane sums of dy and
// dy * (x - mean)), rows_backward_merge (a warp per channel: dbeta, dgamma
// and the two sums for dx), rows_backward_data.  The map kernels (normalize,
// backward data) walk the rows last to first: the reductions read the last
// rows last, so the first tens of MB they need are still in L2.  The host sizes
// every rows grid to the blocks resident at once (occupancy API): a grid of
// 1.3 waves left a tail of one block per SM for the last third of the rows.
// By default training forward and backward run instead as one launch each
// (batchnorm_rows_train_resident / batchnorm_rows_backward_resident, end of
// file; batchnorm_rows_{train,backward}_fused with ROWS_RESIDENT off).

#define ROWS_MERGE_AHEAD 8

struct RowLanes {
    int cols, lanes, lane, cv, L;
    __device__ __forceinline__ RowLanes(int cols_) {
        cols = cols_;
        lanes = BN_THREADS / cols;
        const int t = threadIdx.x;
        lane = (int)blockIdx.x * lanes + t / cols;
        cv = (int)blockIdx.y * cols + t % cols;
        L = (int)gridDim.x * lanes;
    }
    __device__ __forceinline__ bool active(int CV) const {
        return (int)threadIdx.x < lanes * cols && cv < CV;
    }
};

// Rows per register batch of rows_statistics: 8, fewer when a row's vector
// takes more than 4 registers (half types: VEC = 8 floats), so that a batch
// holds at most 32 registers of values.
template <typename T, int VEC>
__host__ __device__ constexpr int rows_batch() {
    constexpr int words = VEC * (int)sizeof(acc_t<T>) / 4;
    return words > 0 && 32 / words < 8 ? 32 / words : 8;
}

template <typename T, typename index_t, int VEC>
__global__ void __launch_bounds__(BN_THREADS)
batchnorm_rows_statistics(const T* __restrict__ x, acc_t<T>* __restrict__ part_n,
                          acc_t<T>* __restrict__ part_mean, acc_t<T>* __restrict__ part_m2,
                          index_t M, int C, int cols) {
    typedef acc_t<T> A;
    constexpr int B = rows_batch<T, VEC>();
    const RowLanes rl(cols);
    const int CV = C / VEC;
    if (!rl.active(CV)) return;
    A cnt[VEC], mu[VEC], m2[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) cnt[v] = mu[v] = m2[v] = 0;
    for (index_t r0 = (index_t)rl.lane * B; r0 < M; r0 += (index_t)rl.L * B) {
        A vals[B][VEC];
        const int rows = (int)(M - r0 < (index_t)B ? M - r0 : (index_t)B);
#pragma unroll
        for (int i = 0; i < B; ++i) {
            if (i < rows) {
                load_pack<T, VEC>(x, (r0 + i) * C + (index_t)rl.cv * VEC, vals[i]);
            } else {
#pragma unroll
                for (int v = 0; v < VEC; ++v) vals[i][v] = 0;
            }
        }
        const A nb = A(rows);
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            A s = 0;
#pragma unroll
            for (int i = 0; i < B; ++i) s += vals[i][v];
            const A mb = s / nb;
            A q = 0;
#pragma unroll
            for (int i = 0; i < B; ++i) {
                const A d = vals[i][v] - mb;
                if (i < rows) q += d * d;
            }
            chan_merge(cnt[v], mu[v], m2[v], nb, mb, q);
        }
    }
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
        const index_t o = (index_t)(rl.cv * VEC + v) * rl.L + rl.lane;
        part_n[o] = cnt[v];
        part_mean[o] = mu[v];
        part_m2[o] = m2[v];
    }
}

// One warp per channel: the fixed-order Chan merge of the L lane partials.
template <typename T, typename P>
__global__ void __launch_bounds__(BN_THREADS)
batchnorm_rows_merge_statistics(const acc_t<T>* __restrict__ part_n, const acc_t<T>* __restrict__ part_mean,
                                const acc_t<T>* __restrict__ part_m2, int L, int C,
                                acc_t<T>* __restrict__ mean_out, acc_t<T>* __restrict__ invstd_out,
                                P* __restrict__ running_mean, P* __restrict__ running_var, acc_t<T> eps,
                                acc_t<T> momentum, acc_t<T> unbias, int update_running) {
    typedef acc_t<T> A;
    const int c = (int)blockIdx.x * (BN_THREADS / 32) + (int)(threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (c >= C) return;
    A cnt = 0, mu = 0, m2 = 0;
    // ROWS_MERGE_AHEAD partials loaded before they are merged (a serial chain of
    // L / 32 dependent loads took ~20 us at L = 2112); same lane-strided order.
    for (int b0 = lane; b0 < L; b0 += 32 * ROWS_MERGE_AHEAD) {
        A pn[ROWS_MERGE_AHEAD], pm[ROWS_MERGE_AHEAD], p2[ROWS_MERGE_AHEAD];
#pragma unroll
        for (int u = 0; u < ROWS_MERGE_AHEAD; ++u) {
            const int b = b0 + 32 * u;
            const long long o = (long long)c * L + b;
            pn[u] = b < L ? part_n[o] : A(0);
            pm[u] = b < L ? part_mean[o] : A(0);
            p2[u] = b < L ? part_m2[o] : A(0);
        }
#pragma unroll
        for (int u = 0; u < ROWS_MERGE_AHEAD; ++u) chan_merge(cnt, mu, m2, pn[u], pm[u], p2[u]);
    }
    warp_chan_merge(cnt, mu, m2);
    if (lane == 0) {
        const A var = m2 / cnt;
        write_statistics(c, mu, var, A(1) / sqrt(var + eps), mean_out, invstd_out, running_mean, running_var,
                         momentum, unbias, update_running);
    }
}

// The lane's rows of the K tensors src for the single-pass rows kernels
// (normalize, backward reduce and data), U rows at a time (rows r0 + u * L, all
// loads first): body(vals, u, r) for each row r below M, vals[k][u] the row of
// src[k] as acc_t.  REVERSE: row r is read at M - 1 - r (last to first).
template <bool REVERSE, int K, typename T, int VEC, typename index_t, typename Body>
__device__ __forceinline__ void each_row(const T* const (&src)[K], const RowLanes& rl, index_t M, int C, Body body) {
    constexpr int U = 4;
    for (index_t r0 = rl.lane; r0 < M; r0 += (index_t)rl.L * U) {
        acc_t<T> vals[K][U][VEC];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const index_t r = r0 + (index_t)u * rl.L;
            if (r < M) {
#pragma unroll
                for (int k = 0; k < K; ++k)
                    load_pack<T, VEC>(src[k], (REVERSE ? M - 1 - r : r) * C + (index_t)rl.cv * VEC, vals[k][u]);
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const index_t r = r0 + (index_t)u * rl.L;
            if (r < M) body(vals, u, r);
        }
    }
}

// y = (x - mean) * invstd * gamma + beta.  TRAINING: mean/invstd from
// rows_merge_statistics; else from the running statistics (lane 0 writes them out).
template <typename T, typename P, typename index_t, int VEC, bool TRAINING>
__global__ void __launch_bounds__(BN_THREADS)
batchnorm_rows_normalize(const T* __restrict__ x, T* __restrict__ y, acc_t<T>* __restrict__ mean_io,
                         acc_t<T>* __restrict__ invstd_io, const P* __restrict__ running_mean,
                         const P* __restrict__ running_var, const P* __restrict__ gamma,
                         const P* __restrict__ beta, index_t M, int C, int cols, acc_t<T> eps) {
    typedef acc_t<T> A;
    const RowLanes rl(cols);
    const int CV = C / VEC;
    if (!rl.active(CV)) return;
    A mean[VEC], scale[VEC], shift[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
        const int c = rl.cv * VEC + v;
        A s;
        if (TRAINING) {
            mean[v] = mean_io[c];
            s = invstd_io[c];
        } else {
            mean[v] = load(running_mean[c]);
            s = A(1) / sqrt(A(load(running_var[c])) + eps);
            if (rl.lane == 0) {
                mean_io[c] = mean[v];
                invstd_io[c] = s;
            }
        }
        scale[v] = s * A(load(gamma[c]));
        shift[v] = A(load(beta[c]));
    }
    const T* const src[1] = {x};
    each_row<true, 1, T, VEC>(src, rl, M, C, [&](auto& vals, int u, index_t r) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) vals[0][u][v] = (vals[0][u][v] - mean[v]) * scale[v] + shift[v];
        store_pack<T, VEC>(y, (M - 1 - r) * C + (index_t)rl.cv * VEC, vals[0][u]);
    });
}

// Per lane: sum(dy) and sum(dy * (x - mean)) per channel, at [c * L + lane].
template <typename T, typename index_t, int VEC>
__global__ void __launch_bounds__(BN_THREADS)
batchnorm_rows_backward_reduce(const T* __restrict__ x, const T* __restrict__ dy,
                               const acc_t<T>* __restrict__ mean, acc_t<T>* __restrict__ part_g,
                               acc_t<T>* __restrict__ part_gx, index_t M, int C, int cols) {
    typedef acc_t<T> A;
    const RowLanes rl(cols);
    const int CV = C / VEC;
    if (!rl.active(CV)) return;
    A m[VEC], g[VEC], gx[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
        m[v] = mean[rl.cv * VEC + v];
        g[v] = gx[v] = 0;
    }
    const T* const src[2] = {x, dy};
    each_row<false, 2, T, VEC>(src, rl, M, C, [&](const auto& vals, int u, index_t) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            g[v] += vals[1][u][v];
            gx[v] += vals[1][u][v] * (vals[0][u][v] - m[v]);
        }
    });
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
        const index_t o = (index_t)(rl.cv * VEC + v) * rl.L + rl.lane;
        part_g[o] = g[v];
        part_gx[o] = gx[v];
    }
}

// One warp per channel: sums in a fixed order; dbeta, dgamma, and into
// sums[c] / sums[C + c] the sum(dy) and sum(dy * xhat) the data kernel needs.
template <typename T, typename P>
__global__ void __launch_bounds__(BN_THREADS)
batchnorm_rows_backward_merge(const acc_t<T>* __restrict__ part_g, const acc_t<T>* __restrict__ part_gx,
                              int L, int C, const acc_t<T>* __restrict__ invstd,
                              acc_t<T>* __restrict__ sums, P* __restrict__ dgamma, P* __restrict__ dbeta) {
    typedef acc_t<T> A;
    const int c = (int)blockIdx.x * (BN_THREADS / 32) + (int)(threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (c >= C) return;
    A sg = 0, sgx = 0;
    for (int b0 = lane; b0 < L; b0 += 32 * ROWS_MERGE_AHEAD) {
        A pg[ROWS_MERGE_AHEAD], pgx[ROWS_MERGE_AHEAD];
#pragma unroll
        for (int u = 0; u < ROWS_MERGE_AHEAD; ++u) {
            const int b = b0 + 32 * u;
            const long long o = (long long)c * L + b;
            pg[u] = b < L ? part_g[o] : A(0);
            pgx[u] = b < L ? part_gx[o] : A(0);
        }
#pragma unroll
        for (int u = 0; u < ROWS_MERGE_AHEAD; ++u) {
            sg += pg[u];
            sgx += pgx[u];
        }
    }
    sg = warp_down_sum(sg);
    sgx = warp_down_sum(sgx);
    if (lane == 0) {
        sgx *= invstd[c];
        write_grad_sums(c, C, sg, sgx, sums, dbeta, dgamma);
    }
}

template <typename T, typename P, typename index_t, int VEC>
__global__ void __launch_bounds__(BN_THREADS)
batchnorm_rows_backward_data(const T* __restrict__ x, const T* __restrict__ dy,
                             const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ invstd,
                             const P* __restrict__ gamma, const acc_t<T>* __restrict__ sums,
                             T* __restrict__ dx, index_t M, int C, int cols) {
    typedef acc_t<T> A;
    const RowLanes rl(cols);
    const int CV = C / VEC;
    if (!rl.active(CV)) return;
    A m[VEC], s[VEC], scale[VEC], mean_dy[VEC], mean_dy_xhat[VEC];
    const A n = A(M);
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
        const int c = rl.cv * VEC + v;
        m[v] = mean[c];
        s[v] = invstd[c];
        scale[v] = A(load(gamma[c])) * s[v];
        mean_dy[v] = sums[c] / n;
        mean_dy_xhat[v] = sums[C + c] / n;
    }
    const T* const src[2] = {x, dy};
    each_row<true, 2, T, VEC>(src, rl, M, C, [&](auto& vals, int u, index_t r) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            const A xhat = (vals[0][u][v] - m[v]) * s[v];
            vals[0][u][v] = scale[v] * (vals[1][u][v] - mean_dy[v] - xhat * mean_dy_xhat[v]);
        }
        store_pack<T, VEC>(dx, (M - 1 - r) * C + (index_t)rl.cv * VEC, vals[0][u]);
    });
}

// Channel-last training forward and backward (saved statistics) in ONE launch
// each (issue 5, v4) that keep the last rows they read on chip:
// batchnorm_rows_train_fused (reads x) and batchnorm_rows_backward_fused (x
// and dy) run the same passes (rows_fused and the helpers before it) and
// differ only in their op (RowsTrainOp / RowsBackwardOp: what a batch adds to
// the lane's partials, how partials merge, what the merged channel writes,
// and the value each row maps to).
//
// A persistent grid (every block resident: the host sizes it with the
// occupancy API and launches it cooperatively, as the fused chunk kernels)
// with the RowLanes mapping; lane g reads batches j = 0, 1, ... of B rows of
// its K tensors, rows [(j * L + g) * B, + B) (as rows_statistics: at any time
// the lanes read one contiguous stretch of rows):
//   - every batch goes into the lane's Q partials per channel (forward: exact
//     two-pass batch statistics Chan-merged into (count, mean, M2), as
//     rows_statistics; backward: sums of dy and dy * (x - mean));
//   - the lane's last batch stays in registers (`keep`), the ROWS_SMEM_ROWS / K
//     rows of each tensor before it in a static shared-memory cache (one
//     16-byte vector per row, tensor and thread).  B = rows_batch / K rows.
// Grid barrier 1 (channel_barrier over all blocks); block b merges channels
// b, b + blocks, ... from the L lane partials (its 8 warps lane-strided, then
// the 8 warp results in order: fixed order, bitwise reproducible) and writes
// them (forward: mean / invstd / running statistics; backward: dbeta, dgamma
// and sums[c] / sums[C + c] for dx); grid barrier 2; then every thread maps
// its register rows, its cached rows, and its other batches last to first
// (what the grid read last comes first: L2 hits) to y / dx.  DRAM traffic:
// the tensors once, plus once less what is on chip and in L2, plus the
// output; no merge launch.  (A first version gave each lane one contiguous
// range of rows: 0.246 ms on bn_big_nhwc against 0.236 for the three
// launches -- scattered streams.)
#define ROWS_SMEM_ROWS 8

// Rows per batch of a fused rows kernel reading K tensors.
template <typename T, int VEC, int K>
__host__ __device__ constexpr int fused_rows_batch() {
    return rows_batch<T, VEC>() / K > 0 ? rows_batch<T, VEC>() / K : 1;
}

// Number of batches of B rows lane rl.lane owns: j with (j * L + lane) * B < M.
template <int B, typename index_t>
__device__ __forceinline__ index_t lane_batches(const RowLanes& rl, index_t M) {
    const index_t first = (index_t)rl.lane * B, step = (index_t)rl.L * B;
    return first < M ? (M - first + step - 1) / step : 0;
}

// Block and block count of the (x, y) grid, for the grid barriers and the merge.
__device__ __forceinline__ void grid_block(int& block, int& blocks) {
    blocks = (int)(gridDim.x * gridDim.y);
    block = (int)(blockIdx.y * gridDim.x + blockIdx.x);
}

// Pass 1: every batch of the lane's rows of the K tensors (all loads first,
// zeros past M) into op.accumulate; the last batch kept in `keep`, the SB
// batches before it in `cache` (as T).
template <int B, int SB, typename Op, typename T, int VEC, typename index_t>
__device__ __forceinline__ void rows_first_pass(Op& op, const T* const (&src)[Op::K], const RowLanes& rl,
                                                index_t M, int C, index_t col, index_t batches,
                                                acc_t<T> (&keep)[Op::K][B][VEC],
                                                Pack<T, VEC> (&cache)[Op::K][SB * B][BN_THREADS]) {
    typedef acc_t<T> A;
    constexpr int K = Op::K;
    for (index_t j = 0; j < batches; ++j) {
        const index_t first = (j * rl.L + rl.lane) * B;
        A vals[K][B][VEC];
#pragma unroll
        for (int i = 0; i < B; ++i) {
#pragma unroll
            for (int k = 0; k < K; ++k) {
                if (first + i < M) {
                    load_pack<T, VEC>(src[k], (first + i) * C + col, vals[k][i]);
                } else {
#pragma unroll
                    for (int v = 0; v < VEC; ++v) vals[k][i][v] = 0;
                }
            }
        }
        op.accumulate(vals, (int)(M - first < (index_t)B ? M - first : (index_t)B));
        const index_t back = batches - 1 - j;  // 0: the last batch
        if (back == 0) {
#pragma unroll
            for (int k = 0; k < K; ++k)
#pragma unroll
                for (int i = 0; i < B; ++i)
#pragma unroll
                    for (int v = 0; v < VEC; ++v) keep[k][i][v] = vals[k][i][v];
        } else if (back <= SB) {
#pragma unroll
            for (int i = 0; i < B; ++i) {
#pragma unroll
                for (int k = 0; k < K; ++k) {
                    Pack<T, VEC> pk;
#pragma unroll
                    for (int v = 0; v < VEC; ++v) pk.v[v] = store<T>(vals[k][i][v]);
                    cache[k][(back - 1) * B + i][threadIdx.x] = pk;
                }
            }
        }
    }
}

// The merge between the grid barriers: block `block` of `blocks` takes
// channels block, block + blocks, ...: the Q quantities of the L lane partials
// (parts[q][c * L + lane], volatile: written by other blocks of this launch),
// lane-strided over the block's threads (ROWS_MERGE_AHEAD loads in flight),
// combined by Op::combine per thread, per warp (shuffle tree), then over the
// warps in order; thread 0 hands the channel's result to op.finish.
template <typename Op, typename A>
__device__ __forceinline__ void rows_merge_channels(Op& op, A* const (&parts)[Op::Q], int L, int C, int block,
                                                    int blocks, bool gathered) {
    constexpr int Q = Op::Q;
    __shared__ A merged[Q][BN_THREADS / 32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int c = block; c < C; c += blocks) {
        A acc[Q];
#pragma unroll
        for (int q = 0; q < Q; ++q) acc[q] = 0;
        for (int b0 = threadIdx.x; b0 < L; b0 += BN_THREADS * ROWS_MERGE_AHEAD) {
            A got[ROWS_MERGE_AHEAD][Q];
#pragma unroll
            for (int u = 0; u < ROWS_MERGE_AHEAD; ++u) {
                const int b = b0 + BN_THREADS * u;
                const long long o = (long long)c * L + b;
#pragma unroll
                for (int q = 0; q < Q; ++q) got[u][q] = b < L ? A(((const volatile A*)parts[q])[o]) : A(0);
            }
#pragma unroll
            for (int u = 0; u < ROWS_MERGE_AHEAD; ++u) Op::combine(acc, got[u]);
        }
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) {
            A other[Q];
#pragma unroll
            for (int q = 0; q < Q; ++q) other[q] = __shfl_down_sync(0xffffffffu, acc[q], offset);
            if (lane + offset < 32) Op::combine(acc, other);
        }
        if (lane == 0) {
#pragma unroll
            for (int q = 0; q < Q; ++q) merged[q][warp] = acc[q];
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            A total[Q];
#pragma unroll
            for (int q = 0; q < Q; ++q) total[q] = 0;
            for (int w = 0; w < BN_THREADS / 32; ++w) {
                A part[Q];
#pragma unroll
                for (int q = 0; q < Q; ++q) part[q] = merged[q][w];
                Op::combine(total, part);
            }
            op.finish(c, total, gathered);
            __threadfence();
        }
        __syncthreads();
    }
}

// Pass 2: op.map of the register rows, the cached rows, then the other
// batches last to first (all loads of a batch first) into dst.
template <int B, int SB, typename Op, typename T, int VEC, typename index_t>
__device__ __forceinline__ void rows_second_pass(const Op& op, const T* const (&src)[Op::K], T* __restrict__ dst,
                                                 const RowLanes& rl, index_t M, int C, index_t col,
                                                 index_t batches, const acc_t<T> (&keep)[Op::K][B][VEC],
                                                 const Pack<T, VEC> (&cache)[Op::K][SB * B][BN_THREADS]) {
    typedef acc_t<T> A;
    constexpr int K = Op::K;
    {  // the last batch, from registers
        const index_t first = ((batches - 1) * rl.L + rl.lane) * B;
#pragma unroll
        for (int i = 0; i < B; ++i) {
            if (first + i < M) {
                A out[VEC];
                op.map(keep, i, out);
                store_pack<T, VEC>(dst, (first + i) * C + col, out);
            }
        }
    }
#pragma unroll
    for (int back = 1; back <= SB; ++back) {  // the cached batches
        const index_t j = batches - 1 - back;
        if (j >= 0) {
            const index_t first = (j * rl.L + rl.lane) * B;
#pragma unroll
            for (int i = 0; i < B; ++i) {
                if (first + i < M) {
                    A row[K][1][VEC], out[VEC];
#pragma unroll
                    for (int k = 0; k < K; ++k) {
                        const Pack<T, VEC> pk = cache[k][(back - 1) * B + i][threadIdx.x];
#pragma unroll
                        for (int v = 0; v < VEC; ++v) row[k][0][v] = A(load(pk.v[v]));
                    }
                    op.map(row, 0, out);
                    store_pack<T, VEC>(dst, (first + i) * C + col, out);
                }
            }
        }
    }
    for (index_t j = batches - 2 - SB; j >= 0; --j) {  // the rest, last to first
        const index_t first = (j * rl.L + rl.lane) * B;
        A vals[K][B][VEC];
#pragma unroll
        for (int i = 0; i < B; ++i)
#pragma unroll
            for (int k = 0; k < K; ++k)
                if (first + i < M) load_pack<T, VEC>(src[k], (first + i) * C + col, vals[k][i]);
#pragma unroll
        for (int i = 0; i < B; ++i) {
            if (first + i < M) {
                A out[VEC];
                op.map(vals, i, out);
                store_pack<T, VEC>(dst, (first + i) * C + col, out);
            }
        }
    }
}

// Between the passes of rows_fused and rows_resident: the lane partials out,
// grid barrier 1, the merge of the channels this block owns, grid barrier 2.
// Returns whether every block merged (false: the barrier timed out).
template <typename T, int VEC, typename index_t, typename Op>
__device__ __forceinline__ bool rows_exchange_partials(Op& op, acc_t<T>* const (&parts)[Op::Q], const RowLanes& rl,
                                                       int C, bool active, unsigned* __restrict__ arrive) {
    constexpr int Q = Op::Q;
    if (active) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            const index_t o = (index_t)(rl.cv * VEC + v) * rl.L + rl.lane;
#pragma unroll
            for (int q = 0; q < Q; ++q) parts[q][o] = op.part[q][v];
        }
        __threadfence();
    }
    int block, blocks;
    grid_block(block, blocks);
    const bool gathered = channel_barrier(arrive, 0, 2, blocks);
    rows_merge_channels(op, parts, rl.L, C, block, blocks, gathered);
    return channel_barrier(arrive, 1, 2, blocks);
}

// The whole fused rows kernel for an op: pass 1, the lane partials, grid
// barrier 1, the merge, grid barrier 2, pass 2.
template <typename T, int VEC, typename Op, typename index_t>
__device__ __forceinline__ void rows_fused(Op& op, const T* const (&src)[Op::K], T* __restrict__ dst,
                                           acc_t<T>* const (&parts)[Op::Q], index_t M, int C, int cols,
                                           unsigned* __restrict__ arrive) {
    typedef acc_t<T> A;
    constexpr int K = Op::K;
    constexpr int B = fused_rows_batch<T, VEC, K>();
    constexpr int SB = ROWS_SMEM_ROWS / K / B;  // cached batches
    __shared__ Pack<T, VEC> cache[K][SB * B][BN_THREADS];
    const RowLanes rl(cols);
    const bool active = rl.active(C / VEC);
    const index_t col = (index_t)rl.cv * VEC;
    const index_t batches = active ? lane_batches<B>(rl, M) : 0;
    op.start(rl, active);
    A keep[K][B][VEC];
    rows_first_pass<B, SB>(op, src, rl, M, C, col, batches, keep, cache);
    const bool merged_all = rows_exchange_partials<T, VEC, index_t>(op, parts, rl, C, active, arrive);
    if (!active || batches == 0) return;
    op.prepare(rl, M, C, merged_all);
    rows_second_pass<B, SB>(op, src, dst, rl, M, C, col, batches, keep, cache);
}

// Training forward: partials (count, mean, M2) per channel; the merged channel
// writes mean / invstd / running statistics; y = (x - mean) * scale + shift.
// ONE_COUNT (the resident kernel's 16-bit types, switch
// normalization.ROWS_TRAIN_ONE_COUNT; notes/bn16nhwc.md): the VEC channels of a
// thread see the same rows, so their counts are equal and the batch mean's
// divisor and chan_merge's nb / n are computed once a batch instead of once a
// channel (16 IEEE divisions a batch of 4 half rows -> 1), and a whole batch's
// mean is s * (1 / B) (B a power of two: exact, the same bits as s / B).  The
// same operations on the same operands: bitwise the results of ONE_COUNT false.
template <typename T, typename P, int VEC, bool ONE_COUNT = false>
struct RowsTrainOp {
    typedef acc_t<T> A;
    static constexpr int K = 1, Q = 3;
    A part[Q][VEC];
    A mean[VEC], scale[VEC], shift[VEC];
    A* mean_out;
    A* invstd_out;
    P* running_mean;
    P* running_var;
    const P* gamma;
    const P* beta;
    A eps, momentum, unbias;
    int update_running;

    // The kernel arguments of batchnorm_rows_train_fused and _resident.
    __device__ __forceinline__ void set(A* mean_out_, A* invstd_out_, P* running_mean_, P* running_var_,
                                        const P* gamma_, const P* beta_, A eps_, A momentum_, A unbias_,
                                        int update_running_) {
        mean_out = mean_out_;
        invstd_out = invstd_out_;
        running_mean = running_mean_;
        running_var = running_var_;
        gamma = gamma_;
        beta = beta_;
        eps = eps_;
        momentum = momentum_;
        unbias = unbias_;
        update_running = update_running_;
    }
    __device__ __forceinline__ void start(const RowLanes&, bool) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) part[0][v] = part[1][v] = part[2][v] = 0;
    }
    // Exact two-pass statistics of the batch's `rows` rows, Chan-merged in.
    template <int B>
    __device__ __forceinline__ void accumulate(const A (&vals)[K][B][VEC], int rows) {
        if constexpr (ONE_COUNT) {
            accumulate_one_count(vals, rows);
            return;
        }
        const A nb = A(rows);
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            A s = 0;
#pragma unroll
            for (int i = 0; i < B; ++i) s += vals[0][i][v];
            const A mb = s / nb;
            A q = 0;
#pragma unroll
            for (int i = 0; i < B; ++i) {
                const A d = vals[0][i][v] - mb;
                if (i < rows) q += d * d;
            }
            chan_merge(part[0][v], part[1][v], part[2][v], nb, mb, q);
        }
    }
    // accumulate with ONE_COUNT: chan_merge's steps with the count and f = nb / n
    // shared by the VEC channels (part[0][v] all hold the same count).
    template <int B>
    __device__ __forceinline__ void accumulate_one_count(const A (&vals)[K][B][VEC], int rows) {
        static_assert((B & (B - 1)) == 0, "1 / B must be exact");
        const A nb = A(rows), na = part[0][0];
        const bool whole = rows == B;
        A mb[VEC], q[VEC];
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            A s = 0;
#pragma unroll
            for (int i = 0; i < B; ++i) s += vals[0][i][v];
            mb[v] = whole ? __fmul_rn(s, A(1) / A(B)) : s / nb;
            A sq = 0;
#pragma unroll
            for (int i = 0; i < B; ++i) {
                const A d = vals[0][i][v] - mb[v];
                if (i < rows) sq += d * d;
            }
            q[v] = sq;
        }
        if (nb == A(0)) return;
        if (na == A(0)) {
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                part[0][v] = nb;
                part[1][v] = mb[v];
                part[2][v] = q[v];
            }
            return;
        }
        const A n = na + nb, f = nb / n;
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            const A delta = mb[v] - part[1][v];
            part[1][v] = part[1][v] + delta * f;
            part[2][v] = part[2][v] + q[v] + delta * delta * na * f;
            part[0][v] = n;
        }
    }
    __device__ __forceinline__ static void combine(A (&a)[Q], const A (&b)[Q]) {
        chan_merge(a[0], a[1], a[2], b[0], b[1], b[2]);
    }
    __device__ __forceinline__ void finish(int c, const A (&r)[Q], bool gathered) const {
        const A var = gathered ? r[2] / r[0] : barrier_failed<A>();
        write_statistics(c, gathered ? r[1] : var, var, A(1) / sqrt(var + eps), mean_out, invstd_out, running_mean,
                         running_var, momentum, unbias, update_running);
    }
    template <typename index_t>
    __device__ __forceinline__ void prepare(const RowLanes& rl, index_t, int, bool merged_all) {
        const volatile A* mo = mean_out;
        const volatile A* io = invstd_out;
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            const int c = rl.cv * VEC + v;
            mean[v] = merged_all ? A(mo[c]) : barrier_failed<A>();
            scale[v] = A(io[c]) * A(load(gamma[c]));
            shift[v] = A(load(beta[c]));
        }
    }
    template <int B>
    __device__ __forceinline__ void map(const A (&rows)[K][B][VEC], int i, A (&out)[VEC]) const {
#pragma unroll
        for (int v = 0; v < VEC; ++v) out[v] = (rows[0][i][v] - mean[v]) * scale[v] + shift[v];
    }
};

// Backward: partials sum(dy), sum(dy * (x - mean)) per channel; the merged
// channel writes dbeta, dgamma (the second sum times invstd) and sums[c] /
// sums[C + c]; dx = scale * (dy - mean_dy - xhat * mean_dy_xhat).
template <typename T, typename P, int VEC>
struct RowsBackwardOp {
    typedef acc_t<T> A;
    static constexpr int K = 2, Q = 2;  // tensors x, dy
    A part[Q][VEC];
    A m[VEC], s[VEC], scale[VEC], mean_dy[VEC], mean_dy_xhat[VEC];
    const A* mean;
    const A* invstd;
    const P* gamma;
    A* sums;
    P* dgamma;
    P* dbeta;
    int C;

    // The kernel arguments of batchnorm_rows_backward_fused and _resident.
    __device__ __forceinline__ void set(const A* mean_, const A* invstd_, const P* gamma_, A* sums_, P* dgamma_,
                                        P* dbeta_, int C_) {
        mean = mean_;
        invstd = invstd_;
        gamma = gamma_;
        sums = sums_;
        dgamma = dgamma_;
        dbeta = dbeta_;
        C = C_;
    }
    __device__ __forceinline__ void start(const RowLanes& rl, bool active) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            m[v] = active ? mean[rl.cv * VEC + v] : A(0);
            part[0][v] = part[1][v] = 0;
        }
    }
    template <int B>
    __device__ __forceinline__ void accumulate(const A (&vals)[K][B][VEC], int) {
#pragma unroll
        for (int i = 0; i < B; ++i) {
#pragma unroll
            for (int v = 0; v < VEC; ++v) {  // zeros past M add nothing
                part[0][v] += vals[1][i][v];
                part[1][v] += vals[1][i][v] * (vals[0][i][v] - m[v]);
            }
        }
    }
    __device__ __forceinline__ static void combine(A (&a)[Q], const A (&b)[Q]) {
        a[0] += b[0];
        a[1] += b[1];
    }
    __device__ __forceinline__ void finish(int c, const A (&r)[Q], bool gathered) const {
        A g = r[0], gx = r[1] * invstd[c];
        if (!gathered) g = gx = barrier_failed<A>();
        write_grad_sums(c, C, g, gx, sums, dbeta, dgamma);
    }
    template <typename index_t>
    __device__ __forceinline__ void prepare(const RowLanes& rl, index_t M, int, bool merged_all) {
        const volatile A* vs = sums;
        const A n = A(M);
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            const int c = rl.cv * VEC + v;
            s[v] = invstd[c];
            scale[v] = A(load(gamma[c])) * s[v];
            mean_dy[v] = merged_all ? A(vs[c]) / n : barrier_failed<A>();
            mean_dy_xhat[v] = A(vs[C + c]) / n;
        }
    }
    template <int B>
    __device__ __forceinline__ void map(const A (&rows)[K][B][VEC], int i, A (&out)[VEC]) const {
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            const A xhat = (rows[0][i][v] - m[v]) * s[v];
            out[v] = scale[v] * (rows[1][i][v] - mean_dy[v] - xhat * mean_dy_xhat[v]);
        }
    }
};

template <typename T, typename P, typename index_t, int VEC>
__global__ void __launch_bounds__(BN_THREADS)
batchnorm_rows_train_fused(const T* __restrict__ x, T* __restrict__ y, acc_t<T>* __restrict__ part_n,
                           acc_t<T>* __restrict__ part_mean, acc_t<T>* __restrict__ part_m2,
                           acc_t<T>* __restrict__ mean_out, acc_t<T>* __restrict__ invstd_out,
                           P* __restrict__ running_mean, P* __restrict__ running_var,
                           const P* __restrict__ gamma, const P* __restrict__ beta, index_t M, int C, int cols,
                           acc_t<T> eps, acc_t<T> momentum, acc_t<T> unbias, int update_running,
                           unsigned* __restrict__ arrive) {
    RowsTrainOp<T, P, VEC> op;
    op.set(mean_out, invstd_out, running_mean, running_var, gamma, beta, eps, momentum, unbias, update_running);
    const T* const src[1] = {x};
    acc_t<T>* const parts[3] = {part_n, part_mean, part_m2};
    rows_fused<T, VEC>(op, src, y, parts, M, C, cols, arrive);
}

template <typename T, typename P, typename index_t, int VEC>
__global__ void __launch_bounds__(BN_THREADS)
batchnorm_rows_backward_fused(const T* __restrict__ x, const T* __restrict__ dy,
                              const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ invstd,
                              const P* __restrict__ gamma, acc_t<T>* __restrict__ part_g,
                              acc_t<T>* __restrict__ part_gx, acc_t<T>* __restrict__ sums, T* __restrict__ dx,
                              P* __restrict__ dgamma, P* __restrict__ dbeta, index_t M, int C, int cols,
                              unsigned* __restrict__ arrive) {
    RowsBackwardOp<T, P, VEC> op;
    op.set(mean, invstd, gamma, sums, dgamma, dbeta, C);
    const T* const src[2] = {x, dy};
    acc_t<T>* const parts[2] = {part_g, part_gx};
    rows_fused<T, VEC>(op, src, dx, parts, M, C, cols, arrive);
}

// ---------------------------------------------------------------------------
// Channel-last training forward and backward with more rows on chip and L2
// eviction hints (issue 5, bnnhwc; switch normalization.ROWS_RESIDENT):
// batchnorm_rows_{train,backward}_resident.  The passes, the lane mapping,
// the batches, the partials and the merge are those of rows_fused above (same
// B, same lanes for the same grid: bitwise the same results); what differs is
// where the rows between the passes live and what the L2 keeps:
//   - the lane's last batch stays in registers as storage packs (16-bit types:
//     half the registers of acc_t values, so two blocks fit an SM);
//   - the `cached` batches before it (a runtime count, the host sizes it to the
//     shared memory an SM has for the resident blocks: ~110 KB a block at two
//     blocks per SM, 3 batches of 8 fp32 rows a thread instead of rows_fused's
//     static 1) live in DYNAMIC shared memory, layout [k][batch][row][thread];
//   - `window` >= 0: the `window` batches before those are read with normal L2
//     priority in pass 1 and every other access of both passes is evict-first
//     (PTX .cs: the batches that stay on chip, the early batches pass 2 reaches
//     last, pass 2's loads and the y / dx stores), so the L2 holds the window
//     for pass 2 (which reads it right after the on-chip rows) instead of lines
//     that are on chip anyway or that y's writes would push out.  window < 0:
//     plain accesses everywhere (the A/B of the hints alone).
// DRAM traffic: x (and dy) once + the output + the second read less
// (on-chip + window) batches: notes/bnnhwc.md has the numbers.

// 16-byte accesses with the evict-first cache operator (.cs); other widths plain.
template <typename T, int VEC, typename index_t>
__device__ __forceinline__ void load_pack_cs(const T* __restrict__ p, index_t off, Pack<T, VEC>& out,
                                             bool first) {
    if constexpr (sizeof(Pack<T, VEC>) == 16) {
        if (first) {
            unsigned* w = reinterpret_cast<unsigned*>(&out);
            asm("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];"
                : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p + off));
            return;
        }
    } else if constexpr (sizeof(Pack<T, VEC>) == 8 && sizeof(T) == 2) {  // 16-bit, 4 a thread (_narrow)
        if (first) {
            unsigned* w = reinterpret_cast<unsigned*>(&out);
            asm("ld.global.cs.v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p + off));
            return;
        }
    }
    out = *reinterpret_cast<const Pack<T, VEC>*>(p + off);
}

template <typename T, int VEC, typename index_t>
__device__ __forceinline__ void store_pack_cs(T* __restrict__ p, index_t off, const acc_t<T> (&in)[VEC],
                                              bool first) {
    Pack<T, VEC> pk;
#pragma unroll
    for (int v = 0; v < VEC; ++v) pk.v[v] = store<T>(in[v]);
    if constexpr (sizeof(Pack<T, VEC>) == 16) {
        if (first) {
            const unsigned* w = reinterpret_cast<const unsigned*>(&pk);
            asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};"
                         :: "l"(p + off), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");
            return;
        }
    } else if constexpr (sizeof(Pack<T, VEC>) == 8 && sizeof(T) == 2) {  // 16-bit, 4 a thread (_narrow)
        if (first) {
            const unsigned* w = reinterpret_cast<const unsigned*>(&pk);
            asm volatile("st.global.cs.v2.u32 [%0], {%1, %2};" :: "l"(p + off), "r"(w[0]), "r"(w[1]) : "memory");
            return;
        }
    }
    *reinterpret_cast<Pack<T, VEC>*>(p + off) = pk;
}


// 16-bit rows as 32-bit words (WORDS; switch normalization.ROWS_16BIT_WORDS,
// notes/bn16nhwc.md).  A Pack of 8 half_t is 8 16-bit values to the compiler:
// pass 1's zero fill, the copies into registers / shared memory and the
// conversions became ~100 PRMT byte moves a batch in the backward (SASS).  As
// four words a row is moved whole, converted half by half (cvt.f32.f16 of a
// word's halves; bf16: a shift or a mask) and stored from pairs converted at
// once (cvt.rn.{f16,bf16}x2.f32: the same rounding as two single conversions).
// Same values, same arithmetic: bitwise the results of Pack.
template <typename T, int VEC>
struct alignas(16) RowWords {
    unsigned w[VEC * sizeof(T) / 4];
};

template <bool WORDS, typename T, int VEC> struct row_pack { typedef Pack<T, VEC> type; };
template <typename T, int VEC> struct row_pack<true, T, VEC> { typedef RowWords<T, VEC> type; };

template <typename T, int VEC>
__device__ __forceinline__ void zero_row(Pack<T, VEC>& pk) {
#pragma unroll
    for (int v = 0; v < VEC; ++v) pk.v[v] = store<T>(acc_t<T>(0));
}

template <typename T, int VEC>
__device__ __forceinline__ void zero_row(RowWords<T, VEC>& pk) {
#pragma unroll
    for (int i = 0; i < VEC * (int)sizeof(T) / 4; ++i) pk.w[i] = 0u;
}

template <typename T, int VEC>
__device__ __forceinline__ acc_t<T> row_value(const Pack<T, VEC>& pk, int v) {
    return acc_t<T>(load(pk.v[v]));
}

// Value `high` (0: low half, 1: high half) of a word of two 16-bit values.
__device__ __forceinline__ float word_value(unsigned w, int high, half_t) {
    float f;
    if (high)
        asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, hi; }" : "=f"(f) : "r"(w));
    else
        asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, lo; }" : "=f"(f) : "r"(w));
    return f;
}

__device__ __forceinline__ float word_value(unsigned w, int high, bfloat16_t) {
    return __uint_as_float(high ? (w & 0xffff0000u) : (w << 16));
}

template <typename T, int VEC>
__device__ __forceinline__ float row_value(const RowWords<T, VEC>& pk, int v) {
    return word_value(pk.w[v >> 1], v & 1, T());
}

// A word of two values (lo in the low half), each rounded as store<T> rounds.
__device__ __forceinline__ unsigned word_of(float lo, float hi, half_t) {
    unsigned w;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
#else
    w = (unsigned)store<half_t>(lo).bits | ((unsigned)store<half_t>(hi).bits << 16);
#endif
    return w;
}

__device__ __forceinline__ unsigned word_of(float lo, float hi, bfloat16_t) {
    unsigned w;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
#else
    w = (unsigned)store<bfloat16_t>(lo).bits | ((unsigned)store<bfloat16_t>(hi).bits << 16);
#endif
    return w;
}

template <typename T, int VEC, typename index_t>
__device__ __forceinline__ void load_pack_cs(const T* __restrict__ p, index_t off, RowWords<T, VEC>& out,
                                             bool first) {
    if (first) {
        asm("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(out.w[0]), "=r"(out.w[1]), "=r"(out.w[2]), "=r"(out.w[3]) : "l"(p + off));
        return;
    }
    out = *reinterpret_cast<const RowWords<T, VEC>*>(p + off);
}

// store_pack_cs, or with WORDS the row converted a pair at a time.
template <bool WORDS, typename T, int VEC, typename index_t>
__device__ __forceinline__ void store_row_cs(T* __restrict__ p, index_t off, const acc_t<T> (&in)[VEC], bool first) {
    if constexpr (WORDS) {
        RowWords<T, VEC> pk;
#pragma unroll
        for (int i = 0; i < VEC / 2; ++i) pk.w[i] = word_of(in[2 * i], in[2 * i + 1], T());
        if (first) {
            asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};"
                         :: "l"(p + off), "r"(pk.w[0]), "r"(pk.w[1]), "r"(pk.w[2]), "r"(pk.w[3]) : "memory");
            return;
        }
        *reinterpret_cast<RowWords<T, VEC>*>(p + off) = pk;
    } else {
        store_pack_cs<T, VEC>(p, off, in, first);
    }
}


// Pass 1 of the resident kernels: as rows_first_pass, with the loads' L2
// priority chosen per batch and the on-chip batches kept as storage packs
// (registers: keep; dynamic shared memory: cache[((k * cached + back - 1) * B
// + i) * BN_THREADS + thread]).
template <int B, typename S, typename Op, typename T, typename index_t>
__device__ __forceinline__ void rows_resident_first_pass(Op& op, const T* const (&src)[Op::K], const RowLanes& rl,
                                                         index_t M, int C, index_t col, index_t batches,
                                                         S (&keep)[Op::K][B], S* __restrict__ cache, int cached,
                                                         int window) {
    typedef acc_t<T> A;
    constexpr int K = Op::K, VEC = (int)(sizeof(S) / sizeof(T));
    for (index_t j = 0; j < batches; ++j) {
        const index_t first = (j * rl.L + rl.lane) * B;
        const index_t back = batches - 1 - j;  // 0: the last batch
        const bool evict_first = window >= 0 && (back <= cached || back > cached + window);
        S pk[K][B];
#pragma unroll
        for (int i = 0; i < B; ++i) {
#pragma unroll
            for (int k = 0; k < K; ++k) {
                if (first + i < M) {
                    load_pack_cs(src[k], (first + i) * C + col, pk[k][i], evict_first);
                } else {
                    zero_row(pk[k][i]);
                }
            }
        }
        // The packs go on chip before the arithmetic (they are dead during it: registers).
        if (back == 0) {
#pragma unroll
            for (int k = 0; k < K; ++k)
#pragma unroll
                for (int i = 0; i < B; ++i) keep[k][i] = pk[k][i];
        } else if (back <= cached) {
#pragma unroll
            for (int k = 0; k < K; ++k)
#pragma unroll
                for (int i = 0; i < B; ++i)
                    cache[((k * cached + (int)back - 1) * B + i) * BN_THREADS + threadIdx.x] = pk[k][i];
        }
        A vals[K][B][VEC];
#pragma unroll
        for (int k = 0; k < K; ++k)
#pragma unroll
            for (int i = 0; i < B; ++i)
#pragma unroll
                for (int v = 0; v < VEC; ++v) vals[k][i][v] = row_value(pk[k][i], v);
        op.accumulate(vals, (int)(M - first < (index_t)B ? M - first : (index_t)B));
    }
}

// Row i of packs as acc_t values, in the [K][1][VEC] shape Op::map takes.
template <int K, int B, typename T, int VEC, typename S>
__device__ __forceinline__ void unpack_row(const S (&pk)[K][B], int i, acc_t<T> (&row)[K][1][VEC]) {
#pragma unroll
    for (int k = 0; k < K; ++k)
#pragma unroll
        for (int v = 0; v < VEC; ++v) row[k][0][v] = row_value(pk[k][i], v);
}

// Pass 2 of the resident kernels: op.map of the register batch, the cached
// batches (last to first), then the other batches last to first -- the first
// of them are the L2 window; evict-first loads and stores when window >= 0.
template <int B, bool WORDS, typename S, typename Op, typename T, typename index_t>
__device__ __forceinline__ void rows_resident_second_pass(const Op& op, const T* const (&src)[Op::K],
                                                          T* __restrict__ dst, const RowLanes& rl, index_t M,
                                                          int C, index_t col, index_t batches,
                                                          const S (&keep)[Op::K][B], const S* __restrict__ cache,
                                                          int cached, int window) {
    typedef acc_t<T> A;
    constexpr int K = Op::K, VEC = (int)(sizeof(S) / sizeof(T));
    const bool hint = window >= 0;
    {  // the last batch, from registers
        const index_t first = ((batches - 1) * rl.L + rl.lane) * B;
#pragma unroll
        for (int i = 0; i < B; ++i) {
            if (first + i < M) {
                A row[K][1][VEC], out[VEC];
                unpack_row<K, B, T, VEC>(keep, i, row);
                op.map(row, 0, out);
                store_row_cs<WORDS, T, VEC>(dst, (first + i) * C + col, out, hint);
            }
        }
    }
    const int on_chip = (index_t)cached < batches - 1 ? cached : (int)(batches - 1);
    for (int back = 1; back <= on_chip; ++back) {  // the cached batches
        const index_t first = ((batches - 1 - back) * rl.L + rl.lane) * B;
        S pk[K][B];
#pragma unroll
        for (int k = 0; k < K; ++k)
#pragma unroll
            for (int i = 0; i < B; ++i) pk[k][i] = cache[((k * cached + back - 1) * B + i) * BN_THREADS + threadIdx.x];
#pragma unroll
        for (int i = 0; i < B; ++i) {  // a cached batch is whole: only the last batch can pass M
            A row[K][1][VEC], out[VEC];
            unpack_row<K, B, T, VEC>(pk, i, row);
            op.map(row, 0, out);
            store_row_cs<WORDS, T, VEC>(dst, (first + i) * C + col, out, hint);
        }
    }
    for (index_t j = batches - 2 - on_chip; j >= 0; --j) {  // the rest, last to first
        const index_t first = (j * rl.L + rl.lane) * B;
        S pk[K][B];
#pragma unroll
        for (int i = 0; i < B; ++i)
#pragma unroll
            for (int k = 0; k < K; ++k) load_pack_cs(src[k], (first + i) * C + col, pk[k][i], hint);
#pragma unroll
        for (int i = 0; i < B; ++i) {
            A row[K][1][VEC], out[VEC];
            unpack_row<K, B, T, VEC>(pk, i, row);
            op.map(row, 0, out);
            store_row_cs<WORDS, T, VEC>(dst, (first + i) * C + col, out, hint);
        }
    }
}

// The resident kernel for an op: rows_fused with the passes above.
template <typename T, int VEC, bool WORDS, typename Op, typename index_t>
__device__ __forceinline__ void rows_resident(Op& op, const T* const (&src)[Op::K], T* __restrict__ dst,
                                              acc_t<T>* const (&parts)[Op::Q], index_t M, int C, int cols,
                                              int cached, int window, unsigned* __restrict__ arrive) {
    constexpr int K = Op::K;
    constexpr int B = fused_rows_batch<T, VEC, K>();
    typedef typename row_pack<WORDS, T, VEC>::type S;
    extern __shared__ __align__(16) unsigned char rows_cache_bytes[];
    S* cache = reinterpret_cast<S*>(rows_cache_bytes);
    const RowLanes rl(cols);
    const bool active = rl.active(C / VEC);
    const index_t col = (index_t)rl.cv * VEC;
    const index_t batches = active ? lane_batches<B>(rl, M) : 0;
    op.start(rl, active);
    S keep[K][B];
    rows_resident_first_pass<B>(op, src, rl, M, C, col, batches, keep, cache, cached, window);
    const bool merged_all = rows_exchange_partials<T, VEC, index_t>(op, parts, rl, C, active, arrive);
    if (!active || batches == 0) return;
    op.prepare(rl, M, C, merged_all);
    rows_resident_second_pass<B, WORDS>(op, src, dst, rl, M, C, col, batches, keep, cache, cached, window);
}

// Two blocks an SM (the grid is resident; pass 1 needs the loads of two blocks in flight).
// ONE_COUNT: RowsTrainOp's shared-count statistics; WORDS: 16-bit rows as 32-bit
// words (RowWords).  Both give bitwise the results of false.
template <typename T, typename P, typename index_t, int VEC, bool ONE_COUNT = false, bool WORDS = false>
__global__ void __launch_bounds__(BN_THREADS, 2)
batchnorm_rows_train_resident(const T* __restrict__ x, T* __restrict__ y, acc_t<T>* __restrict__ part_n,
                              acc_t<T>* __restrict__ part_mean, acc_t<T>* __restrict__ part_m2,
                              acc_t<T>* __restrict__ mean_out, acc_t<T>* __restrict__ invstd_out,
                              P* __restrict__ running_mean, P* __restrict__ running_var,
                              const P* __restrict__ gamma, const P* __restrict__ beta, index_t M, int C, int cols,
                              acc_t<T> eps, acc_t<T> momentum, acc_t<T> unbias, int update_running, int cached,
                              int window, unsigned* __restrict__ arrive) {
    RowsTrainOp<T, P, VEC, ONE_COUNT> op;
    op.set(mean_out, invstd_out, running_mean, running_var, gamma, beta, eps, momentum, unbias, update_running);
    const T* const src[1] = {x};
    acc_t<T>* const parts[3] = {part_n, part_mean, part_m2};
    rows_resident<T, VEC, WORDS>(op, src, y, parts, M, C, cols, cached, window, arrive);
}

template <typename T, typename P, typename index_t, int VEC, bool WORDS = false>
__global__ void __launch_bounds__(BN_THREADS, 2)
batchnorm_rows_backward_resident(const T* __restrict__ x, const T* __restrict__ dy,
                                 const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ invstd,
                                 const P* __restrict__ gamma, acc_t<T>* __restrict__ part_g,
                                 acc_t<T>* __restrict__ part_gx, acc_t<T>* __restrict__ sums, T* __restrict__ dx,
                                 P* __restrict__ dgamma, P* __restrict__ dbeta, index_t M, int C, int cols,
                                 int cached, int window, unsigned* __restrict__ arrive) {
    RowsBackwardOp<T, P, VEC> op;
    op.set(mean, invstd, gamma, sums, dgamma, dbeta, C);
    const T* const src[2] = {x, dy};
    acc_t<T>* const parts[2] = {part_g, part_gx};
    rows_resident<T, VEC, WORDS>(op, src, dx, parts, M, C, cols, cached, window, arrive);
}

// ---------------------------------------------------------------------------
// 16-bit channel-last training forward / backward at FOUR channels a thread
// (issue 5, bn16nhwc3; switch normalization.ROWS_16BIT_NARROW): the resident
// kernels above (rows_resident, the same ops, cache, hints and merge) with VEC
// = 4 8-byte vectors instead of 8 16-byte ones, under their own names (their
// own warm-up groups).  Everything but the bytes then matches float32's
// kernel on the same C: a warp covers 128 channels (half a 256-channel row),
// a block 4 lanes x 64 columns, L = 4 lanes a block (half the 16-bit lanes:
// half the C x L lane partials written before grid barrier 1 and merged
// between the barriers), batches of 8 rows (train) / 4 rows of x and dy
// (backward) -- rows_batch<T, 4> counts 4 floats a row -- so half the Chan
// merges per value, and 24 batches a lane on 64x56x56x256 as float32.  Bytes a
// thread a batch stay 64 (8 x 8 B; the cache per batch 16 KB a block, as VEC 8).
// ld/st.global.cs.v2 carry the L2 hints (load_pack_cs / store_pack_cs).
// Different lanes and batches from VEC 8: not bitwise its results (fp32
// accumulation either way; tests compare with float64 at the dtype's tolerance).
template <typename T, typename P, typename index_t, bool ONE_COUNT = false>
__global__ void __launch_bounds__(BN_THREADS, 2)
batchnorm_rows_train_narrow(const T* __restrict__ x, T* __restrict__ y, acc_t<T>* __restrict__ part_n,
                            acc_t<T>* __restrict__ part_mean, acc_t<T>* __restrict__ part_m2,
                            acc_t<T>* __restrict__ mean_out, acc_t<T>* __restrict__ invstd_out,
                            P* __restrict__ running_mean, P* __restrict__ running_var,
                            const P* __restrict__ gamma, const P* __restrict__ beta, index_t M, int C, int cols,
                            acc_t<T> eps, acc_t<T> momentum, acc_t<T> unbias, int update_running, int cached,
                            int window, unsigned* __restrict__ arrive) {
    static_assert(sizeof(T) == 2, "16-bit storage only");
    RowsTrainOp<T, P, 4, ONE_COUNT> op;
    op.mean_out = mean_out;
    op.invstd_out = invstd_out;
    op.running_mean = running_mean;
    op.running_var = running_var;
    op.gamma = gamma;
    op.beta = beta;
    op.eps = eps;
    op.momentum = momentum;
    op.unbias = unbias;
    op.update_running = update_running;
    const T* const src[1] = {x};
    acc_t<T>* const parts[3] = {part_n, part_mean, part_m2};
    rows_resident<T, 4, false>(op, src, y, parts, M, C, cols, cached, window, arrive);
}

template <typename T, typename P, typename index_t>
__global__ void __launch_bounds__(BN_THREADS, 2)
batchnorm_rows_backward_narrow(const T* __restrict__ x, const T* __restrict__ dy,
                               const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ invstd,
                               const P* __restrict__ gamma, acc_t<T>* __restrict__ part_g,
                               acc_t<T>* __restrict__ part_gx, acc_t<T>* __restrict__ sums, T* __restrict__ dx,
                               P* __restrict__ dgamma, P* __restrict__ dbeta, index_t M, int C, int cols,
                               int cached, int window, unsigned* __restrict__ arrive) {
    static_assert(sizeof(T) == 2, "16-bit storage only");
    RowsBackwardOp<T, P, 4> op;
    op.mean = mean;
    op.invstd = invstd;
    op.gamma = gamma;
    op.sums = sums;
    op.dgamma = dgamma;
    op.dbeta = dbeta;
    op.C = C;
    const T* const src[2] = {x, dy};
    acc_t<T>* const parts[2] = {part_g, part_gx};
    rows_resident<T, 4, false>(op, src, dx, parts, M, C, cols, cached, window, arrive);
}
