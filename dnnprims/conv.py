"""2-D convolution: forward, backward data, backward filter, backward bias.

Semantics are PyTorch's ``conv2d`` (cross-correlation).  Filters are always
(K, C/groups, R, S); ``layout`` says how x, y, dx and dy are stored: "NCHW" or
"NHWC" (an NHWC x has shape (N, H, W, C)).  ``stride``, ``padding`` and
``dilation`` take an int or a pair.

Every call: normalise and validate the arguments, describe the problem as a
:class:`ConvProblem`, choose an algorithm from the registry (``algo="auto"`` or
a name, see :mod:`dnnprims.algos`), then run the NumPy reference (NumPy input)
or the algorithm (CuPy input).  The algorithm is chosen, and an unsupported one
refused, on both paths, so both raise the same errors.
"""
import numpy as np

from . import _kernels, _validate
from ._dtypes import FLOAT64
from .algos import CHOICE_HOLDERS, DIRECTIONS, PRECISIONS, ConvOptions, ConvProblem, choose, explain_auto
from .algos.direct import backward_bias as _backward_bias_kernel
from .reference import conv as _reference

__all__ = ["conv2d_forward", "conv2d_backward_data", "conv2d_backward_filter",
           "conv2d_backward_bias", "conv2d_output_shape", "conv2d_choose", "ConvProblem",
           "ConvOptions"]


def _options(workspace_limit, precision, deterministic):
    """Validate the caller's algorithm constraints into a ConvOptions."""
    if workspace_limit is not None:
        if isinstance(workspace_limit, bool) or not isinstance(workspace_limit, (int, np.integer)):
            raise TypeError(f"workspace_limit must be an int (bytes) or None, got {workspace_limit!r}")
        if workspace_limit < 0:
            raise ValueError(f"workspace_limit must be >= 0 bytes, got {workspace_limit}")
        workspace_limit = int(workspace_limit)
    _validate.check_choice("precision", precision, PRECISIONS)
    if not isinstance(deterministic, (bool, np.bool_)):
        raise TypeError(f"deterministic must be a bool, got {deterministic!r}")
    return ConvOptions(workspace_limit, precision, bool(deterministic))


def _activation_options(activation, alpha):
    """None, or (mode, alpha) with alpha resolved to the mode's default."""
    from .activations import _check_options
    if activation is None:
        if alpha is not None:
            raise ValueError("alpha was given without activation")
        return None
    return activation, _check_options(activation, alpha, "none")


def _shape_tuple(name, shape):
    try:
        shape = tuple(shape)
    except TypeError:
        raise TypeError(f"{name} must be a tuple of 4 ints, got {shape!r}") from None
    if len(shape) != 4 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                  for v in shape):
        raise TypeError(f"{name} must be a tuple of 4 ints, got {shape!r}")
    shape = tuple(int(v) for v in shape)
    if min(shape) < 0:
        raise ValueError(f"{name} must not have negative sizes, got {shape}")
    return shape


