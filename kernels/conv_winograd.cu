// Winograd F(M x M, R x R) convolution, stride 1 (R = 3 or 5): the input and output transforms
// and the filter transform around the alpha^2 batched GEMMs (cuBLAS, from
// Python: dnnprims/algos/winograd.py, which also derives the matrices and
// generates conv_winograd_matrices.cuh from the Toom-Cook points).
//
// Workspace layouts (acc_t<T>: float, or double for double storage), per batch
// chunk of `tiles` output tiles t = ((n - n0) * tiles_h + th) * tiles_w + tw:
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
//
// The transform loops are fully unrolled over compile-time matrices, so the
// zero entries cost nothing and the +-1 entries are plain adds.  Indices are
// int: Python refuses tensors and workspaces of 2^31 elements or more.
#include "common.cuh"
#include "conv_winograd_matrices.cuh"

// x (N, C, H, W) or (N, H, W, C) -> V.  Tiles start at (th * M - pad_h,
// tw * M - pad_w); a negative pad (backward data with padding > 2) crops.
template <typename T, int M, int R, bool NHWC>
__global__ void __launch_bounds__(256)
winograd_input_transform(const T* __restrict__ x, acc_t<T>* __restrict__ v,
                         int C, int H, int W, int pad_h, int pad_w,
                         int tiles_h, int tiles_w, int tiles, int n0) {
    typedef acc_t<T> A;
    typedef winograd_matrices<M, R> F;
    constexpr int ALPHA = F::ALPHA;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= C * tiles) return;
    const int c = NHWC ? i % C : i / tiles;
    const int t = NHWC ? i / C : i % tiles;
    const int tw = t % tiles_w;
    const int th = (t / tiles_w) % tiles_h;
    const int n = n0 + t / (tiles_w * tiles_h);
    const int h0 = th * M - pad_h, w0 = tw * M - pad_w;

    A d[ALPHA][ALPHA];
#pragma unroll
    for (int r = 0; r < ALPHA; ++r) {
#pragma unroll
        for (int s = 0; s < ALPHA; ++s) {
            const int h = h0 + r, w = w0 + s;
            A value = A(0);
            if ((unsigned)h < (unsigned)H && (unsigned)w < (unsigned)W)
                value = load(x[NHWC ? ((n * H + h) * W + w) * C + c : ((n * C + c) * H + h) * W + w]);
            d[r][s] = value;
        }
    }
    A bd[ALPHA][ALPHA];   // B^T d
#pragma unroll
    for (int r = 0; r < ALPHA; ++r) {
#pragma unroll
        for (int s = 0; s < ALPHA; ++s) {
            A sum = A(0);
#pragma unroll
            for (int k = 0; k < ALPHA; ++k) {
                if (F::bt(r, k) != 0.0) sum += A(F::bt(r, k)) * d[k][s];
            }
            bd[r][s] = sum;
        }
    }
    const int plane = C * tiles;
    A* out = v + (NHWC ? t * C + c : c * tiles + t);
#pragma unroll
    for (int r = 0; r < ALPHA; ++r) {
#pragma unroll
        for (int s = 0; s < ALPHA; ++s) {
            A sum = A(0);
#pragma unroll
            for (int k = 0; k < ALPHA; ++k) {
                if (F::bt(s, k) != 0.0) sum += bd[r][k] * A(F::bt(s, k));
            }
            out[(r * ALPHA + s) * plane] = sum;
        }
    }
}

// w (K, C, R, R) -> U[a][kout][cin] = (G g G^T)[a] for the Winograd convolution
// with Kout output and Cin input channels.  rotate = 0: g = w[kout][cin]
// (forward).  rotate = 1: g = w[cin][kout] rotated by 180 degrees (backward
// data: w's K is the convolution's Cin, w's C its Kout).
template <typename T, int M, int R>
__global__ void __launch_bounds__(256)
winograd_filter_transform(const T* __restrict__ w, acc_t<T>* __restrict__ u,
                          int Kout, int Cin, int rotate) {
    typedef acc_t<T> A;
    typedef winograd_matrices<M, R> F;
    constexpr int ALPHA = F::ALPHA;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= Kout * Cin) return;
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
    A gg[ALPHA][R];   // G g
#pragma unroll
    for (int r = 0; r < ALPHA; ++r) {
#pragma unroll
        for (int s = 0; s < R; ++s) {
            A sum = A(0);
#pragma unroll
            for (int k = 0; k < R; ++k) {
                if (F::g(r, k) != 0.0) sum += A(F::g(r, k)) * g[k][s];
            }
            gg[r][s] = sum;
        }
    }
    const int plane = Kout * Cin;
#pragma unroll
    for (int r = 0; r < ALPHA; ++r) {
#pragma unroll
        for (int s = 0; s < ALPHA; ++s) {
            A sum = A(0);
#pragma unroll
            for (int k = 0; k < R; ++k) {
                if (F::g(s, k) != 0.0) sum += gg[r][k] * A(F::g(s, k));
            }
            u[(r * ALPHA + s) * plane + i] = sum;
        }
    }
}

