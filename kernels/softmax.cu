// Softmax and log-softmax over one axis, forward and backward.
//
// Python views the tensor as (outer, n, inner) with the reduced axis of length
// n in the middle, and picks one of six mappings:
//
//   *_rows_registers  inner == 1 and the row fits in registers (n up to
//                  256 threads x ROW_PACKS packs x VEC values): blockDim
//                  (G, R), G threads (a power of two, 32..256) per row and R
//                  rows per block (R > 1 only when G == 32); G is the fewest
//                  that hold the row, or more when rows are too few to fill
//                  the GPU (Python: SHORT_ROW_PACKS), which shortens each
//                  thread's serial chain of loads, exps and adds.  Thread t holds
//                  packs t, t + G, ... (ROW_PACKS of them, VEC values each,
//                  16-byte loads when Python found the row and pointers
//                  aligned), so x is read once and y written once; max and
//                  sum are reductions over registers (warp shuffles, plus
//                  shared memory across the warps of one row when G > 32).
//   *_rows_block   inner == 1 and longer rows: one block per row, online
//                  (max, sum) in one read, a second read writes y.
//   *_channels_packs  inner > 1, inner % VEC == 0 (VEC values = 16 bytes),
//                  pointers aligned, n <= K packs x CY rows of threads (512 for
//                  (8, 256), 1024 for (8, 512)): the axis in registers as
//                  16-byte packs of VEC inner positions (see the kernels at the
//                  end of this file).  The kernels below are the
//                  fallbacks for other shapes.
//   *_channels_registers  forward, 16-bit types, inner >= 8 and n <= 32 x CY
//                  (CY <= 32): the same tiles as *_channels below, each thread
//                  holding its 32 values in registers (no shared memory but the
//                  reductions').
//   *_channels_pairs  16-bit types, inner even, pointers aligned: the
//                  *_channels tile below with two inner positions (4 bytes) per
//                  thread.
//   *_channels     inner > 1 and a (n x TW) tile fits in shared memory (the
//                  channel axis of NCHW): blockDim (TW, CY) with TW * CY =
//                  256; a block owns TW consecutive inner positions of one
//                  outer index and all n values along the axis.  Thread
//                  (tx, ty) loads rows ty, ty + CY, ... of the tile: each warp
//                  load is TW consecutive values (coalesced along inner), the
//                  tile is staged in shared memory, so x is read once; the
//                  column max/sum are combined across ty in fixed order.
//                  Each thread reads back only the tile slots it wrote, so
//                  the tile needs no barrier (the scratch of the column
//                  reductions does).
//   *_columns      inner > 1 and the tile does not fit: one thread per
//                  (outer, inner) column loops over the n elements with stride
//                  inner (coalesced across the warp), reading x twice.
//
// Forward keeps an online (max, sum of exp(x - max)) pair (Milakov and
// Gimelshein, "Online normalizer calculation for softmax", 2018): the max and
// the normaliser come out of one read of x, and a second read writes y.
// Subtracting the max keeps every finite input from overflowing; a slice that
// is entirely -inf yields NaN, as in PyTorch.
//
// Backward takes the forward output y:
//   softmax:      dx = y * (dy - sum(dy * y))
//   log-softmax:  dx = dy - exp(y) * sum(dy)
//
// All arithmetic is in acc_t<T>.  Loops stride by gridDim * blockDim; Python
// caps the grid and picks index_t with room for the last stride step
// (dnnprims/softmax.py).
#include "common.cuh"
#include "packs.cuh"

// Packs each thread holds per row in the *_rows_registers kernels.
#define ROW_PACKS 8

__device__ __forceinline__ float exp_acc(float v) { return expf(v); }
__device__ __forceinline__ double exp_acc(double v) { return exp(v); }
__device__ __forceinline__ float log_acc(float v) { return logf(v); }
__device__ __forceinline__ double log_acc(double v) { return log(v); }

// Fold one value into a running (max m, sum s of exp(x - m)).  An empty pair is
// (-inf, 0); -inf values contribute nothing (and never form -inf - -inf).
template <typename A> __device__ __forceinline__ void online_add(A& m, A& s, A v) {
    if (v > m) {
        s = s * exp_acc(m - v) + A(1);
        m = v;
    } else if (v != negative_infinity<A>()) {
        s += exp_acc(v - m);
    }
}

// Merge two running pairs; equal maxima (including +inf) are not subtracted.
template <typename A> __device__ __forceinline__ void online_merge(A& m, A& s, A mo, A so) {
    const A mn = fmax(m, mo);
    if (mn == negative_infinity<A>()) return;  // both empty
    s = (m == mn ? s : s * exp_acc(m - mn)) + (mo == mn ? so : so * exp_acc(mo - mn));
    m = mn;
}

template <typename A> __device__ __forceinline__ void warp_online_merge(A& m, A& s) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const A mo = __shfl_xor_sync(0xffffffffu, m, offset);
        const A so = __shfl_xor_sync(0xffffffffu, s, offset);
        online_merge(m, s, mo, so);
    }
}

