"""The convolution algorithm registry.

A convolution call is described once, after validation, by a :class:`ConvProblem`
(a small frozen dataclass: shapes, options, layout, dtype).  That problem is the
key for choosing an algorithm, for caches and for benchmarks.  Each algorithm is
a :class:`ConvAlgorithm` in :data:`REGISTRY`: it says which problems and
directions it supports (and why not), how much workspace it needs, and how to
run.  ``algo="auto"`` resolves through :func:`choose`.

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


class ConvAlgorithm:
    """Base class: one way of computing some directions of a convolution."""

    name = None
    directions = DIRECTIONS

    def supports(self, problem, direction):
        """(True, "") or (False, reason a user can read)."""
        if direction not in self.directions:
            return False, f"it has no {direction} implementation"
        return True, ""

    def workspace_bytes(self, problem, direction):
        return 0

    def run(self, problem, direction, a, b, out, bias=None):
        """Compute into ``out`` (allocated by the caller, same dtype) and return it.
        ``bias`` (forward only, length K, or None) is added to y."""
        raise NotImplementedError


REGISTRY = {}

# Above this much column-matrix workspace, "auto" prefers "direct" to "gemm".
AUTO_GEMM_WORKSPACE_LIMIT = 256 * 2**20


def register(algorithm):
    """Add an algorithm instance to the registry under its name."""
    if algorithm.name in REGISTRY:
        raise ValueError(f"a convolution algorithm named {algorithm.name!r} is already registered")
    REGISTRY[algorithm.name] = algorithm
    return algorithm


def auto_rule(problem, direction):
    """The name ``algo="auto"`` picks: a stand-in rule until the measured
    heuristic table (issue 3) replaces it.

    "gemm" (im2col + cuBLAS) for ungrouped problems it supports (float32,
    float64) whose workspace fits AUTO_GEMM_WORKSPACE_LIMIT -- there the GEMM
    does the heavy lifting far faster than a thread per output; "direct"
    otherwise: grouped and depthwise problems (tiny GEMMs), half types, and
    as the fallback that supports every problem."""
    gemm = REGISTRY.get("gemm")
    if (gemm is not None and problem.groups == 1 and gemm.supports(problem, direction)[0]
            and gemm.workspace_bytes(problem, direction) <= AUTO_GEMM_WORKSPACE_LIMIT):
        return "gemm"
    return "direct"


def choose(problem, direction, algo="auto"):
    """The algorithm that runs ``direction`` of ``problem`` for a user's ``algo``.

    Raises ValueError for an unknown name or one that does not support the
    problem, saying why."""
    if not isinstance(algo, str):
        raise TypeError(f"algo must be a string, got {type(algo).__name__}")
    if algo == "auto":
        algo = auto_rule(problem, direction)
    algorithm = REGISTRY.get(algo)
    if algorithm is None:
        raise ValueError(f"algo must be 'auto' or one of {', '.join(map(repr, REGISTRY))}, got {algo!r}")
    ok, reason = algorithm.supports(problem, direction)
    if not ok:
        raise ValueError(f"algo {algo!r} does not support this {direction} problem: {reason}")
    return algorithm


# Importing the algorithm modules registers them (and declares their kernel
# families for _kernels.families()).
from . import direct, gemm  # noqa: E402,F401
