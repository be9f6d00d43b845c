// Shared definitions for every dnnprims kernel family.
//
// Storage types.  Half-precision values are carried as raw 16-bit patterns
// and converted with explicit PTX / bit arithmetic, so the kernels compile
// under NVRTC with no CUDA toolkit headers at all (CuPy wheels do not always
// ship cuda_fp16.h / cuda_bf16.h).  Arithmetic happens in acc_t<T>: float for
// the half types and float, double for double -- the cuDNN accumulation rule.
//
// Index types.  Every kernel takes an index_t template parameter: int when all
// tensors it touches have fewer than 2^31 elements (the common, faster case),
// long long otherwise.  Python picks it (dnnprims/_kernels.py: index_type).
#pragma once

struct half_t { unsigned short bits; };
struct bfloat16_t { unsigned short bits; };

template <typename T> struct storage;

template <> struct storage<float> {
    typedef float acc_t;
    static __device__ __forceinline__ float load(float v) { return v; }
    static __device__ __forceinline__ float store(float v) { return v; }
};

template <> struct storage<double> {
    typedef double acc_t;
    static __device__ __forceinline__ double load(double v) { return v; }
    static __device__ __forceinline__ double store(double v) { return v; }
};

template <> struct storage<half_t> {
    typedef float acc_t;
    static __device__ __forceinline__ float load(half_t v) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
        return f;
    }
    static __device__ __forceinline__ half_t store(float f) {
        half_t h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
        return h;
    }
};

template <> struct storage<bfloat16_t> {
    typedef float acc_t;
    static __device__ __forceinline__ float load(bfloat16_t v) {
        return __uint_as_float(((unsigned int)v.bits) << 16);
    }
    // Round to nearest even on the upper 16 bits; NaN stays a quiet NaN.  sm_80+
    // has the conversion in hardware (one instruction instead of ~6 integer ops,
    // which kept 16-bit bf16 kernels such as gelu off the copy bandwidth); NaN
    // becomes the canonical quiet NaN there.
    static __device__ __forceinline__ bfloat16_t store(float f) {
        bfloat16_t b;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b.bits) : "f"(f));
#else
        unsigned int u = __float_as_uint(f);
        if ((u & 0x7fffffffu) > 0x7f800000u) {
            b.bits = (unsigned short)((u >> 16) | 0x40u);
        } else {
            u += 0x7fffu + ((u >> 16) & 1u);
            b.bits = (unsigned short)(u >> 16);
        }
#endif
        return b;
    }
};

template <typename T> using acc_t = typename storage<T>::acc_t;

template <typename T> __device__ __forceinline__ acc_t<T> load(const T& v) {
    return storage<T>::load(v);
}

template <typename T> __device__ __forceinline__ T store(acc_t<T> v) {
    return storage<T>::store(v);
}

// -inf in the accumulation type, without relying on <math.h> macros.
template <typename A> __device__ __forceinline__ A negative_infinity();
template <> __device__ __forceinline__ float negative_infinity<float>() {
    return __int_as_float(0xff800000);
}
template <> __device__ __forceinline__ double negative_infinity<double>() {
    return __longlong_as_double(0xfff0000000000000ULL);
}

// 2^v and 1 / v by the SFU (ex2.approx / rcp.approx, flush to zero: relative
// error ~2^-22, within ~1 ulp of float): the 16-bit paths' exp and division,
// where the accurate forms cost ~10 instructions and a slow-path branch a value
// for results rounded to 16 bits (activation GELU, softmax).
__device__ __forceinline__ float ex2_approx(float v) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
    return r;
}
__device__ __forceinline__ float rcp_approx(float v) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
    return r;
}

// Warp-wide reductions over all 32 lanes (every lane gets the result).
template <typename A> __device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

template <typename A> __device__ __forceinline__ A warp_max(A v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// Block-wide sum; every thread gets the result.  `scratch` holds 32 values.
// Must be called by all threads of the block.
template <typename A> __device__ __forceinline__ A block_sum(A v, A* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : A(0);
    return warp_sum(v);
}

template <typename A> __device__ __forceinline__ A block_max(A v, A* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : negative_infinity<A>();
    return warp_max(v);
}
