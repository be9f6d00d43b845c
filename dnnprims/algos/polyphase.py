"""The "polyphase" algorithm: a dilated stride-1 convolution as one dilation-1
convolution over the phase sub-images stacked into the batch (space-to-batch).

With stride 1 and dilation (dh, dw), output pixel (p, q) reads the padded input
at (p + dh*r, q + dw*s): pixels of the same phase (p mod dh, q mod dw) only.
When the padding is a multiple of the dilation and the image a multiple of it,

    y[n, k, dh*u + a, dw*v + b] = sum_{c,r,s} x[n, c, dh*(u + r - ph/dh) + a,
                                                 dw*(v + s - pw/dw) + b] * w[k, c, r, s]

so phase (a, b) of y is an ordinary dilation-1 convolution of phase (a, b) of
x, x[..., a::dh, b::dw] (H/dh x W/dw, padding (ph/dh, pw/dw)), with the same
filter.  The dh*dw phases are independent problems of one shape: stacked into
the batch they are one sub-problem

    x (N, C, H, W) -> xs (dh*dw*N, C, H/dh, W/dw),   batch index (a*dw + b)*N + n

(NHWC alike), run by the best dilation-1 algorithm -- for 3x3 filters that is
Winograd, which cannot run a dilated filter at all -- and the result is
scattered back.  Backward data decomposes the same way (the forward map is
block-diagonal over phases, so is its adjoint); backward filter is the inner
backward filter over the stacked batch (its batch sum is the sum over phases).

The two layout copies are CuPy copies of a transposed 6-D view into a fresh
buffer (the workspace: both stacked tensors, plus the inner algorithm's).

The inner algorithm is what ``algo="auto"`` picks for the sub-problem under the
caller's options (:meth:`ConvAlgorithm.under`): precision, determinism, and the
workspace limit less the stacked buffers.  Conditions (:meth:`supports`):
stride 1, dilation other than (1, 1), padding a multiple of the dilation, H and
W multiples of the dilation.
"""
import dataclasses

import numpy as np

from . import CHOICE_HOLDERS, DEFAULT_OPTIONS, ConvAlgorithm, ConvOptions, choose, explain_auto, register


