"""regs.py ROOT expr... : registers / spill (ptxas -v via NVRTC 13.0) and SASS instruction counts."""
import ctypes, os, re, subprocess, sys, tempfile, collections
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ab"))
os.environ.setdefault("LIBNVRTC", "/tmp/nvrtc130/x/nvidia/cu13/lib/libnvrtc.so.13")
import sass_compare as sc
root, *exprs = sys.argv[1:]
kdir = os.path.join(root, "kernels")
src = open(os.path.join(kdir, "pooling.cu")).read()
lib, prog = sc.library(), ctypes.c_void_p()
assert not lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"pooling.cu", 0, None, None)
for e in exprs: lib.nvrtcAddNameExpression(prog, e.encode())
opts = [*sc.CUPY_OPTIONS, f"-I{kdir}".encode(), b"--ptxas-options=-v"]
st = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
size = ctypes.c_size_t(); lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
log = ctypes.create_string_buffer(size.value); lib.nvrtcGetProgramLog(prog, log); log = log.value.decode()
if st: print(log); sys.exit(1)
lowered = {}
for e in exprs:
    name = ctypes.c_char_p(); lib.nvrtcGetLoweredName(prog, e.encode(), ctypes.byref(name)); lowered[e] = name.value.decode()
size = ctypes.c_size_t(); lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
b = ctypes.create_string_buffer(size.value); lib.nvrtcGetCUBIN(prog, b)
info = {}
cur = None
for line in log.splitlines():
    m = re.search(r"Compiling entry function '(\S+)'", line)
    if m: cur = m.group(1)
    m = re.search(r"Used (\d+) registers", line)
    if m and cur: info.setdefault(cur, {})["regs"] = int(m.group(1))
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m and cur: info.setdefault(cur, {})["spill"] = (int(m.group(1)), int(m.group(2)))
L = sc.listings(b.raw, lowered)
dump = os.environ.get("DUMP")
for e in exprs:
    lines = L[e]
    ldg = sum(1 for l in lines if l.startswith("LDG") or " LDG" in l)
    stg = sum(1 for l in lines if "STG" in l)
    print(f"{e}: {info.get(lowered[e])} sass {len(lines)} LDG {ldg} STG {stg}")
    if dump:
        open(f"{dump}/{re.sub(r'[^A-Za-z0-9]+','_',e)}.sass","w").write("\n".join(lines))
