"""SASS facts behind notes/lnodd.md (a copy of notes/rowbwd_sass.py with the odd-row kernels): instructions, registers (highest register + 1, as
notes/ab/sass_compare.py counts them), local-memory (spill) instructions, and the memory /
barrier / shuffle instructions of the layer / RMS norm kernels, compiled as the H100
compiles them (NVRTC to an sm_90 cubin with CuPy's options, nvdisasm).
    LIBNVRTC=/tmp/nvrtc130/x/nvidia/cu13/lib/libnvrtc.so.13 \\
    LD_LIBRARY_PATH=/tmp/nvrtc130/x/nvidia/cu13/lib PYTHONPATH=$PWD \\
    python notes/lnodd_sass.py [ROOT]      (ROOT: the tree whose kernels/ is compiled, default .)"""
import collections
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ab"))
import sass_compare as sc  # noqa: E402

KINDS = ("LDG", "STG", "LDS", "STS", "LDGSTS", "SHFL", "BAR", "MUFU")
EXPRESSIONS = ["norm_rows_forward<float, float, int, 1>", "norm_rows_forward<half_t, half_t, int, 1>", "norm_rows_forward_odd<float, float, int, 4>", "norm_rows_forward_odd<float, float, int, 8>", "norm_rows_forward_odd<float, float, int, 16>", "norm_rows_forward_odd<half_t, half_t, int, 16>", "norm_rows_forward_odd<half_t, float, int, 16>", "norm_rows_forward_odd<half_t, float, int, 8>", "norm_rows_forward_odd<bfloat16_t, float, int, 16>", "norm_rows_forward_odd<float, float, long long, 16>", "norm_rows_forward_odd<double, double, int, 16>", "norm_rows_backward<float, float, int, 1>", "norm_rows_backward_odd<float, float, int, 16>", "norm_rows_backward_odd<float, float, int, 8>", "norm_rows_backward_odd<half_t, float, int, 16>", "norm_rows_backward_odd<half_t, half_t, int, 16>",
               ]


def main(root="."):
    kernel_dir = os.path.join(root, "kernels")
    source = open(os.path.join(kernel_dir, "row_normalization.cu")).read()
    exprs = [e for e in EXPRESSIONS if f" {e.split('<')[0]}(" in source]
    listings = sc.listings(*sc.cubin_of(source, kernel_dir, exprs, "row_normalization.cu"))
    print(sc.version())
    for e in exprs:
        lines = listings[e]
        ops = collections.Counter((i.split()[1] if i.startswith("@") else i.split()[0]).split(".")[0] for i in lines)
        spills = sum(ops[k] for k in ("LDL", "STL"))
        print(f"{e:58s} {len(lines):5d} instr  regs {sc.registers(lines):3d}  spills {spills}  "
              + " ".join(f"{k} {ops[k]}" for k in KINDS if ops[k]))


if __name__ == "__main__":
    main(*sys.argv[1:])
