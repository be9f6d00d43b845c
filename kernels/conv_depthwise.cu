// Depthwise convolution (groups == C, K = C * multiplier): forward with a fused
// bias + activation epilogue, backward data, backward filter.  Filters are
// (K, 1, R, S); output channel k reads input channel c = k / multiplier.
//
// These layers do ~2 R*S flops per element moved, so they are memory-bound: the
// kernels aim to read each input once from DRAM and write each output once.
//
// NCHW, stride 1, dilation 1, 3x3 / 5x5 with padding KS / 2 (the MobileNet
// layers): the dw_same_* kernels at the end of this file (registers and warp
// shuffles, no shared memory), dw_small_nchw for 3x3 planes of <= 64 columns in
// forward / multiplier-1 backward data.  Every other NCHW problem:
// NCHW (one block per tile of one (image, channel) plane; flat block index =
// plane * tiles + tile, grid-stride over it):
//   The block is TQT x TP threads (TQT a power of two along the row, TP rows);
//   each thread computes DW_V outputs of one row, spaced TQT apart (so a warp's
//   shared-memory reads and global stores are consecutive), the tile being
//   TP x (TQT * DW_V) outputs.  The input tile with its halo is staged in
//   shared memory (coalesced row loads, zeros outside the image), the R x S
//   filter of the plane too (a broadcast read per tap).
//   forward          y tile from the x tile: acc += xs[ty*sh + r*dh][col*sw + s*dw] * w[r, s].
//   backward_data    the dx tile gathers from a dy tile whose first row is
//                    p_lo = floor((h0 + ph - (R-1) dh) / sh): tap r of dx row h
//                    reads dy row (h + ph - r dh) / sh when that is exact
//                    (STRIDED: tested per tap; stride 1 needs no test), so no
//                    work is spent on the zeros a strided transposed
//                    convolution would insert.  With a multiplier the block
//                    loops over the multiplier's dy planes.
//   backward_filter  two passes, no atomics (same bits every run).  Pass 1: a
//                    block per (k, chunk) walks its share of the (image, tile)
//                    items; per item it stages the x tile, holds DW_V dy values
//                    in registers, and adds sum_v dy * x per tap into its own
//                    shared-memory slot (slots[tap][thread]); at the end one
//                    warp per tap sums the slots in a fixed order into
//                    partials[k, tap, chunk].  Taps that do not fit shared
//                    memory at once are done in groups (group_taps).
//                    Pass 2 (dw_backward_filter_reduce): one thread per
//                    (k, tap) sums the chunks in order.
// NHWC (channels fastest in memory):
//   forward, backward_data  block = KB channel vectors (threadIdx.x) x PB
//                    positions (threadIdx.y), grid.y = channel chunks; block x
//                    walks a contiguous run of per_block positions, so the
//                    R x S window's rows are re-read from L1 / L2, not DRAM.  V = 4 channels per thread with
//                    16-byte (float), 8-byte (half) or 2x16-byte (double) loads
//                    when the multiplier is 1, C % 4 == 0 and the pointers are
//                    aligned; else V = 1.  The block's filter slice is staged
//                    in shared memory as ws[tap][channel], contiguous per tap.
//   backward_filter  pass 1: block = KB output channels x PB position slots,
//                    slots in shared memory as above; pass 2 shared with NCHW.
//
// Accumulation in acc_t<T> (float for half types, double for double).  Plane
// offsets are 64-bit; offsets inside one plane (H*W, P*Q < 2^31, checked in
// Python) are int.  NHWC flat position indices are index_t.
#include "activation_math.cuh"

#define DW_V 4

