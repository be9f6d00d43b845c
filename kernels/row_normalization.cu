// Row normalizations: layer norm, RMS norm, group norm, instance norm.
//
// A *row* is the set of values that share one mean and one variance: row r =
// (sample n, group g), r = n * G + g, with K channels per group and S spatial
// positions per channel, M = K * S values.  Element j of a row:
//   NCHW (also layer norm: a (rows, L) matrix is G = 1, K = L, S = 1):
//     offset r * M + j,                 channel g * K + j / S
//   NHWC: j = s * K + k,
//     offset (n * S + s) * G * K + g * K + k,   channel g * K + k
// gamma/beta (storage P) have one value per channel (per column for layer norm).
//
// T is the storage type of x, y, dy, dx; P that of gamma, beta, dgamma, dbeta
// (T, or float for a half T); A = acc_t<T> holds every intermediate and the
// saved mean / rstd (one per row).
//
// Forward and backward: one block per row (blockDim a power of two chosen on
// the host so that each thread holds about two 16-byte vectors).  Thread t
// handles vectors t, t + blockDim, ... of VEC values; VEC > 1 only when a
// vector stays in one row and maps to one channel (NCHW: S % VEC == 0) or to
// VEC consecutive channels (NCHW with S == 1, NHWC with K % VEC == 0), and the
// pointers are 16-byte aligned.  UNROLL vectors are loaded before any is
// used, so each thread keeps several loads in flight.
//
// Single read: when the row (forward) or the rows of x and dy (backward) fit in
// the dynamic shared memory the host grants (`cache`), pass 1 copies them
// there and the later passes read shared memory: x is read from DRAM once.
// Otherwise the later passes read global memory again (mostly L2 hits).
// Statistics are two-pass exact (mean, then the sum of squared deviations),
// in A, reduced in a fixed order (bitwise reproducible).
//
// Parameter gradients (dgamma = sum dy * xhat, dbeta = sum dy per channel) are
// reduced over every row, so they cannot come from the row blocks without
// atomics.  x is viewed as (outer, P, inner) with the row statistics of
// element (o, p, i) at index (o / ostep) * G + p / K:
//   layer norm (R, L, 1), ostep 1;  group NCHW (N, C, S), ostep 1;
//   group NHWC (N * S, C, 1), ostep S.
// norm_param_grads_columns (inner == 1) gives each thread one column p and a
// range of rows o (32 columns x 8 row lanes per block, grid.y splits the rows);
// norm_param_grads_planes (inner > 1) gives one block to each (o, p) plane.
// Both write partial sums per (split, p); norm_param_grads_finish adds them in
// order.  No atomics: results are deterministic.  Layer and RMS norm instead
// run norm_rows_backward_fused (dx and the gradient partials from one read of
// x and dy; see there) when a row fits NORM_FUSED_ITEMS vectors a thread, or
// with 16-byte rows norm_rows_backward_fused_pipelined (the same, the next
// rows' copies in flight; at the end of the file).
//
// Group / instance norm NCHW forward with 16-byte rows runs
// gn_rows_forward_pipelined instead (persistent blocks, two row buffers, the
// next row's cp.async copies overlap this row's reduction and stores); see
// there.  gn_rows_backward is an alternative backward kept behind a switch.
// On sm_90+ the group / instance norm NCHW backward first tries
// gn_rows_backward_cluster (a cluster of CL blocks per row, each holding its
// channels' x and dy in shared memory: both read once; see there), and the
// forward gn_rows_forward_cluster (the same split, statistics merged across
// the cluster; see there).
// Layer / RMS norm rows that are not 16-byte vectors (odd lengths, misaligned
// views) run norm_rows_forward_odd and, longer than 2048 values,
// norm_rows_backward_odd (the row's values in registers, scalar coalesced
// loads; at the end of the file).
#include "common.cuh"
#include "bulk_copy.cuh"

#define NORM_UNROLL 4

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) NormPack {
    T v[VEC];
};

template <typename index_t>
struct RowGeometry {
    index_t K, S, M;   // channels per group, spatial size, values per row
    int G;
    int nhwc;

    // Offset of vector `v` (VEC values starting at j = v * VEC) of row `row`.
    template <int VEC>
    __device__ __forceinline__ index_t offset(index_t row, index_t v) const {
        const index_t j = v * VEC;
        if (!nhwc) return row * M + j;
        const index_t n = row / G, g = row - n * G;
        const index_t s = j / K, k = j - s * K;
        return (n * S + s) * (index_t)G * K + g * K + k;
    }

    // Channel (parameter index) of the first value of vector v; later values of
    // the vector are at +1 (when `step`) or the same channel.
    template <int VEC>
    __device__ __forceinline__ index_t channel(index_t row, index_t v) const {
        const index_t g = row % G, j = v * VEC;
        if (nhwc) return g * K + j % K;
        return g * K + (S == 1 ? j : j / S);
    }

    __device__ __forceinline__ int step() const { return nhwc || S == 1; }
};

template <typename T, int VEC, typename index_t>
__device__ __forceinline__ void norm_load(const T* __restrict__ p, index_t off, acc_t<T> (&out)[VEC]) {
    const NormPack<T, VEC> pk = *reinterpret_cast<const NormPack<T, VEC>*>(p + off);
#pragma unroll
    for (int e = 0; e < VEC; ++e) out[e] = load(pk.v[e]);
}

template <typename T, int VEC, typename index_t>
__device__ __forceinline__ void norm_store(T* __restrict__ p, index_t off, const acc_t<T> (&in)[VEC]) {
    NormPack<T, VEC> pk;
#pragma unroll
    for (int e = 0; e < VEC; ++e) pk.v[e] = store<T>(in[e]);
    *reinterpret_cast<NormPack<T, VEC>*>(p + off) = pk;
}

// Vector v of the row: from the shared-memory copy when cached, else global.
template <typename T, int VEC, typename index_t>
__device__ __forceinline__ void row_vector(const T* __restrict__ global, const T* cached, int cache,
                                           const RowGeometry<index_t>& geo, index_t row, index_t v,
                                           acc_t<T> (&out)[VEC]) {
    if (cache) norm_load<T, VEC>(cached, v * VEC, out);
    else norm_load<T, VEC>(global, geo.template offset<VEC>(row, v), out);
}

template <typename P, typename A>
__device__ __forceinline__ A param_or(const P* __restrict__ p, long long i, A otherwise) {
    return p != nullptr ? A(load(p[i])) : otherwise;
}

// y = (x - mean) * rstd * gamma + beta per row (RMS: mean = 0, rstd from
// mean(x^2)).  Writes mean/rstd per row (mean_out is unused for RMS).
// write_y == 0 computes the statistics only (backward without saved ones).
template <typename T, typename P, typename index_t, int VEC>
__global__ void norm_rows_forward(const T* __restrict__ x, T* __restrict__ y,
                                  const P* __restrict__ gamma, const P* __restrict__ beta,
                                  acc_t<T>* __restrict__ mean_out, acc_t<T>* __restrict__ rstd_out,
                                  index_t K, index_t S, int G, int nhwc, acc_t<T> eps, int rms,
                                  int cache, int write_y) {
    typedef acc_t<T> A;
    extern __shared__ __align__(16) unsigned char norm_smem[];
    __shared__ A scratch[32];
    T* row_cache = reinterpret_cast<T*>(norm_smem);
    const RowGeometry<index_t> geo{K, S, K * S, G, nhwc};
    const index_t row = blockIdx.x;
    const index_t Mv = geo.M / VEC;
    const index_t T_ = blockDim.x;
    const A count = A(geo.M);

    // Pass 1: read the row (and cache it); sum of x, or of x^2 for RMS.
    A s1 = 0;
    for (index_t base = threadIdx.x; base < Mv; base += NORM_UNROLL * T_) {
        A v[NORM_UNROLL][VEC];
#pragma unroll
        for (int u = 0; u < NORM_UNROLL; ++u) {
            const index_t vi = base + u * T_;
            if (vi < Mv) norm_load<T, VEC>(x, geo.template offset<VEC>(row, vi), v[u]);
        }
#pragma unroll
        for (int u = 0; u < NORM_UNROLL; ++u) {
            const index_t vi = base + u * T_;
            if (vi < Mv) {
                if (cache) norm_store<T, VEC>(row_cache, vi * VEC, v[u]);
#pragma unroll
                for (int e = 0; e < VEC; ++e) s1 += rms ? v[u][e] * v[u][e] : v[u][e];
            }
        }
    }
    s1 = block_sum(s1, scratch);  // its barrier also publishes the cache
    A mean = 0, rstd;
    if (rms) {
        rstd = A(1) / sqrt(s1 / count + eps);
    } else {
        mean = s1 / count;
        A s2 = 0;
        for (index_t vi = threadIdx.x; vi < Mv; vi += T_) {
            A v[VEC];
            row_vector<T, VEC>(x, row_cache, cache, geo, row, vi, v);
#pragma unroll
            for (int e = 0; e < VEC; ++e) s2 += (v[e] - mean) * (v[e] - mean);
        }
        s2 = block_sum(s2, scratch);
        rstd = A(1) / sqrt(s2 / count + eps);
    }
    if (threadIdx.x == 0) {
        if (!rms) mean_out[row] = mean;
        rstd_out[row] = rstd;
    }
    if (!write_y) return;
    const int step = geo.step();
    for (index_t vi = threadIdx.x; vi < Mv; vi += T_) {
        A v[VEC];
        row_vector<T, VEC>(x, row_cache, cache, geo, row, vi, v);
        const index_t c0 = geo.template channel<VEC>(row, vi);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            const index_t c = c0 + (step ? e : 0);
            v[e] = (v[e] - mean) * rstd * param_or(gamma, c, A(1)) + param_or(beta, c, A(0));
        }
        norm_store<T, VEC>(y, geo.template offset<VEC>(row, vi), v);
    }
}

// Per-channel sums of dy and dy * (x - mean) of one NCHW row (K planes of S
// values) for the parameter gradients, deterministic without atomics: the 32
// vectors a warp reads at once are consecutive, so with S / VEC >= 32 they lie
// in at most two planes (k0 = the plane of lane 0's vector, and k0 + 1); two
// warp sums per quantity, and lane 0 adds them to its warp's own slice
// acc[warp][k][2] of shared memory (no other thread writes it).  After the
// block's barriers, thread k < K adds plane k's slices in warp order.
template <int VEC, typename A, typename index_t>
__device__ __forceinline__ void plane_sums_add(A* acc, index_t vi, index_t Mv, index_t S, index_t K,
                                               const A (&xv)[VEC],
                                               const A (&dv)[VEC], A mean) {
    const int lane = threadIdx.x & 31;
    const index_t first = vi - lane;  // lane 0's vector
    const index_t k0 = first * VEC / S;
    A d = 0, dx = 0;
    bool hi = false;
    if (vi < Mv) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            d += dv[e];
            dx += dv[e] * (xv[e] - mean);
        }
        hi = vi * VEC / S != k0;
    }
    const A lo_d = warp_sum(hi ? A(0) : d), lo_dx = warp_sum(hi ? A(0) : dx);
    const A hi_d = warp_sum(hi ? d : A(0)), hi_dx = warp_sum(hi ? dx : A(0));
    if (lane == 0 && first < Mv) {
        A* slot = acc + 2 * k0;
        slot[0] += lo_d;
        slot[1] += lo_dx;
        if (k0 + 1 < K) {  // zeros when no lane of the warp is in plane k0 + 1
            slot[2] += hi_d;
            slot[3] += hi_dx;
        }
    }
}