// Block-wide merge; every thread gets the row's pair.  Called by all threads.
template <typename A> __device__ __forceinline__ void block_online_merge(A& m, A& s) {
    __shared__ A max_scratch[32];
    __shared__ A sum_scratch[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
    warp_online_merge(m, s);
    __syncthreads();  // the scratch may still be read for the previous row
    if (lane == 0) {
        max_scratch[warp] = m;
        sum_scratch[warp] = s;
    }
    __syncthreads();
    m = lane < warps ? max_scratch[lane] : negative_infinity<A>();
    s = lane < warps ? sum_scratch[lane] : A(0);
    warp_online_merge(m, s);  // every warp merges the same values: all agree
}

// exp for the register and pack kernels (and every backward).  float/double use the accurate library exp;
// the 16-bit types use ex2.approx (relative error ~2^-22, far below their
// storage rounding), which halves the instructions per element -- at 2 bytes
// a value these kernels otherwise run out of issue slots before bandwidth.
template <typename T> __device__ __forceinline__ acc_t<T> exp_for(acc_t<T> v) {
    if constexpr (sizeof(T) == 2) {
        return ex2_approx(v * 1.4426950408889634f);
    } else {
        return exp_acc(v);
    }
}

template <typename A, bool LOG> __device__ __forceinline__ A softmax_value(A v, A m, A s) {
    if (LOG) return v - m - log_acc(s);
    return exp_acc(v - m) / s;
}

// The per-element reduction term of backward: dy*y (softmax) or dy (log).
template <typename A, bool LOG> __device__ __forceinline__ A backward_term(A dy, A y) {
    return LOG ? dy : dy * y;
}

template <typename T, bool LOG>
__device__ __forceinline__ acc_t<T> backward_value(acc_t<T> dy, acc_t<T> y, acc_t<T> sum) {
    if (LOG) return dy - exp_for<T>(y) * sum;
    return y * (dy - sum);
}

// ---- forward ---------------------------------------------------------------

template <typename T, typename index_t, bool LOG>
__global__ void softmax_forward_rows_block(const T* x, T* y, index_t rows, index_t n) {
    typedef acc_t<T> A;
    const index_t step = blockDim.x;
    for (index_t row = blockIdx.x; row < rows; row += (index_t)gridDim.x) {
        const T* xr = x + row * n;
        T* yr = y + row * n;
        A m = negative_infinity<A>(), s = A(0);
        for (index_t k = threadIdx.x; k < n; k += step) online_add(m, s, load(xr[k]));
        block_online_merge(m, s);
        for (index_t k = threadIdx.x; k < n; k += step) yr[k] = store<T>(softmax_value<A, LOG>(load(xr[k]), m, s));
    }
}

// First element of column col = (o, i) of the (outer, n, inner) view.
template <typename index_t> __device__ __forceinline__ index_t column_start(index_t col, index_t n, index_t inner) {
    const index_t o = col / inner;
    return o * n * inner + (col - o * inner);
}

template <typename T, typename index_t, bool LOG>
__global__ void softmax_forward_columns(const T* x, T* y, index_t outer, index_t n, index_t inner) {
    typedef acc_t<T> A;
    const index_t stride = (index_t)gridDim.x * (index_t)blockDim.x;
    for (index_t col = (index_t)blockIdx.x * (index_t)blockDim.x + (index_t)threadIdx.x; col < outer * inner;
         col += stride) {
        const index_t base = column_start(col, n, inner);
        A m = negative_infinity<A>(), s = A(0);
        for (index_t k = 0; k < n; ++k) online_add(m, s, load(x[base + k * inner]));
        for (index_t k = 0; k < n; ++k) {
            const index_t at = base + k * inner;
            y[at] = store<T>(softmax_value<A, LOG>(load(x[at]), m, s));
        }
    }
}

// ---- backward --------------------------------------------------------------

template <typename T, typename index_t, bool LOG>
__global__ void softmax_backward_rows_block(const T* dy, const T* y, T* dx, index_t rows, index_t n) {
    typedef acc_t<T> A;
    __shared__ A scratch[32];
    const index_t step = blockDim.x;
    for (index_t row = blockIdx.x; row < rows; row += (index_t)gridDim.x) {
        const index_t off = row * n;
        A sum = A(0);
        for (index_t k = threadIdx.x; k < n; k += step)
            sum += backward_term<A, LOG>(load(dy[off + k]), load(y[off + k]));
        sum = block_sum(sum, scratch);
        for (index_t k = threadIdx.x; k < n; k += step)
            dx[off + k] = store<T>(backward_value<T, LOG>(load(dy[off + k]), load(y[off + k]), sum));
    }
}

template <typename T, typename index_t, bool LOG>
__global__ void softmax_backward_columns(const T* dy, const T* y, T* dx, index_t outer, index_t n,
                                         index_t inner) {
    typedef acc_t<T> A;
    const index_t stride = (index_t)gridDim.x * (index_t)blockDim.x;
    for (index_t col = (index_t)blockIdx.x * (index_t)blockDim.x + (index_t)threadIdx.x; col < outer * inner;
         col += stride) {
        const index_t base = column_start(col, n, inner);
        A sum = A(0);
        for (index_t k = 0; k < n; ++k) {
            const index_t at = base + k * inner;
            sum += backward_term<A, LOG>(load(dy[at]), load(y[at]));
        }
        for (index_t k = 0; k < n; ++k) {
            const index_t at = base + k * inner;
            dx[at] = store<T>(backward_value<T, LOG>(load(dy[at]), load(y[at]), sum));
        }
    }
}

// ---- rows held in registers ---------------------------------------------------

// Max / sum over the threads of one row: the warp, or (G > 32, one row per
// block) the whole block.  Called by every thread of the row.
template <typename A> __device__ __forceinline__ A row_max(A v, A* scratch) {
    return blockDim.x > 32 ? block_max(v, scratch) : warp_max(v);
}

template <typename A> __device__ __forceinline__ A row_sum(A v, A* scratch) {
    return blockDim.x > 32 ? block_sum(v, scratch) : warp_sum(v);
}

// Rows are held as raw packs (ROW_PACKS x 16 bytes a thread: 32 registers in
// every storage type) and converted where used, so 16-bit rows need no more
// registers than float rows.  At most 256 threads a row (Python), which keeps
// every specialisation launchable whatever its register count.  Max and sum
// keep VEC partials a thread (chains of ROW_PACKS, not ROW_PACKS x VEC,
// dependent steps: a short row is latency-bound), combined in a fixed order.
// float and double forward keep exp(x - max) in place of x (one exp a value);
// the 16-bit types recompute it with ex2.approx (a 16-bit pack would round it).
template <typename T, typename index_t, bool LOG, int VEC>
__global__ void __launch_bounds__(256) softmax_forward_rows_registers(const T* __restrict__ x, T* __restrict__ y,
                                                                      index_t rows, index_t n) {
    typedef acc_t<T> A;
    constexpr bool KEEP_EXP = sizeof(T) == sizeof(A) && !LOG;  // float, double: the pack holds A values
    __shared__ A scratch[32];
    const index_t packs = n / VEC;  // Python: n % VEC == 0
    const index_t row_stride = (index_t)gridDim.x * (index_t)blockDim.y;
    for (index_t row = (index_t)blockIdx.x * (index_t)blockDim.y + (index_t)threadIdx.y; row < rows;
         row += row_stride) {
        const T* xr = x + row * n;
        T* yr = y + row * n;
        Pack<T, VEC> v[ROW_PACKS];
#pragma unroll
        for (int k = 0; k < ROW_PACKS; ++k) {
            const index_t j = (index_t)threadIdx.x + (index_t)k * (index_t)blockDim.x;
            if (j < packs) v[k] = load_pack<T, VEC>(xr + j * VEC);
        }
        A part[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) part[e] = negative_infinity<A>();
#pragma unroll
        for (int k = 0; k < ROW_PACKS; ++k) {
            const index_t j = (index_t)threadIdx.x + (index_t)k * (index_t)blockDim.x;
            if (j < packs) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) part[e] = fmax(part[e], load(v[k].v[e]));  // a NaN is skipped here and poisons the sum below
            }
        }
        A m = part[0];
#pragma unroll
        for (int e = 1; e < VEC; ++e) m = fmax(m, part[e]);
        m = row_max(m, scratch);
#pragma unroll
        for (int e = 0; e < VEC; ++e) part[e] = A(0);
#pragma unroll
        for (int k = 0; k < ROW_PACKS; ++k) {
            const index_t j = (index_t)threadIdx.x + (index_t)k * (index_t)blockDim.x;
            if (j < packs) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    const A d = exp_for<T>(load(v[k].v[e]) - m);
                    part[e] += d;
                    if constexpr (KEEP_EXP) v[k].v[e] = d;
                }
            }
        }
        A s = part[0];
#pragma unroll
        for (int e = 1; e < VEC; ++e) s += part[e];
        s = row_sum(s, scratch);
        const A log_s = LOG ? log_acc(s) : A(0);
        const A inv_s = A(1) / s;  // one division per row; the product is within 1.5 ulp of v / s
