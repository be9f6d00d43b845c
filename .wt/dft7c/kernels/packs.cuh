// 16-byte packs of storage values, for vectorised global loads and stores.
//
// A Pack<T, VEC> is VEC consecutive storage values read or written with one
// instruction (ld.global.v4.u32 for 16 bytes).  The raw member is a plain
// aligned word struct, so the compiler emits one vector access without any
// CUDA header; the values are read through the union.  Callers guarantee the
// address is a multiple of sizeof(Pack) (Python checks the pointers).
#pragma once
#include "common.cuh"

struct alignas(16) words4 { unsigned int a, b, c, d; };
struct alignas(8) words2 { unsigned int a, b; };

template <int BYTES> struct raw_word;
template <> struct raw_word<16> { typedef words4 type; };
template <> struct raw_word<8> { typedef words2 type; };
template <> struct raw_word<4> { typedef unsigned int type; };
template <> struct raw_word<2> { typedef unsigned short type; };

template <typename T, int VEC> struct Pack {
    union {
        typename raw_word<sizeof(T) * VEC>::type raw;
        T v[VEC];
    };
};

// Values per 16-byte pack.
template <typename T> struct pack_width { static constexpr int value = 16 / sizeof(T); };

template <typename T, int VEC> __device__ __forceinline__ Pack<T, VEC> load_pack(const T* p) {
    Pack<T, VEC> out;
    out.raw = *reinterpret_cast<const typename raw_word<sizeof(T) * VEC>::type*>(p);
    return out;
}

template <typename T, int VEC> __device__ __forceinline__ void store_pack(T* p, const Pack<T, VEC>& v) {
    *reinterpret_cast<typename raw_word<sizeof(T) * VEC>::type*>(p) = v.raw;
}
