// CPU shims for notes/mpbwd_cpu/gen_nhwc.py: CUDA qualifiers, float helpers, and a warp's
// lanes as threads (threadIdx / blockIdx per thread; __shfl_down_sync through a barrier).
#include <barrier>
#include <thread>
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
static thread_local D3 blockIdx, threadIdx;
static D3 blockDim, gridDim;
template <typename T> using acc_t = T;
template <typename T> inline T load(const T& v) { return v; }
template <typename T> inline T store(T v) { return v; }
template <typename A> inline A negative_infinity() { return -INFINITY; }
static std::barrier<>* warp_barrier;
static uint64_t shfl_buf[32];
template <typename V> V __shfl_down_sync(unsigned, V v, int d) {
    const int lane = threadIdx.x & 31;
    uint64_t b = 0; memcpy(&b, &v, sizeof(V));
    shfl_buf[lane] = b;
    warp_barrier->arrive_and_wait();
    V r = v;
    if (lane + d < 32) memcpy(&r, &shfl_buf[lane + d], sizeof(V));
    warp_barrier->arrive_and_wait();
    return r;
}
