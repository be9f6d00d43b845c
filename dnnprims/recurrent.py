"""One step of an LSTM cell and a GRU cell, forward and backward (PyTorch's
``nn.LSTMCell`` / ``nn.GRUCell``).

Weight layout and gate order are PyTorch's: ``w_ih`` is (G*H, I), ``w_hh``
(G*H, H), biases (G*H,), with G = 4 gates (i, f, g, o) for LSTM and 3
(r, z, n) for GRU, where ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``.
``x`` is (B, I) and the states (B, H); a 1-D ``x`` (I,) with 1-D states is one
unbatched step, as in PyTorch.  ``h``/``c`` may be None (zeros); biases may be
None (no bias), and then backward returns None for their gradients.  Backward
accepts None for a zero output gradient and always returns ``dh`` (and ``dc``),
the gradient with respect to the state that was passed, or to the zero state.

NumPy arrays run :mod:`dnnprims.reference.recurrent`.  On CuPy arrays the
GEMMs go to cuBLAS through ``cupy.matmul`` in the accumulation dtype (float32
for float16/bfloat16, so gate pre-activations never round to 16 bits), and one
kernel of ``kernels/recurrent.cu`` does the bias add, the gate nonlinearities
and the state update (forward), or the gate gradients (backward).
"""
import numpy as np

from . import _dtypes, _kernels, _validate
from .reference import recurrent as _reference

_LSTM_GATES = 4
_GRU_GATES = 3
_BLOCK = 256
_MAX_BLOCKS = 65536  # grid cap; kernels loop with a grid stride
_STRIDE_SLACK = _BLOCK * _MAX_BLOCKS

FAMILY = _kernels.KernelFamily("recurrent.cu", [
    f"{kernel}<{t}, {i}>"
    for kernel in ("lstm_cell_forward", "lstm_cell_backward", "gru_cell_forward", "gru_cell_backward")
    for t in _dtypes.CUDA_TYPES
    for i in ("int", "long long")
])


def _check_cell(cell, gates, x, w_ih, w_hh, b_ih, b_hh, states):
    """Validate one cell's arguments; ``states`` maps names to (B, H) arrays or None
    (states and output gradients).  Returns (xp, dtype, hidden)."""
    named = dict(states)
    xp = _validate.array_module(x=x, **named, w_ih=w_ih, w_hh=w_hh, b_ih=b_ih, b_hh=b_hh)
    for name, a in (("x", x), ("w_ih", w_ih), ("w_hh", w_hh)):
        if a is None:
            raise TypeError(f"{name} must be an array, got None")
    dtype = _validate.check_same_dtype(x=x, **named, w_ih=w_ih, w_hh=w_hh, b_ih=b_ih, b_hh=b_hh)
    _validate.check_ndim("w_hh", w_hh, 2, f"({gates} * hidden_size, hidden_size) for {cell}")
    hidden = w_hh.shape[1]
    _validate.check_shape("w_hh", w_hh, (gates * hidden, hidden),
                          f"({gates} * hidden_size, hidden_size) for {cell}, hidden_size = w_hh.shape[1]")
    if x.ndim not in (1, 2):
        raise ValueError(f"x must be 2-D (batch, input_size) or 1-D (input_size,), got shape {tuple(x.shape)}")
    _validate.check_ndim("w_ih", w_ih, 2, f"({gates} * hidden_size, input_size) for {cell}")
    _validate.check_shape("w_ih", w_ih, (gates * hidden, x.shape[-1]),
                          f"({gates} * hidden_size, input_size) for {cell}, input_size = x.shape[-1], "
                          "hidden_size = w_hh.shape[1]")
    state_shape = tuple(x.shape[:-1]) + (hidden,)
    what = "(batch, hidden_size)" if x.ndim == 2 else "(hidden_size,) for an unbatched x"
    for name, a in named.items():
        if a is not None:
            _validate.check_shape(name, a, state_shape, what)
    for name, b in (("b_ih", b_ih), ("b_hh", b_hh)):
        if b is not None:
            _validate.check_shape(name, b, (gates * hidden,), f"({gates} * hidden_size,) for {cell}")
    return xp, dtype, hidden


def _batched(*arrays):
    """View 1-D (unbatched) arrays as one-row batches."""
    return tuple(a if a is None or a.ndim == 2 else a[None] for a in arrays)


def _unbatched(unbatched, *arrays):
    return tuple(a[0] if unbatched and a is not None else a for a in arrays)