def _describe(x_shape, w_shape, stride, padding, dilation, groups, layout, dtype,
              x_name="x", w_name="w"):
    """Validate the geometry of a convolution and return its ConvProblem."""
    _validate.check_layout(layout)
    stride = _validate.int_pair("stride", stride, 1)
    padding = _validate.int_pair("padding", padding, 0)
    dilation = _validate.int_pair("dilation", dilation, 1)
    if not isinstance(groups, (int, np.integer)) or isinstance(groups, bool):
        raise TypeError(f"groups must be an int, got {groups!r}")
    groups = int(groups)
    if groups < 1:
        raise ValueError(f"groups must be positive, got {groups}")
    if layout == "NCHW":
        N, C, H, W = x_shape
    else:
        N, H, W, C = x_shape
    K, Cg, R, S = w_shape
    if C % groups:
        raise ValueError(f"{x_name} has {C} channels, which groups={groups} does not divide")
    if K % groups:
        raise ValueError(f"{w_name} has {K} filters (shape[0]), which groups={groups} does not divide")
    if Cg * groups != C:
        raise ValueError(f"{w_name} must have shape[1] == channels / groups = {C} / {groups} = "
                         f"{C // groups}, got {w_name} shape {tuple(w_shape)}")
    if R < 1 or S < 1:
        raise ValueError(f"{w_name} must have a filter of at least 1 x 1, got shape {tuple(w_shape)}")
    padded = (H + 2 * padding[0], W + 2 * padding[1])
    extent = (dilation[0] * (R - 1) + 1, dilation[1] * (S - 1) + 1)
    if extent[0] > padded[0] or extent[1] > padded[1]:
        raise ValueError(f"{w_name}'s dilated filter size {extent[0]} x {extent[1]} is larger than "
                         f"the padded input size {padded[0]} x {padded[1]} of {x_name}")
    P = _reference.output_size(H, R, stride[0], padding[0], dilation[0])
    Q = _reference.output_size(W, S, stride[1], padding[1], dilation[1])
    return ConvProblem(N=N, C=C, H=H, W=W, K=K, R=R, S=S, P=P, Q=Q, stride=stride,
                       padding=padding, dilation=dilation, groups=groups, layout=layout,
                       dtype=np.dtype(dtype).name)


def conv2d_output_shape(x_shape, w_shape, *, stride=1, padding=0, dilation=1, groups=1,
                        layout="NCHW"):
    """The shape of ``conv2d_forward``'s result, in ``layout``, after the same checks."""
    problem = _describe(_shape_tuple("x_shape", x_shape), _shape_tuple("w_shape", w_shape),
                        stride, padding, dilation, groups, layout, FLOAT64, "x_shape", "w_shape")
    return problem.y_shape


def conv2d_choose(x_shape, w_shape, *, stride=1, padding=0, dilation=1, groups=1,
                  layout="NCHW", dtype="float32", direction="forward", algo="auto",
                  workspace_limit=None, precision="default", deterministic=False):
    """(algorithm name, reason): what ``algo`` ("auto", "find" or a name) runs for
    this problem on the GPU under the given constraints.  "find" times the
    candidates on the current GPU (once per problem, then cached); "auto" needs
    no GPU."""
    _validate.check_choice("direction", direction, DIRECTIONS)
    options = _options(workspace_limit, precision, deterministic)
    problem = _describe(_shape_tuple("x_shape", x_shape), _shape_tuple("w_shape", w_shape),
                        stride, padding, dilation, groups, layout, np.dtype(dtype), "x_shape", "w_shape")
    if algo == "auto":
        name, reason = explain_auto(problem, direction, options)
        return choose(problem, direction, name, options=options).name, reason
    algorithm = choose(problem, direction, algo, gpu=algo == "find", options=options)
    return algorithm.name, ("fastest measured on this GPU (find mode, cached)" if algo == "find"
                            else "named by the caller") + algorithm.explain(problem, direction)


def _check_output_gradient(dy, problem, source):
    if tuple(dy.shape) != problem.y_shape:
        raise ValueError(f"dy has shape {tuple(dy.shape)} but {source} give an output of shape "
                         f"{problem.y_shape} ({problem.layout})")


# Validated GPU calls: (problem, algorithm, ...) per kind of call (see _validate.CallMemo).
_MEMO = _validate.CallMemo()
CHOICE_HOLDERS.append(_MEMO.clear)   # a new table re-decides cached calls

# The fast path (see _validate.CallMemo): _FAST maps a cheap key of a call
# whose arrays are all C-contiguous CuPy arrays -- each array's shape, dtype
# and device, the current device, and the options (integer options as plain
# ints where they are, else with their exact types) -- to a closure that
# allocates the output and runs the algorithm's prepared launch.
_FAST = _MEMO.fast
_NDARRAY = _validate.NDARRAY
_current_device = _validate.current_device
_exact = _validate.exact


def _int_key(v):
    """An int option as itself when it is a plain int, else with its exact types."""
    return v if type(v) is int else _exact(v)


