// 2-D max and average pooling, forward and backward, NCHW and NHWC.
//
// Forward: one thread per output element (grid-stride loop) scans its window's
// real input elements in row-major order.  Padding never enters a maximum;
// average pooling divides by PyTorch's divisor (see dnnprims/reference/pooling.py).
//
// Backward: one thread per *input* element gathers from every output window
// that contains it, so no atomics are needed and the result is deterministic
// (the same summation order on every run).  Max pooling stores no indices: the
// thread recomputes each covering window's argmax with the forward rule (first
// maximum in row-major order; a NaN always wins, so the last NaN) and takes the
// window's gradient only if the argmax is itself.  With a k x k window and
// stride s that is about (k/s)^2 windows of k^2 loads per input element --
// correct for any overlap.  These general kernels serve NHWC and NCHW planes
// too wide for the row tiles; the NCHW fast paths are further down.
//
// In NHWC consecutive threads handle consecutive channels of one pixel, so the
// loads of a warp are coalesced in both layouts.
#include "common.cuh"

template <typename index_t, bool NHWC>
struct Layout4 {
    // Element offset of (n, c, h, w) in a tensor with C channels of H x W.
    static __device__ __forceinline__ index_t offset(index_t n, index_t c, index_t h, index_t w,
                                                     index_t C, index_t H, index_t W) {
        return NHWC ? ((n * H + h) * W + w) * C + c : ((n * C + c) * H + h) * W + w;
    }
    // Coordinates of flat element i, in the layout's own order.
    static __device__ __forceinline__ void split(index_t i, index_t C, index_t H, index_t W,
                                                 index_t& n, index_t& c, index_t& h, index_t& w) {
        if (NHWC) {
            c = i % C; i /= C;
            w = i % W; i /= W;
            h = i % H; n = i / H;
        } else {
            w = i % W; i /= W;
            h = i % H; i /= H;
            c = i % C; n = i / C;
        }
    }
};

template <typename index_t>
__device__ __forceinline__ index_t imin(index_t a, index_t b) { return a < b ? a : b; }
template <typename index_t>
__device__ __forceinline__ index_t imax(index_t a, index_t b) { return a > b ? a : b; }

// Offset of the element max pooling selects in the window rows [h0, h1) x
// columns [w0, w1) (already clipped to the input), and its value in `best`.
template <typename T, typename index_t, bool NHWC>
__device__ __forceinline__ index_t window_argmax(const T* __restrict__ x, index_t n, index_t c,
                                                 index_t h0, index_t h1, index_t w0, index_t w1,
                                                 index_t C, index_t H, index_t W, acc_t<T>& best) {
    typedef Layout4<index_t, NHWC> L;
    acc_t<T> m = negative_infinity<acc_t<T>>();
    index_t arg = L::offset(n, c, h0, w0, C, H, W);
    for (index_t h = h0; h < h1; ++h) {
        for (index_t w = w0; w < w1; ++w) {
            const index_t off = L::offset(n, c, h, w, C, H, W);
            const acc_t<T> v = load(x[off]);
            if (v > m || v != v) {  // v != v: NaN wins, as in PyTorch
                m = v;
                arg = off;
            }
        }
    }
    best = m;
    return arg;
}

// PyTorch's average-pooling divisor for the window starting at (hs, ws).
template <typename index_t>
__device__ __forceinline__ index_t avg_divisor(index_t hs, index_t ws, index_t kh, index_t kw,
                                               index_t H, index_t W, index_t ph, index_t pw,
                                               int count_include_pad) {
    if (count_include_pad) {
        return (imin(hs + kh, H + ph) - hs) * (imin(ws + kw, W + pw) - ws);
    }
    return (imin(hs + kh, H) - imax(hs, index_t(0))) * (imin(ws + kw, W) - imax(ws, index_t(0)));
}

#define POOL_PARAMS                                                                  \
    index_t N, index_t C, index_t H, index_t W, index_t Ho, index_t Wo, index_t kh, \
        index_t kw, index_t sh, index_t sw, index_t ph, index_t pw

#define GRID_STRIDE_LOOP(i, total)                                              \
    for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < (total); \
         i += (index_t)blockDim.x * gridDim.x)

template <typename T, typename index_t, bool NHWC>
__global__ void pool_max_forward(const T* __restrict__ x, T* __restrict__ y, POOL_PARAMS) {
    typedef Layout4<index_t, NHWC> L;
    const index_t total = N * C * Ho * Wo;
    GRID_STRIDE_LOOP(i, total) {
        index_t n, c, oh, ow;
        L::split(i, C, Ho, Wo, n, c, oh, ow);
        const index_t hs = oh * sh - ph, ws = ow * sw - pw;
        acc_t<T> best;
        window_argmax<T, index_t, NHWC>(x, n, c, imax(hs, index_t(0)), imin(hs + kh, H),
                                        imax(ws, index_t(0)), imin(ws + kw, W), C, H, W, best);
        y[i] = store<T>(best);
    }
}

