"""Shared fixtures: the array modules a test body runs on, and random data.

A test written against ``xp`` runs once on NumPy and, where a GPU is present,
once on CuPy; the CuPy run is marked ``gpu`` and skips cleanly without one.
"""
import importlib.util
import os
import zlib

import numpy as np
import pytest

from dnnprims import _dtypes


def _gpu_available():
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


# test_against_torch.py uses PyTorch as an optional oracle, not a dependency: where torch is
# not installed the file is left uncollected, so that pytest reports no skip for it.
collect_ignore = [] if importlib.util.find_spec("torch") else ["test_against_torch.py"]

GPU = _gpu_available()
requires_gpu = pytest.mark.skipif(not GPU, reason="no CUDA GPU available")

if GPU:
    import cupy
else:
    cupy = None

XP_PARAMS = [pytest.param(np, id="numpy"),
             pytest.param(cupy, id="cupy", marks=[pytest.mark.gpu, requires_gpu])]

FLOAT_DTYPES = [pytest.param(d, id=d.name) for d in _dtypes.SUPPORTED]


@pytest.fixture(params=XP_PARAMS)
def xp(request):
    return request.param


@pytest.fixture
def gpu():
    """The cupy module; skips the test where there is no GPU."""
    if not GPU:
        pytest.skip("no CUDA GPU available")
    return cupy


@pytest.fixture
def rng(request):
    """Random data, seeded from the test's id: every run of a test draws the same data, and
    different tests (and parameters) draw different data.  Unseeded, a rare ill-conditioned
    draw (a sum that cancels to 1e-5 of its terms, compared relative to itself) failed CI once
    in a while with data nobody could reproduce (session 9: an LSTM 1x1x1 dh and a group-norm
    adjoint identity); hypothesis tests explore shapes and values with their own seeds."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def random_array(rng, shape, dtype=np.float64, low=-1.0, high=1.0):
    """Fresh uniform random data (never zeros) in the given dtype."""
    return rng.uniform(low, high, size=shape).astype(dtype)


@pytest.fixture
def rule_only():
    """algo="auto" follows the documented rule (no measured table) for the duration of a test."""
    from dnnprims.algos import table
    previous = table.use(None)
    yield
    table.use(previous)


def pytest_collection_modifyitems(config, items):
    """A test that asks for the ``gpu`` fixture is a GPU test: mark it ``gpu`` so that
    ``pytest -m gpu`` (scripts/gpu_suite.sh) selects it, as it does the CuPy runs of ``xp``.

    ``DNNPRIMS_TEST_SHARD=i/n`` keeps every n-th collected test starting at i (round
    robin, so each family's slow tests spread over the shards): scripts/gpu_suite.sh
    runs n shards side by side, one process each, to use the GPU machine's cores."""
    for item in items:
        if "gpu" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.gpu)
    spec = os.environ.get("DNNPRIMS_TEST_SHARD")
    if spec:
        index, count = (int(v) for v in spec.split("/"))
        if not 0 <= index < count:
            raise pytest.UsageError(f"DNNPRIMS_TEST_SHARD={spec!r}: expected i/n with 0 <= i < n")
        keep = [item for k, item in enumerate(items) if k % count == index]
        drop = [item for k, item in enumerate(items) if k % count != index]
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep
