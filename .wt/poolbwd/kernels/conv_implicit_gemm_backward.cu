// Implicit-GEMM convolution backward passes that the forward kernel
// (conv_implicit_gemm.cu) cannot express: backward filter with split-K, and
// backward data for stride > 1 by sub-pixel (phase) decomposition.  Nothing is
// materialised in device memory except split-K partial sums.
//
// ---- conv_wgrad_implicit_gemm: backward filter ------------------------------
// GEMM view, per group g:
//   dw[g*Kg + m, tap n] = sum_l A[m, l] * B[l, n]
//   m = output channel within the group               M = Kg
//   n = filter tap (c, r, s) of the group's input      N = Cg * R * S
//   l = output position (image, p, q)                  L = N_batch * P * Q
//   A[m, l] = dy[image, g*Kg + m, p, q]
//   B[l, n] = x[image, g*Cg + c, p*sh - ph + r*dh, q*sw - pw + s*dw]   (0 outside)
// The taps come from the forward tap table (dnnprims/algos/implicit_gemm.py:
// .x offset in one image, .y = r*dh, .z = s*dw, .w = offset of the tap inside
// one filter, i.e. where dw stores it), padded to a multiple of 128 with an
// out-of-range .y so that padded columns gather zeros.
// The reduction depth L is huge and M*N small for many layers, so it is split:
// blockIdx.z = g * splits + split reduces l in [split*chunk, (split+1)*chunk).
// mode 0: one split, the tile is stored in T straight into dw;
// mode 1: each split stores its float tile into partial[split] and
//         conv_wgrad_split_sum adds the splits in a fixed order (deterministic);
// mode 2: every split atomicAdds into one float buffer (fast, not bit-stable).
// Thread mapping of the loads: in each k-step of BK positions l, each thread
// owns exactly ONE l (decoded once per step: two integer divisions) and loads
// several m of dy and several taps n of x for it.  NCHW: l is the fastest
// thread index (consecutive q are consecutive addresses in dy and, for stride
// 1, in x); NHWC: LANES = THREADS / BK consecutive threads share an l and read
// consecutive channels (32- or 64-byte runs).  The row padding of the shared
// tiles (4 floats NCHW, LANES floats NHWC) keeps those stores at most 2-way
// bank-conflicted while rows stay 16-byte aligned for the float4 reads of the
// math loop, which is the forward kernel's: two stages, TM x TN register tiles
// of groups of 4, loads of stage t+1 in registers during the FMAs of stage t.
//
// ---- conv_dgrad_subpixel: backward data, any stride --------------------------
// dx[h, w] only receives taps r with (h + ph - r*dh) divisible by sh.  Split dx
// into the sh*sw phases (a, b) = (h mod sh, w mod sw); phase pixels
// (h, w) = (a + sh*i, b + sw*j) form a dense (Hp x Wp) grid, and for them
//   dx[image, g*Cg + n, a + sh*i, b + sw*j]
//     = sum over (k, r, s) of the phase  dy[image, g*Kg + k, i + off_r, j + off_s] * w[g*Kg + k, n, r, s]
// with off_r = (a + ph - r*dh) / sh exact: a stride-1 implicit GEMM with
// M = N*Hp*Wp, N = Cg, depth Kg * (taps of the phase).  No multiply touches an
// inserted zero.  blockIdx.z = g * phases + phase; each phase has its own tap
// table (taps + phase * taps_per_phase: .x offset in one image of dy, .y = off_r,
// .z = off_s, .w = offset in w) and depth phase_depth[phase]; a phase with no
// taps stores zeros.  The main loop is the forward kernel's; the epilogue
// scatters to the strided phase pixels.
//
// Indices are int: Python refuses tensors of 2^31 elements or more.
#include "common.cuh"

#define CONV_BACKWARD_OUTSIDE (-(1 << 29))

// 256-thread tiles ask for two resident blocks per SM (at most 128 registers a
// thread): with one, 8 warps cannot hide the gather latency.
#define CONV_BACKWARD_BOUNDS(THREADS) __launch_bounds__(THREADS, (THREADS) >= 256 ? 2 : 5)

