"""dnnprims._cublas.gemm: row-major strided-batched GEMM on cuBLAS, against matmul."""
import itertools

import numpy as np
import pytest

from dnnprims._cublas import gemm
from dnnprims.testing import assert_close

from conftest import random_array

# (batch or None, M, N, K): sizes 1, 3, 7, 13 and a shared (2-D) operand.
SHAPES = [(None, 7, 13, 3), (None, 1, 1, 1), (3, 13, 7, 1), (2, 3, 1, 7), (5, 8, 16, 32)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product([False, True], repeat=2)))
@pytest.mark.parametrize("shared", ["a", "b", "none"])
@pytest.mark.parametrize("beta", [0.0, 1.0, -0.5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gemm_matches_matmul(xp, rng, shape, trans_a, trans_b, shared, beta, dtype):
    batch, M, N, K = shape
    lead = () if batch is None else (batch,)
    a_shape = (K, M) if trans_a else (M, K)
    b_shape = (N, K) if trans_b else (K, N)
    a = random_array(rng, a_shape if shared == "a" or batch is None else lead + a_shape, dtype)
    b = random_array(rng, b_shape if shared == "b" or batch is None else lead + b_shape, dtype)
    c0 = random_array(rng, lead + (M, N), dtype)
    op_a = np.swapaxes(a, -1, -2) if trans_a else a
    op_b = np.swapaxes(b, -1, -2) if trans_b else b
    want = op_a.astype(np.float64) @ op_b.astype(np.float64) + beta * c0.astype(np.float64)
    c = xp.asarray(c0)
    got = gemm(xp, xp.asarray(a), xp.asarray(b), c, trans_a=trans_a, trans_b=trans_b, beta=beta)
    assert got is c
    assert_close(got, want, dtype)
