"""CPU check of notes/wip/poolbf16.patch (notes/poolbf16.md): notes/maxpool16_cpu's harness
(pool_k3s2_backward_rolled's own source cut out of KERNELS_DIR/pooling.cu, the PTX pair
instructions emulated, dx compared bit for bit with a scalar gather) for every SHARES of the
patched kernel: 0 (main's), 1 (pairwise shares, one branch a step), 2 (bfloat16's high halves
by mul.hi / mul.lo, emulated as written).  Also counts the tail fast path's hits.
    python notes/poolbf16_cpu/gen.py KERNELS_DIR OUT.cpp && g++ -std=c++17 -O1 -w OUT.cpp -o h && ./h"""
import os
import re
import subprocess
import sys
HERE = os.path.dirname(os.path.abspath(__file__))
M16 = os.path.join(HERE, "..", "maxpool16_cpu")
kdir, out = sys.argv[1], sys.argv[2]
tmp = out + ".base.cpp"
subprocess.run([sys.executable, os.path.join(M16, "gen.py"), kdir, tmp], check=True, capture_output=True)
code = open(tmp).read()
src = open(os.path.join(kdir, "pooling.cu")).read()


def grab(start):
    i = src.index(start)
    j = src.rfind("\n", 0, src.rfind("\n", 0, i)) + 1  # the template line above
    k, depth = src.index("{", i), 0
    for n in range(k, len(src)):
        depth += {"{": 1, "}": -1}.get(src[n], 0)
        if depth == 0:
            return src[j:n + 1] + "\n"


extra = grab("__device__ __forceinline__ void first_max_shares_pairwise(")
extra += """template <typename T, bool FMA_PIPE> inline float high_half(unsigned w) {
    if constexpr (FMA_PIPE && NegInfBits<T>::value == 0xff80u) {
        unsigned h = (unsigned)(((unsigned long long)w * 65536ull) >> 32);  // mul.hi.u32
        h = h * 65536u;                                                      // mul.lo.u32
        float f; memcpy(&f, &h, 4); return f;
    }
    return half_of<T, true>(w);
}
"""
anchor = "template <typename T, typename index_t, int S, int MINB"
code = code.replace(anchor, extra + anchor, 1)
code = code.replace("static D3 blockIdx", "static long g_ok = 0, g_fail = 0;\nstatic D3 blockIdx", 1)
code = code.replace("if (ok != 0xffffffffu) return false;", "if (ok != 0xffffffffu) { ++g_fail; return false; }")
code = re.sub(r"\n    return true;\n#else", "\n    ++g_ok; return true;\n#else", code)
# the driver: SHARES as a template argument of run()
code = code.replace("template <typename T, int S, bool HINT>\nint run(", "template <typename T, int S, bool HINT, int SH = 0>\nint run(")
code = code.replace(", HINT>((const T*)x.data()", ", HINT, SH>((const T*)x.data()")
code = code.replace("int main() {", "int main_maxpool16() {")
code += r"""
int main() {
    std::mt19937 g(7);
    int total = 0, cases = 0;
    int Hs[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 14, 17, 20, 29, 30, 31, 57, 60};
    int Ws[] = {8, 16, 24, 56};
    for (int H : Hs) for (int W : Ws) for (int kind = 0; kind < 3; ++kind) {
        int planes = 4;
        total += run<half_t, 2, false, 1>(planes, H, W, g, kind, 0);
        total += run<half_t, 1, false, 1>(planes, H, W, g, kind, 1);
        total += run<bfloat16_t, 2, false, 1>(planes, H, W, g, kind, 0);
        total += run<bfloat16_t, 2, false, 2>(planes, H, W, g, kind, 0);
        total += run<bfloat16_t, 1, false, 2>(planes, H, W, g, kind, 1);
        total += run<bfloat16_t, 4, false, 2>(planes, H, W, g, kind, 0);
        total += run<bfloat16_t, 2, false, 0>(planes, H, W, g, kind, 0);
        total += run<half_t, 2, false, 0>(planes, H, W, g, kind, 0);
        cases += 8;
    }
    printf("%d cases, %d mismatching elements; tail fast path %ld hits, %ld exact fallbacks\n",
           cases, total, g_ok, g_fail);
    g_ok = g_fail = 0;
    int bad = run<bfloat16_t, 2, false, 2>(8, 56, 56, g, 0, 0) + run<half_t, 2, false, 1>(8, 56, 56, g, 0, 0);
    printf("random 8x56x56 (bf16 SHARES 2, f16 SHARES 1): %d mismatching; tail fast path %ld hits, %ld fallbacks\n",
           bad, g_ok, g_fail);
    return total + bad != 0;
}
"""
open(out, "w").write(code)
os.remove(tmp)
