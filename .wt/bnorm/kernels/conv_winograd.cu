// Winograd F(M x M, R x R) convolution, stride 1 (R = 3 or 5): the input and output transforms
// and the filter transform around the alpha^2 batched GEMMs (cuBLAS, from
// Python: dnnprims/algos/winograd.py, which also derives the matrices and
// generates conv_winograd_matrices.cuh from the Toom-Cook points).
//
// Workspace layouts (acc_t<T>: float, or double for double storage), per batch
// chunk of `tiles` output tiles t = ((n - n0) * tiles_h + th) * tiles_w + tw;
// the kernels take the one workspace allocation and the element offsets of V
// and M in it (U starts it), so a prepared launch fixes everything but pointers:
//   U[a][k][c]                  filter transform,  a = alpha index (i * ALPHA + j)
//   V[a][c][t] (NCHW)           input transform
//   V[a][t][c] (NHWC)
//   Mw[a][k][t] / Mw[a][t][k]   the GEMM result that the output transform reads
// Thread mapping: one thread per (channel, tile) -- it loads its ALPHA x ALPHA
// input tile (zero outside the image: the padding), or its ALPHA^2 GEMM
// results, keeps the whole tile in registers and applies both 1-D transforms.
// Consecutive threads take consecutive tiles for NCHW (the workspace stores
// along t are coalesced; the image loads overlap by 2 columns and hit L1) and
// consecutive channels for NHWC (coalesced along c on both sides).  Nothing is
// shared between threads, so there is no shared memory and no barrier.
// The filter transform (one thread per (kout, cin) pair) runs in the input
// transform's launch, in the blocks past the input's own (`input_blocks`):
// the two are independent, so the small filter grid fills the input grid's
// tail instead of taking a launch (and a drain) of its own.
//
// The transform loops are fully unrolled over compile-time matrices, so the
// zero entries cost nothing and the +-1 entries are plain adds.  Every stage's
// 2-D transform Y = L X L^T is the one helper `transform_2d` below.  Indices are
// int: Python refuses tensors and workspaces of 2^31 elements or more.
#include "common.cuh"
#include "conv_winograd_matrices.cuh"

// The matrices of winograd_matrices / winograd_wgrad_matrices as the L of
// transform_2d: L(i, j) is a compile-time constant once the loops unroll.
template <typename F> struct winograd_bt {
    static __device__ __forceinline__ double l(int i, int j) { return F::bt(i, j); }
};
template <typename F> struct winograd_g {
    static __device__ __forceinline__ double l(int i, int j) { return F::g(i, j); }
};
template <typename F> struct winograd_at {
    static __device__ __forceinline__ double l(int i, int j) { return F::at(i, j); }
};

// y = L x L^T for the OUT x IN matrix L: first L x (OUT x IN), then each of its
// rows times L^T.  The sums run in the order of j (the same bits as the
// kernels' former hand-written loops); zero entries are skipped at compile time.
template <typename L, int OUT, int IN, typename A>
__device__ __forceinline__ void transform_2d(const A (&x)[IN][IN], A (&y)[OUT][OUT]) {
    A lx[OUT][IN];
#pragma unroll
    for (int r = 0; r < OUT; ++r) {
#pragma unroll
        for (int s = 0; s < IN; ++s) {
            A sum = A(0);
#pragma unroll
            for (int j = 0; j < IN; ++j) {
                if (L::l(r, j) != 0.0) sum += A(L::l(r, j)) * x[j][s];
            }
            lx[r][s] = sum;
        }
    }
#pragma unroll
    for (int r = 0; r < OUT; ++r) {
#pragma unroll
        for (int s = 0; s < OUT; ++s) {
            A sum = A(0);
#pragma unroll
            for (int j = 0; j < IN; ++j) {
                if (L::l(s, j) != 0.0) sum += lx[r][j] * A(L::l(s, j));
            }
            y[r][s] = sum;
        }
    }
}

