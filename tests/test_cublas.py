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


def _column_major_args(gpu, rng, dtype, batch=3, m=13, n=7, k=5):
    """Operands of a strided-batched C = A B (column-major, cuBLAS's order) and
    the argument tuple of StridedBatched.call for them."""
    from dnnprims import _cublas
    a = gpu.asarray(random_array(rng, (batch, k, m), dtype))     # column-major m x k: stored k rows of m
    b = gpu.asarray(random_array(rng, (batch, n, k), dtype))
    c = gpu.empty((batch, n, m), dtype)
    one, zero = (_cublas._scalar(np.dtype(dtype), v).ctypes.data for v in (1.0, 0.0))
    args = (_cublas._OP_N, _cublas._OP_N, m, n, k, one, a.data.ptr, m, m * k, b.data.ptr, k, k * n, zero,
            c.data.ptr, m, m * n, batch)
    return a, b, c, args


def _want(a, b):
    # Column-major C = A B is, in row-major storage, C^T = B^T A^T: c[i] = b[i] @ a[i].
    return np.matmul(b.get().astype(np.float64), a.get().astype(np.float64))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_strided_batched_direct_call_follows_the_current_stream(gpu, rng, dtype):
    """The ctypes call on our own handle sets the handle's stream only when the
    current stream changed: calls alternating between the default stream and a
    side stream, each result read on its own stream, all equal the reference."""
    from dnnprims import _cublas
    run = _cublas.StridedBatched(dtype)
    side = gpu.cuda.Stream(non_blocking=True)
    for stream in (gpu.cuda.Stream.null, side, side, gpu.cuda.Stream.null, side):
        with stream:
            a, b, c, args = _column_major_args(gpu, rng, dtype)
            run(*args)
            assert_close(c, _want(a, b), dtype)
            stream.synchronize()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_strided_batched_graph_replays_on_new_operand_values(gpu, rng, dtype):
    """A captured GEMM graph (pointers fixed) computes with the operands' values
    at each launch, on any stream; nothing runs at capture time."""
    from dnnprims import _cublas
    run = _cublas.StridedBatched(dtype)
    a, b, c, args = _column_major_args(gpu, rng, dtype)
    c.fill(7)
    before = _cublas.captures
    captured = run.capture([args])
    assert captured is not None, _cublas.CAPTURE_FAILURES
    assert _cublas.captures == before + 1
    graph, keep = captured
    gpu.cuda.Device().synchronize()
    assert bool((c == 7).all())                   # capture ran nothing
    side = gpu.cuda.Stream(non_blocking=True)
    for stream in (gpu.cuda.Stream.null, side):
        with stream:
            a[...] = gpu.asarray(random_array(rng, a.shape, dtype))
            b[...] = gpu.asarray(random_array(rng, b.shape, dtype))
            graph.launch()
            assert_close(c, _want(a, b), dtype)
    run(*args)                                    # the direct call still works after a capture
    assert_close(c, _want(a, b), dtype)
