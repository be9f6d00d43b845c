"""cuDNN's tensor operations (cudnnAddTensor, cudnnScaleTensor,
cudnnTransformTensor for NCHW <-> NHWC, cudnnReduceTensor).

NumPy arrays run ``dnnprims.reference.tensor_ops``; CuPy arrays run
``kernels/tensor_ops.cu``.  Every function returns a new array of x's dtype;
half types compute and accumulate in float32.
"""
import numbers

import numpy as np

from . import _dtypes, _validate
from ._kernels import KernelFamily, ceil_div, index_type
from .reference import tensor_ops as reference

LAYOUTS = ("NCHW", "NHWC")
REDUCE_OPS = ("sum", "mean", "max", "min", "amax", "norm1", "norm2")
# op -> (map, combine, finish) codes of kernels/tensor_ops.cu
_REDUCE_CODES = {"sum": (0, 0, 0), "mean": (0, 0, 1), "max": (0, 1, 0), "min": (0, 2, 0),
                 "amax": (1, 1, 0), "norm1": (1, 0, 0), "norm2": (2, 0, 2)}

_TYPES = ("half_t", "bfloat16_t", "float", "double")
_INDEX_TYPES = ("int", "long long")
_VECTOR = {"half_t": 8, "bfloat16_t": 8, "float": 4, "double": 2}
_ACC = {"half_t": "float", "bfloat16_t": "float", "float": "float", "double": "double"}
# (input, output) type pairs of the reductions: one stage, partials in A, partials -> T.
_REDUCE_PAIRS = sorted({(t, t) for t in _TYPES} | {(t, _ACC[t]) for t in _TYPES} |
                       {(_ACC[t], t) for t in _TYPES})

FAMILY = KernelFamily("tensor_ops.cu", [
    *(f"scale_add<{t}, {i}, {v}, {c}>" for t in _TYPES for i in _INDEX_TYPES
      for v in sorted({1, _VECTOR[t]}) for c in ("false", "true")),
    *(f"transpose_batched<{t}, {i}>" for t in _TYPES for i in _INDEX_TYPES),
    *(f"reduce_{k}<{a}, {b}, {i}>" for k in ("rows", "columns") for a, b in _REDUCE_PAIRS
      for i in _INDEX_TYPES),
    *(f"reduce_planes<{t}, {t}, {i}, {v}>" for t in _TYPES for i in _INDEX_TYPES
      for v in sorted({1, _VECTOR[t]})),
])

_BLOCK = 256
_UNROLL = 4  # TENSOR_UNROLL
_TARGET_BLOCKS = 132 * 8    # rows reduction: enough blocks to fill the GPU
_TARGET_THREADS = 132 * 2048  # columns reduction
# (R1, O, R2) reductions (NCHW over (0, 2, 3)) with at least this many outputs run
# reduce_planes: one launch, a block per output, no partials; fewer outputs take
# the rows + columns stages, which split the work over more blocks.
PLANES_MIN_OUTPUTS = 128
# Validated reduce_planes calls: (kept shape, R1, O, R2, step) per kind of call.
_MEMO = _validate.CallMemo()