def sub_problem(p):
    """The dilation-1 problem of the stacked phases (see the module docstring)."""
    dh, dw = p.dilation
    return dataclasses.replace(p, N=p.N * dh * dw, H=p.H // dh, W=p.W // dw, P=p.P // dh, Q=p.Q // dw,
                               padding=(p.padding[0] // dh, p.padding[1] // dw), dilation=(1, 1))


def phase_view(t, layout, dilation):
    """A 4-D tensor of ``layout`` as a 6-D view whose first two axes are the
    phase (a, b) = (h mod dh, w mod dw) of its pixels:
    NCHW (dh, dw, N, C, H/dh, W/dw), NHWC (dh, dw, N, H/dh, W/dw, C)."""
    dh, dw = dilation
    if layout == "NCHW":
        n, c, h, w = t.shape
        return t.reshape(n, c, h // dh, dh, w // dw, dw).transpose(3, 5, 0, 1, 2, 4)
    n, h, w, c = t.shape
    return t.reshape(n, h // dh, dh, w // dw, dw, c).transpose(2, 4, 0, 1, 3, 5)


# The copies move bits: unsigned views of the storage type's width, so that they
# need no arithmetic on (and no CuPy support for) bfloat16.
_BITS = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def _bits(t):
    return t.view(_BITS[t.dtype.itemsize])


def split_phases(xp, t, layout, dilation):
    """The phases of ``t`` stacked into the batch: a new contiguous tensor of
    (dh*dw*N, ...) in ``layout``, batch index (a*dw + b)*N + n."""
    dh, dw = dilation
    stacked = xp.ascontiguousarray(phase_view(_bits(t), layout, dilation)).view(t.dtype)
    return stacked.reshape((dh * dw * t.shape[0],) + stacked.shape[3:])


def merge_phases(stacked, out, layout, dilation):
    """Write the stacked phases back into ``out`` (the inverse of split_phases)."""
    view = phase_view(_bits(out), layout, dilation)
    view[...] = _bits(stacked).reshape(view.shape)
    return out


def decompose(xp, problem, direction, a, b, out, bias, launch):
    """``direction`` of ``problem`` by its phases: ``a, b, out`` as in
    :meth:`ConvAlgorithm.run`; ``launch(a', b', out', bias)`` computes the
    sub-problem (:func:`sub_problem`) into out' and returns None or its result.
    Written against ``xp``: the same code runs on NumPy in the tests."""
    p, d = problem, problem.dilation
    sub = sub_problem(p)
    if direction == "backward_filter":
        result = launch(split_phases(xp, a, p.layout, d), split_phases(xp, b, p.layout, d), out, None)
        return out if result is None else result
    if direction == "forward":
        stacked_out = xp.empty(sub.y_shape, dtype=out.dtype)
    else:
        stacked_out = xp.empty(sub.x_shape, dtype=out.dtype)
    result = launch(split_phases(xp, a, p.layout, d), b, stacked_out, bias)
    return merge_phases(stacked_out if result is None else result, out, p.layout, d)


def emulate(problem, direction, a, b, bias=None):
    """The decomposition on NumPy with the reference computing the sub-problem
    (float64 arrays in, float64 out): what the tests check against the
    reference of the whole problem."""
    from ..reference import conv as reference
    sub = sub_problem(problem)
    opts = (sub.stride, sub.padding, sub.dilation, sub.groups, sub.layout)

    def launch(a, b, out, bias):
        if direction == "forward":
            return reference.conv2d_forward(a, b, bias, *opts)
        if direction == "backward_data":
            return reference.conv2d_backward_data(a, b, sub.x_shape, *opts)
        return reference.conv2d_backward_filter(a, b, sub.w_shape, *opts)

    shape = {"forward": problem.y_shape, "backward_data": problem.x_shape,
             "backward_filter": problem.w_shape}[direction]
    return decompose(np, problem, direction, a, b, np.empty(shape, dtype=a.dtype), bias, launch)


class PolyphaseConvolution(ConvAlgorithm):
    """See the module docstring.  The registered instance chooses its inner
    algorithm under the default options; :meth:`under` gives the instance for
    other options (kept per options), whose inner choice obeys them -- so it is
    deterministic / strict exactly when the options ask for it."""

    name = "polyphase"

    def __init__(self, options=DEFAULT_OPTIONS, variants=None):
        self.options = options
        self.deterministic = options.deterministic
        self.strict = options.precision == "strict"
        self._variants = {options: self} if variants is None else variants

    def under(self, options):
        variant = self._variants.get(options)
        if variant is None:
            if len(self._variants) >= 256:   # workspace limits are free-form: bound the cache,
                registered = self._variants.get(DEFAULT_OPTIONS)   # keeping the registered instance
                self._variants.clear()
                if registered is not None:
                    self._variants[DEFAULT_OPTIONS] = registered
            variant = self._variants[options] = PolyphaseConvolution(options, self._variants)
        return variant

    def supports(self, problem, direction):
        ok, reason = super().supports(problem, direction)
        if not ok:
            return ok, reason
        p = problem
        (dh, dw), (ph, pw) = p.dilation, p.padding
        if p.dilation == (1, 1):
            return False, "dilation is (1, 1): there are no phases to split"
        if p.stride != (1, 1):
            return False, f"it needs stride 1 (got {p.stride}): a strided output mixes phases"
        if ph % dh or pw % dw:
            return False, (f"padding {p.padding} is not a multiple of dilation {p.dilation}: "
                           f"the phases would need different paddings")
        if p.H % dh or p.W % dw:
            return False, (f"input size {p.H}x{p.W} is not a multiple of dilation {p.dilation}: "
                           f"the phase sub-images would differ in size")
        return True, ""

    def stacked_bytes(self, problem):
        """The two stacked tensors (input side and output side) of any direction."""
        p = problem
        return (p.N * p.C * p.H * p.W + p.N * p.K * p.P * p.Q) * np.dtype(p.dtype).itemsize

    def _inner_options(self, problem):
        limit = self.options.workspace_limit
        if limit is not None:
            limit = max(0, limit - self.stacked_bytes(problem))
        return ConvOptions(limit, self.options.precision, self.options.deterministic)

    def inner(self, problem, direction):
        """(algorithm, reason): what runs the sub-problem, ``auto``'s choice there
        under this instance's options (the workspace limit less the stacked
        buffers)."""
        sub, options = sub_problem(problem), self._inner_options(problem)
        name, reason = explain_auto(sub, direction, options)
        return choose(sub, direction, name, options=options), reason

    def explain(self, problem, direction):
        algorithm, reason = self.inner(problem, direction)
        sub = sub_problem(problem)
        return (f"; inner algorithm for the {sub.N} x {sub.H}x{sub.W} dilation-1 sub-problem: "
                f"{algorithm.name} ({reason})")

    def workspace_bytes(self, problem, direction):
        if not self.supports(problem, direction)[0]:
            return 0
        algorithm, _ = self.inner(problem, direction)
        return self.stacked_bytes(problem) + algorithm.workspace_bytes(sub_problem(problem), direction)

    def prepare(self, problem, direction, has_bias=False, activation=None):
        """The inner algorithm's prepared call between the two layout copies."""
        import cupy

        if activation is not None:   # fused_activations is empty: conv.py never asks
            raise ValueError("polyphase applies no activation in its epilogue")
        algorithm, _ = self.inner(problem, direction)
        launch = algorithm.prepare(sub_problem(problem), direction, has_bias, None)

        def run(a, b, out, bias=None):
            return decompose(cupy, problem, direction, a, b, out, bias, launch)
        return run

    def run(self, problem, direction, a, b, out, bias=None, activation=None):
        return self.prepared(problem, direction, bias is not None, activation)(a, b, out, bias)


POLYPHASE = register(PolyphaseConvolution())


def _forget_prepared_calls():
    """A prepared call holds the inner algorithm auto chose when it was made:
    drop them all when the choices are forgotten (a new table, forget_choices)."""
    for variant in list(POLYPHASE._variants.values()):
        cache = variant.__dict__.get("_prepared_cache")
        if cache:
            cache.clear()


CHOICE_HOLDERS.append(_forget_prepared_calls)
