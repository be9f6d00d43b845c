"""Machine code of main's kernels vs this tree's, per kernel specialisation.

    [LIBNVRTC=/path/libnvrtc.so.13] PYTHONPATH=$PWD python notes/dedupe_sass.py [--base main] [FAMILY.cu:REGEX ...]

For each FAMILY.cu:REGEX, every name expression of that family (as this tree's
Python declares it) whose text matches REGEX is compiled by NVRTC to a CUBIN
for sm_90 with CuPy's options (what the GPU machine's RawModule does: -ftz=true,
--device-as-default-execution-space) twice: once from the base revision's kernels/ (git archive, headers
included) and once from this tree's kernels/.  The .text.<kernel> section of
each specialisation (its SASS bytes) and the section header's flags/info (the
register count lives there) are compared; a differing pair is also disassembled
with nvdisasm (if found) and the first differing lines are printed.

Prints one line per specialisation: identical / differs.  No GPU needed.
"""
import argparse
import ctypes
import difflib
import glob
import io
import os
import pathlib
import re
import struct
import subprocess
import sys
import tarfile
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
# What the dedupe change touches (notes/dedupe.md): the kernels whose source changed
# and, for the helpers moved into common.cuh, every kernel that calls them.
DEFAULT_TARGETS = [
    ("activation.cu", r"bias_activation_backward_rows_(packed|sweep)<"),
    ("activation.cu", r"<(half_t|bfloat16_t), (int|long long), (4|9)[,>]"),  # GELU: ex2/rcp_approx
    ("batchnorm.cu", r"batchnorm_rows_(train|backward)_(resident|fused)<"),
    ("row_normalization.cu", r"norm_rows_(backward_fused|backward_fused_pipelined|forward_pipelined)<"),
    ("softmax.cu", r"."),  # exp_for / ex2_approx / rcp_approx everywhere in 16-bit
]
FAMILY_MODULE = {
    "batchnorm.cu": "normalization",
    "row_normalization.cu": "row_normalization",
    "activation.cu": "activations",
    "softmax.cu": "softmaxes",
}


def nvrtc_library():
    """LIBNVRTC if set (the device's NVRTC: 13.0 in session 10, e.g. from `pip download
    nvidia-cuda-nvrtc==13.0.88 --no-deps`), else the venv's."""
    if os.environ.get("LIBNVRTC"):
        return ctypes.CDLL(os.environ["LIBNVRTC"])
    import nvidia  # the venv's nvidia packages carry libnvrtc
    for base in nvidia.__path__:
        hits = sorted(glob.glob(os.path.join(base, "cu*", "lib", "libnvrtc.so*")))
        if hits:
            return ctypes.CDLL(hits[0])
    return ctypes.CDLL("libnvrtc.so")


def nvrtc_version():
    major, minor = ctypes.c_int(), ctypes.c_int()
    NVRTC.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"NVRTC {major.value}.{minor.value} ({NVRTC._name})"


# What cupy.RawModule passes NVRTC on the GPU machine (with the loader's -std=c++17 -I kernels/).
CUPY_OPTIONS = (b"-arch=sm_90", b"-std=c++17", b"--device-as-default-execution-space", b"-ftz=true")


NVRTC = None


def check(status, prog=None):
    if status != 0:
        log = ""
        if prog is not None:
            size = ctypes.c_size_t()
            NVRTC.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value)
            NVRTC.nvrtcGetProgramLog(prog, buf)
            log = buf.value.decode(errors="replace")
        raise RuntimeError(f"NVRTC error {status}\n{log}")


def compile_cubin(source, kernel_dir, expressions):
    """CUBIN bytes and {expression: lowered name} for sm_90."""
    prog = ctypes.c_void_p()
    check(NVRTC.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"family.cu", 0, None, None))
    try:
        for e in expressions:
            check(NVRTC.nvrtcAddNameExpression(prog, e.encode()))
        opts = [*CUPY_OPTIONS, f"-I{kernel_dir}".encode()]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        check(NVRTC.nvrtcCompileProgram(prog, len(opts), arr), prog)
        lowered = {}
        for e in expressions:
            name = ctypes.c_char_p()
            check(NVRTC.nvrtcGetLoweredName(prog, e.encode(), ctypes.byref(name)))
            lowered[e] = name.value.decode()
        size = ctypes.c_size_t()
        check(NVRTC.nvrtcGetCUBINSize(prog, ctypes.byref(size)))
        buf = ctypes.create_string_buffer(size.value)
        check(NVRTC.nvrtcGetCUBIN(prog, buf))
        return buf.raw, lowered
    finally:
        NVRTC.nvrtcDestroyProgram(ctypes.byref(prog))


