"""CPU harness (notes/mpnhwc.md): runs pool_nhwc_k3s2_backward_walk's own source (K 8 / 4 slots x
S 1 / 2 / 4 x PF, full and one-block grids) and pool_nhwc_k3s2_backward_shfl's (main's NHWC float32 kernel,
SLOTS 8), cut out of KERNELS_DIR/pooling.cu, on the CPU -- a warp's 32 lanes as 32 threads
meeting at each __shfl_down_sync (C++20 barrier; shim from notes/mpbwd_cpu) -- and compares dx
bit for bit between them and with a scalar NHWC gather (first maximum / last NaN in row-major
window order, sums from +0 in the gather's order).
    python notes/mpnhwc_cpu/gen.py KERNELS_DIR OUT.cpp && g++ -std=c++20 -O1 -w -pthread OUT.cpp -o h && ./h
Every 16-byte load (load_pack) and dx store (the kernels' reinterpret_cast stores) is bounds-checked
against the tensor it must fall in (OOB below; x / dy for loads, dx for stores): a violation is
counted, the first few printed, and served from / into a scratch pack instead of the tensor.
A third argument names another driver: main_oob.cpp (r50-sized shapes, every variant, the
dispatch's real grid; notes/mpnhwc.md "Out-of-bounds fix")."""
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
LOAD = "load_pack(const T* p) {\n    return *reinterpret_cast<const PackN<T, N>*>(p);"
assert code.count(LOAD) == 1
code = code.replace(LOAD, "load_pack(const T* p) {\n    if (!oob_ok(p, sizeof(T) * N, false)) return PackN<T, N>{};\n"
                          "    return *reinterpret_cast<const PackN<T, N>*>(p);")
STORE = "*reinterpret_cast<PackN<T, VEC>*>("
assert code.count(STORE) == 2  # the shfl kernel's and the walk's dx stores
code = code.replace(STORE, "*oob_dst<PackN<T, VEC>>(")
OOB = r"""
// bounds checks (gen.py): the tensors a load / store may touch, set by the driver
struct Span { const char* lo; const char* hi; };
static Span oob_load[2], oob_store;  // x, dy; dx
template <typename V> static void oob_set(const V& x, const V& dy, const V& dx) {
    auto span = [](const V& v) { return Span{(const char*)v.data(), (const char*)(v.data() + v.size())}; };
    oob_load[0] = span(x); oob_load[1] = span(dy); oob_store = span(dx);
}
static std::atomic<long long> oob_count{0};
static bool oob_ok(const void* p, size_t bytes, bool st) {
    const char* c = (const char*)p;
    auto in = [&](const Span& s) { return s.lo && c >= s.lo && c + bytes <= s.hi; };
    if (!oob_store.lo || (st ? in(oob_store) : in(oob_load[0]) || in(oob_load[1]))) return true;  // unset: off
    if (oob_count++ < 4) {
        const Span& s = st ? oob_store : oob_load[0];
        printf("  OOB %s block %u thread %u: byte offset %td of %s (%td bytes)\n", st ? "store" : "load",
               blockIdx.x, threadIdx.x, c - s.lo, st ? "dx" : "x", s.hi - s.lo);
    }
    return false;
}
template <typename P> static P* oob_dst(void* p) {
    static thread_local P scratch;
    return oob_ok(p, sizeof(P), true) ? (P*)p : &scratch;
}
"""
driver = sys.argv[3] if len(sys.argv) > 3 else "main.cpp"
open(sys.argv[2], "w").write(open(SHIM).read() + "#include <atomic>\n" + OOB + code
                             + open(os.path.join(HERE, driver)).read())
