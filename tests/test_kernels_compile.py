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


# Kernels written in inline PTX for sm_90 and up (bulk copies, mbarriers, clusters).
_INLINE_PTX = [("row_normalization.cu", "gn_rows_backward_pipelined<"),
               ("batchnorm.cu", "batchnorm_train_cluster<"),
               # the resident rows kernels' evict-first loads / stores (one 16-byte specialisation)
               ("batchnorm.cu", "batchnorm_rows_train_resident<half_t, float, int, 8>"),
               # their 16-bit rows as words (cvt.f32.f16 of a word's halves, cvt.rn.{f16,bf16}x2.f32)
               ("batchnorm.cu", "batchnorm_rows_train_resident<half_t, float, int, 8, true, true>"),
               ("batchnorm.cu", "batchnorm_rows_backward_resident<bfloat16_t, float, int, 8, true>"),
               # their 16-bit 8-byte (4 channels a thread) evict-first accesses, ld / st.global.cs.v2
               ("batchnorm.cu", "batchnorm_rows_backward_narrow<half_t, float, int>"),
               ("row_normalization.cu", "gn_rows_backward_cluster<"),
               ("row_normalization.cu", "gn_rows_backward_registers<"),
               ("row_normalization.cu", "gn_rows_forward_cluster<")]


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
@pytest.mark.parametrize("filename, prefix", _INLINE_PTX)
def test_inline_ptx_assembles(arch, filename, prefix):
    """The check above stops at compute_90 PTX, which nothing assembles until a GPU
    loads it: inline PTX that ptxas rejects (operand types, state spaces) would
    pass it.  gn_rows_backward_pipelined's bulk copies and mbarriers, and
    batchnorm_train_cluster's bulk copies and cluster barriers / distributed
    shared memory, are inline PTX (sm_90 and up; below, the first has its
    cp.async path and the second traps, never launched there): their
    specialisations compiled for a real architecture, which makes NVRTC run
    ptxas, on both sides of the `__CUDA_ARCH__ >= 900` switch."""
    import types
    family = FAMILIES[filename]
    expressions = [e for e in family.name_expressions if e.startswith(prefix)]
    assert expressions
    subset = types.SimpleNamespace(source=family.source, filename=family.filename, name_expressions=expressions)
    log = _kernels.compile_with_nvrtc(subset, arch=arch)
    assert log == "", f"NVRTC / ptxas messages for {arch}:\n{log}"


def test_kernel_source_carries_the_headers_digest(tmp_path):
    """CuPy caches compiled kernels by source text and options only: each family's
    source ends with a digest of the kernels/*.cuh it may include, so a changed
    header changes every family's cache key."""
    from dnnprims import _kernels
    for family in _kernels.families().values():
        assert family.source.endswith(f"\n// headers {_kernels.headers_digest()}\n"), family.filename
    (tmp_path / "a.cuh").write_text("int a;")
    (tmp_path / "b.cuh").write_text("int b;")
    before = _kernels.headers_digest(str(tmp_path))
    (tmp_path / "b.cuh").write_text("int b2;")
    _kernels.headers_digest.cache_clear()
    assert _kernels.headers_digest(str(tmp_path)) != before
    assert len(_kernels.headers_digest()) == 16