def elf_sections(blob):
    """{section name: (sh_flags, sh_info, bytes)} of a 64-bit little-endian ELF."""
    shoff, = struct.unpack_from("<Q", blob, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", blob, 0x3A)

    def header(i):
        return struct.unpack_from("<IIQQQQIIQQ", blob, shoff + i * shentsize)

    stroff = header(shstrndx)[4]
    out = {}
    for i in range(shnum):
        name, typ, flags, _addr, off, size, _link, info, _align, _ent = header(i)
        end = blob.index(b"\0", stroff + name)
        data = b"" if typ == 8 else blob[off:off + size]  # SHT_NOBITS
        out[blob[stroff + name:end].decode()] = (flags, info, data)
    return out


def find_nvdisasm():
    hits = glob.glob("/tmp/nvd/nvidia/cu*/bin/nvdisasm") + glob.glob("/usr/local/cuda*/bin/nvdisasm")
    try:
        import nvidia
        for base in nvidia.__path__:
            hits += glob.glob(os.path.join(base, "cu*", "bin", "nvdisasm"))
    except ImportError:
        pass
    return hits[0] if hits else None


def disassemble(nvdisasm, cubin, function):
    """The SASS lines of one kernel (addresses and encodings stripped)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True).stdout
    lines, inside = [], False
    for line in text.splitlines():
        if ".text." in line and line.lstrip().startswith("//-"):
            inside = re.search(r"\.text\.(\S+)", line).group(1) == function
            continue
        if inside:
            lines.append(re.sub(r"\.L_x_\d+", ".L", re.sub(r"/\*[0-9a-fx]{4,}\*/", "", line)).strip())
    return lines


def base_kernel_dir(rev, workdir):
    data = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "kernels"],
                          capture_output=True, check=True).stdout
    tarfile.open(fileobj=io.BytesIO(data)).extractall(workdir)
    return pathlib.Path(workdir) / "kernels"


def expressions_of(family_file, regex):
    import importlib
    module = importlib.import_module("dnnprims." + FAMILY_MODULE[family_file])
    pattern = re.compile(regex)
    return [e for e in module.FAMILY.name_expressions if pattern.search(e)]


def main():
    global NVRTC
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", default="main")
    parser.add_argument("targets", nargs="*")
    args = parser.parse_args()
    targets = [t.split(":", 1) for t in args.targets] or DEFAULT_TARGETS
    NVRTC = nvrtc_library()
    nvdisasm = find_nvdisasm()
    print(f"{nvrtc_version()}, options {' '.join(o.decode() for o in CUPY_OPTIONS)} -I<tree>/kernels; "
          f"nvdisasm: {nvdisasm}", flush=True)
    sys.path.insert(0, str(ROOT))
    totals = {"identical": 0, "differs": 0}
    with tempfile.TemporaryDirectory() as work:
        old_dir = base_kernel_dir(args.base, work)
        new_dir = ROOT / "kernels"
        for family_file, regex in targets:
            exprs = expressions_of(family_file, regex)
            print(f"== {family_file} /{regex}/: {len(exprs)} specialisations ({args.base} vs this tree)",
                  flush=True)
            old_src = (old_dir / family_file).read_text()
            new_src = (new_dir / family_file).read_text()
            old_bin, old_low = compile_cubin(old_src, old_dir, exprs)
            new_bin, new_low = compile_cubin(new_src, new_dir, exprs)
            old_sec, new_sec = elf_sections(old_bin), elf_sections(new_bin)
            for e in exprs:
                name = old_low[e]
                a = old_sec.get(".text." + name)
                b = new_sec.get(".text." + new_low[e])
                same = a is not None and a == b
                totals["identical" if same else "differs"] += 1
                size = len(a[2]) // 16 if a else 0
                print(f"  {'identical' if same else 'DIFFERS  '}  {size:5d} instr  {e}", flush=True)
                if not same and nvdisasm and a and b:
                    da = disassemble(nvdisasm, old_bin, name)
                    db = disassemble(nvdisasm, new_bin, new_low[e])
                    diff = [d for d in difflib.unified_diff(da, db, lineterm="", n=0)
                            if d[:1] in "+-" and d[:3] not in ("+++", "---")]
                    print(f"      {len(diff)} SASS lines differ (nvdisasm), first: {diff[:4]}")
    print(f"total: {totals['identical']} identical, {totals['differs']} differ")
    return 1 if totals["differs"] else 0


if __name__ == "__main__":
    sys.exit(main())
