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

// N consecutive elements as one aligned (vector) access.
template <typename T, int N>
struct alignas(sizeof(T) * N) PackN {
    T v[N];
};

template <typename T, int N>
__device__ __forceinline__ PackN<T, N> load_pack(const T* p) {
    return *reinterpret_cast<const PackN<T, N>*>(p);
}


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

// One thread per input element: dx[i] gathers dy of every output window that
// covers element i, in row-major window order; for max only where the window's
// argmax (recomputed from x) is i, for average divided by the window's divisor.
template <typename T, typename index_t, bool NHWC, bool MAX>
__device__ __forceinline__ void gather_backward(const T* __restrict__ x, const T* __restrict__ dy,
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
                const acc_t<T> g = load(dy[L::offset(n, c, oh, ow, C, Ho, Wo)]);
                if (MAX) {
                    acc_t<T> best;
                    const index_t arg = window_argmax<T, index_t, NHWC>(
                        x, n, c, imax(hs, index_t(0)), imin(hs + kh, H), imax(ws, index_t(0)),
                        imin(ws + kw, W), C, H, W, best);
                    if (arg == i) grad += g;
                } else {
                    grad += g / acc_t<T>(avg_divisor(hs, ws, kh, kw, H, W, ph, pw, count_include_pad));
                }
            }
        }
        dx[i] = store<T>(grad);
    }
}

template <typename T, typename index_t, bool NHWC>
__global__ void pool_max_backward(const T* __restrict__ x, const T* __restrict__ dy,
                                  T* __restrict__ dx, POOL_PARAMS) {
    gather_backward<T, index_t, NHWC, true>(x, dy, dx, N, C, H, W, Ho, Wo, kh, kw, sh, sw, ph, pw, 0);
}

template <typename T, typename index_t, bool NHWC>
__global__ void pool_avg_backward(const T* __restrict__ x, const T* __restrict__ dy,
                                  T* __restrict__ dx, POOL_PARAMS, int count_include_pad) {
    gather_backward<T, index_t, NHWC, false>(x, dy, dx, N, C, H, W, Ho, Wo, kh, kw, sh, sw, ph, pw,
                                             count_include_pad);
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
// direct kernels at the end of the file run).  Since v3 only the backward is
// tiled: the forward runs the direct rows kernels (the tiled forward measured
// no faster: 0.138 vs 0.150 ms on max3x3s2_big, and slower for average pooling).
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

// Global average pooling of small planes (count <= GLOBAL_SMALL_COUNT, e.g.
// ResNet's 7x7): one warp per plane would leave most lanes idle and keep only
// two loads in flight per warp.  Instead a block stages GLOBAL_SMALL_PLANES
// consecutive planes -- one contiguous run of memory -- into shared memory
// with coalesced 16-byte loads (when the run is aligned; 4 unrolled per
// thread, so several are in flight) spread over all its threads, then two
// threads sum one plane from shared memory (even / odd positions, one shuffle:
// half the dependent chain of one thread per plane; thread t reads
// tile[(t/2) * count + e]: for odd count the lanes' reads spread over the banks).
// Not for double (the tile is float).
#define GLOBAL_SMALL_COUNT 64
#define GLOBAL_SMALL_PLANES 128

template <typename T, typename index_t>
__global__ void __launch_bounds__(256)
pool_global_avg_forward_small(const T* __restrict__ x, T* __restrict__ y, index_t planes, int count) {
    static_assert(sizeof(acc_t<T>) == 4, "float accumulation only");
    constexpr int VEC = 16 / sizeof(T);
    __shared__ float tile[GLOBAL_SMALL_PLANES * GLOBAL_SMALL_COUNT];
    for (index_t first = (index_t)blockIdx.x * GLOBAL_SMALL_PLANES; first < planes;
         first += (index_t)gridDim.x * GLOBAL_SMALL_PLANES) {
        const int here = (int)(planes - first < GLOBAL_SMALL_PLANES ? planes - first : GLOBAL_SMALL_PLANES);
        const int n = here * count;
        const T* src = x + first * count;
        int done = 0;
        if ((((unsigned long long)src) & 15ull) == 0) {
            const int vectors = n / VEC;
            const PackN<T, VEC>* vsrc = reinterpret_cast<const PackN<T, VEC>*>(src);
#pragma unroll 4
            for (int i = threadIdx.x; i < vectors; i += blockDim.x) {
                const PackN<T, VEC> pk = vsrc[i];
#pragma unroll
                for (int k = 0; k < VEC; ++k) tile[i * VEC + k] = load(pk.v[k]);
            }
            done = vectors * VEC;
        }
        for (int i = done + threadIdx.x; i < n; i += blockDim.x) tile[i] = load(src[i]);
        __syncthreads();
        // blockDim.x == 2 * GLOBAL_SMALL_PLANES (Python launches 256 threads)
        const int p = threadIdx.x >> 1, half = threadIdx.x & 1;
        float r = 0.f;
        if (p < here) {
            const float* t = tile + p * count;
            for (int e = half; e < count; e += 2) r += t[e];
        }
        r += __shfl_xor_sync(0xffffffffu, r, 1);
        if (p < here && half == 0) y[first + p] = store<T>(r / float(count));
        __syncthreads();  // the tile is rewritten by the next round
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

// Global average backward (pool_global_avg_backward_flat): dx = dy[plane] /
// count over each plane.  One warp per plane (pool_global_backward) leaves
// most lanes idle on 7x7 planes and stores 4 bytes a lane; here a thread
// writes VEC consecutive elements of dx with one 16-byte store (the run may
// span planes: the divisions happen once per thread, then a counter walks the
// plane boundary), so the kernel is bound by dx's bytes alone.  Needs a
// 16-byte aligned dx; the last thread stores its tail element by element.
template <typename T, typename index_t>
__global__ void __launch_bounds__(256)
pool_global_avg_backward_flat(const T* __restrict__ /* x: not needed */, const T* __restrict__ dy,
                              T* __restrict__ dx, index_t vectors, index_t total, int count) {
    typedef acc_t<T> A;
    constexpr int VEC = 16 / sizeof(T);
    for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < vectors;
         i += (index_t)blockDim.x * gridDim.x) {
        const index_t e0 = i * VEC;
        index_t plane = e0 / count;
        int off = (int)(e0 - plane * count);
        A g = load(dy[plane]) / A(count);
        PackN<T, VEC> pk;
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            if (off == count) {  // the next plane starts here
                off = 0;
                ++plane;
                if (e0 + v < total) g = load(dy[plane]) / A(count);
            }
            pk.v[v] = store<T>(g);
            ++off;
        }
        if (e0 + VEC <= total) {
            *reinterpret_cast<PackN<T, VEC>*>(dx + e0) = pk;
        } else {
#pragma unroll
            for (int v = 0; v < VEC; ++v)
                if (e0 + v < total) dx[e0 + v] = pk.v[v];
        }
    }
}

// ---------------------------------------------------------------------------
// Direct paths (issue 5, v3): no shared memory, the overlap re-read comes from
// L1/L2.  Used for NCHW planes below 2^31 elements and for NHWC.
//
// Max pooling backward with overlapping windows runs in two launches: the
// forward kernel writes, per output window, the *window-local* position of its
// argmax as one byte ((h - hs) * kw + (w - ws), so kh * kw <= 256) and no y;
// the backward gathers, per input element, over its covering windows, adding
// dy where the window's byte names the element.  The extra traffic is 2 bytes
// per output (1/8 of y in float32), instead of recomputing each covering
// window's argmax (9 x 4 loads per input for 3x3 stride 2).  Without overlap
// (stride >= window) an input has at most one covering window and the backward
// recomputes that window's argmax from x (one launch, no byte workspace).  The
// gather is deterministic: covering windows in row-major order, no atomics.
//
// Measured (H100, notes/mem_poolbn.md): NCHW forward 0.57-0.58 of copy for
// max 3x3/2 (float16 0.25: instruction-bound, scalar 2-byte loads), 0.93 for
// average 2x2/2; NHWC max forward 0.80 (16-byte loads).  The NCHW backward
// gather (argmax bytes or recompute) measured slower than the row tiles
// (0.58 vs 0.37 ms on max3x3s2_big: one dependent load chain per element), so
// Python prefers the tiles and keeps this as the fallback when a tile does not fit.
//
// NCHW (pool_rows_*): a group of S lanes (S = 4..32, a power of two >= the
// row width where possible) handles one output row (forward) or input row
// (backward) of one plane; lanes walk the row's columns, two outputs per lane
// per step (ow and ow + S) so that 2 * kh * kw independent loads are in
// flight per thread; consecutive lanes read input columns stride apart, so a
// warp's loads hit a few cache lines and the window overlap hits L1.  One
// division per row, none per element.  CASE fixes the window and stride at
// compile time for the common shapes (1: 3x3 stride 2, 2: 2x2 stride 2; 0:
// runtime), so the window loops unroll into independent predicated loads.
//
// NHWC (pool_nhwc_*): one thread per (pixel, VEC consecutive channels), VEC =
// 16 / sizeof(T) when C % VEC == 0 and the pointers are 16-byte aligned (else
// 1): each window element is one 16-byte load, coalesced across the warp
// along C.

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack16 {
    T v[VEC];
};

template <int CASE> struct WindowCase { static constexpr int KH = 0, KW = 0, SH = 0, SW = 0; };
template <> struct WindowCase<1> { static constexpr int KH = 3, KW = 3, SH = 2, SW = 2; };
template <> struct WindowCase<2> { static constexpr int KH = 2, KW = 2, SH = 2, SW = 2; };

// The window geometry, with the compile-time values of CASE where it fixes them.
template <int CASE>
struct Geometry {
    int H, W, Ho, Wo, kh, kw, sh, sw, ph, pw;
    __device__ __forceinline__ Geometry(int H_, int W_, int Ho_, int Wo_, int kh_, int kw_, int sh_,
                                        int sw_, int ph_, int pw_)
        : H(H_), W(W_), Ho(Ho_), Wo(Wo_),
          kh(CASE ? WindowCase<CASE>::KH : kh_), kw(CASE ? WindowCase<CASE>::KW : kw_),
          sh(CASE ? WindowCase<CASE>::SH : sh_), sw(CASE ? WindowCase<CASE>::SW : sw_),
          ph(ph_), pw(pw_) {}
};

#define GEOMETRY_PARAMS int H, int W, int Ho, int Wo, int kh, int kw, int sh, int sw, int ph, int pw
#define GEOMETRY_ARGS H, W, Ho, Wo, kh, kw, sh, sw, ph, pw

// Max or sum over the window starting at (hs, ws) of one NCHW plane p; for max
// also the window-local position of the forward rule's pick (first maximum in
// row-major order, the last NaN if any; the first real element if all -inf).
template <typename T, bool MAX, int CASE>
__device__ __forceinline__ acc_t<T> window_reduce(const T* __restrict__ p, const Geometry<CASE>& g,
                                                  int hs, int ws, bool active, int& pos) {
    typedef acc_t<T> A;
    const int h0 = max(hs, 0), w0 = max(ws, 0);
    A r = MAX ? negative_infinity<A>() : A(0);
    pos = (h0 - hs) * g.kw + (w0 - ws);
    if constexpr (CASE != 0) {
        constexpr int KH = WindowCase<CASE>::KH, KW = WindowCase<CASE>::KW;
        A v[KH][KW];
        bool ok[KH][KW];
#pragma unroll
        for (int i = 0; i < KH; ++i)
#pragma unroll
            for (int j = 0; j < KW; ++j) {
                const int h = hs + i, w = ws + j;
                ok[i][j] = active && h >= 0 && h < g.H && w >= 0 && w < g.W;
                v[i][j] = ok[i][j] ? load(p[h * g.W + w]) : A(0);
            }
#pragma unroll
        for (int i = 0; i < KH; ++i)
#pragma unroll
            for (int j = 0; j < KW; ++j) {
                if (!ok[i][j]) continue;
                if (MAX) {
                    if (v[i][j] > r || v[i][j] != v[i][j]) {
                        r = v[i][j];
                        pos = i * KW + j;
                    }
                } else {
                    r += v[i][j];
                }
            }
    } else {
        if (!active) return r;
        const int h1 = min(hs + g.kh, g.H), w1 = min(ws + g.kw, g.W);
        for (int h = h0; h < h1; ++h) {
            const T* row = p + h * g.W;
            for (int w = w0; w < w1; ++w) {
                const A v = load(row[w]);
                if (MAX) {
                    if (v > r || v != v) {
                        r = v;
                        pos = (h - hs) * g.kw + (w - ws);
                    }
                } else {
                    r += v;
                }
            }
        }
    }
    return r;
}

// Lanes of a warp as groups of S = 1 << log2_group lanes, one row per group.
struct LaneGroups {
    int group, col, size;
    long long first, stride;
    __device__ __forceinline__ LaneGroups(int log2_group) {
        size = 1 << log2_group;
        const int lane = threadIdx.x & 31;
        const int per_warp = 32 >> log2_group;
        col = lane & (size - 1);
        group = lane >> log2_group;
        const long long warp = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
        first = warp * per_warp + group;
        stride = (long long)gridDim.x * (blockDim.x >> 5) * per_warp;
    }
};

// y (may be null) and, for max, the window-local argmax byte (may be null).
template <typename T, bool MAX, int CASE>
__global__ void __launch_bounds__(256)
pool_rows_forward(const T* __restrict__ x, T* __restrict__ y, unsigned char* __restrict__ arg,
                  long long rows, GEOMETRY_PARAMS, int count_include_pad, int log2_group) {
    typedef acc_t<T> A;
    const Geometry<CASE> g(GEOMETRY_ARGS);
    const LaneGroups lg(log2_group);
    for (long long r = lg.first; r < rows; r += lg.stride) {
        const long long plane = r / g.Ho;
        const int oh = (int)(r - plane * g.Ho);
        const T* xp = x + plane * g.H * g.W;
        const long long out = r * g.Wo;
        const int hs = oh * g.sh - g.ph;
        for (int ow0 = lg.col; ow0 < g.Wo; ow0 += 2 * lg.size) {
            A res[2];
            int pos[2];
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const int ow = ow0 + u * lg.size;
                res[u] = window_reduce<T, MAX, CASE>(xp, g, hs, ow * g.sw - g.pw, ow < g.Wo, pos[u]);
            }
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const int ow = ow0 + u * lg.size;
                if (ow >= g.Wo) continue;
                A v = res[u];
                if (!MAX) {
                    v = v / A(avg_divisor<int>(hs, ow * g.sw - g.pw, g.kh, g.kw, g.H, g.W, g.ph,
                                               g.pw, count_include_pad));
                }
                if (y) y[out + ow] = store<T>(v);
                if (MAX && arg) arg[out + ow] = (unsigned char)pos[u];
            }
        }
    }
}

// dx, one input row per lane group.  MAX: `arg` from pool_rows_forward, or
// null when windows do not overlap (the one covering window's argmax is then
// recomputed from x).
template <typename T, bool MAX, int CASE>
__global__ void __launch_bounds__(256)
pool_rows_backward(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx,
                   const unsigned char* __restrict__ arg, long long rows,
                   GEOMETRY_PARAMS, int count_include_pad, int log2_group) {
    typedef acc_t<T> A;
    const Geometry<CASE> g(GEOMETRY_ARGS);
    const LaneGroups lg(log2_group);
    for (long long r = lg.first; r < rows; r += lg.stride) {
        const long long plane = r / g.H;
        const int h = (int)(r - plane * g.H);
        int oh_lo, oh_hi;
        covering_outputs<int>(h, g.kh, g.sh, g.ph, g.Ho, oh_lo, oh_hi);
        const long long out0 = plane * g.Ho * g.Wo;
        const T* xp = x + plane * g.H * g.W;
        for (int w = lg.col; w < g.W; w += lg.size) {
            int ow_lo, ow_hi;
            covering_outputs<int>(w, g.kw, g.sw, g.pw, g.Wo, ow_lo, ow_hi);
            A grad = 0;
            for (int oh = oh_lo; oh <= oh_hi; ++oh) {
                const int hs = oh * g.sh - g.ph;
                for (int ow = ow_lo; ow <= ow_hi; ++ow) {
                    const int ws = ow * g.sw - g.pw;
                    const long long o = out0 + (long long)oh * g.Wo + ow;
                    const A gv = load(dy[o]);
                    if (MAX) {
                        int pos;
                        if (arg) {
                            pos = arg[o];
                        } else {
                            window_reduce<T, true, CASE>(xp, g, hs, ws, true, pos);
                        }
                        if (pos == (h - hs) * g.kw + (w - ws)) grad += gv;
                    } else {
                        grad += gv / A(avg_divisor<int>(hs, ws, g.kh, g.kw, g.H, g.W, g.ph, g.pw,
                                                        count_include_pad));
                    }
                }
            }
            dx[r * g.W + w] = store<T>(grad);
        }
    }
}