#pragma unroll
        for (int k = 0; k < ROW_PACKS; ++k) {
            const index_t j = (index_t)threadIdx.x + (index_t)k * (index_t)blockDim.x;
            if (j < packs) {
                Pack<T, VEC> p;
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    A r;
                    if constexpr (LOG) r = load(v[k].v[e]) - m - log_s;
                    else if constexpr (KEEP_EXP) r = load(v[k].v[e]) * inv_s;
                    else r = exp_for<T>(load(v[k].v[e]) - m) * inv_s;
                    p.v[e] = store<T>(r);
                }
                store_pack<T, VEC>(yr + j * VEC, p);
            }
        }
    }
}

template <typename T, typename index_t, bool LOG, int VEC>
__global__ void __launch_bounds__(256) softmax_backward_rows_registers(const T* __restrict__ dy,
                                                                       const T* __restrict__ y,
                                                                       T* __restrict__ dx, index_t rows, index_t n) {
    typedef acc_t<T> A;
    __shared__ A scratch[32];
    const index_t packs = n / VEC;
    const index_t row_stride = (index_t)gridDim.x * (index_t)blockDim.y;
    for (index_t row = (index_t)blockIdx.x * (index_t)blockDim.y + (index_t)threadIdx.y; row < rows;
         row += row_stride) {
        const index_t off = row * n;
        Pack<T, VEC> g[ROW_PACKS], w[ROW_PACKS];
#pragma unroll
        for (int k = 0; k < ROW_PACKS; ++k) {
            const index_t j = (index_t)threadIdx.x + (index_t)k * (index_t)blockDim.x;
            if (j < packs) {
                g[k] = load_pack<T, VEC>(dy + off + j * VEC);
                w[k] = load_pack<T, VEC>(y + off + j * VEC);
            }
        }
        A part[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) part[e] = A(0);
#pragma unroll
        for (int k = 0; k < ROW_PACKS; ++k) {
            const index_t j = (index_t)threadIdx.x + (index_t)k * (index_t)blockDim.x;
            if (j < packs) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) part[e] += backward_term<A, LOG>(load(g[k].v[e]), load(w[k].v[e]));
            }
        }
        A sum = part[0];
#pragma unroll
        for (int e = 1; e < VEC; ++e) sum += part[e];
        sum = row_sum(sum, scratch);
#pragma unroll
        for (int k = 0; k < ROW_PACKS; ++k) {
            const index_t j = (index_t)threadIdx.x + (index_t)k * (index_t)blockDim.x;
            if (j < packs) {
                Pack<T, VEC> p;
#pragma unroll
                for (int e = 0; e < VEC; ++e)
                    p.v[e] = store<T>(backward_value<T, LOG>(load(g[k].v[e]), load(w[k].v[e]), sum));
                store_pack<T, VEC>(dx + off + j * VEC, p);
            }
        }
    }
}

// The column a thread of a tile kernel owns in tile t: its first element
// (outer o, inner position p) and whether p lies inside inner; the tile's
// blockDim.x threads cover `positions` consecutive inner positions each.
template <typename index_t> struct TileColumn {
    index_t base;
    bool valid;
};
template <typename index_t>
__device__ __forceinline__ TileColumn<index_t> tile_column(index_t t, index_t tiles_per_outer, index_t n,
                                                           index_t inner, int positions) {
    const index_t o = t / tiles_per_outer;
    const index_t p = ((t - o * tiles_per_outer) * (index_t)blockDim.x + (index_t)threadIdx.x) * positions;
    return {o * n * inner + p, p < inner};
}

// ---- strided axis through a shared-memory tile ---------------------------------

#define CHANNEL_THREADS 256  // TW * CY

// Combine one value per thread across the CY threads of each tile column
// (fixed order, so every thread of the column gets the same bits).
template <typename A, bool MAX> __device__ __forceinline__ A column_reduce(A v, A* scratch) {
    const int tx = threadIdx.x, ty = threadIdx.y, tw = blockDim.x, cy = blockDim.y;
    __syncthreads();  // scratch may still be read by the previous call
    scratch[ty * tw + tx] = v;
    __syncthreads();
    A r = scratch[tx];
    for (int k = 1; k < cy; ++k) r = MAX ? fmax(r, scratch[k * tw + tx]) : r + scratch[k * tw + tx];
    return r;
}

template <typename T, typename index_t, bool LOG>
__global__ void softmax_forward_channels(const T* __restrict__ x, T* __restrict__ y, index_t outer, index_t n,
                                         index_t inner, index_t tiles_per_outer) {
    typedef acc_t<T> A;
    __shared__ A scratch[CHANNEL_THREADS];
    extern __shared__ __align__(16) unsigned char tile_bytes[];
    T* tile = reinterpret_cast<T*>(tile_bytes);  // n x TW values
    const int tx = threadIdx.x, ty = threadIdx.y, tw = blockDim.x, cy = blockDim.y;
    const index_t tiles = outer * tiles_per_outer;
    for (index_t t = blockIdx.x; t < tiles; t += (index_t)gridDim.x) {
        const TileColumn<index_t> col = tile_column(t, tiles_per_outer, n, inner, 1);
        const index_t base = col.base;
        const bool valid = col.valid;
        A m = negative_infinity<A>();
        if (valid) {
#pragma unroll 8
            for (index_t c = ty; c < n; c += cy) {
                const T v = x[base + c * inner];
                tile[c * tw + tx] = v;
                m = fmax(m, load(v));
            }
        }
        m = column_reduce<A, true>(m, scratch);
        A s = A(0);
        if (valid)
            for (index_t c = ty; c < n; c += cy) s += exp_acc(load(tile[c * tw + tx]) - m);
        s = column_reduce<A, false>(s, scratch);
        const A log_s = LOG ? log_acc(s) : A(0);
        const A inv_s = A(1) / s;
        if (valid) {
            for (index_t c = ty; c < n; c += cy) {
                const A v = load(tile[c * tw + tx]);
                y[base + c * inner] = store<T>(LOG ? v - m - log_s : exp_acc(v - m) * inv_s);
            }
        }
    }
}

template <typename T, typename index_t, bool LOG>
__global__ void softmax_backward_channels(const T* __restrict__ dy, const T* __restrict__ y, T* __restrict__ dx,
                                          index_t outer, index_t n, index_t inner, index_t tiles_per_outer) {
    typedef acc_t<T> A;
    __shared__ A scratch[CHANNEL_THREADS];
    extern __shared__ __align__(16) unsigned char tile_bytes[];
    const int tx = threadIdx.x, ty = threadIdx.y, tw = blockDim.x, cy = blockDim.y;
    T* tile_dy = reinterpret_cast<T*>(tile_bytes);  // n x TW values of dy, then n x TW of y
    T* tile_y = tile_dy + n * tw;
    const index_t tiles = outer * tiles_per_outer;
    for (index_t t = blockIdx.x; t < tiles; t += (index_t)gridDim.x) {
        const TileColumn<index_t> col = tile_column(t, tiles_per_outer, n, inner, 1);
        const index_t base = col.base;
        const bool valid = col.valid;
        A sum = A(0);
        if (valid) {
#pragma unroll 8
            for (index_t c = ty; c < n; c += cy) {
                const T g = dy[base + c * inner], w = y[base + c * inner];
                tile_dy[c * tw + tx] = g;
                tile_y[c * tw + tx] = w;
                sum += backward_term<A, LOG>(load(g), load(w));
            }
        }
        sum = column_reduce<A, false>(sum, scratch);
        if (valid) {
            for (index_t c = ty; c < n; c += cy)
                dx[base + c * inner] = store<T>(
                    backward_value<T, LOG>(load(tile_dy[c * tw + tx]), load(tile_y[c * tw + tx]), sum));
        }
    }
}