// The SIZE x SIZE patch of image n, channel c at (h0, w0), zero outside H x W
// (and everywhere when !live).
template <typename T, int SIZE, bool NHWC>
__device__ __forceinline__ void load_patch(const T* __restrict__ x, acc_t<T> (&d)[SIZE][SIZE], bool live,
                                           int n, int c, int C, int H, int W, int h0, int w0) {
    typedef acc_t<T> A;
#pragma unroll
    for (int r = 0; r < SIZE; ++r) {
#pragma unroll
        for (int s = 0; s < SIZE; ++s) {
            const int h = h0 + r, w = w0 + s;
            A value = A(0);
            if (live && (unsigned)h < (unsigned)H && (unsigned)w < (unsigned)W)
                value = load(x[NHWC ? ((n * H + h) * W + w) * C + c : ((n * C + c) * H + h) * W + w]);
            d[r][s] = value;
        }
    }
}

// Element i of every a-plane: dst[a * plane + i] = y[a].
template <int SIZE, typename A>
__device__ __forceinline__ void store_planes(A* __restrict__ dst, const A (&y)[SIZE][SIZE], int plane) {
#pragma unroll
    for (int r = 0; r < SIZE; ++r) {
#pragma unroll
        for (int s = 0; s < SIZE; ++s) dst[(r * SIZE + s) * plane] = y[r][s];
    }
}

// w (K, C, R, R) -> U[a][kout][cin] = (G g G^T)[a] for pair i = kout * Cin + cin
// of the Winograd convolution with Kout output and Cin input channels.
// rotate = 0: g = w[kout][cin] (forward).  rotate = 1: g = w[cin][kout] rotated
// by 180 degrees (backward data: w's K is the convolution's Cin, w's C its Kout).
template <typename T, int M, int R>
__device__ __forceinline__ void filter_transform_pair(const T* __restrict__ w, acc_t<T>* __restrict__ u,
                                                      int Kout, int Cin, int rotate, int i) {
    typedef acc_t<T> A;
    typedef winograd_matrices<M, R> F;
    constexpr int ALPHA = F::ALPHA;
    const int cin = i % Cin, kout = i / Cin;
    A g[R][R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int s = 0; s < R; ++s) {
            g[r][s] = rotate ? load(w[((cin * Kout + kout) * R + R - 1 - r) * R + R - 1 - s])
                             : load(w[((kout * Cin + cin) * R + r) * R + s]);
        }
    }
    A ggg[ALPHA][ALPHA];
    transform_2d<winograd_g<F>, ALPHA, R>(g, ggg);
    store_planes(u + i, ggg, Kout * Cin);
}

// x (N, C, H, W) or (N, H, W, C) -> V.  Tiles start at (th * M - pad_h,
// tw * M - pad_w); a negative pad (backward data with padding > 2) crops.
// Blocks past `input_blocks` run the filter transform w -> U (Kout x C pairs;
// the launch gives them ceil(Kout * C / 256) blocks, or none).
template <typename T, int M, int R, bool NHWC>
__global__ void __launch_bounds__(256)
winograd_input_transform(const T* __restrict__ x, acc_t<T>* __restrict__ workspace, long long v_offset,
                         int C, int H, int W, int pad_h, int pad_w,
                         int tiles_h, int tiles_w, int tiles, int n0, int input_blocks,
                         const T* __restrict__ w, int Kout, int rotate) {
    typedef acc_t<T> A;
    typedef winograd_matrices<M, R> F;
    constexpr int ALPHA = F::ALPHA;
    if ((int)blockIdx.x >= input_blocks) {
        const int i = ((int)blockIdx.x - input_blocks) * blockDim.x + threadIdx.x;
        if (i < Kout * C) filter_transform_pair<T, M, R>(w, workspace, Kout, C, rotate, i);   // U: offset 0
        return;
    }
    A* __restrict__ v = workspace + v_offset;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= C * tiles) return;
    const int c = NHWC ? i % C : i / tiles;
    const int t = NHWC ? i / C : i % tiles;
    const int tw = t % tiles_w;
    const int th = (t / tiles_w) % tiles_h;
    const int n = n0 + t / (tiles_w * tiles_h);

    A d[ALPHA][ALPHA];
    load_patch<T, ALPHA, NHWC>(x, d, true, n, c, C, H, W, th * M - pad_h, tw * M - pad_w);
    A bdb[ALPHA][ALPHA];
    transform_2d<winograd_bt<F>, ALPHA, ALPHA>(d, bdb);
    store_planes(v + (NHWC ? t * C + c : c * tiles + t), bdb, C * tiles);
}