// (image n, row h, column w, first channel c) of thread i = ((n * rows + h) *
// cols + w) * (C / VEC) + c / VEC; cv = C / VEC.
template <typename index_t>
__device__ __forceinline__ void nhwc_pixel(index_t i, int cv, int vec, int rows, int cols, index_t& n, int& h,
                                           int& w, int& c) {
    index_t p = i / cv;
    c = (int)(i - p * cv) * vec;
    w = (int)(p % cols);
    p /= cols;
    h = (int)(p % rows);
    n = p / rows;
}

// VEC consecutive channels at p (one 16-byte load when VEC > 1), as A.
template <typename T, int VEC>
__device__ __forceinline__ void load_channels(const T* __restrict__ p, acc_t<T> (&out)[VEC]) {
    if (VEC > 1) {
        const Pack16<T, VEC> pk = *reinterpret_cast<const Pack16<T, VEC>*>(p);
#pragma unroll
        for (int v = 0; v < VEC; ++v) out[v] = load(pk.v[v]);
    } else {
        out[0] = load(p[0]);
    }
}

// Max (with the window-local position of the forward rule's pick: the first
// maximum in row-major order, the last NaN; the first real element if all
// -inf) or sum, per channel, over the window starting at (hs, ws) of one NHWC
// image xn (channel offset included).
template <typename T, typename index_t, bool MAX, int VEC>
__device__ __forceinline__ void nhwc_window_reduce(const T* __restrict__ xn, int hs, int ws, int C, int H, int W,
                                                   int kh, int kw, acc_t<T> (&r)[VEC], int (&pos)[VEC]) {
    typedef acc_t<T> A;
    const int h0 = max(hs, 0), w0 = max(ws, 0), h1 = min(hs + kh, H), w1 = min(ws + kw, W);
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
        r[v] = MAX ? negative_infinity<A>() : A(0);
        pos[v] = (h0 - hs) * kw + (w0 - ws);
    }
    for (int h = h0; h < h1; ++h) {
        for (int w = w0; w < w1; ++w) {
            A vals[VEC];
            load_channels<T, VEC>(xn + ((index_t)h * W + w) * C, vals);
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                if (MAX) {
                    if (vals[v] > r[v] || vals[v] != vals[v]) {
                        r[v] = vals[v];
                        pos[v] = (h - hs) * kw + (w - ws);
                    }
                } else {
                    r[v] += vals[v];
                }
            }
        }
    }
}

// NHWC: thread i = ((n * Ho + oh) * Wo + ow) * (C / VEC) + c / VEC.
template <typename T, typename index_t, bool MAX, int VEC>
__global__ void __launch_bounds__(256)
pool_nhwc_forward(const T* __restrict__ x, T* __restrict__ y, unsigned char* __restrict__ arg,
                  index_t total, int C, GEOMETRY_PARAMS, int count_include_pad) {
    typedef acc_t<T> A;
    const int cv = C / VEC;
    for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (index_t)blockDim.x * gridDim.x) {
        index_t n;
        int oh, ow, c;
        nhwc_pixel<index_t>(i, cv, VEC, Ho, Wo, n, oh, ow, c);
        const int hs = oh * sh - ph, ws = ow * sw - pw;
        A r[VEC];
        int pos[VEC];
        nhwc_window_reduce<T, index_t, MAX, VEC>(x + n * H * W * C + c, hs, ws, C, H, W, kh, kw, r, pos);
        const A divisor = MAX ? A(1) : A(avg_divisor<int>(hs, ws, kh, kw, H, W, ph, pw, count_include_pad));
        const index_t o = i * VEC;
        if (y) {
            Pack16<T, VEC> pk;
#pragma unroll
            for (int v = 0; v < VEC; ++v) pk.v[v] = store<T>(MAX ? r[v] : r[v] / divisor);
            *reinterpret_cast<Pack16<T, VEC>*>(y + o) = pk;
        }
        if (MAX && arg) {  // VEC bytes in one store (o is a multiple of VEC)
            PackN<unsigned char, VEC> pb;
#pragma unroll
            for (int v = 0; v < VEC; ++v) pb.v[v] = (unsigned char)pos[v];
            *reinterpret_cast<PackN<unsigned char, VEC>*>(arg + o) = pb;
        }
    }
}

// NHWC: thread i = ((n * H + h) * W + w) * (C / VEC) + c / VEC.
template <typename T, typename index_t, bool MAX, int VEC>
__global__ void __launch_bounds__(256)
pool_nhwc_backward(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx,
                   const unsigned char* __restrict__ arg, index_t total, int C,
                   GEOMETRY_PARAMS, int count_include_pad) {
    typedef acc_t<T> A;
    const int cv = C / VEC;
    for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (index_t)blockDim.x * gridDim.x) {
        index_t n;
        int h, w, c;
        nhwc_pixel<index_t>(i, cv, VEC, H, W, n, h, w, c);
        int oh_lo, oh_hi, ow_lo, ow_hi;
        covering_outputs<int>(h, kh, sh, ph, Ho, oh_lo, oh_hi);
        covering_outputs<int>(w, kw, sw, pw, Wo, ow_lo, ow_hi);
        A grad[VEC];
#pragma unroll
        for (int v = 0; v < VEC; ++v) grad[v] = 0;
        for (int oh = oh_lo; oh <= oh_hi; ++oh) {
            const int hs = oh * sh - ph;
            for (int ow = ow_lo; ow <= ow_hi; ++ow) {
                const int ws = ow * sw - pw;
                const index_t o = ((n * Ho + oh) * Wo + ow) * C + c;
                A g[VEC];
                load_channels<T, VEC>(dy + o, g);
                if (MAX) {
                    const int self = (h - hs) * kw + (w - ws);
                    int pos[VEC];
                    if (arg) {  // VEC bytes in one load (C and c are multiples of VEC)
                        const PackN<unsigned char, VEC> pb = load_pack<unsigned char, VEC>(arg + o);
#pragma unroll
                        for (int v = 0; v < VEC; ++v) pos[v] = pb.v[v];
                    } else {  // no overlap: recompute this window's argmax per channel
                        A m[VEC];
                        nhwc_window_reduce<T, index_t, true, VEC>(x + n * H * W * C + c, hs, ws, C, H, W, kh,
                                                                  kw, m, pos);
                    }
#pragma unroll
                    for (int v = 0; v < VEC; ++v)
                        if (pos[v] == self) grad[v] += g[v];
                } else {
                    const A divisor = A(avg_divisor<int>(hs, ws, kh, kw, H, W, ph, pw, count_include_pad));
#pragma unroll
                    for (int v = 0; v < VEC; ++v) grad[v] += g[v] / divisor;
                }
            }
        }
        Pack16<T, VEC> pk;
#pragma unroll
        for (int v = 0; v < VEC; ++v) pk.v[v] = store<T>(grad[v]);
        *reinterpret_cast<Pack16<T, VEC>*>(dx + i * VEC) = pk;
    }
}

// ---------------------------------------------------------------------------
// NCHW 3x3 windows, stride 2, padding 1 (ResNet's stem pooling), vectorised
// (pool_k3s2_*).  Requires W % VEC == 0 (VEC = 16 / sizeof(T)) and 16-byte
// aligned x, y / dy, dx: every input row is then whole 16-byte vectors and
// Wo = W / 2.
//
// Forward: thread = (plane, band of R output rows, column vector j).  It loads
// the 2R + 1 input rows its band needs, each as ONE 16-byte vector (columns
// VEC*j .. VEC*j + VEC - 1) plus the left halo column VEC*j - 1 (a scalar
// load, an L1 hit: the neighbour lane's vector holds it), all loads issued
// before any arithmetic (the loops unroll fully); then VEC / 2 outputs per
// output row: a row pass (3 columns -> 1 per output) per input row, shared by
// the two output rows that meet on it, then the column pass.  Consecutive
// threads take consecutive vectors of a row (coalesced 16-byte loads) and
// write consecutive VEC / 2-element packs of y.  The rolling window over rows
// reads each input row once per band (2R + 1 rows for 2R: the halo row).
//
// Backward (max only): thread = (plane, band of 2R *input* rows, column vector
// j): it owns that 2R x VEC tile of dx and writes it with 16-byte stores, every
// dx element by exactly one thread (no atomics).  It recomputes the argmax of
// every window touching its tile -- output rows R*b .. R*b + R and columns
// VEC/2*j .. VEC/2*j + VEC/2, the last row and column shared with the next
// band / vector, whose first input row / column is that window's last one --
// from x rows 2Rb - 1 .. 2Rb + 2R + 1 and columns VEC*j - 1 .. VEC*j + VEC + 1
// (left halo scalar, the vector, a 2-element right halo), and adds each
// window's dy to its argmax when that lies in the tile, windows in row-major
// order (the gather's order: deterministic).  DRAM traffic is the floor: x
// and dy read once, dx written once; the halo re-reads hit L1/L2.
//
// The pick is the forward rule: the first maximum in row-major window order,
// the last NaN if any; padding never enters; all -inf -> the first real element.
//
// Measured (H100, notes/pool.md, notes/pool3.md; fraction of copy bandwidth
// over the floor bytes): forward 0.92-0.97 in float32 (the rows kernel above:
// 0.57), float16 0.93 on packed pairs (0.60 scalar); backward 0.86-0.89 in
// float32 with argmax3x3's no-NaN path (0.78-0.81 with the exact rule only; the
// row tiles: 0.42); float16 / bfloat16 0.61 on packed pairs (notes/pool4.md,
// k3s2_max_backward_pairs; 0.37 scalar: per-element compare work, not bytes,
// sets the 16-bit time).  Results are bitwise those of the previous paths,
// except the float16 / bfloat16 max forward's sign of a zero maximum (see
// k3s2_max_forward_pairs).

// The 3x3 / 2 kernels' reduction of three neighbours, in this order (a row
// pass, then the column pass over its results): max picks the first maximum and
// the last NaN (together: the row-major scan's pick), average sums.
template <bool MAX, typename A>
__device__ __forceinline__ A reduce3(A a, A b, A c) {
    if (MAX) {
        a = (b > a || b != b) ? b : a;
        return (c > a || c != c) ? c : a;
    }
    return (a + b) + c;
}

// The forward rule's pick in a 3x3 window, as a * 3 + c (row a, column c);
// at(a, c) is the value, row[a] && col[c] says the element lies inside the
// input.  EXACT: the full rule (the last NaN wins, else the first maximum in
// row-major order; all -inf: the first real element; -1 if none is real).
// Otherwise the caller guarantees no NaN among the values and -inf in every
// padding position, and a strict > from the first real element picks the same
// element with half the instructions (a compare and two selects an element):
// the backward kernels are bound by this arithmetic, not by bytes, in float16.
template <bool EXACT, typename A, typename At>
__device__ __forceinline__ int argmax3x3(At at, const bool (&row)[3], const bool (&col)[3]) {
    int pos;
    if (EXACT) {
        A best = A(0);
        pos = -1;
#pragma unroll
        for (int a = 0; a < 3; ++a)
#pragma unroll
            for (int c = 0; c < 3; ++c) {
                const A e = at(a, c);
                if (row[a] && col[c] && (pos < 0 || e > best || e != e)) {
                    best = e;
                    pos = a * 3 + c;
                }
            }
        return pos;
    }
    pos = (row[0] ? 0 : row[1] ? 3 : 6) + (col[0] ? 0 : col[1] ? 1 : 2);
    A best = negative_infinity<A>();
#pragma unroll
    for (int a = 0; a < 3; ++a)
#pragma unroll
        for (int c = 0; c < 3; ++c) {
            const A e = at(a, c);
            if (e > best) {
                best = e;
                pos = a * 3 + c;
            }
        }
    return pos;
}

// A compile-time bool as a value (for generic lambdas: decltype(b)::value).
template <bool B>
struct Bool {
    static constexpr bool value = B;
};

// Whether any of n values is NaN, as one sum (one add a value, two chains):
// -inf + inf also reads as NaN, which only sends the caller to its exact path.
template <int N, typename A>
__device__ __forceinline__ bool any_nan(const A* v) {
    A s0 = A(0), s1 = A(0);
#pragma unroll
    for (int e = 0; e < N; e += 2) {
        s0 += v[e];
        if (e + 1 < N) s1 += v[e + 1];
    }
    s0 += s1;
    return s0 != s0;
}

// Columns -1 .. VEC - 1 + RIGHT of one NCHW row (relative to `row`, a 16-byte
// aligned vector) into out[0 .. VEC + RIGHT]: the left halo column (a scalar
// load, an L1 hit: the neighbour lane's vector holds it), the vector, and RIGHT
// (0 or 2: one 8-byte load) right halo columns.  `fill` where the row, the left
// or the right halo lies outside the plane.  The loader of both pool_k3s2 kernels.
template <typename T, int VEC, int RIGHT>
__device__ __forceinline__ void load_row_vector(acc_t<T> (&out)[VEC + 1 + RIGHT], const T* row, bool row_ok,
                                                bool left_ok, bool right_ok, acc_t<T> fill) {
    static_assert(RIGHT == 0 || RIGHT == 2, "right halo: none or one 2-element pack");
    if (!row_ok) {
#pragma unroll
        for (int e = 0; e < VEC + 1 + RIGHT; ++e) out[e] = fill;
        return;
    }
    const PackN<T, VEC> pk = load_pack<T, VEC>(row);
#pragma unroll
    for (int e = 0; e < VEC; ++e) out[e + 1] = load(pk.v[e]);
    out[0] = left_ok ? load(row[-1]) : fill;
    if (RIGHT) {
        if (right_ok) {
            const PackN<T, 2> pr = load_pack<T, 2>(row + VEC);
            out[VEC + 1] = load(pr.v[0]);
            out[VEC + 1 + RIGHT - 1] = load(pr.v[1]);
        } else {
            out[VEC + 1] = out[VEC + 1 + RIGHT - 1] = fill;
        }
    }
}

template <typename index_t>
__device__ __forceinline__ void plane_band_lane(index_t i, int lanes, int bands, index_t& plane, int& band,
                                           int& j) {
    const index_t q = i / lanes;
    j = (int)(i - q * lanes);
    plane = q / bands;
    band = (int)(q - plane * bands);
}

// float16 / bfloat16 max forward on packed pairs (sm_80+: max.NaN.{f16,bf16}x2,
// two values an instruction, no conversions): the per-element arithmetic, not
// the bytes, bounded the scalar path (0.60 of copy in float16 against 0.97 in
// float32).  The column pass comes first here (elementwise over the three input
// rows' words), then the row pass over the column maxima, pairing outputs (u,
// u + 1) in one word by byte permutes.  The value is the same maximum (a NaN
// wins: the canonical NaN), except that a window whose maximum is a zero of
// both signs gives +0.0 where the first-maximum rule gives the first zero.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define PACKED_MAX_PAIRS 1
#else
#define PACKED_MAX_PAIRS 0
#endif

// name<T>(a, b): one PTX instruction on a pair of 16-bit floats a word, the
// float16 form for half_t, the bfloat16 one for bfloat16_t.
#define PAIR_INSTRUCTION(name, ptx_half, ptx_bfloat16)                                  \
    template <typename T>                                                               \
    __device__ __forceinline__ unsigned name(unsigned a, unsigned b);                   \
    template <>                                                                         \
    __device__ __forceinline__ unsigned name<half_t>(unsigned a, unsigned b) {          \
        unsigned d;                                                                     \
        asm(ptx_half " %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));                        \
        return d;                                                                       \
    }                                                                                   \
    template <>                                                                         \
    __device__ __forceinline__ unsigned name<bfloat16_t>(unsigned a, unsigned b) {      \
        unsigned d;                                                                     \
        asm(ptx_bfloat16 " %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));                    \
        return d;                                                                       \
    }

PAIR_INSTRUCTION(max_nan_pairs, "max.NaN.f16x2", "max.NaN.bf16x2")
template <typename T> struct NegInfBits;
template <> struct NegInfBits<half_t> { static constexpr unsigned value = 0xfc00u; };
template <> struct NegInfBits<bfloat16_t> { static constexpr unsigned value = 0xff80u; };