// ---- strided axis, 16-bit types: two inner positions per thread -------------------

// The *_channels tiles for half_t / bfloat16_t with inner even and the
// pointers aligned: thread tx owns positions 2 tx, 2 tx + 1 of the tile's 2 TW,
// loaded and stored as one 4-byte pair, so a warp moves 128 bytes per access
// as the float kernels do (one 2-byte value per thread moved 64 bytes and ran
// at 0.41-0.62 of the copy bandwidth against float's 0.83-0.90).  The tile
// holds n x TW pairs; each thread reduces its two columns (scratch of 2 x 256).
template <typename A, bool MAX> __device__ __forceinline__ void column_reduce2(A& a, A& b, A* scratch) {
    const int tx = threadIdx.x, ty = threadIdx.y, tw = blockDim.x, cy = blockDim.y;
    __syncthreads();
    scratch[ty * tw + tx] = a;
    scratch[CHANNEL_THREADS + ty * tw + tx] = b;
    __syncthreads();
    A ra = scratch[tx], rb = scratch[CHANNEL_THREADS + tx];
    for (int k = 1; k < cy; ++k) {
        const A va = scratch[k * tw + tx], vb = scratch[CHANNEL_THREADS + k * tw + tx];
        ra = MAX ? fmax(ra, va) : ra + va;
        rb = MAX ? fmax(rb, vb) : rb + vb;
    }
    a = ra;
    b = rb;
}

template <typename T, typename index_t, bool LOG>
__global__ void softmax_forward_channels_pairs(const T* __restrict__ x, T* __restrict__ y, index_t outer,
                                               index_t n, index_t inner, index_t tiles_per_outer) {
    typedef acc_t<T> A;
    typedef Pack<T, 2> Pair;
    __shared__ A scratch[2 * CHANNEL_THREADS];
    extern __shared__ __align__(16) unsigned char tile_bytes[];
    Pair* tile = reinterpret_cast<Pair*>(tile_bytes);  // n x TW pairs
    const int tx = threadIdx.x, ty = threadIdx.y, tw = blockDim.x, cy = blockDim.y;
    const index_t tiles = outer * tiles_per_outer;
    for (index_t t = blockIdx.x; t < tiles; t += (index_t)gridDim.x) {
        const TileColumn<index_t> col = tile_column(t, tiles_per_outer, n, inner, 2);
        const index_t base = col.base;
        const bool valid = col.valid;
        A m0 = negative_infinity<A>(), m1 = negative_infinity<A>();
        if (valid) {
#pragma unroll 8
            for (index_t c = ty; c < n; c += cy) {
                const Pair v = load_pack<T, 2>(x + base + c * inner);
                tile[c * tw + tx] = v;
                m0 = fmax(m0, load(v.v[0]));
                m1 = fmax(m1, load(v.v[1]));
            }
        }
        column_reduce2<A, true>(m0, m1, scratch);
        A s0 = A(0), s1 = A(0);
        if (valid) {
            for (index_t c = ty; c < n; c += cy) {
                const Pair v = tile[c * tw + tx];
                s0 += exp_for<T>(load(v.v[0]) - m0);
                s1 += exp_for<T>(load(v.v[1]) - m1);
            }
        }
        column_reduce2<A, false>(s0, s1, scratch);
        const A log_s0 = LOG ? log_acc(s0) : A(0), log_s1 = LOG ? log_acc(s1) : A(0);
        const A inv_s0 = A(1) / s0, inv_s1 = A(1) / s1;
        if (valid) {
            for (index_t c = ty; c < n; c += cy) {
                Pair v = tile[c * tw + tx];
                const A d0 = load(v.v[0]) - m0, d1 = load(v.v[1]) - m1;
                v.v[0] = store<T>(LOG ? d0 - log_s0 : exp_for<T>(d0) * inv_s0);
                v.v[1] = store<T>(LOG ? d1 - log_s1 : exp_for<T>(d1) * inv_s1);
                store_pack<T, 2>(y + base + c * inner, v);
            }
        }
    }
}

template <typename T, typename index_t, bool LOG>
__global__ void softmax_backward_channels_pairs(const T* __restrict__ dy, const T* __restrict__ y,
                                                T* __restrict__ dx, index_t outer, index_t n, index_t inner,
                                                index_t tiles_per_outer) {
    typedef acc_t<T> A;
    typedef Pack<T, 2> Pair;
    __shared__ A scratch[2 * CHANNEL_THREADS];
    extern __shared__ __align__(16) unsigned char tile_bytes[];
    const int tx = threadIdx.x, ty = threadIdx.y, tw = blockDim.x, cy = blockDim.y;
    Pair* tile_dy = reinterpret_cast<Pair*>(tile_bytes);  // n x TW pairs of dy, then n x TW of y
    Pair* tile_y = tile_dy + n * tw;
    const index_t tiles = outer * tiles_per_outer;
    for (index_t t = blockIdx.x; t < tiles; t += (index_t)gridDim.x) {
        const TileColumn<index_t> col = tile_column(t, tiles_per_outer, n, inner, 2);
        const index_t base = col.base;
        const bool valid = col.valid;
        A sum0 = A(0), sum1 = A(0);
        if (valid) {
#pragma unroll 8
            for (index_t c = ty; c < n; c += cy) {
                const Pair g = load_pack<T, 2>(dy + base + c * inner), w = load_pack<T, 2>(y + base + c * inner);
                tile_dy[c * tw + tx] = g;
                tile_y[c * tw + tx] = w;
                sum0 += backward_term<A, LOG>(load(g.v[0]), load(w.v[0]));
                sum1 += backward_term<A, LOG>(load(g.v[1]), load(w.v[1]));
            }
        }
        column_reduce2<A, false>(sum0, sum1, scratch);
        if (valid) {
            for (index_t c = ty; c < n; c += cy) {
                const Pair g = tile_dy[c * tw + tx], w = tile_y[c * tw + tx];
                Pair r;
                r.v[0] = store<T>(backward_value<T, LOG>(load(g.v[0]), load(w.v[0]), sum0));
                r.v[1] = store<T>(backward_value<T, LOG>(load(g.v[1]), load(w.v[1]), sum1));
                store_pack<T, 2>(dx + base + c * inner, r);
            }
        }
    }
}

// ---- strided axis held in registers ----------------------------------------------

// The same tiles as *_channels, but each thread keeps its CHANNEL_VALUES values
// (rows ty, ty + CY, ... of the tile; Python: n <= CHANNEL_VALUES * CY) in
// registers: all loads in flight at once, no shared-memory traffic, one exp
// per element.  Forward of the 16-bit types only: on the H100 it beat the
// shared-memory tile there (fp16 softmax 0.163 -> 0.125 ms on 64x256x56x56)
// but lost for float (0.165 -> 0.183 ms) and for every backward it was tried
// on (notes/mem_softmax.md, v2).
#define CHANNEL_VALUES 32