def _launch(kernel, dtype, rows, hidden, gates, args):
    if rows * hidden == 0:
        return
    index_t = _kernels.index_type(rows * gates * hidden + _STRIDE_SLACK)
    itype = np.int32 if index_t == "int" else np.int64
    grid = min(_kernels.ceil_div(rows * hidden, _BLOCK), _MAX_BLOCKS)
    FAMILY.launch(f"{kernel}<{_dtypes.cuda_type(dtype)}, {index_t}>", (grid,), (_BLOCK,),
                  (*args, itype(rows), itype(hidden)))


def _gpu_operands(xp, dtype, hidden, gates, x, w_ih, w_hh, b_ih, b_hh, states):
    """Contiguous storage arrays for the kernels (zeros for absent biases/states),
    accumulation-dtype copies for the GEMMs, and the two gate GEMMs."""
    acc = _dtypes.accumulate_dtype(dtype)
    rows = x.shape[0]
    b_ih = xp.zeros(gates * hidden, dtype) if b_ih is None else _validate.contiguous(xp, b_ih)
    b_hh = xp.zeros(gates * hidden, dtype) if b_hh is None else _validate.contiguous(xp, b_hh)
    states = [xp.zeros((rows, hidden), dtype) if s is None else _validate.contiguous(xp, s) for s in states]
    x_acc, w_ih_acc, w_hh_acc = (a.astype(acc, copy=False) for a in (x, w_ih, w_hh))
    h_acc = states[0].astype(acc, copy=False)
    gx = xp.ascontiguousarray(xp.matmul(x_acc, w_ih_acc.T))
    gh = xp.ascontiguousarray(xp.matmul(h_acc, w_hh_acc.T))
    return b_ih, b_hh, states, (x_acc, h_acc, w_ih_acc, w_hh_acc), gx, gh


def lstm_cell(x, h, c, w_ih, w_hh, b_ih=None, b_hh=None):
    """One LSTM step: returns (h1, c1)."""
    xp, dtype, hidden = _check_cell("LSTM", _LSTM_GATES, x, w_ih, w_hh, b_ih, b_hh, {"h": h, "c": c})
    unbatched = x.ndim == 1
    x, h, c = _batched(x, h, c)
    shape = (x.shape[0], hidden)
    if xp is np:
        h = np.zeros(shape, dtype) if h is None else h
        c = np.zeros(shape, dtype) if c is None else c
        return _unbatched(unbatched, *_reference.lstm_cell(x, h, c, w_ih, w_hh, b_ih, b_hh))
    b_ih, b_hh, (h, c), _, gx, gh = _gpu_operands(xp, dtype, hidden, _LSTM_GATES, x, w_ih, w_hh,
                                                  b_ih, b_hh, (h, c))
    h1, c1 = xp.empty(shape, dtype), xp.empty(shape, dtype)
    _launch("lstm_cell_forward", dtype, shape[0], hidden, _LSTM_GATES, (gx, gh, b_ih, b_hh, c, h1, c1))
    return _unbatched(unbatched, h1, c1)


def lstm_cell_backward(dh1, dc1, x, h, c, w_ih, w_hh, b_ih=None, b_hh=None):
    """Gradients of :func:`lstm_cell`: (dx, dh, dc, dw_ih, dw_hh, db_ih, db_hh); db_ih
    (db_hh) is None where b_ih (b_hh) is.  ``dh1``/``dc1`` None are zero gradients."""
    xp, dtype, hidden = _check_cell("LSTM", _LSTM_GATES, x, w_ih, w_hh, b_ih, b_hh,
                                    {"dh1": dh1, "dc1": dc1, "h": h, "c": c})
    unbatched = x.ndim == 1
    dh1, dc1, x, h, c = _batched(dh1, dc1, x, h, c)
    shape = (x.shape[0], hidden)
    if xp is np:
        h = np.zeros(shape, dtype) if h is None else h
        c = np.zeros(shape, dtype) if c is None else c
        dx, dh, dc, *rest = _reference.lstm_cell_backward(dh1, dc1, x, h, c, w_ih, w_hh, b_ih, b_hh)
        return (*_unbatched(unbatched, dx, dh, dc), *rest)
    has_ih, has_hh = b_ih is not None, b_hh is not None
    b_ih, b_hh, (h, c, dh1, dc1), (x_acc, h_acc, w_ih_acc, w_hh_acc), gx, gh = _gpu_operands(
        xp, dtype, hidden, _LSTM_GATES, x, w_ih, w_hh, b_ih, b_hh, (h, c, dh1, dc1))
    acc = _dtypes.accumulate_dtype(dtype)
    dgates = xp.empty((shape[0], _LSTM_GATES * hidden), acc)
    dc = xp.empty(shape, dtype)
    _launch("lstm_cell_backward", dtype, shape[0], hidden, _LSTM_GATES,
            (gx, gh, b_ih, b_hh, c, dh1, dc1, dgates, dc))
    dx = xp.matmul(dgates, w_ih_acc).astype(dtype)
    dh = xp.matmul(dgates, w_hh_acc).astype(dtype)
    dw_ih = xp.matmul(dgates.T, x_acc).astype(dtype)
    dw_hh = xp.matmul(dgates.T, h_acc).astype(dtype)
    db = dgates.sum(axis=0)
    return (*_unbatched(unbatched, dx, dh, dc), dw_ih, dw_hh,
            db.astype(dtype) if has_ih else None, db.astype(dtype) if has_hh else None)