// dx = rstd * (g*dy - mean(g*dy) - xhat * mean(g*dy*xhat)) per row, g = gamma
// of each value's channel (RMS: without the mean(g*dy) term, xhat = x * rstd).
// plane_sums (NCHW group norm, S / VEC >= 32): also the per-(sample, channel)
// parameter-gradient partials part_dgamma / part_dbeta [row * K + k] = sums
// of dy * xhat and dy over plane k of the row (plane_sums_add), so the
// gradient needs no second read of x and dy; the warp slices take
// 2 * K * warps values of dynamic shared memory after the caches.
template <typename T, typename P, typename index_t, int VEC>
__global__ void norm_rows_backward(const T* __restrict__ dy, const T* __restrict__ x,
                                   const P* __restrict__ gamma, const acc_t<T>* __restrict__ mean_in,
                                   const acc_t<T>* __restrict__ rstd_in, T* __restrict__ dx,
                                   index_t K, index_t S, int G, int nhwc, int rms, int cache,
                                   acc_t<T>* __restrict__ part_dgamma, acc_t<T>* __restrict__ part_dbeta,
                                   int plane_sums) {
    typedef acc_t<T> A;
    extern __shared__ __align__(16) unsigned char norm_smem[];
    __shared__ A scratch[32];
    const RowGeometry<index_t> geo{K, S, K * S, G, nhwc};
    T* x_cache = reinterpret_cast<T*>(norm_smem);
    T* dy_cache = x_cache + geo.M;  // M * sizeof(T) is a multiple of 16 when cached with VEC > 1
    const index_t row = blockIdx.x;
    const index_t Mv = geo.M / VEC;
    const index_t T_ = blockDim.x;
    const A count = A(geo.M);
    const A mean = rms ? A(0) : mean_in[row];
    const A rstd = rstd_in[row];
    const int step = geo.step();
    const int warp = threadIdx.x >> 5;
    // This warp's slice of the plane sums, after the caches (16-byte aligned).
    A* plane_acc = reinterpret_cast<A*>(norm_smem + (cache ? (2 * geo.M * sizeof(T) + 15) / 16 * 16 : 0)) +
                   (index_t)warp * 2 * K;
    if (plane_sums) {
        for (index_t i = threadIdx.x & 31; i < 2 * K; i += 32) plane_acc[i] = A(0);
        __syncwarp();
    }

    A sum_g = 0, sum_gx = 0;  // sum g*dy, sum g*dy*xhat
    // The loop runs while the warp's first lane has vectors left, so that every
    // lane takes part in plane_sums_add's shuffles (blockDim is a multiple of 32).
    for (index_t base = threadIdx.x; base - (threadIdx.x & 31) < Mv; base += NORM_UNROLL * T_) {
        A xv[NORM_UNROLL][VEC], dv[NORM_UNROLL][VEC];
#pragma unroll
        for (int u = 0; u < NORM_UNROLL; ++u) {
            const index_t vi = base + u * T_;
            if (vi < Mv) {
                const index_t off = geo.template offset<VEC>(row, vi);
                norm_load<T, VEC>(x, off, xv[u]);
                norm_load<T, VEC>(dy, off, dv[u]);
            }
        }
#pragma unroll
        for (int u = 0; u < NORM_UNROLL; ++u) {
            const index_t vi = base + u * T_;
            if (vi < Mv) {
                if (cache) {
                    norm_store<T, VEC>(x_cache, vi * VEC, xv[u]);
                    norm_store<T, VEC>(dy_cache, vi * VEC, dv[u]);
                }
                const index_t c0 = geo.template channel<VEC>(row, vi);
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    const A gdy = dv[u][e] * param_or(gamma, c0 + (step ? e : 0), A(1));
                    sum_g += gdy;
                    sum_gx += gdy * (xv[u][e] - mean) * rstd;
                }
            }
        }
        if (plane_sums) {
#pragma unroll
            for (int u = 0; u < NORM_UNROLL; ++u) {
                // every lane of the warp takes part (its vector may be past the row)
                plane_sums_add<VEC>(plane_acc, base + u * T_, Mv, geo.S, geo.K, xv[u], dv[u], mean);
            }
        }
    }
    sum_g = block_sum(sum_g, scratch);
    sum_gx = block_sum(sum_gx, scratch);  // its barriers also publish the plane sums
    if (plane_sums) {
        const int warps = (int)(T_ >> 5);
        A* acc0 = plane_acc - (index_t)warp * 2 * K;
        for (index_t k = threadIdx.x; k < K; k += T_) {
            A d = 0, dxs = 0;
            for (int w = 0; w < warps; ++w) {
                d += acc0[(index_t)w * 2 * K + 2 * k];
                dxs += acc0[(index_t)w * 2 * K + 2 * k + 1];
            }
            part_dbeta[row * K + k] = d;
            part_dgamma[row * K + k] = dxs * rstd;
        }
    }
    const A mean_g = rms ? A(0) : sum_g / count;
    const A mean_gx = sum_gx / count;
    for (index_t vi = threadIdx.x; vi < Mv; vi += T_) {
        A xv[VEC], dv[VEC];
        row_vector<T, VEC>(x, x_cache, cache, geo, row, vi, xv);
        row_vector<T, VEC>(dy, dy_cache, cache, geo, row, vi, dv);
        const index_t c0 = geo.template channel<VEC>(row, vi);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            const A gdy = dv[e] * param_or(gamma, c0 + (step ? e : 0), A(1));
            xv[e] = rstd * (gdy - mean_g - (xv[e] - mean) * rstd * mean_gx);
        }
        norm_store<T, VEC>(dx, geo.template offset<VEC>(row, vi), xv);
    }
}

// Two block sums with one pair of barriers (scratch holds 64 values).
template <typename A>
__device__ __forceinline__ void block_sum2(A& a, A& b, A* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
    a = warp_sum(a);
    b = warp_sum(b);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) {
        scratch[warp] = a;
        scratch[32 + warp] = b;
    }
    __syncthreads();
    a = warp_sum(lane < warps ? scratch[lane] : A(0));
    b = warp_sum(lane < warps ? scratch[32 + lane] : A(0));
}

// The pieces norm_rows_backward_fused and its _pipelined twin share; item(u) /
// valid(u) are each kernel's own index arithmetic for vector u of its thread.
// Start: the thread's gamma in registers, dgamma / dbeta sums zero.
template <int I, int VEC, typename A, typename P, typename index_t, typename Item>
__device__ __forceinline__ void norm_fused_start(A (&g)[I][VEC], A (&dg)[I][VEC], A (&db)[I][VEC],
                                                 const P* __restrict__ gamma, index_t Mv, Item item) {
#pragma unroll
    for (int u = 0; u < I; ++u) {
        const index_t vi = item(u);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            dg[u][e] = db[u][e] = A(0);
            g[u][e] = vi < Mv ? param_or(gamma, vi * VEC + e, A(1)) : A(0);
        }
    }
}

// This thread's terms of the row's sums of gamma * dy and gamma * dy * xhat.
template <int I, int VEC, typename A, typename Valid>
__device__ __forceinline__ void norm_fused_sums(const A (&xv)[I][VEC], const A (&dv)[I][VEC], const A (&g)[I][VEC],
                                                A mean, A rstd, A& sum_g, A& sum_gx, Valid valid) {
#pragma unroll
    for (int u = 0; u < I; ++u) {
        if (valid(u)) {
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const A gdy = dv[u][e] * g[u][e];
                sum_g += gdy;
                sum_gx += gdy * (xv[u][e] - mean) * rstd;
            }
        }
    }
}

// One vector: dgamma / dbeta sums updated, x replaced by dx.
template <int VEC, typename A>
__device__ __forceinline__ void norm_fused_dx(A (&xv)[VEC], const A (&dv)[VEC], const A (&g)[VEC], A (&dg)[VEC],
                                              A (&db)[VEC], A mean, A rstd, A mean_g, A mean_gx) {
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
        const A xhat = (xv[e] - mean) * rstd;
        dg[e] += dv[e] * xhat;
        db[e] += dv[e];
        xv[e] = rstd * (dv[e] * g[e] - mean_g - xhat * mean_gx);
    }
}

// Layer / RMS norm backward with the parameter gradients fused (G == 1, S == 1,
// NCHW: element j of every row is column j).  A persistent grid (the blocks
// resident at once) walks rows blockIdx.x, + gridDim.x, ...; thread t owns
// vectors t and t + blockDim (NORM_FUSED_ITEMS; the host picks blockDim >= M /
// (2 VEC)), so its columns are the same in every row and it accumulates
// dgamma = sum dy * xhat and dbeta = sum dy for them in registers while the
// row's x and dy, also in registers, give dx.  x and dy are read once (the
// separate gradient kernels re-read both: 5 tensors' traffic instead of 3).
// Each block writes its column partials at [blockIdx.x * M + column];
// norm_param_grads_finish_wide adds them in block order.
#define NORM_FUSED_ITEMS 2
template <typename T, typename P, typename index_t, int VEC>
__global__ void norm_rows_backward_fused(const T* __restrict__ dy, const T* __restrict__ x,
                                         const P* __restrict__ gamma, const acc_t<T>* __restrict__ mean_in,
                                         const acc_t<T>* __restrict__ rstd_in, T* __restrict__ dx,
                                         acc_t<T>* __restrict__ part_dgamma, acc_t<T>* __restrict__ part_dbeta,
                                         index_t rows, index_t M, int rms) {
    typedef acc_t<T> A;
    __shared__ A scratch[64];
    const index_t Mv = M / VEC;
    const index_t T_ = blockDim.x;
    const A count = A(M);
    A dg[NORM_FUSED_ITEMS][VEC], db[NORM_FUSED_ITEMS][VEC], g[NORM_FUSED_ITEMS][VEC];
    norm_fused_start(g, dg, db, gamma, Mv, [&](int u) -> index_t { return threadIdx.x + u * T_; });
    for (index_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const A mean = rms ? A(0) : mean_in[row];
        const A rstd = rstd_in[row];
        A xv[NORM_FUSED_ITEMS][VEC], dv[NORM_FUSED_ITEMS][VEC];
#pragma unroll
        for (int u = 0; u < NORM_FUSED_ITEMS; ++u) {
            const index_t vi = threadIdx.x + u * T_;
            if (vi < Mv) {
                norm_load<T, VEC>(x, row * M + vi * VEC, xv[u]);
                norm_load<T, VEC>(dy, row * M + vi * VEC, dv[u]);
            }
        }
        A sum_g = 0, sum_gx = 0;
        norm_fused_sums(xv, dv, g, mean, rstd, sum_g, sum_gx, [&](int u) {
            const index_t vi = threadIdx.x + u * T_;
            return vi < Mv;
        });
        block_sum2(sum_g, sum_gx, scratch);
        const A mean_g = rms ? A(0) : sum_g / count;
        const A mean_gx = sum_gx / count;
#pragma unroll
        for (int u = 0; u < NORM_FUSED_ITEMS; ++u) {
            const index_t vi = threadIdx.x + u * T_;
            if (vi < Mv) {
                norm_fused_dx(xv[u], dv[u], g[u], dg[u], db[u], mean, rstd, mean_g, mean_gx);
                norm_store<T, VEC>(dx, row * M + vi * VEC, xv[u]);
            }
        }
    }
#pragma unroll
    for (int u = 0; u < NORM_FUSED_ITEMS; ++u) {
        const index_t vi = threadIdx.x + u * T_;
        if (vi < Mv) {
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                part_dgamma[(index_t)blockIdx.x * M + vi * VEC + e] = dg[u][e];
                part_dbeta[(index_t)blockIdx.x * M + vi * VEC + e] = db[u][e];
            }
        }
    }
}

// dgamma[p] = sum over splits s of part[s * count + p], many splits: block (32,
// L) per 32 columns (L = blockDim.y <= 32 split lanes: 8, or 32 for the
// pipelined kernel's ~1000 splits), split lane ty adds splits ty, ty + L, ...
// in that order, NORM_FINISH_AHEAD loads of each array in flight (1056 splits
// with 32 lanes: 5 dependent steps; with 8 lanes and 4 ahead main took 33,
// ~256 KB in flight on 32 SMs for 8.7 MB), then lane 0 adds the L lane sums in
// order.  Deterministic; the order does not depend on the loads in flight.
#define NORM_FINISH_AHEAD 8
template <typename A, typename P>
__global__ void norm_param_grads_finish_wide(const A* __restrict__ part_dgamma, const A* __restrict__ part_dbeta,
                                             P* __restrict__ dgamma, P* __restrict__ dbeta, long long splits,
                                             long long count) {
    __shared__ A red_g[32][33], red_b[32][33];
    const long long p = (long long)blockIdx.x * 32 + threadIdx.x;
    const long long lanes = blockDim.y;
    A sg = 0, sb = 0;
    if (p < count) {
        for (long long s0 = threadIdx.y; s0 < splits; s0 += lanes * NORM_FINISH_AHEAD) {
            A vg[NORM_FINISH_AHEAD], vb[NORM_FINISH_AHEAD];
#pragma unroll
            for (int u = 0; u < NORM_FINISH_AHEAD; ++u) {
                const long long s = s0 + lanes * u;
                vg[u] = s < splits ? part_dgamma[s * count + p] : A(0);
                vb[u] = s < splits ? part_dbeta[s * count + p] : A(0);
            }
#pragma unroll
            for (int u = 0; u < NORM_FINISH_AHEAD; ++u) {
                sg += vg[u];
                sb += vb[u];
            }
        }
    }
    red_g[threadIdx.y][threadIdx.x] = sg;
    red_b[threadIdx.y][threadIdx.x] = sb;
    __syncthreads();
    if (threadIdx.y == 0 && p < count) {
        for (int k = 1; k < (int)blockDim.y; ++k) {
            sg += red_g[k][threadIdx.x];
            sb += red_b[k][threadIdx.x];
        }
        dgamma[p] = store<P>(sg);
        if (dbeta != nullptr) dbeta[p] = store<P>(sb);
    }
}

// Statistics of element (o, p, *): row (o / ostep) * G + p / K.
template <typename index_t>
__device__ __forceinline__ index_t stats_row(index_t o, index_t p, index_t ostep, int G, index_t K) {
    return (o / ostep) * (index_t)G + p / K;
}