template <typename T, typename index_t, bool LOG>
__global__ void __launch_bounds__(256) softmax_forward_channels_registers(const T* __restrict__ x,
                                                                         T* __restrict__ y, index_t outer,
                                                                         index_t n, index_t inner,
                                                                         index_t tiles_per_outer) {
    typedef acc_t<T> A;
    __shared__ A scratch[CHANNEL_THREADS];
    const int ty = threadIdx.y, cy = blockDim.y;
    const index_t tiles = outer * tiles_per_outer;
    for (index_t t = blockIdx.x; t < tiles; t += (index_t)gridDim.x) {
        const TileColumn<index_t> col = tile_column(t, tiles_per_outer, n, inner, 1);
        const index_t base = col.base;
        const bool valid = col.valid;
        A v[CHANNEL_VALUES];
        A m = negative_infinity<A>();
#pragma unroll
        for (int k = 0; k < CHANNEL_VALUES; ++k) {
            const index_t c = (index_t)ty + (index_t)k * cy;
            if (valid && c < n) {
                v[k] = load(x[base + c * inner]);
                m = fmax(m, v[k]);
            }
        }
        m = column_reduce<A, true>(m, scratch);
        A s = A(0);
#pragma unroll
        for (int k = 0; k < CHANNEL_VALUES; ++k) {
            const index_t c = (index_t)ty + (index_t)k * cy;
            if (valid && c < n) {
                const A e = exp_for<T>(v[k] - m);
                s += e;
                if (!LOG) v[k] = e;
            }
        }
        s = column_reduce<A, false>(s, scratch);
        const A log_s = LOG ? log_acc(s) : A(0);
        const A inv_s = A(1) / s;
#pragma unroll
        for (int k = 0; k < CHANNEL_VALUES; ++k) {
            const index_t c = (index_t)ty + (index_t)k * cy;
            if (valid && c < n) y[base + c * inner] = store<T>(LOG ? v[k] - m - log_s : v[k] * inv_s);
        }
    }
}

// ---- strided axis in registers, 16-byte packs of inner positions ------------------

// *_channels_packs: blockDim (TW, CY), TW * CY = 256 or 512, TW <= 32 (a power of
// two; <= 16 for 512 threads).
// A block owns TW x VEC consecutive inner positions of one outer index (VEC =
// the values of a 16-byte pack: 4 float, 8 half/bfloat16, 2 double) and the
// whole axis; thread (tx, ty) holds the packs of positions tx * VEC .. + VEC
// for axis rows ty, ty + CY, ... (K of them, 4 or 8; Python: n <= K * CY,
// inner % VEC == 0, pointers 16-byte aligned).  Each warp
// access moves 32/TW rows of TW x 16 contiguous bytes, every load is issued
// before any math, and the packs stay raw (32 registers a thread in every
// dtype, as in *_rows_registers) and are converted where used.  float and
// double forward keep exp(x - max) in place of x (one exp a value); the
// 16-bit types recompute it with ex2.approx (a 16-bit pack would round it).
#define CHANNEL_PACK_THREADS 512  // the most threads of a *_channels_packs block
#define CHANNEL_PACK_BOUNDED_THREADS 256  // the forward's block when MINB > 1 blocks must share an SM

// The shared-memory step of the column reductions below: lane tx < TW of each
// warp (its butterfly's result) puts its N values at scratch[(warp * TW + tx) * N
// ..], and after the barrier every thread takes warp 0's of its column; the
// caller combines warps 1, 2, ... from scratch in order.
template <int N, typename V>
__device__ __forceinline__ void column_scratch_exchange(V (&v)[N], V* scratch, int lane, int warp, int tw, int tx) {
    __syncthreads();  // scratch may still be read by the previous call
    if (lane < tw) {
#pragma unroll
        for (int i = 0; i < N; ++i) scratch[(warp * tw + tx) * N + i] = v[i];
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = scratch[tx * N + i];
}

// Reduce VEC values per thread over the CY threads of its tile column (same
// tx): a butterfly over the lanes of a warp with the same tx (every lane gets
// the same bits), then the warps' results through shared memory, combined in
// warp order.  `scratch` holds warps x TW x VEC <= 256 x VEC values.
// WARPS > 0: the block's warps as a constant (the loop over them unrolled).
template <typename A, int VEC, bool MAX, int WARPS = 0>
__device__ __forceinline__ void column_reduce_packs(A (&v)[VEC], A* scratch) {
    const int tw = blockDim.x, tx = threadIdx.x;
    const int flat = threadIdx.y * tw + tx;
    const int lane = flat & 31, warp = flat >> 5, warps = WARPS > 0 ? WARPS : (tw * blockDim.y) >> 5;
    for (int off = 16; off >= tw; off >>= 1) {  // lanes off apart share tx when off >= TW
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            const A o = __shfl_xor_sync(0xffffffffu, v[e], off);
            v[e] = MAX ? fmax(v[e], o) : v[e] + o;
        }
    }
    column_scratch_exchange(v, scratch, lane, warp, tw, tx);
    for (int w = 1; w < warps; ++w) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            const A o = scratch[(w * tw + tx) * VEC + e];
            v[e] = MAX ? fmax(v[e], o) : v[e] + o;
        }
    }
}

// The packs of one thread in tile t: axis rows ty, ty + CY, ... (the K slots) of
// its VEC inner positions.  The opening both *_channels_packs kernels share:
// where the thread's column starts, which of its K rows exist, and their loads
// (all issued before any math) and stores.
template <typename T, typename index_t, int K> struct ColumnPacks {
    static constexpr int VEC = pack_width<T>::value;
    index_t base, n, inner;
    bool valid;
    __device__ __forceinline__ ColumnPacks(index_t t, index_t tiles_per_outer, index_t n_, index_t inner_)
        : n(n_), inner(inner_) {
        const TileColumn<index_t> col = tile_column(t, tiles_per_outer, n_, inner_, VEC);
        base = col.base;
        valid = col.valid;
    }
    __device__ __forceinline__ index_t row(int k) const { return (index_t)threadIdx.y + (index_t)k * (index_t)blockDim.y; }
    __device__ __forceinline__ bool holds(int k) const { return valid && row(k) < n; }
    __device__ __forceinline__ void read(Pack<T, VEC> (&v)[K], const T* __restrict__ src) const {
#pragma unroll
        for (int k = 0; k < K; ++k)
            if (holds(k)) v[k] = load_pack<T, VEC>(src + base + row(k) * inner);
    }
    // Two sources' packs of the same rows, the loads of each row side by side.
    __device__ __forceinline__ void read(Pack<T, VEC> (&a)[K], const T* __restrict__ src_a, Pack<T, VEC> (&b)[K],
                                         const T* __restrict__ src_b) const {
#pragma unroll
        for (int k = 0; k < K; ++k) {
            if (holds(k)) {
                const index_t at = base + row(k) * inner;
                a[k] = load_pack<T, VEC>(src_a + at);
                b[k] = load_pack<T, VEC>(src_b + at);
            }
        }
    }
    // f(k, e) for position e of every held slot k, slots and positions in order.
    template <typename F> __device__ __forceinline__ void each(F f) const {
#pragma unroll
        for (int k = 0; k < K; ++k) {
            if (holds(k)) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) f(k, e);
            }
        }
    }
    // dst's packs of the held rows: value(k, e) (in acc_t<T>) for slot k, position e.
    template <typename F> __device__ __forceinline__ void write(T* __restrict__ dst, F value) const {
#pragma unroll
        for (int k = 0; k < K; ++k) {
            if (holds(k)) {
                Pack<T, VEC> out;
#pragma unroll
                for (int e = 0; e < VEC; ++e) out.v[e] = store<T>(value(k, e));
                store_pack<T, VEC>(dst + base + row(k) * inner, out);
            }
        }
    }
};

