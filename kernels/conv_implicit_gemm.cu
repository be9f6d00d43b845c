// Implicit-GEMM convolution: forward, and backward data (stride 1) as a forward
// convolution over dy with the rotated filter.  Nothing is materialised in
// device memory: the im2col tile is gathered into shared memory on the fly.
//
// GEMM view, per group g (blockIdx.z):
//   out[m, n] = sum_k A[m, k] * B[k, n]
//   m = (image, p, q) of an output position          M     = N * P * Q
//   n = output channel within the group              Ngemm = Kg
//   k = a filter tap (channel, r, s) of the input    Kgemm = Cg * R * S
//   A[m, k] = x[image, g*Cg + c, p*sh - ph + dh(k), q*sw - pw + dw(k)]   (0 outside)
//   B[k, n] = w[g * w_group_stride + n * w_n_stride + w_off(k)]
// The per-tap quantities come from a small table `taps` built on the host
// (dnnprims/algos/implicit_gemm.py), one int4 per k:
//   .x = offset of the tap inside one image of x (channel and dh, dw folded in)
//   .y = dh, .z = dw (the tap's row / column displacement, for the bounds test)
//   .w = w_off, the tap's offset inside one filter column of B
// so the inner loops do no division: each thread decodes its output rows
// (image, p, q) once, and per k only adds the table entry and tests
// (unsigned)(h0 + dh) < H, (unsigned)(w0 + dw) < W.  The k order of the table
// follows memory: (c, r, s) for NCHW (consecutive m are consecutive q, so the
// gather is coalesced along m), (r, s, c) for NHWC (consecutive k are
// consecutive channels, coalesced along k).  Backward data uses the same kernel
// with x = dy, w_off pointing at the rotated tap (R-1-r, S-1-s) and the
// roles of C and K swapped (see the Python module).
//
// Block tile BM x BN, k-step BK; each thread owns a TM x TN register tile made
// of TM/4 x TN/4 groups of 4 rows / columns spaced BM*4/TM (BN*4/TN) apart, so
// that a warp's float4 reads of shared memory hit consecutive addresses
// (conflict-free).  Threads are laid out m-fastest for NCHW (the epilogue's
// float4 stores run along p*q, contiguous in y) and n-fastest for NHWC
// (contiguous along channels).  Shared memory holds two stages of As[BK][BM]
// and Bs[BK][BN] in the accumulation type (rows padded by 4 floats: the
// k-fastest stores of the NHWC A tile and of the B tile would otherwise hit
// one bank 8 times); the global loads of stage t+1 are issued into registers
// before the FMA loop of stage t and stored after it, one barrier per stage.
//
// Accumulation in acc_t<T> = float (float, half, bfloat16 storage; double is
// not instantiated: an 8x8 double tile would not fit the register file well).
// The epilogue adds the bias and applies the activation act_mode
// (activation_math.cuh; ACTIVATION_NONE = none) to the register tile before
// the stores, so conv + bias + activation is one pass over y.  Indices are int: Python refuses problems whose
// tensors do not fit 32-bit indexing (the direct algorithm covers them).
//
// Split-K (SPLIT_K = true; WORK IN PROGRESS, not registered: dnnprims/algos/implicit_gemm.py).
// When M * Ngemm gives fewer blocks than the GPU has SMs (batch 1, late layers) and
// Kgemm is long, the k range is split too: blockIdx.z = g * splits + split, and
// split s reduces the taps [s * chunk, min((s + 1) * chunk, Kgemm)), chunk a
// multiple of BK (so a split's last k-step ends at the next split's first tap:
// no tap twice, none skipped; the host makes every split non-empty).  Its
// epilogue stores the raw float accumulators, no bias or activation, to
// partials + split * (N * Ky * P * Q), at y's own layout (NCHW [image][channel]
// [p*q], NHWC [image*p*q][channel]) with the same store code as y: the stores
// are coalesced exactly as today's (float4 along p*q for NCHW, along channels
// for NHWC), and conv_implicit_gemm_split_sum is elementwise over y with no
// index remapping.  That kernel adds the splits in order 0..splits-1, then the
// bias, applies the activation and casts: the same bits on every run (no
// atomics).  SPLIT_K = false is the single-pass kernel above, unchanged (its
// partials / chunk / splits arguments are not read).
#include "activation_math.cuh"