// inner == 1: block (32, 8) covers 32 columns; blockIdx.y is a split of the rows.
template <typename T, typename index_t>
__global__ void norm_param_grads_columns(const T* __restrict__ dy, const T* __restrict__ x,
                                         const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ rstd,
                                         acc_t<T>* __restrict__ part_dgamma, acc_t<T>* __restrict__ part_dbeta,
                                         index_t outer, index_t P, index_t ostep, int G, index_t K,
                                         index_t rows_per_split, int rms) {
    typedef acc_t<T> A;
    __shared__ A red_g[8][33], red_b[8][33];
    const index_t p = (index_t)blockIdx.x * 32 + threadIdx.x;
    const index_t o0 = (index_t)blockIdx.y * rows_per_split;
    const index_t o1 = o0 + rows_per_split < outer ? o0 + rows_per_split : outer;
    A dg = 0, db = 0;
    if (p < P) {
        for (index_t o = o0 + threadIdx.y; o < o1; o += 8 * NORM_UNROLL) {
            A xv[NORM_UNROLL], dv[NORM_UNROLL];
#pragma unroll
            for (int u = 0; u < NORM_UNROLL; ++u) {
                const index_t oo = o + u * 8;
                if (oo < o1) {
                    xv[u] = load(x[oo * P + p]);
                    dv[u] = load(dy[oo * P + p]);
                }
            }
#pragma unroll
            for (int u = 0; u < NORM_UNROLL; ++u) {
                const index_t oo = o + u * 8;
                if (oo < o1) {
                    const index_t r = stats_row(oo, p, ostep, G, K);
                    const A xhat = (xv[u] - (rms ? A(0) : mean[r])) * rstd[r];
                    dg += dv[u] * xhat;
                    db += dv[u];
                }
            }
        }
    }
    red_g[threadIdx.y][threadIdx.x] = dg;
    red_b[threadIdx.y][threadIdx.x] = db;
    __syncthreads();
    if (threadIdx.y == 0 && p < P) {
        for (int k = 1; k < 8; ++k) {
            dg += red_g[k][threadIdx.x];
            db += red_b[k][threadIdx.x];
        }
        part_dgamma[(index_t)blockIdx.y * P + p] = dg;
        part_dbeta[(index_t)blockIdx.y * P + p] = db;
    }
}

// inner > 1: block per (o, p) plane of `inner` contiguous values; writes partials at o * P + p.
template <typename T, typename index_t>
__global__ void norm_param_grads_planes(const T* __restrict__ dy, const T* __restrict__ x,
                                        const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ rstd,
                                        acc_t<T>* __restrict__ part_dgamma, acc_t<T>* __restrict__ part_dbeta,
                                        index_t P, index_t inner, int G, index_t K) {
    typedef acc_t<T> A;
    __shared__ A scratch[32];
    const index_t plane = blockIdx.x;
    const index_t o = plane / P, p = plane - o * P;
    const index_t r = stats_row(o, p, (index_t)1, G, K);
    const A m = mean[r], s = rstd[r];
    const T* xp = x + plane * inner;
    const T* dp = dy + plane * inner;
    A dg = 0, db = 0;
    for (index_t i = threadIdx.x; i < inner; i += blockDim.x) {
        const A d = load(dp[i]);
        dg += d * (load(xp[i]) - m) * s;
        db += d;
    }
    dg = block_sum(dg, scratch);
    db = block_sum(db, scratch);
    if (threadIdx.x == 0) {
        part_dgamma[plane] = dg;
        part_dbeta[plane] = db;
    }
}

// dgamma[p] = sum over splits of the partials, in split order.
template <typename A, typename P>
__global__ void norm_param_grads_finish(const A* __restrict__ part_dgamma, const A* __restrict__ part_dbeta,
                                        P* __restrict__ dgamma, P* __restrict__ dbeta, long long splits,
                                        long long count) {
    const long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= count) return;
    A g = 0, b = 0;
    for (long long s = 0; s < splits; ++s) {
        g += part_dgamma[s * count + p];
        b += part_dbeta[s * count + p];
    }
    dgamma[p] = store<P>(g);
    if (dbeta != nullptr) dbeta[p] = store<P>(b);
}

// ---------------------------------------------------------------------------
// Group / instance norm, NCHW (rows of K contiguous planes of S values).
//
// gn_rows_forward_pipelined: a persistent block (one per SM when a row is
// ~100 KB) walks rows blockIdx.x, + gridDim.x, ... with two row buffers in
// dynamic shared memory: while row r is reduced (two-pass exact statistics
// from shared memory) and normalized to global memory, the 16-byte cp.async
// copies of row r + gridDim.x into the other buffer are already in flight,
// so the SM's loads overlap its stores (one block per row per launch ran
// load, reduce, store one after another).  Needs VEC > 1 (16-byte aligned
// rows).  cp.async needs sm_80; older devices copy synchronously.
template <typename T, int VEC>
__device__ __forceinline__ void copy16_async(T* smem, const T* __restrict__ gmem) {
#if __CUDA_ARCH__ >= 800
    unsigned s;
    asm volatile("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(s) : "l"(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
#else
    *reinterpret_cast<NormPack<T, VEC>*>(smem) = *reinterpret_cast<const NormPack<T, VEC>*>(gmem);
#endif
}

__device__ __forceinline__ void copy_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Wait until at most one committed group (the most recent) is still in flight.
__device__ __forceinline__ void copy_async_wait_all_but_one() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group 1;" ::: "memory");
#endif
}

template <typename T, typename P, typename index_t, int VEC>
__global__ void __launch_bounds__(1024) gn_rows_forward_pipelined(
        const T* __restrict__ x, T* __restrict__ y, const P* __restrict__ gamma, const P* __restrict__ beta,
        acc_t<T>* __restrict__ mean_out, acc_t<T>* __restrict__ rstd_out, index_t K, index_t S, int G,
        index_t rows, acc_t<T> eps) {
    typedef acc_t<T> A;
    extern __shared__ __align__(16) unsigned char norm_smem[];
    __shared__ A scratch[32];
    const index_t M = K * S;
    const index_t Mv = M / VEC;
    const index_t T_ = blockDim.x;
    const index_t stride = (M * (index_t)sizeof(T) + 15) / 16 * 16 / (index_t)sizeof(T);
    T* const buf0 = reinterpret_cast<T*>(norm_smem);  // buffer b at buf0 + b * stride
    const A count = A(M);
    index_t row = blockIdx.x;
    if (row >= rows) return;
    for (index_t v = threadIdx.x; v < Mv; v += T_) copy16_async<T, VEC>(buf0 + v * VEC, x + row * M + v * VEC);
    copy_async_commit();
    for (int it = 0; row < rows; row += gridDim.x, ++it) {
        const T* cur = buf0 + (it & 1) * stride;
        const index_t next = row + gridDim.x;
        if (next < rows) {  // the other buffer was last read before the previous iteration's final barrier
            T* nb = buf0 + ((it + 1) & 1) * stride;
            for (index_t v = threadIdx.x; v < Mv; v += T_) copy16_async<T, VEC>(nb + v * VEC, x + next * M + v * VEC);
        }
        copy_async_commit();  // possibly empty: the wait below then still leaves only this group
        copy_async_wait_all_but_one();
        __syncthreads();  // every thread's copies of the current row have landed
        A s1 = 0;
        for (index_t v = threadIdx.x; v < Mv; v += T_) {
            A xv[VEC];
            norm_load<T, VEC>(cur, v * VEC, xv);
#pragma unroll
            for (int e = 0; e < VEC; ++e) s1 += xv[e];
        }
        const A mean = block_sum(s1, scratch) / count;
        A s2 = 0;
        for (index_t v = threadIdx.x; v < Mv; v += T_) {
            A xv[VEC];
            norm_load<T, VEC>(cur, v * VEC, xv);
#pragma unroll
            for (int e = 0; e < VEC; ++e) s2 += (xv[e] - mean) * (xv[e] - mean);
        }
        const A rstd = A(1) / sqrt(block_sum(s2, scratch) / count + eps);
        if (threadIdx.x == 0) {
            mean_out[row] = mean;
            rstd_out[row] = rstd;
        }
        const index_t cbase = (row % G) * K;
        for (index_t v = threadIdx.x; v < Mv; v += T_) {
            A xv[VEC];
            norm_load<T, VEC>(cur, v * VEC, xv);
            const index_t c = cbase + v * VEC / S;  // S % VEC == 0: one channel per vector
            const A scale = rstd * param_or(gamma, c, A(1));
            const A shift = param_or(beta, c, A(0));
#pragma unroll
            for (int e = 0; e < VEC; ++e) xv[e] = (xv[e] - mean) * scale + shift;
            norm_store<T, VEC>(y, row * M + v * VEC, xv);
        }
        __syncthreads();  // the buffer just read is the next iteration's copy target
    }
}

// gn_rows_backward: dx and the per-(sample, channel) dgamma/dbeta partials of
// one NCHW row per block, with cheap plane sums.  Warp w owns the contiguous
// vectors [w R, (w + 1) R) of the row (R = ceil(Mv / warps), lanes 32 apart;
// the host checks R <= S / VEC, so a warp's range lies in at most two planes
// k0 = w R VEC / S and k0 + 1).  Each lane sums dy and dy * (x - mean) for
// the two planes in 4 registers (a compare picks the plane, no shuffles in
// the loop); at the end 4 warp sums per warp go to shared memory and thread k
// adds plane k's warp values in warp order (deterministic).  The row's
// sum g*dy and sum g*dy*xhat (gamma per channel) then follow from the K
// plane sums, so the loop loads no gamma.  cache: 2 = x and dy kept in
// dynamic shared memory (200 KB fp32 rows at 8x56x56: one block per SM),
// 1 = x only (dy re-read, mostly from L2: the dx pass walks each warp's
// range last to first), 0 = neither.  Shared memory after the caches (16-
// byte aligned): 4 values per warp, then 2 per plane.  Measured (H100,
// 64x256x56x56 / 32 groups): slower than norm_rows_backward (0.308 ms with
// cache 1 at 2 blocks/SM, 0.337 with cache 2, vs 0.301): the 32 warps of a
// block stream 32 separate 3 KB ranges instead of one contiguous 16 KB run
// per step.  Off by default (row_normalization.GN_BACKWARD); tested.
template <typename T, typename P, typename index_t, int VEC>
__global__ void __launch_bounds__(1024) gn_rows_backward(
        const T* __restrict__ dy, const T* __restrict__ x, const P* __restrict__ gamma,
        const acc_t<T>* __restrict__ mean_in, const acc_t<T>* __restrict__ rstd_in, T* __restrict__ dx,
        index_t K, index_t S, int G, int cache, acc_t<T>* __restrict__ part_dgamma,
        acc_t<T>* __restrict__ part_dbeta) {
    typedef acc_t<T> A;
    extern __shared__ __align__(16) unsigned char norm_smem[];
    const index_t M = K * S;
    const index_t Mv = M / VEC, PV = S / VEC;
    const index_t row = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int warps = blockDim.x >> 5;
    const index_t R = (Mv + warps - 1) / warps;
    const index_t bytes = (M * (index_t)sizeof(T) + 15) / 16 * 16;
    T* x_cache = reinterpret_cast<T*>(norm_smem);
    T* dy_cache = reinterpret_cast<T*>(norm_smem + bytes);
    A* warp_acc = reinterpret_cast<A*>(norm_smem + (cache == 2 ? 2 * bytes : cache == 1 ? bytes : 0));
    A* plane_acc = warp_acc + 4 * warps;
    const A mean = mean_in[row], rstd = rstd_in[row];
    const A count = A(M);
    const index_t first = (index_t)warp * R;
    const index_t end = first + R < Mv ? first + R : Mv;
    const index_t k0 = first < Mv ? first / PV : 0;
    const index_t hi_from = (k0 + 1) * PV;  // first vector of plane k0 + 1
    const T* xr = x + row * M;
    const T* dyr = dy + row * M;

    A d_lo = 0, t_lo = 0, d_hi = 0, t_hi = 0;
    for (index_t base = first + lane; base < end; base += 32 * NORM_UNROLL) {
        A xv[NORM_UNROLL][VEC], dv[NORM_UNROLL][VEC];
#pragma unroll
        for (int u = 0; u < NORM_UNROLL; ++u) {
            const index_t vi = base + 32 * u;
            if (vi < end) {
                norm_load<T, VEC>(xr, vi * VEC, xv[u]);
                norm_load<T, VEC>(dyr, vi * VEC, dv[u]);
            }
        }
#pragma unroll
        for (int u = 0; u < NORM_UNROLL; ++u) {
            const index_t vi = base + 32 * u;
            if (vi < end) {
                if (cache >= 1) norm_store<T, VEC>(x_cache, vi * VEC, xv[u]);
                if (cache == 2) norm_store<T, VEC>(dy_cache, vi * VEC, dv[u]);
                A d = 0, t = 0;
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    d += dv[u][e];
                    t += dv[u][e] * (xv[u][e] - mean);
                }
                if (vi >= hi_from) {
                    d_hi += d;
                    t_hi += t;
                } else {
                    d_lo += d;
                    t_lo += t;
                }
            }
        }
    }
    d_lo = warp_sum(d_lo);
    t_lo = warp_sum(t_lo);
    d_hi = warp_sum(d_hi);
    t_hi = warp_sum(t_hi);
    if (lane == 0) {
        warp_acc[4 * warp + 0] = d_lo;
        warp_acc[4 * warp + 1] = t_lo;
        warp_acc[4 * warp + 2] = d_hi;
        warp_acc[4 * warp + 3] = t_hi;
    }
    __syncthreads();  // also publishes the caches
    for (index_t k = threadIdx.x; k < K; k += blockDim.x) {
        A d = 0, t = 0;
        for (int w = 0; w < warps; ++w) {
            const index_t f = (index_t)w * R;
            if (f >= Mv) break;
            const index_t kw = f / PV;
            if (kw == k) {
                d += warp_acc[4 * w + 0];
                t += warp_acc[4 * w + 1];
            } else if (kw + 1 == k) {
                d += warp_acc[4 * w + 2];
                t += warp_acc[4 * w + 3];
            }
        }
        plane_acc[2 * k] = d;
        plane_acc[2 * k + 1] = t;
        part_dbeta[row * K + k] = d;
        part_dgamma[row * K + k] = t * rstd;
    }
    __syncthreads();
    const index_t cbase = (row % G) * K;
    A sum_g = 0, sum_t = 0;  // sum g*dy, sum g*dy*(x - mean)
    for (index_t k = 0; k < K; ++k) {
        const A g = param_or(gamma, cbase + k, A(1));
        sum_g += g * plane_acc[2 * k];
        sum_t += g * plane_acc[2 * k + 1];
    }
    const A mean_g = sum_g / count;
    const A mean_gx = sum_t * rstd / count;
    const A g_lo = param_or(gamma, cbase + k0, A(1));
    const A g_hi = k0 + 1 < K ? param_or(gamma, cbase + k0 + 1, A(1)) : A(0);
    // dx, each warp's range last to first (the most recently read vectors first).
    const index_t steps = (R + 31) / 32;
    for (index_t s0 = steps - 1; s0 >= 0; s0 -= NORM_UNROLL) {
        A xv[NORM_UNROLL][VEC], dv[NORM_UNROLL][VEC];
#pragma unroll
        for (int u = 0; u < NORM_UNROLL; ++u) {
            const index_t vi = first + lane + 32 * (s0 - u);
            if (s0 - u >= 0 && vi < end) {
                if (cache >= 1) norm_load<T, VEC>(x_cache, vi * VEC, xv[u]);
                else norm_load<T, VEC>(xr, vi * VEC, xv[u]);
                if (cache == 2) norm_load<T, VEC>(dy_cache, vi * VEC, dv[u]);
                else norm_load<T, VEC>(dyr, vi * VEC, dv[u]);
            }
        }
#pragma unroll
        for (int u = 0; u < NORM_UNROLL; ++u) {
            const index_t vi = first + lane + 32 * (s0 - u);
            if (s0 - u >= 0 && vi < end) {
                const A g = vi >= hi_from ? g_hi : g_lo;
#pragma unroll
                for (int e = 0; e < VEC; ++e)
                    xv[u][e] = rstd * (g * dv[u][e] - mean_g - (xv[u][e] - mean) * rstd * mean_gx);
                norm_store<T, VEC>(dx + row * M, vi * VEC, xv[u]);
            }
        }
    }
}