// One output row of M values at dst (NCHW: contiguous along q): VEC = M floats
// in one 8- or 16-byte store when the row lies inside Q and dst is aligned
// (float storage, M = 2 or 4), else one store per value inside Q.
template <typename T> struct winograd_is_float { static constexpr bool value = false; };
template <> struct winograd_is_float<float> { static constexpr bool value = true; };

// One output row of M values at dst (NCHW: contiguous along q), the first
// `count` of them inside Q: float storage with M = 2 or 4 writes a full row as
// one 8- or 16-byte store when `vec` (Python checks Q % M == 0 and y's
// alignment), anything else one store per value.
template <typename T, int M>
__device__ __forceinline__ void store_row(T* __restrict__ dst, const acc_t<T> (&vals)[M], int count, bool vec) {
    if constexpr (winograd_is_float<T>::value && M == 4) {
        if (vec && count >= M) {
            *reinterpret_cast<float4*>(dst) = make_float4(vals[0], vals[1], vals[2], vals[3]);
            return;
        }
    } else if constexpr (winograd_is_float<T>::value && M == 2) {
        if (vec && count >= M) {
            *reinterpret_cast<float2*>(dst) = make_float2(vals[0], vals[1]);
            return;
        }
    }
#pragma unroll
    for (int s = 0; s < M; ++s) {
        if (s < count) dst[s] = store<T>(vals[s]);
    }
}

// Mw -> y (N, K, P, Q) or (N, P, Q, K): Y = A^T Mw A (+ bias), the part of the
// M x M tile inside P x Q.  NCHW float rows go out as one vector store each
// when `vec_rows` (Q a multiple of M, y 16-byte aligned: Python checks).
template <typename T, int M, int R, bool NHWC>
__global__ void __launch_bounds__(256)
winograd_output_transform(const acc_t<T>* __restrict__ workspace, long long m_offset,
                          const T* __restrict__ bias, int has_bias,
                          T* __restrict__ y, int K, int P, int Q,
                          int tiles_h, int tiles_w, int tiles, int n0, int vec_rows) {
    typedef acc_t<T> A;
    typedef winograd_matrices<M, R> F;
    constexpr int ALPHA = F::ALPHA;
    const A* __restrict__ mw = workspace + m_offset;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= K * tiles) return;
    const int k = NHWC ? i % K : i / tiles;
    const int t = NHWC ? i / K : i % tiles;
    const int tw = t % tiles_w;
    const int th = (t / tiles_w) % tiles_h;
    const int n = n0 + t / (tiles_w * tiles_h);

    const int plane = K * tiles;
    const A* in = mw + (NHWC ? t * K + k : k * tiles + t);
    A mt[ALPHA][ALPHA];
#pragma unroll
    for (int r = 0; r < ALPHA; ++r) {
#pragma unroll
        for (int s = 0; s < ALPHA; ++s) mt[r][s] = in[(r * ALPHA + s) * plane];
    }
    A out[M][M];
    transform_2d<winograd_at<F>, M, ALPHA>(mt, out);
    const A b = has_bias ? load(bias[k]) : A(0);
    const int p0 = th * M, q0 = tw * M;
