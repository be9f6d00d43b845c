// CPU shims for notes/mpbwd_cpu/gen.py: the CUDA qualifiers and common.cuh's float helpers.
#include <cstdint>
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
#define __global__
struct D3 { unsigned x; };
static D3 blockIdx, threadIdx, blockDim, gridDim;
template <typename T> using acc_t = T;
template <typename T> inline T load(const T& v) { return v; }
template <typename T> inline T store(T v) { return v; }
template <typename A> inline A negative_infinity() { return -INFINITY; }
template <typename T> inline bool k3s2_max_backward_pairs(const T*, const T*, T*, int, int, int, int, int, int, bool, bool) { return false; }
