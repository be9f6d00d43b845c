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
// correct for any overlap; the fast paths come with issue 5.
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
