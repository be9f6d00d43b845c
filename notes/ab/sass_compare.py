"""Do two kernel trees compile to the same machine code?  NVRTC (the library's own
compiler, as on the GPU machine; no GPU needed) to an sm_90 cubin for each tree, then
each named specialisation's .text section compared instruction by instruction (16
bytes each).  A refactor of a timed kernel that keeps every instruction needs no new
timing; one that changes them does (a lambda-restructured max-pool backward once cost
10 % with bitwise-equal results; ptxas of another CUDA version said "identical").
nvdisasm 13.5 refuses NVRTC 13.5's cubins, hence bytes, not a listing.
    python notes/ab/sass_compare.py OLD_KERNEL_DIR NEW_KERNEL_DIR family.cu "expr<...>" [...]
    (an old tree: git archive REV kernels | tar -x -C /tmp/old)"""
import os
import struct
import sys

from cupy_backends.cuda.libs import nvrtc


def cubin(kernel_dir, filename, expressions, arch="sm_90"):
    with open(os.path.join(kernel_dir, filename)) as f:
        source = f.read()
    prog = nvrtc.createProgram(source, filename, [], [])
    try:
        for e in expressions:
            nvrtc.addNameExpression(prog, e)
        nvrtc.compileProgram(prog, [f"--gpu-architecture={arch}", "-std=c++17", f"-I{kernel_dir}"])
        return bytes(nvrtc.getCUBIN(prog))
    finally:
        nvrtc.destroyProgram(prog)


def text_sections(elf):
    """{section name: bytes} of the ELF64 cubin's .text.<kernel> sections."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    sections = [struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names = sections[shstrndx][4]
    out = {}
    for name, _, _, _, offset, size in sections:
        label = elf[names + name:elf.index(b"\0", names + name)].decode()
        if label.startswith(".text."):
            out[label[6:]] = elf[offset:offset + size]
    return out


def main(argv):
    old_dir, new_dir, filename, *expressions = argv
    old, new = (text_sections(cubin(d, filename, expressions)) for d in (old_dir, new_dir))
    same = True
    for kernel in sorted(set(old) | set(new)):
        a, b = old.get(kernel, b""), new.get(kernel, b"")
        n = max(len(a), len(b)) // 16
        differ = sum(a[16 * i:16 * i + 16] != b[16 * i:16 * i + 16] for i in range(n))
        same &= differ == 0
        print(f"{'identical' if not differ else f'{differ} of {n} instructions differ':>32}  {kernel[:100]}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
