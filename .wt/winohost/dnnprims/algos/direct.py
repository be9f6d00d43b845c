"""The "direct" algorithm: kernels/conv_direct.cu, every option, every direction.

Supports every valid problem (any stride, padding, dilation, groups, layout and
dtype); no workspace.  It is the correctness baseline the faster algorithms are
compared with, and the fallback ``auto`` always has.  Also home of the bias
gradient kernel, which every algorithm shares.
"""
import numpy as np

from .. import _dtypes
from .._kernels import KernelFamily, ceil_div, index_type
from . import ConvAlgorithm, register

_KERNELS = ("conv_direct_forward", "conv_direct_backward_data", "conv_direct_backward_filter",
            "conv_direct_backward_bias")

FAMILY = KernelFamily("conv_direct.cu", [
    f"{kernel}<{t}, {i}, {nhwc}>"
    for kernel in _KERNELS
    for t in _dtypes.CUDA_TYPES
    for i in ("int", "long long")
    for nhwc in ("false", "true")
])

_THREADS = 256
# Elementwise kernels use grid-stride loops; this many blocks fill any GPU.
_MAX_BLOCKS = 65535 * 8
_REDUCTION_MAX_BLOCKS = 65535 * 4


def _expression(kernel, dtype, index_t, layout):
    return f"{kernel}<{_dtypes.cuda_type(dtype)}, {index_t}, {'true' if layout == 'NHWC' else 'false'}>"


def _problem_args(p):
    i32 = np.int32
    return (i32(p.C), i32(p.H), i32(p.W), i32(p.K), i32(p.R), i32(p.S), i32(p.P), i32(p.Q),
            i32(p.stride[0]), i32(p.stride[1]), i32(p.padding[0]), i32(p.padding[1]),
            i32(p.dilation[0]), i32(p.dilation[1]), i32(p.groups))


def _index_type(*sizes):
    # The largest tensor decides, with headroom for the grid-stride step: a loop
    # index may reach size - 1 + blocks * threads before the loop test fails.
    return index_type(*(size + _MAX_BLOCKS * _THREADS for size in sizes))


def _problem_index_type(p):
    return _index_type(p.N * p.C * p.H * p.W, p.N * p.K * p.P * p.Q, p.K * (p.C // p.groups) * p.R * p.S)


def _index_scalar(index_t, value):
    return np.int32(value) if index_t == "int" else np.int64(value)


class DirectConvolution(ConvAlgorithm):
    name = "direct"

    def run(self, problem, direction, a, b, out, bias=None, activation=None):
        p = problem
        index_t = _problem_index_type(p)
        total = out.size
        if total == 0:
            return out
        expr = _expression(f"conv_direct_{direction}", out.dtype, index_t, p.layout)
        if direction == "forward":
            blocks = min(ceil_div(total, _THREADS), _MAX_BLOCKS)
            args = (a, b, b if bias is None else bias, np.int32(bias is not None), out,
                    *_problem_args(p), _index_scalar(index_t, total))
        elif direction == "backward_data":
            blocks = min(ceil_div(total, _THREADS), _MAX_BLOCKS)
            args = (a, b, out, *_problem_args(p), _index_scalar(index_t, total))
        elif direction == "backward_filter":
            blocks = min(total, _REDUCTION_MAX_BLOCKS)
            args = (a, b, out, np.int32(p.N), *_problem_args(p), _index_scalar(index_t, total))
        else:
            raise ValueError(f"unknown direction {direction!r}")
        FAMILY.launch(expr, (blocks,), (_THREADS,), args)
        return out


def backward_bias(dy, out, layout):
    """db[k] = sum of dy over n, p, q (one block per k, deterministic)."""
    if out.size == 0:
        return out
    if layout == "NCHW":
        N, K, P, Q = dy.shape
    else:
        N, P, Q, K = dy.shape
    expr = _expression("conv_direct_backward_bias", dy.dtype, _index_type(dy.size), layout)
    FAMILY.launch(expr, (min(K, _REDUCTION_MAX_BLOCKS),), (_THREADS,),
                  (dy, out, np.int32(N), np.int32(K), np.int32(P), np.int32(Q)))
    return out


DIRECT = register(DirectConvolution())