// Elementwise maximum (NaN-propagating) of three packs of 16-bit floats, two
// values an instruction (the NHWC float16 / bfloat16 max forward's passes).
template <typename T, int VEC>
__device__ __forceinline__ PackN<T, VEC> max3_pairs(const PackN<T, VEC>& a, const PackN<T, VEC>& b,
                                                    const PackN<T, VEC>& c) {
    static_assert(sizeof(T) == 2 && VEC % 2 == 0, "pairs of 16-bit values");
    typedef PackN<unsigned, VEC / 2> Words;
    const Words& wa = reinterpret_cast<const Words&>(a);
    const Words& wb = reinterpret_cast<const Words&>(b);
    const Words& wc = reinterpret_cast<const Words&>(c);
    Words r;
#if PACKED_MAX_PAIRS
#pragma unroll
    for (int i = 0; i < VEC / 2; ++i) r.v[i] = max_nan_pairs<T>(max_nan_pairs<T>(wa.v[i], wb.v[i]), wc.v[i]);
#endif
    return reinterpret_cast<const PackN<T, VEC>&>(r);
}

// One band (R output rows, 4 columns: one 8-byte store each) of pool_k3s2_forward
// for max over 2-byte types; xp / yp point at the band's column vector j.
template <typename T, int R>
__device__ __forceinline__ void k3s2_max_forward_pairs(const T* __restrict__ xp, T* __restrict__ yp, int H,
                                                       int W, int Ho, int Wo, int h0, int oh0, bool left) {
#if PACKED_MAX_PAIRS
    constexpr int ROWS = 2 * R + 1;
    constexpr unsigned NINF = NegInfBits<T>::value * 0x10001u;
    unsigned q[ROWS][4], halo[ROWS];  // 8 values as 4 words; the left halo column (low half)
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const int h = h0 + r;
        if (h >= 0 && h < H) {
            const PackN<unsigned, 4> pk = load_pack<unsigned, 4>(reinterpret_cast<const unsigned*>(
                xp + (long long)h * W));
#pragma unroll
            for (int i = 0; i < 4; ++i) q[r][i] = pk.v[i];
            halo[r] = left ? (unsigned)xp[(long long)h * W - 1].bits : NINF;
        } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) q[r][i] = NINF;
            halo[r] = NINF;
        }
    }
#pragma unroll
    for (int k = 0; k < R; ++k) {
        const int oh = oh0 + k;
        if (oh >= Ho) break;
        unsigned c[4];  // column maxima: columns 2i (low half), 2i + 1 (high half)
#pragma unroll
        for (int i = 0; i < 4; ++i)
            c[i] = max_nan_pairs<T>(max_nan_pairs<T>(q[2 * k][i], q[2 * k + 1][i]), q[2 * k + 2][i]);
        const unsigned hc = max_nan_pairs<T>(max_nan_pairs<T>(halo[2 * k], halo[2 * k + 1]), halo[2 * k + 2]);
        PackN<unsigned, 2> out;  // outputs (0, 1), (2, 3): max of columns 2u - 1, 2u, 2u + 1
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            const int u = 2 * p;
            const unsigned even = (c[u] & 0xffffu) | (c[u + 1] << 16);           // columns 2u, 2u + 2
            const unsigned odd = (c[u] >> 16) | (c[u + 1] & 0xffff0000u);        // 2u + 1, 2u + 3
            const unsigned prev = (u == 0 ? (hc & 0xffffu) : (c[u - 1] >> 16)) | (c[u] & 0xffff0000u);
            out.v[p] = max_nan_pairs<T>(max_nan_pairs<T>(prev, even), odd);     // 2u - 1, 2u + 1
        }
        *reinterpret_cast<PackN<unsigned, 2>*>(yp + (long long)oh * Wo) = out;
    }
#endif
}

template <typename T, typename index_t, bool MAX, int R>
__global__ void __launch_bounds__(256)
pool_k3s2_forward(const T* __restrict__ x, T* __restrict__ y, index_t items, int H, int W, int Ho,
                  int bands, int count_include_pad) {
    typedef acc_t<T> A;
    constexpr int VEC = 16 / sizeof(T), OUT = VEC / 2, ROWS = 2 * R + 1;
    const int lanes = W / VEC, Wo = W / 2;
    for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < items;
         i += (index_t)blockDim.x * gridDim.x) {
        index_t plane;
        int band, j;
        plane_band_lane<index_t>(i, lanes, bands, plane, band, j);
        const T* xp = x + (long long)plane * H * W + VEC * j;
        const int oh0 = band * R, h0 = 2 * oh0 - 1;
        if constexpr (MAX && PACKED_MAX_PAIRS && sizeof(T) == 2) {
            k3s2_max_forward_pairs<T, R>(xp, y + (long long)plane * Ho * Wo + OUT * j, H, W, Ho, Wo, h0,
                                         oh0, j > 0);
        } else {
            // row pass: rp[r][u] = reduce of columns 2u - 1, 2u, 2u + 1 (local) of input row h0 + r
            A v[ROWS][VEC + 1];  // [0] = the left halo column
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                const int h = h0 + r;
                load_row_vector<T, VEC, 0>(v[r], xp + (long long)h * W, h >= 0 && h < H, j > 0, false,
                                           MAX ? negative_infinity<A>() : A(0));
            }
            A rp[ROWS][OUT];
#pragma unroll
            for (int r = 0; r < ROWS; ++r)
#pragma unroll
                for (int u = 0; u < OUT; ++u) rp[r][u] = reduce3<MAX>(v[r][2 * u], v[r][2 * u + 1], v[r][2 * u + 2]);
            T* yp = y + (long long)plane * Ho * Wo + OUT * j;
#pragma unroll
            for (int k = 0; k < R; ++k) {
                const int oh = oh0 + k;
                if (oh >= Ho) break;
                PackN<T, OUT> pk;
#pragma unroll
                for (int u = 0; u < OUT; ++u) {
                    A m = reduce3<MAX>(rp[2 * k][u], rp[2 * k + 1][u], rp[2 * k + 2][u]);
                    if (!MAX) {
                        m = m / A(avg_divisor<int>(2 * oh - 1, 2 * (OUT * j + u) - 1, 3, 3, H, W, 1, 1,
                                                   count_include_pad));
                    }
                    pk.v[u] = store<T>(m);
                }
                *reinterpret_cast<PackN<T, OUT>*>(yp + (long long)oh * Wo) = pk;
            }
        }
    }
}

// float16 / bfloat16 max backward on packed pairs (sm_90+: set.{eq,gt}.u32.
// {f16,bf16}x2 and max.NaN.*x2; the scalar path elsewhere).  The scalar
// argmax (argmax3x3: a compare and two selects an element, after a conversion
// to float) made the 16-bit backward compare-bound (0.37 of copy against 0.89
// in float32).  Here the two window rows of a band (R = 1: output rows oh0 and
// oh0 + 1, x rows 0..2 and 2..4 of the tile) travel as the low and high halves
// of one word: P[a][c] = (row a, row a + 2) at local column c, built once per
// tile by byte permutes.  Per window pair: the maximum M (column pass then row
// pass, max.NaN pairs, shared between neighbouring windows), then the first
// position equal to M in row-major order: per element one packed compare, one
// LOP3 (eq & ~seen & dy: the element's share of the window's dy, or +0) and an
// OR into `seen`.  Equality picks exactly the fast rule's element when no value
// is NaN and M > -inf (padding is -inf, so it never equals M then; -0.0 and
// +0.0 compare equal, so the first zero wins, as with the strict > scan).
// Otherwise (a NaN in the tile, or a window of -inf only) it returns false and
// the caller runs the scalar path (exact rule).  dx sums in float from +0 in
// the gather's order (windows in row-major order; a share that is not the
// window's argmax adds +0), so dx is bitwise the scalar path's (checked on the
// H100 on 64 x 256 x 56 x 56, notes/pool4.md).  MINB (__launch_bounds__' minimum
// blocks per SM, both max backward kernels, from the Python tables): 3 for this
// kernel (80 registers, ~100 bytes of spill, 24 warps an SM instead of 16:
// 0.127 -> 0.107 ms, 0.61 -> 0.72 of copy, notes/pool5.md).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define PACKED_CMP_PAIRS 1
#else
#define PACKED_CMP_PAIRS 0
#endif

// 0xffff in each half where a == b (resp. a > b), else 0 (16-bit float pairs).
#if PACKED_CMP_PAIRS
PAIR_INSTRUCTION(eq_pairs, "set.eq.u32.f16x2", "set.eq.u32.bf16x2")
PAIR_INSTRUCTION(gt_pairs, "set.gt.u32.f16x2", "set.gt.u32.bf16x2")
#endif

// Per half of a word (a window of 16-bit pairs): the window's dy g at the first
// element at(a, c), in row-major order, equal to the window's maximum M, and +0
// at the others -- each element's share of g.
template <typename T, typename At>
__device__ __forceinline__ void first_max_shares(At at, unsigned M, unsigned g, unsigned (&share)[3][3]) {
    unsigned seen = 0u;
#pragma unroll
    for (int a = 0; a < 3; ++a)
#pragma unroll
        for (int c = 0; c < 3; ++c) {
            const unsigned eq = eq_pairs<T>(at(a, c), M);
            share[a][c] = eq & ~seen & g;
            seen |= eq;
        }
}

// first_max_shares with the running mask taken two elements a step: `left` = g where no
// element before element k equals M; element k's share = eq_k & left, element k + 1's =
// eq_k+1 & ~eq_k & left (three inputs: one LOP3), and `left` skips to k + 2 in one more
// (left & ~eq_k & ~eq_k+1): 9 + 4 logic operations a window instead of 9 + 7 (the shares
// are the same words; notes/poolbf16.md).  The 16-bit rolled backward is short of issue
// slots on the ALU pipe, bfloat16 most (its conversions to float are integer operations).
template <typename T, typename At>
__device__ __forceinline__ void first_max_shares_pairwise(At at, unsigned M, unsigned g, unsigned (&share)[3][3]) {
    unsigned left = g;
#pragma unroll
    for (int k = 0; k < 9; k += 2) {
        const unsigned e0 = eq_pairs<T>(at(k / 3, k % 3), M);
        share[k / 3][k % 3] = e0 & left;
        if (k + 1 < 9) {
            const unsigned e1 = eq_pairs<T>(at((k + 1) / 3, (k + 1) % 3), M);
            share[(k + 1) / 3][(k + 1) % 3] = e1 & ~e0 & left;
            left &= ~(e0 | e1);
        }
    }
}

// Bytes of a and b by selector s (prmt: a = bytes 0..3, b = bytes 4..7).
__device__ __forceinline__ unsigned permute_bytes(unsigned a, unsigned b, unsigned s) {
    unsigned d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(s));
    return d;
}

// The low (HIGH = false) or high half of a word of 16-bit floats, as float.
template <typename T, bool HIGH>
__device__ __forceinline__ float half_of(unsigned w) {
    T h;
    h.bits = (unsigned short)(HIGH ? w >> 16 : w & 0xffffu);
    return load(h);
}

// half_of<T, true> for the rolled backward's SHARES = 2: bfloat16's high half by two integer
// multiplies (w >> 16 as the high word of w * 2^16, then * 2^16: the FMA pipe) instead of
// a LOP3 on the ALU pipe, which the step is short of; float16 as half_of.
template <typename T, bool FMA_PIPE>
__device__ __forceinline__ float high_half(unsigned w) {
    if constexpr (FMA_PIPE && NegInfBits<T>::value == 0xff80u) {  // bfloat16
        unsigned h;
        asm("mul.hi.u32 %0, %1, 65536;" : "=r"(h) : "r"(w));
        asm("mul.lo.u32 %0, %1, 65536;" : "=r"(h) : "r"(h));
        return __uint_as_float(h);
    }
    return half_of<T, true>(w);
}

// One tile of pool_k3s2_backward (R = 1: dx rows h0 + 1, h0 + 2, columns VEC*j
// .. VEC*j + 7) on packed pairs; xp / dyp / dxp point at the tile's column
// vector j of plane row 0.  Returns false (nothing written) where the tile
// needs the exact rule.
template <typename T>
__device__ __forceinline__ bool k3s2_max_backward_pairs(const T* __restrict__ xp, const T* __restrict__ dyp,
                                                        T* __restrict__ dxp, int H, int W, int Ho, int Wo,
                                                        int h0, int oh0, bool left, bool right) {
#if PACKED_CMP_PAIRS
    constexpr unsigned NINF = NegInfBits<T>::value, NINF2 = NINF * 0x10001u;
    // x rows h0 .. h0 + 4: words (local columns 2i + 1, 2i + 2), i = 0..3, and [4] =
    // the right halo (9, 10); halo[r] = local column 0 (the left halo)
    unsigned q[5][5], halo[5];
#pragma unroll
    for (int r = 0; r < 5; ++r) {
        const int h = h0 + r;
        if (h >= 0 && h < H) {
            const T* row = xp + (long long)h * W;
            const PackN<unsigned, 4> pk = load_pack<unsigned, 4>(reinterpret_cast<const unsigned*>(row));
#pragma unroll
            for (int i = 0; i < 4; ++i) q[r][i] = pk.v[i];
            q[r][4] = right ? *reinterpret_cast<const unsigned*>(row + 8) : NINF2;
            halo[r] = left ? (unsigned)row[-1].bits : NINF;
        } else {
#pragma unroll
            for (int i = 0; i < 5; ++i) q[r][i] = NINF2;
            halo[r] = NINF;
        }
    }
    // P[a][c]: (row a, row a + 2) at local column c -- window rows oh0 (low) and oh0 + 1 (high)
    unsigned P[3][11];
#pragma unroll
    for (int a = 0; a < 3; ++a) {
        P[a][0] = halo[a] | (halo[a + 2] << 16);
#pragma unroll
        for (int i = 0; i < 5; ++i) {
            P[a][2 * i + 1] = permute_bytes(q[a][i], q[a + 2][i], 0x5410u);
            P[a][2 * i + 2] = permute_bytes(q[a][i], q[a + 2][i], 0x7632u);
        }
    }
    unsigned cm[11], M[5];
#pragma unroll
    for (int c = 0; c < 11; ++c) cm[c] = max_nan_pairs<T>(max_nan_pairs<T>(P[0][c], P[1][c]), P[2][c]);
    const bool second = oh0 + 1 < Ho;  // window row oh0 + 1 exists
    const unsigned exists = second ? 0xffffffffu : 0x0000ffffu;
    unsigned ok = 0xffffffffu;  // every existing window's maximum is a number above -inf
#pragma unroll
    for (int m = 0; m < 5; ++m) {
        M[m] = max_nan_pairs<T>(max_nan_pairs<T>(cm[2 * m], cm[2 * m + 1]), cm[2 * m + 2]);
        ok &= gt_pairs<T>(M[m], NINF2) | ~(m < 4 || right ? exists : 0u);
    }
    if (ok != 0xffffffffu) return false;
    // dy of the window pairs m = 0..4: (row oh0, row oh0 + 1), zero where the window does not exist
    unsigned G[5];
    {
        const PackN<unsigned, 2> d0 = load_pack<unsigned, 2>(reinterpret_cast<const unsigned*>(dyp + (long long)oh0 * Wo));
        PackN<unsigned, 2> d1;
        d1.v[0] = d1.v[1] = 0u;
        if (second) d1 = load_pack<unsigned, 2>(reinterpret_cast<const unsigned*>(dyp + (long long)(oh0 + 1) * Wo));
        G[0] = permute_bytes(d0.v[0], d1.v[0], 0x5410u);
        G[1] = permute_bytes(d0.v[0], d1.v[0], 0x7632u);
        G[2] = permute_bytes(d0.v[1], d1.v[1], 0x5410u);
        G[3] = permute_bytes(d0.v[1], d1.v[1], 0x7632u);
        const unsigned g0 = right ? (unsigned)dyp[(long long)oh0 * Wo + 4].bits : 0u;
        const unsigned g1 = right && second ? (unsigned)dyp[(long long)(oh0 + 1) * Wo + 4].bits : 0u;
        G[4] = g0 | (g1 << 16);
    }
    // window row oh0 (low halves) first, then oh0 + 1 (high halves): the gather's order
    float grad[2][8];
#pragma unroll
    for (int d = 0; d < 2; ++d)
#pragma unroll
        for (int f = 0; f < 8; ++f) grad[d][f] = 0.0f;
    unsigned upper[5][3];  // high-half shares of x row 2 (dx row 1): window row oh0 + 1
#pragma unroll
    for (int m = 0; m < 5; ++m) {
        unsigned share[3][3];
        first_max_shares<T>([&](int a, int c) { return P[a][2 * m + c]; }, M[m], G[m], share);
#pragma unroll
        for (int a = 0; a < 3; ++a)
#pragma unroll
            for (int c = 0; c < 3; ++c) {
                const int f = 2 * m + c - 1;
                if (a == 0) upper[m][c] = share[0][c];
                if (a > 0 && f >= 0 && f < 8) grad[a - 1][f] += half_of<T, false>(share[a][c]);
            }
    }
#pragma unroll
    for (int m = 0; m < 5; ++m)
#pragma unroll
        for (int c = 0; c < 3; ++c) {
            const int f = 2 * m + c - 1;
            if (f >= 0 && f < 8) grad[1][f] += half_of<T, true>(upper[m][c]);
        }
#pragma unroll
    for (int d = 0; d < 2; ++d) {
        const int h = h0 + 1 + d;
        if (h >= H) break;
        PackN<T, 8> pk;
#pragma unroll
        for (int f = 0; f < 8; ++f) pk.v[f] = store<T>(grad[d][f]);
        *reinterpret_cast<PackN<T, 8>*>(dxp + (long long)h * W) = pk;
    }
    return true;
#else
    return false;
#endif
}

