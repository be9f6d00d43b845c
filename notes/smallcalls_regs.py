"""ptxas' resource use (registers, spill, shared memory) of single kernel
specialisations, without a GPU: NVRTC compiles the family's source to PTX for
compute_90, ptxas (CUDA 13.0 on PATH) assembles it for sm_90 with -v.
    python notes/smallcalls_regs.py ROOT FAMILY_FILE 'expr' ['expr' ...] [--ptx OUT]
ROOT: a tree holding kernels/ (main's, or a patched copy).  Resident 256-thread
blocks per SM follow from the registers (65536 / (regs * 256), rounded down)."""
import os
import re
import subprocess
import sys
import tempfile

from cupy_backends.cuda.libs import nvrtc

args = sys.argv[1:]
ptx_out = None
if "--ptx" in args:
    i = args.index("--ptx")
    ptx_out = args[i + 1]
    del args[i:i + 2]
root, filename, *exprs = args
kdir = os.path.join(root, "kernels")
src = open(os.path.join(kdir, filename)).read()
prog = nvrtc.createProgram(src, filename, [], [])
for e in exprs:
    nvrtc.addNameExpression(prog, e)
try:
    nvrtc.compileProgram(prog, ["--gpu-architecture=compute_90", "-std=c++17", f"-I{kdir}"])
except nvrtc.NVRTCError:
    print(nvrtc.getProgramLog(prog))
    raise
lowered = {e: nvrtc.getLoweredName(prog, e) for e in exprs}
ptx = nvrtc.getPTX(prog).decode().rstrip("\x00")
if ptx_out:
    open(ptx_out, "w").write(ptx)
ptx = re.sub(r"^\.version \S+", ".version 9.0", ptx, flags=re.M)
with tempfile.TemporaryDirectory() as d:
    open(f"{d}/k.ptx", "w").write(ptx)
    r = subprocess.run(["ptxas", "-arch=sm_90", "-v", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                       capture_output=True, text=True)
    if r.returncode:
        sys.exit(r.stderr)
    log = r.stdout + r.stderr
for e in exprs:
    name = lowered[e]
    m = re.search(rf"Compiling entry function '{re.escape(name)}'.*?Function properties.*?"
                  r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads.*?"
                  r"Used (\d+) registers(?:, used \d+ barriers)?(?:, (\d+) bytes smem)?", log, re.S)
    if not m:
        print(e, "?")
        continue
    stack, sst, sld, regs, smem = m.groups()
    regs = int(regs)
    blocks = 65536 // (((regs + 7) // 8 * 8) * 256)
    print(f"{e}: regs {regs} (256-thread blocks/SM by registers {blocks}), spill {sst}/{sld}, "
          f"stack {stack}, smem {smem or 0}")