#pragma unroll
    for (int r = 0; r < M; ++r) {
        const int p = p0 + r;
        if (p >= P) break;
#pragma unroll
        for (int s = 0; s < M; ++s) out[r][s] += b;
        if (NHWC) {
#pragma unroll
            for (int s = 0; s < M; ++s) {
                if (q0 + s < Q) y[((n * P + p) * Q + q0 + s) * K + k] = store<T>(out[r][s]);
            }
        } else {
            store_row<T, M>(y + ((n * K + k) * P + p) * Q + q0, out[r], Q - q0, vec_rows != 0);
        }
    }
}

// ---- Backward filter: Winograd F(R x R, M x M) ----------------------------------
// dw[k][c] (RxR) = sum over tiles t of the correlation of the x tile (ALPHA x ALPHA)
// with the dy tile (M x M): per tile F(RxR, MxM), and since the inverse transform
// is linear the sum over t moves inside it,
//     dw[k][c] = A^T ( sum_t (G dy[k,t] G^T) .* (B^T x[c,t] B) ) A,
// i.e. ALPHA^2 GEMMs Mw[a] = Dt[a] Xt[a]^T of depth "tiles" (cuBLAS, from Python).
// The depth is split into `splits` contiguous runs of `split_tiles` tile slots
// (GEMM batch b = a * splits + s: more blocks for small K x C, shorter float sums);
// slots past the chunk's last tile are written as zeros in both operands.
// Workspace layouts (acc_t<T>), slot = s * split_tiles + tl, tile of the slot
// t = ((n - n0) * tiles_h + th) * tiles_w + tw:
//   Xt[a][s][c][tl] (NCHW) / Xt[a][s][tl][c] (NHWC)  input transform
//   Dt[a][s][k][tl] (NCHW) / Dt[a][s][tl][k] (NHWC)  output-gradient transform
//   Mw[a][s][k][c]                                    GEMM results (over batch chunks: beta = 1)
// The transform kernels take the workspace and the element offset of their part
// (Xt, Dt), the output kernel the workspace itself (Mw starts it).
// Either way the thread with flat index i writes element i of every a-plane:
// one thread per (channel, slot), tl fastest for NCHW, the channel fastest for
// NHWC, so the stores are coalesced and the loads run along W or C.

// x -> Xt: B^T d B of the ALPHA x ALPHA tile at (th * M - pad_h, tw * M - pad_w).
template <typename T, int M, int R, bool NHWC>
__global__ void __launch_bounds__(256)
winograd_wgrad_input_transform(const T* __restrict__ x, acc_t<T>* __restrict__ workspace, long long offset,
                               int C, int H, int W, int pad_h, int pad_w, int tiles_h, int tiles_w,
                               int tiles, int n0, int splits, int split_tiles) {
    typedef acc_t<T> A;
    A* __restrict__ v = workspace + offset;
    typedef winograd_wgrad_matrices<M, R> F;
    constexpr int ALPHA = F::ALPHA;
    const int plane = C * splits * split_tiles;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= plane) return;
    int c, t;
    if (NHWC) {
        c = i % C;
        t = i / C;
    } else {
        const int tl = i % split_tiles, rest = i / split_tiles;
        c = rest % C;
        t = (rest / C) * split_tiles + tl;
    }
    const bool live = t < tiles;
    const int tw = t % tiles_w;
    const int th = (t / tiles_w) % tiles_h;
    const int n = n0 + t / (tiles_w * tiles_h);
    A d[ALPHA][ALPHA];
    load_patch<T, ALPHA, NHWC>(x, d, live, n, c, C, H, W, th * M - pad_h, tw * M - pad_w);
    A bdb[ALPHA][ALPHA];
    transform_2d<winograd_bt<F>, ALPHA, ALPHA>(d, bdb);
    store_planes(v + i, bdb, plane);
}