template <typename T, typename index_t, int R, int MINB>
__global__ void __launch_bounds__(256, MINB)
pool_k3s2_backward(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx,
                   index_t items, int H, int W, int Ho, int bands) {
    typedef acc_t<T> A;
    constexpr int VEC = 16 / sizeof(T), OUT = VEC / 2;
    constexpr int XR = 2 * R + 3, XC = VEC + 3;  // x rows 2Rb - 1 .., columns VEC*j - 1 ..
    const int lanes = W / VEC, Wo = W / 2;
    for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < items;
         i += (index_t)blockDim.x * gridDim.x) {
        index_t plane;
        int band, j;
        plane_band_lane<index_t>(i, lanes, bands, plane, band, j);
        const T* xp = x + (long long)plane * H * W + VEC * j;
        const T* dyp = dy + (long long)plane * Ho * Wo + OUT * j;
        const int h0 = 2 * R * band - 1, oh0 = R * band;
        const bool right = j + 1 < lanes;  // the window column shared with the next vector exists
        if constexpr (sizeof(T) == 2 && R == 1) {
            if (k3s2_max_backward_pairs<T>(xp, dyp, dx + (long long)plane * H * W + VEC * j, H, W, Ho, Wo,
                                           h0, oh0, j > 0, right))
                continue;
        }
        A v[XR][XC];
        bool rok[XR];
#pragma unroll
        for (int r = 0; r < XR; ++r) {
            const int h = h0 + r;
            rok[r] = h >= 0 && h < H;
            load_row_vector<T, VEC, 2>(v[r], xp + (long long)h * W, rok[r], j > 0, right,
                                       negative_infinity<A>());
        }
        const bool exact = any_nan<XR * XC>(&v[0][0]);  // else argmax3x3's fast path
        A g[R + 1][OUT + 1];
#pragma unroll
        for (int k = 0; k <= R; ++k) {
            const bool ok = oh0 + k < Ho;
            const T* drow = dyp + (long long)(oh0 + k) * Wo;
            if (ok) {
                const PackN<T, OUT> pk = load_pack<T, OUT>(drow);
#pragma unroll
                for (int m = 0; m < OUT; ++m) g[k][m] = load(pk.v[m]);
                g[k][OUT] = right ? load(drow[OUT]) : A(0);
            } else {
#pragma unroll
                for (int m = 0; m <= OUT; ++m) g[k][m] = A(0);
            }
        }
        A grad[2 * R][VEC];
#pragma unroll
        for (int d = 0; d < 2 * R; ++d)
#pragma unroll
            for (int f = 0; f < VEC; ++f) grad[d][f] = A(0);
        // the windows, with argmax3x3's exact rule or (no NaN in the tile) its fast path
        auto windows = [&](auto exact_rule) {
#pragma unroll
        for (int k = 0; k <= R; ++k) {
            if (oh0 + k >= Ho) break;
#pragma unroll
            for (int m = 0; m <= OUT; ++m) {
                if (m == OUT && !right) break;
                // window (oh0 + k, OUT*j + m): x rows 2k .. 2k + 2, columns 2m .. 2m + 2 (local)
                const bool row[3] = {rok[2 * k], rok[2 * k + 1], rok[2 * k + 2]};
                const bool col[3] = {m > 0 || j > 0, true, true};
                const int pos = argmax3x3<decltype(exact_rule)::value, A>(
                    [&](int a, int c) { return v[2 * k + a][2 * m + c]; }, row, col);
                // dx local (row 2k + a - 1, column 2m + c - 1)
#pragma unroll
                for (int a = 0; a < 3; ++a)
#pragma unroll
                    for (int c = 0; c < 3; ++c) {
                        const int d = 2 * k + a - 1, f = 2 * m + c - 1;
                        if (d < 0 || d >= 2 * R || f < 0 || f >= VEC) continue;
                        if (pos == a * 3 + c) grad[d][f] += g[k][m];
                    }
            }
        }
        };
        if (exact) {
            windows(Bool<true>());
        } else {
            windows(Bool<false>());
        }
        T* dxp = dx + (long long)plane * H * W + VEC * j;
#pragma unroll
        for (int d = 0; d < 2 * R; ++d) {
            const int h = h0 + 1 + d;
            if (h >= H) break;
            PackN<T, VEC> pk;
#pragma unroll
            for (int f = 0; f < VEC; ++f) pk.v[f] = store<T>(grad[d][f]);
            *reinterpret_cast<PackN<T, VEC>*>(dxp + (long long)h * W) = pk;
        }
    }
}

// ---------------------------------------------------------------------------
// NCHW average pooling backward, 2x2 windows, stride 2, no padding
// (pool_k2s2_avg_backward): windows do not overlap, so dx = dy / 4 broadcast
// over each window; input rows past 2 * Ho (odd H) get no gradient.  Requires
// W % VEC == 0 (then Wo = W / 2) and 16-byte aligned dy, dx.  Thread = (plane,
// band of R output rows, column vector j): R loads of VEC / 2 dy values (8
// bytes each, issued first), then 2R 16-byte stores of dx rows -- the floor:
// dy read once, dx written once, nothing else.
template <typename T, typename index_t, int R>
__global__ void __launch_bounds__(256)
pool_k2s2_avg_backward(const T* __restrict__ /* x: not needed */, const T* __restrict__ dy,
                       T* __restrict__ dx, index_t items, int H, int W, int Ho, int bands) {
    typedef acc_t<T> A;
    constexpr int VEC = 16 / sizeof(T), OUT = VEC / 2;
    const int lanes = W / VEC, Wo = W / 2;
    for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < items;
         i += (index_t)blockDim.x * gridDim.x) {
        index_t plane;
        int band, j;
        plane_band_lane<index_t>(i, lanes, bands, plane, band, j);
        const T* dyp = dy + (long long)plane * Ho * Wo + OUT * j;
        T* dxp = dx + (long long)plane * H * W + VEC * j;
        const int oh0 = band * R;
        A g[R][OUT];
#pragma unroll
        for (int k = 0; k < R; ++k) {
            if (oh0 + k < Ho) {
                const PackN<T, OUT> pk = load_pack<T, OUT>(dyp + (long long)(oh0 + k) * Wo);
#pragma unroll
                for (int m = 0; m < OUT; ++m) g[k][m] = load(pk.v[m]) / A(4);
            } else {
#pragma unroll
                for (int m = 0; m < OUT; ++m) g[k][m] = A(0);
            }
        }
#pragma unroll
        for (int k = 0; k < R; ++k) {
            PackN<T, VEC> pk;
#pragma unroll
            for (int f = 0; f < VEC; ++f) pk.v[f] = store<T>(g[k][f / 2]);
#pragma unroll
            for (int a = 0; a < 2; ++a) {
                const int h = 2 * (oh0 + k) + a;
                if (h < H) *reinterpret_cast<PackN<T, VEC>*>(dxp + (long long)h * W) = pk;
            }
        }
    }
}

// ---------------------------------------------------------------------------
// NHWC 3x3 windows, stride 2, padding 1, C a multiple of VEC = 16 / sizeof(T)
// and 16-byte aligned arrays (pool_nhwc_k3s2_*): column-rolling kernels.
//
// Thread = (image n, band of rows, segment of `cols` output columns, VEC
// channels c .. c + VEC - 1); consecutive threads take consecutive channel
// vectors of one pixel (a warp's 16-byte loads are one contiguous run), then
// consecutive bands (vertically adjacent threads share their halo row: often
// the same block, so an L1 hit), then segments, then images.  The thread walks
// its segment column by column: per output column ow it loads only the two new
// input columns 2ow and 2ow + 1 of its rows (one 16-byte load per pixel, all
// issued before any arithmetic) and carries column 2ow - 1 from the previous
// step, so each input pixel is loaded once per band and segment instead of
// once per covering window (the per-window kernels above load 9 pixels per
// output: 2.25x the input through L1; here (2R + 1) / 2R rows and
// (cols + 1) / cols columns: 1.3x for R = 2, cols = 8).
//
// Forward: band = R output rows (input rows 2Rb - 1 .. 2Rb + 2R - 1).  Per step a
// row pass (columns 2ow - 1, 2ow, 2ow + 1 of each input row, in that order)
// shared by the two output rows meeting on a row, then the column pass: the
// order of pool_k3s2_forward (so the same values: max picks the first maximum
// in row-major order, the last NaN; padding never wins over a real element;
// average sums in that order and divides by PyTorch's divisor).
//
// Backward (max): band = 2R *input* rows 2Rb .. 2Rb + 2R - 1, owned: every dx
// element is written by exactly one thread, once (16-byte stores), no
// atomics, no argmax bytes.  Windows touching the band: output rows Rb .. Rb +
// R (input rows 2Rb - 1 .. 2Rb + 2R + 1).  Per step ow the thread computes the
// argmax of windows (Rb + k, ow) for k = 0 .. R from the three carried / loaded
// columns, then finishes dx column 2ow - 1 (covered by windows ow - 1, kept from
// the previous step, and ow) and column 2ow (window ow only), adding each
// window's dy where its argmax lies, windows in row-major order (the gather's
// order).  A segment owns dx columns 2 * cols * s .. 2 * cols * (s + 1) - 1 and
// steps over windows cols * s .. cols * (s + 1) (one extra: its last odd column
// is covered by the next segment's first window; step Wo is a window-less
// step that finishes the last column when W is even).  DRAM traffic is the
// floor: x and dy read once, dx written once.
//
// Measured (H100, notes/pool3.md, 64 x 56 x 56 x 256; fraction of copy over the
// floor bytes): forward 0.91 float32, 0.89 float16 (packed pairs; 0.72-0.79
// scalar); backward 0.79-0.80 float32, 2.1x PyTorch (argmax bytes + gather
// before: 0.49, 1.3x); float16 / bfloat16 0.56, 2.7x PyTorch on packed pairs
// (nhwc_k3s2_backward_pairs, 135 registers; 0.33 scalar: compare-bound, 218
// registers; notes/pool4.md); 0.87 (float16 / bfloat16) and 0.79 (float32) with
// MINB = 2 (128 registers: two blocks of 256 per SM; notes/pool5.md).  R = 2
// measured slower in both directions (registers), one segment per row fastest
// for the backward (each seam recomputes a window column).

// The VEC channels at input rows h0 .. h0 + ROWS - 1 of column w (NHWC, image
// base xn, channel offset included); `fill` where the pixel is outside the image.
template <typename T, typename index_t, int VEC, int ROWS>
__device__ __forceinline__ void load_nhwc_column(PackN<T, VEC> (&out)[ROWS], const T* __restrict__ xn,
                                                 int h0, int w, int H, int W, int C, T fill) {
    const bool col_ok = w >= 0 && w < W;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const int h = h0 + r;
        if (col_ok && h >= 0 && h < H) {
            out[r] = load_pack<T, VEC>(xn + ((index_t)h * W + w) * C);
        } else {
#pragma unroll
            for (int e = 0; e < VEC; ++e) out[r].v[e] = fill;
        }
    }
}

// Whether a loaded column holds a NaN (any_nan over its values).
template <typename T, int VEC, int ROWS>
__device__ __forceinline__ bool nhwc_column_nan(const PackN<T, VEC> (&col)[ROWS]) {
    acc_t<T> v[ROWS * VEC];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int e = 0; e < VEC; ++e) v[r * VEC + e] = load(col[r].v[e]);
    return any_nan<ROWS * VEC>(v);
}

// (image n, band, segment, channel c) of thread item i.
template <typename index_t>
__device__ __forceinline__ void image_band_segment(index_t i, int lanes, int bands, int segments, int vec,
                                                   index_t& n, int& band, int& seg, int& c) {
    index_t p;
    plane_band_lane<index_t>(i, lanes, bands, p, band, c);
    c *= vec;
    n = p / segments;
    seg = (int)(p - n * segments);
}

template <typename T, typename index_t, bool MAX, int R>
__global__ void __launch_bounds__(256)
pool_nhwc_k3s2_forward(const T* __restrict__ x, T* __restrict__ y, index_t items, int C, int H, int W,
                       int Ho, int Wo, int bands, int segments, int cols, int count_include_pad) {
    typedef acc_t<T> A;
    constexpr int VEC = 16 / sizeof(T), ROWS = 2 * R + 1;
    const int lanes = C / VEC;
    const T fill = store<T>(MAX ? negative_infinity<A>() : A(0));
    for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < items;
         i += (index_t)blockDim.x * gridDim.x) {
        index_t n;
        int band, seg, c;
        image_band_segment<index_t>(i, lanes, bands, segments, VEC, n, band, seg, c);
        const T* xn = x + n * H * W * C + c;
        T* yn = y + n * Ho * Wo * C + c;
        const int oh0 = band * R, h0 = 2 * oh0 - 1;
        const int ow0 = seg * cols, ow1 = min(ow0 + cols, Wo);
        PackN<T, VEC> left[ROWS];  // input column 2ow - 1
        load_nhwc_column<T, index_t, VEC, ROWS>(left, xn, h0, 2 * ow0 - 1, H, W, C, fill);
        for (int ow = ow0; ow < ow1; ++ow) {
            PackN<T, VEC> mid[ROWS], right[ROWS];
            load_nhwc_column<T, index_t, VEC, ROWS>(mid, xn, h0, 2 * ow, H, W, C, fill);
            load_nhwc_column<T, index_t, VEC, ROWS>(right, xn, h0, 2 * ow + 1, H, W, C, fill);
            if constexpr (MAX && PACKED_MAX_PAIRS && sizeof(T) == 2) {
                // packed pairs (see k3s2_max_forward_pairs: the same maximum, +0.0 for mixed zeros)
                PackN<T, VEC> rw[ROWS];
#pragma unroll
                for (int r = 0; r < ROWS; ++r) rw[r] = max3_pairs<T, VEC>(left[r], mid[r], right[r]);
#pragma unroll
                for (int k = 0; k < R; ++k) {
                    const int oh = oh0 + k;
                    if (oh >= Ho) break;
                    *reinterpret_cast<PackN<T, VEC>*>(yn + ((index_t)oh * Wo + ow) * C) =
                        max3_pairs<T, VEC>(rw[2 * k], rw[2 * k + 1], rw[2 * k + 2]);
                }
            } else {
                A rp[ROWS][VEC];  // row pass: columns 2ow - 1, 2ow, 2ow + 1 of each row
#pragma unroll
                for (int r = 0; r < ROWS; ++r)
#pragma unroll
                    for (int v = 0; v < VEC; ++v)
                        rp[r][v] = reduce3<MAX>(load(left[r].v[v]), load(mid[r].v[v]), load(right[r].v[v]));
#pragma unroll
                for (int k = 0; k < R; ++k) {
                    const int oh = oh0 + k;
                    if (oh >= Ho) break;
                    const A divisor = MAX ? A(1) : A(avg_divisor<int>(2 * oh - 1, 2 * ow - 1, 3, 3, H, W, 1, 1,
                                                                      count_include_pad));
                    PackN<T, VEC> pk;
#pragma unroll
                    for (int v = 0; v < VEC; ++v) {
                        const A m = reduce3<MAX>(rp[2 * k][v], rp[2 * k + 1][v], rp[2 * k + 2][v]);
                        pk.v[v] = store<T>(MAX ? m : m / divisor);
                    }
                    *reinterpret_cast<PackN<T, VEC>*>(yn + ((index_t)oh * Wo + ow) * C) = pk;
                }
            }
#pragma unroll
            for (int r = 0; r < ROWS; ++r) left[r] = right[r];
        }
    }
}

// The 16-bit words of VEC = 8 channels at input rows h0 .. h0 + 4 of column w
// (NHWC, image base xn, channel offset included); -inf pairs outside the image.
template <typename T, typename index_t>
__device__ __forceinline__ void load_nhwc_words(unsigned (&out)[5][4], const T* __restrict__ xn, int h0, int w,
                                                int H, int W, int C) {
    constexpr unsigned NINF2 = NegInfBits<T>::value * 0x10001u;
    const bool col_ok = w >= 0 && w < W;
#pragma unroll
    for (int r = 0; r < 5; ++r) {
        const int h = h0 + r;
        if (col_ok && h >= 0 && h < H) {
            const PackN<unsigned, 4> pk =
                load_pack<unsigned, 4>(reinterpret_cast<const unsigned*>(xn + ((index_t)h * W + w) * C));
#pragma unroll
            for (int i = 0; i < 4; ++i) out[r][i] = pk.v[i];
        } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) out[r][i] = NINF2;
        }
    }
}

