"""Hypothesis strategies that draw valid problems for each primitive family.

Users can import these to property-test their own code against the
references.  Requires ``hypothesis`` (the ``test`` extra).  One section per
family.
"""
from hypothesis import strategies as st  # noqa: F401



# --- convolution ---------------------------------------------------------------

CONV_SIZES = (1, 2, 3, 5, 7, 13)


@st.composite
def conv_problems(draw, max_channels=8, max_size=13, max_filter=5, layouts=("NCHW", "NHWC")):
    """Keyword arguments of a valid conv2d problem: shapes (in ``layout``) and options.

    Draws ``x_shape``, ``w_shape`` (KCRS), ``stride``, ``padding``, ``dilation`` (pairs),
    ``groups`` (including depthwise) and ``layout``, such that the dilated filter fits
    the padded input.  Spatial sizes favour 1, 3, 7 and 13."""
    groups = draw(st.sampled_from((1, 1, 2, 3)))
    per_group = st.integers(1, max(1, max_channels // groups))
    C = groups * draw(per_group)
    depthwise = draw(st.booleans())
    K = C * draw(st.integers(1, 2)) if depthwise else groups * draw(per_group)
    if depthwise:
        groups = C
    R, S = draw(st.integers(1, max_filter)), draw(st.integers(1, max_filter))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))

    def spatial(extent, pad):
        smallest = max(1, extent - 2 * pad)
        choices = [n for n in CONV_SIZES if smallest <= n <= max_size]
        return draw(st.sampled_from(choices) if choices else st.integers(smallest, smallest + 4))

    H = spatial(dilation[0] * (R - 1) + 1, padding[0])
    W = spatial(dilation[1] * (S - 1) + 1, padding[1])
    N = draw(st.integers(1, 3))
    layout = draw(st.sampled_from(layouts))
    x_shape = (N, C, H, W) if layout == "NCHW" else (N, H, W, C)
    return dict(x_shape=x_shape, w_shape=(K, C // groups, R, S), stride=stride, padding=padding,
                dilation=dilation, groups=groups, layout=layout)


# ---------------------------------------------------------------------- pooling

@st.composite
def pool_problems(draw, max_size=13):
    """Keyword arguments of a valid ``pool`` problem plus ``x_shape``:
    sizes from {1, 3, 7, 13, ...}, overlapping and non-overlapping windows,
    padding up to half the window, both modes and layouts."""
    sizes = st.sampled_from([s for s in (1, 2, 3, 5, 7, 13) if s <= max_size])
    h, w = draw(sizes), draw(sizes)
    kh = draw(st.integers(1, min(4, h + 2)))
    kw = draw(st.integers(1, min(4, w + 2)))
    ph = draw(st.integers(0, kh // 2))
    pw = draw(st.integers(0, kw // 2))
    # The window must fit the padded input; the largest padding always makes it fit.
    ph = ph if h + 2 * ph >= kh else kh // 2
    pw = pw if w + 2 * pw >= kw else kw // 2
    stride = draw(st.one_of(st.none(), st.tuples(st.integers(1, 3), st.integers(1, 3))))
    n, c = draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([1, 3, 4]))
    layout = draw(st.sampled_from(["NCHW", "NHWC"]))
    x_shape = (n, c, h, w) if layout == "NCHW" else (n, h, w, c)
    return dict(x_shape=x_shape, window=(kh, kw), stride=stride, padding=(ph, pw),
                mode=draw(st.sampled_from(["max", "avg"])),
                count_include_pad=draw(st.booleans()), layout=layout)


# ---------------------------------------------------------------------- batch normalization

@st.composite
def batchnorm_problems(draw):
    """Keyword arguments of a valid ``batchnorm`` problem plus ``x_shape``: 2-D
    (N, C) or 4-D in either layout, at least 3 values per channel (with 2, dx is
    zero up to the eps term and its relative error means nothing)."""
    layout = draw(st.sampled_from(["NCHW", "NHWC"]))
    sizes = st.sampled_from([1, 3, 7, 13])
    c = draw(st.sampled_from([1, 3, 4]))
    if draw(st.booleans()):
        x_shape = (draw(st.sampled_from([3, 7, 13])), c)
    else:
        n, h, w = draw(st.sampled_from([1, 2, 3])), draw(sizes), draw(sizes)
        if n * h * w < 3:
            n = 3
        x_shape = (n, c, h, w) if layout == "NCHW" else (n, h, w, c)
    return dict(x_shape=x_shape, layout=layout, affine=draw(st.booleans()),
                momentum=draw(st.sampled_from([0.0, 0.1, 0.5, 1.0])),
                eps=draw(st.sampled_from([1e-5, 1e-3, 0.1])))


# ---- softmax -----------------------------------------------------------------
# Side lengths that exercise single-element, odd and prime sizes.
SIDES = (1, 2, 3, 5, 7, 13)


@st.composite
def softmax_problems(draw, max_ndim=4):
    """(shape, axis) for softmax/log_softmax: any ndim >= 1, any (possibly negative) axis."""
    ndim = draw(st.integers(1, max_ndim))
    shape = tuple(draw(st.lists(st.sampled_from(SIDES), min_size=ndim, max_size=ndim)))
    # A longer reduced axis now and then, to reach the block-per-row kernel.
    axis = draw(st.integers(-ndim, ndim - 1))
    if draw(st.booleans()) and ndim <= 2:
        shape = shape[:axis % ndim] + (draw(st.sampled_from((31, 33, 1025, 1500))),) + shape[axis % ndim + 1:]
    return shape, axis


# ---- activation --------------------------------------------------------------
@st.composite
def activation_options(draw):
    """(mode, keyword options) for activation/activation_backward."""
    from ..activations import ACTIVATION_MODES, DEFAULT_ALPHA

    mode = draw(st.sampled_from(ACTIVATION_MODES))
    options = {}
    if mode == "gelu":
        options["approximate"] = draw(st.sampled_from(("none", "tanh")))
    if mode in DEFAULT_ALPHA and draw(st.booleans()):
        low = 0.25 if mode == "clipped_relu" else -2.0
        # |alpha| >= 1e-3 (or exactly 0): alpha must survive rounding to the
        # storage dtype, or the float64 oracle computes a different function.
        options["alpha"] = draw(st.floats(low, 3.0, allow_nan=False).filter(
            lambda a: a == 0.0 or abs(a) >= 1e-3))
    return mode, options


@st.composite
def activation_problems(draw, max_ndim=4):
    """(shape, mode, options): any shape (0-D included)."""
    ndim = draw(st.integers(0, max_ndim))
    shape = tuple(draw(st.lists(st.sampled_from(SIDES), min_size=ndim, max_size=ndim)))
    mode, options = draw(activation_options())
    return shape, mode, options


@st.composite
def bias_activation_problems(draw, max_ndim=4):
    """(shape, layout, mode, options) for bias_activation: ndim >= 2, either layout."""
    ndim = draw(st.integers(2, max_ndim))
    shape = tuple(draw(st.lists(st.sampled_from(SIDES + (8, 16)), min_size=ndim, max_size=ndim)))
    layout = draw(st.sampled_from(("NCHW", "NHWC")))
    mode, options = draw(activation_options())
    return shape, layout, mode, options


# ---- recurrent cells -----------------------------------------------------------
@st.composite
def recurrent_cell_problems(draw):
    """A dict of sizes and options for lstm_cell/gru_cell: batch (None = an unbatched
    1-D step), input_size, hidden_size, and which biases and states are given."""
    return {
        "batch": draw(st.sampled_from((None, 1, 2, 3, 7, 13))),
        "input_size": draw(st.sampled_from((1, 3, 7, 13))),
        "hidden_size": draw(st.sampled_from((1, 3, 7, 13))),
        "bias_ih": draw(st.booleans()),
        "bias_hh": draw(st.booleans()),
        "initial_state": draw(st.booleans()),  # False: h (and c) are None
    }


# --- row normalization (layer, RMS, group, instance norm) ------------------------

ROW_SIZES = (1, 2, 3, 7, 13)


@st.composite
def layer_norm_problems(draw, max_ndim=4):
    """``x_shape`` and ``normalized_shape`` (1 to 3 trailing axes) of a layer/RMS norm,
    sizes from 1, 2, 3, 7, 13, plus ``eps`` and ``affine``."""
    ndim = draw(st.integers(1, max_ndim))
    x_shape = tuple(draw(st.sampled_from(ROW_SIZES)) for _ in range(ndim))
    k = draw(st.integers(1, min(3, ndim)))
    return {"x_shape": x_shape, "normalized_shape": x_shape[ndim - k:],
            "eps": draw(st.sampled_from((1e-5, 1e-3, 0.1))), "affine": draw(st.booleans())}


@st.composite
def group_norm_problems(draw):
    """``x_shape`` (3-D or 4-D, in ``layout``), ``num_groups`` dividing C, ``eps``, ``affine``."""
    groups = draw(st.sampled_from((1, 2, 3)))
    channels = groups * draw(st.sampled_from((1, 2, 3)))
    n = draw(st.sampled_from((1, 2, 3)))
    spatial = tuple(draw(st.sampled_from(ROW_SIZES)) for _ in range(draw(st.integers(1, 2))))
    layout = draw(st.sampled_from(("NCHW", "NHWC")))
    x_shape = (n, channels, *spatial) if layout == "NCHW" else (n, *spatial, channels)
    return {"x_shape": x_shape, "num_groups": groups, "layout": layout,
            "eps": draw(st.sampled_from((1e-5, 1e-3))), "affine": draw(st.booleans())}


# --- tensor operations -------------------------------------------------------------

@st.composite
def broadcast_problems(draw, max_ndim=4):
    """``a_shape`` and a ``c_shape`` that broadcasts to it (size-1 axes, fewer axes)."""
    ndim = draw(st.integers(1, max_ndim))
    a_shape = tuple(draw(st.sampled_from(ROW_SIZES)) for _ in range(ndim))
    c_shape = tuple(d if draw(st.booleans()) else 1 for d in a_shape)
    drop = draw(st.integers(0, ndim - 1))
    return {"a_shape": a_shape, "c_shape": c_shape[drop:]}


@st.composite
def reduce_problems(draw, max_ndim=4):
    """``x_shape``, ``axes`` (None, an int or a tuple), ``op`` and ``keepdims``."""
    ndim = draw(st.integers(1, max_ndim))
    x_shape = tuple(draw(st.sampled_from(ROW_SIZES)) for _ in range(ndim))
    axes = draw(st.one_of(st.none(), st.integers(-ndim, ndim - 1),
                          st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True)
                          .map(tuple)))
    op = draw(st.sampled_from(("sum", "mean", "max", "min", "amax", "norm1", "norm2")))
    return {"x_shape": x_shape, "axes": axes, "op": op, "keepdims": draw(st.booleans())}


# ---------------------------------------------------------------------- convolution: FFT

@st.composite
def fft_conv_problems(draw, max_channels=4, max_filter=11, max_padding=5):
    """Keyword arguments of a stride-1 ungrouped conv2d problem -- what the FFT
    algorithms compute: filters up to ``max_filter`` (also larger than the
    image), padding up to ``max_padding`` (also more than half the filter),
    dilation 1 or 2, images from {1, 3, 7, 13} where the filter fits."""
    R, S = draw(st.integers(1, max_filter)), draw(st.integers(1, max_filter))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding = (draw(st.integers(0, max_padding)), draw(st.integers(0, max_padding)))

    def spatial(extent, pad):
        smallest = max(1, extent - 2 * pad)
        choices = [n for n in (1, 3, 7, 13) if n >= smallest]
        return draw(st.sampled_from(choices) if choices else st.integers(smallest, smallest + 4))

    H = spatial(dilation[0] * (R - 1) + 1, padding[0])
    W = spatial(dilation[1] * (S - 1) + 1, padding[1])
    N, C, K = (draw(st.integers(1, 3)), draw(st.integers(1, max_channels)),
               draw(st.integers(1, max_channels)))
    layout = draw(st.sampled_from(("NCHW", "NHWC")))
    x_shape = (N, C, H, W) if layout == "NCHW" else (N, H, W, C)
    return dict(x_shape=x_shape, w_shape=(K, C, R, S), stride=(1, 1), padding=padding,
                dilation=dilation, groups=1, layout=layout)


# ---------------------------------------------------------------------- convolution: polyphase

@st.composite
def polyphase_conv_problems(draw, max_channels=6, max_filter=4):
    """Keyword arguments of a dilated stride-1 conv2d problem that "polyphase"
    decomposes: dilation (dh, dw) in 1..3 (not both 1), padding a multiple of it
    (0..2 dilations), H, W multiples of it with the phase sub-image from
    {1, 3, 7, 13} (or the smallest that fits), groups 1, 2 or depthwise."""
    dilation = draw(st.tuples(st.integers(1, 3), st.integers(1, 3)).filter(lambda d: d != (1, 1)))
    R, S = draw(st.integers(1, max_filter)), draw(st.integers(1, max_filter))
    multiples = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    padding = (multiples[0] * dilation[0], multiples[1] * dilation[1])

    def spatial(taps, pad_multiple, d):
        # The sub-image (size / d) must hold the filter with its padding: size/d + 2 pad/d >= taps.
        smallest = max(1, taps - 2 * pad_multiple)
        choices = [n for n in (1, 3, 7, 13) if n >= smallest]
        return d * draw(st.sampled_from(choices) if choices else st.integers(smallest, smallest + 3))

    H, W = spatial(R, multiples[0], dilation[0]), spatial(S, multiples[1], dilation[1])
    groups = draw(st.sampled_from((1, 1, 2, "depthwise")))
    if groups == "depthwise":
        C = draw(st.integers(1, max_channels))
        groups, K = C, C * draw(st.integers(1, 2))
    else:
        C = groups * draw(st.integers(1, max(1, max_channels // groups)))
        K = groups * draw(st.integers(1, max(1, max_channels // groups)))
    N = draw(st.integers(1, 3))
    layout = draw(st.sampled_from(("NCHW", "NHWC")))
    x_shape = (N, C, H, W) if layout == "NCHW" else (N, H, W, C)
    return dict(x_shape=x_shape, w_shape=(K, C // groups, R, S), stride=(1, 1), padding=padding,
                dilation=dilation, groups=groups, layout=layout)