def _forward_key(x, w, bias, stride, padding, dilation, groups, layout, algo, activation, alpha,
                 workspace_limit, precision):
    """The fast path's key of a forward call, or None (no fast path)."""
    if not (type(x) is _NDARRAY and type(w) is _NDARRAY and x._c_contiguous and w._c_contiguous):
        return None
    if bias is None:
        b = None
    elif type(bias) is _NDARRAY and bias._c_contiguous:
        b = (bias.shape, bias.dtype, bias.data.device_id)
    else:
        return None
    try:
        return (x.shape, x.dtype, x.data.device_id, w.shape, w.dtype, w.data.device_id, b,
                _current_device(), _int_key(stride), _int_key(padding), _int_key(dilation),
                _int_key(groups), layout, algo, activation, alpha, type(alpha),
                workspace_limit, type(workspace_limit), precision)
    except TypeError:  # an unhashable option (a list): the slow path
        return None


def _forward_runner(problem, algorithm, act, fused, has_bias, dtype):
    """The fast path's closure for one validated forward call."""
    from .activations import activation as apply
    shape = problem.y_shape
    launch = algorithm.prepare(problem, "forward", has_bias, act if fused else None)
    output = _kernels.OutputSlot(shape, dtype)

    if act is None or fused:
        def run(x, w, bias):
            y = output()
            out = launch(x, w, y, bias)
            return y if out is None else out
    else:
        mode, alpha = act

        def run(x, w, bias):
            y = output()
            out = launch(x, w, y, bias)
            return apply(y if out is None else out, mode, alpha=alpha)
    return run


def conv2d_forward(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1,
                   layout="NCHW", algo="auto", activation=None, alpha=None,
                   workspace_limit=None, precision="default"):
    """y = act(conv2d(x, w) + bias): x (N, C, H, W) or (N, H, W, C), w (K, C/groups, R, S).

    ``activation`` (a mode of ``dnnprims.ACTIVATION_MODES``, with its ``alpha``)
    is applied in the algorithm's epilogue where it fuses that mode, else as
    one extra pass.  ``workspace_limit`` (bytes) and ``precision="strict"``
    constrain which algorithms may run (see ``ConvOptions``)."""
    fast_key = _forward_key(x, w, bias, stride, padding, dilation, groups, layout, algo, activation,
                            alpha, workspace_limit, precision)
    if fast_key is not None:
        run = _FAST.get(fast_key)
        if run is not None:
            return run(x, w, bias)
    key = _MEMO.key("forward", (x, w, bias), (stride, padding, dilation, groups, layout, algo,
                                              activation, alpha, workspace_limit, precision))
    plan = _MEMO.get(key)
    if plan is None:
        xp = _validate.array_module(x=x, w=w, bias=bias)
        dtype = _validate.check_same_dtype(x=x, w=w, bias=bias)
        _validate.check_ndim("x", x, 4, f"{layout} input")
        _validate.check_ndim("w", w, 4, "filters K, C/groups, R, S")
        problem = _describe(x.shape, w.shape, stride, padding, dilation, groups, layout, dtype)
        if bias is not None:
            _validate.check_shape("bias", bias, (problem.K,), "one value per filter")
        act = _activation_options(activation, alpha)
        options = _options(workspace_limit, precision, False)
        algorithm = choose(problem, "forward", algo, gpu=xp is not np, options=options)
        if xp is np:
            y = _reference.conv2d_forward(x, w, bias, problem.stride, problem.padding,
                                          problem.dilation, problem.groups, layout)
            return y if act is None else _apply_activation(y, act)
        fused = act is not None and act[0] in algorithm.fused_activations
        plan = _MEMO.put(key, (problem, algorithm, act, fused))
    problem, algorithm, act, fused = plan
    xp = _validate._cupy
    y = xp.empty(problem.y_shape, dtype=x.dtype)
    if y.size == 0:
        return y
    if fast_key is not None and fast_key not in _FAST:
        # A prepared launch takes the pointers of the arrays as given (no copies).
        return _MEMO.put_fast(fast_key, _forward_runner(problem, algorithm, act, fused, bias is not None,
                                                          x.dtype))(x, w, bias)
    x, w = _validate.contiguous(xp, x), _validate.contiguous(xp, w)
    bias = None if bias is None else _validate.contiguous(xp, bias)
    y = algorithm.run(problem, "forward", x, w, y, bias=bias, activation=act if fused else None)
    return y if act is None or fused else _apply_activation(y, act)


