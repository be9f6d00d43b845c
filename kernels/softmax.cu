// Softmax and log-softmax over one axis, forward and backward.
//
// Python views the tensor as (outer, n, inner) with the reduced axis of length
// n in the middle, and picks one of three mappings:
//
//   *_rows_warp    inner == 1 and n <= 1024: one warp per row, blockDim
//                  (32, ROWS); lane l reads elements l, l+32, ... so every
//                  step is a coalesced 128-byte read.  Reductions are warp
//                  shuffles only: no shared memory, no __syncthreads.
//   *_rows_block   inner == 1 and longer rows: one block per row, block-wide
//                  reductions through shared memory.
//   *_columns      inner > 1 (e.g. the channel axis of NCHW): one thread per
//                  (outer, inner) column loops over the n elements with stride
//                  inner.  Neighbouring threads own neighbouring inner indices,
//                  so each step of every thread's loop is one coalesced read
//                  across the warp, and no thread ever talks to another.
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

template <typename A, bool LOG> __device__ __forceinline__ A softmax_value(A v, A m, A s) {
    if (LOG) return v - m - log_acc(s);
    return exp_acc(v - m) / s;
}

// The per-element reduction term of backward: dy*y (softmax) or dy (log).
template <typename A, bool LOG> __device__ __forceinline__ A backward_term(A dy, A y) {
    return LOG ? dy : dy * y;
}

template <typename A, bool LOG> __device__ __forceinline__ A backward_value(A dy, A y, A sum) {
    if (LOG) return dy - exp_acc(y) * sum;
    return y * (dy - sum);
}

// ---- forward ---------------------------------------------------------------

template <typename T, typename index_t, bool LOG>
__global__ void softmax_forward_rows_warp(const T* x, T* y, index_t rows, index_t n) {
    typedef acc_t<T> A;
    const index_t lane = threadIdx.x;
    const index_t row_stride = (index_t)gridDim.x * (index_t)blockDim.y;
    for (index_t row = (index_t)blockIdx.x * (index_t)blockDim.y + (index_t)threadIdx.y; row < rows;
         row += row_stride) {
        const T* xr = x + row * n;
        T* yr = y + row * n;
        A m = negative_infinity<A>(), s = A(0);
        for (index_t k = lane; k < n; k += 32) online_add(m, s, load(xr[k]));
        warp_online_merge(m, s);
        for (index_t k = lane; k < n; k += 32) yr[k] = store<T>(softmax_value<A, LOG>(load(xr[k]), m, s));
    }
}

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

template <typename T, typename index_t, bool LOG>
__global__ void softmax_forward_columns(const T* x, T* y, index_t outer, index_t n, index_t inner) {
    typedef acc_t<T> A;
    const index_t columns = outer * inner;
    const index_t stride = (index_t)gridDim.x * (index_t)blockDim.x;
    for (index_t col = (index_t)blockIdx.x * (index_t)blockDim.x + (index_t)threadIdx.x; col < columns;
         col += stride) {
        const index_t o = col / inner;
        const index_t base = o * n * inner + (col - o * inner);
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
__global__ void softmax_backward_rows_warp(const T* dy, const T* y, T* dx, index_t rows, index_t n) {
    typedef acc_t<T> A;
    const index_t lane = threadIdx.x;
    const index_t row_stride = (index_t)gridDim.x * (index_t)blockDim.y;
    for (index_t row = (index_t)blockIdx.x * (index_t)blockDim.y + (index_t)threadIdx.y; row < rows;
         row += row_stride) {
        const index_t off = row * n;
        A sum = A(0);
        for (index_t k = lane; k < n; k += 32) sum += backward_term<A, LOG>(load(dy[off + k]), load(y[off + k]));
        sum = warp_sum(sum);
        for (index_t k = lane; k < n; k += 32)
            dx[off + k] = store<T>(backward_value<A, LOG>(load(dy[off + k]), load(y[off + k]), sum));
    }
}

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
            dx[off + k] = store<T>(backward_value<A, LOG>(load(dy[off + k]), load(y[off + k]), sum));
    }
}

template <typename T, typename index_t, bool LOG>
__global__ void softmax_backward_columns(const T* dy, const T* y, T* dx, index_t outer, index_t n,
                                         index_t inner) {
    typedef acc_t<T> A;
    const index_t columns = outer * inner;
    const index_t stride = (index_t)gridDim.x * (index_t)blockDim.x;
    for (index_t col = (index_t)blockIdx.x * (index_t)blockDim.x + (index_t)threadIdx.x; col < columns;
         col += stride) {
        const index_t o = col / inner;
        const index_t base = o * n * inner + (col - o * inner);
        A sum = A(0);
        for (index_t k = 0; k < n; ++k) {
            const index_t at = base + k * inner;
            sum += backward_term<A, LOG>(load(dy[at]), load(y[at]));
        }
        for (index_t k = 0; k < n; ++k) {
            const index_t at = base + k * inner;
            dx[at] = store<T>(backward_value<A, LOG>(load(dy[at]), load(y[at]), sum));
        }
    }
}
