"""Do two trees compile a kernel family to the same machine code, as the GPU machine
compiles it?  NVRTC straight to an sm_90 cubin with CuPy's options (what RawModule does
on the device: -arch=sm_90, the family's options, --device-as-default-execution-space,
-ftz=true), nvdisasm's listing of each named specialisation, compared line by line with
branch labels renumbered per function and per-program helper numbers taken out.  A
refactor of a timed kernel that keeps every line needs no new timing; one that changes
them does (session 10: a restructured max-pool backward ran 10 % slower with bitwise
equal results, and a local ptxas of NVRTC's PTX had called it identical).
    python notes/ab/sass_compare.py OLD_ROOT NEW_ROOT family.cu "expr<...>" [...]
        (OLD_ROOT: e.g. git archive REV dnnprims kernels | tar -x -C /tmp/old; the family's
        source and include folder are each tree's kernels/)
    LIBNVRTC=/path/libnvrtc.so.13: the device's NVRTC (13.0 in session 10: pip download
    nvidia-cuda-nvrtc==13.0.88 --no-deps), else CuPy's.  NVDISASM=path to nvdisasm 13.x
    (pip nvidia-cuda-nvdisasm).  CuPy's nvrtc.getCUBIN drops the cubin's last byte, which
    nvdisasm refuses: NVRTC is called through ctypes here."""
import collections
import ctypes
import os
import pathlib
import re
import subprocess
import sys
import tempfile

from cupy_backends.cuda.libs import nvrtc

NVDISASM = os.environ.get("NVDISASM", "/tmp/nvd/nvidia/cu13/bin/nvdisasm")
CUPY_OPTIONS = (b"-arch=sm_90", b"-std=c++17", b"--device-as-default-execution-space", b"-ftz=true")


def library():
    default = pathlib.Path(nvrtc.__file__).parents[3] / "nvidia/cu13/lib/libnvrtc.so.13"
    return ctypes.CDLL(os.environ.get("LIBNVRTC", str(default)))


def version():
    lib, major, minor = library(), ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"NVRTC {major.value}.{minor.value} ({lib._name})"


def cubin_of(source, kernel_dir, expressions, filename="kernel.cu"):
    """(cubin bytes, {expression: lowered name}) of the expressions of source."""
    lib, prog = library(), ctypes.c_void_p()

    def ok(status, what):
        if status:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(f"{what}: NVRTC error {status}\n{log.value.decode()}")

    ok(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), filename.encode(), 0, None, None), "create")
    try:
        for e in expressions:
            ok(lib.nvrtcAddNameExpression(prog, e.encode()), e)
        opts = [*CUPY_OPTIONS, f"-I{kernel_dir}".encode()]
        ok(lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts)), "compile")
        size = ctypes.c_size_t()
        ok(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "cubin size")
        binary = ctypes.create_string_buffer(size.value)
        ok(lib.nvrtcGetCUBIN(prog, binary), "cubin")
        lowered = {}
        for e in expressions:
            name = ctypes.c_char_p()
            ok(lib.nvrtcGetLoweredName(prog, e.encode(), ctypes.byref(name)), e)
            lowered[e] = name.value.decode()
        return binary.raw, lowered
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def listings(binary, lowered):
    """{expression: [normalised instruction lines]} from nvdisasm."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(binary)
        sass = subprocess.run([NVDISASM, "-c", path], capture_output=True, text=True, check=True).stdout
    bodies, labels, current = collections.defaultdict(list), collections.defaultdict(dict), None
    for line in sass.splitlines():
        m = re.match(r"\s*\.text\.(\S+):", line)
        if m:
            current = m.group(1)
            continue
        m = re.search(r"/\*[0-9a-f]{4}\*/\s+(.*?);", line)
        if m and current:
            ins, names = m.group(1), labels[current]
            ins = re.sub(r"\.L_x_\d+", lambda t: names.setdefault(t.group(0), f"L{len(names)}"), ins)
            ins = ins.replace(f"`({current})", "SELF")
            ins = re.sub(r"\$__internal_\d+_", "$__internal_N_", ins)
            bodies[current].append(" ".join(ins.split()))
    return {e: bodies.get(name, []) for e, name in lowered.items()}


def registers(lines):
    """Highest register index used + 1 (nvdisasm's view of the function's registers)."""
    return max((int(r) for i in lines for r in re.findall(r"\bR(\d+)\b", i)), default=-1) + 1


def compare(old_root, new_root, filename, expressions, new_expressions=None):
    """[(old expression, new expression, old lines, new lines)] compiled from each tree's kernels/."""
    new_expressions = new_expressions or expressions
    out = []
    for root, exprs in ((old_root, expressions), (new_root, new_expressions)):
        kernel_dir = os.path.join(root, "kernels")
        with open(os.path.join(kernel_dir, filename)) as f:
            out.append(listings(*cubin_of(f.read(), kernel_dir, exprs, filename)))
    return [(a, b, out[0][a], out[1][b]) for a, b in zip(expressions, new_expressions)]


def main(argv):
    old_root, new_root, filename, *expressions = argv
    print(f"{version()}, sm_90 cubins with CuPy's options, {NVDISASM}")
    same = True
    for e, _, a, b in compare(old_root, new_root, filename, expressions):
        differ = sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b))
        same &= differ == 0
        print(f"{'identical' if not differ else f'{differ} of {len(a)} lines differ':>28}  regs {registers(a)} / "
              f"{registers(b)}  {e}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