// Warp totals of four values in 6 shuffles (transpose-reduce): the halves of
// the warp swap two values (offset 16), the quarters one (offset 8), then
// three butterfly steps.  Lanes 8q .. 8q + 7 return the total of v[q].  Fixed
// order: deterministic.
template <typename A>
__device__ __forceinline__ A warp_sum4(A v0, A v1, A v2, A v3) {
    const int lane = threadIdx.x & 31;
    const bool b4 = (lane & 16) != 0, b3 = (lane & 8) != 0;
    const A k0 = (b4 ? v2 : v0) + __shfl_xor_sync(0xffffffffu, b4 ? v0 : v2, 16);
    const A k1 = (b4 ? v3 : v1) + __shfl_xor_sync(0xffffffffu, b4 ? v1 : v3, 16);
    A m = (b3 ? k1 : k0) + __shfl_xor_sync(0xffffffffu, b3 ? k0 : k1, 8);
#pragma unroll
    for (int offset = 4; offset > 0; offset >>= 1) m += __shfl_xor_sync(0xffffffffu, m, offset);
    return m;
}

__device__ __forceinline__ void copy_async_wait_all() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group 0;" ::: "memory");
#endif
}

// Bring `bytes` from p on into L2 (one prefetch per 32-byte sector), spread
// over the block's threads.  No data comes back to the SM.
__device__ __forceinline__ void prefetch_l2(const void* p, unsigned bytes) {
    const char* c = static_cast<const char*>(p);
    for (unsigned o = threadIdx.x * 32u; o < bytes; o += blockDim.x * 32u)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(c + o));
}

// Hopper bulk copies (shared_address, mbarrier_init1, bulk_copy_expect,
// mbarrier_wait): bulk_copy.cuh.

// The copies of one row (x, and dy with dy_smem; `off` its offset) into buffer b:
// bulk (thread 0, counted on bars[b]) or 16-byte cp.async from every thread.
template <typename T, int VEC, typename index_t>
__device__ __forceinline__ void gn_copy_row(T* xbuf, T* dybuf, unsigned stride, const T* __restrict__ x,
                                            const T* __restrict__ dy, index_t off, unsigned Mv, unsigned b,
                                            bool dy_smem, bool bulk, unsigned long long* bars) {
    if (bulk) {
        if (threadIdx.x == 0) {
            const unsigned bytes = Mv * VEC * (unsigned)sizeof(T);
            bulk_copy_expect(&bars[b], xbuf + b * stride, x + off, bytes, dy_smem ? 2 * bytes : bytes);
            if (dy_smem) bulk_copy_expect(&bars[b], dybuf + b * stride, dy + off, bytes, 0u);
        }
        return;
    }
    for (unsigned v = threadIdx.x; v < Mv; v += blockDim.x)
        copy16_async<T, VEC>(xbuf + b * stride + v * VEC, x + off + v * VEC);
    if (dy_smem)
        for (unsigned v = threadIdx.x; v < Mv; v += blockDim.x)
            copy16_async<T, VEC>(dybuf + b * stride + v * VEC, dy + off + v * VEC);
}