// Taps past Kgemm (the table is padded to a multiple of 16) carry this dh so
// that the bounds test fails without a separate k < Kgemm test for A.
#define IMPLICIT_GEMM_OUTSIDE (-(1 << 29))

// Stores a thread's TM x TN register tile at y's layout.  y points at the
// group's first channel; S is y's storage type (T) or float (split-K partials).
template <typename S, bool NHWC, int BM, int BN, int TM, int TN>
__device__ __forceinline__ void conv_implicit_gemm_store_tile(S* __restrict__ y, const float (&acc)[TM][TN],
                                                              int m0, int n0, int tm, int tn,
                                                              int M, int PQ, int Ky, int Kg) {
    constexpr int M_GROUP = BM * 4 / TM;
    constexpr int N_GROUP = BN * 4 / TN;
    typedef float A;
#pragma unroll
    for (int i4 = 0; i4 < TM / 4; ++i4) {
        const int m_first = m0 + i4 * M_GROUP + tm * 4;
        if (m_first >= M) continue;
        if (NHWC) {
#pragma unroll
            for (int ii = 0; ii < 4; ++ii) {
                const int m = m_first + ii;
                if (m >= M) break;
                S* row = y + m * Ky;
#pragma unroll
                for (int j4 = 0; j4 < TN / 4; ++j4) {
                    const int n_first = n0 + j4 * N_GROUP + tn * 4;
                    if (n_first >= Kg) continue;
                    A v[4];
#pragma unroll
                    for (int jj = 0; jj < 4; ++jj) v[jj] = acc[4 * i4 + ii][4 * j4 + jj];
                    bool vector_ok = false;
                    if constexpr (sizeof(S) == 4) vector_ok = (Ky % 4 == 0) && (Kg % 4 == 0);
                    if (vector_ok) {
                        *reinterpret_cast<float4*>(row + n_first) = make_float4(v[0], v[1], v[2], v[3]);
                    } else {
#pragma unroll
                        for (int jj = 0; jj < 4; ++jj)
                            if (n_first + jj < Kg) row[n_first + jj] = store<S>(v[jj]);
                    }
                }
            }
        } else {
            bool vector_ok = false;
            if constexpr (sizeof(S) == 4) vector_ok = (PQ % 4 == 0);  // then M % 4 == 0 too
            if (vector_ok) {
                const int image = m_first / PQ, pq = m_first - image * PQ;
                S* column = y + image * Ky * PQ + pq;
#pragma unroll
                for (int j = 0; j < TN; ++j) {
                    const int n = n0 + (j / 4) * N_GROUP + tn * 4 + (j % 4);
                    if (n >= Kg) continue;
                    const float4 v = make_float4(acc[4 * i4][j], acc[4 * i4 + 1][j],
                                                 acc[4 * i4 + 2][j], acc[4 * i4 + 3][j]);
                    *reinterpret_cast<float4*>(column + n * PQ) = v;
                }
            } else {
#pragma unroll
                for (int ii = 0; ii < 4; ++ii) {
                    const int m = m_first + ii;
                    if (m >= M) break;
                    const int image = m / PQ, pq = m - image * PQ;
                    S* column = y + image * Ky * PQ + pq;
#pragma unroll
                    for (int j = 0; j < TN; ++j) {
                        const int n = n0 + (j / 4) * N_GROUP + tn * 4 + (j % 4);
                        if (n < Kg) column[n * PQ] = store<S>(acc[4 * i4 + ii][j]);
                    }
                }
            }
        }
    }
}