template <typename T, typename index_t, bool LOG, int K, int MINB>
__global__ void __launch_bounds__(MINB > 1 ? CHANNEL_PACK_BOUNDED_THREADS : CHANNEL_PACK_THREADS, MINB > 1 ? MINB : 0)
    softmax_forward_channels_packs(const T* __restrict__ x, T* __restrict__ y, index_t outer, index_t n,
                                   index_t inner, index_t tiles_per_outer) {
    typedef acc_t<T> A;
    constexpr int VEC = pack_width<T>::value;
    constexpr bool KEEP_EXP = sizeof(T) == sizeof(A);  // float, double: the pack holds A values
    __shared__ A scratch[256 * VEC];
    const index_t tiles = outer * tiles_per_outer;
    for (index_t t = blockIdx.x; t < tiles; t += (index_t)gridDim.x) {
        const ColumnPacks<T, index_t, K> col(t, tiles_per_outer, n, inner);
        Pack<T, VEC> v[K];
        col.read(v, x);
        A m[VEC], s[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) m[e] = negative_infinity<A>(), s[e] = A(0);
        col.each([&](int k, int e) { m[e] = fmax(m[e], load(v[k].v[e])); });  // a NaN poisons the sum below
        column_reduce_packs<A, VEC, true>(m, scratch);
        col.each([&](int k, int e) {
            const A d = exp_for<T>(load(v[k].v[e]) - m[e]);
            s[e] += d;
            if constexpr (KEEP_EXP && !LOG) v[k].v[e] = d;
        });
        column_reduce_packs<A, VEC, false>(s, scratch);
#pragma unroll
        for (int e = 0; e < VEC; ++e) s[e] = LOG ? log_acc(s[e]) : A(1) / s[e];  // log s, or 1 / s
        col.write(y, [&](int k, int e) {
            if constexpr (LOG) return load(v[k].v[e]) - m[e] - s[e];
            else if constexpr (KEEP_EXP) return load(v[k].v[e]) * s[e];
            else return exp_for<T>(load(v[k].v[e]) - m[e]) * s[e];
        });
    }
}