// gn_rows_backward_pipelined: group / instance norm NCHW backward, dx and the
// per-(sample, channel) dgamma/dbeta partials.  A persistent block (one per SM
// for 100 KB fp32 rows) walks rows blockIdx.x, + gridDim.x, ...  Dynamic
// shared memory: two x row buffers (x_b at buf + b * stride), then, with
// dy_smem, two dy row buffers, then per warp the plane slices lo[K][2],
// hi[K][2], then 3 K per-plane totals.  At the top of each row the block waits
// for the row's cp.async copies, and after one barrier (which also ends the
// previous row, so the other buffers are free) issues the 16-byte cp.async
// copies of the next row's x (and dy with dy_smem) into the other buffers: the
// DRAM reads of row r + gridDim.x overlap all of row r's work (reads, shuffles,
// stores), as in gn_rows_forward_pipelined.  Without dy_smem, dy is read from
// global memory in pass 1 and again in pass 2 (the second read is an L2 hit:
// the resident rows' dy is ~13 MB); `flags` bit 0 ("xl2") then also asks L2
// for the next row's dy at the top of the row (pass 1 then reads it from L2).
// `flags` bit 1 (late): the next row's copies are issued after pass 1 instead;
// bit 2 (bulk, sm_90+): the rows come in by cp.async.bulk (gn_copy_row), one
// mbarrier per buffer, waited on with the parity of that buffer's use.  H100
// (notes/mem5.md): bulk 0.2754 vs 0.2776 ms fp32, 0.161 vs 0.178 fp16 / bf16
// (the default); late slower in every dtype.
// Pass 1, block-contiguous (thread t: vectors t, t + blockDim, ..., S / VEC >=
// 32, so a warp's 32 vectors lie in planes k0 and k0 + 1): per vector
// d = sum dy, t = sum dy * (x - mean), warp_sum4 of (d, t) split into the two
// planes, and lanes 0, 8, 16, 24 add their total to the warp's slice (each
// address always by the same lane).  Thread k then adds plane k's slices in
// warp order: D_k, T_k give the partials (dbeta = D_k, dgamma = rstd T_k) and
// the row sums sum g*dy = sum_k g_k D_k, sum g*dy*xhat = rstd sum_k g_k T_k
// (no gamma load in pass 1).  Pass 2: dx = rstd g dy + b (x - mean) + c.
// Within-row indices are unsigned 32-bit (a row fits shared memory); row
// offsets use index_t.  Needs VEC > 1 (16-byte aligned rows).
template <typename T, typename P, typename index_t, int VEC>
__global__ void __launch_bounds__(1024) gn_rows_backward_pipelined(
        const T* __restrict__ dy, const T* __restrict__ x, const P* __restrict__ gamma,
        const acc_t<T>* __restrict__ mean_in, const acc_t<T>* __restrict__ rstd_in, T* __restrict__ dx,
        index_t K_, index_t S_, int G, index_t rows, acc_t<T>* __restrict__ part_dgamma,
        acc_t<T>* __restrict__ part_dbeta, int dy_smem, int flags) {
    typedef acc_t<T> A;
    typedef NormPack<T, VEC> Pack;
    // 16-byte loads in flight per thread (2 for half types: 4 spill bf16 at 64 registers)
    constexpr int U = sizeof(T) == 2 ? 2 : NORM_UNROLL;
    extern __shared__ __align__(16) unsigned char norm_smem[];
    __shared__ __align__(8) unsigned long long bars[2];  // bulk copies: one mbarrier per buffer
    const unsigned K = (unsigned)K_, S = (unsigned)S_;
    const unsigned M = K * S, Mv = M / VEC, PV = S / VEC;
    const unsigned nt = blockDim.x;
    const unsigned tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = nt >> 5;
    const unsigned stride = (M * (unsigned)sizeof(T) + 15) / 16 * 16 / (unsigned)sizeof(T);
    T* const xbuf = reinterpret_cast<T*>(norm_smem);  // x_b at xbuf + b * stride
    T* const dybuf = xbuf + 2 * stride;                // dy_b at dybuf + b * stride (dy_smem)
    A* const slices = reinterpret_cast<A*>(xbuf + (dy_smem ? 4 : 2) * stride);
    A* const my = slices + warp * 4 * K;               // lo[k][2] at my[2k], hi[k][2] at my[2K + 2k]
    A* const tot = slices + warps * 4 * K;             // per plane: g D, g T, g
    const A count = A(M);
    const bool l2 = (flags & 1) != 0, late = (flags & 2) != 0;
#if __CUDA_ARCH__ >= 900
    const bool bulk = (flags & 4) != 0;
#else
    const bool bulk = false;
#endif
    index_t row = blockIdx.x;
    if (row >= rows) return;
    if (bulk) {
        if (tid == 0) {
            mbarrier_init1(&bars[0]);
            mbarrier_init1(&bars[1]);
        }
        __syncthreads();
    }
    gn_copy_row<T, VEC>(xbuf, dybuf, stride, x, dy, row * (index_t)M, Mv, 0u, dy_smem, bulk, bars);
    copy_async_commit();
    for (unsigned it = 0; row < rows; row += gridDim.x, ++it) {
        const unsigned b = it & 1;
        const T* const xc = xbuf + b * stride;
        const T* const dc = dybuf + b * stride;
        for (unsigned i = lane; i < 4 * K; i += 32) my[i] = A(0);  // read before the previous row's last barrier
        if (bulk) mbarrier_wait(&bars[b], (it >> 1) & 1);  // the (it >> 1)-th phase of buffer b's barrier
        else copy_async_wait_all();
        // This row's copies have landed (every thread's), and every thread has
        // finished the previous row, whose buffers the next row's copies now take.
        __syncthreads();
        const index_t next = row + gridDim.x;
        // The next row's copies: now, or (late) after pass 1's global reads of dy.
        const auto copy_next = [&]() {
            if (next < rows) {
                gn_copy_row<T, VEC>(xbuf, dybuf, stride, x, dy, next * (index_t)M, Mv, b ^ 1, dy_smem, bulk, bars);
                if (!dy_smem && l2) prefetch_l2(dy + next * (index_t)M, M * (unsigned)sizeof(T));
            }
            copy_async_commit();  // possibly empty
        };
        if (!late) copy_next();
        const A mean = mean_in[row], rstd = rstd_in[row];
        const T* const dyr = dy + row * (index_t)M;

        // Pass 1: plane sums of dy and dy * (x - mean).
        for (unsigned base = tid; base - lane < Mv; base += U * nt) {
            Pack dp[U];
            if (dy_smem) {  // uniform: shared-memory loads, or global loads in flight together
#pragma unroll
                for (int u = 0; u < U; ++u)
                    if (base + u * nt < Mv) dp[u] = *reinterpret_cast<const Pack*>(dc + (base + u * nt) * VEC);
            } else {
#pragma unroll
                for (int u = 0; u < U; ++u)
                    if (base + u * nt < Mv) dp[u] = *reinterpret_cast<const Pack*>(dyr + (base + u * nt) * VEC);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const unsigned vi = base + u * nt;
                const unsigned first = vi - lane;  // lane 0's vector
                const unsigned k0 = first / PV;
                A d = 0, t = 0;
                bool hi = false;
                if (vi < Mv) {
                    const Pack xp = *reinterpret_cast<const Pack*>(xc + vi * VEC);
#pragma unroll
                    for (int e = 0; e < VEC; ++e) {
                        const A dv = load(dp[u].v[e]);
                        d += dv;
                        t += dv * (load(xp.v[e]) - mean);
                    }
                    hi = vi / PV != k0;
                }
                const A s = warp_sum4(hi ? A(0) : d, hi ? A(0) : t, hi ? d : A(0), hi ? t : A(0));
                if ((lane & 7) == 0 && first < Mv) {
                    const unsigned q = lane >> 3;  // 0 lo d, 1 lo t, 2 hi d, 3 hi t
                    if (q < 2) my[2 * k0 + q] += s;
                    else if (k0 + 1 < K) my[2 * K + 2 * (k0 + 1) + (q - 2)] += s;
                }
            }
        }
        __syncthreads();  // the slices are complete
        if (late) copy_next();
        for (unsigned k = tid; k < K; k += nt) {
            A d = 0, t = 0;
            for (unsigned w = 0; w < warps; ++w) {
                const A* sl = slices + w * 4 * K;
                d += sl[2 * k] + sl[2 * K + 2 * k];
                t += sl[2 * k + 1] + sl[2 * K + 2 * k + 1];
            }
            const A g = param_or(gamma, (row % G) * (index_t)K + k, A(1));
            part_dbeta[row * (index_t)K + k] = d;
            part_dgamma[row * (index_t)K + k] = t * rstd;
            tot[3 * k] = g * d;
            tot[3 * k + 1] = g * t;
            tot[3 * k + 2] = g;
        }
        __syncthreads();  // the totals are complete
        A sum_g = 0, sum_t = 0;
        for (unsigned k = 0; k < K; ++k) {
            sum_g += tot[3 * k];
            sum_t += tot[3 * k + 1];
        }
        // dx = rstd (g dy - mean_g - xhat mean_gx), mean_g = sum_g / M,
        // mean_gx = rstd sum_t / M:  dx = (rstd g) dy + bx (x - mean) + c.
        const A bx = -rstd * rstd * rstd * (sum_t / count);
        const A c = -rstd * (sum_g / count);
        T* const dxr = dx + row * (index_t)M;
        for (unsigned base = tid; base < Mv; base += U * nt) {
            Pack dp[U];
            if (dy_smem) {  // uniform: shared-memory loads, or global loads in flight together
#pragma unroll
                for (int u = 0; u < U; ++u)
                    if (base + u * nt < Mv) dp[u] = *reinterpret_cast<const Pack*>(dc + (base + u * nt) * VEC);
            } else {
#pragma unroll
                for (int u = 0; u < U; ++u)
                    if (base + u * nt < Mv) dp[u] = *reinterpret_cast<const Pack*>(dyr + (base + u * nt) * VEC);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const unsigned vi = base + u * nt;
                if (vi < Mv) {
                    const Pack xp = *reinterpret_cast<const Pack*>(xc + vi * VEC);
                    const A a = rstd * tot[3 * (vi / PV) + 2];
                    A o[VEC];
#pragma unroll
                    for (int e = 0; e < VEC; ++e) o[e] = a * load(dp[u].v[e]) + bx * (load(xp.v[e]) - mean) + c;
                    norm_store<T, VEC>(dxr, vi * VEC, o);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// gn_rows_backward_cluster (sm_90+): group / instance norm NCHW backward where
// a row's x and dy (2 M values) exceed what one block holds at a good
// occupancy.  One cluster of CL blocks per row (blockIdx.x = row * CL + rank):
// block `rank` takes the contiguous channels rank * K / CL .. (rank + 1) * K /
// CL - 1 of the row (K % CL == 0), so its x and its dy are each one contiguous
// run of Kb S values (Kb = K / CL), which thread 0 bulk-copies (cp.async.bulk,
// bulk_copy.cuh) into dynamic shared memory, counted on one mbarrier: x and dy
// are read from DRAM once (the pipelined kernel above re-reads dy from L2 when
// four rows do not fit the opt-in: 100 KB fp32 rows at 8x56x56).
// Plane sums (per channel k of the block): D_k = sum dy, T_k = sum dy (x -
// mean), from shared memory.  `wpp` warps per plane when the block has more
// warps than planes (else one, each warp walking planes w, w + warps, ...):
// warp `sub` of plane k adds vectors sub * 32 + lane, + 32 wpp, ..., warp_sum,
// and lane 0 writes slot (k, sub); thread k adds its plane's slots in order
// (fixed order: bitwise reproducible) and writes the partials exactly as the
// other backward kernels do (dbeta = D_k, dgamma = rstd T_k at row * K + k, for
// norm_param_grads_finish), and keeps rstd g_k (g_k = gamma of the channel, or
// 1) for dx.  Warp 0 adds the block's g_k D_k and g_k T_k (lane-strided, then
// warp_sum) into `share`; after a cluster barrier every block reads the CL
// shares through distributed shared memory in rank order (all blocks get
// bitwise the same row sums sum g dy, sum g dy (x - mean)), arrives on the
// cluster barrier again (done reading), and writes dx from shared memory:
//   dx = (rstd g) dy + bx (x - mean) + c,  bx = -rstd^3 sum_t / M,
//   c = -rstd sum_g / M  (as gn_rows_backward_pipelined).
// It waits on that second barrier before exit (the others may still read its
// share).  Dynamic shared memory: x run, dy run (Kb S sizeof(T) bytes each, a
// multiple of 16), then 2 max(Kb, warps) slots, then Kb coefficients (A).
// Within-block indices are unsigned 32-bit; row offsets use index_t.  The host
// launches it with 16-byte planes (S sizeof(T) % 16 == 0) and 16-byte aligned
// dy, x, dx, on sm_90+ only (below it traps: no clusters).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define NORM_CLUSTER_DIMS(n)
#else
#define NORM_CLUSTER_DIMS(n) __cluster_dims__(n, 1, 1)
#endif
#define NORM_CLUSTER_THREADS 512

template <typename T, typename P, typename index_t, int CL>
__global__ void __launch_bounds__(NORM_CLUSTER_THREADS) NORM_CLUSTER_DIMS(CL) gn_rows_backward_cluster(
        const T* __restrict__ dy, const T* __restrict__ x, const P* __restrict__ gamma,
        const acc_t<T>* __restrict__ mean_in, const acc_t<T>* __restrict__ rstd_in, T* __restrict__ dx,
        index_t K_, index_t S_, int G, acc_t<T>* __restrict__ part_dgamma, acc_t<T>* __restrict__ part_dbeta) {
#if __CUDA_ARCH__ >= 900
    typedef acc_t<T> A;
    constexpr int VEC = 16 / (int)sizeof(T);
    typedef NormPack<T, VEC> Pack;
    extern __shared__ __align__(16) unsigned char norm_smem[];
    __shared__ __align__(8) unsigned long long bar;
    __shared__ A share[2];   // this block's sum g dy, sum g dy (x - mean): read by the whole cluster
    __shared__ A merged[2];  // the row's
    const unsigned rank = cluster_rank();
    const index_t row = (index_t)(blockIdx.x / CL);
    const unsigned K = (unsigned)K_, S = (unsigned)S_;
    const unsigned Kb = K / CL, PV = S / VEC, mv = Kb * PV;  // this block's planes, vectors
    const unsigned nt = blockDim.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = nt >> 5;
    const unsigned bytes = mv * 16u;
    const Pack* const xs = reinterpret_cast<const Pack*>(norm_smem);
    const Pack* const ds = reinterpret_cast<const Pack*>(norm_smem + bytes);
    A* const slots = reinterpret_cast<A*>(norm_smem + 2 * bytes);  // (plane k, warp sub): 2 (k wpp + sub)
    A* const coef = slots + 2 * (Kb > warps ? Kb : warps);         // per plane: rstd g
    const index_t M = (index_t)K * S;
    const index_t first = (index_t)rank * Kb;                      // the block's first channel in the group
    const index_t off = row * M + first * S;
    if (tid == 0) {
        mbarrier_init1(&bar);
        bulk_copy_expect(&bar, norm_smem, x + off, bytes, 2 * bytes);
        bulk_copy_expect(&bar, norm_smem + bytes, dy + off, bytes, 0u);
    }
    __syncthreads();  // the barrier is initialised before anyone waits on it
    const A mean = mean_in[row], rstd = rstd_in[row];
    mbarrier_wait(&bar, 0);

    // Plane sums: warp `warp` is warp `sub` of planes p0, p0 + span, ...
    const unsigned wpp = warps > Kb ? warps / Kb : 1u;
    const unsigned span = warps / wpp;
    const unsigned p0 = warp / wpp, sub = warp - p0 * wpp;
    if (p0 < span) {
        for (unsigned k = p0; k < Kb; k += span) {
            const Pack* const xp = xs + k * PV;
            const Pack* const dp = ds + k * PV;
            A d = 0, t = 0;
#pragma unroll 4
            for (unsigned i = sub * 32 + lane; i < PV; i += wpp * 32) {
                const Pack xv = xp[i], dv = dp[i];
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    const A v = load(dv.v[e]);
                    d += v;
                    t += v * (load(xv.v[e]) - mean);
                }
            }
            d = warp_sum(d);
            t = warp_sum(t);
            if (lane == 0) {
                slots[2 * (k * wpp + sub)] = d;
                slots[2 * (k * wpp + sub) + 1] = t;
            }
        }
    }
    __syncthreads();  // the slots are complete
    for (unsigned k = tid; k < Kb; k += nt) {
        A d = 0, t = 0;
        for (unsigned s = 0; s < wpp; ++s) {
            d += slots[2 * (k * wpp + s)];
            t += slots[2 * (k * wpp + s) + 1];
        }
        const A g = param_or(gamma, (index_t)(row % G) * K + first + k, A(1));  // gamma of the channel
        part_dbeta[row * (index_t)K + first + k] = d;
        part_dgamma[row * (index_t)K + first + k] = t * rstd;
        coef[k] = rstd * g;
        slots[2 * k * wpp] = g * d;  // plane k's own first slot (only thread k reads plane k's slots)
        slots[2 * k * wpp + 1] = g * t;
    }
    __syncthreads();  // g D_k, g T_k and the coefficients are complete
    if (warp == 0) {
        A sg = 0, st = 0;
        for (unsigned k = lane; k < Kb; k += 32) {
            sg += slots[2 * k * wpp];
            st += slots[2 * k * wpp + 1];
        }
        sg = warp_sum(sg);
        st = warp_sum(st);
        if (lane == 0) {
            share[0] = sg;
            share[1] = st;
        }
    }
    cluster_arrive();  // every block's share is written ...
    cluster_wait();
    if (tid == 0) {  // ... and added in rank order by every block alike
        A sg = 0, st = 0;
        for (unsigned r = 0; r < (unsigned)CL; ++r) {
            sg += cluster_load(&share[0], r);
            st += cluster_load(&share[1], r);
        }
        merged[0] = sg;
        merged[1] = st;
    }
    cluster_arrive();  // done reading the others' shares (waited on before exit)
    __syncthreads();
    const A count = A(M);
    const A bx = -rstd * rstd * rstd * (merged[1] / count);
    const A c = -rstd * (merged[0] / count);
    T* const dxb = dx + off;
    for (unsigned i0 = tid; i0 < mv; i0 += NORM_UNROLL * nt) {
        Pack xv[NORM_UNROLL], dv[NORM_UNROLL];  // the loads in flight together
#pragma unroll
        for (int u = 0; u < NORM_UNROLL; ++u)
            if (i0 + u * nt < mv) {
                xv[u] = xs[i0 + u * nt];
                dv[u] = ds[i0 + u * nt];
            }
#pragma unroll
        for (int u = 0; u < NORM_UNROLL; ++u) {
            const unsigned i = i0 + u * nt;
            if (i < mv) {
                const A a = coef[i / PV];
                A o[VEC];
#pragma unroll
                for (int e = 0; e < VEC; ++e) o[e] = a * load(dv[u].v[e]) + bx * (load(xv[u].v[e]) - mean) + c;
                norm_store<T, VEC>(dxb, (index_t)i * VEC, o);
            }
        }
    }
    cluster_wait();
#else
    __trap();  // Python launches it only on sm_90+
#endif
}

// ---------------------------------------------------------------------------
// gn_rows_backward_registers (sm_90+): gn_rows_backward_cluster's split (one
// cluster of CL blocks per row, block `rank` taking the contiguous channels
// rank * Kb .. (rank + 1) * Kb - 1, Kb = K / CL) with the block's x and dy
// held in REGISTERS, loaded by plain 16-byte loads from every thread, instead
// of bulk-copied into shared memory.  Why (notes/gnbwd2.md): every "copy the
// share into shared memory, reduce, write" kernel (this family's cluster
// backward and forward, the instance-norm backward with no cluster at all)
// stops at 0.88-0.90 of copy whatever the share (25-100 KB), while the
// softmax backward, the same read-2 / reduce / write-1 shape with the row in
// registers (16-byte loads, ROW_PACKS a thread), runs at 1.00; and 16-bit
// rows (twice the values a byte) lose 10 % more to the two passes over shared
// memory.  Here the block holds no dynamic shared memory, so only registers
// bound the blocks an SM, and each value is converted from its load once per
// pass with no shared-memory traffic.
// Mapping: tpp threads per plane (whole warps; the host takes tpp = 32 *
// ceil(ceil(S / VEC / ITEMS) / 32), so every thread has at most ITEMS vectors
// of each tensor), blockDim = Kb * tpp: thread t belongs to plane k = t / tpp
// of the block and holds its vectors j = t % tpp + u * tpp (u < ITEMS, j <
// S / VEC) of x and dy, all loads issued before any is used.  Per thread the
// sums D = sum dy and T = sum dy (x - mean) (two chains each, even / odd
// lanes of a vector), warp_sum, one slot per warp; warp 0's lane k adds plane
// k's warps in order, writes the parameter-gradient partials exactly as the
// other backward kernels do (dbeta = D_k, dgamma = rstd T_k at row * K + k)
// and the lanes' g_k D_k, g_k T_k are warp-summed into `share`.  After the
// cluster barrier EVERY warp reads the CL shares (lane r from rank r) and adds
// them in rank order with shuffles (no block barrier; all blocks and warps get
// bitwise the same row sums), arrives on the barrier again (done reading), and
// writes dx from its registers with gn_rows_backward_cluster's formula:
//   dx = (rstd g) dy + bx (x - mean) + c,  bx = -rstd^3 sum_t / M,
//   c = -rstd sum_g / M.
// It waits on that second barrier before exit (the others may read its
// share).  Deterministic (fixed orders, no atomics).  Static shared memory
// only (2 values a warp + 2).  Within-plane indices are unsigned 32-bit; row
// and plane offsets use index_t.  The host launches it with 16-byte planes (S
// sizeof(T) % 16 == 0), 16-byte aligned dy, x, dx, S / VEC >= 32, Kb * tpp <=
// NORM_CLUSTER_THREADS (so Kb <= 16 and warp 0 has a lane a plane), sm_90+
// (below it traps).
// The compiler may not assume a pack's words unchanged from here on.
template <typename Pack>
__device__ __forceinline__ void norm_opaque(Pack& p) {
    unsigned* const w = reinterpret_cast<unsigned*>(&p);
#pragma unroll
    for (int i = 0; i < (int)(sizeof(Pack) / 4); ++i) asm volatile("" : "+r"(w[i]));
}

template <typename T, typename P, typename index_t, int CL, int ITEMS>
__global__ void __launch_bounds__(NORM_CLUSTER_THREADS) NORM_CLUSTER_DIMS(CL) gn_rows_backward_registers(
        const T* __restrict__ dy, const T* __restrict__ x, const P* __restrict__ gamma,
        const acc_t<T>* __restrict__ mean_in, const acc_t<T>* __restrict__ rstd_in, T* __restrict__ dx,
        index_t K_, index_t S_, int G, int tpp, acc_t<T>* __restrict__ part_dgamma,
        acc_t<T>* __restrict__ part_dbeta) {
#if __CUDA_ARCH__ >= 900
    typedef acc_t<T> A;
    constexpr int VEC = 16 / (int)sizeof(T);
    typedef NormPack<T, VEC> Pack;
    __shared__ A slots[2 * (NORM_CLUSTER_THREADS / 32)];  // per warp: sum dy, sum dy (x - mean)
    __shared__ A share[2];  // this block's sum g dy, sum g dy (x - mean): read by the whole cluster
    const unsigned rank = cluster_rank();
    const index_t row = (index_t)(blockIdx.x / CL);
    const unsigned K = (unsigned)K_, S = (unsigned)S_;
    const unsigned Kb = K / CL, PV = S / VEC;  // this block's planes; vectors a plane
    const unsigned tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, tp = (unsigned)tpp;
    const unsigned k = tid / tp, j0 = tid - k * tp;  // this thread's plane in the block, first vector
    const index_t M = (index_t)K * S;
    const index_t first = (index_t)rank * Kb;  // the block's first channel in the group
    const index_t poff = row * M + (first + k) * (index_t)S;
    const Pack* const xp = reinterpret_cast<const Pack*>(x + poff);
    const Pack* const dp = reinterpret_cast<const Pack*>(dy + poff);
    Pack xv[ITEMS], dv[ITEMS];  // every load in flight before any is used
#pragma unroll
    for (int u = 0; u < ITEMS; ++u) {
        const unsigned j = j0 + (unsigned)u * tp;
        if (j < PV) {
            xv[u] = xp[j];
            dv[u] = dp[j];
        }
    }
    const A mean = mean_in[row], rstd = rstd_in[row];
    const index_t cbase = (row % G) * (index_t)K + first;  // gamma index of the block's first channel
    const A g = param_or(gamma, cbase + k, A(1));
    A d0 = 0, d1 = 0, t0 = 0, t1 = 0;
#pragma unroll
    for (int u = 0; u < ITEMS; ++u) {
        if (j0 + (unsigned)u * tp < PV) {
#pragma unroll
            for (int e = 0; e < VEC; e += 2) {
                const A v0 = load(dv[u].v[e]), v1 = load(dv[u].v[e + 1]);
                d0 += v0;
                d1 += v1;
                t0 += v0 * (load(xv[u].v[e]) - mean);
                t1 += v1 * (load(xv[u].v[e + 1]) - mean);
            }
        }
    }
    const A d = warp_sum(d0 + d1), t = warp_sum(t0 + t1);
    if (lane == 0) {
        slots[2 * warp] = d;
        slots[2 * warp + 1] = t;
    }
    __syncthreads();  // the slots are complete
    if (warp == 0) {
        const unsigned wpp = tp / 32;  // warps a plane: plane q's are q * wpp .. (q + 1) * wpp - 1
        A sg = 0, st = 0;
        if (lane < Kb) {
            A D = 0, Tq = 0;
            for (unsigned s = 0; s < wpp; ++s) {
                D += slots[2 * (lane * wpp + s)];
                Tq += slots[2 * (lane * wpp + s) + 1];
            }
            const A gq = param_or(gamma, cbase + lane, A(1));
            part_dbeta[row * (index_t)K + first + lane] = D;
            part_dgamma[row * (index_t)K + first + lane] = Tq * rstd;
            sg = gq * D;
            st = gq * Tq;
        }
        sg = warp_sum(sg);
        st = warp_sum(st);
        if (lane == 0) {
            share[0] = sg;
            share[1] = st;
        }
    }
    cluster_arrive();  // every block's share is written ...
    cluster_wait();
    A sg = 0, st = 0;
    {  // ... read by lane r of every warp from rank r, added in rank order by every lane alike
        A a = 0, b = 0;
        if (lane < (unsigned)CL) {
            a = cluster_load(&share[0], lane);
            b = cluster_load(&share[1], lane);
        }
#pragma unroll
        for (int r = 0; r < CL; ++r) {
            sg += __shfl_sync(0xffffffffu, a, r);
            st += __shfl_sync(0xffffffffu, b, r);
        }
    }
    cluster_arrive();  // done reading the others' shares (waited on before exit)
    const A count = A(M);
    const A bx = -rstd * rstd * rstd * (st / count);
    const A c = -rstd * (sg / count);
    const A a = rstd * g;
    T* const dxp = dx + poff;
#pragma unroll
    for (int u = 0; u < ITEMS; ++u) {  // convert the raw words again below: keeping the first
        norm_opaque(xv[u]);             // pass's converted values (bfloat16's shifts) would take
        norm_opaque(dv[u]);             // twice the registers
    }
#pragma unroll
    for (int u = 0; u < ITEMS; ++u) {
        const unsigned j = j0 + (unsigned)u * tp;
        if (j < PV) {
            A o[VEC];
#pragma unroll
            for (int e = 0; e < VEC; ++e) o[e] = a * load(dv[u].v[e]) + bx * (load(xv[u].v[e]) - mean) + c;
            norm_store<T, VEC>(dxp, (index_t)j * VEC, o);
        }
    }
    cluster_wait();
#else
    __trap();  // Python launches it only on sm_90+
#endif
}

// ---------------------------------------------------------------------------
// gn_rows_forward_cluster: group / instance norm forward, NCHW, as a cluster of
// CL blocks per row (the forward twin of gn_rows_backward_cluster).  Grid rows
// * CL; block `rank` of row r takes the contiguous channels rank * Kb ..
// (rank + 1) * Kb - 1 (Kb = K / CL), one run of Kb S values of x, which thread
// 0 bulk-copies into dynamic shared memory (x read from DRAM once); threads
// k < Kb meanwhile put gamma / beta of the block's channels after it (A).
// Statistics: each block computes its own sum and its sum of squared
// deviations from its own mean (two passes over shared memory, block_sum),
// writes them to `share`; after a cluster barrier warp 0 reads the CL shares
// through distributed shared memory (lane r reads rank r) and every lane adds
// them in rank order (Chan's merge of equal-count parts, exact in exact
// arithmetic: mean = sum s_b / M, q = sum (q_b + n_b (s_b / n_b - mean)^2)),
// so every block of the cluster gets bitwise the same mean and rstd.  Then the
// block writes y = (x - mean) (rstd gamma) + beta from shared memory and rank
// 0 the row's mean / rstd; a second arrive says the shares were read, waited
// on before exit.  Why: the persistent gn_rows_forward_pipelined (one 1024-
// thread block per SM at 100 KB fp32 rows) ends with a static wave tail (2048
// rows over 132 SMs: 68 SMs do 16 rows, 64 do 15) and fill / drain, and keeps
// one row's copies in flight per SM in bursts; here 12.5 KB blocks (CL 8 at
// 8x56x56 fp32), 8-16 resident per SM at different phases, stream like an
// elementwise kernel and the hardware scheduler balances the last wave block
// by block.  Dynamic shared memory: the x run (Kb S sizeof(T), a multiple of
// 16), then 2 Kb values (A).  Within-block indices are unsigned 32-bit; row
// offsets use index_t.  The host launches it with 16-byte planes (S sizeof(T)
// % 16 == 0), 16-byte aligned x and y, on sm_90+ only (below it traps).
template <typename T, typename P, typename index_t, int CL>
__global__ void __launch_bounds__(NORM_CLUSTER_THREADS) NORM_CLUSTER_DIMS(CL) gn_rows_forward_cluster(
        const T* __restrict__ x, T* __restrict__ y, const P* __restrict__ gamma, const P* __restrict__ beta,
        acc_t<T>* __restrict__ mean_out, acc_t<T>* __restrict__ rstd_out, index_t K_, index_t S_, int G,
        acc_t<T> eps) {
#if __CUDA_ARCH__ >= 900
    typedef acc_t<T> A;
    constexpr int VEC = 16 / (int)sizeof(T);
    typedef NormPack<T, VEC> Pack;
    extern __shared__ __align__(16) unsigned char norm_smem[];
    __shared__ __align__(8) unsigned long long bar;
    __shared__ A scratch[32];
    __shared__ A share[2];   // this block's sum x, sum (x - its mean)^2: read by the whole cluster
    __shared__ A merged[2];  // the row's mean and rstd
    const unsigned rank = cluster_rank();
    const index_t row = (index_t)(blockIdx.x / CL);
    const unsigned K = (unsigned)K_, S = (unsigned)S_;
    const unsigned Kb = K / CL, PV = S / VEC, mv = Kb * PV;  // this block's planes, vectors
    const unsigned nt = blockDim.x, tid = threadIdx.x;
    const unsigned bytes = mv * 16u;
    const Pack* const xs = reinterpret_cast<const Pack*>(norm_smem);
    A* const coef = reinterpret_cast<A*>(norm_smem + bytes);  // per plane: gamma, beta
    const index_t M = (index_t)K * S;
    const index_t first = (index_t)rank * Kb;  // the block's first channel in the group
    const index_t off = row * M + first * S;
    if (tid == 0) {
        mbarrier_init1(&bar);
        bulk_copy_expect(&bar, norm_smem, x + off, bytes, bytes);
    }
    const index_t cbase = (row % G) * (index_t)K + first;
    for (unsigned k = tid; k < Kb; k += nt) {
        coef[2 * k] = param_or(gamma, cbase + k, A(1));
        coef[2 * k + 1] = param_or(beta, cbase + k, A(0));
    }
    __syncthreads();  // the barrier is initialised before anyone waits on it; coef is complete
    mbarrier_wait(&bar, 0);
    const A nb = A(mv) * A(VEC);  // values in this block
    A s1 = 0;
#pragma unroll 4
    for (unsigned i = tid; i < mv; i += nt) {
        const Pack v = xs[i];
#pragma unroll
        for (int e = 0; e < VEC; ++e) s1 += load(v.v[e]);
    }
    const A sb = block_sum(s1, scratch);
    const A mb = sb / nb;
    A s2 = 0;
#pragma unroll 4
    for (unsigned i = tid; i < mv; i += nt) {
        const Pack v = xs[i];
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            const A d = load(v.v[e]) - mb;
            s2 += d * d;
        }
    }
    const A qb = block_sum(s2, scratch);
    if (tid == 0) {
        share[0] = sb;
        share[1] = qb;
    }
    cluster_arrive();  // every block's share is written ...
    cluster_wait();
    if (tid < 32) {  // ... read by lane r from rank r, added in rank order by every lane alike
        A s = 0, q = 0;
        if (tid < (unsigned)CL) {
            s = cluster_load(&share[0], tid);
            q = cluster_load(&share[1], tid);
        }
        A total = 0;
#pragma unroll
        for (int r = 0; r < CL; ++r) total += __shfl_sync(0xffffffffu, s, r);
        const A mean = total / A(M);
        A dev = 0;
#pragma unroll
        for (int r = 0; r < CL; ++r) {
            const A d = __shfl_sync(0xffffffffu, s, r) / nb - mean;
            dev += __shfl_sync(0xffffffffu, q, r) + nb * d * d;
        }
        if (tid == 0) {
            merged[0] = mean;
            merged[1] = A(1) / sqrt(dev / A(M) + eps);
        }
    }
    cluster_arrive();  // done reading the others' shares (waited on before exit)
    __syncthreads();
    const A mean = merged[0], rstd = merged[1];
    if (rank == 0 && tid == 0) {
        mean_out[row] = mean;
        rstd_out[row] = rstd;
    }
    T* const yb = y + off;
    for (unsigned i0 = tid; i0 < mv; i0 += NORM_UNROLL * nt) {
        Pack xv[NORM_UNROLL];
#pragma unroll
        for (int u = 0; u < NORM_UNROLL; ++u)
            if (i0 + u * nt < mv) xv[u] = xs[i0 + u * nt];
#pragma unroll
        for (int u = 0; u < NORM_UNROLL; ++u) {
            const unsigned i = i0 + u * nt;
            if (i < mv) {
                const unsigned k = i / PV;
                const A scale = rstd * coef[2 * k], shift = coef[2 * k + 1];
                A o[VEC];
#pragma unroll
                for (int e = 0; e < VEC; ++e) o[e] = (load(xv[u].v[e]) - mean) * scale + shift;
                norm_store<T, VEC>(yb, (index_t)i * VEC, o);
            }
        }
    }
    cluster_wait();
#else
    __trap();  // Python launches it only on sm_90+
#endif
}

// ---------------------------------------------------------------------------
// norm_rows_backward_fused_pipelined: layer / RMS norm backward with the
// parameter gradients fused, as norm_rows_backward_fused (persistent grid,
// thread t owns vectors t and t + blockDim of every row, dgamma / dbeta
// accumulated in registers, block partials at [blockIdx.x * M + column]),
// with the next rows' loads in flight while a row is reduced and written.
// There each thread loaded its 4 vectors, then waited on them, two block
// barriers and its dx stores before the next row's loads went out: with ~8
// resident blocks an SM had its loads in flight only part of the time (H100,
// 65536 x 1024 fp32: 0.86 of copy; fp16 0.65: two thirds of fp32's time for
// half the bytes).  Here each thread copies ITS OWN vectors of x and dy by
// 16-byte cp.async into its own slots of a ring of NORM_STAGES rows in
// dynamic shared memory (slot (stage, tensor, item) of thread t at
// ((stage * 2 + tensor) * NORM_FUSED_ITEMS + item) * blockDim + t): rows
// row + gridDim.x and row + 2 gridDim.x are in flight while row `row` runs.
// A thread reads only the slots it copied, so cp.async.wait_group alone makes
// them visible (no barrier for the data); the stage it refills at the top of
// an iteration is the one it read in the previous iteration.  One group is
// committed per iteration (possibly empty), so "all but the NORM_STAGES - 1
// most recent groups" is this row.  Needs VEC > 1 (16-byte aligned rows);
// cp.async needs sm_80 (older devices copy synchronously, still correct).
#define NORM_STAGES 3

template <int N>
__device__ __forceinline__ void copy_async_wait_pending() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

template <typename T, typename P, typename index_t, int VEC>
__global__ void norm_rows_backward_fused_pipelined(const T* __restrict__ dy, const T* __restrict__ x,
                                                   const P* __restrict__ gamma,
                                                   const acc_t<T>* __restrict__ mean_in,
                                                   const acc_t<T>* __restrict__ rstd_in, T* __restrict__ dx,
                                                   acc_t<T>* __restrict__ part_dgamma,
                                                   acc_t<T>* __restrict__ part_dbeta, index_t rows, index_t M,
                                                   int rms) {
    typedef acc_t<T> A;
    typedef NormPack<T, VEC> Pack;
    constexpr int I = NORM_FUSED_ITEMS;
    extern __shared__ __align__(16) unsigned char norm_smem[];
    __shared__ A scratch[64];
    Pack* const ring = reinterpret_cast<Pack*>(norm_smem);
    const index_t Mv = M / VEC;
    const unsigned nt = blockDim.x, tid = threadIdx.x;
    const A count = A(M);
    // This thread's slot of (stage, tensor 0 = x / 1 = dy, item).
    const auto slot = [&](unsigned stage, unsigned tensor, int u) -> T* {
        return reinterpret_cast<T*>(ring + ((stage * 2 + tensor) * I + u) * nt + tid);
    };
    // The copies of this thread's vectors of row r into `stage`, then one commit (empty past the rows).
    const auto issue = [&](long long r, unsigned stage) {
        if (r < (long long)rows) {
#pragma unroll
            for (int u = 0; u < I; ++u) {
                const index_t vi = tid + u * nt;
                if (vi < Mv) {
                    const index_t off = (index_t)r * M + vi * VEC;
                    copy16_async<T, VEC>(slot(stage, 0, u), x + off);
                    copy16_async<T, VEC>(slot(stage, 1, u), dy + off);
                }
            }
        }
        copy_async_commit();
    };
    A dg[I][VEC], db[I][VEC], g[I][VEC];
    norm_fused_start(g, dg, db, gamma, Mv, [&](int u) -> index_t { return tid + u * nt; });
    const long long first = blockIdx.x, step = gridDim.x;
#pragma unroll
    for (int s = 0; s < NORM_STAGES - 1; ++s) issue(first + s * step, (unsigned)s);
    unsigned stage = 0;  // it % NORM_STAGES
    for (long long row = first; row < (long long)rows; row += step) {
        issue(row + (NORM_STAGES - 1) * step, stage == 0 ? NORM_STAGES - 1 : stage - 1);
        copy_async_wait_pending<NORM_STAGES - 1>();  // this thread's copies of `row` have landed
        const A mean = rms ? A(0) : mean_in[row];
        const A rstd = rstd_in[row];
        A xv[I][VEC], dv[I][VEC];
#pragma unroll
        for (int u = 0; u < I; ++u) {
            if (tid + u * nt < Mv) {
                norm_load<T, VEC>(slot(stage, 0, u), 0, xv[u]);
                norm_load<T, VEC>(slot(stage, 1, u), 0, dv[u]);
            }
        }
        A sum_g = 0, sum_gx = 0;
        norm_fused_sums(xv, dv, g, mean, rstd, sum_g, sum_gx, [&](int u) { return tid + u * nt < Mv; });
        block_sum2(sum_g, sum_gx, scratch);
        const A mean_g = rms ? A(0) : sum_g / count;
        const A mean_gx = sum_gx / count;
        T* const dxr = dx + (index_t)row * M;
#pragma unroll
        for (int u = 0; u < I; ++u) {
            const index_t vi = tid + u * nt;
            if (vi < Mv) {
                norm_fused_dx(xv[u], dv[u], g[u], dg[u], db[u], mean, rstd, mean_g, mean_gx);
                norm_store<T, VEC>(dxr, vi * VEC, xv[u]);
            }
        }
        stage = stage + 1 == NORM_STAGES ? 0 : stage + 1;
    }
#pragma unroll
    for (int u = 0; u < I; ++u) {
        const index_t vi = tid + u * nt;
        if (vi < Mv) {
            const index_t off = (index_t)blockIdx.x * M + vi * VEC;
            norm_store<A, VEC>(part_dgamma, off, dg[u]);
            norm_store<A, VEC>(part_dbeta, off, db[u]);
        }
    }
}

// norm_rows_forward_pipelined: layer / RMS norm forward (G == 1, S == 1, NCHW)
// with the same ring: a persistent grid walks rows blockIdx.x, + gridDim.x,
// ...; thread t owns vectors t and t + blockDim of every row (the host picks
// blockDim >= M / (2 VEC)) and keeps their gamma / beta in registers; its
// vectors of the next NORM_STAGES - 1 rows are in flight (cp.async into its
// own slots: stage s, item u at (s * NORM_FUSED_ITEMS + u) * blockDim + t)
// while this row's statistics are reduced and y stored.  The one-block-per-
// row norm_rows_forward issues a row's loads only when its block starts,
// after the previous block on that slot stored its row.  Statistics as
// there: two-pass exact (mean, then the sum of squared deviations, from
// registers), RMS from mean(x^2); mean_out is unused for RMS.
template <typename T, typename P, typename index_t, int VEC>
__global__ void norm_rows_forward_pipelined(const T* __restrict__ x, T* __restrict__ y,
                                            const P* __restrict__ gamma, const P* __restrict__ beta,
                                            acc_t<T>* __restrict__ mean_out, acc_t<T>* __restrict__ rstd_out,
                                            index_t rows, index_t M, acc_t<T> eps, int rms) {
    typedef acc_t<T> A;
    typedef NormPack<T, VEC> Pack;
    constexpr int I = NORM_FUSED_ITEMS;
    extern __shared__ __align__(16) unsigned char norm_smem[];
    __shared__ A scratch[32];
    Pack* const ring = reinterpret_cast<Pack*>(norm_smem);
    const index_t Mv = M / VEC;
    const unsigned nt = blockDim.x, tid = threadIdx.x;
    const A count = A(M);
    const auto slot = [&](unsigned stage, int u) -> T* {
        return reinterpret_cast<T*>(ring + (stage * I + u) * nt + tid);
    };
    const auto issue = [&](long long r, unsigned stage) {
        if (r < (long long)rows) {
#pragma unroll
            for (int u = 0; u < I; ++u) {
                const index_t vi = tid + u * nt;
                if (vi < Mv) copy16_async<T, VEC>(slot(stage, u), x + (index_t)r * M + vi * VEC);
            }
        }
        copy_async_commit();
    };
    A g[I][VEC], b[I][VEC];
#pragma unroll
    for (int u = 0; u < I; ++u) {
        const index_t vi = tid + u * nt;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            g[u][e] = vi < Mv ? param_or(gamma, vi * VEC + e, A(1)) : A(0);
            b[u][e] = vi < Mv ? param_or(beta, vi * VEC + e, A(0)) : A(0);
        }
    }
    // The ring walk of norm_rows_backward_fused_pipelined, written out: as one helper taking
    // the row body as a lambda it changes both kernels' SASS (notes/dedupe.md).
    const long long first = blockIdx.x, step = gridDim.x;
#pragma unroll
    for (int s = 0; s < NORM_STAGES - 1; ++s) issue(first + s * step, (unsigned)s);
    unsigned stage = 0;  // it % NORM_STAGES
    for (long long row = first; row < (long long)rows; row += step) {
        issue(row + (NORM_STAGES - 1) * step, stage == 0 ? NORM_STAGES - 1 : stage - 1);
        copy_async_wait_pending<NORM_STAGES - 1>();  // this thread's copies of `row` have landed
        A xv[I][VEC];
        A s1 = 0;
#pragma unroll
        for (int u = 0; u < I; ++u) {
            if (tid + u * nt < Mv) {
                norm_load<T, VEC>(slot(stage, u), 0, xv[u]);
#pragma unroll
                for (int e = 0; e < VEC; ++e) s1 += rms ? xv[u][e] * xv[u][e] : xv[u][e];
            }
        }
        s1 = block_sum(s1, scratch);
        A mean = 0, rstd;
        if (rms) {
            rstd = A(1) / sqrt(s1 / count + eps);
        } else {
            mean = s1 / count;
            A s2 = 0;
#pragma unroll
            for (int u = 0; u < I; ++u) {
                if (tid + u * nt < Mv) {
#pragma unroll
                    for (int e = 0; e < VEC; ++e) s2 += (xv[u][e] - mean) * (xv[u][e] - mean);
                }
            }
            s2 = block_sum(s2, scratch);
            rstd = A(1) / sqrt(s2 / count + eps);
        }
        if (tid == 0) {
            if (!rms) mean_out[row] = mean;
            rstd_out[row] = rstd;
        }
        T* const yr = y + (index_t)row * M;
#pragma unroll
        for (int u = 0; u < I; ++u) {
            const index_t vi = tid + u * nt;
            if (vi < Mv) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) xv[u][e] = (xv[u][e] - mean) * rstd * g[u][e] + b[u][e];
                norm_store<T, VEC>(yr, vi * VEC, xv[u]);
            }
        }
        stage = stage + 1 == NORM_STAGES ? 0 : stage + 1;
    }
}