def gru_cell(x, h, w_ih, w_hh, b_ih=None, b_hh=None):
    """One GRU step: returns h1."""
    xp, dtype, hidden = _check_cell("GRU", _GRU_GATES, x, w_ih, w_hh, b_ih, b_hh, {"h": h})
    unbatched = x.ndim == 1
    x, h = _batched(x, h)
    shape = (x.shape[0], hidden)
    if xp is np:
        h = np.zeros(shape, dtype) if h is None else h
        return _unbatched(unbatched, _reference.gru_cell(x, h, w_ih, w_hh, b_ih, b_hh))[0]
    b_ih, b_hh, (h,), _, gx, gh = _gpu_operands(xp, dtype, hidden, _GRU_GATES, x, w_ih, w_hh,
                                                b_ih, b_hh, (h,))
    h1 = xp.empty(shape, dtype)
    _launch("gru_cell_forward", dtype, shape[0], hidden, _GRU_GATES, (gx, gh, b_ih, b_hh, h, h1))
    return _unbatched(unbatched, h1)[0]


def gru_cell_backward(dh1, x, h, w_ih, w_hh, b_ih=None, b_hh=None):
    """Gradients of :func:`gru_cell`: (dx, dh, dw_ih, dw_hh, db_ih, db_hh); db_ih (db_hh)
    is None where b_ih (b_hh) is.  ``dh1=None`` is a zero gradient."""
    xp, dtype, hidden = _check_cell("GRU", _GRU_GATES, x, w_ih, w_hh, b_ih, b_hh, {"dh1": dh1, "h": h})
    unbatched = x.ndim == 1
    dh1, x, h = _batched(dh1, x, h)
    shape = (x.shape[0], hidden)
    if xp is np:
        h = np.zeros(shape, dtype) if h is None else h
        dx, dh, *rest = _reference.gru_cell_backward(dh1, x, h, w_ih, w_hh, b_ih, b_hh)
        return (*_unbatched(unbatched, dx, dh), *rest)
    has_ih, has_hh = b_ih is not None, b_hh is not None
    b_ih, b_hh, (h, dh1), (x_acc, h_acc, w_ih_acc, w_hh_acc), gx, gh = _gpu_operands(
        xp, dtype, hidden, _GRU_GATES, x, w_ih, w_hh, b_ih, b_hh, (h, dh1))
    acc = _dtypes.accumulate_dtype(dtype)
    dgx = xp.empty((shape[0], _GRU_GATES * hidden), acc)
    dgh = xp.empty((shape[0], _GRU_GATES * hidden), acc)
    dh_direct = xp.empty(shape, acc)
    _launch("gru_cell_backward", dtype, shape[0], hidden, _GRU_GATES,
            (gx, gh, b_ih, b_hh, h, dh1, dgx, dgh, dh_direct))
    dx = xp.matmul(dgx, w_ih_acc).astype(dtype)
    dh = (dh_direct + xp.matmul(dgh, w_hh_acc)).astype(dtype)
    dw_ih = xp.matmul(dgx.T, x_acc).astype(dtype)
    dw_hh = xp.matmul(dgh.T, h_acc).astype(dtype)
    return (*_unbatched(unbatched, dx, dh), dw_ih, dw_hh,
            dgx.sum(axis=0).astype(dtype) if has_ih else None,
            dgh.sum(axis=0).astype(dtype) if has_hh else None)
