"""Sizes over 2^31 elements, checked without a GPU and without allocating:
what convolution's algorithm choice does with such problems (each algorithm
either admits them and indexes in 64 bits, or refuses them saying why), and
that the validation of the public functions neither overflows nor refuses
them.  tests/test_large_tensors.py runs the kernels themselves on the GPU."""
import numpy as np
import pytest

import dnnprims
from dnnprims import algos
from dnnprims._validate import INT32_LIMIT
from dnnprims.conv import _describe


def _big(x_shape, w_shape, layout="NCHW", dtype="float32", groups=1, padding=None):
    R = w_shape[2]
    return _describe(x_shape, w_shape, 1, R // 2 if padding is None else padding, 1, groups, layout, dtype)


# cuBLAS takes the GEMM's m, n, k and leading dimensions as 32-bit ints (CuPy's
# wrapper raises OverflowError on a bigger one): the "gemm" algorithm must refuse
# a problem where one of them would be over 2^31 - 1, so that "auto" takes
# another algorithm and algo="gemm" says why, instead of failing in the call.
@pytest.mark.parametrize("direction", algos.DIRECTIONS)
def test_gemm_refuses_gemm_dimensions_over_int32(direction):
    # NHWC 1x1: the GEMM's rows are N*P*Q = 2^31 + 2^16 (x and y 17 GB each in float32)
    p = _big((2**15 + 1, 256, 256, 2), (2, 2, 1, 1), "NHWC")
    assert p.N * p.P * p.Q > INT32_LIMIT
    ok, why = algos.admits(algos.REGISTRY["gemm"], p, direction)
    if direction == "backward_filter":   # chunked over the batch: the depth stays small
        assert ok, why
    else:
        assert not ok and "2^31" in why
        assert dnnprims.conv2d_choose(p.x_shape, p.w_shape, layout="NHWC", direction=direction)[0] != "gemm"
        with pytest.raises(ValueError, match="2\\^31"):
            dnnprims.conv2d_choose(p.x_shape, p.w_shape, layout="NHWC", direction=direction, algo="gemm")


def test_gemm_still_admits_a_big_nchw_batch():
    # NCHW batches are a strided batch of GEMMs of P*Q columns: 2.2e9 elements are fine
    p = _big((33, 64, 1024, 1024), (64, 64, 1, 1))
    assert p.N * p.C * p.H * p.W > INT32_LIMIT
    for direction in algos.DIRECTIONS:
        assert algos.admits(algos.REGISTRY["gemm"], p, direction)[0]


BIG = {   # problems of more than 2^31 elements in x or y
    "nchw_3x3": ((33, 64, 1024, 1024), (64, 64, 3, 3), "NCHW", 1),
    "nhwc_3x3": ((33, 1024, 1024, 64), (64, 64, 3, 3), "NHWC", 1),
    "nchw_1x1": ((33, 64, 1024, 1024), (64, 64, 1, 1), "NCHW", 1),
    "nhwc_1x1_rows": ((2**15 + 1, 256, 256, 2), (2, 2, 1, 1), "NHWC", 1),
    "depthwise": ((33, 64, 1024, 1024), (64, 1, 3, 3), "NCHW", 64),
    "grouped": ((33, 64, 1024, 1024), (64, 16, 3, 3), "NCHW", 4),
}
# Algorithms whose kernels switch to 64-bit indices (index_type) or whose
# supports() refuses sizes they cannot index: what "auto" may pick here.
SIXTY_FOUR_BIT = {"direct", "gemm", "depthwise", "polyphase"}


@pytest.mark.parametrize("case", sorted(BIG))
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("direction", algos.DIRECTIONS)
def test_auto_picks_an_algorithm_that_indexes_past_int32(case, dtype, direction):
    x_shape, w_shape, layout, groups = BIG[case]
    p = _big(x_shape, w_shape, layout, dtype, groups)
    assert max(p.N * p.C * p.H * p.W, p.N * p.K * p.P * p.Q) > INT32_LIMIT
    name, why = dnnprims.conv2d_choose(x_shape, w_shape, padding=p.padding, groups=groups, layout=layout,
                                       dtype=dtype, direction=direction)
    assert name in SIXTY_FOUR_BIT, (name, why)
    assert algos.admits(algos.REGISTRY[name], p, direction)[0]


@pytest.mark.parametrize("name", ["implicit_gemm", "implicit_gemm_wgrad", "winograd_f2x2_3x3",
                                  "winograd_wgrad_f3x3_2x2"])
def test_32_bit_algorithms_refuse_big_problems_saying_why(name):
    p = _big((33, 64, 1024, 1024), (64, 64, 3, 3))
    algorithm = algos.REGISTRY[name]
    direction = algorithm.directions[-1]
    ok, why = algos.admits(algorithm, p, direction)
    assert not ok and why


def test_conv2d_output_shape_of_a_big_problem():
    assert dnnprims.conv2d_output_shape((33, 64, 1024, 1024), (64, 64, 3, 3), padding=1) == (33, 64, 1024, 1024)
    assert dnnprims.conv2d_output_shape((2**20, 1, 2**12, 2**12), (1, 1, 1, 1)) == (2**20, 1, 2**12, 2**12)


# The public functions' validation on arrays of more than 2^31 elements that
# occupy a few bytes (np.broadcast_to of one element): nothing is refused for
# size, and no check overflows.  The NumPy path would then compute, so each call
# is stopped right after validation by a bad later argument whose error must be
# the one raised (the size itself raised nothing).
HUGE = (2**16 + 1, 2**15)   # 2^31 + 2^15 elements


def _huge(shape=HUGE, dtype=np.float32):
    return np.broadcast_to(np.zeros((), dtype), shape)


@pytest.mark.parametrize("call, match", [
    (lambda x: dnnprims.softmax(x, axis=2), "axis"),
    (lambda x: dnnprims.log_softmax(x, axis=-3), "axis"),
    (lambda x: dnnprims.activation(x, "nope"), "mode"),
    (lambda x: dnnprims.reduce_tensor(x, axes=(5,)), "ax"),
    (lambda x: dnnprims.scale_tensor(x, "two"), "alpha"),
    (lambda x: dnnprims.add_tensor(x, np.zeros(3, np.float32)), "c"),
    (lambda x: dnnprims.layer_norm(x, (7,)), "normalized_shape"),
    (lambda x: dnnprims.rms_norm(x, (7,)), "normalized_shape"),
])
def test_validation_of_huge_arrays_raises_only_the_real_error(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call(_huge())


class Reached(Exception):
    """The call got past validation to the reference implementation."""


class _Stop:
    def __getattr__(self, name):
        def stop(*args, **kwargs):
            raise Reached(name)
        return stop


@pytest.fixture
def no_reference(monkeypatch):
    """Every public module's reference implementation replaced by one that
    raises Reached: a call that validates stops there, before computing."""
    from dnnprims import (activations, conv, normalization, pooling, recurrent, row_normalization,
                          softmaxes, tensor_ops)
    for module in (activations, conv, recurrent, softmaxes):
        monkeypatch.setattr(module, "_reference", _Stop())
    for module in (normalization, pooling, row_normalization, tensor_ops):
        monkeypatch.setattr(module, "reference", _Stop())


X4 = (2**15 + 1, 4, 128, 128)       # NCHW, 2^31 + 2^16 elements
B, I, H = 2**16 + 1, 2**15, 4        # a recurrent cell whose x has 2^31 + 2^15 elements


def _small(*shape):
    return np.zeros(shape, np.float32)


PUBLIC_CALLS = {
    "softmax": lambda: dnnprims.softmax(_huge()),
    "log_softmax": lambda: dnnprims.log_softmax(_huge(), axis=0),
    "softmax_backward": lambda: dnnprims.softmax_backward(_huge(), _huge()),
    "log_softmax_backward": lambda: dnnprims.log_softmax_backward(_huge(), _huge()),
    "activation": lambda: dnnprims.activation(_huge(), "gelu"),
    "activation_backward": lambda: dnnprims.activation_backward(_huge(), _huge(), "elu"),
    "bias_activation": lambda: dnnprims.bias_activation(_huge(X4), _small(4), "relu"),
    "bias_activation_backward": lambda: dnnprims.bias_activation_backward(_huge(X4), _huge(X4), _small(4), "relu"),
    "add_tensor": lambda: dnnprims.add_tensor(_huge(X4), _small(1, 4, 1, 1)),
    "scale_tensor": lambda: dnnprims.scale_tensor(_huge(), 2.0),
    "transform_layout": lambda: dnnprims.transform_layout(_huge(X4)),
    "reduce_tensor": lambda: dnnprims.reduce_tensor(_huge(X4), axes=(0, 2, 3)),
    "layer_norm": lambda: dnnprims.layer_norm(_huge(), (2**15,)),
    "layer_norm_backward": lambda: dnnprims.layer_norm_backward(_huge(), _huge(), (2**15,)),
    "rms_norm": lambda: dnnprims.rms_norm(_huge(), (2**15,)),
    "rms_norm_backward": lambda: dnnprims.rms_norm_backward(_huge(), _huge(), (2**15,)),
    "group_norm": lambda: dnnprims.group_norm(_huge(X4), 2),
    "group_norm_backward": lambda: dnnprims.group_norm_backward(_huge(X4), _huge(X4), 2),
    "instance_norm": lambda: dnnprims.instance_norm(_huge(X4)),
    "instance_norm_backward": lambda: dnnprims.instance_norm_backward(_huge(X4), _huge(X4)),
    "batchnorm": lambda: dnnprims.batchnorm(_huge(X4), _small(4), _small(4)),
    "batchnorm_backward": lambda: dnnprims.batchnorm_backward(_huge(X4), _huge(X4), _small(4)),
    "pool": lambda: dnnprims.pool(_huge(X4), 2),
    "pool_backward": lambda: dnnprims.pool_backward(_huge((2**15 + 1, 4, 64, 64)), _huge(X4), None, 2),
    "conv2d_forward": lambda: dnnprims.conv2d_forward(_huge(X4), _small(4, 4, 3, 3), padding=1),
    "conv2d_backward_data": lambda: dnnprims.conv2d_backward_data(_huge(X4), _small(4, 4, 3, 3), X4, padding=1),
    "conv2d_backward_filter": lambda: dnnprims.conv2d_backward_filter(_huge(X4), _huge(X4), (4, 4, 3, 3),
                                                                      padding=1),
    "conv2d_backward_bias": lambda: dnnprims.conv2d_backward_bias(_huge(X4)),
    "lstm_cell": lambda: dnnprims.lstm_cell(_huge((B, I)), _small(B, H), _small(B, H), _small(4 * H, I),
                                            _small(4 * H, H)),
    "lstm_cell_backward": lambda: dnnprims.lstm_cell_backward(_small(B, H), None, _huge((B, I)), _small(B, H),
                                                              _small(B, H), _small(4 * H, I), _small(4 * H, H)),
    "gru_cell": lambda: dnnprims.gru_cell(_huge((B, I)), _small(B, H), _small(3 * H, I), _small(3 * H, H)),
    "gru_cell_backward": lambda: dnnprims.gru_cell_backward(_small(B, H), _huge((B, I)), _small(B, H),
                                                            _small(3 * H, I), _small(3 * H, H)),
}


@pytest.mark.parametrize("name", sorted(PUBLIC_CALLS))
def test_every_public_function_accepts_more_than_2_31_elements(no_reference, name):
    # Nothing is refused for size (_validate.INT32_LIMIT: the kernels switch to
    # 64-bit indices); the validation gets through to the computation.
    with pytest.raises(Reached):
        PUBLIC_CALLS[name]()


def test_the_public_calls_cover_every_public_function():
    functions = {name for name in dnnprims.__all__ if callable(getattr(dnnprims, name))
                 and name[0].islower() and not name.startswith(("conv2d_output", "conv2d_choose", "release",
                                                                "set_"))}
    assert functions == set(PUBLIC_CALLS)
