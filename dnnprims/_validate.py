"""Argument checking shared by every primitive.

Every public function validates here, before any kernel runs.  Messages name the
argument and say what was expected.  Errors about the kind of a value are
``TypeError``; errors about its shape or range are ``ValueError``.
"""
import numbers

import numpy as np

from . import _dtypes

try:
    import cupy as _cupy
except ImportError:  # CPU-only install
    _cupy = None

# Index arithmetic in the kernels is 32-bit only where every tensor the
# kernel touches is smaller than this; larger tensors switch to the 64-bit
# specialisation (see kernels/common.cuh).  Nothing is refused for size.
INT32_LIMIT = 2**31 - 1


# The fast paths' cheap checks: the exact array type and the current device.
NDARRAY = _cupy.ndarray if _cupy is not None else None
current_device = _cupy.cuda.runtime.getDevice if _cupy is not None else None


def is_cupy_array(a):
    return _cupy is not None and isinstance(a, _cupy.ndarray)


def array_module(**arrays):
    """Check that every named array (None entries skipped) is a NumPy or CuPy
    array, that they are not mixed, and that CuPy arrays share one device.
    Returns ``numpy`` or ``cupy``."""
    kinds = {}
    device = None
    device_name = None
    for name, a in arrays.items():
        if a is None:
            continue
        if is_cupy_array(a):
            kinds[name] = "cupy"
            dev = a.data.device_id
            if device is None:
                device, device_name = dev, name
            elif dev != device:
                raise ValueError(
                    f"{name} is on GPU {dev} but {device_name} is on GPU {device}; "
                    "all arrays must be on the same device")
        elif isinstance(a, np.ndarray):
            kinds[name] = "numpy"
        else:
            raise TypeError(
                f"{name} must be a numpy.ndarray or cupy.ndarray, got {type(a).__name__}")
    if len(set(kinds.values())) > 1:
        np_names = [n for n, k in kinds.items() if k == "numpy"]
        cp_names = [n for n, k in kinds.items() if k == "cupy"]
        raise TypeError(
            f"cannot mix NumPy and CuPy arrays: {', '.join(np_names)} "
            f"{'is' if len(np_names) == 1 else 'are'} NumPy but {', '.join(cp_names)} "
            f"{'is' if len(cp_names) == 1 else 'are'} CuPy")
    if "cupy" in kinds.values():
        current = _cupy.cuda.runtime.getDevice()
        if device != current:
            raise ValueError(
                f"{device_name} is on GPU {device} but the current device is "
                f"GPU {current}; call inside `with cupy.cuda.Device({device}):`")
        return _cupy
    return np


def check_float_dtype(name, a):
    if a is None:  # array_module skips None (an optional argument's "absent"); here it is required
        raise TypeError(f"{name} must be a numpy.ndarray or cupy.ndarray, got None")
    if a.dtype not in _dtypes.SUPPORTED:
        raise TypeError(
            f"{name} must have a floating dtype ({_dtypes.supported_names()}), got {a.dtype}")


def check_same_dtype(**arrays):
    """All named arrays (None skipped) have one supported floating dtype; returns it."""
    dtype = None
    first = None
    for name, a in arrays.items():
        if a is None:
            continue
        check_float_dtype(name, a)
        if dtype is None:
            dtype, first = a.dtype, name
        elif a.dtype != dtype:
            raise TypeError(f"{name} has dtype {a.dtype} but {first} has dtype {dtype}; "
                            "they must match")
    return dtype


def check_ndim(name, a, ndim, what=None):
    if a is None:  # a required array (optional ones are checked only when given)
        raise TypeError(f"{name} must be a numpy.ndarray or cupy.ndarray, got None")
    if a.ndim != ndim:
        desc = f" ({what})" if what else ""
        raise ValueError(f"{name} must be {ndim}-D{desc}, got shape {tuple(a.shape)}")


def check_shape(name, a, shape, what=None):
    if tuple(a.shape) != tuple(shape):
        desc = f" ({what})" if what else ""
        raise ValueError(f"{name} must have shape {tuple(shape)}{desc}, got {tuple(a.shape)}")


def int_pair(name, value, minimum):
    """An int or a pair of ints, each >= minimum, as a tuple of two ints."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        pair = (int(value), int(value))
    else:
        try:
            pair = tuple(value)
        except TypeError:
            raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}") from None
        if len(pair) != 2 or not all(
                isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in pair):
            raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")
        pair = (int(pair[0]), int(pair[1]))
    if min(pair) < minimum:
        what = "positive" if minimum == 1 else f">= {minimum}"
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return pair


def check_layout(layout, allowed=("NCHW", "NHWC")):
    if layout not in allowed:
        raise ValueError(f"layout must be one of {', '.join(map(repr, allowed))}, got {layout!r}")
    return layout


def check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def real_number(name, value, low, high=None):
    """A real number (not a bool) in [low, high] (no upper bound when None), as float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    if not (value >= low and (high is None or value <= high)):
        bounds = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {bounds}, got {value!r}")
    return float(value)