// ---------------------------------------------------------------------------
// norm_rows_forward_regs: layer / RMS norm forward (G == 1, S == 1, NCHW) on
// 16-byte rows of at most NORM_FUSED_ITEMS vectors a thread (the host picks
// blockDim >= M / (2 VEC)), R rows a block, one block per R rows (not
// persistent: the one-block-per-row shape that RMS norm runs at 0.97 of copy
// on the H100).  Thread t loads vectors t and t + blockDim of each of its
// block's rows into registers (R * 2 16-byte loads in flight a thread) and
// keeps them there: no shared-memory copy of the row.
// Statistics with ONE block barrier a row (norm_rows_forward's layer norm
// takes two block sums, each two barriers, and re-reads its shared copy for
// the squared deviations):  RMS: the sum of x^2, warp sums, one barrier, the
// warps' sums added.  Layer norm: each warp takes its own exact two-pass
// statistics by shuffles (its sum S_w over its n_w values, then M2_w, the sum
// of (x - S_w / n_w)^2 over them); after the barrier every warp adds the W
// warps' entries lane-parallel: mean = sum S_w / M and M2 = sum [M2_w + n_w
// (S_w / n_w - mean)^2] -- the exact split of the sum of squared deviations
// into within- and between-warp parts, every term non-negative (no
// cancellation, unlike sum x^2 - M mean^2).  n_w is known from the geometry
// (no shuffles).  mean_out gets 0 for RMS (the host's fill is not needed).
// Reductions in a fixed order: deterministic.
template <typename T, typename P, typename index_t, int VEC, int R>
__global__ void __launch_bounds__(1024) norm_rows_forward_regs(const T* __restrict__ x, T* __restrict__ y,
                                                               const P* __restrict__ gamma,
                                                               const P* __restrict__ beta,
                                                               acc_t<T>* __restrict__ mean_out,
                                                               acc_t<T>* __restrict__ rstd_out, index_t rows,
                                                               index_t M, acc_t<T> eps, int rms) {
    typedef acc_t<T> A;
    constexpr int I = NORM_FUSED_ITEMS;
    __shared__ A scratch[R][2][32];
    const index_t Mv = M / VEC;
    const unsigned nt = blockDim.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const unsigned warps = (nt + 31) >> 5;
    const index_t row0 = (index_t)blockIdx.x * R;
    const A count = A(M);
    // Values of warp w's lanes: item u covers vectors u * nt + 32 w .. + 31, those below Mv.
    const auto warp_count = [&](unsigned w) -> A {
        index_t n = 0;
#pragma unroll
        for (int u = 0; u < I; ++u) {
            const index_t first = (index_t)u * nt + 32 * w;
            n += first >= Mv ? index_t(0) : (Mv - first < 32 ? Mv - first : index_t(32));
        }
        return A(n * VEC);
    };
    A xv[R][I][VEC];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int u = 0; u < I; ++u) {
            const index_t vi = tid + u * nt;
            if (row0 + r < rows && vi < Mv) {
                norm_load<T, VEC>(x, (row0 + r) * M + vi * VEC, xv[r][u]);
            } else {
#pragma unroll
                for (int e = 0; e < VEC; ++e) xv[r][u][e] = A(0);
            }
        }
    }
    A s[R], d[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        s[r] = 0;
#pragma unroll
        for (int u = 0; u < I; ++u) {
#pragma unroll
            for (int e = 0; e < VEC; ++e) s[r] += rms ? xv[r][u][e] * xv[r][u][e] : xv[r][u][e];
        }
        s[r] = warp_sum(s[r]);
        d[r] = 0;
    }
    if (!rms) {
        const A nw = warp_count(warp);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const A mw = nw > A(0) ? s[r] / nw : A(0);
#pragma unroll
            for (int u = 0; u < I; ++u) {
                if (tid + u * nt < Mv) {
#pragma unroll
                    for (int e = 0; e < VEC; ++e) d[r] += (xv[r][u][e] - mw) * (xv[r][u][e] - mw);
                }
            }
            d[r] = warp_sum(d[r]);
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            scratch[r][0][warp] = s[r];
            scratch[r][1][warp] = d[r];
        }
    }
    __syncthreads();
    A mean[R], rstd[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const A sw = lane < warps ? scratch[r][0][lane] : A(0);
        const A total = warp_sum(sw);
        if (rms) {
            mean[r] = 0;
            rstd[r] = A(1) / sqrt(total / count + eps);
        } else {
            mean[r] = total / count;
            A between = 0;
            if (lane < warps) {
                const A nw = warp_count(lane);
                const A dm = (nw > A(0) ? sw / nw : A(0)) - mean[r];
                between = scratch[r][1][lane] + nw * dm * dm;
            }
            rstd[r] = A(1) / sqrt(warp_sum(between) / count + eps);
        }
        if (tid == 0 && row0 + r < rows) {
            mean_out[row0 + r] = mean[r];
            rstd_out[row0 + r] = rstd[r];
        }
    }
