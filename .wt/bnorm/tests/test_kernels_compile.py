"""Every kernel specialisation the library can request compiles cleanly with NVRTC.

Needs only NVRTC (the ``nvrtc`` extra), not a GPU, so it runs in CI."""
import pytest

from dnnprims import _kernels

FAMILIES = _kernels.families()


def test_every_family_is_declared():
    names = {p.name for p in _kernels.KERNEL_DIR.glob("*.cu")}
    assert names == set(FAMILIES), "each kernels/*.cu file must be declared by exactly one module"


@pytest.mark.parametrize("filename", sorted(FAMILIES))
def test_family_compiles_without_warnings(filename):
    family = FAMILIES[filename]
    assert family.name_expressions, f"{filename} declares no specialisations"
    log = _kernels.compile_with_nvrtc(family)
    assert log == "", f"NVRTC warnings for {filename}:\n{log}"
