"""SASS of pool_k3s2_backward_rolled specialisations, main's kernels/ against this tree's, no GPU:
NVRTC straight to a sm_90 CUBIN (NVRTC's own code generator, `-arch=sm_90`, as CuPy compiles on
the device: no local ptxas) -> nvdisasm.  Evidence for notes/poolbf16.md.

    git archive main dnnprims kernels | tar -C /tmp/main_tree -xf -     (main's tree, once)
    PYTHONPATH=$PWD python notes/poolbf16_sass.py /tmp/main_tree [--group] [--dump DIR] [--new ROOT (default: this tree)]
    LIBNVRTC=.../libnvrtc.so.13 (with LD_LIBRARY_PATH at its folder): another NVRTC than CuPy's,
    e.g. 13.0.88 (the device's: torch cu130's nvidia-cuda-nvrtc): pip download
    nvidia-cuda-nvrtc==13.0.88 --no-deps, unzip.  NVDISASM: nvdisasm 13.x (it reads the cubin
    whole; CuPy's nvrtc.getCUBIN drops its last byte, hence ctypes here).

Compares, per type, main's `<T, int, 2, 2, false>` with this tree's `<T, int, 2, 2, false, 0>`
instruction for instruction (opcodes and operands; branch labels renumbered by function, the
kernel's own name and NVRTC's helper numbers taken out, nvdisasm's padding collapsed), prints
registers / instructions / ALU-pipe counts of SHARES 0 / 1 / 2.  Each tree's family source
(FAMILY.source, its include folder); --group: every specialisation of the kernel in one
program, as the device compiles the family's group (slower), else only the compared ones."""
import collections
import importlib
import importlib.util
import os
import pathlib
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ab"))
import sass_compare  # noqa: E402  (NVRTC with CuPy's options, nvdisasm, the normalised listing)
HERE = pathlib.Path(__file__).resolve().parent.parent
ALU = ("LOP3", "ISETP", "SEL", "PRMT", "SHF", "IADD3", "LEA", "VHMNMX", "FSETP", "FSEL", "PLOP3", "HSETP2",
       "HMNMX2", "LOP", "BMSK", "SGXT", "FMNMX", "IMNMX", "VIMNMX", "P2R", "R2P")


def family_of(root, name):
    """(source, include folder, name expressions) of the tree's pooling family."""
    spec = importlib.util.spec_from_file_location(name, f"{root}/dnnprims/__init__.py",
                                                  submodule_search_locations=[f"{root}/dnnprims"])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    pooling = importlib.import_module(f"{name}.pooling")
    kernels = importlib.import_module(f"{name}._kernels")
    return pooling.FAMILY.source, str(kernels.KERNEL_DIR), list(pooling.FAMILY.name_expressions)


def sass_of(family, exprs, group):
    """{expr: (registers, [normalised instruction lines])} of exprs (group: of the whole group)"""
    source, kernel_dir, declared = family
    compiled = [e for e in declared if e.startswith("pool_k3s2_backward_rolled<")] if group else exprs
    assert set(exprs) <= set(compiled), set(exprs) - set(compiled)
    lines = sass_compare.listings(*sass_compare.cubin_of(source, kernel_dir, compiled, "pooling.cu"))
    return {e: (sass_compare.registers(lines[e]), lines[e]) for e in exprs}


def opcode(ins):
    return re.sub(r"^@!?U?P[T\d]+\s+", "", ins).split()[0]


def mix(ins):
    ops = [opcode(i) for i in ins]
    base = collections.Counter(o.split(".")[0] for o in ops)
    alu = sum(n for o, n in base.items() if o in ALU)
    return (f"instr {len(ops):5d}  ALU {alu:4d}  IMAD {base['IMAD']:4d}  MOV {base['MOV']:3d}  HADD2 {base['HADD2']:3d}"
            f"  FADD {base['FADD']:3d}  LOP3 {base['LOP3']:4d}  BRA {base['BRA']:3d}  BSSY {base['BSSY']:3d}")


def main():
    main_root = sys.argv[1]
    group = "--group" in sys.argv
    dump = sys.argv[sys.argv.index("--dump") + 1] if "--dump" in sys.argv else None
    types = ("half_t", "bfloat16_t")
    old = sass_of(family_of(main_root, "dnnprims_main"), [f"pool_k3s2_backward_rolled<{t}, int, 2, 2, false>" for t in types], group)
    new_exprs = [f"pool_k3s2_backward_rolled<{t}, int, 2, 2, false, {k}>" for t in types for k in (0, 1, 2)
                 if not (t == "half_t" and k == 2)]
    this = sys.argv[sys.argv.index("--new") + 1] if "--new" in sys.argv else str(HERE)
    new = sass_of(family_of(this, "dnnprims_this"), new_exprs, group)
    print(f"{sass_compare.version()} -arch=sm_90 cubin, {sass_compare.NVDISASM}"
          f"{', whole rolled groups' if group else ''}")
    for t in types:
        o = old[f"pool_k3s2_backward_rolled<{t}, int, 2, 2, false>"]
        n = new[f"pool_k3s2_backward_rolled<{t}, int, 2, 2, false, 0>"]
        same = o[1] == n[1]
        ops_same = [opcode(i) for i in o[1]] == [opcode(i) for i in n[1]]
        diff = sum(a != b for a, b in zip(o[1], n[1])) + abs(len(o[1]) - len(n[1]))
        print(f"{t}: main vs SHARES 0: identical instructions {same}, identical opcodes {ops_same}, "
              f"{diff} lines differ")
        print(f"  main      regs {o[0]:3d}  {mix(o[1])}")
        for e in new_exprs:
            if e.startswith(f"pool_k3s2_backward_rolled<{t},"):
                print(f"  SHARES {e[-2]}  regs {new[e][0]:3d}  {mix(new[e][1])}")
        if group:
            # every SHARES 0 specialisation (S, MINB, hint, index type) against main's
            pairs = [(e, e[:-1] + ", 0>") for e in old if e.startswith(f"pool_k3s2_backward_rolled<{t},")]
            same = [e for e, e0 in pairs if old[e][1] == new[e0][1]]
            print(f"  whole group: {len(same)} of {len(pairs)} SHARES 0 specialisations identical to main's"
                  + "".join(f"\n    DIFFERS {e}" for e, _ in pairs if e not in same))
        if dump:
            os.makedirs(dump, exist_ok=True)
            open(f"{dump}/{t}_main.sass", "w").write("\n".join(o[1]) + "\n")
            for e in new_exprs:
                if e.startswith(f"pool_k3s2_backward_rolled<{t},"):
                    open(f"{dump}/{t}_shares{e[-2]}.sass", "w").write("\n".join(new[e][1]) + "\n")


if __name__ == "__main__":
    main()