// Sum of 16-bit float pairs, a + b, rounded once (add.{f16,bf16}x2); equal to
// the float sum rounded to T (float has 24 >= 2p + 2 bits: double rounding is
// innocuous), and +0 for (+-0) + (+-0) unless both are -0.
#if PACKED_CMP_PAIRS
PAIR_INSTRUCTION(add_pairs, "add.rn.f16x2", "add.rn.bf16x2")
#endif

// One item (band of input rows h0 + 1, h0 + 2, segment ow0 .. ow1, 8 channels)
// of pool_nhwc_k3s2_backward for 16-bit T, R = 1, on packed channel pairs
// (see k3s2_max_backward_pairs): a word holds channels (2i, 2i + 1) of one
// pixel, so a window's nine elements are nine words, no permutes.  Per step and
// window (k = 0, 1) the maximum M (row pass shared by both windows), then the
// shares of dy (eq & ~seen & dy) per element; a step whose windows hold a NaN or
// only -inf takes the exact rule per channel (argmax3x3<true>) instead, giving
// the same shares.  dx: columns 2ow - 1 (windows ow - 1, ow: up to four shares,
// summed in float in the gather's order) and 2ow (window ow), sums of two
// shares by add_pairs (the float sum rounded once: bitwise the scalar path's).
template <typename T, typename index_t>
__device__ __forceinline__ void nhwc_k3s2_backward_pairs(const T* __restrict__ xn, const T* __restrict__ dyn,
                                                         T* __restrict__ dxn, int C, int H, int W, int Ho,
                                                         int Wo, int oh0, int ow0, int ow1, int cols) {
#if PACKED_CMP_PAIRS
    constexpr unsigned NINF2 = NegInfBits<T>::value * 0x10001u;
    const int h0 = 2 * oh0 - 1;
    const bool second = oh0 + 1 < Ho;  // window row oh0 + 1 exists
    bool row_ok[5];
#pragma unroll
    for (int r = 0; r < 5; ++r) row_ok[r] = h0 + r >= 0 && h0 + r < H;
    unsigned col[3][5][4];  // input columns 2ow - 1, 2ow, 2ow + 1: [column][x row][word]
    load_nhwc_words<T, index_t>(col[0], xn, h0, 2 * ow0 - 1, H, W, C);
    bool left_ok = ow0 > 0;
    // shares of window (oh0 + k, ow - 1) in its right column: [0] = (k 0, row a 1) -> dx row 1,
    // [1] = (k 0, a 2) -> dx row 2, [2] = (k 1, a 0) -> dx row 2; likewise cur0 / cur1 for the
    // left / middle column of window ow
    unsigned prev[3][4];
#pragma unroll
    for (int s = 0; s < 3; ++s)
#pragma unroll
        for (int i = 0; i < 4; ++i) prev[s][i] = 0u;
    for (int ow = ow0; ow <= ow1; ++ow) {
        load_nhwc_words<T, index_t>(col[1], xn, h0, 2 * ow, H, W, C);
        load_nhwc_words<T, index_t>(col[2], xn, h0, 2 * ow + 1, H, W, C);
        const bool window = ow < Wo;
        const bool need[2] = {window, window && second};
        unsigned g[2][4];
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            if (need[k]) {
                const PackN<unsigned, 4> pk = load_pack<unsigned, 4>(
                    reinterpret_cast<const unsigned*>(dyn + ((index_t)(oh0 + k) * Wo + ow) * C));
#pragma unroll
                for (int i = 0; i < 4; ++i) g[k][i] = pk.v[i];
            } else {
#pragma unroll
                for (int i = 0; i < 4; ++i) g[k][i] = 0u;
            }
        }
        unsigned M[2][4], ok = 0xffffffffu;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            unsigned rm[5];
#pragma unroll
            for (int r = 0; r < 5; ++r)
                rm[r] = max_nan_pairs<T>(max_nan_pairs<T>(col[0][r][i], col[1][r][i]), col[2][r][i]);
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                M[k][i] = max_nan_pairs<T>(max_nan_pairs<T>(rm[2 * k], rm[2 * k + 1]), rm[2 * k + 2]);
                if (need[k]) ok &= gt_pairs<T>(M[k][i], NINF2);
            }
        }
        unsigned next[3][4], cur0[3][4], cur1[3][4];
        if (ok == 0xffffffffu) {
#pragma unroll
            for (int k = 0; k < 2; ++k)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    unsigned share[3][3];
                    first_max_shares<T>([&](int a, int c) { return col[c][2 * k + a][i]; }, M[k][i], g[k][i],
                                        share);
#pragma unroll
                    for (int a = 0; a < 3; ++a)
#pragma unroll
                        for (int c = 0; c < 3; ++c) {
                            const int s = k == 0 ? a - 1 : (a == 0 ? 2 : -1);
                            if (s >= 0) (c == 0 ? cur0 : c == 1 ? cur1 : next)[s][i] = share[a][c];
                        }
                }
        } else {
            // the exact rule, channel by channel
            const bool col_ok[3] = {left_ok, 2 * ow < W, 2 * ow + 1 < W};
#pragma unroll
            for (int s = 0; s < 3; ++s)
#pragma unroll
                for (int i = 0; i < 4; ++i) next[s][i] = cur0[s][i] = cur1[s][i] = 0u;
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                const bool row[3] = {need[k] && row_ok[2 * k], need[k] && row_ok[2 * k + 1],
                                     need[k] && row_ok[2 * k + 2]};
#pragma unroll
                for (int v = 0; v < 8; ++v) {
                    const int i = v / 2, shift = 16 * (v % 2);
                    const int pos = argmax3x3<true, float>([&](int a, int c) {
                        T h;
                        h.bits = (unsigned short)(col[c][2 * k + a][i] >> shift);
                        return load(h);
                    }, row, col_ok);
                    const unsigned gv = g[k][i] & (0xffffu << shift);
#pragma unroll
                    for (int a = 0; a < 3; ++a) {
                        const int s = k == 0 ? a - 1 : (a == 0 ? 2 : -1);
                        if (s < 0) continue;
                        if (pos == a * 3) cur0[s][i] |= gv;
                        if (pos == a * 3 + 1) cur1[s][i] |= gv;
                        if (pos == a * 3 + 2) next[s][i] |= gv;
                    }
                }
            }
        }
        // dx column 2ow - 1: row 1 = prev[0] + cur0[0]; row 2 = prev[1] + cur0[1] + prev[2] + cur0[2]
        const int w = 2 * ow - 1;
        if (ow > ow0 && w < W) {
            PackN<unsigned, 4> r1, r2;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                r1.v[i] = add_pairs<T>(add_pairs<T>(0u, prev[0][i]), cur0[0][i]);
                float lo = 0.0f, hi = 0.0f;
                lo += half_of<T, false>(prev[1][i]);
                hi += half_of<T, true>(prev[1][i]);
                lo += half_of<T, false>(cur0[1][i]);
                hi += half_of<T, true>(cur0[1][i]);
                lo += half_of<T, false>(prev[2][i]);
                hi += half_of<T, true>(prev[2][i]);
                lo += half_of<T, false>(cur0[2][i]);
                hi += half_of<T, true>(cur0[2][i]);
                r2.v[i] = (unsigned)store<T>(lo).bits | ((unsigned)store<T>(hi).bits << 16);
            }
            *reinterpret_cast<PackN<unsigned, 4>*>(dxn + ((index_t)(h0 + 1) * W + w) * C) = r1;
            if (h0 + 2 < H) *reinterpret_cast<PackN<unsigned, 4>*>(dxn + ((index_t)(h0 + 2) * W + w) * C) = r2;
        }
        // dx column 2ow: row 1 = cur1[0]; row 2 = cur1[1] + cur1[2]
        if (ow < ow0 + cols && 2 * ow < W) {
            PackN<unsigned, 4> r1, r2;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                r1.v[i] = add_pairs<T>(0u, cur1[0][i]);
                r2.v[i] = add_pairs<T>(add_pairs<T>(0u, cur1[1][i]), cur1[2][i]);
            }
            *reinterpret_cast<PackN<unsigned, 4>*>(dxn + ((index_t)(h0 + 1) * W + 2 * ow) * C) = r1;
            if (h0 + 2 < H)
                *reinterpret_cast<PackN<unsigned, 4>*>(dxn + ((index_t)(h0 + 2) * W + 2 * ow) * C) = r2;
        }
#pragma unroll
        for (int r = 0; r < 5; ++r)
#pragma unroll
            for (int i = 0; i < 4; ++i) col[0][r][i] = col[2][r][i];
        left_ok = 2 * ow + 1 < W;
#pragma unroll
        for (int s = 0; s < 3; ++s)
#pragma unroll
            for (int i = 0; i < 4; ++i) prev[s][i] = next[s][i];
    }
#endif
}

// The column walk of the NHWC max 3x3 / 2 / 1 backward kernels below, shared by
// pool_nhwc_k3s2_backward (a band of R window rows, all computed here) and
// pool_nhwc_k3s2_backward_shfl (one window row computed, the one below taken
// from the next slot by shuffles).  A thread walks output columns ow0 .. ow1
// of its band (x columns rolled: left = 2ow - 1 from the previous step) over
// the XR x rows h0 .. h0 + XR - 1; `windows(left, mid, right, col_ok, exact,
// ow, g, pos)` fills the WR window rows' dy and argmax positions (a * 3 + c,
// -1: no window) of column ow and is called by every lane at every step
// (uniform: the shuffles); the dx rows h0 + 1 .. h0 + 2 (WR - 1) of columns
// 2ow - 1 (windows ow - 1 and ow) and 2ow (window ow) are summed in the
// gather's order and written when `owner`.
template <typename T, typename index_t, int VEC, int XR, int WR, typename Windows>
__device__ __forceinline__ void nhwc_k3s2_backward_walk(const T* __restrict__ xn, T* __restrict__ dxn, int C,
                                                        int H, int W, int h0, int ow0, int ow1, int cols,
                                                        bool owner, Windows windows) {
    typedef acc_t<T> A;
    constexpr int R = WR - 1;
    const T fill = store<T>(negative_infinity<A>());  // padding: argmax3x3's fast path
    PackN<T, VEC> left[XR];  // input column 2ow - 1
    load_nhwc_column<T, index_t, VEC, XR>(left, xn, h0, 2 * ow0 - 1, H, W, C, fill);
    bool left_ok = ow0 > 0, left_nan = nhwc_column_nan<T, VEC, XR>(left);
    // windows (oh0 + k, ow - 1) of the previous step: argmax position a * 3 + c
    // (-1: no window) and dy
    int prev_pos[WR][VEC];
    A prev_g[WR][VEC];
#pragma unroll
    for (int k = 0; k < WR; ++k)
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            prev_pos[k][v] = -1;
            prev_g[k][v] = A(0);
        }
    for (int ow = ow0; ow <= ow1; ++ow) {
        PackN<T, VEC> mid[XR], right[XR];
        load_nhwc_column<T, index_t, VEC, XR>(mid, xn, h0, 2 * ow, H, W, C, fill);
        load_nhwc_column<T, index_t, VEC, XR>(right, xn, h0, 2 * ow + 1, H, W, C, fill);
        const bool col_ok[3] = {left_ok, 2 * ow < W, 2 * ow + 1 < W};
        const bool right_nan = nhwc_column_nan<T, VEC, XR>(right);
        const bool exact = left_nan || right_nan || nhwc_column_nan<T, VEC, XR>(mid);
        A g[WR][VEC];
        int pos[WR][VEC];
        windows(left, mid, right, col_ok, exact, ow, g, pos);
        // dx column 2ow - 1 (windows ow - 1 and ow) and 2ow (window ow); local rows 1 .. 2R
#pragma unroll
        for (int side = 0; side < 2; ++side) {
            const int w = 2 * ow - 1 + side;
            if (!owner || (side == 0 ? !(ow > ow0 && w < W) : !(ow < ow0 + cols && w < W))) continue;
#pragma unroll
            for (int r = 1; r <= 2 * R; ++r) {
                const int h = h0 + r;
                if (h >= H) break;
                PackN<T, VEC> pk;
#pragma unroll
                for (int v = 0; v < VEC; ++v) {
                    A s = A(0);
#pragma unroll
                    for (int k = 0; k < WR; ++k) {
                        const int a = r - 2 * k;
                        if (a < 0 || a > 2) continue;
                        if (side == 0) {
                            s += prev_pos[k][v] == a * 3 + 2 ? prev_g[k][v] : A(0);
                            s += pos[k][v] == a * 3 ? g[k][v] : A(0);
                        } else {
                            s += pos[k][v] == a * 3 + 1 ? g[k][v] : A(0);
                        }
                    }
                    pk.v[v] = store<T>(s);
                }
                *reinterpret_cast<PackN<T, VEC>*>(dxn + ((index_t)h * W + w) * C) = pk;
            }
        }
#pragma unroll
        for (int r = 0; r < XR; ++r) left[r] = right[r];
        left_ok = col_ok[2];
        left_nan = right_nan;
#pragma unroll
        for (int k = 0; k < WR; ++k)
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                prev_pos[k][v] = pos[k][v];
                prev_g[k][v] = g[k][v];
            }
    }
}

template <typename T, typename index_t, int R, int MINB>
__global__ void __launch_bounds__(256, MINB)
pool_nhwc_k3s2_backward(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx,
                        index_t items, int C, int H, int W, int Ho, int Wo, int bands, int segments,
                        int cols) {
    typedef acc_t<T> A;
    constexpr int VEC = 16 / sizeof(T), XR = 2 * R + 3, WR = R + 1;
    const int lanes = C / VEC;
    for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < items;
         i += (index_t)blockDim.x * gridDim.x) {
        index_t n;
        int band, seg, c;
        image_band_segment<index_t>(i, lanes, bands, segments, VEC, n, band, seg, c);
        const T* xn = x + n * H * W * C + c;
        const T* dyn = dy + n * Ho * Wo * C + c;
        T* dxn = dx + n * H * W * C + c;
        const int oh0 = band * R, h0 = 2 * oh0 - 1;  // local x row r = input row h0 + r
        const int ow0 = seg * cols, ow1 = min(ow0 + cols, Wo);
        if constexpr (sizeof(T) == 2 && R == 1 && PACKED_CMP_PAIRS) {
            nhwc_k3s2_backward_pairs<T, index_t>(xn, dyn, dxn, C, H, W, Ho, Wo, oh0, ow0, ow1, cols);
        } else {
            bool row_ok[XR];
#pragma unroll
            for (int r = 0; r < XR; ++r) row_ok[r] = h0 + r >= 0 && h0 + r < H;
            nhwc_k3s2_backward_walk<T, index_t, VEC, XR, WR>(
                xn, dxn, C, H, W, h0, ow0, ow1, cols, true,
                [&](const PackN<T, VEC>(&left)[XR], const PackN<T, VEC>(&mid)[XR], const PackN<T, VEC>(&right)[XR],
                    const bool (&col_ok)[3], bool exact, int ow, A(&g)[WR][VEC], int(&pos)[WR][VEC]) {
                    auto windows = [&](auto exact_rule) {
#pragma unroll
                        for (int k = 0; k < WR; ++k) {
                            const bool window = oh0 + k < Ho && ow < Wo;
                            if (window) {
                                const PackN<T, VEC> pk =
                                    load_pack<T, VEC>(dyn + ((index_t)(oh0 + k) * Wo + ow) * C);
#pragma unroll
                                for (int v = 0; v < VEC; ++v) g[k][v] = load(pk.v[v]);
                            }
                            const bool row[3] = {window && row_ok[2 * k], window && row_ok[2 * k + 1],
                                                 window && row_ok[2 * k + 2]};
#pragma unroll
                            for (int v = 0; v < VEC; ++v) {
                                pos[k][v] = argmax3x3<decltype(exact_rule)::value, A>([&](int a, int cc) {
                                    return load((cc == 0 ? left : cc == 1 ? mid : right)[2 * k + a].v[v]);
                                }, row, col_ok);
                                if (!window) g[k][v] = A(0);
                            }
                        }
                    };
                    if (exact) {
                        windows(Bool<true>());
                    } else {
                        windows(Bool<false>());
                    }
                });
        }
    }
}

