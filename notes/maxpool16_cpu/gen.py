"""CPU harness (notes/maxpool16.md): runs pool_k3s2_backward_rolled's own source, cut out of
KERNELS_DIR/pooling.cu, on the CPU -- the PTX pair instructions, prmt and the 16-bit
conversions emulated in shim.h -- one thread after another, and compares dx bit for bit
with a scalar gather (main.cpp: first maximum / last NaN in row-major window order, float
sums from +0 in the gather's order, rounded once).  Shapes: heights 1..60, widths 8..56,
random, integer (ties, NaN, +-inf, -0.0) and -inf / NaN-row planes; S = 1 / 2 / 4, float16
and bfloat16, a one-block grid (grid-stride).
    python notes/maxpool16_cpu/gen.py KERNELS_DIR OUT.cpp && g++ -std=c++17 -O1 -w OUT.cpp && ./a.out"""
import os
import sys
HERE = os.path.dirname(os.path.abspath(__file__))
src = open(sys.argv[1] + "/pooling.cu").read()

def grab(start):
    i = src.index(start)
    # back up to the template line(s) just above
    j = src.rfind("\n", 0, i) + 1
    k = src.index("{", i)
    depth = 0
    for n in range(k, len(src)):
        if src[n] == "{": depth += 1
        elif src[n] == "}":
            depth -= 1
            if depth == 0:
                end = n + 1
                if src[end:end + 1] == ";": end += 1
                return src[j:end] + "\n"
    raise ValueError(start)

def grab_with_template(start):
    body = grab(start)
    i = src.index(start)
    j = src.rfind("\n", 0, i)
    prev = src.rfind("\n", 0, j)
    line = src[prev + 1:j]
    if line.startswith("template"):
        return line + "\n" + body
    return body

parts = []
parts.append(grab_with_template("struct alignas(sizeof(T) * N) PackN {"))
parts.append(grab_with_template("__device__ __forceinline__ PackN<T, N> load_pack(const T* p) {"))
parts.append("template <bool HINT> inline PackN<unsigned, 4> load_words4(const unsigned* p) { return load_pack<unsigned, 4>(p); }\n")
parts.append(grab_with_template("__device__ __forceinline__ void plane_band_lane("))
parts.append(grab_with_template("__device__ __forceinline__ int argmax3x3("))
parts.append(grab_with_template("struct Bool {"))
parts.append(grab_with_template("__device__ __forceinline__ void first_max_shares("))
parts.append(grab_with_template("__device__ __forceinline__ float half_of("))
parts.append(grab_with_template("__device__ __forceinline__ void store_float_row("))
parts.append(grab_with_template("__device__ __forceinline__ void load_k3s2_words("))
if "k3s2_tail_row_pairs(" in src:
    parts.append(grab_with_template("__device__ __forceinline__ bool k3s2_tail_row_pairs("))
k = src.index("pool_k3s2_backward_rolled(const T*")
tmpl_start = src.rfind("template <typename T, typename index_t, int S, int MINB", 0, k)
kb = grab("pool_k3s2_backward_rolled(const T*")
kernel = src[tmpl_start:src.index("pool_k3s2_backward_rolled(const T*")] + kb[kb.index("pool_k3s2_backward_rolled("):]
code = "".join(parts) + kernel
code = code.replace("__global__ void __launch_bounds__(256, MINB)", "void")
hint = "bool HINT" in kernel  # the patched kernel's fifth template parameter
main = open(os.path.join(HERE, "main.cpp")).read().replace(" KARG>", ", HINT>" if hint else ">")
if not hint:  # main's kernel: no hint variants
    main = main.replace("run<half_t, 1, true>", "run<half_t, 1, false>")
open(sys.argv[2], "w").write(open(os.path.join(HERE, "shim.h")).read() + code + main)
print("kernel with the HINT parameter:", hint)
