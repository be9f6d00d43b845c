// Activation math shared by every kernel that applies an activation: the
// pointwise kernels (activation.cu) and the fused convolution epilogues
// (conv_implicit_gemm.cu, conv_depthwise.cu).  One definition, so a fused
// epilogue gives the same values as the separate pass.
//
// Math is in the accumulation type A (float for the half types).  Derivatives
// at the kinks follow PyTorch: relu/clipped_relu pass nothing at x == 0
// (clipped_relu also nothing at x == alpha, like hardtanh), leaky_relu alpha,
// elu alpha.  NaN inputs propagate through relu/leaky_relu/clipped_relu
// (comparisons are written so that NaN takes the identity branch); backward, a
// NaN x passes dy through relu (PyTorch's threshold_backward), alpha * dy
// through leaky_relu.
//
// activate_dynamic(mode, v, alpha) takes the mode at run time (ACTIVATION_NONE
// = identity) for epilogues: the branch is uniform across the grid and runs
// once per output, so it costs nothing next to the convolution and saves a
// template parameter (and NVRTC specialisations) per mode.
#pragma once
#include "common.cuh"

enum ActivationMode {
    RELU = 0,
    SIGMOID = 1,
    TANH = 2,
    ELU = 3,
    GELU = 4,        // x * Phi(x), with erf
    GELU_TANH = 5,   // the tanh approximation of GELU
    SILU = 6,
    LEAKY_RELU = 7,  // alpha = negative slope
    CLIPPED_RELU = 8, // alpha = ceiling
    GELU_ONE_EXP = 9  // GELU (erf) in float from one exponential and a fitted erfc (gelu_one_exp below),
                      // for 16-bit storage; never an epilogue's mode (activate_dynamic: identity)
};

__device__ __forceinline__ float exp_acc(float v) { return expf(v); }
__device__ __forceinline__ double exp_acc(double v) { return exp(v); }
__device__ __forceinline__ float expm1_acc(float v) { return expm1f(v); }
__device__ __forceinline__ double expm1_acc(double v) { return expm1(v); }
__device__ __forceinline__ float tanh_acc(float v) { return tanhf(v); }
__device__ __forceinline__ double tanh_acc(double v) { return tanh(v); }
__device__ __forceinline__ float erf_acc(float v) { return erff(v); }
__device__ __forceinline__ double erf_acc(double v) { return erf(v); }

// exp(-|v|) never overflows, so neither branch does.
template <typename A> __device__ __forceinline__ A sigmoid_acc(A v) {
    const A e = exp_acc(-fabs(v));
    return v >= A(0) ? A(1) / (A(1) + e) : e / (A(1) + e);
}

template <typename A> __device__ __forceinline__ A gelu_tanh_inner(A v) {
    return tanh_acc(A(0.7978845608028654) * (v + A(0.044715) * v * v * v));  // sqrt(2/pi)
}

// ---- 16-bit storage: a cheaper GELU derivative (and forward) -----------------
// A float16 / bfloat16 backward keeps 11 / 8 significant bits of dx, and with
// erff + expf (~45 SASS instructions an element, two MUFU) the pointwise
// kernel was issue-bound at 2-byte elements (notes/half16.md).  Here both terms
// of gelu'(x) = Phi(x) + x phi(x) share one exponential e = exp(-x^2 / 2):
//   Phi(-|x|) = e * h(x),  h = t P(t),  t = 1 / (1 + |x| / (2 sqrt 2)),
// P a degree-6 polynomial fitted here (reweighted least squares on the relative
// error of erfc(z) exp(z^2), z = |x| / sqrt 2 in [0, 10.5]: max 1.5e-6; beyond,
// e is 0 in float), so
//   gelu'(x) = [x >= 0] + e * (x / sqrt(2 pi) -+ h)      (- for x >= 0),
// with ex2_approx / rcp_approx (common.cuh; ~2^-22 relative).  Error of gelu' against
// float64 <= 2e-6 (relative, away from its zero near x = -0.75; absolute 2e-7
// there): notes/half16_accuracy.py over every float16 and a dense bfloat16
// sweep.  ~20 instructions.  float and double keep the library erf / exp.
// NaN propagates; +-inf gives NaN, as the library formula does (inf * 0).
// Phi(-|v|) exp(v^2 / 2) = t P(t), the fitted erfc above.
__device__ __forceinline__ float gelu_tail_scaled(float v) {
    const float t = rcp_approx(fmaf(fabsf(v), 0.353553391f, 1.0f));
    float p = 0.0436620973f;
    p = fmaf(p, t, -0.176825091f);
    p = fmaf(p, t, 0.192460239f);
    p = fmaf(p, t, 0.0204604492f);
    p = fmaf(p, t, 0.140187606f);
    p = fmaf(p, t, 0.13889575f);
    p = fmaf(p, t, 0.141158193f);
    return t * p;
}
__device__ __forceinline__ float gelu_derivative_fast(float v) {
    const float e = ex2_approx(v * (v * -0.721347520f));  // exp(-v^2 / 2) = 2^(-v^2 log2(e) / 2)
    const float h = gelu_tail_scaled(v);
    const float r = fmaf(v, 0.398942280f, v < 0.0f ? h : -h);  // 1 / sqrt(2 pi)
    return fmaf(e, r, v >= 0.0f ? 1.0f : 0.0f);
}