#pragma unroll
    for (int u = 0; u < I; ++u) {
        const index_t vi = tid + u * nt;
        if (vi < Mv) {
            A g[VEC], b[VEC];
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                g[e] = param_or(gamma, vi * VEC + e, A(1));
                b[e] = param_or(beta, vi * VEC + e, A(0));
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if (row0 + r < rows) {
#pragma unroll
                    for (int e = 0; e < VEC; ++e) xv[r][u][e] = (xv[r][u][e] - mean[r]) * rstd[r] * g[e] + b[e];
                    norm_store<T, VEC>(y, (row0 + r) * M + vi * VEC, xv[r][u]);
                }
            }
        }
    }
}

// norm_rows_forward_odd: layer / RMS norm forward (G == 1, S == 1, NCHW) on rows
// that are not 16-byte vectors (a length not a multiple of 16 bytes, or a
// misaligned view: 8192 x 4097 float32), which norm_rows_forward runs one
// 1024-thread block a row (2 blocks an SM: 32 KB of loads in flight an SM at a
// block's start), the row copied to shared memory, two block sums (4 barriers).
// Here: one block a row of ceil(M / I) threads rounded up to warps (the host
// picks I in _ODD_ITEMS so that the block has at most 512 threads): thread t
// loads values t + u * blockDim, u < I, with scalar coalesced loads (a warp reads
// 32 consecutive values), all I issued before any is used, and keeps them in
// registers.  Statistics as norm_rows_forward_regs (one block barrier: warp-exact
// two-pass, warps merged by the exact within / between split; RMS: the sum of
// x^2).  mean_out gets 0 for RMS.  Fixed reduction order: deterministic.
template <typename T, typename P, typename index_t, int I>
__global__ void __launch_bounds__(1024) norm_rows_forward_odd(const T* __restrict__ x, T* __restrict__ y,
                                                              const P* __restrict__ gamma,
                                                              const P* __restrict__ beta,
                                                              acc_t<T>* __restrict__ mean_out,
                                                              acc_t<T>* __restrict__ rstd_out, index_t M,
                                                              acc_t<T> eps, int rms) {
    typedef acc_t<T> A;
    __shared__ A scratch[2][32];
    const unsigned nt = blockDim.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const unsigned warps = (nt + 31) >> 5;
    const index_t row = blockIdx.x;
    const T* __restrict__ xr = x + row * M;
    const A count = A(M);
    // Values of warp w's lanes: item u covers values u * nt + 32 w .. + 31, those below M.
    const auto warp_count = [&](unsigned w) -> A {
        index_t n = 0;
#pragma unroll
        for (int u = 0; u < I; ++u) {
            const index_t first = (index_t)u * nt + 32 * w;
            n += first >= M ? index_t(0) : (M - first < 32 ? M - first : index_t(32));
        }
        return A(n);
    };
    A xv[I];
#pragma unroll
    for (int u = 0; u < I; ++u) {
        const index_t j = tid + (index_t)u * nt;
        xv[u] = j < M ? A(load(xr[j])) : A(0);
    }
    A s = 0, d = 0;
#pragma unroll
    for (int u = 0; u < I; ++u) s += rms ? xv[u] * xv[u] : xv[u];
    s = warp_sum(s);
    if (!rms) {
        const A nw = warp_count(warp);
        const A mw = nw > A(0) ? s / nw : A(0);
#pragma unroll
        for (int u = 0; u < I; ++u) {
            if (tid + (index_t)u * nt < M) d += (xv[u] - mw) * (xv[u] - mw);
        }
        d = warp_sum(d);
    }
    if (lane == 0) {
        scratch[0][warp] = s;
        scratch[1][warp] = d;
    }
    __syncthreads();
    const A sw = lane < warps ? scratch[0][lane] : A(0);
    const A total = warp_sum(sw);
    A mean, rstd;
    if (rms) {
        mean = 0;
        rstd = A(1) / sqrt(total / count + eps);
    } else {
        mean = total / count;
        A between = 0;
        if (lane < warps) {
            const A nw = warp_count(lane);
            const A dm = (nw > A(0) ? sw / nw : A(0)) - mean;
            between = scratch[1][lane] + nw * dm * dm;
        }
        rstd = A(1) / sqrt(warp_sum(between) / count + eps);
    }
    if (tid == 0) {
        mean_out[row] = mean;
        rstd_out[row] = rstd;
    }
    T* __restrict__ yr = y + row * M;
#pragma unroll
    for (int u = 0; u < I; ++u) {
        const index_t j = tid + (index_t)u * nt;
        if (j < M) yr[j] = store<T>((xv[u] - mean) * rstd * param_or(gamma, j, A(1)) + param_or(beta, j, A(0)));
    }
}