template <typename T, typename index_t, bool NHWC>
__global__ void pool_avg_forward(const T* __restrict__ x, T* __restrict__ y, POOL_PARAMS,
                                 int count_include_pad) {
    typedef Layout4<index_t, NHWC> L;
    const index_t total = N * C * Ho * Wo;
    GRID_STRIDE_LOOP(i, total) {
        index_t n, c, oh, ow;
        L::split(i, C, Ho, Wo, n, c, oh, ow);
        const index_t hs = oh * sh - ph, ws = ow * sw - pw;
        const index_t h1 = imin(hs + kh, H), w1 = imin(ws + kw, W);
        acc_t<T> sum = 0;
        for (index_t h = imax(hs, index_t(0)); h < h1; ++h) {
            for (index_t w = imax(ws, index_t(0)); w < w1; ++w) {
                sum += load(x[L::offset(n, c, h, w, C, H, W)]);
            }
        }
        const index_t divisor = avg_divisor(hs, ws, kh, kw, H, W, ph, pw, count_include_pad);
        y[i] = store<T>(sum / acc_t<T>(divisor));
    }
}

// Range [lo, hi] of output positions whose window covers input position h.
template <typename index_t>
__device__ __forceinline__ void covering_outputs(index_t h, index_t k, index_t s, index_t p,
                                                 index_t out, index_t& lo, index_t& hi) {
    const index_t a = h + p - k;  // window oh covers h iff oh*s - p <= h < oh*s - p + k
    lo = a < 0 ? index_t(0) : a / s + 1;
    hi = imin((h + p) / s, out - 1);
}

template <typename T, typename index_t, bool NHWC>
__global__ void pool_max_backward(const T* __restrict__ x, const T* __restrict__ dy,
                                  T* __restrict__ dx, POOL_PARAMS) {
    typedef Layout4<index_t, NHWC> L;
    const index_t total = N * C * H * W;
    GRID_STRIDE_LOOP(i, total) {
        index_t n, c, h, w;
        L::split(i, C, H, W, n, c, h, w);
        index_t oh_lo, oh_hi, ow_lo, ow_hi;
        covering_outputs(h, kh, sh, ph, Ho, oh_lo, oh_hi);
        covering_outputs(w, kw, sw, pw, Wo, ow_lo, ow_hi);
        acc_t<T> grad = 0;
        for (index_t oh = oh_lo; oh <= oh_hi; ++oh) {
            const index_t hs = oh * sh - ph;
            for (index_t ow = ow_lo; ow <= ow_hi; ++ow) {
                const index_t ws = ow * sw - pw;
                acc_t<T> best;
                const index_t arg = window_argmax<T, index_t, NHWC>(
                    x, n, c, imax(hs, index_t(0)), imin(hs + kh, H), imax(ws, index_t(0)),
                    imin(ws + kw, W), C, H, W, best);
                if (arg == i) grad += load(dy[L::offset(n, c, oh, ow, C, Ho, Wo)]);
            }
        }
        dx[i] = store<T>(grad);
    }
}

template <typename T, typename index_t, bool NHWC>
__global__ void pool_avg_backward(const T* __restrict__ x, const T* __restrict__ dy,
                                  T* __restrict__ dx, POOL_PARAMS, int count_include_pad) {
    typedef Layout4<index_t, NHWC> L;
    const index_t total = N * C * H * W;
    GRID_STRIDE_LOOP(i, total) {
        index_t n, c, h, w;
        L::split(i, C, H, W, n, c, h, w);
        index_t oh_lo, oh_hi, ow_lo, ow_hi;
        covering_outputs(h, kh, sh, ph, Ho, oh_lo, oh_hi);
        covering_outputs(w, kw, sw, pw, Wo, ow_lo, ow_hi);
        acc_t<T> grad = 0;
        for (index_t oh = oh_lo; oh <= oh_hi; ++oh) {
            const index_t hs = oh * sh - ph;
            for (index_t ow = ow_lo; ow <= ow_hi; ++ow) {
                const index_t ws = ow * sw - pw;
                const index_t divisor = avg_divisor(hs, ws, kh, kw, H, W, ph, pw, count_include_pad);
                grad += load(dy[L::offset(n, c, oh, ow, C, Ho, Wo)]) / acc_t<T>(divisor);
            }
        }
        dx[i] = store<T>(grad);
    }
}