// GELU forward on 16-bit storage, the same way: gelu(v) = v Phi(v) with
// q = Phi(-|v|) = e h (relative error ~2e-6) and Phi(v) = 1 - q for v >= 0, q
// below.  ~17 instructions an element against ~30 for erff: the 16-bit forward
// moves 8 values per 16-byte pack, so erff's cost per byte made it issue-bound
// next to the copy (notes/biasact.md).  More accurate than the erff form in the
// tail, where 1 + erff(v / sqrt 2) cancels (v < -4: Phi(v) below float's ulp of 1).
// +inf gives +inf, -inf NaN, NaN NaN: as 0.5 v (1 + erf(v / sqrt 2)).
__device__ __forceinline__ float gelu_one_exp(float v) {
    const float q = ex2_approx(v * (v * -0.721347520f)) * gelu_tail_scaled(v);
    return v * (v >= 0.0f ? 1.0f - q : q);
}

template <int MODE, typename A> __device__ __forceinline__ A activate(A v, A alpha) {
    if constexpr (MODE == RELU) return v < A(0) ? A(0) : v;
    if constexpr (MODE == SIGMOID) return sigmoid_acc(v);
    if constexpr (MODE == TANH) return tanh_acc(v);
    if constexpr (MODE == ELU) return v > A(0) ? v : alpha * expm1_acc(v);
    if constexpr (MODE == GELU) return A(0.5) * v * (A(1) + erf_acc(v * A(0.7071067811865476)));  // sqrt(1/2)
    if constexpr (MODE == GELU_TANH) return A(0.5) * v * (A(1) + gelu_tanh_inner(v));
    if constexpr (MODE == SILU) return v * sigmoid_acc(v);
    if constexpr (MODE == LEAKY_RELU) return v < A(0) ? alpha * v : v;
    if constexpr (MODE == GELU_ONE_EXP) {
        if constexpr (sizeof(A) == 4) return gelu_one_exp(v);
        else return activate<GELU>(v, alpha);
    }
    // CLIPPED_RELU
    return v < A(0) ? A(0) : (v > alpha ? alpha : v);
}

template <int MODE, typename A> __device__ __forceinline__ A derivative(A v, A alpha) {
    // "x <= 0", as PyTorch's threshold_backward tests: a NaN x passes dy.
    if constexpr (MODE == RELU) return v <= A(0) ? A(0) : A(1);
    // s (1 - s) and 1 - t^2 cancel badly where s or |t| is near 1; these exp(-|x|)
    // forms are accurate everywhere and never overflow.
    if constexpr (MODE == SIGMOID) {
        const A e = exp_acc(-fabs(v));
        return e / ((A(1) + e) * (A(1) + e));
    }
    if constexpr (MODE == TANH) {
        const A e = exp_acc(A(-2) * fabs(v));
        return A(4) * e / ((A(1) + e) * (A(1) + e));
    }
    if constexpr (MODE == ELU) return v > A(0) ? A(1) : alpha * exp_acc(v);
    if constexpr (MODE == GELU) {
        const A cdf = A(0.5) * (A(1) + erf_acc(v * A(0.7071067811865476)));
        return cdf + v * A(0.3989422804014327) * exp_acc(A(-0.5) * v * v);  // 1/sqrt(2 pi)
    }
    if constexpr (MODE == GELU_TANH) {
        const A t = gelu_tanh_inner(v);
        return A(0.5) * (A(1) + t) +
               A(0.5) * v * (A(1) - t * t) * A(0.7978845608028654) * (A(1) + A(3 * 0.044715) * v * v);
    }
    if constexpr (MODE == SILU) {
        const A s = sigmoid_acc(v);
        return s * (A(1) + v * (A(1) - s));
    }
    if constexpr (MODE == LEAKY_RELU) return v > A(0) ? A(1) : alpha;
    if constexpr (MODE == GELU_ONE_EXP) {
        if constexpr (sizeof(A) == 4) return gelu_derivative_fast(v);
        else return derivative<GELU>(v, alpha);
    }
    // CLIPPED_RELU
    return (v > A(0) && v < alpha) ? A(1) : A(0);
}

// The derivative a kernel on storage type T uses: derivative<MODE> but for GELU
// on 16-bit storage.
template <typename T, int MODE> __device__ __forceinline__ acc_t<T> derivative_for(acc_t<T> v, acc_t<T> alpha) {
    if constexpr (MODE == GELU && sizeof(T) == 2) return gelu_derivative_fast(v);
    else return derivative<MODE>(v, alpha);
}

#define ACTIVATION_NONE (-1)

template <typename A> __device__ __forceinline__ A activate_dynamic(int mode, A v, A alpha) {
    switch (mode) {
        case RELU: return activate<RELU>(v, alpha);
        case SIGMOID: return activate<SIGMOID>(v, alpha);
        case TANH: return activate<TANH>(v, alpha);
        case ELU: return activate<ELU>(v, alpha);
        case GELU: return activate<GELU>(v, alpha);
        case GELU_TANH: return activate<GELU_TANH>(v, alpha);
        case SILU: return activate<SILU>(v, alpha);
        case LEAKY_RELU: return activate<LEAKY_RELU>(v, alpha);
        case CLIPPED_RELU: return activate<CLIPPED_RELU>(v, alpha);
        default: return v;
    }
}

// The same, as a call: for epilogues that apply it to a whole register tile,
// where inlining every mode's math once per element would bloat the kernel.
template <typename A> __device__ __noinline__ A activate_call(int mode, A v, A alpha) {
    return activate_dynamic(mode, v, alpha);
}

// Applies the mode to v[0..n) in place: relu inline, the others through
// activate_call, nothing for ACTIVATION_NONE.
template <int n, typename A> __device__ __forceinline__ void activate_tile(int mode, A* v, A alpha) {
    if (mode == RELU) {
#pragma unroll
        for (int i = 0; i < n; ++i) v[i] = activate<RELU>(v[i], alpha);
    } else if (mode != ACTIVATION_NONE) {
#pragma unroll
        for (int i = 0; i < n; ++i) v[i] = activate_call(mode, v[i], alpha);
    }
}
