"""The one kernel loader.

Each ``kernels/<family>.cu`` file is a *kernel family*: CUDA C++ templates
plus the list of name expressions (specialisations) the library may request.
A family is compiled per device and per kernel: the first launch of
``activation_forward<...>`` compiles every declared specialisation of
``activation_forward`` in one NVRTC call (CuPy also keeps the binary in its
on-disk cache), not the whole family -- a family of several kernels times
dtypes, index types and modes has hundreds of specialisations, over a minute
of NVRTC for the first call otherwise.  Every launch goes through
:meth:`KernelFamily.function`.  Nothing else in dnnprims compiles code.

Without a GPU, :func:`compile_with_nvrtc` compiles a family to PTX through
NVRTC alone; CI uses it to prove that every specialisation builds cleanly.
"""
import pathlib

from ._validate import INT32_LIMIT

_HERE = pathlib.Path(__file__).resolve().parent
# Installed wheels carry kernels/ as dnnprims/kernels; a source checkout has it
# beside the package.
KERNEL_DIR = _HERE / "kernels" if (_HERE / "kernels" / "common.cuh").exists() else _HERE.parent / "kernels"

# Options for every compile.  -std=c++17 for alias templates and if constexpr;
# no fast-math: results must match the references within the documented bounds.
COMPILE_OPTIONS = ("-std=c++17", f"-I{KERNEL_DIR}")

_FAMILIES = {}


def index_type(*sizes):
    """'int' when every size (element count) fits 32-bit indexing, else 'long long'."""
    return "int" if max(sizes, default=0) <= INT32_LIMIT else "long long"


class KernelFamily:
    """One ``kernels/*.cu`` file and the specialisations the library launches."""

    def __init__(self, filename, name_expressions):
        self.filename = filename
        self.name_expressions = tuple(name_expressions)
        self._declared = frozenset(self.name_expressions)
        self._modules = {}  # (device id, kernel name) -> cupy.RawModule
        self._functions = {}  # (device id, expression) -> cupy.RawKernel: the hot-path lookup
        _FAMILIES[filename] = self

    @property
    def source(self):
        return (KERNEL_DIR / self.filename).read_text()

    def function(self, expression):
        """The compiled kernel for one name expression on the current device."""
        import cupy

        device = cupy.cuda.runtime.getDevice()
        kernel = self._functions.get((device, expression))
        if kernel is not None:
            return kernel
        if expression not in self._declared:
            raise KeyError(f"{expression!r} is not a declared specialisation of {self.filename}")
        kernel_name = expression.split("<", 1)[0]
        module = self._modules.get((device, kernel_name))
        if module is None:
            group = tuple(e for e in self.name_expressions if e.split("<", 1)[0] == kernel_name)
            module = cupy.RawModule(code=self.source, options=COMPILE_OPTIONS, name_expressions=group)
            try:
                module.compile()
            except cupy.cuda.compiler.CompileException as e:
                raise RuntimeError(f"compiling {kernel_name} of kernel family {self.filename} failed:\n"
                                   f"{e.get_message()}") from None
            self._modules[(device, kernel_name)] = module
        kernel = self._functions[(device, expression)] = module.get_function(expression)
        return kernel

    def launch(self, expression, grid, block, args, shared_mem=0):
        """Launch on the current device and current CuPy stream."""
        self.function(expression)(grid, block, args, shared_mem=shared_mem)


def families():
    """Every kernel family the library declares (imports all primitive modules)."""
    from . import (algos, pooling, normalization, row_normalization, softmaxes, activations,  # noqa: F401
                   recurrent, tensor_ops)
    return dict(_FAMILIES)


def compile_with_nvrtc(family, arch="compute_90"):
    """Compile every specialisation of a family to PTX with NVRTC (no GPU needed).

    Returns NVRTC's log; raises RuntimeError with the log on failure."""
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(family.source, family.filename, [], [])
    try:
        for expr in family.name_expressions:
            nvrtc.addNameExpression(prog, expr)
        options = [f"--gpu-architecture={arch}", *COMPILE_OPTIONS]
        try:
            nvrtc.compileProgram(prog, options)
        except nvrtc.NVRTCError:
            raise RuntimeError(f"compiling kernel family {family.filename} failed:\n"
                               f"{nvrtc.getProgramLog(prog)}") from None
        for expr in family.name_expressions:
            nvrtc.getLoweredName(prog, expr)  # raises if an expression was not instantiated
        return nvrtc.getProgramLog(prog).strip("\x00").strip()
    finally:
        nvrtc.destroyProgram(prog)


def ceil_div(a, b):
    return -(-a // b)
