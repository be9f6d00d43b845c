// im2col and col2im for the "gemm" convolution algorithm (dnnprims/algos/gemm.py).
//
// The column matrix holds, for every output position (n, p, q) and every
// filter tap (c, r, s) of the input channel c (global channel index, so the
// groups are consecutive blocks of Cg*R*S rows), the input value that tap
// meets:  col(n, (c, r, s), (p, q)) = x[n, c, p*sh - ph + r*dh, q*sw - pw + s*dw]
// (0 in the padding).  Where it sits in memory is given by three element
// strides, so one kernel writes every arrangement the GEMMs want:
//   offset = n * stride_n + ((c * R + r) * S + s) * stride_j + (p * Q + q) * stride_pq
// e.g. (N, C*R*S, P*Q) for NCHW forward, (C*R*S, N, P*Q) for NCHW backward
// filter, (N*P*Q, C*R*S) for NHWC.
//
// Thread mapping:
//   im2col  one thread per column element.  The flat thread index is split
//           in the order of the input layout (q fastest for NCHW, c then s
//           fastest for NHWC) so that neighbouring threads read neighbouring
//           inputs; writes follow the strides.
//   col2im  one thread per input-gradient element dx[n, c, h, w], gathering
//           the column entries of the taps whose output position is
//           integral (as in conv_direct_backward_data): no atomics, so the
//           result is deterministic.  Accumulates in acc_t<T>.
// Grid-stride loops; the grid is capped in Python.
#include "common.cuh"
#include "conv_indexing.cuh"

template <typename T, typename index_t, bool NHWC>
__global__ void conv_im2col(const T* __restrict__ x, T* __restrict__ col,
                            int C, int H, int W, int R, int S, int P, int Q,
                            int stride_h, int stride_w, int pad_h, int pad_w, int dil_h, int dil_w,
                            index_t stride_n, index_t stride_j, index_t stride_pq, index_t total) {
    for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (index_t)blockDim.x * gridDim.x) {
        index_t t = i, n;
        int c, r, s, p, q;
        if (NHWC) {  // (n, p, q, c, r, s), s fastest
            s = (int)(t % S); t /= S;
            r = (int)(t % R); t /= R;
            c = (int)(t % C); t /= C;
            q = (int)(t % Q); t /= Q;
            p = (int)(t % P); n = t / P;
        } else {     // (n, c, r, s, p, q), q fastest
            q = (int)(t % Q); t /= Q;
            p = (int)(t % P); t /= P;
            s = (int)(t % S); t /= S;
            r = (int)(t % R); t /= R;
            c = (int)(t % C); n = t / C;
        }
        const int h = p * stride_h - pad_h + r * dil_h;
        const int w = q * stride_w - pad_w + s * dil_w;
        T v = store<T>(acc_t<T>(0));
        if (h >= 0 && h < H && w >= 0 && w < W) {
            v = x[offset4<NHWC, index_t>(n, c, h, w, C, H, W)];
        }
        col[n * stride_n + (((index_t)c * R + r) * S + s) * stride_j + ((index_t)p * Q + q) * stride_pq] = v;
    }
}

template <typename T, typename index_t, bool NHWC>
__global__ void conv_col2im(const T* __restrict__ col, T* __restrict__ dx,
                            int C, int H, int W, int R, int S, int P, int Q,
                            int stride_h, int stride_w, int pad_h, int pad_w, int dil_h, int dil_w,
                            index_t stride_n, index_t stride_j, index_t stride_pq, index_t total) {
    typedef acc_t<T> A;
    for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (index_t)blockDim.x * gridDim.x) {
        index_t n;
        int c, h, w;
        split4<NHWC>(i, C, H, W, n, c, h, w);
        A acc = A(0);
        for_each_tap_reaching(h, w, R, S, P, Q, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
                              [&](int r, int s, int p, int q) {
            acc += load(col[n * stride_n + (((index_t)c * R + r) * S + s) * stride_j +
                            ((index_t)p * Q + q) * stride_pq]);
        });
        dx[i] = store<T>(acc);
    }
}
