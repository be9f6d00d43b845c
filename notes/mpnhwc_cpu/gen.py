"""CPU harness (notes/mpnhwc.md): runs pool_nhwc_k3s2_backward_walk's own source (K 8 / 4 slots x
S 1 / 2 / 4 x PF, full and one-block grids) and pool_nhwc_k3s2_backward_shfl's (main's NHWC float32 kernel,
SLOTS 8), cut out of KERNELS_DIR/pooling.cu, on the CPU -- a warp's 32 lanes as 32 threads
meeting at each __shfl_down_sync (C++20 barrier; shim from notes/mpbwd_cpu) -- and compares dx
bit for bit between them and with a scalar NHWC gather (first maximum / last NaN in row-major
window order, sums from +0 in the gather's order).
    python notes/mpnhwc_cpu/gen.py KERNELS_DIR OUT.cpp && g++ -std=c++20 -O1 -w -pthread OUT.cpp -o h && ./h"""
import os
import sys
HERE = os.path.dirname(os.path.abspath(__file__))
SHIM = os.path.join(HERE, "..", "mpbwd_cpu", "shim_nhwc.h")
src = open(sys.argv[1] + "/pooling.cu").read()


def grab(start):
    """The definition containing `start` with the template line above it."""
    i = src.index(start)
    j = src.rfind("\n", 0, i) + 1
    while True:  # the template / __global__ lines above
        prev = src.rfind("\n", 0, j - 1) + 1
        if not src[prev:j].startswith(("template", "__global__")):
            break
        j = prev
    k = src.index("{", i)
    depth = 0
    for n in range(k, len(src)):
        if src[n] == "{":
            depth += 1
        elif src[n] == "}":
            depth -= 1
            if depth == 0:
                end = n + 1
                if src[end:end + 1] == ";":
                    end += 1
                return src[j:end] + "\n"
    raise ValueError(start)


parts = [grab("struct alignas(sizeof(T) * N) PackN {"),
         grab("__device__ __forceinline__ PackN<T, N> load_pack(const T* p) {"),
         grab("__device__ __forceinline__ int argmax3x3("),
         grab("struct Bool {"),
         grab("__device__ __forceinline__ bool any_nan("),
         grab("__device__ __forceinline__ void load_nhwc_column("),
         grab("__device__ __forceinline__ bool nhwc_column_nan("),
         grab("__device__ __forceinline__ void nhwc_k3s2_backward_walk("),
         grab("pool_nhwc_k3s2_backward_shfl(const T* __restrict__ x"),
         grab("__device__ __forceinline__ void row0_scan("),
         grab("__device__ __forceinline__ void load_nhwc_row3("),
         grab("pool_nhwc_k3s2_backward_walk(const T* __restrict__ x")]
code = "".join(parts).replace("__global__ void __launch_bounds__(256, MINB)", "void")
open(sys.argv[2], "w").write(open(SHIM).read() + code + open(os.path.join(HERE, "main.cpp")).read())