template <typename T, bool NHWC, int BM, int BN, int BK, int TM, int TN, bool SPLIT_K>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
conv_implicit_gemm(const T* __restrict__ x, const T* __restrict__ w, const int4* __restrict__ taps,
                   const T* __restrict__ bias, int has_bias, int act_mode, float act_alpha,
                   T* __restrict__ y, float* __restrict__ partials,
                   int H, int W, int Cx, int x_group_channels,
                   int P, int Q, int Ky, int Kg,
                   int Kgemm, int w_n_stride, int w_group_stride,
                   int sh, int sw, int ph, int pw, int M, int chunk, int splits) {
    typedef acc_t<T> A;
    static_assert(sizeof(A) == 4, "float accumulation only");
    constexpr int THREADS = (BM / TM) * (BN / TN);
    constexpr int A_LOADS = BM * BK / THREADS;
    constexpr int B_LOADS = BN * BK / THREADS;
    constexpr int A_ROWS = NHWC ? A_LOADS : 1;    // output rows m each thread gathers for A
    constexpr int PAD = 4;
    static_assert(TM % 4 == 0 && TN % 4 == 0, "register tiles are groups of 4");
    static_assert((BM * BK) % THREADS == 0 && (BN * BK) % THREADS == 0, "whole loads per thread");
    static_assert(THREADS % BK == 0 && (NHWC || THREADS % BM == 0), "load mapping");

    __shared__ __align__(16) A As[2][BK][BM + PAD];
    __shared__ __align__(16) A Bs[2][BK][BN + PAD];

    const int tid = threadIdx.x;
    const int g = SPLIT_K ? blockIdx.z / splits : blockIdx.z;
    const int split = SPLIT_K ? blockIdx.z - g * splits : 0;
    const int k_begin = SPLIT_K ? split * chunk : 0;
    const int k_end = SPLIT_K ? min(Kgemm, k_begin + chunk) : Kgemm;
    const int m0 = blockIdx.x * BM;
    const int n0 = blockIdx.y * BN;
    const int PQ = P * Q;
    const int image_stride = Cx * H * W;

    x += NHWC ? g * x_group_channels : g * x_group_channels * H * W;
    w += g * w_group_stride;

    // --- the A gather: decode this thread's output rows once -----------------
    const int a_k0 = NHWC ? tid % BK : tid / BM;          // first k of this thread
    const int a_m0 = NHWC ? tid / BK : tid % BM;          // first m of this thread
    constexpr int A_K_STEP = NHWC ? 0 : THREADS / BM;     // k step between loads (NCHW)
    constexpr int A_M_STEP = NHWC ? THREADS / BK : 0;     // m step between loads (NHWC)
    int a_base[A_ROWS], a_h0[A_ROWS], a_w0[A_ROWS];
#pragma unroll
    for (int i = 0; i < A_ROWS; ++i) {
        const int m = m0 + a_m0 + i * A_M_STEP;
        if (m < M) {
            const int image = m / PQ, pq = m - image * PQ;
            const int p = pq / Q, q = pq - p * Q;
            a_h0[i] = p * sh - ph;
            a_w0[i] = q * sw - pw;
            a_base[i] = image * image_stride + (NHWC ? (a_h0[i] * W + a_w0[i]) * Cx : a_h0[i] * W + a_w0[i]);
        } else {
            a_h0[i] = IMPLICIT_GEMM_OUTSIDE;
            a_w0[i] = 0;
            a_base[i] = 0;
        }
    }
    // --- the B load: k-fastest so that a filter column is read contiguously ---
    const int b_k = tid % BK;
    const int b_n0 = tid / BK;
    constexpr int B_N_STEP = THREADS / BK;

    A a_next[A_LOADS], b_next[B_LOADS];

    auto load_stage = [&](int k0) {
#pragma unroll
        for (int i = 0; i < A_LOADS; ++i) {
            const int row = NHWC ? i : 0;
            const int4 tap = __ldg(&taps[k0 + a_k0 + i * A_K_STEP]);
            const bool inside = (unsigned)(a_h0[row] + tap.y) < (unsigned)H &&
                                (unsigned)(a_w0[row] + tap.z) < (unsigned)W;
            a_next[i] = inside ? load(x[a_base[row] + tap.x]) : A(0);
        }
        const int k = k0 + b_k;
        const int w_off = __ldg(&taps[k]).w;
#pragma unroll
        for (int i = 0; i < B_LOADS; ++i) {
            const int n = n0 + b_n0 + i * B_N_STEP;
            b_next[i] = (k < Kgemm && n < Kg) ? load(w[n * w_n_stride + w_off]) : A(0);
        }
    };
    auto store_stage = [&](int buf) {
#pragma unroll
        for (int i = 0; i < A_LOADS; ++i) {
            As[buf][a_k0 + i * A_K_STEP][a_m0 + i * A_M_STEP] = a_next[i];
        }
#pragma unroll
        for (int i = 0; i < B_LOADS; ++i) Bs[buf][b_k][b_n0 + i * B_N_STEP] = b_next[i];
    };

    // --- register tile --------------------------------------------------------
    const int tm = NHWC ? tid / (BN / TN) : tid % (BM / TM);
    const int tn = NHWC ? tid % (BN / TN) : tid / (BM / TM);
    constexpr int M_GROUP = BM * 4 / TM;   // distance between this thread's row groups
    constexpr int N_GROUP = BN * 4 / TN;
    A acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = A(0);

    const int stages = (k_end - k_begin + BK - 1) / BK;
    load_stage(k_begin);
    store_stage(0);
    __syncthreads();
    for (int t = 0; t < stages; ++t) {
        const int buf = t & 1;
        const bool more = t + 1 < stages;
        if (more) load_stage(k_begin + (t + 1) * BK);
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            A a[TM], b[TN];
#pragma unroll
            for (int i = 0; i < TM / 4; ++i) {
                const float4 v = *reinterpret_cast<const float4*>(&As[buf][kk][i * M_GROUP + tm * 4]);
                a[4 * i] = v.x; a[4 * i + 1] = v.y; a[4 * i + 2] = v.z; a[4 * i + 3] = v.w;
            }
#pragma unroll
            for (int j = 0; j < TN / 4; ++j) {
                const float4 v = *reinterpret_cast<const float4*>(&Bs[buf][kk][j * N_GROUP + tn * 4]);
                b[4 * j] = v.x; b[4 * j + 1] = v.y; b[4 * j + 2] = v.z; b[4 * j + 3] = v.w;
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
        }
        if (more) store_stage(buf ^ 1);
        __syncthreads();
    }

    // --- epilogue: bias and activation, then store (split-K: the raw tile) ---------------------
    if constexpr (SPLIT_K) {
        float* split_y = partials + split * (M * Ky) + (NHWC ? g * Kg : g * Kg * PQ);
        conv_implicit_gemm_store_tile<float, NHWC, BM, BN, TM, TN>(split_y, acc, m0, n0, tm, tn, M, PQ, Ky, Kg);
    } else {
        y += NHWC ? g * Kg : g * Kg * PQ;  // first channel of this group
        const T* group_bias = bias + g * Kg;
        A bias_of[TN];
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int n = n0 + (j / 4) * N_GROUP + tn * 4 + (j % 4);
            bias_of[j] = (has_bias && n < Kg) ? load(group_bias[n]) : A(0);
        }
#pragma unroll
        for (int i = 0; i < TM; ++i) {
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] += bias_of[j];
            activate_tile<TN>(act_mode, acc[i], act_alpha);
        }
        conv_implicit_gemm_store_tile<T, NHWC, BM, BN, TM, TN>(y, acc, m0, n0, tm, tn, M, PQ, Ky, Kg);
    }
}

// Split-K's second pass, one thread per element i of y (and of each split's
// partials, which have y's layout):
//   y[i] = act(partials[0][i] + ... + partials[splits-1][i] + bias[channel of i])
// in that order (deterministic), cast to T.  channel = (i / inner) % K with
// inner = P*Q for NCHW, 1 for NHWC.
template <typename T>
__global__ void conv_implicit_gemm_split_sum(const float* __restrict__ partials, const T* __restrict__ bias,
                                             int has_bias, int act_mode, float act_alpha, T* __restrict__ y,
                                             int total, int splits, int K, int inner) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    float sum = partials[i];
    for (int s = 1; s < splits; ++s) sum += partials[s * total + i];
    if (has_bias) sum += load(bias[(i / inner) % K]);
    activate_tile<1>(act_mode, &sum, act_alpha);
    y[i] = store<T>(sum);
}