// ---- 16-bit forward in register words (notes/chsoft16.md) ---------------------------
//
// softmax_forward_channels_words: the *_channels_packs forward for half_t /
// bfloat16_t with fewer instructions a value (Python: PACKED16_FORWARD).  A
// 16-bit value moves half the bytes of a float for the same per-value work, so
// the packs kernel spent 27.6 SASS instructions a value (6.9 a byte moved,
// float 5.3) and issue, in bursts between its barriers, kept the loads of the
// next tiles waiting.  Here each 32-bit word of a pack (two values) is handled
// as a word:
//  - the max pass in packed max.f16x2 / max.bf16x2 (exact; NaN-ignoring like
//    fmax, the sum then turns the column NaN), and the column max reduced as
//    words too (half the shuffles and scratch of floats);
//  - each word is unpacked to two floats by two conversions (no shifts or moves);
//  - exp in base 2 against a per-column offset: e(x) = 2^(x log2(e) - M), M =
//    m log2(e) rounded, one FFMA (exact product inside) and one ex2.approx a
//    value, for the sum and again for the output, so any rounding of M cancels
//    between numerator and denominator; log-softmax takes the exact remainder
//    r = m log2(e) - M (one fma a column) back out of log s;
//  - outputs packed two to a word (cvt.rn.f16x2 / bf16x2).
// Sums stay float, added in the packs kernel's order.  bfloat16 maxima beyond
// 2^126 (M would overflow) take (x - m) log2(e) instead, per thread.
template <typename T> struct WordMath;
// (Before sm_80, which lacks the packed max and the pair conversions, the same
// results through floats.)
template <> struct WordMath<half_t> {
    static constexpr unsigned int lowest = 0xfc00fc00u;  // -inf, -inf
    static constexpr bool offset_finite = true;          // |m| log2(e) <= 94500 for every finite m
    static __device__ __forceinline__ unsigned int max(unsigned int a, unsigned int b);
    static __device__ __forceinline__ void unpack(unsigned int w, float& lo, float& hi) {
        asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}"
            : "=f"(lo), "=f"(hi) : "r"(w));
    }
    static __device__ __forceinline__ unsigned int pack(float lo, float hi);
};
template <> struct WordMath<bfloat16_t> {
    static constexpr unsigned int lowest = 0xff80ff80u;
    static constexpr bool offset_finite = false;  // m log2(e) overflows beyond ~2.4e38
    static __device__ __forceinline__ unsigned int max(unsigned int a, unsigned int b);
    static __device__ __forceinline__ void unpack(unsigned int w, float& lo, float& hi) {
        lo = __uint_as_float(w << 16);
        hi = __uint_as_float(w & 0xffff0000u);
    }
    static __device__ __forceinline__ unsigned int pack(float lo, float hi);
};
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ unsigned int WordMath<half_t>::max(unsigned int a, unsigned int b) {
    unsigned int r;
    asm("max.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ unsigned int WordMath<half_t>::pack(float lo, float hi) {
    unsigned int r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));  // first source -> upper half
    return r;
}
__device__ __forceinline__ unsigned int WordMath<bfloat16_t>::max(unsigned int a, unsigned int b) {
    unsigned int r;
    asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ unsigned int WordMath<bfloat16_t>::pack(float lo, float hi) {
    unsigned int r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
#else
template <typename T> __device__ __forceinline__ unsigned int pack_through_storage(float lo, float hi) {
    return (unsigned int)store<T>(lo).bits | ((unsigned int)store<T>(hi).bits << 16);
}
template <typename T> __device__ __forceinline__ unsigned int max_through_floats(unsigned int a, unsigned int b) {
    float alo, ahi, blo, bhi;
    WordMath<T>::unpack(a, alo, ahi);
    WordMath<T>::unpack(b, blo, bhi);
    return pack_through_storage<T>(fmaxf(alo, blo), fmaxf(ahi, bhi));  // exact: a max is one of its inputs
}
__device__ __forceinline__ unsigned int WordMath<half_t>::max(unsigned int a, unsigned int b) {
    return max_through_floats<half_t>(a, b);
}
__device__ __forceinline__ unsigned int WordMath<half_t>::pack(float lo, float hi) {
    return pack_through_storage<half_t>(lo, hi);
}
__device__ __forceinline__ unsigned int WordMath<bfloat16_t>::max(unsigned int a, unsigned int b) {
    return max_through_floats<bfloat16_t>(a, b);
}
__device__ __forceinline__ unsigned int WordMath<bfloat16_t>::pack(float lo, float hi) {
    return pack_through_storage<bfloat16_t>(lo, hi);
}
#endif

__device__ __forceinline__ unsigned int& word_of(words4& w, int i) {
    return i == 0 ? w.a : i == 1 ? w.b : i == 2 ? w.c : w.d;
}

// 16-byte copy global -> shared that completes asynchronously (sm_80+; before, a
// plain copy through registers), the commit of the thread's copies as a group, and
// the wait for all of them.
__device__ __forceinline__ void copy16_async(words4* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned int s;
    asm volatile("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(s) : "l"(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
#else
    *smem = *reinterpret_cast<const words4*>(gmem);
#endif
}
__device__ __forceinline__ void copy16_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
__device__ __forceinline__ void copy16_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group 0;" ::: "memory");
#endif
}

// The column max of W words (2 W values) a thread: a butterfly over the lanes
// with the same tx, then the warps' words through shared memory (as
// column_reduce_packs, in words).
template <typename T, int W, int WARPS> __device__ __forceinline__ void column_max_words(unsigned int (&v)[W],
                                                                                         unsigned int* scratch) {
    const int tw = blockDim.x, tx = threadIdx.x;
    const int flat = threadIdx.y * tw + tx;
    const int lane = flat & 31, warp = flat >> 5;
    for (int off = 16; off >= tw; off >>= 1) {
#pragma unroll
        for (int i = 0; i < W; ++i) v[i] = WordMath<T>::max(v[i], __shfl_xor_sync(0xffffffffu, v[i], off));
    }
    column_scratch_exchange(v, scratch, lane, warp, tw, tx);
#pragma unroll
    for (int w = 1; w < WARPS; ++w) {
#pragma unroll
        for (int i = 0; i < W; ++i) v[i] = WordMath<T>::max(v[i], scratch[(w * tw + tx) * W + i]);
    }
}

template <bool B> struct bool_constant { static constexpr bool value = B; };

// Blocks of CHANNEL_WORDS_THREADS (Python), MINB of them an SM (registers capped).
#define CHANNEL_WORDS_THREADS 256
template <typename T, typename index_t, bool LOG, int K, int MINB>
__global__ void __launch_bounds__(CHANNEL_WORDS_THREADS, MINB)
    softmax_forward_channels_words(const T* __restrict__ x, T* __restrict__ y, index_t outer, index_t n,
                                   index_t inner, index_t tiles_per_outer) {
    constexpr int VEC = pack_width<T>::value, W = VEC / 2, WARPS = CHANNEL_WORDS_THREADS / 32;
    constexpr float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;
    __shared__ float scratch[256 * VEC];
    __shared__ words4 staged[K][CHANNEL_WORDS_THREADS];  // this thread's packs of its next tile
    const int flat = threadIdx.y * blockDim.x + threadIdx.x;
    const index_t tiles = outer * tiles_per_outer;
    // Copies of tile t's packs into the thread's own slots (no barrier: only it reads them back).
    auto stage = [&](index_t t) {
        const ColumnPacks<T, index_t, K> col(t, tiles_per_outer, n, inner);
#pragma unroll
        for (int k = 0; k < K; ++k)
            if (col.holds(k)) copy16_async(&staged[k][flat], x + col.base + col.row(k) * inner);
        copy16_commit();
    };
    if ((index_t)blockIdx.x < tiles) stage(blockIdx.x);
    for (index_t t = blockIdx.x; t < tiles; t += (index_t)gridDim.x) {
        const ColumnPacks<T, index_t, K> col(t, tiles_per_outer, n, inner);
        Pack<T, VEC> v[K];
        copy16_wait_all();
#pragma unroll
        for (int k = 0; k < K; ++k)
            if (col.holds(k)) v[k].raw = staged[k][flat];
        unsigned int mw[W];
#pragma unroll
        for (int i = 0; i < W; ++i) mw[i] = WordMath<T>::lowest;
#pragma unroll
        for (int k = 0; k < K; ++k) {
            if (col.holds(k)) {
#pragma unroll
                for (int i = 0; i < W; ++i) mw[i] = WordMath<T>::max(mw[i], word_of(v[k].raw, i));
            }
        }
        // The next tile's copies reuse the slots just read: issued only once the maxima
        // (which consumed every slot read) exist, so no copy can land before its read
        // (PTX orders cp.async after nothing without a wait; the volatile asm keeps the
        // data dependence ahead of the copies' issue).
        asm volatile("" ::"r"(mw[0]), "r"(mw[W - 1]), "r"(mw[W / 2]), "r"(mw[(W - 1) / 2]));
        if (t + (index_t)gridDim.x < tiles) stage(t + (index_t)gridDim.x);  // in flight during this tile
        column_max_words<T, W, WARPS>(mw, reinterpret_cast<unsigned int*>(scratch));
        float m[VEC], offset[VEC], s[VEC];
        bool in_range = true;
#pragma unroll
        for (int i = 0; i < W; ++i) WordMath<T>::unpack(mw[i], m[2 * i], m[2 * i + 1]);
#pragma unroll
        for (int e = 0; e < VEC; ++e) in_range = in_range && !(fabsf(m[e]) > 0x1p126f);
        // The exponent of value x at position e: fast, x log2(e) + offset, offset = -M;
        // else (bfloat16 maxima beyond 2^126) (x - offset) log2(e), offset = m (one
        // array either way: registers).  The per-value passes branch per thread; the
        // column reduction between them stays outside, reached by every thread alike.
        const bool fast = WordMath<T>::offset_finite || in_range;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            offset[e] = fast ? -(m[e] * LOG2E) : m[e];
            s[e] = 0.0f;
        }
        // exp(x - m) of value x at position e, scaled by 2^-M when FAST.
        auto exp_at = [&](auto form, float x, int e) {
            constexpr bool FAST = decltype(form)::value;
            return ex2_approx(FAST ? fmaf(x, LOG2E, offset[e]) : (x - offset[e]) * LOG2E);
        };
        // word(k, i, lo, hi) on the two values of every word of the thread's rows k, then row_done(k).
        auto each_word = [&](auto word, auto row_done) {
#pragma unroll
            for (int k = 0; k < K; ++k) {
                if (col.holds(k)) {
#pragma unroll
                    for (int i = 0; i < W; ++i) {
                        float lo, hi;
                        WordMath<T>::unpack(word_of(v[k].raw, i), lo, hi);
                        word(k, i, lo, hi);
                    }
                    row_done(k);
                }
            }
        };
        auto sum_pass = [&](auto form) {
            each_word([&](int, int i, float lo, float hi) {
                s[2 * i] += exp_at(form, lo, 2 * i);
                s[2 * i + 1] += exp_at(form, hi, 2 * i + 1);
            }, [](int) {});
        };
        auto write_pass = [&](auto form) {
            each_word([&](int k, int i, float lo, float hi) {
                if (LOG) {
                    lo = (lo - m[2 * i]) - s[2 * i];
                    hi = (hi - m[2 * i + 1]) - s[2 * i + 1];
                } else {
                    lo = exp_at(form, lo, 2 * i) * s[2 * i];
                    hi = exp_at(form, hi, 2 * i + 1) * s[2 * i + 1];
                }
                word_of(v[k].raw, i) = WordMath<T>::pack(lo, hi);
            }, [&](int k) { store_pack<T, VEC>(y + col.base + col.row(k) * col.inner, v[k]); });
        };
        if (fast) sum_pass(bool_constant<true>());
        else sum_pass(bool_constant<false>());
        column_reduce_packs<float, VEC, false, WARPS>(s, scratch);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            // log of the true sum = log s + (M - m log2(e)) ln 2, with r = m log2(e) - M
            // exactly (fma); 1 / s for softmax.
            if (LOG) s[e] = fast ? logf(s[e]) - fmaf(m[e], LOG2E, offset[e]) * LN2 : logf(s[e]);
            else s[e] = rcp_approx(s[e]);
        }
        if (fast) write_pass(bool_constant<true>());
        else write_pass(bool_constant<false>());
    }
}