// ---------------------------------------------------------------------------
// NCHW float16 / bfloat16 max 3x3 / 2 / 1 backward rolling down the plane
// (pool_k3s2_backward_rolled; packed pairs, sm_90+: Python launches it only
// there, and it traps elsewhere).  Same requirements as pool_k3s2_backward.
//
// pool_k3s2_backward's R = 1 tile loads 5 x rows for 2 dx rows and computes two
// window rows for them, the second again in the next band: 10 windows for 16 dx
// elements, x through L1 / L2 2.5 times.  Here thread = (plane, segment of 2S
// window rows, column vector j) walks down its segment two window rows (oh,
// oh + 1) a step: it loads x rows 2oh .. 2oh + 3 (row 2oh - 1 is carried from
// the previous step), pairs the two window rows in the halves of a word as the
// pair path does (P[a][c] = (local row a, local row a + 2), local row 0 = x row
// 2oh - 1), and finishes per step (a = the element's row in its window):
//   dx 2oh - 1: carried window row oh - 1 (a = 2), then oh (a = 0, low halves);
//   dx 2oh: low halves, a = 1;  dx 2oh + 1: low a = 2, then high a = 0;
//   dx 2oh + 2: high a = 1;  dx 2oh + 3: high a = 2, carried (float) to the next step.
// Each window row is computed once, plus one per segment (the tail step past the
// segment's end finishes its last dx row: window row oh_end, a = 0); x goes
// through L1 (4S + 3) / 4S times.  The tail step has no load phase of its own: the
// last full step also loads its x rows 2oh_end, 2oh_end + 1 and dy row oh_end, and
// its fast path (k3s2_tail_row_pairs, ~100 instructions instead of a pair step's
// ~420) computes only the a = 0 shares on raw words; a tail window with a NaN or
// only -inf reloads its rows and runs as an ordinary step (exact rule).  So a
// thread waits for memory S times per segment, not S + 1 (S = 1: one load phase
// an item, a block's footprint one contiguous run of rows, like float32's R = 2
// tile).  HINT: x rows loaded with the .L2::256B prefetch-size hint.
// Sums are the gather's order (row-major windows, from +0): dx rows 2oh and
// 2oh + 2 (at most two shares a column) by
// add_pairs (the float sum rounded once), the others in float, so dx is bitwise
// pool_k3s2_backward's.  A step whose windows hold a NaN or only -inf takes
// the exact rule per element (argmax3x3<true>) for that step's shares.
// Every dx element is written once by one thread: deterministic, no atomics.
// Measured (H100, notes/poolbwd.md, 64 x 256 x 56 x 56): 0.0967 ms float16,
// 0.0961 bfloat16 with S = 2, two blocks per SM (99 registers): 0.80 of copy,
// 6.2x PyTorch (pool_k3s2_backward: 0.1065, 0.72); S = 2 beats S = 4 / 7 (0.099 /
// 0.105: 11.9 waves of blocks instead of 6 / 3.4), MINB 3 spills and is slower.
// Also measured and dropped (notes/mem5.md, same call: S = 2 0.0963-0.0966):
// S = 3 0.0976, and each step's x rows loaded one step ahead (119 registers,
// still two blocks per SM) 0.0977-0.0990 for S = 2 / 3 / 4, MINB 1 or 2.
// (Those figures are before the tail change; notes/maxpool16.md times S = 1 / 2 / 4,
// MINB 1 / 2 / 3, the hint and a resident grid against them: 117 registers at MINB 2.
// With the tail change, H100 session 9: 0.0880 ms float16 = 0.875 of copy, bfloat16
// unchanged at 0.0966; the hint, MINB 3 and S = 4 were slower.)
// SHARES: 0 = main's fast path (first_max_shares, a branch a window), main's source kept as
// it was; 1 = the shares by first_max_shares_pairwise (3 logic operations fewer a window)
// and one branch a step (fast or exact for all five windows: the fast step is one straight
// block, no BSSY / BSYNC / BRA a window); 2 = 1 with bfloat16's high halves converted on the
// FMA pipe (high_half; float16 as 1).  The step is short of ALU issue slots, bfloat16 more
// than float16: its 24 high-half conversions a step are LOP3s where float16's are HADD2.F32s.
// SASS (NVRTC 13.0 -arch=sm_90 cubin, CuPy's options; S 2, MINB 2, int; whole kernel),
// instructions / ALU pipe / highest register + 1: float16 1648 / 975 / 117 (SHARES 0 =
// main's, instruction for instruction), 1688 / 979 / 126 (1); bfloat16 1648 / 1043 / 117 (0
// = main's), 1656 / 1026 / 126 (1), 1704 / 993 / 125 (2).  H100, session 10: bfloat16 0.0954
// -> 0.0867 ms with SHARES 1 (2: 0.0950), float16 0.0868 at SHARES 0 (notes/poolbf16.md,
// notes/poolbf16_sass.py).  The same shares in the same order: dx bitwise the same.

// 16 bytes of x at p (16-byte aligned) as four words; HINT: with the L2 prefetch-size hint
// .L2::256B (a miss fetches the whole 256-byte block around the sector into L2).
template <bool HINT>
__device__ __forceinline__ PackN<unsigned, 4> load_words4(const unsigned* p) {
    if constexpr (HINT) {
        PackN<unsigned, 4> r;
        asm("ld.global.nc.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(r.v[0]), "=r"(r.v[1]), "=r"(r.v[2]), "=r"(r.v[3]) : "l"(p));
        return r;
    }
    return load_pack<unsigned, 4>(p);
}

// x row h of the tile (at `row`: read only when 0 <= h < H) as words (local columns
// 2i + 1, 2i + 2), i = 0..3, [4] = the right halo (9, 10), and `halo` = local column 0;
// -inf outside.
template <typename T, bool HINT = false>
__device__ __forceinline__ void load_k3s2_words(unsigned (&q)[5], unsigned& halo, const T* __restrict__ row,
                                                int h, int H, bool left, bool right, bool wanted) {
    constexpr unsigned NINF = NegInfBits<T>::value, NINF2 = NINF * 0x10001u;
    if (wanted && h >= 0 && h < H) {
        const PackN<unsigned, 4> pk = load_words4<HINT>(reinterpret_cast<const unsigned*>(row));
#pragma unroll
        for (int i = 0; i < 4; ++i) q[i] = pk.v[i];
        q[4] = right ? *reinterpret_cast<const unsigned*>(row + 8) : NINF2;
        halo = left ? (unsigned)row[-1].bits : NINF;
    } else {
#pragma unroll
        for (int i = 0; i < 5; ++i) q[i] = NINF2;
        halo = NINF;
    }
}

template <typename T>
__device__ __forceinline__ void store_float_row(T* __restrict__ p, const float (&v)[8]) {
    PackN<T, 8> pk;
#pragma unroll
    for (int f = 0; f < 8; ++f) pk.v[f] = store<T>(v[f]);
    *reinterpret_cast<PackN<T, 8>*>(p) = pk;
}

// The rolled kernel's tail step on its fast path: window row oh alone (x rows 2oh - 1,
// 2oh, 2oh + 1 as words r0, r1, r2 with their left halo columns h0, h1, h2; dy row oh as
// d[0] = windows (0, 1), d[1] = (2, 3), d[2] = window 4 in the low half) finishes dx row
// 2oh - 1, the windows' row a = 0 = r0: each window's first-max shares among its first
// three elements (row-major order: they come first, so no later row can take them) are
// added to `row` in the gather's order.  Only the maximum needs the other two rows.
// Raw words, no vertical pairing: word m of r0 = columns (2m + 1, 2m + 2) = (c = 1, c = 2)
// of window m, column 2m (c = 0) = the high half of word m - 1 (m = 0: the halo); the
// window maximum is broadcast to both halves so one packed compare serves c = 1 and 2.
// About 110 instructions instead of a whole pair step (~420).  Returns false (row
// untouched) where an existing window's maximum is NaN or -inf: the caller then runs
// the general step with the exact rule.
template <typename T>
__device__ __forceinline__ bool k3s2_tail_row_pairs(const unsigned (&r0)[5], unsigned h0, const unsigned (&r1)[5],
                                                    unsigned h1, const unsigned (&r2)[5], unsigned h2,
                                                    const unsigned (&d)[3], bool right, float (&row)[8]) {
#if PACKED_CMP_PAIRS
    constexpr unsigned NINF2 = NegInfBits<T>::value * 0x10001u;
    unsigned cm[5], MM[5];
#pragma unroll
    for (int i = 0; i < 5; ++i) cm[i] = max_nan_pairs<T>(max_nan_pairs<T>(r0[i], r1[i]), r2[i]);
    const unsigned ch = max_nan_pairs<T>(max_nan_pairs<T>(h0, h1), h2);  // the halo column (low half)
    unsigned ok = 0xffffffffu;
#pragma unroll
    for (int m = 0; m < 5; ++m) {
        const unsigned c0 = m == 0 ? permute_bytes(ch, 0u, 0x1010u) : permute_bytes(cm[m - 1], 0u, 0x3232u);
        MM[m] = max_nan_pairs<T>(max_nan_pairs<T>(cm[m], permute_bytes(cm[m], 0u, 0x1032u)), c0);
        if (m < 4 || right) ok &= gt_pairs<T>(MM[m], NINF2);
    }
    if (ok != 0xffffffffu) return false;
#pragma unroll
    for (int m = 0; m < 5; ++m) {
        const unsigned gg = permute_bytes(d[m / 2], 0u, m % 2 ? 0x3232u : 0x1010u);  // dy in both halves
        const unsigned e12 = eq_pairs<T>(r0[m], MM[m]);                            // (c = 1, c = 2)
        const unsigned e0 = permute_bytes(eq_pairs<T>(m == 0 ? h0 << 16 : r0[m - 1], MM[m]), 0u, 0x3232u);
        const unsigned e1 = e12 & ~e0;
        const unsigned s12 = e1 & ~(e1 << 16) & gg;  // shares of c = 1 (low), c = 2 (high)
        const unsigned s0 = e0 & gg;                  // share of c = 0 (low)
#pragma unroll
        for (int c = 0; c < 3; ++c) {
            const int f = 2 * m + c - 1;
            if (f < 0 || f >= 8) continue;
            row[f] += c == 0 ? half_of<T, false>(s0) : c == 1 ? half_of<T, false>(s12) : half_of<T, true>(s12);
        }
    }
    return true;
#else
    return false;
#endif
}

template <typename T, typename index_t, int S, int MINB, bool HINT, int SHARES>
__global__ void __launch_bounds__(256, MINB)
pool_k3s2_backward_rolled(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx,
                          index_t items, int H, int W, int Ho, int segments) {
#if PACKED_CMP_PAIRS
    static_assert(sizeof(T) == 2, "16-bit types only");
    constexpr unsigned NINF2 = NegInfBits<T>::value * 0x10001u;
    constexpr int VEC = 8, OUT = 4;
    const int lanes = W / VEC, Wo = W / 2;
    for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < items;
         i += (index_t)blockDim.x * gridDim.x) {
        index_t plane;
        int seg, j;
        plane_band_lane<index_t>(i, lanes, segments, plane, seg, j);
        const T* xp = x + (long long)plane * H * W + VEC * j;
        const T* dyp = dy + (long long)plane * Ho * Wo + OUT * j;
        T* dxp = dx + (long long)plane * H * W + VEC * j;
        // offsets inside a plane in int: H * W < 2^31 on the NCHW paths (Python), and a
        // row is addressed only once it is known to lie in the plane
        const bool left = j > 0, right = j + 1 < lanes;
        const int oh_start = 2 * S * seg, oh_end = min(oh_start + 2 * S, Ho);
        const bool has_tail = oh_end < Ho;  // the tail step computes window row oh_end
        unsigned q[5][5], halo[5];
        // the tail step's x rows 2oh_end, 2oh_end + 1 and dy row oh_end (words 0, 1 and the
        // right halo), loaded with the last full step's rows: no load phase of its own
        unsigned qt[2][5], halot[2], dt[3];
#pragma unroll
        for (int c = 0; c < 5; ++c) qt[0][c] = qt[1][c] = NINF2;
        halot[0] = halot[1] = dt[0] = dt[1] = dt[2] = 0u;
        load_k3s2_words<T, HINT>(q[0], halo[0], xp + (long long)(2 * oh_start - 1) * W, 2 * oh_start - 1, H,
                                 left, right, true);
        float carry[8];  // dx row 2oh - 1 so far: window row oh - 1's shares (a = 2)
#pragma unroll
        for (int f = 0; f < 8; ++f) carry[f] = 0.0f;
        for (int oh = oh_start;; oh += 2) {
            const bool tail = oh >= oh_end;  // only dx row 2oh - 1 is left
            if (tail && (!has_tail || k3s2_tail_row_pairs<T>(q[0], halo[0], qt[0], halot[0], qt[1], halot[1], dt,
                                                             right, carry))) {
                if (2 * oh - 1 < H) store_float_row<T>(dxp + (2 * oh - 1) * W, carry);
                break;
            }
            const bool second = !tail && oh + 1 < Ho;  // window row oh + 1 is this step's
            bool rok[5];
#pragma unroll
            for (int r = 0; r < 5; ++r) rok[r] = 2 * oh - 1 + r >= 0 && 2 * oh - 1 + r < H && (r <= 2 || second);
            const T* xs = xp + (long long)(2 * oh) * W;  // x row 2oh of the tile
#pragma unroll
            for (int r = 1; r < 5; ++r)
                load_k3s2_words<T, HINT>(q[r], halo[r], xs + (r - 1) * W, 2 * oh - 1 + r, H, left, right,
                                         r <= 2 || second);
            // the last full step also loads the tail step's rows (its fast path uses them;
            // the exact fallback, rare, loads them again as a step of its own)
            const bool pre = has_tail && !tail && oh + 2 >= oh_end;
            if (pre) {
                load_k3s2_words<T, HINT>(qt[0], halot[0], xs + 4 * W, 2 * oh + 4, H, left, right, true);
                load_k3s2_words<T, HINT>(qt[1], halot[1], xs + 5 * W, 2 * oh + 5, H, left, right, true);
            }
            const T* drow = dyp + oh * Wo;
            const PackN<unsigned, 2> d0 = load_pack<unsigned, 2>(reinterpret_cast<const unsigned*>(drow));
            PackN<unsigned, 2> d1;
            d1.v[0] = d1.v[1] = 0u;
            if (second) d1 = load_pack<unsigned, 2>(reinterpret_cast<const unsigned*>(drow + Wo));
            if (pre) {
                const PackN<unsigned, 2> d2 = load_pack<unsigned, 2>(reinterpret_cast<const unsigned*>(drow + 2 * Wo));
                dt[0] = d2.v[0];
                dt[1] = d2.v[1];
                dt[2] = right ? (unsigned)drow[2 * Wo + 4].bits : 0u;
            }
            const unsigned g0 = right ? (unsigned)drow[4].bits : 0u;
            const unsigned g1 = right && second ? (unsigned)drow[Wo + 4].bits : 0u;
            unsigned P[3][11];
#pragma unroll
            for (int a = 0; a < 3; ++a) {
                P[a][0] = halo[a] | (halo[a + 2] << 16);
#pragma unroll
                for (int c = 0; c < 5; ++c) {
                    P[a][2 * c + 1] = permute_bytes(q[a][c], q[a + 2][c], 0x5410u);
                    P[a][2 * c + 2] = permute_bytes(q[a][c], q[a + 2][c], 0x7632u);
                }
            }
            unsigned cm[11], M[5];
#pragma unroll
            for (int c = 0; c < 11; ++c) cm[c] = max_nan_pairs<T>(max_nan_pairs<T>(P[0][c], P[1][c]), P[2][c]);
            const unsigned exists = second ? 0xffffffffu : 0x0000ffffu;
            unsigned ok = 0xffffffffu;
#pragma unroll
            for (int m = 0; m < 5; ++m) {
                M[m] = max_nan_pairs<T>(max_nan_pairs<T>(cm[2 * m], cm[2 * m + 1]), cm[2 * m + 2]);
                ok &= gt_pairs<T>(M[m], NINF2) | ~(m < 4 || right ? exists : 0u);
            }
            const bool fast = ok == 0xffffffffu;
            unsigned G[5];  // dy of window pairs m: (row oh, row oh + 1), 0 where no window
            G[0] = permute_bytes(d0.v[0], d1.v[0], 0x5410u);
            G[1] = permute_bytes(d0.v[0], d1.v[0], 0x7632u);
            G[2] = permute_bytes(d0.v[1], d1.v[1], 0x5410u);
            G[3] = permute_bytes(d0.v[1], d1.v[1], 0x7632u);
            G[4] = g0 | (g1 << 16);
            float row0[8], row2[8], row4[8];
            unsigned mid[8];  // dx rows 2oh (low halves) and 2oh + 2 (high) by column
#pragma unroll
            for (int f = 0; f < 8; ++f) {
                row0[f] = carry[f];
                row2[f] = row4[f] = 0.0f;
                mid[f] = 0u;
            }
            unsigned upper[5][3];  // high halves of a = 0: window row oh + 1 -> dx row 2oh + 1
            if constexpr (SHARES == 0) {
                // main's loop token for token (a branch a window).  Written once with the
                // lambdas below, NVRTC 13.0 compiled SHARES 0 to other SASS (float16 9 % slower
                // on the H100, notes/poolbf16.md): the exact rule and the accumulation stay
                // duplicated so that SHARES 0 is main's code instruction for instruction.
#pragma unroll
                for (int m = 0; m < 5; ++m) {
                    unsigned share[3][3];
                    if (fast) {
                        first_max_shares<T>([&](int a, int c) { return P[a][2 * m + c]; }, M[m], G[m], share);
                    } else {
#pragma unroll
                        for (int a = 0; a < 3; ++a)
#pragma unroll
                            for (int c = 0; c < 3; ++c) share[a][c] = 0u;
#pragma unroll
                        for (int k = 0; k < 2; ++k) {
                            const bool w = (k == 0 || second) && (m < 4 || right);
                            const bool row[3] = {w && rok[2 * k], w && rok[2 * k + 1], w && rok[2 * k + 2]};
                            const bool col[3] = {m > 0 || left, true, true};
                            const int pos = argmax3x3<true, float>([&](int a, int c) {
                                return k == 0 ? half_of<T, false>(P[a][2 * m + c]) : half_of<T, true>(P[a][2 * m + c]);
                            }, row, col);
                            const unsigned gk = G[m] & (k == 0 ? 0x0000ffffu : 0xffff0000u);
#pragma unroll
                            for (int a = 0; a < 3; ++a)
#pragma unroll
                                for (int c = 0; c < 3; ++c)
                                    if (pos == a * 3 + c) share[a][c] |= gk;
                        }
                    }
#pragma unroll
                    for (int c = 0; c < 3; ++c) {
                        upper[m][c] = share[0][c];
                        const int f = 2 * m + c - 1;
                        if (f < 0 || f >= 8) continue;
                        row0[f] += half_of<T, false>(share[0][c]);
                        mid[f] = add_pairs<T>(mid[f], share[1][c]);
                        row2[f] += half_of<T, false>(share[2][c]);
                        row4[f] += half_of<T, true>(share[2][c]);
                    }
                }
            } else {
                // window m's shares into the rows, in the gather's order
                auto add_shares = [&](int m, const unsigned (&share)[3][3]) {
#pragma unroll
                    for (int c = 0; c < 3; ++c) {
                        upper[m][c] = share[0][c];
                        const int f = 2 * m + c - 1;
                        if (f < 0 || f >= 8) continue;
                        row0[f] += half_of<T, false>(share[0][c]);
                        mid[f] = add_pairs<T>(mid[f], share[1][c]);
                        row2[f] += half_of<T, false>(share[2][c]);
                        row4[f] += high_half<T, SHARES == 2>(share[2][c]);
                    }
                };
                // window m's shares by the exact rule (argmax3x3<true> per half)
                auto exact_shares = [&](int m, unsigned (&share)[3][3]) {
#pragma unroll
                    for (int a = 0; a < 3; ++a)
#pragma unroll
                        for (int c = 0; c < 3; ++c) share[a][c] = 0u;
#pragma unroll
                    for (int k = 0; k < 2; ++k) {
                        const bool w = (k == 0 || second) && (m < 4 || right);
                        const bool row[3] = {w && rok[2 * k], w && rok[2 * k + 1], w && rok[2 * k + 2]};
                        const bool col[3] = {m > 0 || left, true, true};
                        const int pos = argmax3x3<true, float>([&](int a, int c) {
                            return k == 0 ? half_of<T, false>(P[a][2 * m + c]) : half_of<T, true>(P[a][2 * m + c]);
                        }, row, col);
                        const unsigned gk = G[m] & (k == 0 ? 0x0000ffffu : 0xffff0000u);
#pragma unroll
                        for (int a = 0; a < 3; ++a)
#pragma unroll
                            for (int c = 0; c < 3; ++c)
                                if (pos == a * 3 + c) share[a][c] |= gk;
                    }
                };
                // one branch a step: the fast path's five windows are one straight block
                if (fast) {
#pragma unroll
                    for (int m = 0; m < 5; ++m) {
                        unsigned share[3][3];
                        first_max_shares_pairwise<T>([&](int a, int c) { return P[a][2 * m + c]; }, M[m], G[m],
                                                     share);
                        add_shares(m, share);
                    }
                } else {
#pragma unroll
                    for (int m = 0; m < 5; ++m) {
                        unsigned share[3][3];
                        exact_shares(m, share);
                        add_shares(m, share);
                    }
                }
            }
#pragma unroll
            for (int m = 0; m < 5; ++m)
#pragma unroll
                for (int c = 0; c < 3; ++c) {
                    const int f = 2 * m + c - 1;
                    if (f >= 0 && f < 8) row2[f] += high_half<T, SHARES == 2>(upper[m][c]);
                }
            if (oh > oh_start) store_float_row<T>(dxp + (2 * oh - 1) * W, row0);
            if (tail) break;
            {
                PackN<unsigned, 4> r1, r3;
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                    r1.v[w] = permute_bytes(mid[2 * w], mid[2 * w + 1], 0x5410u);
                    r3.v[w] = permute_bytes(mid[2 * w], mid[2 * w + 1], 0x7632u);
                }
                *reinterpret_cast<PackN<unsigned, 4>*>(dxp + 2 * oh * W) = r1;
                if (2 * oh + 1 < H) store_float_row<T>(dxp + (2 * oh + 1) * W, row2);
                if (2 * oh + 2 < H) *reinterpret_cast<PackN<unsigned, 4>*>(dxp + (2 * oh + 2) * W) = r3;
            }
#pragma unroll
            for (int f = 0; f < 8; ++f) carry[f] = row4[f];
#pragma unroll
            for (int c = 0; c < 5; ++c) q[0][c] = q[4][c];
            halo[0] = halo[4];
        }
    }
