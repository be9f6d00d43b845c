"""Registers and SASS instruction mix of chosen activation.cu specialisations, no GPU:
NVRTC -> PTX (compute_90) -> ptxas -arch=sm_90 -v -> nvdisasm.  Evidence for notes/biasact.md.
    PYTHONPATH=$PWD python notes/biasact_sass.py [expr ...]"""
import collections
import os
import re
import subprocess
import sys
import tempfile

from cupy_backends.cuda.libs import nvrtc

from dnnprims import _kernels, activations

NVDISASM = os.environ.get("NVDISASM", "nvdisasm")
EXPRS = [a.replace("~", " ") for a in sys.argv[1:]] or [
    "activation_forward<half_t, int, 4, 4>", "activation_forward<half_t, int, 9, 4>",
    "activation_forward<half_t, int, 9, 1>", "activation_forward<half_t, int, 0, 1>",
    "bias_activation_backward_planes<float, int, 4>", "bias_activation_backward_plane_packs<float, int, 4>",
    "bias_activation_backward_rows_packed<float, int, 0>", "bias_activation_backward_rows_sweep<float, int, 0>",
    "bias_activation_backward_rows_packed<float, int, 4>", "bias_activation_backward_rows_sweep<float, int, 4>",
]


def ptx_of(exprs):
    family = activations.FAMILY
    prog = nvrtc.createProgram(family.source, family.filename, [], [])
    try:
        for e in exprs:
            nvrtc.addNameExpression(prog, e)
        nvrtc.compileProgram(prog, ["--gpu-architecture=compute_90", *_kernels.COMPILE_OPTIONS])
        return nvrtc.getPTX(prog), {e: nvrtc.getLoweredName(prog, e) for e in exprs}
    finally:
        nvrtc.destroyProgram(prog)


def main():
    # Only the requested specialisations: a trimmed family source is not needed, NVRTC
    # instantiates just the name expressions added.
    ptx, lowered = ptx_of(EXPRS)
    with tempfile.TemporaryDirectory() as d:
        ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
        # NVRTC may be newer than the local ptxas: claim the version ptxas reads (no new features used).
        ptx = re.sub(r"^\.version \S+", ".version " + os.environ.get("PTX_VERSION", "9.0"), ptx, flags=re.M)
        open(f"{d}/k.ptx", "w").write(ptx.rstrip("\x00"))
        log = subprocess.run(["ptxas", "-arch=sm_90", "-v", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                             capture_output=True, text=True).stderr
        sass = subprocess.run([NVDISASM, "-c", f"{d}/k.cubin"], capture_output=True, text=True).stdout
    regs = {}
    current = None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            current = m.group(1)
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            regs[current] = int(m.group(1))
        m = re.search(r"(\d+) bytes spill stores", line)
        if m and current and int(m.group(1)):
            print(f"SPILL {current}: {line.strip()}")
    # split SASS by function
    bodies = collections.defaultdict(list)
    current = None
    for line in sass.splitlines():
        m = re.match(r"\s*\.text\.(\S+):", line)
        if m:
            current = m.group(1)
            continue
        m = re.search(r"/\*[0-9a-f]{4}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", line)
        if m and current:
            bodies[current].append(m.group(2))
    for e in EXPRS:
        low = lowered[e]
        ops = bodies.get(low, [])
        kinds = collections.Counter(o.split(".")[0] for o in ops)
        mufu = sum(1 for o in ops if o.startswith("MUFU"))
        print(f"{e:55s} regs {regs.get(low, '?'):>3}  SASS {len(ops):4d}  LDG {kinds['LDG']:2d} STG {kinds['STG']:2d}"
              f" MUFU {mufu:2d}  FFMA+FMUL+FADD {kinds['FFMA'] + kinds['FMUL'] + kinds['FADD']:3d}")


if __name__ == "__main__":
    main()
