"""Tensors of more than 2^31 elements take the 64-bit index specialisation and
give the right answer everywhere, including past element 2^31.

Each test allocates about 9-13 GB of GPU memory (float16 keeps it small), so
they run only on the GPU.  The check compares whole outputs with CuPy's own
elementwise arithmetic (64-bit safe) or samples slices on both sides of the
2^31 boundary against the NumPy reference.
"""
import numpy as np
import pytest

import dnnprims
from dnnprims.reference import pooling as pooling_reference
from dnnprims.reference import softmaxes as softmax_reference
from dnnprims.testing import assert_close

pytestmark = pytest.mark.gpu

LARGE = 2**31 + 4099  # odd, so the tail is not a multiple of any block size


@pytest.fixture
def big(gpu):
    yield gpu
    gpu.get_default_memory_pool().free_all_blocks()


def test_activation_past_int32_range(big):
    cp = big
    x = cp.random.uniform(-1, 1, LARGE, dtype=cp.float32).astype(cp.float16)
    y = dnnprims.activation(x, "relu")
    assert bool((y == cp.maximum(x, 0)).all())
    dx = dnnprims.activation_backward(x, x, "relu")
    assert bool((dx == cp.where(x > 0, x, 0)).all())


def test_pooling_past_int32_range(big):
    cp = big
    # 2 x 16385 x 256 x 256 = 2^31 + 2^17 elements
    shape = (2, 16385, 256, 256)
    x = cp.random.uniform(-1, 1, shape, dtype=cp.float32).astype(cp.float16)
    assert x.size > 2**31
    y = dnnprims.pool(x, 2, mode="max")
    yavg = dnnprims.pool(x, 3, mode="avg", stride=2, padding=1)
    for n, c in ((0, 0), (1, 16384), (1, 8191)):  # the last plane lies past 2^31
        plane = x[n:n + 1, c:c + 1].get()
        assert_close(y[n:n + 1, c:c + 1], pooling_reference.pool(plane.astype(np.float64), (2, 2), (2, 2), (0, 0), "max", True, "NCHW"), np.float16)
        assert_close(yavg[n:n + 1, c:c + 1], pooling_reference.pool(plane.astype(np.float64), (3, 3), (2, 2), (1, 1), "avg", True, "NCHW"), np.float16)
    # max 3x3 / 2 / 1 backward: the vectorised pool_k3s2 kernel, planes past 2^31 elements
    del yavg
    dy = cp.random.uniform(-1, 1, y.shape[:2] + (128, 128), dtype=cp.float32).astype(cp.float16)
    dx = dnnprims.pool_backward(dy, x, None, 3, stride=2, padding=1)
    for n, c in ((0, 0), (1, 16384), (1, 8191)):
        plane, dplane = x[n:n + 1, c:c + 1].get(), dy[n:n + 1, c:c + 1].get()
        want = pooling_reference.pool_backward(dplane.astype(np.float64), plane.astype(np.float64),
                                               (3, 3), (2, 2), (1, 1), "max", True, "NCHW")
        assert_close(dx[n:n + 1, c:c + 1], want, np.float16)


def test_softmax_past_int32_range(big):
    cp = big
    rows, cols = 2**21 + 3, 1024  # 2^31 + 3072 elements
    x = cp.random.uniform(-4, 4, (rows, cols), dtype=cp.float32).astype(cp.float16)
    y = dnnprims.softmax(x, axis=1)
    for r in (0, rows // 2, rows - 1):
        row = x[r:r + 1].get().astype(np.float64)
        assert_close(y[r:r + 1], softmax_reference.softmax(row, 1), np.float16)
