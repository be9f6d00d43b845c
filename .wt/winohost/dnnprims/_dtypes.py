"""The one place where dtype rules live.

Storage dtypes are float16, bfloat16 (when ``ml_dtypes`` provides it), float32
and float64.  Half-precision types accumulate in float32, the others in
themselves -- the cuDNN / PyTorch rule.
"""
import numpy as np

try:  # bfloat16 has no NumPy dtype of its own; ml_dtypes supplies one.
    import ml_dtypes as _ml_dtypes

    BFLOAT16 = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    BFLOAT16 = None

FLOAT16 = np.dtype(np.float16)
FLOAT32 = np.dtype(np.float32)
FLOAT64 = np.dtype(np.float64)

SUPPORTED = tuple(d for d in (FLOAT16, BFLOAT16, FLOAT32, FLOAT64) if d is not None)

# Name of each dtype's storage type in kernels/common.cuh.
_CUDA_NAMES = {FLOAT16: "half_t", FLOAT32: "float", FLOAT64: "double"}
if BFLOAT16 is not None:
    _CUDA_NAMES[BFLOAT16] = "bfloat16_t"

# The CUDA storage types every kernel family is specialised for.
CUDA_TYPES = ("half_t", "bfloat16_t", "float", "double")


def is_half(dtype):
    dtype = np.dtype(dtype)
    return dtype == FLOAT16 or (BFLOAT16 is not None and dtype == BFLOAT16)


def accumulate_dtype(dtype):
    """The dtype arithmetic is carried out in for a given storage dtype."""
    return FLOAT32 if is_half(dtype) else np.dtype(dtype)


def cuda_type(dtype):
    """The C++ storage type name used in kernel name expressions."""
    return _CUDA_NAMES[np.dtype(dtype)]


def supported_names():
    return ", ".join(str(d) for d in SUPPORTED)