// ---------------------------------------------------------------------------
// NCHW fast paths (issue 5).
//
// Row tiles.  In NCHW, a run of whole rows of one (n, c) plane is one
// contiguous segment of memory, so a block stages the input rows its tile
// needs in shared memory with coalesced 16-byte loads (copy_rows), then
// computes from shared memory: each input byte is read from DRAM about once
// (plus the k - s halo rows between tiles), however much the windows overlap.
// One block per (plane, tile) item, grid-stride over items; Python picks the
// tile height so the staged rows fit the shared-memory budget (else the
// general kernels above run).
//
// Forward (pool_forward_nchw_tiled): a tile is `tile_rows` output rows; one
// thread per output of the tile.
//
// Backward (pool_backward_nchw_tiled): a tile is `tile_rows` *input* rows,
// so every dx element is written by exactly one thread (no atomics; the same
// summation order as the general kernel: covering windows in row-major
// order).  Phase 1 computes, once per covering output window, the argmax
// (max; as a plane offset h * W + w) and its dy -- or dy / divisor (avg) --
// into shared memory; phase 2 is one thread per input element gathering from
// its at most ceil(k/s)^2 windows.  The argmax is thus computed once per
// window, not once per (window, input) pair.
//
// Global (pool_global_*): window = the whole plane (H x W, no padding): one
// warp per plane, lane-strided coalesced reads, a shuffle reduction.  For max
// the reduction carries (value, position) and merges with the sequential
// rule's outcome (the last NaN if any, else the first maximum), so it selects
// exactly the element the row-major scan would.

// Stage `count` consecutive elements starting at src into rows[0, count) (as A).
template <typename T>
__device__ __forceinline__ void copy_rows(const T* __restrict__ src, int count, acc_t<T>* rows) {
    constexpr int VEC = 16 / sizeof(T);
    struct alignas(16) Vec { T v[VEC]; };
    const int misalign = (int)(((unsigned long long)src & 15ull) / sizeof(T));
    int head = misalign ? VEC - misalign : 0;
    if ((((unsigned long long)src) % sizeof(T)) != 0) head = count;  // never for real arrays
    head = head < count ? head : count;
    for (int e = threadIdx.x; e < head; e += blockDim.x) rows[e] = load(src[e]);
    const int vectors = (count - head) / VEC;
    const Vec* vsrc = reinterpret_cast<const Vec*>(src + head);
#pragma unroll 4
    for (int i = threadIdx.x; i < vectors; i += blockDim.x) {
        const Vec v = vsrc[i];
#pragma unroll
        for (int k = 0; k < VEC; ++k) rows[head + i * VEC + k] = load(v.v[k]);
    }
    for (int e = head + vectors * VEC + threadIdx.x; e < count; e += blockDim.x) rows[e] = load(src[e]);
}

// Threads of a tiled block as a (rows x cols) grid over a tile of `width`
// columns: no per-element division.  Threads past rows * cols idle.
struct ThreadGrid {
    int cols, rows, col, row;
    __device__ __forceinline__ ThreadGrid(int width) {
        cols = min(width, (int)blockDim.x);
        rows = blockDim.x / cols;
        col = threadIdx.x % cols;
        row = threadIdx.x / cols;
    }
};

template <typename T, typename index_t, bool MAX>
__global__ void pool_forward_nchw_tiled(const T* __restrict__ x, T* __restrict__ y, POOL_PARAMS,
                                        int count_include_pad, int tile_rows, int tiles,
                                        index_t items) {
    typedef acc_t<T> A;
    extern __shared__ __align__(16) unsigned char pool_smem[];
    A* rows = reinterpret_cast<A*>(pool_smem);
    const int iH = (int)H, iW = (int)W, iWo = (int)Wo;
    const int ikh = (int)kh, ikw = (int)kw, ish = (int)sh, isw = (int)sw, iph = (int)ph, ipw = (int)pw;
    const ThreadGrid g(iWo);
    for (index_t item = blockIdx.x; item < items; item += gridDim.x) {
        const index_t plane = item / tiles;
        const int tile = (int)(item - plane * tiles);
        const int oh0 = tile * tile_rows;
        const int oh1 = min(oh0 + tile_rows, (int)Ho);
        const int ha = max(oh0 * ish - iph, 0);
        const int hb = min((oh1 - 1) * ish - iph + ikh, iH);
        __syncthreads();  // the previous item's reads of rows are done
        copy_rows(x + plane * H * W + (index_t)ha * W, (hb - ha) * iW, rows);
        __syncthreads();
        if (g.row >= g.rows) continue;
        T* yp = y + plane * Ho * Wo;
        for (int oh = oh0 + g.row; oh < oh1; oh += g.rows) {
            const int hs = oh * ish - iph;
            const int h0 = max(hs, 0), h1 = min(hs + ikh, iH);
            for (int ow = g.col; ow < iWo; ow += g.cols) {
                const int ws = ow * isw - ipw;
                const int w0 = max(ws, 0), w1 = min(ws + ikw, iW);
                A r = MAX ? negative_infinity<A>() : A(0);
                for (int h = h0; h < h1; ++h) {
                    const A* row = rows + (h - ha) * iW;
                    for (int w = w0; w < w1; ++w) {
                        const A v = row[w];
                        if (MAX) {
                            if (v > r || v != v) r = v;
                        } else {
                            r += v;
                        }
                    }
                }
                if (!MAX) {
                    r = r / A(avg_divisor<int>(hs, ws, ikh, ikw, iH, iW, iph, ipw, count_include_pad));
                }
                yp[(index_t)oh * Wo + ow] = store<T>(r);
            }
        }
    }
}

