"""CPU harness for the NHWC half of notes/mpbwd.md: runs pool_nhwc_k3s2_backward_shfl's own
source (cut out of KERNELS_DIR/pooling.cu) on the CPU, a warp's 32 lanes as 32 threads
meeting at every __shfl_down_sync (C++20 barrier), with PF = true and false and VB = 16 and 8, and compares
dx bit for bit between them and with a scalar NHWC gather.
    python notes/mpbwd_cpu/gen_nhwc.py KERNELS_DIR OUT.cpp && g++ -std=c++20 -O1 -w -pthread OUT.cpp -o h && ./h"""
import os
import sys
HERE = os.path.dirname(os.path.abspath(__file__))
sys.argv, out = sys.argv[:2] + ["/dev/null"], sys.argv[2]
exec(open(os.path.join(HERE, "gen.py")).read().split("parts = [")[0])  # src, grab
parts = [grab("struct alignas(sizeof(T) * N) PackN {"),
         grab("__device__ __forceinline__ PackN<T, N> load_pack(const T* p) {"),
         grab("__device__ __forceinline__ int argmax3x3("),
         grab("struct Bool {"),
         grab("__device__ __forceinline__ bool any_nan("),
         grab("__device__ __forceinline__ void load_nhwc_column("),
         grab("__device__ __forceinline__ bool nhwc_column_nan("),
         grab("__device__ __forceinline__ void nhwc_k3s2_backward_walk("),
         grab("pool_nhwc_k3s2_backward_shfl(const T* __restrict__ x")]
code = "".join(parts).replace("__global__ void __launch_bounds__(256, MINB)", "void")
open(out, "w").write(open(os.path.join(HERE, "shim_nhwc.h")).read() + code
                     + open(os.path.join(HERE, "main_nhwc.cpp")).read())
