// CPU shims for notes/maxpool16_cpu/gen.py: the CUDA qualifiers, half_t / bfloat16_t with
// round-to-nearest-even conversions, and the PTX pair instructions (max.NaN, set.eq / set.gt,
// add.rn on two 16-bit floats a word) and prmt, one half at a time.
#include <cstdint>
#include <type_traits>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <random>
#include <algorithm>
using std::min; using std::max;
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __trap() abort()
#define PACKED_CMP_PAIRS 1
struct D3 { unsigned x; };
static D3 blockIdx, threadIdx, blockDim, gridDim;
struct half_t { unsigned short bits; };
struct bfloat16_t { unsigned short bits; };
static float f16_to_f(unsigned short h) {
    unsigned s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023; float v;
    if (e == 0) v = std::ldexp((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = std::ldexp((float)(m | 1024), (int)e - 25);
    return s ? -v : v;
}
static unsigned short f_to_f16(float f) {  // round to nearest even
    if (std::isnan(f)) return 0x7fff;
    unsigned s = std::signbit(f) ? 0x8000 : 0; float a = std::fabs(f);
    if (a >= 65520.0f) return s | 0x7c00;
    if (a < std::ldexp(1.0f, -14)) {  // subnormal: units of 2^-24
        float q = std::nearbyint(a * std::ldexp(1.0f, 24));
        return s | (unsigned)q;
    }
    int e; float fr = std::frexp(a, &e);  // a = fr * 2^e, fr in [0.5, 1)
    float q = std::nearbyint(fr * 2048.0f);  // 11 bits
    if (q >= 2048.0f) { q = 1024.0f; e += 1; }
    unsigned E = (unsigned)(e - 1 + 15), M = (unsigned)q - 1024;
    if (E >= 31) return s | 0x7c00;
    return s | (E << 10) | M;
}
static float bf_to_f(unsigned short b) { unsigned u = (unsigned)b << 16; float f; memcpy(&f, &u, 4); return f; }
static unsigned short f_to_bf(float f) {
    unsigned u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u); return (unsigned short)(u >> 16);
}
template <typename T> struct storage;
template <> struct storage<half_t> { typedef float acc_t;
    static float load(half_t v) { return f16_to_f(v.bits); }
    static half_t store(float f) { half_t h; h.bits = f_to_f16(f); return h; } };
template <> struct storage<bfloat16_t> { typedef float acc_t;
    static float load(bfloat16_t v) { return bf_to_f(v.bits); }
    static bfloat16_t store(float f) { bfloat16_t h; h.bits = f_to_bf(f); return h; } };
template <typename T> using acc_t = typename storage<T>::acc_t;
template <typename T> inline acc_t<T> load(const T& v) { return storage<T>::load(v); }
template <typename T> inline T store(acc_t<T> v) { return storage<T>::store(v); }
template <typename A> inline A negative_infinity() { return -INFINITY; }
template <typename T> struct NegInfBits;
template <> struct NegInfBits<half_t> { static constexpr unsigned value = 0xfc00u; };
template <> struct NegInfBits<bfloat16_t> { static constexpr unsigned value = 0xff80u; };
template <typename T> float tof(unsigned short b) { return std::is_same<T, half_t>::value ? f16_to_f(b) : bf_to_f(b); }
template <typename T> unsigned short fromf(float f) { return std::is_same<T, half_t>::value ? f_to_f16(f) : f_to_bf(f); }
template <typename T> unsigned pairop(unsigned a, unsigned b, int op) {
    unsigned r = 0;
    for (int k = 0; k < 2; ++k) {
        unsigned short x = (a >> (16 * k)) & 0xffff, y = (b >> (16 * k)) & 0xffff, z;
        float fx = tof<T>(x), fy = tof<T>(y);
        if (op == 0) z = (std::isnan(fx) || std::isnan(fy)) ? 0x7fff : (fx > fy ? x : (fy > fx ? y : (std::signbit(fx) ? y : x)));
        else if (op == 1) z = fx == fy ? 0xffff : 0;
        else if (op == 2) z = fx > fy ? 0xffff : 0;
        else z = fromf<T>(fx + fy);
        r |= (unsigned)z << (16 * k);
    }
    return r;
}
template <typename T> unsigned max_nan_pairs(unsigned a, unsigned b) { return pairop<T>(a, b, 0); }
template <typename T> unsigned eq_pairs(unsigned a, unsigned b) { return pairop<T>(a, b, 1); }
template <typename T> unsigned gt_pairs(unsigned a, unsigned b) { return pairop<T>(a, b, 2); }
template <typename T> unsigned add_pairs(unsigned a, unsigned b) { return pairop<T>(a, b, 3); }
inline unsigned permute_bytes(unsigned a, unsigned b, unsigned s) {
    unsigned char by[8]; for (int i = 0; i < 4; ++i) { by[i] = (a >> (8 * i)) & 0xff; by[4 + i] = (b >> (8 * i)) & 0xff; }
    unsigned r = 0; for (int i = 0; i < 4; ++i) r |= (unsigned)by[(s >> (4 * i)) & 7] << (8 * i);
    return r;
}
