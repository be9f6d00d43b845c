"""Batch normalization, forward (training and inference) and backward (PyTorch semantics).

NumPy arrays run ``dnnprims.reference.normalization``; CuPy arrays run
``kernels/batchnorm.cu``.  ``x`` is (N, C), (N, C, L), (N, C, H, W) or
(N, C, D, H, W) with ``layout="NCHW"`` (channel axis 1), or channel-last with
``layout="NHWC"``.  Parameters (gamma, beta, running statistics) have x's
dtype, or float32 when x is float16/bfloat16 (the cuDNN rule); the saved
``mean``/``invstd`` are in the accumulation dtype (float32 for half x).
"""
import numbers

import numpy as np

from . import _dtypes, _validate
from ._kernels import KernelFamily, ceil_div, index_type
from .reference import normalization as reference

LAYOUTS = ("NCHW", "NHWC")

# (storage type of x, storage type of the parameters)
_TYPE_PAIRS = (("half_t", "half_t"), ("half_t", "float"), ("bfloat16_t", "bfloat16_t"),
               ("bfloat16_t", "float"), ("float", "float"), ("double", "double"))
_KERNELS = ("batchnorm_statistics", "batchnorm_inference_statistics", "batchnorm_forward",
            "batchnorm_backward_reduce", "batchnorm_backward_data")

FAMILY = KernelFamily("batchnorm.cu", [
    f"{kernel}<{t}, {p}, {i}>" for kernel in _KERNELS for t, p in _TYPE_PAIRS
    for i in ("int", "long long")])

_BLOCK = 256
_MAX_BLOCKS = 8192


def _shape(x, layout):
    """(channels, outer, inner): x viewed as (outer, C, inner)."""
    _validate.check_layout(layout, LAYOUTS)
    _validate.check_float_dtype("x", x)
    if not 2 <= x.ndim <= 5:
        raise ValueError(f"x must be 2-D to 5-D ((N, C), (N, C, L), (N, C, H, W) or (N, C, D, H, W), "
                         f"channel-last for NHWC), got shape {tuple(x.shape)}")
    axis = reference.channel_axis(x.ndim, layout)
    channels = x.shape[axis]
    outer = int(np.prod(x.shape[:axis], dtype=np.int64))
    inner = int(np.prod(x.shape[axis + 1:], dtype=np.int64))
    return channels, outer, inner


def _param_dtype(x_dtype, **params):
    """The common dtype of the given parameters: x's, or float32 for half x."""
    dtype = _validate.check_same_dtype(**params)
    if dtype is None:
        return np.dtype(x_dtype)
    allowed = {np.dtype(x_dtype), _dtypes.accumulate_dtype(x_dtype)}
    if dtype not in allowed:
        names = ", ".join(n for n, a in params.items() if a is not None)
        raise TypeError(f"{names} must have dtype {' or '.join(sorted(str(d) for d in allowed))} "
                        f"for x of dtype {x_dtype}, got {dtype}")
    return dtype


def _check_vectors(channels, **vectors):
    for name, v in vectors.items():
        if v is not None:
            _validate.check_shape(name, v, (channels,), "one value per channel")


def _check_real(name, value, low, high=None):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    if not (value >= low and (high is None or value <= high)):
        bounds = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {bounds}, got {value!r}")
    return float(value)


def _check_pair(first, a, second, b):
    if (a is None) != (b is None):
        given, missing = (first, second) if a is not None else (second, first)
        raise ValueError(f"{given} was given without {missing}; pass both or neither")