def check_bool(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def check_writeable(**arrays):
    """Arrays a call updates in place (running statistics): a read-only NumPy
    array is refused before anything is written, so that a failed call never
    leaves one statistic updated and the other not (CuPy arrays are always
    writeable)."""
    for name, a in arrays.items():
        if a is not None and not getattr(a.flags, "writeable", True):
            raise ValueError(f"{name} is read-only, but this call updates it in place")


def check_pair(first, a, second, b):
    """Two optional arguments that only make sense together: both or neither."""
    if (a is None) != (b is None):
        given, missing = (first, second) if a is not None else (second, first)
        raise ValueError(f"{given} was given without {missing}; pass both or neither")


def parameter_dtype(x_dtype, **params):
    """The common dtype of a normalization's parameters (None entries skipped):
    x's, or float32 for half x (the cuDNN rule); x's dtype when none is given."""
    dtype = check_same_dtype(**params)
    if dtype is None:
        return np.dtype(x_dtype)
    allowed = {np.dtype(x_dtype), _dtypes.accumulate_dtype(x_dtype)}
    if dtype not in allowed:
        names = ", ".join(n for n, a in params.items() if a is not None)
        raise TypeError(f"{names} must have dtype {' or '.join(sorted(str(d) for d in allowed))} "
                        f"for x of dtype {x_dtype}, got {dtype}")
    return dtype


def contiguous(xp, a):
    """A C-contiguous view or copy of the same shape: kernels index with plain
    row-major strides.  (cupy.ascontiguousarray turns a 0-d array into 1-d.)"""
    if a.flags.c_contiguous:
        return a
    return xp.ascontiguousarray(a).reshape(a.shape)


def exact(value):
    """A hashable stand-in for an option that equals another only when the
    values and their exact types do (``True``, ``1.0`` and ``1`` are equal
    and hash alike in Python, but validation treats them differently); for a
    tuple, its elements' types too.  Raises TypeError when unhashable."""
    t = type(value)
    hash(value)
    if t is tuple:
        return (t, value, tuple(map(type, value)))
    return (t, value)


class CallMemo:
    """What the slow path of a public function worked out for one kind of GPU
    call (validated problem, chosen algorithm, launch plan), keyed by everything
    that validation depends on, so that a repeated call skips straight to the
    launch: the per-call host overhead on a cached problem is a key, one dict
    lookup, the output allocation and the launch.

    :meth:`key` returns None (no memo: take the slow path) unless every array
    is a CuPy array; it records each array's shape, dtype and device and the
    current device, and each option's exact type and value (so ``True`` never
    passes for a cached ``1``, nor ``(1.0, 1.0)`` for ``(1, 1)``).  An
    unhashable option (a list) also gives no memo.

    ``fast`` is the flat table of a function's fast path: a cheap key of the
    commonest calls (C-contiguous, 16-byte-aligned CuPy arrays; options with
    their types where types matter), built inline by the function itself and
    checked before anything else, mapping straight to a prepared launch
    (see ``_kernels.PreparedLaunch``).  An entry is made by the slow path after
    the call validated, so a call that differs in anything validated misses
    and is validated (and refused) as before.  :meth:`clear` empties both."""

    def __init__(self, limit=4096):
        self._entries = {}
        self._limit = limit
        self.fast = {}

    @staticmethod
    def key(tag, arrays, options):
        if _cupy is None:
            return None
        parts = [tag, None]
        ndarray = _cupy.ndarray
        arrays_given = False
        for a in arrays:
            if a is None:
                parts.append(None)
            elif type(a) is ndarray:
                parts.append((a.shape, a.dtype, a.data.device_id))
                arrays_given = True
            else:
                return None
        if not arrays_given:
            return None
        parts[1] = _cupy.cuda.runtime.getDevice()
        try:
            for v in options:
                parts.append(exact(v))
        except TypeError:
            return None
        return tuple(parts)

    def get(self, key):
        return None if key is None else self._entries.get(key)

    def put(self, key, value):
        if key is not None:
            if len(self._entries) >= self._limit:
                self._entries.clear()
            self._entries[key] = value
        return value

    def put_fast(self, key, value):
        """Record a fast-path entry (the table is emptied when full)."""
        if len(self.fast) >= self._limit:
            self.fast.clear()
        self.fast[key] = value
        return value

    def clear(self):
        self._entries.clear()
        self.fast.clear()
