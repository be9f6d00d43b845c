// Index helpers shared by the direct convolution and im2col / col2im kernels
// (kernels/conv_direct.cu, kernels/conv_im2col.cu): 4-D offsets and splits in
// either activation layout, and the taps that reach one input element.
#pragma once

template <bool NHWC, typename index_t>
__device__ __forceinline__ index_t offset4(index_t n, index_t c, index_t h, index_t w,
                                           int C, int H, int W) {
    return NHWC ? ((n * H + h) * W + w) * C + c : ((n * C + c) * H + h) * W + w;
}

// Split a flat index of a (N, C, H, W) tensor stored in the given layout.
template <bool NHWC, typename index_t>
__device__ __forceinline__ void split4(index_t i, int C, int H, int W,
                                       index_t& n, int& c, int& h, int& w) {
    if (NHWC) {
        c = (int)(i % C); i /= C;
        w = (int)(i % W); i /= W;
        h = (int)(i % H); n = i / H;
    } else {
        w = (int)(i % W); i /= W;
        h = (int)(i % H); i /= H;
        c = (int)(i % C); n = i / C;
    }
}

// The taps (r, s) whose output position (p, q) reaches input element (h, w):
// p = (h + pad_h - r * dil_h) / stride_h when that division is exact and p is in
// [0, P), the same for q.  f(r, s, p, q) is called once per such tap, r then s
// ascending (the order fixes the sum's rounding: backward data is deterministic).
template <typename F>
__device__ __forceinline__ void for_each_tap_reaching(int h, int w, int R, int S, int P, int Q, int stride_h,
                                                      int stride_w, int pad_h, int pad_w, int dil_h, int dil_w,
                                                      F&& f) {
    for (int r = 0; r < R; ++r) {
        const int ph = h + pad_h - r * dil_h;  // = p * stride_h when tap r reaches row h
        if (ph < 0) break;                     // decreases with r
        if (ph % stride_h != 0) continue;
        const int p = ph / stride_h;
        if (p >= P) continue;
        for (int s = 0; s < S; ++s) {
            const int qw = w + pad_w - s * dil_w;
            if (qw < 0) break;
            if (qw % stride_w != 0) continue;
            const int q = qw / stride_w;
            if (q >= Q) continue;
            f(r, s, p, q);
        }
    }
}