// The shared math of one k-step: acc += As[kk][m] * Bs[kk][n] for the thread's
// TM x TN tile (groups of 4 spaced BM*4/TM, BN*4/TN apart: conflict-free float4).
template <int BM, int BN, int BK, int TM, int TN, int LDA, int LDB>
__device__ __forceinline__ void conv_backward_tile_math(const float (*As)[LDA], const float (*Bs)[LDB],
                                                        int tm, int tn, float (&acc)[TM][TN]) {
    constexpr int M_GROUP = BM * 4 / TM;
    constexpr int N_GROUP = BN * 4 / TN;
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
        float a[TM], b[TN];
#pragma unroll
        for (int i = 0; i < TM / 4; ++i) {
            const float4 v = *reinterpret_cast<const float4*>(&As[kk][i * M_GROUP + tm * 4]);
            a[4 * i] = v.x; a[4 * i + 1] = v.y; a[4 * i + 2] = v.z; a[4 * i + 3] = v.w;
        }
#pragma unroll
        for (int j = 0; j < TN / 4; ++j) {
            const float4 v = *reinterpret_cast<const float4*>(&Bs[kk][j * N_GROUP + tn * 4]);
            b[4 * j] = v.x; b[4 * j + 1] = v.y; b[4 * j + 2] = v.z; b[4 * j + 3] = v.w;
        }
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
    }
}

template <typename T, bool NHWC, int BM, int BN, int BK, int TM, int TN>
__global__ void CONV_BACKWARD_BOUNDS((BM / TM) * (BN / TN))
conv_wgrad_implicit_gemm(const T* __restrict__ x, const T* __restrict__ dy, const int4* __restrict__ taps,
                         float* __restrict__ partial, T* __restrict__ dw, int mode,
                         int H, int W, int C, int Cg, int P, int Q, int K, int Kg, int Ntaps,
                         int sh, int sw, int ph, int pw, int L, int chunk, int splits) {
    static_assert(sizeof(acc_t<T>) == 4, "float accumulation only");
    constexpr int THREADS = (BM / TM) * (BN / TN);
    constexpr int LANES = THREADS / BK;       // threads sharing one l in a k-step
    constexpr int A_LOADS = BM / LANES;
    constexpr int B_LOADS = BN / LANES;
    constexpr int PAD = NHWC ? LANES : 4;
    static_assert(THREADS % BK == 0 && BM % LANES == 0 && BN % LANES == 0, "load mapping");
    static_assert(TM % 4 == 0 && TN % 4 == 0 && PAD % 4 == 0, "float4 rows");

    __shared__ __align__(16) float As[2][BK][BM + PAD];
    __shared__ __align__(16) float Bs[2][BK][BN + PAD];

    const int tid = threadIdx.x;
    const int g = blockIdx.z / splits;
    const int split = blockIdx.z - g * splits;
    const int m0 = blockIdx.x * BM;
    const int n0 = blockIdx.y * BN;
    const int l_begin = split * chunk;
    const int l_end = min(L, l_begin + chunk);
    const int PQ = P * Q;
    const int l_local = NHWC ? tid / LANES : tid % BK;
    const int lane = NHWC ? tid % LANES : tid / BK;

    dy += NHWC ? g * Kg : g * Kg * PQ;
    x += NHWC ? g * Cg : g * Cg * H * W;

    float a_next[A_LOADS], b_next[B_LOADS];
    auto load_stage = [&](int l0) {
        const int l = l0 + l_local;
        int dy_base = 0, x_base = 0, h0 = CONV_BACKWARD_OUTSIDE, w0 = 0;
        if (l < l_end) {
            const int image = l / PQ, pq = l - image * PQ;
            const int p = pq / Q, q = pq - p * Q;
            h0 = p * sh - ph;
            w0 = q * sw - pw;
            dy_base = NHWC ? l * K : image * K * PQ + pq;
            x_base = image * C * H * W + (NHWC ? (h0 * W + w0) * C : h0 * W + w0);
        }
        const bool l_ok = l < l_end;
#pragma unroll
        for (int i = 0; i < A_LOADS; ++i) {
            const int m = m0 + lane + i * LANES;
            a_next[i] = (l_ok && m < Kg) ? load(dy[dy_base + (NHWC ? m : m * PQ)]) : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < B_LOADS; ++i) {
            const int4 tap = __ldg(&taps[n0 + lane + i * LANES]);
            const bool inside = (unsigned)(h0 + tap.y) < (unsigned)H && (unsigned)(w0 + tap.z) < (unsigned)W;
            b_next[i] = inside ? load(x[x_base + tap.x]) : 0.0f;
        }
    };
    auto store_stage = [&](int buf) {
#pragma unroll
        for (int i = 0; i < A_LOADS; ++i) As[buf][l_local][lane + i * LANES] = a_next[i];
#pragma unroll
        for (int i = 0; i < B_LOADS; ++i) Bs[buf][l_local][lane + i * LANES] = b_next[i];
    };

    // n-fastest register tiles: the epilogue's consecutive threads write
    // consecutive taps.
    const int tn = tid % (BN / TN);
    const int tm = tid / (BN / TN);
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

    const int stages = l_end > l_begin ? (l_end - l_begin + BK - 1) / BK : 0;
    load_stage(l_begin);
    store_stage(0);
    __syncthreads();
    for (int t = 0; t < stages; ++t) {
        const int buf = t & 1;
        const bool more = t + 1 < stages;
        if (more) load_stage(l_begin + (t + 1) * BK);
        conv_backward_tile_math<BM, BN, BK, TM, TN, BM + PAD, BN + PAD>(As[buf], Bs[buf], tm, tn, acc);
        if (more) store_stage(buf ^ 1);
        __syncthreads();
    }

    constexpr int M_GROUP = BM * 4 / TM;
    constexpr int N_GROUP = BN * 4 / TN;
    float* split_partial = partial + (mode == 1 ? split * K * Ntaps : 0);
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + (i / 4) * M_GROUP + tm * 4 + (i % 4);
        if (m >= Kg) continue;
        const int row = (g * Kg + m) * Ntaps;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int n = n0 + (j / 4) * N_GROUP + tn * 4 + (j % 4);
            if (n >= Ntaps) continue;
            const int offset = row + __ldg(&taps[n]).w;
            if (mode == 0) {
                dw[offset] = store<T>(acc[i][j]);
            } else if (mode == 1) {
                split_partial[offset] = acc[i][j];
            } else {
                atomicAdd(split_partial + offset, acc[i][j]);
            }
        }
    }
}