def _apply_activation(y, act):
    from .activations import activation
    return activation(y, act[0], alpha=act[1])


def conv2d_backward_data(dy, w, x_shape, *, stride=1, padding=0, dilation=1, groups=1,
                         layout="NCHW", algo="auto", workspace_limit=None, precision="default"):
    """dx, the gradient of conv2d_forward with respect to x (of shape ``x_shape``).

    With stride > 1 several input sizes give dy's size; ``x_shape`` picks one.
    ``dy=None`` means a zero output gradient."""
    fast_key = _backward_key("backward_data", dy, w, x_shape, stride, padding, dilation, groups, layout,
                             algo, workspace_limit, precision)
    if fast_key is not None:
        run = _FAST.get(fast_key)
        if run is not None:
            return run(dy, w)
    key = _MEMO.key("backward_data", (dy, w), (x_shape, stride, padding, dilation, groups, layout,
                                               algo, workspace_limit, precision))
    plan = _MEMO.get(key) if dy is not None else None
    if plan is None:
        xp = _validate.array_module(dy=dy, w=w)
        dtype = _validate.check_same_dtype(dy=dy, w=w)
        if dy is not None:
            _validate.check_ndim("dy", dy, 4, f"{layout} output gradient")
        _validate.check_ndim("w", w, 4, "filters K, C/groups, R, S")
        x_shape = _shape_tuple("x_shape", x_shape)
        problem = _describe(x_shape, w.shape, stride, padding, dilation, groups, layout, dtype,
                            x_name="x_shape")
        options = _options(workspace_limit, precision, False)
        if dy is None:
            return xp.zeros(x_shape, dtype=dtype)
        _check_output_gradient(dy, problem, "x_shape and w")
        algorithm = choose(problem, "backward_data", algo, gpu=xp is not np, options=options)
        if xp is np:
            return _reference.conv2d_backward_data(dy, w, x_shape, problem.stride, problem.padding,
                                                   problem.dilation, problem.groups, layout)
        plan = _MEMO.put(key, (problem, algorithm))
    problem, algorithm = plan
    xp = _validate._cupy
    dx = xp.empty(problem.x_shape, dtype=dy.dtype)
    if dx.size == 0:
        return dx
    if fast_key is not None and fast_key not in _FAST:
        run = _MEMO.put_fast(fast_key, _backward_runner(problem, algorithm, "backward_data", dy.dtype))
        return run(dy, w)
    dy, w = _validate.contiguous(xp, dy), _validate.contiguous(xp, w)
    return algorithm.run(problem, "backward_data", dy, w, dx)


def _backward_key(direction, a, b, shape, stride, padding, dilation, groups, layout, algo, workspace_limit,
                  precision, deterministic=False):
    """The fast path's key of a backward call (arrays a, b; the other tensor's
    shape), or None (no fast path).  The direction is part of it: backward data
    (dy, w, x_shape) and backward filter (x, dy, w_shape) of a same-padded
    convolution with N == C == K can have equal shapes in every other place."""
    if not (type(a) is _NDARRAY and type(b) is _NDARRAY and a._c_contiguous and b._c_contiguous):
        return None
    try:
        return (direction, a.shape, a.dtype, a.data.device_id, b.shape, b.dtype, b.data.device_id,
                _current_device(), _exact(shape), _int_key(stride), _int_key(padding),
                _int_key(dilation), _int_key(groups), layout, algo, workspace_limit,
                type(workspace_limit), precision, deterministic, type(deterministic))
    except TypeError:
        return None