// ---- float forward with fewer instructions a value (notes/chsoftf32.md) -------------
//
// softmax_forward_channels_floats: the *_channels_packs forward for float
// (Python: FLOAT_FORWARD), same tiles and mapping (blockDim (TW, CY), 256
// threads, K packs of 4 inner positions a thread, every load issued before any
// math), with the compute between a tile's loads and its stores cut from ~1380
// to ~570 (softmax) / ~660 (log-softmax) SASS instructions a thread, so that the
// block is back to loading sooner:
//  - rows a thread does not hold are -inf in registers (they add nothing to the
//    max or the sum), so the max and exp passes run over all K slots without a
//    per-slot branch; only the loads and stores test the row;
//  - one pass after the max: c = x - m, d = exp(c) into the sum, the slot keeps d
//    (softmax) or c (log-softmax: y = c - log s, m no longer live);
//  - EXP2: d = ex2.approx(c log2(e)) (2 ulp, as expf; one FMUL + MUFU against
//    expf's ~9 instructions) and 1 / s = rcp.approx and one Newton step (the IEEE
//    division has a slow-path branch); EXP2 false: expf and the IEEE division,
//    bitwise the packs kernel's results (the sums are added in its order);
//  - the column reductions over a constant 8 warps (unrolled), addresses as
//    index_t offsets from one base (first row + k rows of threads);
//  - MINB blocks an SM (registers capped: K 8, MINB 3 -> 80, no spills; MINB 4 -> 64,
//    spills; K 16 (tiles 16 threads wide, 64 KB), MINB 2 -> 110-126);
//  - STREAM: the stores with .cs (evict first: y is not read again here).
#define CHANNEL_FLOATS_THREADS 256
template <bool STREAM> __device__ __forceinline__ void store_floats(float* p, const Pack<float, 4>& v) {
    if (STREAM) {
        asm volatile("st.global.cs.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.v[0]), "f"(v.v[1]), "f"(v.v[2]),
                     "f"(v.v[3])
                     : "memory");
    } else {
        store_pack<float, 4>(p, v);
    }
}

template <typename T, typename index_t, bool LOG, int K, int MINB, bool EXP2, bool STREAM>
__global__ void __launch_bounds__(CHANNEL_FLOATS_THREADS, MINB)
    softmax_forward_channels_floats(const T* __restrict__ x, T* __restrict__ y, index_t outer, index_t n,
                                    index_t inner, index_t tiles_per_outer) {
    static_assert(sizeof(T) == sizeof(float), "float only");
    constexpr int VEC = 4, WARPS = CHANNEL_FLOATS_THREADS / 32;
    constexpr float LOG2E = 1.4426950408889634f;
    __shared__ float scratch[256 * VEC];
    const index_t tiles = outer * tiles_per_outer;
    for (index_t t = blockIdx.x; t < tiles; t += (index_t)gridDim.x) {
        const ColumnPacks<float, index_t, K> col(t, tiles_per_outer, n, inner);
        const index_t first = col.base + (index_t)threadIdx.y * inner, stride = (index_t)blockDim.y * inner;
        Pack<float, VEC> v[K];
#pragma unroll
        for (int k = 0; k < K; ++k) {
            if (col.holds(k)) {
                v[k] = load_pack<float, VEC>(x + (first + k * stride));
            } else {
#pragma unroll
                for (int e = 0; e < VEC; ++e) v[k].v[e] = negative_infinity<float>();
            }
        }
        float m[VEC], s[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) m[e] = negative_infinity<float>(), s[e] = 0.0f;
#pragma unroll
        for (int k = 0; k < K; ++k) {
#pragma unroll
            for (int e = 0; e < VEC; ++e) m[e] = fmaxf(m[e], v[k].v[e]);  // a NaN poisons the sum below
        }
        column_reduce_packs<float, VEC, true, WARPS>(m, scratch);
        // One pass: d = exp(x - m) into s; the slot keeps d (softmax) or x - m (log-softmax).
#pragma unroll
        for (int k = 0; k < K; ++k) {
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const float c = v[k].v[e] - m[e];
                const float d = EXP2 ? ex2_approx(c * LOG2E) : expf(c);
                s[e] += d;
                v[k].v[e] = LOG ? c : d;
            }
        }
        column_reduce_packs<float, VEC, false, WARPS>(s, scratch);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            // log s, or 1 / s (EXP2: rcp.approx and one Newton step, within an ulp).
            if (LOG) {
                s[e] = logf(s[e]);
            } else if (EXP2) {
                const float r = rcp_approx(s[e]);
                s[e] = fmaf(r, fmaf(-s[e], r, 1.0f), r);
            } else {
                s[e] = 1.0f / s[e];
            }
        }
#pragma unroll
        for (int k = 0; k < K; ++k) {
            if (col.holds(k)) {
                Pack<float, VEC> out;
#pragma unroll
                for (int e = 0; e < VEC; ++e) out.v[e] = LOG ? v[k].v[e] - s[e] : v[k].v[e] * s[e];
                store_floats<STREAM>(y + (first + k * stride), out);
            }
        }
    }
}

template <typename T, typename index_t, bool LOG, int K>
__global__ void __launch_bounds__(CHANNEL_PACK_THREADS) softmax_backward_channels_packs(const T* __restrict__ dy,
                                                                                  const T* __restrict__ y,
                                                                                  T* __restrict__ dx, index_t outer,
                                                                                  index_t n, index_t inner,
                                                                                  index_t tiles_per_outer) {
    typedef acc_t<T> A;
    constexpr int VEC = pack_width<T>::value;
    __shared__ A scratch[256 * VEC];
    const index_t tiles = outer * tiles_per_outer;
    for (index_t t = blockIdx.x; t < tiles; t += (index_t)gridDim.x) {
        const ColumnPacks<T, index_t, K> col(t, tiles_per_outer, n, inner);
        Pack<T, VEC> g[K], w[K];
        col.read(g, dy, w, y);
        A sum[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) sum[e] = A(0);
        col.each([&](int k, int e) { sum[e] += backward_term<A, LOG>(load(g[k].v[e]), load(w[k].v[e])); });
        column_reduce_packs<A, VEC, false>(sum, scratch);
        col.write(dx, [&](int k, int e) { return backward_value<T, LOG>(load(g[k].v[e]), load(w[k].v[e]), sum[e]); });
    }
}