def batchnorm(x, gamma, beta, running_mean=None, running_var=None, *, training=True, momentum=0.1,
              eps=1e-5, layout="NCHW", return_stats=False):
    """Batch normalization.  ``training=True`` normalizes with batch statistics and,
    when given, updates ``running_mean``/``running_var`` in place; ``training=False``
    uses them (then required).  ``return_stats=True`` returns ``(y, mean, invstd)``."""
    xp = _validate.array_module(x=x, gamma=gamma, beta=beta, running_mean=running_mean,
                                running_var=running_var)
    channels, outer, inner = _shape(x, layout)
    if not isinstance(training, (bool, np.bool_)):
        raise TypeError(f"training must be a bool, got {training!r}")
    momentum = _check_real("momentum", momentum, 0.0, 1.0)
    eps = _check_real("eps", eps, 0.0)
    pdtype = _param_dtype(x.dtype, gamma=gamma, beta=beta, running_mean=running_mean,
                          running_var=running_var)
    _check_vectors(channels, gamma=gamma, beta=beta, running_mean=running_mean,
                   running_var=running_var)
    _check_pair("running_mean", running_mean, "running_var", running_var)
    n = outer * inner
    if not training and running_mean is None:
        raise ValueError("running_mean and running_var are required when training=False")
    if training and n == 1:
        raise ValueError(f"x must have more than 1 value per channel when training, got shape "
                         f"{tuple(x.shape)}")
    if xp is np:
        y, mean, invstd = reference.batchnorm(x, gamma, beta, running_mean, running_var,
                                              bool(training), momentum, eps, layout)
    else:
        y, mean, invstd = _batchnorm_gpu(xp, x, gamma, beta, running_mean, running_var,
                                         bool(training), momentum, eps, pdtype, channels, outer,
                                         inner)
    return (y, mean, invstd) if return_stats else y


def batchnorm_backward(dy, x, gamma, *, eps=1e-5, mean=None, invstd=None, layout="NCHW"):
    """Training-mode gradients ``(dx, dgamma, dbeta)``.  ``mean``/``invstd`` are the
    saved statistics (``batchnorm(..., return_stats=True)``); None recomputes them
    from ``x``.  ``dy=None`` is a zero gradient.  dgamma/dbeta have gamma's dtype
    (x's when gamma is None)."""
    xp = _validate.array_module(dy=dy, x=x, gamma=gamma, mean=mean, invstd=invstd)
    channels, outer, inner = _shape(x, layout)
    eps = _check_real("eps", eps, 0.0)
    _validate.check_same_dtype(x=x, dy=dy)
    if dy is not None:
        _validate.check_shape("dy", dy, x.shape, "x's shape")
    pdtype = _param_dtype(x.dtype, gamma=gamma)
    _check_vectors(channels, gamma=gamma, mean=mean, invstd=invstd)
    _check_pair("mean", mean, "invstd", invstd)
    acc = _dtypes.accumulate_dtype(x.dtype)
    for name, v in (("mean", mean), ("invstd", invstd)):
        if v is not None and v.dtype != acc:
            raise TypeError(f"{name} must have dtype {acc} (the accumulation dtype of x's "
                            f"{x.dtype}), got {v.dtype}")
    if dy is None:
        return (xp.zeros(x.shape, x.dtype), xp.zeros(channels, pdtype), xp.zeros(channels, pdtype))
    if xp is np:
        return reference.batchnorm_backward(dy, x, gamma, mean, invstd, eps, layout, pdtype)
    return _batchnorm_backward_gpu(xp, dy, x, gamma, mean, invstd, eps, pdtype, channels, outer, inner)


# ---------------------------------------------------------------------- GPU path

def _scalar(acc):
    return np.float32 if acc == np.float32 else np.float64


def _spec(kernel, x_dtype, pdtype, index_t):
    return f"{kernel}<{_dtypes.cuda_type(x_dtype)}, {_dtypes.cuda_type(pdtype)}, {index_t}>"


def _elementwise_grid(total):
    blocks = min(ceil_div(total, _BLOCK), _MAX_BLOCKS)
    return blocks, blocks * _BLOCK