def _check_real(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    return float(value)


def _scalar(dtype):
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32


# ---------------------------------------------------------------------- add and scale

def add_tensor(a, c, alpha=1.0, beta=1.0):
    """``alpha * a + beta * c`` with c broadcast to a's shape (NumPy rules; e.g. a
    bias (1, C, 1, 1) against (N, C, H, W)); the result has a's shape and dtype."""
    xp = _validate.array_module(a=a, c=c)
    _validate.check_float_dtype("a", a)
    _validate.check_float_dtype("c", c)
    _validate.check_same_dtype(a=a, c=c)
    alpha, beta = _check_real("alpha", alpha), _check_real("beta", beta)
    if c.ndim > a.ndim or any(cd not in (1, ad) for cd, ad in zip(c.shape[::-1], a.shape[::-1])):
        raise ValueError(f"c must broadcast to a's shape {tuple(a.shape)}, got {tuple(c.shape)}")
    if xp is np:
        return reference.add_tensor(a, c, alpha, beta)
    return _scale_add_gpu(xp, a, c, alpha, beta)


def scale_tensor(x, alpha):
    """``alpha * x``."""
    xp = _validate.array_module(x=x)
    _validate.check_float_dtype("x", x)
    alpha = _check_real("alpha", alpha)
    if xp is np:
        return reference.scale_tensor(x, alpha)
    return _scale_add_gpu(xp, x, None, alpha, 0.0)


def _collapse_broadcast(shape, c_shape):
    """a's shape and c's element strides (0 on broadcast axes), size-1 axes dropped
    and neighbours merged where c is contiguous across them or broadcast on both."""
    c_shape = (1,) * (len(shape) - len(c_shape)) + tuple(c_shape)
    strides, s = [], 1
    for d in reversed(c_shape):
        strides.append(s if d != 1 else 0)
        s *= d
    strides = strides[::-1]
    dims = [(d, st) for d, st in zip(shape, strides) if d != 1]
    merged = []
    for d, st in dims:
        if merged:
            pd, pst = merged[-1]
            if (pst == 0 and st == 0) or (st != 0 and pst == st * d):
                merged[-1] = (pd * d, st)
                continue
        merged.append((d, st))
    return merged or [(1, 0)]


def _scale_add_gpu(cp, a, c, alpha, beta):
    a = _validate.contiguous(cp, a)
    out = cp.empty(a.shape, a.dtype)
    if a.size == 0:
        return out
    t = _dtypes.cuda_type(a.dtype)
    if c is not None:
        c = _validate.contiguous(cp, c)
        dims = _collapse_broadcast(a.shape, c.shape)
        if len(dims) > 4:  # an unusual broadcast pattern: materialise c
            c = cp.ascontiguousarray(cp.broadcast_to(c, a.shape))
            dims = [(a.size, 1)]
    else:
        dims = [(a.size, 0)]
    dims = [(1, 0)] * (4 - len(dims)) + dims
    vec = _VECTOR[t]
    aligned = all(v.data.ptr % 16 == 0 for v in (a, out))
    vec = vec if dims[3][0] % vec == 0 and aligned else 1
    vectors = a.size // vec
    it = np.int32 if index_type(a.size + _UNROLL * _BLOCK * vec) == "int" else np.int64
    index_t = "int" if it is np.int32 else "long long"
    has_c = "true" if c is not None else "false"
    real = _scalar(_dtypes.accumulate_dtype(a.dtype))
    FAMILY.launch(f"scale_add<{t}, {index_t}, {vec}, {has_c}>", (ceil_div(vectors, _UNROLL * _BLOCK),),
                  (_BLOCK,), (a, a if c is None else c, out, it(vectors), it(dims[1][0]), it(dims[2][0]),
                              it(dims[3][0]), *(it(st) for _, st in dims), real(alpha), real(beta)))
    return out


# ---------------------------------------------------------------------- layout transform

def transform_layout(x, src="NCHW", dst="NHWC"):
    """Move the channel axis: NCHW -> NHWC (axis 1 to last) or NHWC -> NCHW, for
    3-D to 5-D x; the result is C-contiguous (a copy even when src == dst)."""
    xp = _validate.array_module(x=x)
    _validate.check_float_dtype("x", x)
    _validate.check_choice("src", src, LAYOUTS)
    _validate.check_choice("dst", dst, LAYOUTS)
    if not 3 <= x.ndim <= 5:
        raise ValueError(f"x must be 3-D to 5-D, got shape {tuple(x.shape)}")
    if xp is np:
        return reference.transform_layout(x, src, dst)
    if src == dst:
        return x.copy()
    x = _validate.contiguous(xp, x)
    n = x.shape[0]
    if src == "NCHW":
        channels, spatial = x.shape[1], x.size // max(1, n * x.shape[1])
        out_shape = (n, *x.shape[2:], channels)
        rows, cols = channels, spatial
    else:
        channels, spatial = x.shape[-1], x.size // max(1, n * x.shape[-1])
        out_shape = (n, channels, *x.shape[1:-1])
        rows, cols = spatial, channels
    out = xp.empty(out_shape, x.dtype)
    if x.size == 0:
        return out
    tiles_r, tiles_c = ceil_div(rows, 32), ceil_div(cols, 32)
    index_t = index_type(x.size + 32 * cols, n * tiles_r * tiles_c)
    it = np.int32 if index_t == "int" else np.int64
    FAMILY.launch(f"transpose_batched<{_dtypes.cuda_type(x.dtype)}, {index_t}>", (n * tiles_r * tiles_c,),
                  (32, 8), (x, out, it(rows), it(cols), it(tiles_r), it(tiles_c)))
    return out


# ---------------------------------------------------------------------- reduction

def _normalize_axes(axes, ndim):
    if axes is None:
        return tuple(range(ndim))
    if isinstance(axes, (int, np.integer)) and not isinstance(axes, bool):
        axes = (axes,)
    try:
        axes = tuple(axes)
    except TypeError:
        raise TypeError(f"axes must be None, an int or a tuple of ints, got {axes!r}") from None
    out = []
    for a in axes:
        if isinstance(a, bool) or not isinstance(a, (int, np.integer)):
            raise TypeError(f"axes must be None, an int or a tuple of ints, got {axes!r}")
        if not -ndim <= a < ndim:
            raise ValueError(f"axes entry {a} is out of range for x with {ndim} dimensions")
        out.append(int(a) % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"axes must not repeat an axis, got {axes!r}")
    return tuple(sorted(out))


def reduce_tensor(x, axes=None, op="sum", keepdims=False):
    """Reduce over ``axes`` (None: all) with ``op`` in sum, mean, max, min, amax
    (max |x|), norm1 (sum |x|), norm2 (sqrt(sum x^2)); result in x's dtype,
    accumulated in float32 for half x."""
    key = _MEMO.key("reduce", (x,), (axes, op, keepdims))
    plan = _MEMO.get(key)
    if plan is not None:  # validated before: straight to the one launch
        return _reduce_planes(_validate._cupy, x, *plan)
    xp = _validate.array_module(x=x)
    _validate.check_float_dtype("x", x)
    _validate.check_choice("op", op, REDUCE_OPS)
    if not isinstance(keepdims, (bool, np.bool_)):
        raise TypeError(f"keepdims must be a bool, got {keepdims!r}")
    axes = _normalize_axes(axes, x.ndim)
    count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    if count == 0 and op in ("max", "min", "amax"):
        raise ValueError(f"x has a zero-size reduction over axes {axes}; op {op!r} has no identity")
    if xp is np:
        return reference.reduce_tensor(x, axes, op, keepdims)
    plan = _planes_plan(x, axes, op, keepdims, count)
    if plan is not None:
        return _reduce_planes(xp, x, *_MEMO.put(key, plan))
    return _reduce_gpu(xp, x, axes, op, keepdims, count)


def _kept_shape(shape, axes, keepdims):
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _planes_plan(x, axes, op, keepdims, count):
    """(kept shape, R1, O, R2, step) when x reduces as (R1, O, R2) with at least
    PLANES_MIN_OUTPUTS outputs and something to reduce, else None."""
    if x.size == 0 or count == 0:
        return None
    dims = _collapse_reduction(x.shape, axes)
    if tuple(red for _, red in dims) != (True, False, True) or dims[1][0] < PLANES_MIN_OUTPUTS:
        return None
    map_, combine, finish = _REDUCE_CODES[op]
    (r1, _), (o, _), (r2, _) = dims
    return _kept_shape(x.shape, axes, keepdims), r1, o, r2, (map_, combine, finish, 1.0 / count)


def _reduce_planes(cp, x, kept_shape, r1, o, r2, step):
    x = _validate.contiguous(cp, x)
    t = _dtypes.cuda_type(x.dtype)
    vec = _VECTOR[t] if r2 % _VECTOR[t] == 0 and x.data.ptr % 16 == 0 else 1
    vectors = r1 * r2 // vec
    block = int(min(1024, max(64, 1 << max(0, (ceil_div(vectors, 8) - 1).bit_length()))))
    index_t = index_type(x.size + _UNROLL * block * vec)
    it = np.int32 if index_t == "int" else np.int64
    map_, combine, finish, scale = _codes(step)
    out = cp.empty(kept_shape, x.dtype)
    FAMILY.launch(f"reduce_planes<{t}, {t}, {index_t}, {vec}>", (o,), (block,),
                  (x, out, it(r1), it(o), it(r2), map_, combine, finish,
                   _scalar(_dtypes.accumulate_dtype(x.dtype))(scale)))
    return out


def _collapse_reduction(shape, axes):
    """[(size, reduced)] with size-1 axes dropped and neighbours of one kind merged."""
    merged = []
    for i, d in enumerate(shape):
        if d == 1:
            continue
        red = i in axes
        if merged and merged[-1][1] == red:
            merged[-1] = (merged[-1][0] * d, red)
        else:
            merged.append((d, red))
    return merged


def _reduce_gpu(cp, x, axes, op, keepdims, count):
    kept_shape = _kept_shape(x.shape, axes, keepdims)
    out_size = int(np.prod(kept_shape, dtype=np.int64))
    if out_size == 0:
        return cp.empty(kept_shape, x.dtype)
    if count == 0:
        return cp.full(kept_shape, np.nan if op == "mean" else 0, x.dtype)
    x = _validate.contiguous(cp, x)
    dims = _collapse_reduction(x.shape, axes)
    if not any(red for _, red in dims):  # nothing to reduce (only size-1 axes)
        dims = [(out_size, False), (1, True)]
    map_, combine, finish = _REDUCE_CODES[op]
    step = (map_, combine, finish, 1.0 / count)
    acc = _dtypes.accumulate_dtype(x.dtype)
    kinds = tuple(red for _, red in dims)
    if kinds == (True, False, True):
        # (R1, O, R2), e.g. NCHW over (0, 2, 3): rows over R2 into partials (R1, O) in A,
        # then columns over R1 -- x is read once.
        (r1, _), (o, _), (r2, _) = dims
        part = _reduce_rows(cp, x, r1 * o, r2, (map_, combine, 0, 1.0), acc)
        out = _reduce_columns(cp, part, 1, r1, o, (0, combine, finish, 1.0 / count), x.dtype)
    elif kinds in ((True,), (False, True)):  # (R) or (O, R): rows
        out = _reduce_rows(cp, x, dims[0][0] if len(dims) == 2 else 1, count, step, x.dtype)
    elif kinds in ((True, False), (False, True, False)):  # (R, O2) or (O1, R, O2): columns
        o1 = dims[0][0] if len(dims) == 3 else 1
        out = _reduce_columns(cp, x, o1, count, dims[-1][0], step, x.dtype)
    else:
        # More reduced runs: bring the reduced axes last (one copy), then rows.
        kept = [i for i in range(x.ndim) if i not in axes]
        x = cp.ascontiguousarray(x.transpose(kept + list(axes)))
        out = _reduce_rows(cp, x, out_size, count, step, x.dtype)
    return out.reshape(kept_shape)


def _codes(step):
    map_, combine, finish, scale = step
    return np.int32(map_), np.int32(combine), np.int32(finish), scale


def _reduce_rows(cp, x, outputs, R, step, out_dtype):
    """(outputs,) of out_dtype from x viewed as (outputs, R); R split over blocks when
    there are few outputs (partials in A, then a second launch)."""
    t, tout = _dtypes.cuda_type(x.dtype), _dtypes.cuda_type(out_dtype)
    map_, combine, finish, scale = _codes(step)
    real = _scalar(_dtypes.accumulate_dtype(x.dtype))
    splits = max(1, min(ceil_div(_TARGET_BLOCKS, outputs), ceil_div(R, 8 * _UNROLL * _BLOCK)))
    per_split = ceil_div(R, splits)
    splits = ceil_div(R, per_split)
    index_t = index_type(x.size + _UNROLL * _BLOCK, outputs * splits)
    it = np.int32 if index_t == "int" else np.int64
    if splits == 1:
        out = cp.empty(outputs, out_dtype)
        FAMILY.launch(f"reduce_rows<{t}, {tout}, {index_t}>", (outputs,), (_BLOCK,),
                      (x, out, it(R), it(per_split), map_, combine, finish, real(scale)))
        return out
    acc = _dtypes.accumulate_dtype(x.dtype)
    part = cp.empty(outputs * splits, acc)
    FAMILY.launch(f"reduce_rows<{t}, {_ACC[t]}, {index_t}>", (outputs * splits,), (_BLOCK,),
                  (x, part, it(R), it(per_split), map_, combine, np.int32(0), real(1.0)))
    return _reduce_rows(cp, part, outputs, splits, (0, int(combine), int(finish), scale), out_dtype)


def _reduce_columns(cp, x, O1, R, O2, step, out_dtype):
    """(O1 * O2,) of out_dtype from x viewed as (O1, R, O2); R split when there are
    few columns (partials (splits, O1, O2) in A, then one column launch over splits)."""
    t, tout = _dtypes.cuda_type(x.dtype), _dtypes.cuda_type(out_dtype)
    map_, combine, finish, scale = _codes(step)
    real = _scalar(_dtypes.accumulate_dtype(x.dtype))
    splits = max(1, min(ceil_div(_TARGET_THREADS, O1 * O2), ceil_div(R, 16)))
    per_split = ceil_div(R, splits)
    splits = ceil_div(R, per_split)
    index_t = index_type(x.size + _UNROLL * O2, splits * O1 * O2)
    it = np.int32 if index_t == "int" else np.int64
    tiles = ceil_div(O2, _BLOCK)
    if splits == 1:
        out = cp.empty(O1 * O2, out_dtype)
        FAMILY.launch(f"reduce_columns<{t}, {tout}, {index_t}>", (tiles * O1,), (_BLOCK,),
                      (x, out, it(O1), it(R), it(O2), it(per_split), map_, combine, finish, real(scale)))
        return out
    acc = _dtypes.accumulate_dtype(x.dtype)
    part = cp.empty(splits * O1 * O2, acc)
    FAMILY.launch(f"reduce_columns<{t}, {_ACC[t]}, {index_t}>", (tiles * O1 * splits,), (_BLOCK,),
                  (x, part, it(O1), it(R), it(O2), it(per_split), map_, combine, np.int32(0), real(1.0)))
    return _reduce_columns(cp, part, 1, splits, O1 * O2, (0, int(combine), int(finish), scale), out_dtype)