#else
    __trap();
#endif
}

// ---------------------------------------------------------------------------
// NHWC float32 max 3x3 / 2 / 1 backward with window rows exchanged by shuffles
// (pool_nhwc_k3s2_backward_shfl; C a multiple of 4 * 32 / SLOTS).
//
// pool_nhwc_k3s2_backward's band (dx rows 2oh, 2oh + 1) computes window rows oh
// and oh + 1 from x rows 2oh - 1 .. 2oh + 3: window row oh + 1 is computed again
// by the next band, x goes through L1 / L2 2.5 times.  Here a warp is SLOTS
// vertically adjacent bands x 32 / SLOTS channel vectors (lane = slot * CV + cv,
// CV = 32 / SLOTS, consecutive cv: consecutive 16-byte vectors of one pixel):
// slot s computes only window row oh = (SLOTS - 1) * group + s from x rows
// 2oh - 1 .. 2oh + 1 and takes window row oh + 1's argmax positions and dy from
// slot s + 1 (__shfl_down_sync by CV lanes, uniform code: every lane of a warp
// walks the same columns).  Slots 0 .. SLOTS - 2 own their bands' dx rows; the
// last slot computes its window row for the slot above only (the next group's
// slot 0 computes it again): SLOTS / (SLOTS - 1) windows per window row, x
// 1.5 SLOTS / (SLOTS - 1) times through L1.  Otherwise as pool_nhwc_k3s2_backward:
// both walk the columns in nhwc_k3s2_backward_walk (the same sums in the same
// order: dx is bitwise its) and differ only in how a step gets its windows.
// Measured (H100, notes/poolbwd.md, 64 x 56 x 56 x 256, cols 32): 0.1776 ms with
// SLOTS = 8, two blocks per SM (92 registers): 0.87 of copy, 2.3x PyTorch
// (pool_nhwc_k3s2_backward: 0.1952, 0.79); SLOTS = 4 0.199, MINB 3 (80 registers) 0.249.
// After the fold into nhwc_k3s2_backward_walk (same registers): 0.1758-0.1760 ms,
// 0.876 of copy, 2.32x (notes/mem5.md).
template <typename T, typename index_t, int SLOTS, int MINB>
__global__ void __launch_bounds__(256, MINB)
pool_nhwc_k3s2_backward_shfl(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx,
                             index_t items, int C, int H, int W, int Ho, int Wo, int groups, int segments,
                             int cols) {
    typedef acc_t<T> A;
    constexpr int VEC = 16 / sizeof(T), CV = 32 / SLOTS, XR = 3;
    const int quads = C / (VEC * CV);  // warps across the channels
    for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < items;
         i += (index_t)blockDim.x * gridDim.x) {
        // items is a multiple of 32: a warp's lanes stay together
        const int lane = (int)(i & 31), slot = lane / CV, cv = lane - slot * CV;
        const index_t wi = i >> 5;
        index_t q = wi / quads;
        const int cq = (int)(wi - q * quads);
        index_t p = q / groups;
        const int group = (int)(q - p * groups);
        const index_t n = p / segments;
        const int seg = (int)(p - n * segments);
        const int c = (cq * CV + cv) * VEC;
        const T* xn = x + n * H * W * C + c;
        const T* dyn = dy + n * Ho * Wo * C + c;
        T* dxn = dx + n * H * W * C + c;
        const int oh0 = (SLOTS - 1) * group + slot, h0 = 2 * oh0 - 1;  // local x row r = input row h0 + r
        const bool owner = slot < SLOTS - 1 && oh0 < Ho;
        const int ow0 = seg * cols, ow1 = min(ow0 + cols, Wo);
        bool row_ok[XR];
#pragma unroll
        for (int r = 0; r < XR; ++r) row_ok[r] = h0 + r >= 0 && h0 + r < H;
        nhwc_k3s2_backward_walk<T, index_t, VEC, XR, 2>(
            xn, dxn, C, H, W, h0, ow0, ow1, cols, owner,
            [&](const PackN<T, VEC>(&left)[XR], const PackN<T, VEC>(&mid)[XR], const PackN<T, VEC>(&right)[XR],
                const bool (&col_ok)[3], bool exact, int ow, A(&g)[2][VEC], int(&pos)[2][VEC]) {
                const bool window = oh0 < Ho && ow < Wo;
                if (window) {
                    const PackN<T, VEC> pk = load_pack<T, VEC>(dyn + ((index_t)oh0 * Wo + ow) * C);
#pragma unroll
                    for (int v = 0; v < VEC; ++v) g[0][v] = load(pk.v[v]);
                } else {
#pragma unroll
                    for (int v = 0; v < VEC; ++v) g[0][v] = A(0);
                }
                const bool row[3] = {window && row_ok[0], window && row_ok[1], window && row_ok[2]};
                auto argmaxes = [&](auto exact_rule) {
#pragma unroll
                    for (int v = 0; v < VEC; ++v)
                        pos[0][v] = argmax3x3<decltype(exact_rule)::value, A>([&](int a, int cc) {
                            return load((cc == 0 ? left : cc == 1 ? mid : right)[a].v[v]);
                        }, row, col_ok);
                };
                if (exact) {
                    argmaxes(Bool<true>());
                } else {
                    argmaxes(Bool<false>());
                }
                // window row oh0 + 1: the slot below (the last slot's values are never used)
#pragma unroll
                for (int v = 0; v < VEC; ++v) {
                    pos[1][v] = __shfl_down_sync(0xffffffffu, pos[0][v], CV);
                    g[1][v] = __shfl_down_sync(0xffffffffu, g[0][v], CV);
                }
            });
    }
}

// ---------------------------------------------------------------------------
// NCHW float32 max 3x3 / 2 / 1 backward walking down the plane one window row a
// step (pool_k3s2_backward_walk <T, index_t, S, MINB, PF>; same requirements as
// pool_k3s2_backward: W % VEC == 0, 16-byte aligned arrays).
//
// pool_k3s2_backward's R = 2 tile (99 registers: two blocks of 256 an SM, 16
// warps) loads 7 x rows for 4 dx rows and computes 3 x 3 windows for them: x
// through L1 / L2 1.75 times, 2.25 windows an owned window, ~700 instructions a
// thread, one load phase, then the arithmetic with nothing in flight.  Here
// thread = (plane, segment of S window rows, column vector j) walks down its
// segment one window row oh a step: x row 2oh - 1 is carried from the step
// before, rows 2oh, 2oh + 1 and dy row oh are loaded (each as the 16-byte
// vector, the left halo scalar and the 2-element right halo, as
// load_row_vector), the windows (oh, OUT*j + m), m = 0 .. OUT, are computed
// once (argmax3x3: the fast rule unless the step's three rows hold a NaN), and
// per step (a = the element's row in its window):
//   dx 2oh - 1: carried window row oh - 1 (a = 2), then oh (a = 0)   (stored)
//   dx 2oh:     window row oh (a = 1)                                 (stored)
//   dx 2oh + 1: window row oh (a = 2), carried to the next step.
// The tail step past the segment's end (window row oh_end < Ho) finishes dx row
// 2oh_end - 1 only.  So (S + 1) / S window rows an owned one, x rows through L1
// (2S + 2) / 2S times, ~270 SASS instructions a step on the fast path (8 dx
// elements; the tile: ~700 for 16) and 56-64 registers (NVRTC 13.0, sm_90, S 4,
// MINB 4, without / with PF): four blocks an SM fit.  PF: the next step's two x rows
// and dy row are loaded before this step's arithmetic (17 more registers), so
// a thread always has a step of loads in flight (the tile has one load phase
// and then none).  Sums are the gather's order (row-major windows, from +0), so
// dx is bitwise pool_k3s2_backward's; every dx element is written once by one
// thread: deterministic, no atomics.
template <typename T, typename index_t, int S, int MINB, bool PF>
__global__ void __launch_bounds__(256, MINB)
pool_k3s2_backward_walk(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx,
                        index_t items, int H, int W, int Ho, int segments) {
    typedef acc_t<T> A;
    constexpr int VEC = 16 / sizeof(T), OUT = VEC / 2, XC = VEC + 3;  // x columns VEC*j - 1 .. VEC*j + VEC + 1
    const int lanes = W / VEC, Wo = W / 2;
    const A ninf = negative_infinity<A>();
    for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < items;
         i += (index_t)blockDim.x * gridDim.x) {
        index_t plane;
        int seg, j;
        plane_band_lane<index_t>(i, lanes, segments, plane, seg, j);
        const T* xp = x + (long long)plane * H * W + VEC * j;
        const T* dyp = dy + (long long)plane * Ho * Wo + OUT * j;
        T* dxp = dx + (long long)plane * H * W + VEC * j;
        const bool left = j > 0, right = j + 1 < lanes;  // right: the window column OUT*j + OUT exists
        const int oh_start = seg * S, oh_end = min(oh_start + S, Ho);
        const int oh_last = oh_end < Ho ? oh_end : Ho - 1;  // the tail step, or the plane's last window row
        // x rows 2oh - 1 (top), 2oh (mid), 2oh + 1 (bot); dy row oh (g); next step's (PF)
        A top[XC], mid[XC], bot[XC], g[OUT + 1];
        auto load_step = [&](int oh, A (&m)[XC], A (&b)[XC], A (&gg)[OUT + 1]) {
            const T* row = xp + (long long)(2 * oh) * W;
            load_row_vector<T, VEC, 2>(m, row, true, left, right, ninf);  // 2oh <= 2Ho - 2 < H
            load_row_vector<T, VEC, 2>(b, row + W, 2 * oh + 1 < H, left, right, ninf);
            const T* drow = dyp + (long long)oh * Wo;
            const PackN<T, OUT> pk = load_pack<T, OUT>(drow);
#pragma unroll
            for (int u = 0; u < OUT; ++u) gg[u] = load(pk.v[u]);
            gg[OUT] = right ? load(drow[OUT]) : A(0);
        };
        load_row_vector<T, VEC, 2>(top, xp + (long long)(2 * oh_start - 1) * W, oh_start > 0, left, right, ninf);
        bool top_nan = any_nan<XC>(top);
        if constexpr (PF) load_step(oh_start, mid, bot, g);
        A carry[VEC];  // dx row 2oh - 1: window row oh - 1's a = 2 shares
#pragma unroll
        for (int f = 0; f < VEC; ++f) carry[f] = A(0);
        for (int oh = oh_start;; ++oh) {
            A nmid[XC], nbot[XC], ng[OUT + 1];
            if constexpr (PF) {
                if (oh < oh_last) load_step(oh + 1, nmid, nbot, ng);
            } else {
                load_step(oh, mid, bot, g);
            }
            const bool bot_nan = any_nan<XC>(bot);
            const bool exact = top_nan || bot_nan || any_nan<XC>(mid);
            const bool row[3] = {2 * oh - 1 >= 0, true, 2 * oh + 1 < H};
            int pos[OUT + 1];
            auto windows = [&](auto exact_rule) {
#pragma unroll
                for (int m = 0; m <= OUT; ++m) {
                    const bool col[3] = {m > 0 || left, true, true};
                    pos[m] = argmax3x3<decltype(exact_rule)::value, A>([&](int a, int c) {
                        return (a == 0 ? top : a == 1 ? mid : bot)[2 * m + c];
                    }, row, col);
                    if (m == OUT && !right) pos[m] = -1;  // no window
                }
            };
            if (exact) {
                windows(Bool<true>());
            } else {
                windows(Bool<false>());
            }
            A r1[VEC], r2[VEC];  // dx rows 2oh (a = 1), 2oh + 1 (a = 2); carry += a = 0
#pragma unroll
            for (int f = 0; f < VEC; ++f) r1[f] = r2[f] = A(0);
#pragma unroll
            for (int m = 0; m <= OUT; ++m)
#pragma unroll
                for (int c = 0; c < 3; ++c) {
                    const int f = 2 * m + c - 1;
                    if (f < 0 || f >= VEC) continue;
                    if (pos[m] == c) carry[f] += g[m];
                    if (pos[m] == 3 + c) r1[f] += g[m];
                    if (pos[m] == 6 + c) r2[f] += g[m];
                }
            if (oh > oh_start) {  // dx row 2oh - 1 (the segment's first belongs to the one above)
                PackN<T, VEC> pk;
#pragma unroll
                for (int f = 0; f < VEC; ++f) pk.v[f] = store<T>(carry[f]);
                *reinterpret_cast<PackN<T, VEC>*>(dxp + (long long)(2 * oh - 1) * W) = pk;
            }
            if (oh == oh_end) break;  // the tail step: dx row 2oh_end - 1 only
            {
                PackN<T, VEC> pk;
#pragma unroll
                for (int f = 0; f < VEC; ++f) pk.v[f] = store<T>(r1[f]);
                *reinterpret_cast<PackN<T, VEC>*>(dxp + (long long)(2 * oh) * W) = pk;
            }
            if (oh == oh_last) {  // the plane's last window row: dx row 2Ho - 1 (even H) has no more windows
                if (2 * oh + 1 < H) {
                    PackN<T, VEC> pk;
#pragma unroll
                    for (int f = 0; f < VEC; ++f) pk.v[f] = store<T>(r2[f]);
                    *reinterpret_cast<PackN<T, VEC>*>(dxp + (long long)(2 * oh + 1) * W) = pk;
                }
                break;
            }
#pragma unroll
            for (int f = 0; f < VEC; ++f) carry[f] = r2[f];
#pragma unroll
            for (int e = 0; e < XC; ++e) top[e] = bot[e];
            top_nan = bot_nan;
            if constexpr (PF) {
#pragma unroll
                for (int e = 0; e < XC; ++e) {
                    mid[e] = nmid[e];
                    bot[e] = nbot[e];
                }
#pragma unroll
                for (int u = 0; u <= OUT; ++u) g[u] = ng[u];
            }
        }
    }
}

