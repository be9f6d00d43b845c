"""ptxas' registers / spill of single batchnorm.cu specialisations, as the device's NVRTC
compiles them (no GPU): NVRTC straight to an sm_90 cubin with CuPy's options plus
--ptxas-options=-v, the program log filtered to the named kernels.
    LIBNVRTC=/tmp/nvrtc130/x/nvidia/cu13/lib/libnvrtc.so.13 python notes/smallbn_regs.py ROOT 'expr' ..."""
import ctypes
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "ab"))
import sass_compare  # noqa: E402


def main(argv):
    root, *expressions = argv
    lib, prog = sass_compare.library(), ctypes.c_void_p()
    kdir = os.path.join(root, "kernels")
    src = open(os.path.join(kdir, "batchnorm.cu")).read()
    lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"batchnorm.cu", 0, None, None)
    for e in expressions:
        lib.nvrtcAddNameExpression(prog, e.encode())
    opts = [*sass_compare.CUPY_OPTIONS, f"-I{kdir}".encode(), b"--ptxas-options=-v"]
    status = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    print(sass_compare.version(), "status", status)
    print(log.value.decode())


if __name__ == "__main__":
    main(sys.argv[1:])