__device__ __forceinline__ int floor_div(int a, int b) {
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

template <typename T> __device__ __forceinline__ T from_bits(unsigned int b) {
    T t;
    t.bits = (unsigned short)(b & 0xffffu);
    return t;
}

// V consecutive elements of p into out (acc type), vectorised for V == 4.
template <typename T, int V> __device__ __forceinline__ void load_vec(const T* p, acc_t<T>* out) {
    if constexpr (V == 4 && sizeof(T) == 4) {
        const float4 f = *reinterpret_cast<const float4*>(p);
        out[0] = f.x; out[1] = f.y; out[2] = f.z; out[3] = f.w;
    } else if constexpr (V == 4 && sizeof(T) == 2) {
        const uint2 u = *reinterpret_cast<const uint2*>(p);
        out[0] = load(from_bits<T>(u.x)); out[1] = load(from_bits<T>(u.x >> 16));
        out[2] = load(from_bits<T>(u.y)); out[3] = load(from_bits<T>(u.y >> 16));
    } else if constexpr (V == 4 && sizeof(T) == 8) {
        const double2 a = reinterpret_cast<const double2*>(p)[0];
        const double2 b = reinterpret_cast<const double2*>(p)[1];
        out[0] = a.x; out[1] = a.y; out[2] = b.x; out[3] = b.y;
    } else {
#pragma unroll
        for (int i = 0; i < V; ++i) out[i] = load(p[i]);
    }
}

template <typename T, int V> __device__ __forceinline__ void store_vec(T* p, const acc_t<T>* v) {
    if constexpr (V == 4 && sizeof(T) == 4) {
        *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
    } else if constexpr (V == 4 && sizeof(T) == 2) {
        uint2 u;
        u.x = (unsigned int)store<T>(v[0]).bits | ((unsigned int)store<T>(v[1]).bits << 16);
        u.y = (unsigned int)store<T>(v[2]).bits | ((unsigned int)store<T>(v[3]).bits << 16);
        *reinterpret_cast<uint2*>(p) = u;
    } else if constexpr (V == 4 && sizeof(T) == 8) {
        reinterpret_cast<double2*>(p)[0] = make_double2(v[0], v[1]);
        reinterpret_cast<double2*>(p)[1] = make_double2(v[2], v[3]);
    } else {
#pragma unroll
        for (int i = 0; i < V; ++i) p[i] = store<T>(v[i]);
    }
}

// Stage rows [row0, row0 + rows) x cols [col0, col0 + cols) of one plane
// (height Hs, width Ws) into dst (row pitch `pitch`), zeros outside the plane.
template <typename T>
__device__ __forceinline__ void stage_tile(acc_t<T>* dst, const T* __restrict__ plane, int Hs, int Ws,
                                           int row0, int col0, int rows, int cols, int pitch) {
    for (int row = threadIdx.y; row < rows; row += blockDim.y) {
        const int h = row0 + row;
        const bool row_in = (unsigned)h < (unsigned)Hs;
        const T* src = plane + (long long)(row_in ? h : 0) * Ws;
        for (int col = threadIdx.x; col < cols; col += blockDim.x) {
            const int wi = col0 + col;
            dst[row * pitch + col] = (row_in && (unsigned)wi < (unsigned)Ws) ? load(src[wi]) : acc_t<T>(0);
        }
    }
}

// Shared memory: filter taps first (rounded up to 4 values), then the tile.
__device__ __forceinline__ int dw_round4(int n) { return (n + 3) & ~3; }

// ----------------------------------------------------------------------------- NCHW

template <typename T>
__global__ void __launch_bounds__(256)
dw_forward_nchw(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                int has_bias, int act_mode, acc_t<T> act_alpha, T* __restrict__ y,
                int C, int H, int W, int K, int R, int S, int P, int Q,
                int sh, int sw, int ph, int pw, int dh, int dw, int mult,
                long long planes, int tiles_q, int tiles, int in_rows, int in_cols, int pitch) {
    typedef acc_t<T> A;
    extern __shared__ __align__(16) unsigned char dw_smem[];
    A* ws = reinterpret_cast<A*>(dw_smem);
    A* xs = ws + dw_round4(R * S);
    const int tx = threadIdx.x, ty = threadIdx.y, TQT = blockDim.x, TP = blockDim.y;
    const int tid = ty * TQT + tx, nthreads = TQT * TP;
    long long loaded_plane = -1;
    A b = A(0);
    for (long long blk = blockIdx.x; blk < planes * tiles; blk += gridDim.x) {
        const long long plane = blk / tiles;          // n * K + k
        const int tile = (int)(blk - plane * tiles);
        const int k = (int)(plane % K);
        const long long n = plane / K;
        __syncthreads();  // the previous tile's reads of ws / xs are done
        if (plane != loaded_plane) {
            for (int i = tid; i < R * S; i += nthreads) ws[i] = load(w[(long long)k * R * S + i]);
            b = has_bias ? load(bias[k]) : A(0);
            loaded_plane = plane;
        }
        const int tp = tile / tiles_q, tq = tile - tp * tiles_q;
        const int p0 = tp * TP, q0 = tq * TQT * DW_V;
        stage_tile<T>(xs, x + (n * C + k / mult) * (long long)H * W, H, W,
                      p0 * sh - ph, q0 * sw - pw, in_rows, in_cols, pitch);
        __syncthreads();
        A acc[DW_V];
#pragma unroll
        for (int v = 0; v < DW_V; ++v) acc[v] = b;
        const A* xrow = xs + ty * sh * pitch + tx * sw;
        for (int r = 0; r < R; ++r) {
            for (int s = 0; s < S; ++s) {
                const A wv = ws[r * S + s];
                const A* xt = xrow + r * dh * pitch + s * dw;
#pragma unroll
                for (int v = 0; v < DW_V; ++v) acc[v] += xt[v * TQT * sw] * wv;
            }
        }
        activate_tile<DW_V>(act_mode, acc, act_alpha);
        const int p = p0 + ty;
        if (p < P) {
            T* yrow = y + plane * (long long)P * Q + (long long)p * Q;
#pragma unroll
            for (int v = 0; v < DW_V; ++v) {
                const int q = q0 + tx + v * TQT;
                if (q < Q) yrow[q] = store<T>(acc[v]);
            }
        }
    }
}

template <typename T, bool STRIDED>
__global__ void __launch_bounds__(256)
dw_backward_data_nchw(const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx,
                      int C, int H, int W, int K, int R, int S, int P, int Q,
                      int sh, int sw, int ph, int pw, int dh, int dw, int mult,
                      long long planes, int tiles_w, int tiles, int in_rows, int in_cols, int pitch) {
    typedef acc_t<T> A;
    extern __shared__ __align__(16) unsigned char dw_smem[];
    A* ws = reinterpret_cast<A*>(dw_smem);
    A* ds = ws + dw_round4(mult * R * S);
    const int tx = threadIdx.x, ty = threadIdx.y, TQT = blockDim.x, TP = blockDim.y;
    const int tid = ty * TQT + tx, nthreads = TQT * TP;
    long long loaded_plane = -1;
    for (long long blk = blockIdx.x; blk < planes * tiles; blk += gridDim.x) {
        const long long plane = blk / tiles;          // n * C + c
        const int tile = (int)(blk - plane * tiles);
        const int c = (int)(plane % C);
        const long long n = plane / C;
        const int th = tile / tiles_w, tw = tile - th * tiles_w;
        const int h0 = th * TP, w0 = tw * TQT * DW_V;
        // First dy row / column the tile can reach: p_lo * sh <= h0 + ph - (R-1) dh,
        // so every offset below is >= 0.
        const int p_lo = floor_div(h0 + ph - (R - 1) * dh, sh);
        const int q_lo = floor_div(w0 + pw - (S - 1) * dw, sw);
        const int h = h0 + ty;
        A acc[DW_V];
#pragma unroll
        for (int v = 0; v < DW_V; ++v) acc[v] = A(0);
        for (int j = 0; j < mult; ++j) {
            const int k = c * mult + j;
            __syncthreads();  // the previous reads of ws / ds are done
            if (plane != loaded_plane && j == 0) {
                for (int i = tid; i < mult * R * S; i += nthreads)
                    ws[i] = load(w[(long long)c * mult * R * S + i]);
                loaded_plane = plane;
            }
            stage_tile<T>(ds, dy + (n * K + k) * (long long)P * Q, P, Q, p_lo, q_lo, in_rows, in_cols, pitch);
            __syncthreads();
            const A* wj = ws + j * R * S;
            for (int r = 0; r < R; ++r) {
                int t = h + ph - r * dh - p_lo * sh;
                if (STRIDED) {
                    if (t % sh != 0) continue;
                    t /= sh;
                }
                const A* drow = ds + t * pitch;
                for (int s = 0; s < S; ++s) {
                    const A wv = wj[r * S + s];
                    const int u0 = w0 + tx + pw - s * dw - q_lo * sw;
#pragma unroll
                    for (int v = 0; v < DW_V; ++v) {
                        int u = u0 + v * TQT;
                        if (STRIDED) {
                            if (u % sw != 0) continue;
                            u /= sw;
                        }
                        acc[v] += drow[u] * wv;
                    }
                }
            }
        }
        if (h < H) {
            T* row = dx + plane * (long long)H * W + (long long)h * W;
#pragma unroll
            for (int v = 0; v < DW_V; ++v) {
                const int wi = w0 + tx + v * TQT;
                if (wi < W) row[wi] = store<T>(acc[v]);
            }
        }
    }
}

// Pass 1 of the NCHW filter gradient; grid (K, chunks).  partials[(k*R*S + tap) * chunks + chunk].
template <typename T>
__global__ void __launch_bounds__(256)
dw_backward_filter_nchw(const T* __restrict__ x, const T* __restrict__ dy, acc_t<T>* __restrict__ partials,
                        int N, int C, int H, int W, int K, int R, int S, int P, int Q,
                        int sh, int sw, int ph, int pw, int dh, int dw, int mult,
                        int tiles_q, int tiles, int in_rows, int in_cols, int pitch, int group_taps) {
    typedef acc_t<T> A;
    extern __shared__ __align__(16) unsigned char dw_smem[];
    const int tx = threadIdx.x, ty = threadIdx.y, TQT = blockDim.x, TP = blockDim.y;
    const int tid = ty * TQT + tx, nthreads = TQT * TP;
    A* slots = reinterpret_cast<A*>(dw_smem);                 // [group_taps][nthreads]
    A* xs = slots + group_taps * nthreads;
    const int k = blockIdx.x, c = k / mult, RS = R * S;
    const int chunk = blockIdx.y, chunks = gridDim.y;
    const long long items = (long long)N * tiles;
    for (int t0 = 0; t0 < RS; t0 += group_taps) {
        const int G = min(group_taps, RS - t0);
        for (int i = 0; i < G; ++i) slots[i * nthreads + tid] = A(0);
        for (long long item = chunk; item < items; item += chunks) {
            const long long n = item / tiles;
            const int tile = (int)(item - n * tiles);
            const int tp = tile / tiles_q, tq = tile - tp * tiles_q;
            const int p0 = tp * TP, q0 = tq * TQT * DW_V;
            __syncthreads();  // the previous item's reads of xs are done
            stage_tile<T>(xs, x + (n * C + c) * (long long)H * W, H, W,
                          p0 * sh - ph, q0 * sw - pw, in_rows, in_cols, pitch);
            __syncthreads();
            const int p = p0 + ty;
            const T* dyrow = dy + (n * K + k) * (long long)P * Q + (long long)p * Q;
            A d[DW_V];
#pragma unroll
            for (int v = 0; v < DW_V; ++v) {
                const int q = q0 + tx + v * TQT;
                d[v] = (p < P && q < Q) ? load(dyrow[q]) : A(0);
            }
            const A* xrow = xs + ty * sh * pitch + tx * sw;
            for (int i = 0; i < G; ++i) {
                const int tap = t0 + i, r = tap / S, s = tap - r * S;
                const A* xt = xrow + r * dh * pitch + s * dw;
                A sum = A(0);
#pragma unroll
                for (int v = 0; v < DW_V; ++v) sum += d[v] * xt[v * TQT * sw];
                slots[i * nthreads + tid] += sum;
            }
        }
        __syncthreads();
        const int warp = tid >> 5, lane = tid & 31, warps = nthreads >> 5;  // nthreads % 32 == 0
        for (int i = warp; i < G; i += warps) {
            A v = A(0);
            for (int j = lane; j < nthreads; j += 32) v += slots[i * nthreads + j];
            v = warp_sum(v);
            if (lane == 0) partials[((long long)k * RS + t0 + i) * chunks + chunk] = v;
        }
        __syncthreads();  // slots are reused by the next tap group
    }
}

// Pass 2, both layouts: dw[f] = sum over chunks of partials[f * chunks + chunk], in order.
template <typename T>
__global__ void dw_backward_filter_reduce(const acc_t<T>* __restrict__ partials, T* __restrict__ dw,
                                          long long filter_total, int chunks) {
    typedef acc_t<T> A;
    for (long long f = (long long)blockIdx.x * blockDim.x + threadIdx.x; f < filter_total;
         f += (long long)gridDim.x * blockDim.x) {
        const A* src = partials + f * chunks;
        A v = A(0);
        for (int j = 0; j < chunks; ++j) v += src[j];
        dw[f] = store<T>(v);
    }
}

// ----------------------------------------------------------------------------- NHWC

// Forward: thread (tx, ty) = (channel vector, position slot); block's channels
// [k0, k0 + KB*V) with k0 = blockIdx.y * KB * V; ws[tap][channel - k0].
template <typename T, typename index_t, int V>
__global__ void __launch_bounds__(256)
dw_forward_nhwc(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                int has_bias, int act_mode, acc_t<T> act_alpha, T* __restrict__ y,
                int C, int H, int W, int K, int R, int S, int P, int Q,
                int sh, int sw, int ph, int pw, int dh, int dw, int mult, index_t positions,
                index_t per_block) {
    typedef acc_t<T> A;
    extern __shared__ __align__(16) unsigned char dw_smem[];
    A* ws = reinterpret_cast<A*>(dw_smem);
    const int KB = blockDim.x, CB = KB * V, RS = R * S;
    const int tid = threadIdx.y * KB + threadIdx.x, nthreads = KB * blockDim.y;
    const int k0 = blockIdx.y * CB;
    for (int i = tid; i < RS * CB; i += nthreads) {
        const int tap = i / CB, kl = i - tap * CB;
        ws[i] = k0 + kl < K ? load(w[(long long)(k0 + kl) * RS + tap]) : A(0);
    }
    __syncthreads();
    const int kl = threadIdx.x * V, k = k0 + kl;
    if (k >= K) return;  // K % V == 0: a vector is whole or absent
    A b[V];
#pragma unroll
    for (int v = 0; v < V; ++v) b[v] = has_bias ? load(bias[k + v]) : A(0);
    const index_t first = (index_t)blockIdx.x * per_block;
    const index_t end = positions - first > per_block ? first + per_block : positions;  // no overflow
    for (index_t pos = first + threadIdx.y; pos < end; pos += blockDim.y) {
        const int q = (int)(pos % Q);
        const index_t np = pos / Q;
        const int p = (int)(np % P);
        const index_t n = np / P;
        A acc[V];
#pragma unroll
        for (int v = 0; v < V; ++v) acc[v] = b[v];
        for (int r = 0; r < R; ++r) {
            const int h = p * sh - ph + r * dh;
            if ((unsigned)h >= (unsigned)H) continue;
            for (int s = 0; s < S; ++s) {
                const int wi = q * sw - pw + s * dw;
                if ((unsigned)wi >= (unsigned)W) continue;
                const T* xv = x + ((n * H + h) * W + wi) * C;
                A xin[V];
                if constexpr (V == 1) xin[0] = load(xv[k / mult]);
                else load_vec<T, V>(xv + k, xin);  // V > 1 only with multiplier 1
                const A* wt = ws + (r * S + s) * CB + kl;
#pragma unroll
                for (int v = 0; v < V; ++v) acc[v] += xin[v] * wt[v];
            }
        }
        activate_tile<V>(act_mode, acc, act_alpha);
        store_vec<T, V>(y + pos * K + k, acc);
    }
}

// Backward data: thread = (input channel vector, position of dx); the block's
// input channels [c0, c0 + KB*V) use output channels [c0*mult, (c0 + KB*V)*mult):
// ws[tap][k - c0*mult].
template <typename T, typename index_t, int V>
__global__ void __launch_bounds__(256)
dw_backward_data_nhwc(const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx,
                      int C, int H, int W, int K, int R, int S, int P, int Q,
                      int sh, int sw, int ph, int pw, int dh, int dw, int mult, index_t positions,
                index_t per_block) {
    typedef acc_t<T> A;
    extern __shared__ __align__(16) unsigned char dw_smem[];
    A* ws = reinterpret_cast<A*>(dw_smem);
    const int KB = blockDim.x, CB = KB * V, KBM = CB * mult, RS = R * S;
    const int tid = threadIdx.y * KB + threadIdx.x, nthreads = KB * blockDim.y;
    const int c0 = blockIdx.y * CB;
    for (int i = tid; i < RS * KBM; i += nthreads) {
        const int tap = i / KBM, kl = i - tap * KBM;
        const int k = c0 * mult + kl;
        ws[i] = k < K ? load(w[(long long)k * RS + tap]) : A(0);
    }
    __syncthreads();
    const int cl = threadIdx.x * V, c = c0 + cl;
    if (c >= C) return;
    const index_t first = (index_t)blockIdx.x * per_block;
    const index_t end = positions - first > per_block ? first + per_block : positions;  // no overflow
    for (index_t pos = first + threadIdx.y; pos < end; pos += blockDim.y) {
        const int wi = (int)(pos % W);
        const index_t nh = pos / W;
        const int h = (int)(nh % H);
        const index_t n = nh / H;
        A acc[V];
#pragma unroll
        for (int v = 0; v < V; ++v) acc[v] = A(0);
        for (int r = 0; r < R; ++r) {
            const int ph_ = h + ph - r * dh;         // = p * sh when tap r reaches row h
            if (ph_ < 0) break;                      // decreases with r
            if (ph_ % sh != 0) continue;
            const int p = ph_ / sh;
            if (p >= P) continue;
            for (int s = 0; s < S; ++s) {
                const int qw = wi + pw - s * dw;
                if (qw < 0) break;
                if (qw % sw != 0) continue;
                const int q = qw / sw;
                if (q >= Q) continue;
                const T* dyv = dy + ((n * P + p) * Q + q) * K;
                const A* wt = ws + (r * S + s) * KBM;
                if constexpr (V == 1) {
                    for (int j = 0; j < mult; ++j) acc[0] += load(dyv[c * mult + j]) * wt[cl * mult + j];
                } else {  // multiplier 1: k = c
                    A d[V];
                    load_vec<T, V>(dyv + c, d);
#pragma unroll
                    for (int v = 0; v < V; ++v) acc[v] += d[v] * wt[cl + v];
                }
            }
        }
        store_vec<T, V>(dx + pos * C + c, acc);
    }
}

// Pass 1 of the NHWC filter gradient: thread (tx, ty) = (output channel k0 + tx,
// position slot ty); grid (channel chunks, chunks).  Positions of dy are dealt
// to slots round-robin; slots[tap][ty][tx] accumulate, then are summed over ty
// in order.
template <typename T, typename index_t>
__global__ void __launch_bounds__(256)
dw_backward_filter_nhwc(const T* __restrict__ x, const T* __restrict__ dy, acc_t<T>* __restrict__ partials,
                        int C, int H, int W, int K, int R, int S, int P, int Q,
                        int sh, int sw, int ph, int pw, int dh, int dw, int mult,
                        index_t positions, int group_taps) {
    typedef acc_t<T> A;
    extern __shared__ __align__(16) unsigned char dw_smem[];
    A* slots = reinterpret_cast<A*>(dw_smem);                 // [group_taps][PB][KB]
    const int KB = blockDim.x, PB = blockDim.y, RS = R * S;
    const int tid = threadIdx.y * KB + threadIdx.x, nthreads = KB * PB;
    const int k = blockIdx.x * KB + threadIdx.x, c = k / mult;
    const int chunk = blockIdx.y, chunks = gridDim.y;
    for (int t0 = 0; t0 < RS; t0 += group_taps) {
        const int G = min(group_taps, RS - t0);
        for (int i = 0; i < G; ++i) slots[i * nthreads + tid] = A(0);
        if (k < K) {
            for (index_t pos = (index_t)chunk * PB + threadIdx.y; pos < positions;
                 pos += (index_t)chunks * PB) {
                const int q = (int)(pos % Q);
                const index_t np = pos / Q;
                const int p = (int)(np % P);
                const index_t n = np / P;
                const A d = load(dy[pos * K + k]);
                for (int i = 0; i < G; ++i) {
                    const int tap = t0 + i, r = tap / S, s = tap - r * S;
                    const int h = p * sh - ph + r * dh, wi = q * sw - pw + s * dw;
                    if ((unsigned)h < (unsigned)H && (unsigned)wi < (unsigned)W)
                        slots[i * nthreads + tid] += load(x[((n * H + h) * W + wi) * C + c]) * d;
                }
            }
        }
        __syncthreads();
        for (int i = tid; i < G * KB; i += nthreads) {
            const int tl = i / KB, kx = i - tl * KB, kk = blockIdx.x * KB + kx;
            A v = A(0);
            for (int y = 0; y < PB; ++y) v += slots[tl * nthreads + y * KB + kx];
            if (kk < K) partials[((long long)kk * RS + t0 + tl) * chunks + chunk] = v;
        }
        __syncthreads();
    }
}

// ----------------------------------------------------------------------------- NCHW, "same" KS x KS, stride 1
// The common depthwise layer (MobileNet / EfficientNet): stride 1, dilation 1,
// odd KS x KS filter, padding KS / 2, so every plane keeps its size and an
// output column group [4g, 4g + 4) reads input columns [4g - HC, 4g + 4 + HC)
// (HC = KS / 2).  No shared memory and no __syncthreads in the main loop:
//   - a warp holds spw = 32 / Gs slots of Gs lanes; lane lg of a slot owns the
//     column group g = seg * Gs + lg (Gs <= 32 groups per row segment; one
//     segment when the row has <= 128 columns) of a band of ROWS rows of one
//     plane; idle lanes (g >= G, lanes past spw * Gs, slots past the end) run
//     the same code with their loads masked, so every shuffle has all 32 lanes;
//   - each lane loads its own 4 columns of the band's ROWS + 2 HC input rows
//     at once (one 16-byte load per row for float when W % 4 == 0 and the
//     pointers are aligned: ROWS + 2 HC independent loads in flight), then
//     takes the HC halo columns on each side from its neighbour lanes with
//     warp shuffles; only lanes at a segment's edge load halo columns;
//   - the filter is in registers, the outputs of the band are computed from
//     the register window (the sliding window along W and down the rows).
// Halo rows of a band are re-read by the band above / below (L1 / L2 hits:
// consecutive slots are consecutive bands of one plane), so DRAM sees each
// input about once.
// dw_same_nchw serves forward (filter as is; `terms` = 1 input plane, channel
// k / mult) and backward data (filter rotated 180 degrees: `flip`, which with
// padding KS / 2 and stride 1 is exactly the transposed convolution; `terms`
// = mult dy planes c * mult + j summed).  Slot = (plane * segs + seg) * bands
// + band, plane = n * Cout + co.
// Launch (dnnprims/algos/depthwise.py, measured on the H100): float32 3x3 on
// large launches takes ROWS = 8 (10 row loads in flight per lane, ~180-210
// registers: one 256-thread block per SM) in a grid of one resident wave whose
// warps loop over bands, so they fall out of phase and one warp's loads overlap
// another's math and stores (0.66 of copy bandwidth on mbv2_dw_112, against
// 0.56 with one band per warp); small launches take ROWS = 2 with MINB = 3
// (80 registers, 24 warps per SM).
// dw_same_filter_nchw (backward filter pass 1): grid (K, chunks); a block's
// warps walk the (image, segment, band) slots of channel k in a fixed order,
// each lane adding sum over its band of dy * x per tap in registers; then a
// warp sum per tap (shuffle butterfly) and the warps summed in order into
// partials[k, tap, chunk] (pass 2: dw_backward_filter_reduce).  No atomics.

#define DW_FULL_MASK 0xffffffffu
#define DW_MAX_WARPS 8

// One lane's view of rows [row0, row0 + IN) of a plane (Hs x Ws): win[i][HC + j]
// = column 4g + j, win[i][j] / win[i][HC + 4 + j] = the halo columns
// 4g - HC + j / 4g + 4 + j; zeros outside the plane and for inactive lanes.
// Must be called by all 32 lanes of the warp.
template <typename T, int IN, int HC>
__device__ __forceinline__ void dw_load_window(const T* __restrict__ plane, int row0, int Hs, int Ws, int g,
                                               int lg, int Gs, int G, bool active, bool vec,
                                               acc_t<T> (&win)[IN][4 + 2 * HC]) {
    typedef acc_t<T> A;
    const int col = 4 * g;
    // Own columns first: all IN loads are independent and unconditional (the
    // address is clamped into the plane; the value is masked afterwards), so
    // they are all in flight together.
    const int col_c = min(col, 4 * (G - 1));
    if (vec) {  // Ws % 4 == 0: a whole group is inside the row
#pragma unroll
        for (int i = 0; i < IN; ++i) {
            const int h = row0 + i;
            const int hc = min(max(h, 0), Hs - 1);
            load_vec<T, 4>(plane + (long long)hc * Ws + col_c, win[i] + HC);
            if (!(active && (unsigned)h < (unsigned)Hs)) {
#pragma unroll
                for (int j = 0; j < 4; ++j) win[i][HC + j] = A(0);
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < IN; ++i) {
            const int h = row0 + i;
            const int hc = min(max(h, 0), Hs - 1);
            const bool row_in = active && (unsigned)h < (unsigned)Hs;
            const T* src = plane + (long long)hc * Ws;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const A v = load(src[min(col_c + j, Ws - 1)]);
                win[i][HC + j] = (row_in && col + j < Ws) ? v : A(0);
            }
        }
    }
    if constexpr (HC > 0) {
#pragma unroll
        for (int i = 0; i < IN; ++i) {
#pragma unroll
            for (int j = 0; j < HC; ++j) {
                const A left = __shfl_up_sync(DW_FULL_MASK, win[i][4 + j], 1);     // lane - 1: its column 4 - HC + j
                const A right = __shfl_down_sync(DW_FULL_MASK, win[i][HC + j], 1); // lane + 1: its column j
                win[i][j] = left;
                win[i][HC + 4 + j] = right;
            }
        }
        const bool left_edge = lg == 0, right_edge = lg == Gs - 1 || g >= G - 1;
        if (left_edge || right_edge) {  // segment edges: from memory (zeros at the row's ends)
#pragma unroll
            for (int i = 0; i < IN; ++i) {
                const int h = row0 + i;
                const bool row_in = active && (unsigned)h < (unsigned)Hs;
                const T* src = plane + (long long)(row_in ? h : 0) * Ws;
#pragma unroll
                for (int j = 0; j < HC; ++j) {
                    if (left_edge) {
                        const int c = col - HC + j;
                        win[i][j] = (row_in && c >= 0) ? load(src[c]) : A(0);
                    }
                    if (right_edge) {
                        const int c = col + 4 + j;
                        win[i][HC + 4 + j] = (row_in && c < Ws) ? load(src[c]) : A(0);
                    }
                }
            }
        }
    }
}

// MINB: minimum resident blocks per SM asked of the compiler (register cap
// 65536 / (256 MINB)); 1 leaves it free.
template <typename T, int KS, int ROWS, int MINB>
__global__ void __launch_bounds__(256, MINB)
dw_same_nchw(const T* __restrict__ in, const T* __restrict__ w, const T* __restrict__ bias,
             int has_bias, int act_mode, acc_t<T> act_alpha, T* __restrict__ out,
             int Cin, int Cout, int Hs, int Ws, int terms, int div, int flip,
             int G, int Gs, int segs, int bands, long long slots, int vec) {
    typedef acc_t<T> A;
    constexpr int HC = KS / 2, IN = ROWS + 2 * HC, RS = KS * KS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int spw = 32 / Gs, sl = lane / Gs, lg = lane - sl * Gs;
    const long long step = (long long)gridDim.x * warps * spw;
    for (long long base = ((long long)blockIdx.x * warps + warp) * spw; base < slots; base += step) {
        const long long slot = base + sl;
        const long long s_c = slot < slots ? slot : slots - 1;
        const int band = (int)(s_c % bands);
        const long long plane_seg = s_c / bands;
        const int seg = (int)(plane_seg % segs);
        const long long plane = plane_seg / segs;       // n * Cout + co
        const int co = (int)(plane % Cout);
        const long long n = plane / Cout;
        const int g = seg * Gs + lg;
        const bool active = sl < spw && slot < slots && g < G;
        const int row0 = band * ROWS;
        A acc[ROWS][4];
        const A b0 = has_bias ? load(bias[co]) : A(0);
#pragma unroll
        for (int i = 0; i < ROWS; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] = b0;
        for (int t = 0; t < terms; ++t) {
            const int f = co * terms + t;
            A wt[RS];
#pragma unroll
            for (int i = 0; i < RS; ++i) wt[i] = load(w[(long long)f * RS + (flip ? RS - 1 - i : i)]);
            A win[IN][4 + 2 * HC];
            dw_load_window<T, IN, HC>(in + (n * Cin + f / div) * (long long)Hs * Ws, row0 - HC, Hs, Ws,
                                      g, lg, Gs, G, active, vec != 0, win);
#pragma unroll
            for (int i = 0; i < ROWS; ++i)
#pragma unroll
                for (int r = 0; r < KS; ++r)
#pragma unroll
                    for (int s = 0; s < KS; ++s)
#pragma unroll
                        for (int j = 0; j < 4; ++j) acc[i][j] += win[i + r][j + s] * wt[r * KS + s];
        }
        if (active) {
            T* dst = out + plane * (long long)Hs * Ws;
            const int col = 4 * g;
#pragma unroll
            for (int i = 0; i < ROWS; ++i) {
                const int h = row0 + i;
                if (h < Hs) {
                    activate_tile<4>(act_mode, acc[i], act_alpha);
                    if (vec) {
                        store_vec<T, 4>(dst + (long long)h * Ws + col, acc[i]);
                    } else {
#pragma unroll
                        for (int j = 0; j < 4; ++j)
                            if (col + j < Ws) dst[(long long)h * Ws + col + j] = store<T>(acc[i][j]);
                    }
                }
            }
        }
    }
}

// Small planes (one row segment, W <= 4 * 16, so a warp holds spw >= 2 slots):
// dw_small_nchw, forward and backward data with one input plane per output
// plane (terms == 1: forward, or backward data with multiplier 1).  Same lane
// mapping as dw_same_nchw (Gs = G lanes per slot, slot = plane * bands + band),
// but a warp's consecutive slots are consecutive bands of a plane, so a band's
// HC halo rows above / below are the last / first own rows of the slot before /
// after it in the same warp: they come by __shfl_up/down_sync by Gs lanes, not
// from memory (only a warp's first / last slot loads them).  A lane loads ROWS
// own rows (16-byte loads, all in flight at once) plus those halo rows, so
// every input byte is loaded about once (mbv2_dw_28 with ROWS = 7: one 28 x 28
// plane per warp, 28 lanes x 7 rows, no halo row from memory at all).  The
// outputs are computed input row by input row (each input row adds to the KS
// output rows it touches; an output row is stored as soon as it is complete),
// so a lane holds its raw input rows, KS rows of accumulators and one row's
// halo columns.  Column halos: by shuffles from the neighbour lanes; the row's
// ends are zero padding (one segment).  VEC (W % 4 == 0, aligned pointers):
// 16-byte loads and stores, else masked scalar ones (a template parameter: the
// scalar path's addresses would otherwise raise the register count of both).
template <typename T, int KS, int ROWS, int MINB, bool VEC>
__global__ void __launch_bounds__(256, MINB)
dw_small_nchw(const T* __restrict__ in, const T* __restrict__ w, const T* __restrict__ bias,
              int has_bias, int act_mode, acc_t<T> act_alpha, T* __restrict__ out,
              int Cin, int Cout, int Hs, int Ws, int div, int flip, int G, int bands,
              int slots) {
    typedef acc_t<T> A;
    constexpr int HC = KS / 2, IN = ROWS + 2 * HC, RS = KS * KS;
    static_assert(ROWS >= HC && HC <= 4, "halo rows come from one neighbour slot");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int spw = 32 / G, sl = lane / G, g = lane - sl * G;
    const int col = 4 * g, col_c = min(col, 4 * (G - 1));
    // slots <= 2^30 (checked in Python): base + step stays below 2^31, so 32-bit
    // slot arithmetic (no 64-bit divisions).
    const int step = gridDim.x * warps * spw;
    for (int base = (blockIdx.x * warps + warp) * spw; base < slots; base += step) {
        const int slot = base + sl;
        const int s_c = slot < slots ? slot : slots - 1;
        const int band = s_c % bands;
        const int plane = s_c / bands;               // n * Cout + co
        const int co = plane % Cout;
        const int n = plane / Cout;
        const bool active = sl < spw && slot < slots;
        const int row0 = band * ROWS - HC;           // first window row
        // Halo rows from memory only at the warp's first / last slot (and
        // only inside the plane); else from the neighbour slot.
        const bool top_mem = sl == 0 && band > 0;
        const bool bottom_mem = sl == spw - 1 && band < bands - 1;
        const T* src = in + ((long long)n * Cin + co / div) * Hs * Ws;
        A wt[RS];
#pragma unroll
        for (int i = 0; i < RS; ++i) wt[i] = load(w[(long long)co * RS + (flip ? RS - 1 - i : i)]);
        A raw[IN][4];
#pragma unroll
        for (int r = 0; r < IN; ++r) {
            const int h = row0 + r;
            const bool want = active && (unsigned)h < (unsigned)Hs &&
                              (r < HC ? top_mem : r >= HC + ROWS ? bottom_mem : true);
            const T* row = src + (long long)min(max(h, 0), Hs - 1) * Ws;
            if constexpr (VEC) {
                if (want) {
                    load_vec<T, 4>(row + col_c, raw[r]);
                } else {
#pragma unroll
                    for (int j = 0; j < 4; ++j) raw[r][j] = A(0);
                }
            } else {
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    raw[r][j] = (want && col + j < Ws) ? load(row[min(col_c + j, Ws - 1)]) : A(0);
            }
        }
        // Halo rows from the slots before / after (all 32 lanes shuffle).
        const bool top_nb = sl > 0 && band > 0, bottom_nb = sl < spw - 1 && band < bands - 1;
#pragma unroll
        for (int r = 0; r < HC; ++r)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const A up = __shfl_up_sync(DW_FULL_MASK, raw[r + ROWS][j], G);
                const A down = __shfl_down_sync(DW_FULL_MASK, raw[HC + r][j], G);
                if (top_nb) raw[r][j] = up;
                if (bottom_nb) raw[HC + ROWS + r][j] = down;
            }
        const A b0 = has_bias ? load(bias[co]) : A(0);
        T* dst = out + (long long)plane * Hs * Ws;
        A acc[ROWS][4];
#pragma unroll
        for (int r = 0; r < IN; ++r) {
            // Row r with its halo columns: win[HC + j] = raw[r][j].
            A win[4 + 2 * HC];
#pragma unroll
            for (int j = 0; j < HC; ++j) {
                const A left = __shfl_up_sync(DW_FULL_MASK, raw[r][4 - HC + j], 1);
                const A right = __shfl_down_sync(DW_FULL_MASK, raw[r][j], 1);
                win[j] = g > 0 ? left : A(0);
                win[HC + 4 + j] = g < G - 1 ? right : A(0);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) win[HC + j] = raw[r][j];
            // Input row r adds to output rows i = r - a, filter row a.
#pragma unroll
            for (int a = 0; a < KS; ++a) {
                const int i = r - a;
                if (i >= 0 && i < ROWS) {
                    if (a == 0) {
#pragma unroll
                        for (int j = 0; j < 4; ++j) acc[i][j] = b0;
                    }
#pragma unroll
                    for (int s = 0; s < KS; ++s)
#pragma unroll
                        for (int j = 0; j < 4; ++j) acc[i][j] += win[j + s] * wt[a * KS + s];
                }
            }
            // Output row r - (KS - 1) is complete.
            const int i = r - (KS - 1);
            if (i >= 0) {
                const int h = band * ROWS + i;
                if (active && h < Hs) {
                    activate_tile<4>(act_mode, acc[i], act_alpha);
                    if constexpr (VEC) {
                        store_vec<T, 4>(dst + (long long)h * Ws + col, acc[i]);
                    } else {
#pragma unroll
                        for (int j = 0; j < 4; ++j)
                            if (col + j < Ws) dst[(long long)h * Ws + col + j] = store<T>(acc[i][j]);
                    }
                }
            }
        }
    }
}