// Shared memory: [x rows (max only)] [dy per window] [argmax per window (max
// only)] [covering output range per tile row] [covering output range per column].
template <typename T, typename index_t, bool MAX>
__global__ void pool_backward_nchw_tiled(const T* __restrict__ x, const T* __restrict__ dy,
                                         T* __restrict__ dx, POOL_PARAMS, int count_include_pad,
                                         int tile_rows, int tiles, index_t items, int max_x_rows,
                                         int max_windows) {
    typedef acc_t<T> A;
    extern __shared__ __align__(16) unsigned char pool_smem[];
    A* rows = reinterpret_cast<A*>(pool_smem);
    A* grads = rows + (MAX ? max_x_rows * (int)W : 0);
    int* args = reinterpret_cast<int*>(grads + max_windows);
    const unsigned ranges = ((unsigned)((unsigned char*)(args + (MAX ? max_windows : 0)) - pool_smem) + 7u) & ~7u;
    int2* row_range = reinterpret_cast<int2*>(pool_smem + ranges);  // 8-byte aligned
    int2* col_range = row_range + tile_rows;
    const int iH = (int)H, iW = (int)W, iHo = (int)Ho, iWo = (int)Wo;
    const int ikh = (int)kh, ikw = (int)kw, ish = (int)sh, isw = (int)sw, iph = (int)ph, ipw = (int)pw;
    for (int w = threadIdx.x; w < iW; w += blockDim.x) {
        int lo, hi;
        covering_outputs<int>(w, ikw, isw, ipw, iWo, lo, hi);
        col_range[w] = make_int2(lo, hi);
    }
    const ThreadGrid gw(iWo), gi(iW);
    for (index_t item = blockIdx.x; item < items; item += gridDim.x) {
        const index_t plane = item / tiles;
        const int tile = (int)(item - plane * tiles);
        const int h0 = tile * tile_rows;
        const int h1 = min(h0 + tile_rows, iH);
        int oa, ob, unused;
        covering_outputs<int>(h0, ikh, ish, iph, iHo, oa, unused);
        covering_outputs<int>(h1 - 1, ikh, ish, iph, iHo, unused, ob);
        int xa = 0;
        __syncthreads();  // the previous item's reads of shared memory are done
        for (int r = threadIdx.x; r < h1 - h0; r += blockDim.x) {
            int lo, hi;
            covering_outputs<int>(h0 + r, ikh, ish, iph, iHo, lo, hi);
            row_range[r] = make_int2(lo, hi);
        }
        if (MAX && ob >= oa) {
            xa = max(oa * ish - iph, 0);
            const int xb = min(ob * ish - iph + ikh, iH);
            copy_rows(x + plane * H * W + (index_t)xa * W, (xb - xa) * iW, rows);
            __syncthreads();
        }
        const T* dyp = dy + plane * Ho * Wo;
        if (gw.row < gw.rows) {
            for (int oh = oa + gw.row; oh <= ob; oh += gw.rows) {
                const int hs = oh * ish - iph;
                const int wh0 = max(hs, 0), wh1 = min(hs + ikh, iH);
                const int base = (oh - oa) * iWo;
                for (int ow = gw.col; ow < iWo; ow += gw.cols) {
                    const int ws = ow * isw - ipw;
                    const A gv = load(dyp[(index_t)oh * Wo + ow]);
                    if (MAX) {
                        const int ww0 = max(ws, 0), ww1 = min(ws + ikw, iW);
                        A m = negative_infinity<A>();
                        int arg = wh0 * iW + ww0;
                        for (int h = wh0; h < wh1; ++h) {
                            const A* row = rows + (h - xa) * iW;
                            for (int w = ww0; w < ww1; ++w) {
                                const A v = row[w];
                                if (v > m || v != v) {
                                    m = v;
                                    arg = h * iW + w;
                                }
                            }
                        }
                        args[base + ow] = arg;
                        grads[base + ow] = gv;
                    } else {
                        grads[base + ow] = gv / A(avg_divisor<int>(hs, ws, ikh, ikw, iH, iW, iph, ipw,
                                                                   count_include_pad));
                    }
                }
            }
        }
        __syncthreads();
        if (gi.row >= gi.rows) continue;
        T* dxp = dx + plane * H * W;
        for (int h = h0 + gi.row; h < h1; h += gi.rows) {
            const int2 hr = row_range[h - h0];
            for (int w = gi.col; w < iW; w += gi.cols) {
                const int2 wr = col_range[w];
                const int self = h * iW + w;
                A grad = 0;
                for (int oh = hr.x; oh <= hr.y; ++oh) {
                    const int base = (oh - oa) * iWo;
                    for (int ow = wr.x; ow <= wr.y; ++ow) {
                        if (!MAX || args[base + ow] == self) grad += grads[base + ow];
                    }
                }
                dxp[(index_t)h * W + w] = store<T>(grad);
            }
        }
    }
}