// dy -> Dt: G e G^T of the M x M tile e at (th * M, tw * M), zero outside P x Q.
template <typename T, int M, int R, bool NHWC>
__global__ void __launch_bounds__(256)
winograd_wgrad_grad_transform(const T* __restrict__ dy, acc_t<T>* __restrict__ workspace, long long offset,
                              int K, int P, int Q, int tiles_h, int tiles_w,
                              int tiles, int n0, int splits, int split_tiles) {
    typedef acc_t<T> A;
    A* __restrict__ v = workspace + offset;
    typedef winograd_wgrad_matrices<M, R> F;
    constexpr int ALPHA = F::ALPHA;
    const int plane = K * splits * split_tiles;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= plane) return;
    int k, t;
    if (NHWC) {
        k = i % K;
        t = i / K;
    } else {
        const int tl = i % split_tiles, rest = i / split_tiles;
        k = rest % K;
        t = (rest / K) * split_tiles + tl;
    }
    const bool live = t < tiles;
    const int tw = t % tiles_w;
    const int th = (t / tiles_w) % tiles_h;
    const int n = n0 + t / (tiles_w * tiles_h);
    A e[M][M];
    load_patch<T, M, NHWC>(dy, e, live, n, k, K, P, Q, th * M, tw * M);
    A geg[ALPHA][ALPHA];
    transform_2d<winograd_g<F>, ALPHA, M>(e, geg);
    store_planes(v + i, geg, plane);
}

// Mw -> dw (K, C, R, R): the splits summed in order (the same bits every run),
// then A^T Mw A.  Block: 32 consecutive (k, c) pairs i = i0 + lane (i = k * C + c).
// Phase 1: warp w sums the splits of the points a = w, w + 8, .. (the 32 lanes
// read 32 consecutive floats of a plane: coalesced) into shared memory; 8 warps
// a pair and K * C / 32 blocks keep the loads in flight (one thread a pair, the
// first version, left 48 blocks on alex_conv2_5x5, each thread ALPHA^2 * splits
// dependent loads deep).  Phase 2: warp r (< R) takes output row r of its lane's
// pair, (A^T Mw)[r, :] then the R taps, into shared memory.  Phase 3: the block's
// 32 R x R filters are one contiguous run of dw, written coalesced.
template <typename T, int M, int R>
__global__ void __launch_bounds__(256)
winograd_wgrad_output_transform(const acc_t<T>* __restrict__ mw, T* __restrict__ dw,
                                int K, int C, int splits) {
    typedef acc_t<T> A;
    typedef winograd_wgrad_matrices<M, R> F;
    constexpr int ALPHA = F::ALPHA;
    __shared__ A mts[ALPHA * ALPHA][32];
    __shared__ A outs[32 * R * R];
    const int plane = K * C;
    const int i0 = blockIdx.x * 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int i = i0 + lane;
    if (i < plane) {
        for (int a = warp; a < ALPHA * ALPHA; a += 8) {
            const A* in = mw + a * splits * plane + i;
            A sum = A(0);
            for (int j = 0; j < splits; ++j) sum += in[j * plane];
            mts[a][lane] = sum;
        }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if ((r & 7) == warp && i < plane) {
            A am[ALPHA];   // row r of A^T Mw
#pragma unroll
            for (int s = 0; s < ALPHA; ++s) {
                A sum = A(0);
#pragma unroll
                for (int j = 0; j < ALPHA; ++j) {
                    if (F::at(r, j) != 0.0) sum += A(F::at(r, j)) * mts[j * ALPHA + s][lane];
                }
                am[s] = sum;
            }
#pragma unroll
            for (int s = 0; s < R; ++s) {
                A sum = A(0);
#pragma unroll
                for (int j = 0; j < ALPHA; ++j) {
                    if (F::at(s, j) != 0.0) sum += am[j] * A(F::at(s, j));
                }
                outs[lane * (R * R) + r * R + s] = sum;
            }
        }
    }
    __syncthreads();
    const int pairs = plane - i0 < 32 ? plane - i0 : 32;
    for (int j = threadIdx.x; j < pairs * (R * R); j += 256) dw[i0 * (R * R) + j] = store<T>(outs[j]);
}