// Backward filter pass 1 for the "same" problems; grid (K, chunks), at most
// DW_MAX_WARPS warps.  Slot = (n * segs + seg) * bands + band within channel k.
template <typename T, int KS, int ROWS, int MINB>
__global__ void __launch_bounds__(256, MINB)
dw_same_filter_nchw(const T* __restrict__ x, const T* __restrict__ dy, acc_t<T>* __restrict__ partials,
                    int C, int K, int Hs, int Ws, int mult, int G, int Gs, int segs, int bands,
                    long long slots, int vec) {
    typedef acc_t<T> A;
    constexpr int HC = KS / 2, IN = ROWS + 2 * HC, RS = KS * KS;
    __shared__ A sums[DW_MAX_WARPS][RS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int spw = 32 / Gs, sl = lane / Gs, lg = lane - sl * Gs;
    const int k = blockIdx.x, c = k / mult, chunk = blockIdx.y, chunks = gridDim.y;
    A acc[RS];
#pragma unroll
    for (int i = 0; i < RS; ++i) acc[i] = A(0);
    const long long step = (long long)chunks * warps * spw;
    for (long long base = ((long long)chunk * warps + warp) * spw; base < slots; base += step) {
        const long long slot = base + sl;
        const long long s_c = slot < slots ? slot : slots - 1;
        const int band = (int)(s_c % bands);
        const long long n_seg = s_c / bands;
        const int seg = (int)(n_seg % segs);
        const long long n = n_seg / segs;
        const int g = seg * Gs + lg;
        const bool active = sl < spw && slot < slots && g < G;
        const int row0 = band * ROWS;
        A win[IN][4 + 2 * HC];
        A d[ROWS][4];
        dw_load_window<T, ROWS, 0>(dy + (n * K + k) * (long long)Hs * Ws, row0, Hs, Ws, g, lg, Gs, G,
                                   active, vec != 0, d);
        dw_load_window<T, IN, HC>(x + (n * C + c) * (long long)Hs * Ws, row0 - HC, Hs, Ws, g, lg, Gs, G,
                                  active, vec != 0, win);
#pragma unroll
        for (int r = 0; r < KS; ++r)
#pragma unroll
            for (int s = 0; s < KS; ++s) {
                A t = A(0);
#pragma unroll
                for (int i = 0; i < ROWS; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) t += d[i][j] * win[i + r][j + s];
                acc[r * KS + s] += t;
            }
    }
#pragma unroll
    for (int i = 0; i < RS; ++i) {
        const A v = warp_sum(acc[i]);
        if (lane == 0) sums[warp][i] = v;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < RS; i += blockDim.x) {
        A v = A(0);
        for (int j = 0; j < warps; ++j) v += sums[j][i];
        partials[((long long)k * RS + i) * chunks + chunk] = v;
    }
}