// dw[i] = sum over splits, in split order, of partial[split][i] (one thread per i).
template <typename T>
__global__ void conv_wgrad_split_sum(const float* __restrict__ partial, T* __restrict__ dw,
                                     int total, int splits) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) sum += partial[s * total + i];
    dw[i] = store<T>(sum);
}

template <typename T, bool NHWC, int BM, int BN, int BK, int TM, int TN>
__global__ void CONV_BACKWARD_BOUNDS((BM / TM) * (BN / TN))
conv_dgrad_subpixel(const T* __restrict__ dy, const T* __restrict__ w, const int4* __restrict__ taps,
                    const int* __restrict__ phase_depth, T* __restrict__ dx,
                    int H, int W, int C, int Cg, int P, int Q, int K, int Kg,
                    int taps_per_phase, int w_n_stride, int w_group_stride,
                    int sh, int sw, int N) {
    static_assert(sizeof(acc_t<T>) == 4, "float accumulation only");
    constexpr int THREADS = (BM / TM) * (BN / TN);
    constexpr int A_LOADS = BM * BK / THREADS;
    constexpr int B_LOADS = BN * BK / THREADS;
    constexpr int A_ROWS = NHWC ? A_LOADS : 1;
    constexpr int PAD = 4;
    static_assert(TM % 4 == 0 && TN % 4 == 0, "register tiles are groups of 4");
    static_assert((BM * BK) % THREADS == 0 && (BN * BK) % THREADS == 0, "whole loads per thread");
    static_assert(THREADS % BK == 0 && (NHWC || THREADS % BM == 0), "load mapping");

    __shared__ __align__(16) float As[2][BK][BM + PAD];
    __shared__ __align__(16) float Bs[2][BK][BN + PAD];

    const int phases = sh * sw;
    const int g = blockIdx.z / phases;
    const int phase = blockIdx.z - g * phases;
    const int a = phase / sw, b = phase - a * sw;
    const int Hp = H > a ? (H - a + sh - 1) / sh : 0;
    const int Wp = W > b ? (W - b + sw - 1) / sw : 0;
    const int HWp = Hp * Wp;
    const int M = N * HWp;
    const int m0 = blockIdx.x * BM;
    if (m0 >= M) return;   // the whole block: this phase has fewer pixels
    const int n0 = blockIdx.y * BN;
    const int Kgemm = phase_depth[phase];
    const int PQ = P * Q;
    const int tid = threadIdx.x;

    taps += phase * taps_per_phase;
    dy += NHWC ? g * Kg : g * Kg * PQ;
    w += g * w_group_stride;

    const int a_k0 = NHWC ? tid % BK : tid / BM;
    const int a_m0 = NHWC ? tid / BK : tid % BM;
    constexpr int A_K_STEP = NHWC ? 0 : THREADS / BM;
    constexpr int A_M_STEP = NHWC ? THREADS / BK : 0;
    int a_base[A_ROWS], a_i[A_ROWS], a_j[A_ROWS];
#pragma unroll
    for (int r = 0; r < A_ROWS; ++r) {
        const int m = m0 + a_m0 + r * A_M_STEP;
        if (m < M) {
            const int image = m / HWp, ij = m - image * HWp;
            const int i = ij / Wp, j = ij - i * Wp;
            a_i[r] = i;
            a_j[r] = j;
            a_base[r] = image * K * PQ + (NHWC ? (i * Q + j) * K : i * Q + j);
        } else {
            a_i[r] = CONV_BACKWARD_OUTSIDE;
            a_j[r] = 0;
            a_base[r] = 0;
        }
    }
    const int b_k = tid % BK;
    const int b_n0 = tid / BK;
    constexpr int B_N_STEP = THREADS / BK;

    float a_next[A_LOADS], b_next[B_LOADS];
    auto load_stage = [&](int k0) {
#pragma unroll
        for (int l = 0; l < A_LOADS; ++l) {
            const int r = NHWC ? l : 0;
            const int4 tap = __ldg(&taps[k0 + a_k0 + l * A_K_STEP]);
            const bool inside = (unsigned)(a_i[r] + tap.y) < (unsigned)P &&
                                (unsigned)(a_j[r] + tap.z) < (unsigned)Q;
            a_next[l] = inside ? load(dy[a_base[r] + tap.x]) : 0.0f;
        }
        const int k = k0 + b_k;
        const int w_off = __ldg(&taps[k]).w;
#pragma unroll
        for (int l = 0; l < B_LOADS; ++l) {
            const int n = n0 + b_n0 + l * B_N_STEP;
            b_next[l] = (k < Kgemm && n < Cg) ? load(w[n * w_n_stride + w_off]) : 0.0f;
        }
    };
    auto store_stage = [&](int buf) {
#pragma unroll
        for (int l = 0; l < A_LOADS; ++l) As[buf][a_k0 + l * A_K_STEP][a_m0 + l * A_M_STEP] = a_next[l];
#pragma unroll
        for (int l = 0; l < B_LOADS; ++l) Bs[buf][b_k][b_n0 + l * B_N_STEP] = b_next[l];
    };

    const int tm = NHWC ? tid / (BN / TN) : tid % (BM / TM);
    const int tn = NHWC ? tid % (BN / TN) : tid / (BM / TM);
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

    const int stages = (Kgemm + BK - 1) / BK;
    load_stage(0);
    store_stage(0);
    __syncthreads();
    for (int t = 0; t < stages; ++t) {
        const int buf = t & 1;
        const bool more = t + 1 < stages;
        if (more) load_stage((t + 1) * BK);
        conv_backward_tile_math<BM, BN, BK, TM, TN, BM + PAD, BN + PAD>(As[buf], Bs[buf], tm, tn, acc);
        if (more) store_stage(buf ^ 1);
        __syncthreads();
    }

    // --- epilogue: scatter to the phase's pixels (a + sh*i, b + sw*j) ---------
    constexpr int M_GROUP = BM * 4 / TM;
    constexpr int N_GROUP = BN * 4 / TN;
    dx += NHWC ? g * Cg : g * Cg * H * W;
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + (i / 4) * M_GROUP + tm * 4 + (i % 4);
        if (m >= M) continue;
        const int image = m / HWp, ij = m - image * HWp;
        const int pi = ij / Wp, pj = ij - pi * Wp;
        const int pixel = (a + sh * pi) * W + b + sw * pj;
        if (NHWC) {
            T* row = dx + (image * H * W + pixel) * C;
#pragma unroll
            for (int j4 = 0; j4 < TN / 4; ++j4) {
                const int n_first = n0 + j4 * N_GROUP + tn * 4;
                if (n_first >= Cg) continue;
                bool vector_ok = false;
                if constexpr (sizeof(T) == 4) vector_ok = (C % 4 == 0) && (Cg % 4 == 0);
                if (vector_ok) {
                    *reinterpret_cast<float4*>(row + n_first) =
                        make_float4(acc[i][4 * j4], acc[i][4 * j4 + 1], acc[i][4 * j4 + 2], acc[i][4 * j4 + 3]);
                } else {
#pragma unroll
                    for (int jj = 0; jj < 4; ++jj)
                        if (n_first + jj < Cg) row[n_first + jj] = store<T>(acc[i][4 * j4 + jj]);
                }
            }
        } else {
            T* column = dx + image * C * H * W + pixel;
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                const int n = n0 + (j / 4) * N_GROUP + tn * 4 + (j % 4);
                if (n < Cg) column[n * H * W] = store<T>(acc[i][j]);
            }
        }
    }
}