// Mw -> y (N, K, P, Q) or (N, P, Q, K): Y = A^T Mw A (+ bias), the part of the
// M x M tile inside P x Q.
template <typename T, int M, int R, bool NHWC>
__global__ void __launch_bounds__(256)
winograd_output_transform(const acc_t<T>* __restrict__ mw, const T* __restrict__ bias, int has_bias,
                          T* __restrict__ y, int K, int P, int Q,
                          int tiles_h, int tiles_w, int tiles, int n0) {
    typedef acc_t<T> A;
    typedef winograd_matrices<M, R> F;
    constexpr int ALPHA = F::ALPHA;
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
    A am[M][ALPHA];   // A^T Mw
#pragma unroll
    for (int r = 0; r < M; ++r) {
#pragma unroll
        for (int s = 0; s < ALPHA; ++s) {
            A sum = A(0);
#pragma unroll
            for (int j = 0; j < ALPHA; ++j) {
                if (F::at(r, j) != 0.0) sum += A(F::at(r, j)) * mt[j][s];
            }
            am[r][s] = sum;
        }
    }
    const A b = has_bias ? load(bias[k]) : A(0);
    const int p0 = th * M, q0 = tw * M;
#pragma unroll
    for (int r = 0; r < M; ++r) {
#pragma unroll
        for (int s = 0; s < M; ++s) {
            A sum = A(0);
#pragma unroll
            for (int j = 0; j < ALPHA; ++j) {
                if (F::at(s, j) != 0.0) sum += am[r][j] * A(F::at(s, j));
            }
            const int p = p0 + r, q = q0 + s;
            if (p < P && q < Q)
                y[NHWC ? ((n * P + p) * Q + q) * K + k : ((n * K + k) * P + p) * Q + q] = store<T>(sum + b);
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
// Either way the thread with flat index i writes element i of every a-plane:
// one thread per (channel, slot), tl fastest for NCHW, the channel fastest for
// NHWC, so the stores are coalesced and the loads run along W or C.

// x -> Xt: B^T d B of the ALPHA x ALPHA tile at (th * M - pad_h, tw * M - pad_w).
template <typename T, int M, int R, bool NHWC>
__global__ void __launch_bounds__(256)
winograd_wgrad_input_transform(const T* __restrict__ x, acc_t<T>* __restrict__ v,
                               int C, int H, int W, int pad_h, int pad_w, int tiles_h, int tiles_w,
                               int tiles, int n0, int splits, int split_tiles) {
    typedef acc_t<T> A;
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
    const int h0 = th * M - pad_h, w0 = tw * M - pad_w;

    A d[ALPHA][ALPHA];
#pragma unroll
    for (int r = 0; r < ALPHA; ++r) {
#pragma unroll
        for (int s = 0; s < ALPHA; ++s) {
            const int h = h0 + r, w = w0 + s;
            A value = A(0);
            if (live && (unsigned)h < (unsigned)H && (unsigned)w < (unsigned)W)
                value = load(x[NHWC ? ((n * H + h) * W + w) * C + c : ((n * C + c) * H + h) * W + w]);
            d[r][s] = value;
        }
    }
    A bd[ALPHA][ALPHA];   // B^T d
#pragma unroll
    for (int r = 0; r < ALPHA; ++r) {
#pragma unroll
        for (int s = 0; s < ALPHA; ++s) {
            A sum = A(0);
#pragma unroll
            for (int k = 0; k < ALPHA; ++k) {
                if (F::bt(r, k) != 0.0) sum += A(F::bt(r, k)) * d[k][s];
            }
            bd[r][s] = sum;
        }
    }
#pragma unroll
    for (int r = 0; r < ALPHA; ++r) {
#pragma unroll
        for (int s = 0; s < ALPHA; ++s) {
            A sum = A(0);
#pragma unroll
            for (int k = 0; k < ALPHA; ++k) {
                if (F::bt(s, k) != 0.0) sum += bd[r][k] * A(F::bt(s, k));
            }
            v[(r * ALPHA + s) * plane + i] = sum;
        }
    }
}

// dy -> Dt: G e G^T of the M x M tile e at (th * M, tw * M), zero outside P x Q.
template <typename T, int M, int R, bool NHWC>
__global__ void __launch_bounds__(256)
winograd_wgrad_grad_transform(const T* __restrict__ dy, acc_t<T>* __restrict__ v,
                              int K, int P, int Q, int tiles_h, int tiles_w,
                              int tiles, int n0, int splits, int split_tiles) {
    typedef acc_t<T> A;
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
    const int p0 = th * M, q0 = tw * M;

    A e[M][M];
#pragma unroll
    for (int r = 0; r < M; ++r) {
#pragma unroll
        for (int s = 0; s < M; ++s) {
            const int p = p0 + r, q = q0 + s;
            A value = A(0);
            if (live && p < P && q < Q)
                value = load(dy[NHWC ? ((n * P + p) * Q + q) * K + k : ((n * K + k) * P + p) * Q + q]);
            e[r][s] = value;
        }
    }
    A ge[ALPHA][M];   // G e
#pragma unroll
    for (int r = 0; r < ALPHA; ++r) {
#pragma unroll
        for (int s = 0; s < M; ++s) {
            A sum = A(0);
#pragma unroll
            for (int j = 0; j < M; ++j) {
                if (F::g(r, j) != 0.0) sum += A(F::g(r, j)) * e[j][s];
            }
            ge[r][s] = sum;
        }
    }
#pragma unroll
    for (int r = 0; r < ALPHA; ++r) {
#pragma unroll
        for (int s = 0; s < ALPHA; ++s) {
            A sum = A(0);
#pragma unroll
            for (int j = 0; j < M; ++j) {
                if (F::g(s, j) != 0.0) sum += ge[r][j] * A(F::g(s, j));
            }
            v[(r * ALPHA + s) * plane + i] = sum;
        }
    }
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