// (value, position) of the sequential max scan's pick from two disjoint
// subsets; position -1 means "no element above -inf seen yet".
template <typename A>
__device__ __forceinline__ void merge_argmax(A& m, int& arg, A om, int oarg) {
    const bool nan = m != m, onan = om != om;
    bool take;
    if (nan || onan) {
        take = onan && (!nan || oarg > arg);
    } else if (arg < 0 || oarg < 0) {
        take = arg < 0 && oarg >= 0;
    } else {
        take = om > m || (om == m && oarg < arg);
    }
    if (take) {
        m = om;
        arg = oarg;
    }
}

// One warp per plane; (value, position) over the plane as the row-major scan picks it.
template <typename T, typename index_t, bool MAX>
__device__ __forceinline__ acc_t<T> warp_plane_reduce(const T* __restrict__ p, int count, int& arg) {
    typedef acc_t<T> A;
    const int lane = threadIdx.x & 31;
    A r = MAX ? negative_infinity<A>() : A(0);
    int pos = -1;
    for (int e = lane; e < count; e += 32) {
        const A v = load(p[e]);
        if (MAX) {
            if (v > r || v != v) {
                r = v;
                pos = e;
            }
        } else {
            r += v;
        }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const A o = __shfl_xor_sync(0xffffffffu, r, offset);
        if (MAX) {
            merge_argmax(r, pos, o, __shfl_xor_sync(0xffffffffu, pos, offset));
        } else {
            r += o;
        }
    }
    arg = pos < 0 ? 0 : pos;  // all -inf: the first element, as the scan
    return r;
}

template <typename T, typename index_t, bool MAX>
__global__ void pool_global_forward(const T* __restrict__ x, T* __restrict__ y, index_t planes,
                                    int count) {
    typedef acc_t<T> A;
    const index_t warps = (index_t)gridDim.x * (blockDim.x >> 5);
    for (index_t plane = (index_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); plane < planes;
         plane += warps) {
        int arg;
        A r = warp_plane_reduce<T, index_t, MAX>(x + plane * count, count, arg);
        if ((threadIdx.x & 31) == 0) y[plane] = store<T>(MAX ? r : r / A(count));
    }
}

template <typename T, typename index_t, bool MAX>
__global__ void pool_global_backward(const T* __restrict__ x, const T* __restrict__ dy,
                                     T* __restrict__ dx, index_t planes, int count) {
    typedef acc_t<T> A;
    const index_t warps = (index_t)gridDim.x * (blockDim.x >> 5);
    const int lane = threadIdx.x & 31;
    for (index_t plane = (index_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); plane < planes;
         plane += warps) {
        int arg = -1;
        if (MAX) warp_plane_reduce<T, index_t, true>(x + plane * count, count, arg);
        const A g = load(dy[plane]);
        T* p = dx + plane * count;
        if (MAX) {
            const T zero = store<T>(A(0));
            for (int e = lane; e < count; e += 32) p[e] = e == arg ? store<T>(g) : zero;
        } else {
            const T v = store<T>(g / A(count));
            for (int e = lane; e < count; e += 32) p[e] = v;
        }
    }
}