def _batchnorm_gpu(cp, x, gamma, beta, running_mean, running_var, training, momentum, eps, pdtype,
                   channels, outer, inner):
    acc = _dtypes.accumulate_dtype(x.dtype)
    real = _scalar(acc)
    y = cp.empty(x.shape, x.dtype)
    if x.size == 0:
        nan = cp.full(channels, np.nan, dtype=acc)
        return y, nan, nan.copy()
    x = _validate.contiguous(cp, x)
    blocks, threads = _elementwise_grid(x.size)
    index_t = index_type(x.size + max(threads, 1024))
    it = np.int32 if index_t == "int" else np.int64
    mean = cp.empty(channels, acc)
    invstd = cp.empty(channels, acc)
    if training:
        update = running_mean is not None
        rm = _validate.contiguous(cp, running_mean) if update else mean  # placeholder, unread
        rv = _validate.contiguous(cp, running_var) if update else invstd
        n = outer * inner
        FAMILY.launch(_spec("batchnorm_statistics", x.dtype, pdtype, index_t), (channels,), (_BLOCK,),
                      (x, mean, invstd, rm, rv, it(outer), it(channels), it(inner), real(eps),
                       real(momentum), real(n / (n - 1)), np.int32(update)))
        if update:  # the kernel updated contiguous copies: write them back
            if rm is not running_mean:
                running_mean[...] = rm
            if rv is not running_var:
                running_var[...] = rv
    else:
        rm = _validate.contiguous(cp, running_mean)
        rv = _validate.contiguous(cp, running_var)
        FAMILY.launch(_spec("batchnorm_inference_statistics", x.dtype, pdtype, index_t),
                      (ceil_div(channels, _BLOCK),), (_BLOCK,),
                      (rm, rv, mean, invstd, it(channels), real(eps)))
    gamma = cp.ones(channels, pdtype) if gamma is None else _validate.contiguous(cp, gamma)
    beta = cp.zeros(channels, pdtype) if beta is None else _validate.contiguous(cp, beta)
    FAMILY.launch(_spec("batchnorm_forward", x.dtype, pdtype, index_t), (blocks,), (_BLOCK,),
                  (x, y, mean, invstd, gamma, beta, it(x.size), it(channels), it(inner)))
    return y, mean, invstd


def _batchnorm_backward_gpu(cp, dy, x, gamma, mean, invstd, eps, pdtype, channels, outer, inner):
    acc = _dtypes.accumulate_dtype(x.dtype)
    dgamma = cp.zeros(channels, pdtype)
    dbeta = cp.zeros(channels, pdtype)
    dx = cp.empty(x.shape, x.dtype)
    if x.size == 0:
        return dx, dgamma, dbeta
    x = _validate.contiguous(cp, x)
    dy = _validate.contiguous(cp, dy)
    blocks, threads = _elementwise_grid(x.size)
    index_t = index_type(x.size + max(threads, 1024))
    it = np.int32 if index_t == "int" else np.int64
    if mean is None:
        mean = cp.empty(channels, acc)
        invstd = cp.empty(channels, acc)
        FAMILY.launch(_spec("batchnorm_statistics", x.dtype, pdtype, index_t), (channels,), (_BLOCK,),
                      (x, mean, invstd, mean, invstd, it(outer), it(channels), it(inner),
                       _scalar(acc)(eps), _scalar(acc)(0), _scalar(acc)(1), np.int32(0)))
    else:
        mean = _validate.contiguous(cp, mean)
        invstd = _validate.contiguous(cp, invstd)
    gamma = cp.ones(channels, pdtype) if gamma is None else _validate.contiguous(cp, gamma)
    sum_dy = cp.empty(channels, acc)
    sum_dy_xhat = cp.empty(channels, acc)
    FAMILY.launch(_spec("batchnorm_backward_reduce", x.dtype, pdtype, index_t), (channels,), (_BLOCK,),
                  (x, dy, mean, invstd, sum_dy, sum_dy_xhat, dgamma, dbeta, it(outer), it(channels),
                   it(inner)))
    FAMILY.launch(_spec("batchnorm_backward_data", x.dtype, pdtype, index_t), (blocks,), (_BLOCK,),
                  (x, dy, mean, invstd, gamma, sum_dy, sum_dy_xhat, dx, it(x.size), it(channels),
                   it(inner), _scalar(acc)(outer * inner)))
    return dx, dgamma, dbeta