// ---------------------------------------------------------------------------
// NHWC float32 max 3x3 / 2 / 1 backward walking DOWN the image one window row a
// step (pool_nhwc_k3s2_backward_walk <T, index_t, K, S, MINB, PF>; C a multiple
// of 4 * 32 / K channels, 16-byte aligned arrays): the NHWC analogue of
// pool_k3s2_backward_walk.
//
// pool_nhwc_k3s2_backward_shfl walks ALONG a band's columns (29 steps of one
// output column on 64 x 56 x 56 x 256, each a load phase and its arithmetic;
// 92 registers, two blocks an SM).  Here a warp is K = 8 (or 4) horizontally
// adjacent window columns x CV = 32 / K channel vectors (lane = slot * CV + cv;
// K 8: 64 bytes of a pixel a slot, as the shfl kernel's slots, 8 pixels an
// instruction; K 4: 128 bytes, whole lines, 4 / 3 windows an owned one across
// instead of 8 / 7): slot s of column group `group`
// takes window column ow = (K - 1) * group + s, and the warp walks down a
// segment of S window rows oh_start .. oh_end - 1 one window row oh a step.  A
// step loads x rows 2oh, 2oh + 1 at columns 2ow - 1, 2ow, 2ow + 1 (six 16-byte
// vectors; row 2oh - 1 is carried from the step before) and dy (oh, ow),
// computes window (oh, ow)'s argmax per channel (argmax3x3: the fast rule
// unless the window's nine elements hold a NaN, the same pick), and takes the
// argmax positions and dy of window (oh, ow + 1) from slot s + 1
// (__shfl_down_sync by CV lanes: 8 shuffles, every lane of a warp runs the same
// steps).  Slots 0 .. K - 2 own dx columns 2ow (fed by window ow only) and
// 2ow + 1 (windows ow, then ow + 1); the last slot computes its window for the
// slot beside it only (the next group's slot 0 computes it again): K / (K - 1)
// windows an owned one across, (S + 1) / S down.  Per step (a = the element's
// row in its window):
//   dx 2oh - 1: carried window row oh - 1 (a = 2), then oh (a = 0)   (stored)
//   dx 2oh:     window row oh (a = 1)                                 (stored)
//   dx 2oh + 1: window row oh (a = 2), carried to the next step.
// The tail step past the segment's end (window row oh_end < Ho) finishes dx row
// 2oh_end - 1 only, as pool_k3s2_backward_walk's.  PF: each next step's loads
// are issued before this step's arithmetic (and the first step's with row
// 2oh_start - 1: one load phase; without PF that costs 128 bytes of spill at
// MINB 4, so row 2oh_start - 1 is a load phase of its own there).  Each dx element gets the shares
// of its windows in row-major window order, summed from +0: dx is bitwise
// pool_nhwc_k3s2_backward_shfl's; every dx element is written once by one
// thread: deterministic, no atomics.
template <typename T, typename index_t, int VEC>
__device__ __forceinline__ void load_nhwc_row3(PackN<T, VEC> (&out)[3], const T* __restrict__ xn, int h, int w0,
                                               bool row_ok, const bool (&col_ok)[3], int W, int C, T fill) {
#pragma unroll
    for (int k = 0; k < 3; ++k) {
        if (row_ok && col_ok[k]) {
            out[k] = load_pack<T, VEC>(xn + ((index_t)h * W + (w0 + k)) * C);
        } else {
#pragma unroll
            for (int e = 0; e < VEC; ++e) out[k].v[e] = fill;
        }
    }
}

// The exact rule's scan (argmax3x3<true>) over the first row of a window, its
// three columns bot[0 .. 2] (`row_ok`, col_ok[c]: inside the input), per
// channel: best and pos (0 .. 2, -1: none real).  pool_nhwc_k3s2_backward_walk
// carries this instead of the row (8 registers, not 12) and goes on with the
// window's other two rows: by the exact rule again where they hold a NaN, else
// by a strict > from (pos < 0 ? -inf and the first real element : best, pos) --
// the same pick (a NaN in the first row stays: nothing is > NaN).
template <typename T, int VEC>
__device__ __forceinline__ void row0_scan(acc_t<T> (&best)[VEC], int (&pos)[VEC], const PackN<T, VEC> (&r)[3],
                                          bool row_ok, const bool (&col_ok)[3]) {
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
        acc_t<T> b = acc_t<T>(0);
        int p = -1;
#pragma unroll
        for (int c = 0; c < 3; ++c) {
            const acc_t<T> e = load(r[c].v[v]);
            if (row_ok && col_ok[c] && (p < 0 || e > b || e != e)) {
                b = e;
                p = c;
            }
        }
        best[v] = b;
        pos[v] = p;
    }
}

template <typename T, typename index_t, int K, int S, int MINB, bool PF>
__global__ void __launch_bounds__(256, MINB)
pool_nhwc_k3s2_backward_walk(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx,
                             index_t items, int C, int H, int W, int Ho, int Wo, int groups, int segments) {
    typedef acc_t<T> A;
    constexpr int VEC = 16 / sizeof(T), CV = 32 / K;
    const int quads = C / (VEC * CV);  // warps across the channels
    const T fill = store<T>(negative_infinity<A>());  // padding: argmax3x3's fast path
    for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < items;
         i += (index_t)blockDim.x * gridDim.x) {
        // items is a multiple of 32: a warp's lanes stay together
        const int lane = (int)(i & 31), slot = lane / CV, cv = lane - slot * CV;
        const index_t wi = i >> 5;
        index_t q = wi / quads;
        const int cq = (int)(wi - q * quads);
        index_t p = q / groups;
        const int group = (int)(q - p * groups);
        const index_t n = p / segments;
        const int seg = (int)(p - n * segments);
        const int c = (cq * CV + cv) * VEC;
        const T* xn = x + n * H * W * C + c;
        const T* dyn = dy + n * Ho * Wo * C + c;
        T* dxn = dx + n * H * W * C + c;
        const int ow = (K - 1) * group + slot;
        const bool window_col = ow < Wo, owner = slot < K - 1 && window_col, right_ok = 2 * ow + 1 < W;
        // a slot past the last window column (ow >= Wo: 2ow >= W) loads nothing: column 2ow - 1 is past
        // the row for odd W or ow > Wo (K 4 on W 112: ow 57, column 113 -- past x's end on the last row)
        const bool col_ok[3] = {ow > 0 && window_col, 2 * ow < W, right_ok};
        const int oh_start = seg * S, oh_end = min(oh_start + S, Ho);  // the same for the whole warp
        const int oh_last = oh_end < Ho ? oh_end : Ho - 1;  // the tail step, or the image's last window row
        // x rows 2oh (mid), 2oh + 1 (bot) at columns 2ow - 1 .. 2ow + 1; dy (oh, ow) (g); the scan of
        // row 2oh - 1 by the exact rule (best0, pos0: see row0_scan)
        PackN<T, VEC> mid[3], bot[3];
        A g[VEC], best0[VEC];
        int pos0[VEC];
        auto load_step = [&](int oh, PackN<T, VEC>(&m)[3], PackN<T, VEC>(&b)[3], A(&gg)[VEC]) {
            load_nhwc_row3<T, index_t, VEC>(m, xn, 2 * oh, 2 * ow - 1, true, col_ok, W, C, fill);  // 2oh < H
            load_nhwc_row3<T, index_t, VEC>(b, xn, 2 * oh + 1, 2 * ow - 1, 2 * oh + 1 < H, col_ok, W, C, fill);
            if (window_col) {
                const PackN<T, VEC> pk = load_pack<T, VEC>(dyn + ((index_t)oh * Wo + ow) * C);
#pragma unroll
                for (int v = 0; v < VEC; ++v) gg[v] = load(pk.v[v]);
            } else {
#pragma unroll
                for (int v = 0; v < VEC; ++v) gg[v] = A(0);
            }
        };
        {  // row 2oh_start - 1 (PF: and the first step's loads, in one load phase)
            PackN<T, VEC> top[3];
            const bool top_ok = oh_start > 0;
            load_nhwc_row3<T, index_t, VEC>(top, xn, 2 * oh_start - 1, 2 * ow - 1, top_ok, col_ok, W, C, fill);
            if constexpr (PF) load_step(oh_start, mid, bot, g);
            row0_scan<T, VEC>(best0, pos0, top, top_ok, col_ok);
        }
        A carry[2][VEC];  // dx row 2oh - 1 at columns 2ow, 2ow + 1: window row oh - 1's a = 2 shares
#pragma unroll
        for (int v = 0; v < VEC; ++v) carry[0][v] = carry[1][v] = A(0);
        for (int oh = oh_start;; ++oh) {
            PackN<T, VEC> nmid[3], nbot[3];
            A ng[VEC];
            if constexpr (PF) {
                if (oh < oh_last) load_step(oh + 1, nmid, nbot, ng);
            } else {
                load_step(oh, mid, bot, g);
            }
            const bool bot_ok = 2 * oh + 1 < H;
            const bool exact = nhwc_column_nan<T, VEC, 3>(bot) || nhwc_column_nan<T, VEC, 3>(mid);
            int pos[VEC];
            if (exact) {  // the exact rule's scan goes on from pos0 / best0
#pragma unroll
                for (int v = 0; v < VEC; ++v) {
                    A best = best0[v];
                    int p = pos0[v];
#pragma unroll
                    for (int a = 1; a < 3; ++a)
#pragma unroll
                        for (int cc = 0; cc < 3; ++cc) {
                            const A e = load((a == 1 ? mid : bot)[cc].v[v]);
                            if ((a == 1 || bot_ok) && col_ok[cc] && (p < 0 || e > best || e != e)) {
                                best = e;
                                p = a * 3 + cc;
                            }
                        }
                    pos[v] = p;
                }
            } else {  // no NaN in rows 2oh, 2oh + 1: a strict > from pos0 / best0 picks the same
                const int first = 3 + (col_ok[0] ? 0 : 1);  // row 2oh's first real element (column 2ow < W)
#pragma unroll
                for (int v = 0; v < VEC; ++v) {
                    A best = pos0[v] < 0 ? negative_infinity<A>() : best0[v];
                    int p = pos0[v] < 0 ? first : pos0[v];
#pragma unroll
                    for (int a = 1; a < 3; ++a)
#pragma unroll
                        for (int cc = 0; cc < 3; ++cc) {
                            const A e = load((a == 1 ? mid : bot)[cc].v[v]);
                            if (e > best) {
                                best = e;
                                p = a * 3 + cc;
                            }
                        }
                    pos[v] = p;
                }
            }
#pragma unroll
            for (int v = 0; v < VEC; ++v)
                if (!window_col) pos[v] = -1;  // no window
            row0_scan<T, VEC>(best0, pos0, bot, bot_ok, col_ok);  // row 2oh + 1: the next window row's first
            // window (oh, ow + 1): the slot beside (the last slot's values are never used)
            int rpos[VEC];
            A rg[VEC];
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                rpos[v] = __shfl_down_sync(0xffffffffu, pos[v], CV);
                rg[v] = __shfl_down_sync(0xffffffffu, g[v], CV);
            }
            // column 2ow: c = 1 of window ow; column 2ow + 1: c = 2 of window ow, then c = 0 of ow + 1
            A r1[2][VEC], r2[2][VEC];  // dx rows 2oh (a = 1), 2oh + 1 (a = 2); carry += a = 0
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                carry[0][v] += pos[v] == 1 ? g[v] : A(0);
                carry[1][v] += pos[v] == 2 ? g[v] : A(0);
                carry[1][v] += rpos[v] == 0 ? rg[v] : A(0);
                r1[0][v] = A(0) + (pos[v] == 4 ? g[v] : A(0));
                r1[1][v] = A(0) + (pos[v] == 5 ? g[v] : A(0));
                r1[1][v] += rpos[v] == 3 ? rg[v] : A(0);
                r2[0][v] = A(0) + (pos[v] == 7 ? g[v] : A(0));
                r2[1][v] = A(0) + (pos[v] == 8 ? g[v] : A(0));
                r2[1][v] += rpos[v] == 6 ? rg[v] : A(0);
            }
            auto store_row = [&](int h, const A(&r)[2][VEC]) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    if (e == 1 && !right_ok) break;
                    PackN<T, VEC> pk;
#pragma unroll
                    for (int v = 0; v < VEC; ++v) pk.v[v] = store<T>(r[e][v]);
                    *reinterpret_cast<PackN<T, VEC>*>(dxn + ((index_t)h * W + (2 * ow + e)) * C) = pk;
                }
            };
            // dx row 2oh - 1 (the segment's first belongs to the one above)
            if (owner && oh > oh_start) store_row(2 * oh - 1, carry);
            if (oh == oh_end) break;  // the tail step: dx row 2oh_end - 1 only
            if (owner) store_row(2 * oh, r1);
            if (oh == oh_last) {  // the image's last window row: dx row 2Ho - 1 (even H) has no more windows
                if (owner && 2 * oh + 1 < H) store_row(2 * oh + 1, r2);
                break;
            }
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                carry[0][v] = r2[0][v];
                carry[1][v] = r2[1][v];
            }
            if constexpr (PF) {
#pragma unroll
                for (int k = 0; k < 3; ++k) {
                    mid[k] = nmid[k];
                    bot[k] = nbot[k];
                }
#pragma unroll
                for (int v = 0; v < VEC; ++v) g[v] = ng[v];
            }
        }
    }
}