def _backward_runner(problem, algorithm, direction, dtype):
    """The fast path's closure for one validated backward-data or backward-filter call."""
    shape = problem.x_shape if direction == "backward_data" else problem.w_shape
    launch = algorithm.prepare(problem, direction)
    output = _kernels.OutputSlot(shape, dtype)

    def run(a, b):
        out = output()
        result = launch(a, b, out, None)
        return out if result is None else result
    return run


def conv2d_backward_filter(x, dy, w_shape, *, stride=1, padding=0, dilation=1, groups=1,
                           layout="NCHW", algo="auto", deterministic=False, workspace_limit=None,
                           precision="default"):
    """dw, the gradient of conv2d_forward with respect to w (of shape ``w_shape``).

    ``dy=None`` means a zero output gradient.  ``deterministic=True`` admits
    only algorithms that give the same bits on every run (no atomics)."""
    fast_key = _backward_key("backward_filter", x, dy, w_shape, stride, padding, dilation, groups, layout,
                             algo, workspace_limit, precision, deterministic)
    if fast_key is not None:
        run = _FAST.get(fast_key)
        if run is not None:
            return run(x, dy)
    key = _MEMO.key("backward_filter", (x, dy), (w_shape, stride, padding, dilation, groups, layout,
                                                 algo, deterministic, workspace_limit, precision))
    plan = _MEMO.get(key) if dy is not None else None
    if plan is None:
        xp = _validate.array_module(x=x, dy=dy)
        dtype = _validate.check_same_dtype(x=x, dy=dy)
        _validate.check_ndim("x", x, 4, f"{layout} input")
        if dy is not None:
            _validate.check_ndim("dy", dy, 4, f"{layout} output gradient")
        w_shape = _shape_tuple("w_shape", w_shape)
        problem = _describe(x.shape, w_shape, stride, padding, dilation, groups, layout, dtype,
                            w_name="w_shape")
        options = _options(workspace_limit, precision, deterministic)
        if dy is None:
            return xp.zeros(w_shape, dtype=dtype)
        _check_output_gradient(dy, problem, "x and w_shape")
        algorithm = choose(problem, "backward_filter", algo, gpu=xp is not np, options=options)
        if xp is np:
            return _reference.conv2d_backward_filter(x, dy, w_shape, problem.stride, problem.padding,
                                                     problem.dilation, problem.groups, layout)
        plan = _MEMO.put(key, (problem, algorithm))
    problem, algorithm = plan
    xp = _validate._cupy
    if problem.N == 0 or problem.P * problem.Q == 0:  # empty sum: zero gradient
        return xp.zeros(problem.w_shape, dtype=x.dtype)
    dw = xp.empty(problem.w_shape, dtype=x.dtype)
    if dw.size == 0:
        return dw
    if fast_key is not None and fast_key not in _FAST:
        return _MEMO.put_fast(fast_key, _backward_runner(problem, algorithm, "backward_filter",
                                                           x.dtype))(x, dy)
    x, dy = _validate.contiguous(xp, x), _validate.contiguous(xp, dy)
    return algorithm.run(problem, "backward_filter", x, dy, dw)


def conv2d_backward_bias(dy, *, layout="NCHW"):
    """db[k] = sum of dy over batch and output positions: shape (K,).

    dy cannot be None here: the gradient's length K is only known from dy."""
    if dy is None:
        raise TypeError("dy must be an array: the bias gradient's length is only known from dy "
                        "(for a zero gradient pass zeros of the output's shape)")
    xp = _validate.array_module(dy=dy)
    _validate.check_float_dtype("dy", dy)
    _validate.check_layout(layout)
    _validate.check_ndim("dy", dy, 4, f"{layout} output gradient")
    if xp is np:
        return _reference.conv2d_backward_bias(dy, layout)
    K = dy.shape[1] if layout == "NCHW" else dy.shape[3]
    db = xp.zeros((K,), dtype=dy.dtype)
    if dy.size == 0:
        return db
    return _backward_bias_kernel(_validate.contiguous(xp, dy), db, layout)
