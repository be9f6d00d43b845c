"""The convolution algorithm registry.

A convolution call is described once, after validation, by a :class:`ConvProblem`
(a small frozen dataclass: shapes, options, layout, dtype).  That problem is the
key for choosing an algorithm, for caches and for benchmarks.  Each algorithm is
a :class:`ConvAlgorithm` in :data:`REGISTRY`: it says which problems and
directions it supports (and why not), how much workspace it needs, and how to
run.  ``algo="auto"`` resolves through :func:`choose` (:func:`explain_auto`: the
measured table of :mod:`.table`, else the rule :func:`auto_preferences`);
``algo="find"`` times the candidates once per problem (:mod:`.find`).

What the caller allows is a :class:`ConvOptions` (workspace limit, precision,
determinism); :func:`admits` applies it on top of ``supports``, so "auto",
"find" and an explicit name all see the same candidate set.

Directions and the arrays ``run`` receives (all C-contiguous, on the device):

    "forward"          a = x,  b = w,  out = y
    "backward_data"    a = dy, b = w,  out = dx
    "backward_filter"  a = x,  b = dy, out = dw
"""
import dataclasses

DIRECTIONS = ("forward", "backward_data", "backward_filter")


@dataclasses.dataclass(frozen=True)
class ConvProblem:
    """One 2-D convolution: x (N, C, H, W) * w (K, C/groups, R, S) -> y (N, K, P, Q).

    Shapes are given in NCHW terms whatever the layout; ``layout`` says how x, y,
    dx and dy are stored ("NCHW" or "NHWC").  Filters are always KCRS."""
    N: int
    C: int
    H: int
    W: int
    K: int
    R: int
    S: int
    P: int
    Q: int
    stride: tuple
    padding: tuple
    dilation: tuple
    groups: int
    layout: str
    dtype: str

    @property
    def x_shape(self):
        return (self.N, self.C, self.H, self.W) if self.layout == "NCHW" else (self.N, self.H, self.W, self.C)

    @property
    def y_shape(self):
        return (self.N, self.K, self.P, self.Q) if self.layout == "NCHW" else (self.N, self.P, self.Q, self.K)

    @property
    def w_shape(self):
        return (self.K, self.C // self.groups, self.R, self.S)

    @property
    def flops(self):
        """Multiply-adds times two, for one direction (all three are the same)."""
        return 2 * self.N * self.K * self.P * self.Q * (self.C // self.groups) * self.R * self.S


PRECISIONS = ("default", "strict")


@dataclasses.dataclass(frozen=True)
class ConvOptions:
    """What the caller allows an algorithm to do; part of every choice and cache key.

    ``workspace_limit``: bytes of device workspace an algorithm may allocate
    (None: no limit).  ``precision="strict"``: only algorithms whose error stays
    within the float32 direct-convolution bound (2e-5 normwise; Winograd
    F(4x4, 3x3), measured at 3.4e-6 for C <= 512, stays within it).  ``deterministic=True``: only algorithms that give the same
    bits on every run (no floating-point atomics)."""
    workspace_limit: object = None
    precision: str = "default"
    deterministic: bool = False


DEFAULT_OPTIONS = ConvOptions()


class ConvAlgorithm:
    """Base class: one way of computing some directions of a convolution.

    Subclasses override ``supports``, ``workspace_bytes`` and ``run``, and set
    the class attributes below where they differ from the defaults."""

    name = None
    directions = DIRECTIONS
    deterministic = True      # same bits every run (no atomics in the reduction)
    strict = True             # error within the float32 direct bound (precision="strict")
    fused_activations = frozenset()   # activation modes applied in the forward epilogue

    def supports(self, problem, direction):
        """(True, "") or (False, reason a user can read)."""
        if direction not in self.directions:
            return False, f"it has no {direction} implementation"
        return True, ""

    def workspace_bytes(self, problem, direction):
        return 0

    def run(self, problem, direction, a, b, out, bias=None, activation=None):
        """Compute into ``out`` (allocated by the caller, same dtype) and return it.
        ``bias`` (forward only, length K, or None) is added to y.  ``activation``
        (forward only) is None or ``(mode, alpha)`` with mode in
        ``fused_activations``: applied to ``y + bias`` in the epilogue."""
        raise NotImplementedError

    def under(self, options):
        """This algorithm as it runs under the caller's ``options`` (what
        :func:`admits` checks and :func:`choose` returns): itself.  An algorithm
        that delegates to an inner choice ("polyphase") returns its instance for
        those options, whose inner choice obeys them."""
        return self

    def explain(self, problem, direction):
        """Text ``explain_auto`` appends to its reason when it picks this
        algorithm: "" (an algorithm with an inner choice names it)."""
        return ""

    def prepare(self, problem, direction, has_bias=False, activation=None):
        """A callable ``(a, b, out, bias)`` that computes this problem into ``out``
        on the current device: what a repeated call runs (conv.py's fast path).
        The default calls :meth:`run`; an algorithm whose cached plan is one or
        two kernel launches overrides it with prepared launches
        (``_kernels.PreparedLaunch``), leaving only the pointers to write."""
        def run(a, b, out, bias=None):
            return self.run(problem, direction, a, b, out, bias=bias, activation=activation)
        return run

    def prepared(self, problem, direction, has_bias=False, activation=None):
        """:meth:`prepare`, cached per (current device, problem, direction,
        has_bias, activation): for a ``run`` written as ``prepared(...)(a, b, out, bias)``."""
        import cupy

        cache = self.__dict__.setdefault("_prepared_cache", {})
        key = (cupy.cuda.runtime.getDevice(), problem, direction, has_bias, activation)
        launch = cache.get(key)
        if launch is None:
            if len(cache) >= 4096:
                cache.clear()
            launch = cache[key] = self.prepare(problem, direction, has_bias, activation)
        return launch


def admits(algorithm, problem, direction, options=DEFAULT_OPTIONS):
    """(True, "") if ``algorithm`` supports the problem and the caller's options
    allow it, else (False, reason)."""
    algorithm = algorithm.under(options)
    ok, reason = algorithm.supports(problem, direction)
    if not ok:
        return ok, reason
    if options.deterministic and not algorithm.deterministic:
        return False, "it reduces with atomics (not bit-reproducible) and deterministic=True"
    if options.precision == "strict" and not algorithm.strict:
        return False, "its rounding error exceeds the float32 direct bound and precision='strict'"
    if options.workspace_limit is not None:
        need = algorithm.workspace_bytes(problem, direction)
        if need > options.workspace_limit:
            return False, f"it needs {need} bytes of workspace, over workspace_limit={options.workspace_limit}"
    return True, ""


REGISTRY = {}

# Above this much column-matrix workspace, "auto" prefers "direct" to "gemm".
AUTO_GEMM_WORKSPACE_LIMIT = 256 * 2**20


def register(algorithm):
    """Add an algorithm instance to the registry under its name."""
    if algorithm.name in REGISTRY:
        raise ValueError(f"a convolution algorithm named {algorithm.name!r} is already registered")
    REGISTRY[algorithm.name] = algorithm
    _auto_choices.clear()
    return algorithm


# At or above this GEMM depth (C/groups * R * S) "auto" prefers cuBLAS ("gemm")
# to implicit_gemm for float32: measured on the H100 (notes/convolution.md, v1),
# cuBLAS wins the deep late layers (r50_5_3x3, vgg_4_2 backward) and ties the rest.
AUTO_IMPLICIT_GEMM_MAX_DEPTH = 2304


# Winograd goes first for 3x3 stride-1 ungrouped float32 forward / backward
# data with at least this many input and output channels and this much direct
# work (FLOPs).  Measured on the H100 (notes/conv_wino.md): it beats cuDNN on
# 16 of 18 batch-32 cases of the public set (C = K = 64..512, >= 7.4 GFLOP);
# on the batch-1 layers (<= 3.7 GFLOP) its five launches per call cost more
# than implicit GEMM's one, and with fewer channels the GEMMs are too thin
# for the saved multiplications to pay for the transforms' memory traffic.
AUTO_WINOGRAD_MIN_CHANNELS = 64
AUTO_WINOGRAD_MIN_FLOPS = 4e9

# "auto" tries "fft" first for ungrouped stride-1 float32 problems with
# filters of at least AUTO_FFT_MIN_FILTER taps a side and at least
# AUTO_FFT_MIN_FLOPS of direct-convolution work, in every direction, when its
# workspace fits AUTO_FFT_WORKSPACE_LIMIT.  Measured on the H100
# (notes/conv_fft.md): "fft" beats our other algorithms by 1.4-18x on
# big_7x7_s1 / big_11x11_s1 / alex_conv2_5x5 at batch 32 (14-40 GFLOP), and
# loses 2-4x at batch 1 (1-1.3 GFLOP), where ~0.4 ms of fixed cost (host
# overhead of its ~15 CuPy calls) dominates.  "fft_tiled" (bounded workspace)
# is never picked by "auto": its chunks were slower than implicit_gemm on
# every measured problem; name it, or let "find" time it.
# "dft" (same spectra, transforms as dense DFT GEMMs: no pad / crop passes,
# no cuFFT) goes before "fft" under the same conditions: in one H100 run at
# batch 32 (notes/conv_large.md) it beat "fft" on big_7x7_s1 by 1.4-1.7x in
# all three directions and on alex_conv2_5x5 backward filter by 1.5x, and
# tied it on alex_conv2_5x5 forward / backward data (0.52 vs 0.53 ms, 0.49 vs
# 0.47).  The measured table decides first where it has entries.
AUTO_FFT_MIN_FILTER = 5
AUTO_FFT_MIN_FLOPS = 8e9
AUTO_FFT_WORKSPACE_LIMIT = 1 << 30


def _fft_preferences(problem, direction):
    p = problem
    if not (p.dtype == "float32" and p.groups == 1 and p.stride == (1, 1) and p.dilation == (1, 1)
            and min(p.R, p.S) >= AUTO_FFT_MIN_FILTER and p.flops >= AUTO_FFT_MIN_FLOPS):
        return []
    prefs = []
    for name, what in (("dft", "Fourier domain, dense-DFT transforms on cuBLAS"), ("fft", "FFT")):
        algorithm = REGISTRY.get(name)
        if algorithm is not None and algorithm.workspace_bytes(p, direction) <= AUTO_FFT_WORKSPACE_LIMIT:
            prefs.append((name, f"stride-1 {p.R}x{p.S} float32, {p.flops / 1e9:.0f} GFLOP of direct "
                                f"work: {what} (spectra within AUTO_FFT_WORKSPACE_LIMIT)"))
    return prefs



# Grouped backward filter goes to "implicit_gemm_wgrad" from this many filters
# per group (half of a 64-row tile).
WGRAD_MIN_GROUP_FILTERS = 32


def winograd_wins(problem, direction):
    """The stand-in rule's Winograd case (see :func:`auto_preferences`)."""
    p = problem
    return (direction in ("forward", "backward_data") and p.dtype == "float32" and p.groups == 1
            and (p.R, p.S) == (3, 3) and p.stride == (1, 1) and p.dilation == (1, 1)
            and min(p.C, p.K) >= AUTO_WINOGRAD_MIN_CHANNELS and p.flops >= AUTO_WINOGRAD_MIN_FLOPS)


# The 5x5 Winograd case reaches further down than the 3x3 one for forward and
# backward data: at batch 1, alex_conv2_5x5 (0.45 GFLOP) runs in 0.031-0.034 ms by
# Winograd against cuDNN's 0.036-0.044 (H100, notes/wino5b.md), and the shipped
# table's batch-1 5x5 points pick winograd_f2x2_5x5 on most float32 shapes with
# C, K >= 64 (gemm / implicit GEMM 1.5-2.5x slower there).  Backward filter keeps
# AUTO_WINOGRAD_MIN_FLOPS: at batch 1 the table's picks are split between
# implicit_gemm_wgrad and the Winograd ones.
AUTO_WINOGRAD_5X5_MIN_FLOPS = 4e8


def winograd_5x5_wins(problem, direction):
    """The stand-in rule's case for Winograd on 5x5 filters (see
    :func:`auto_preferences`): stride 1, dilation 1, ungrouped, float32, C, K >=
    AUTO_WINOGRAD_MIN_CHANNELS, and at least AUTO_WINOGRAD_5X5_MIN_FLOPS of direct
    work (forward / backward data) or AUTO_WINOGRAD_MIN_FLOPS (backward filter).
    Which variant: :func:`_winograd_5x5_preferences`."""
    p = problem
    least = AUTO_WINOGRAD_MIN_FLOPS if direction == "backward_filter" else AUTO_WINOGRAD_5X5_MIN_FLOPS
    return (p.dtype == "float32" and p.groups == 1 and (p.R, p.S) == (5, 5) and p.stride == (1, 1)
            and p.dilation == (1, 1) and min(p.C, p.K) >= AUTO_WINOGRAD_MIN_CHANNELS
            and p.flops >= least)


def _winograd_5x5_preferences(problem, direction):
    """The 5x5 Winograd variants in the order measured on the H100 (notes/wino5b.md,
    alex_conv2_5x5, ms; cuDNN in brackets):
    batch 32 forward F(4x4, 5x5) 0.156, F(3x3, 5x5) 0.178, F(2x2, 5x5) 0.293 (0.123);
    backward data 0.137, 0.157, 0.257 (0.117); backward filter F(5x5, 4x4) 0.150,
    F(5x5, 3x3) 0.178, F(5x5, 2x2) 0.276 (0.095): the larger tile first (fewer, and
    deeper-amortised, GEMM multiplies; 2.2x less transformed data than m = 2).
    Batch 1 (under AUTO_WINOGRAD_MIN_FLOPS): forward 0.033 / 0.032 / 0.031 for
    m = 2 / 3 / 4 (a tie), backward data 0.034 / 0.048 / 0.049 (F(4x4)'s 49 tiles
    an image leave its transform grids a few blocks): F(2x2, 5x5) first."""
    if not winograd_5x5_wins(problem, direction):
        return []
    reason = (f"5x5 stride 1, float32, C and K >= {AUTO_WINOGRAD_MIN_CHANNELS}, "
              f"{problem.flops / 1e9:.2g} GFLOP: Winograd ")
    if direction == "backward_filter":
        return [(f"winograd_wgrad_f5x5_{m}x{m}", reason + f"F(5x5, {m}x{m})") for m in (4, 3, 2)]
    order = (4, 3, 2) if problem.flops >= AUTO_WINOGRAD_MIN_FLOPS else (2, 4, 3)
    return [(f"winograd_f{m}x{m}_5x5", reason + f"F({m}x{m}, 5x5)") for m in order]


def winograd_wgrad_wins(problem, direction):
    """The stand-in rule's Winograd backward-filter case (see :func:`auto_preferences`):
    the same problems as :func:`winograd_wins`, for backward filter.  Measured on
    the H100 (notes/wino_wgrad.md): on the nine batch-32 layers F(3x3, 4x4) is
    the fastest of ours on seven and within 6 % on the other two (F(3x3, 2x2)
    there), 1.7-5.1x faster than implicit_gemm_wgrad, 0.52-2.26x cuDNN."""
    return direction == "backward_filter" and winograd_wins(problem, "forward")


# "polyphase" needs at least this much direct work (FLOPs) before "auto" takes it
# (when its inner pick cannot run the dilated problem itself).  Measured on the
# H100 (notes/polyphase.md): dilated_3x3_d2 at batch 32 (29.6 GFLOP) runs in
# 0.42 ms by polyphase + Winograd, 2.1-2.4x cuDNN and 2.2-2.9x our previous pick,
# in all three directions; at batch 1 (0.92 GFLOP) its two CuPy layout copies
# (~30 us of host time each, whatever the size) make it 0.12-0.19 ms against
# 0.14-0.16 for gemm and 0.064 for implicit_gemm_wgrad (backward filter); below
# the threshold the table's ranking at the undilated twin decides
# (:func:`_undilated_twin_preferences`: implicit_gemm_splitk 0.060 ms there, session 9).
AUTO_POLYPHASE_MIN_FLOPS = 4e9


def _polyphase_preferences(problem, direction, options):
    """The rule's dilated case, for stride-1 problems whose padding and image
    are multiples of the dilation (what "polyphase" supports), depthwise
    excepted.  Its dilation-1 sub-problem (the phases stacked into the batch)
    goes to ``auto`` -- the measured table, which has no dilated entries, and
    the rule's Winograd / FFT cases, which run no dilated filter.  If that pick
    under the caller's ``options`` runs the dilated problem itself (implicit
    GEMM, gemm: the same work either way), it goes first as it is, without the
    two layout copies.  Otherwise "polyphase", whose inner pick is made under
    the workspace limit less the stacked buffers: if that pick runs the dilated
    problem itself, it goes first as it is; if it is the "direct" fallback,
    nothing; else "polyphase" with it inside, given at least
    AUTO_POLYPHASE_MIN_FLOPS of direct work (notes/polyphase.md).
    Depthwise is memory-bound and its kernel runs any dilation: the copies
    would add two passes over x and y."""
    algorithm = REGISTRY.get("polyphase")
    if problem.dilation == (1, 1) or problem.groups == problem.C:
        return []
    if algorithm is None or not algorithm.supports(problem, direction)[0]:
        return _undilated_twin_preferences(problem, direction, options)
    from .polyphase import sub_problem
    sub, (dh, dw) = sub_problem(problem), problem.dilation
    what = (f"dilation {problem.dilation}, stride 1, padding and image multiples of it: the "
            f"{dh * dw} phase sub-images stacked into the batch ({sub.N} x {sub.H}x{sub.W}) are one "
            f"dilation-1 problem")

    def as_it_is(pick):
        return [(pick.name, what + f"; auto's pick for it, {pick.name}, runs the dilated filter "
                                   f"itself (no layout copies)")]

    # A direct run allocates no stacked buffers: its pick is made under the caller's own limit.
    pick = REGISTRY[explain_auto(sub, direction, options)[0]].under(options)
    if pick.name != "direct" and admits(pick, problem, direction, options)[0]:
        return as_it_is(pick)
    if not admits(algorithm, problem, direction, options)[0]:
        return []
    inner = algorithm.under(options).inner(problem, direction)[0]
    if inner.name == "direct":
        return _undilated_twin_preferences(problem, direction, options)
    if admits(inner, problem, direction, options)[0]:
        return as_it_is(inner)
    if problem.flops < AUTO_POLYPHASE_MIN_FLOPS:
        return _undilated_twin_preferences(problem, direction, options)
    return [("polyphase", what + f"; {problem.flops / 1e9:.3g} GFLOP of direct "
                                 f"work >= AUTO_POLYPHASE_MIN_FLOPS")]


def _undilated_twin_preferences(problem, direction, options):
    """Where "polyphase" does not run a dilated problem (or does not pay): the
    measured table's ranking at its undilated twin (the same shapes, P and Q
    included, with dilation 1), keeping the algorithms that run the dilated
    filter themselves at the twin's cost -- an implicit GEMM or im2col gathers
    other taps for the same work, so the twin's times hold for them.  The table
    has no dilated entries; without this the rule picked "gemm", which at batch 1
    (ResNet-style dilated 3x3, C = K = 256, 28x28) measured 0.10 ms against 0.060
    for implicit_gemm_splitk and cuDNN's 0.060 (notes/dilated_ab.py, session 9).

    "The same work" is checked by the workspace: an algorithm that needs more at
    the dilated problem than at the twin is refused (the FFT family transforms the
    dilated filter's whole extent: DeepLab's 3x3 dilation 12 on 65x65 needs 20-23 GB
    for "fft" / "fft_tiled" / "dft" against 0.8-13 GB at the twin, whose times say
    nothing about it; review9).  Table.explain also applies the tuner's workspace
    bound (FIND_WORKSPACE_LIMIT) where the caller sets no limit."""
    from . import table
    measured = table.current()
    if measured is None:
        return []
    twin = dataclasses.replace(problem, dilation=(1, 1))

    def admits_at_the_twins_work(algorithm, p, direction, options):
        ok, why = admits(algorithm, p, direction, options)
        if ok:
            need, there = (algorithm.under(options).workspace_bytes(q, direction) for q in (p, twin))
            if need > there:
                return False, (f"the dilation grows its workspace ({need} bytes, {there} at the twin): "
                               f"not the work the twin measured")
        return ok, why

    choice = measured.explain(problem, direction, options, REGISTRY, admits_at_the_twins_work, ranked_as=twin)
    if choice is None:
        return []
    name, reason = choice
    return [(name, "dilated: the table's ranking at the undilated twin, among algorithms that run the "
                   "dilated filter -- " + reason)]


def auto_preferences(problem, direction, options=DEFAULT_OPTIONS):
    """The documented rule for problems the measured table does not cover
    (:mod:`.table`): an ordered list of (name, reason); ``auto`` takes the
    first one that :func:`admits` the problem under the caller's ``options``.

    In order (each measured on the H100; see notes/conv_*.md):
    1. "depthwise" for depthwise problems (groups == C, any multiplier).
    2. "winograd_wgrad_f3x3_4x4", then "winograd_wgrad_f3x3_2x2", for backward
       filter of the problems of step 4 (:func:`winograd_wgrad_wins`):
       transforms of x and dy tiles, one cuBLAS GEMM per transform point over
       all tiles, deterministic.  Then "implicit_gemm_wgrad" (deterministic split-K) for backward filter,
       ungrouped, or grouped with at least WGRAD_MIN_GROUP_FILTERS filters
       per group (smaller groups would leave the GEMM tiles mostly empty).
       It beat im2col + cuBLAS on all 26 non-depthwise batch-32 problems.
    3. "implicit_gemm_subpixel" for backward data with stride > 1: for half
       types, and for ungrouped float32 where ``subpixel_pays`` (wide
       channels, every phase has taps).
    4. "winograd_f4x4_3x3", then "winograd_f2x2_3x3" (F(2x2) where a
       workspace limit excludes F(4x4)) for 3x3 stride-1 ungrouped float32
       forward and backward data with C, K >= AUTO_WINOGRAD_MIN_CHANNELS and
       at least AUTO_WINOGRAD_MIN_FLOPS of direct work (:func:`winograd_wins`).
    5. "implicit_gemm" (its tile by its own rule) for half types always (it
       accumulates float32 tiles; the alternatives are far slower) and for
       ungrouped float32 problems -- except GEMMs at least
       AUTO_IMPLICIT_GEMM_MAX_DEPTH deep whose im2col workspace fits
       AUTO_GEMM_WORKSPACE_LIMIT (and the caller's workspace limit), where
       cuBLAS is faster.
    6. "gemm" (im2col + cuBLAS) for ungrouped problems whose workspace fits
       AUTO_GEMM_WORKSPACE_LIMIT.
    7. "direct": the fallback that supports every problem.
    Before all of them, for dilated stride-1 problems "polyphase" supports
    (depthwise excepted), ``auto``'s pick for the dilation-1 sub-problem: as it
    is where it runs dilated filters, else inside "polyphase" from
    AUTO_POLYPHASE_MIN_FLOPS of work (:func:`_polyphase_preferences`), else the measured
    table's ranking at the problem's undilated twin among algorithms that run
    dilated filters (:func:`_undilated_twin_preferences`); then the 5x5 Winograd
    variants (forward, backward data: "winograd_f4x4_5x5", "winograd_f3x3_5x5", "winograd_f2x2_5x5", F(2x2) first
    under AUTO_WINOGRAD_MIN_FLOPS; backward filter: "winograd_wgrad_f5x5_4x4",
    "_3x3", "_2x2") for 5x5 problems of the Winograd conditions
    (:func:`winograd_5x5_wins`, :func:`_winograd_5x5_preferences`), then "dft" then "fft" for
    large stride-1 ungrouped float32 problems with filters of at least
    AUTO_FFT_MIN_FILTER taps a side (:func:`_fft_preferences`)."""
    from .implicit_gemm_backward import subpixel_pays
    prefs = (_polyphase_preferences(problem, direction, options)
             + _winograd_5x5_preferences(problem, direction) + _fft_preferences(problem, direction))
    if problem.groups == problem.C:
        prefs.append(("depthwise", "depthwise (groups == C): memory-bound, dedicated kernels"))
    half = problem.dtype in ("float16", "bfloat16")
    if winograd_wgrad_wins(problem, direction):
        reason = (f"backward filter, 3x3 stride 1, float32, C and K >= {AUTO_WINOGRAD_MIN_CHANNELS}, "
                  f">= {AUTO_WINOGRAD_MIN_FLOPS:.0e} FLOPs: Winograd")
        prefs += [("winograd_wgrad_f3x3_4x4", reason + " F(3x3, 4x4)"),
                  ("winograd_wgrad_f3x3_2x2", reason + " F(3x3, 2x2)")]
    if direction == "backward_filter" and (problem.groups == 1 or
                                           problem.K // problem.groups >= WGRAD_MIN_GROUP_FILTERS):
        prefs.append(("implicit_gemm_wgrad", "backward filter: split-K implicit GEMM over N*P*Q, "
                                             "deterministic"))
    depthwise = problem.K == problem.groups and problem.C == problem.groups
    if direction == "backward_data" and problem.stride != (1, 1) and not depthwise and (
            half or (problem.groups == 1 and subpixel_pays(problem))):
        prefs.append(("implicit_gemm_subpixel", "backward data with stride > 1: one implicit GEMM "
                                                "per output phase, no work on inserted zeros"))
    gemm = REGISTRY.get("gemm")
    # Within the caller's limit too: where that refuses gemm, implicit GEMM must stay listed.
    gemm_limit = AUTO_GEMM_WORKSPACE_LIMIT if options.workspace_limit is None else \
        min(AUTO_GEMM_WORKSPACE_LIMIT, options.workspace_limit)
    gemm_fits = (gemm is not None and problem.groups == 1 and gemm.supports(problem, direction)[0]
                 and gemm.workspace_bytes(problem, direction) <= gemm_limit)
    depth = (problem.C // problem.groups if direction == "forward" else problem.K // problem.groups) \
        * problem.R * problem.S
    if winograd_wins(problem, direction):
        reason = (f"3x3 stride 1, float32, C and K >= {AUTO_WINOGRAD_MIN_CHANNELS}, "
                  f">= {AUTO_WINOGRAD_MIN_FLOPS:.0e} FLOPs: Winograd")
        prefs += [("winograd_f4x4_3x3", reason + " F(4x4)"), ("winograd_f2x2_3x3", reason + " F(2x2)")]
    if half:
        prefs.append(("implicit_gemm", "half type: implicit GEMM accumulates float32 tiles"))
    elif problem.groups == 1 and not (gemm_fits and depth >= AUTO_IMPLICIT_GEMM_MAX_DEPTH):
        prefs.append(("implicit_gemm", f"ungrouped float32, GEMM depth {depth} < {AUTO_IMPLICIT_GEMM_MAX_DEPTH}"
                      if depth < AUTO_IMPLICIT_GEMM_MAX_DEPTH else
                      f"ungrouped float32, GEMM depth {depth}, gemm's im2col workspace over the limit"))
    if gemm_fits:
        prefs.append(("gemm", "ungrouped, im2col workspace within AUTO_GEMM_WORKSPACE_LIMIT"))
    prefs.append(("direct", "fallback: grouped/depthwise, or no faster algorithm admits this problem"))
    return prefs


# (problem, direction, options, number of registered algorithms) -> (name, reason):
# "auto" decides once per problem, then a call costs one dict lookup.
_auto_choices = {}
_AUTO_CHOICES_SIZE = 4096


# Clear functions of other caches that hold an "auto" choice (conv.py's call memo
# and fast table), so that a new table takes effect on calls already made.
CHOICE_HOLDERS = []


def forget_choices():
    """Drop the memoised "auto" choices (after the table or the registry changed)."""
    _auto_choices.clear()
    for clear in CHOICE_HOLDERS:
        clear()


def explain_auto(problem, direction, options=DEFAULT_OPTIONS):
    """(name, reason) of the algorithm ``algo="auto"`` picks under ``options``.

    The measured table (:mod:`.table`) decides where it has entries with the
    problem's categorical features near enough and one of the algorithms they
    rank is admitted; otherwise the rule :func:`auto_preferences` does.
    Memoised: a repeated problem costs one dict lookup."""
    key = (problem, direction, options, len(REGISTRY))
    choice = _auto_choices.get(key)
    if choice is None:
        if len(_auto_choices) >= _AUTO_CHOICES_SIZE:
            _auto_choices.clear()
        choice = _auto_choices[key] = _explain_auto(problem, direction, options)
    return choice


def _explain_auto(problem, direction, options):
    from . import table
    measured = table.current()
    if measured is not None:
        choice = measured.explain(problem, direction, options, REGISTRY, admits)
        if choice is not None:
            name, reason = choice
            return name, reason + REGISTRY[name].under(options).explain(problem, direction)
    for name, reason in auto_preferences(problem, direction, options):
        algorithm = REGISTRY.get(name)
        if algorithm is not None and admits(algorithm, problem, direction, options)[0]:
            return name, "rule: " + reason + algorithm.under(options).explain(problem, direction)
    raise ValueError(f"no convolution algorithm admits this {direction} problem under {options}")


def auto_rule(problem, direction, options=DEFAULT_OPTIONS):
    """The name ``algo="auto"`` picks (see :func:`explain_auto`)."""
    return explain_auto(problem, direction, options)[0]


def choose(problem, direction, algo="auto", gpu=False, options=DEFAULT_OPTIONS):
    """The algorithm that runs ``direction`` of ``problem`` for a user's ``algo``.

    ``algo="find"`` times the candidates on the current GPU once per problem
    (:mod:`dnnprims.algos.find`) when ``gpu`` is true; on the NumPy path it
    means "auto" (the reference runs whatever is chosen).
    Raises ValueError for an unknown name or one that does not support the
    problem, saying why."""
    if not isinstance(algo, str):
        raise TypeError(f"algo must be a string, got {type(algo).__name__}")
    if algo == "find":
        from .find import find
        algo = find(problem, direction, options) if gpu else auto_rule(problem, direction, options)
    elif algo == "auto":
        algo = auto_rule(problem, direction, options)
    algorithm = REGISTRY.get(algo)
    if algorithm is None:
        raise ValueError(f"algo must be 'auto', 'find' or one of {', '.join(map(repr, REGISTRY))}, "
                         f"got {algo!r}")
    ok, reason = admits(algorithm, problem, direction, options)
    if not ok:
        raise ValueError(f"algo {algo!r} does not support this {direction} problem: {reason}")
    return algorithm.under(options)


# Importing the algorithm modules registers them (and declares their kernel
# families for _kernels.families()).
from . import direct, fft, gemm, implicit_gemm, implicit_gemm_backward, winograd  # noqa: E402,F401
from . import dft  # noqa: E402,F401  (after fft: it reuses its filter-spectrum kernel)
from . import depthwise  # noqa: E402,F401  (registered after the general algorithms)
from . import polyphase  # noqa: E402,F401  (its inner choice is auto over the others)
