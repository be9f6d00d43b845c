"""SASS instruction counts of single kernel specialisations, without a GPU:
NVRTC compiles the family's source for sm_90 (a cubin), nvdisasm (pip package
nvidia-cuda-nvdisasm) disassembles it, and the kernel's instructions are counted
by opcode (total, MUFU, conversions F2F/F2FP/HADD2.F32/PRMT, branches), plus
ptxas' register count from the program log.
    python notes/half16_sass.py ROOT FAMILY_FILE 'expr' ['expr' ...] [--dump]
ROOT: a tree holding kernels/ (main's, or a patched copy)."""
import collections
import glob
import os
import re
import subprocess
import sys
import tempfile

from cupy_backends.cuda.libs import nvrtc

root, filename, *exprs = sys.argv[1:]
dump = "--dump" in exprs
exprs = [e for e in exprs if e != "--dump"]
kdir = os.path.join(root, "kernels")
src = open(os.path.join(kdir, filename)).read()
prog = nvrtc.createProgram(src, filename, [], [])
for e in exprs:
    nvrtc.addNameExpression(prog, e)
try:
    nvrtc.compileProgram(prog, ["--gpu-architecture=compute_90", "-std=c++17", f"-I{kdir}"])
except nvrtc.NVRTCError:
    print(nvrtc.getProgramLog(prog)); raise
lowered = {e: nvrtc.getLoweredName(prog, e) for e in exprs}
ptx = nvrtc.getPTX(prog).decode().rstrip("\x00")
nvd = glob.glob(os.path.join(os.path.dirname(sys.executable), "..", "lib", "python3*", "site-packages",
                             "nvidia", "*", "bin", "nvdisasm"))[0]
# NVRTC 13.5's own cubin is refused by this nvdisasm; ptxas (CUDA 13.0, on PATH) is not.
ptx = re.sub(r"^\.version \S+", ".version 9.0", ptx, flags=re.M)
with tempfile.TemporaryDirectory() as d:
    open(f"{d}/k.ptx", "w").write(ptx)
    r = subprocess.run(["ptxas", "-arch=sm_90", "-v", f"{d}/k.ptx", "-o", f"{d}/k.cubin"], capture_output=True, text=True)
    if r.returncode: sys.exit(r.stderr)
    log = r.stdout + r.stderr
    f = type("F", (), {"name": f"{d}/k.cubin"})
    r = subprocess.run([nvd, "-c", f.name], capture_output=True, text=True)
    sass = r.stdout
    if r.returncode: sys.exit(r.stderr)
for e in exprs:
    name = lowered[e]
    regs = re.search(rf"Function properties for {re.escape(name)}.*?Used (\d+) registers", log, re.S)
    regs2 = re.findall(rf"Compiling entry function '{re.escape(name)}'.*?Used (\d+) registers", log, re.S)
    body = re.search(rf"\.text\.{re.escape(name)}:(.*?)(?:\n\s*\.section|\Z)", sass, re.S).group(1)
    ins = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", body)
    ops = collections.Counter(i.split(".")[0] for i in ins)
    conv = sum(ops[o] for o in ("F2F", "F2FP", "PRMT", "I2F", "F2I", "HADD2", "SHF", "IMAD"))
    print(f"{e}\n  regs {regs2[0] if regs2 else '?'}  instructions {len(ins)}  MUFU {ops['MUFU']}  "
          f"FFMA {ops['FFMA']} FMUL {ops['FMUL']} FADD {ops['FADD']}  F2FP {ops['F2FP']} HADD2 {ops['HADD2']} "
          f"PRMT {ops['PRMT']} SHF {ops['SHF']} IMAD {ops['IMAD']}  BRA {ops['BRA']}  LDG {ops['LDG']} STG {ops['STG']}")
    print("  top:", ", ".join(f"{k} {v}" for k, v in ops.most_common(14)))
    if dump:
        print(body)