// norm_rows_backward_odd: layer / RMS norm backward with the parameter gradients
// fused (G == 1, S == 1, NCHW) on rows that are not 16-byte vectors, which
// otherwise take norm_rows_backward (one 1024-thread block a row) plus
// norm_param_grads_columns (x and dy read a second time).  norm_rows_backward_fused
// with scalar values and I of them a thread (the host's _odd_shape block):
// a persistent grid (the blocks resident at once) walks rows blockIdx.x, +
// gridDim.x, ...; thread t owns columns t + u * blockDim (u < I) in every row,
// loads its I values of x and dy (scalar, coalesced, all issued before use),
// keeps gamma and its dgamma / dbeta sums in registers, and writes its column
// partials at [blockIdx.x * M + column] for norm_param_grads_finish_wide (block
// order: deterministic).  At most 512 threads (5 I values a thread live: I = 16
// takes ~100 registers; under a 1024-thread bound it spilled): rows that need
// 1024 threads (more than 8192 values) keep the unfused kernels.
template <typename T, typename P, typename index_t, int I>
__global__ void __launch_bounds__(512) norm_rows_backward_odd(
    const T* __restrict__ dy, const T* __restrict__ x, const P* __restrict__ gamma,
    const acc_t<T>* __restrict__ mean_in, const acc_t<T>* __restrict__ rstd_in, T* __restrict__ dx,
    acc_t<T>* __restrict__ part_dgamma, acc_t<T>* __restrict__ part_dbeta, index_t rows, index_t M, int rms) {
    typedef acc_t<T> A;
    __shared__ A scratch[64];
    const index_t T_ = blockDim.x;
    const A count = A(M);
    const auto item = [&](int u) -> index_t { return threadIdx.x + (index_t)u * T_; };
    A dg[I][1], db[I][1], g[I][1];
    norm_fused_start(g, dg, db, gamma, M, item);
    for (index_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const A mean = rms ? A(0) : mean_in[row];
        const A rstd = rstd_in[row];
        A xv[I][1], dv[I][1];
#pragma unroll
        for (int u = 0; u < I; ++u) {
            const index_t j = item(u);
            xv[u][0] = j < M ? A(load(x[row * M + j])) : A(0);
            dv[u][0] = j < M ? A(load(dy[row * M + j])) : A(0);
        }
        A sum_g = 0, sum_gx = 0;
        norm_fused_sums(xv, dv, g, mean, rstd, sum_g, sum_gx, [&](int u) { return item(u) < M; });
        block_sum2(sum_g, sum_gx, scratch);
        const A mean_g = rms ? A(0) : sum_g / count;
        const A mean_gx = sum_gx / count;
#pragma unroll
        for (int u = 0; u < I; ++u) {
            const index_t j = item(u);
            if (j < M) {
                norm_fused_dx(xv[u], dv[u], g[u], dg[u], db[u], mean, rstd, mean_g, mean_gx);
                dx[row * M + j] = store<T>(xv[u][0]);
            }
        }
    }
#pragma unroll
    for (int u = 0; u < I; ++u) {
        const index_t j = item(u);
        if (j < M) {
            part_dgamma[(index_t)blockIdx.x * M + j] = dg[u][0];
            part_dbeta[(index_t)blockIdx.x * M + j] = db[u][0];
        }
    }
}
