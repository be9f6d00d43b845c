"""CPU harness (notes/mpbwd.md): runs pool_k3s2_backward_walk's own source and
pool_k3s2_backward's (float32, R = 2), cut out of KERNELS_DIR/pooling.cu, on the CPU one
thread after another, and compares dx bit for bit between them and with a scalar gather
(first maximum / last NaN in row-major window order, sums from +0 in the gather's order).
    python notes/mpbwd_cpu/gen.py KERNELS_DIR OUT.cpp && g++ -std=c++17 -O1 -w OUT.cpp -o h && ./h"""
import os
import sys
HERE = os.path.dirname(os.path.abspath(__file__))
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
         grab("__device__ __forceinline__ void plane_band_lane("),
         grab("__device__ __forceinline__ int argmax3x3("),
         grab("struct Bool {"),
         grab("__device__ __forceinline__ bool any_nan("),
         grab("__device__ __forceinline__ void load_row_vector("),
         grab("pool_k3s2_backward(const T* __restrict__ x"),
         grab("pool_k3s2_backward_walk(const T* __restrict__ x")]
code = "".join(parts)
code = code.replace("__global__ void __launch_bounds__(256, MINB)", "void")
code = code.replace("if constexpr (sizeof(T) == 2 && R == 1) {", "if constexpr (false) {")
open(sys.argv[2], "w").write(open(os.path.join(HERE, "shim.h")).read() + code
                             + open(os.path.join(HERE, "main.cpp")).read())
