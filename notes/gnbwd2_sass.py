"""Registers and instruction counts of gn_rows_backward_registers (and the shipped
gn_rows_backward_cluster for comparison) as the device's NVRTC compiles them (sm_90 cubin,
CuPy's options; notes/ab/sass_compare.py does the compiling).  No GPU needed.
    LIBNVRTC=/tmp/nvrtc130/x/nvidia/cu13/lib/libnvrtc.so.13 python notes/gnbwd2_sass.py [ROOT]"""
import collections
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "ab"))
import sass_compare as sc  # noqa: E402

ROOT = sys.argv[1] if len(sys.argv) > 1 else "."
EXPRS = [f"gn_rows_backward_registers<{t}, {p}, int, {cl}, {n}>"
         for t, p in (("float", "float"), ("half_t", "float"), ("bfloat16_t", "float"), ("double", "double"))
         for cl in (4, 8) for n in (4, 8)] + \
        [f"gn_rows_backward_cluster<{t}, {p}, int, {cl}>"
         for t, p in (("float", "float"), ("half_t", "float"), ("bfloat16_t", "float")) for cl in (4, 8)]


def main():
    kernel_dir = os.path.join(ROOT, "kernels")
    src = open(os.path.join(kernel_dir, "row_normalization.cu")).read()
    print(sc.version())
    binary, lowered = sc.cubin_of(src, kernel_dir, EXPRS, "row_normalization.cu")
    lists = sc.listings(binary, lowered)
    for e in EXPRS:
        lines = lists[e]
        ops = collections.Counter(re.split(r"[ .]", re.sub(r"^@!?U?P\w+ ", "", l))[0] for l in lines)
        local = sum(1 for l in lines if re.match(r"(@\S+ )?(LDL|STL)", l))
        print(f"regs {sc.registers(lines):4d} instr {len(lines):5d} LDG {ops['LDG']:3d} STG {ops['STG']:3d}"
              f" LDS {ops['LDS']:3d} local {local:2d}  {e}")


if __name__ == "__main__":
    main()
