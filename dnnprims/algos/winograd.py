"""The "winograd" algorithms: Winograd minimal filtering F(m x m, r x r) for r x r
filters, stride 1, dilation 1, any padding, groups 1; forward and backward data,
and F(r x r, m x m) for backward filter (kernels/conv_winograd.cu).  Registered
(m, r) pairs: VARIANTS -- F(2x2, 3x3), F(4x4, 3x3), F(2x2, 5x5), F(3x3, 5x5),
F(4x4, 5x5) -- each in both roles; one code path, the kernels templated on
(M, R).  Below, r = 3 for brevity: replace 3 by r,
alpha = m + 2 by alpha = m + r - 1, 9 by r^2 and padding 2 - p by r - 1 - p.

Structure (three stages; Lavin and Gray, "Fast Algorithms for Convolutional
Neural Networks", 2016):

    U[a, k, c] = (G g[k, c] G^T)[a]              filter transform (workspace)
    V[a, c, t] = (B^T d[c, t] B)[a]              input transform, one alpha x alpha
                                                 tile d of the input per output tile t
    M[a]       = U[a] @ V[a]                     alpha^2 GEMMs (cuBLAS strided-batched, dnnprims._cublas)
    y[k, t]    = A^T M[:, k, t] A  (+ bias)      output transform, an m x m output tile

with alpha = m + 2.  A GEMM multiply-add does the work of 9 m^2 / alpha^2 direct
ones: 2.25 for F(2x2, 3x3), 4 for F(4x4, 3x3).  The workspace holds U, V and M
in the accumulation type (float32 for float16/bfloat16/float32 storage: the
GEMMs are float32 cuBLAS, strict fp32 unless CUPY_TF32=1; float64 for float64);
the batch runs in chunks whose V and M stay under ``WORKSPACE_BOUND`` bytes.
NHWC stores V as (a, t, c) and M as (a, t, k) so that every stage reads and
writes along channels; the GEMM is then V @ U^T.

Backward filter ("winograd_wgrad_f3x3_2x2", "winograd_wgrad_f3x3_4x4";
:class:`WinogradBackwardFilter`) is F(3x3, m x m): dw[k, c] is the correlation of
x with dy, so per tile the 3x3 gradient is F(3, m) with the m x m dy tile as the
"filter" (:func:`wgrad_toom_cook`), and the sum over all N * tiles moves inside
the inverse transform:

    Xt[a, c, t] = (B^T x[c, t] B)[a]             alpha x alpha tile of x (the forward B^T)
    Dt[a, k, t] = (G dy[k, t] G^T)[a]            m x m tile of dy
    Mw[a]       = Dt[a] @ Xt[a]^T                alpha^2 GEMMs of depth N * tiles, the depth
                                                 split into runs that are batch entries too
    dw[k, c]    = A^T (sum of the runs of Mw[:, k, c]) A     3 x 3

A GEMM multiply-add stands for 9 m^2 / alpha^2 direct ones, as forward.

Backward data of a 3x3 stride-1 convolution is a 3x3 stride-1 convolution of
dy with the filter rotated by 180 degrees, C and K swapped, padding 2 - p (the
filter transform reads the rotated filter; nothing is copied).

The transforms are derived here, in exact rational arithmetic, from the
interpolation points (:func:`toom_cook`); ``kernels/conv_winograd_matrices.cuh``
is generated from them (``python -m dnnprims.algos.winograd`` rewrites it, and
a test checks it is current).  :func:`emulate` and :func:`emulate_wgrad` run
the same stages on NumPy: the tests and the accuracy measurement use them.
"""
import functools
import math
import os
from fractions import Fraction

import numpy as np

from .. import _dtypes
from .. import _cublas
from .._kernels import KERNEL_DIR, KernelFamily, WorkspaceSlot, ceil_div
from .._validate import INT32_LIMIT
from . import ConvAlgorithm, register

# Interpolation points of the Toom-Cook construction; None is the point at
# infinity (the product's leading coefficient, g[r-1] * d-term: free of growth).
# Why these: alpha - 1 finite points plus infinity give alpha evaluations; the
# transform entries grow like |p|^(alpha-2), so the smallest magnitudes are best
# -- 0 and +-1 (exact, entries 0/+-1), then +-2 for F(4, 3) (powers of two,
# still exact in binary floating point).  The ill-conditioning that +-2 brings
# is what makes F(4x4, 3x3) lose precision (measured: notes/conv_wino.md).
# Keyed by alpha = m + r - 1, the tile size (the number of points): F(2, 5)
# takes the same six points as F(4, 3).
# alpha = 7 (F(3x3, 5x5), F(5x5, 3x3)) adds 1/2 to alpha 6's points: after 0, +-1,
# +-2 the smallest magnitudes are +-1/2 (exact in binary, and so are their powers),
# and only one of the pair is needed.  Measured (emulate, float32, N(0, 1),
# C = K = 256; notes/wino5b_accuracy.py --points): 0 +-1 +-2 1/2 inf 4.75e-6,
# -1/2 the same (the mirror image), 0 +-1 +-1/2 2 inf 5.0e-6, 0 +-1 +-1/2 -2 inf
# 5.0e-6, and 0 +-1 +-2 3 inf 6.3e-5 (13x worse: 3^5 = 243 in the transforms).
# The chosen set nests between alpha 6's and alpha 8's.
# alpha = 8 (F(4x4, 5x5), F(5x5, 4x4)) takes both +-1/2: 0, +-1, +-2, +-1/2, inf.
# Measured float32 errors in dnnprims/testing/tolerances.py (and FP32_ERROR below).
POINTS = {
    4: (0, 1, -1, None),
    6: (0, 1, -1, 2, -2, None),
    7: (0, 1, -1, 2, -2, Fraction(1, 2), None),
    8: (0, 1, -1, 2, -2, Fraction(1, 2), Fraction(-1, 2), None),
}
FILTER_SIZE = 3
# The (m, r) pairs registered, each in both roles: forward / backward data
# F(m x m, r x r) ("winograd_f{m}x{m}_{r}x{r}") and backward filter F(r x r, m x m)
# ("winograd_wgrad_f{r}x{r}_{m}x{m}").  One code path, kernels templated on (M, R).
# For 5x5 filters the tile grows with m: a GEMM multiply-add stands for
# 25 m^2 / alpha^2 direct ones -- 2.8 for F(2x2, 5x5), 4.6 for F(3x3, 5x5), 6.25 for
# F(4x4, 5x5) -- and the transformed data (V and M: alpha^2 / m^2 times the image)
# shrinks from 9x to 5.4x to 4x: on alex_conv2_5x5 (27 x 27 outputs) the forward
# GEMMs write M of 173, 97 and 77 MB (F(3x3) tiles 27 exactly: 9 x 9 tiles).
VARIANTS = ((2, 3), (4, 3), (2, 5), (3, 5), (4, 5))
# Backward filter F(r x r, m x m): the same pairs (F(5x5, 4x4) came first, as a
# backward-filter-only pair; forward F(4x4, 5x5) now shares its points).
WGRAD_VARIANTS = VARIANTS

# Worst float32 normwise error against float64 measured per (m, r) for forward
# and backward data: the three stages emulated on NumPy in float32 (emulate),
# N(0, 1) data, C = K = 16..512 (notes/conv_wino.md, notes/wino5.md,
# notes/wino5b_accuracy.py), the GPU within the same range (H100 runs).  A variant
# above FP32_DIRECT_BOUND (the float32 direct convolution bound, the "default" row
# of dnnprims/testing/tolerances.py) is not `strict`: precision="strict" excludes it.
FP32_ERROR = {(2, 3): 5.1e-7, (4, 3): 3.4e-6, (2, 5): 3.8e-6, (3, 5): 4.7e-6, (4, 5): 6.4e-6}
FP32_DIRECT_BOUND = 2e-5

SUPPORTED_DTYPES = ("float32", "float64", "float16", "bfloat16")
# V and M of one batch chunk stay under this many bytes (at least one image).
WORKSPACE_BOUND = 512 * 2**20
# Forward / backward data: run the filter transform in the first input-transform
# launch (blocks past the input's own) instead of a launch of its own; the
# small filter grid then fills the input grid's tail (notes/winobd.md).
FILTER_IN_INPUT_LAUNCH = True
# Forward / backward data, NCHW float32: the output transform writes each row of
# an m x m tile (m = 2 or 4) as one 8- / 16-byte store where Q % m == 0 and y is
# aligned (else one store per value, as for every other dtype and NHWC).
VECTOR_ROWS = True
# Forward / backward data of one batch chunk: from the second call on a kept
# workspace (_kernels.WorkspaceSlot), the cuBLAS GEMM runs as a CUDA graph captured
# over that workspace (its pointers all lie in it: the graph replays as captured).
# cudaGraphLaunch costs a few microseconds of host time where the cuBLAS call cost
# 8-15 (notes/hostwino.md).  With FULL_GRAPHS the GEMM graph is captured only the
# first time a call does not run as a whole-call graph (one capture, not two, on the
# second call: notes/review6c.md).  DNNPRIMS_WINOGRAD_GEMM_GRAPHS=0 turns it off.
GEMM_GRAPHS = os.environ.get("DNNPRIMS_WINOGRAD_GEMM_GRAPHS", "1") != "0"
# With GEMM_GRAPHS (notes/hostwino.md; GPU-tested in session 6), the whole
# one-chunk call -- input (and filter) transform, GEMM, output transform -- as one
# CUDA graph per (a, b, out, bias) pointers, FULL_GRAPH_CACHE of them a workspace
# (the least recently used dropped).  A call whose pointers repeat (a benchmark loop;
# a training loop whose memory pool hands the same blocks back) is one graph launch.
# After FULL_GRAPH_MISSES graphs dropped without ever being hit (captures wasted on
# pointers that did not repeat, however many hits came between them) the prepared
# call stops capturing (and takes the GEMM graph).  On by default (H100: fwd / bdata 3x3 b1 10.5-12.1 us host
# per cached call against 19.6-25 with the GEMM graph alone); DNNPRIMS_WINOGRAD_FULL_GRAPHS=0 turns it off.
FULL_GRAPHS = os.environ.get("DNNPRIMS_WINOGRAD_FULL_GRAPHS", "1") != "0"
FULL_GRAPH_CACHE = 4
FULL_GRAPH_MISSES = 8
_THREADS = 256
_PLAN_CACHE_SIZE = 4096
MATRICES_HEADER = "conv_winograd_matrices.cuh"


# --- the transforms, from their definition ------------------------------------------

def _evaluation(points, n):
    """The len(points) x n matrix that evaluates a polynomial of n coefficients
    (lowest first) at the points; the row of infinity picks the leading one."""
    return [[Fraction(0)] * (n - 1) + [Fraction(1)] if p is None
            else [Fraction(p) ** j for j in range(n)] for p in points]


def _inverse(a):
    """Exact inverse of a square Fraction matrix (Gauss-Jordan)."""
    n = len(a)
    aug = [list(row) + [Fraction(int(i == j)) for j in range(n)] for i, row in enumerate(a)]
    for col in range(n):
        pivot = next(r for r in range(col, n) if aug[r][col] != 0)
        aug[col], aug[pivot] = aug[pivot], aug[col]
        scale = aug[col][col]
        aug[col] = [v / scale for v in aug[col]]
        for r in range(n):
            if r != col and aug[r][col] != 0:
                f = aug[r][col]
                aug[r] = [v - f * u for v, u in zip(aug[r], aug[col])]
    return [row[n:] for row in aug]


def _transpose(a):
    return [list(col) for col in zip(*a)]


def toom_cook(m, r=FILTER_SIZE, points=None):
    """(A^T, G, B^T) of F(m, r), exact Fractions, such that for d of length
    alpha = m + r - 1 and g of length r

        A^T [(G g) * (B^T d)] = y,   y[i] = sum_j d[i + j] g[j]   (correlation).

    Derivation: the linear convolution s = h * g of h (m taps) and g (r taps)
    is, by Toom-Cook, s = V^-1 [(E_r g) * (E_m h)] with E_n the evaluation
    matrix at the points (alpha x n) and V = E_alpha.  Correlation is its
    transpose (y = C_g^T d where s = C_g h): y = E_m^T diag(E_r g) V^-T d, so
    A^T = E_m^T, G = E_r, B^T = V^-T.  Each row i of B^T is then scaled by the
    d_i that makes it a primitive integer vector, and row i of G by 1 / d_i
    (the product is unchanged): the input transform, applied to every tile,
    needs only small integers; the fractions sit in the filter transform."""
    alpha = m + r - 1
    points = POINTS[alpha] if points is None else tuple(points)
    if len(points) != alpha or len(set(points)) != alpha:
        raise ValueError(f"F({m}, {r}) needs {alpha} distinct points, got {points}")
    at = _transpose(_evaluation(points, m))
    g = _evaluation(points, r)
    bt = _transpose(_inverse(_evaluation(points, alpha)))
    for i, row in enumerate(bt):
        nonzero = [v for v in row if v != 0]
        d = Fraction(math.lcm(*(v.denominator for v in nonzero)),
                     math.gcd(*(v.numerator for v in nonzero)))
        bt[i] = [v * d for v in row]
        g[i] = [v / d for v in g[i]]
    return at, g, bt


def wgrad_toom_cook(m, r=FILTER_SIZE):
    """(A^T, G, B^T) of F(r, m), the backward-filter transforms (exact Fractions):
    the weight gradient of an r-tap filter (r = 3 below) is the correlation of x with dy,

        dw[j] = sum_i x[i + j] dy[i],

    so over one tile it is F(3, m) -- 3 outputs (the taps), the m-long dy tile in
    the role of the filter, an alpha = m + 2 long x tile as data -- and, being
    linear, the sum over tiles moves inside the inverse transform:
    dw = A^T [sum_t (G dy_t) * (B^T x_t)].  Same points as the forward F(m, 3)
    (POINTS[alpha]: the same alpha), so B^T is the forward input transform exactly
    (it depends on the points only); G (alpha x m) and A^T (r x alpha) differ."""
    return toom_cook(r, r=m, points=POINTS[m + r - 1])


def correlate_1d(d, g):
    """y[i] = sum_j d[i + j] g[j], the definition the transforms must reproduce."""
    m = len(d) - len(g) + 1
    return [sum(d[i + j] * g[j] for j in range(len(g))) for i in range(m)]


def apply_1d(m, d, g):
    """A^T [(G g) * (B^T d)] in exact arithmetic (F(m, len(g)))."""
    at, gm, bt = toom_cook(m, r=len(g))
    u = [sum(row[j] * g[j] for j in range(len(g))) for row in gm]
    v = [sum(row[j] * d[j] for j in range(len(d))) for row in bt]
    return [sum(row[a] * u[a] * v[a] for a in range(len(u))) for row in at]


def matrices(m, dtype=np.float64, wgrad=False, r=FILTER_SIZE):
    """(A^T, G, B^T) of F(m, r) -- or, with ``wgrad``, of the backward-filter
    F(r, m) (:func:`wgrad_toom_cook`) -- as arrays (each entry rounded once from
    the exact value)."""
    exact = wgrad_toom_cook(m, r) if wgrad else toom_cook(m, r)
    return tuple(np.array([[float(v) for v in row] for row in mat], dtype=dtype) for mat in exact)


def _c_value(v):
    """An exact C literal (or constant quotient) for a Fraction."""
    if v.denominator == 1:
        return f"{v.numerator}.0"
    return f"{v.numerator}.0 / {v.denominator}.0"


def matrices_header():
    """The text of kernels/conv_winograd_matrices.cuh, generated from toom_cook()."""
    lines = [
        "// Winograd F(m x m, r x r) transform matrices, GENERATED by",
        "// `python -m dnnprims.algos.winograd` from the Toom-Cook points in",
        "// dnnprims/algos/winograd.py (POINTS; derivation in toom_cook()). Do not edit:",
        "// tests/test_conv_winograd.py checks this file against the generator.",
        "//",
        "// winograd_matrices<M, R>::at(i, j) = A^T[i][j] (M x ALPHA), g(i, j) = G[i][j]",
        "// (ALPHA x R), bt(i, j) = B^T[i][j] (ALPHA x ALPHA), exact rationals evaluated",
        "// in double at compile time; with the transform loops fully unrolled the",
        "// lookups fold into immediate operands and the zero terms disappear.",
        "#pragma once",
        "",
        "template <int M, int R> struct winograd_matrices;",
    ]
    for m, r in VARIANTS:
        points = ", ".join("inf" if p is None else str(p) for p in POINTS[m + r - 1])
        lines += ["", f"// F({m}x{m}, {r}x{r}), points {points}"]
        lines += _matrices_struct(f"winograd_matrices<{m}, {r}>", m + r - 1, toom_cook(m, r))
    lines += ["", "// Backward filter F(RxR, MxM) (wgrad_toom_cook): at(i, j) = A^T[i][j] (R x ALPHA),",
              "// g(i, j) = G[i][j] (ALPHA x M, applied to an M x M tile of dy), bt(i, j) = B^T[i][j]",
              "// (ALPHA x ALPHA, applied to an ALPHA x ALPHA tile of x).",
              "template <int M, int R> struct winograd_wgrad_matrices;"]
    for m, r in WGRAD_VARIANTS:
        points = ", ".join("inf" if p is None else str(p) for p in POINTS[m + r - 1])
        lines += ["", f"// F({r}x{r}, {m}x{m}), points {points}"]
        lines += _matrices_struct(f"winograd_wgrad_matrices<{m}, {r}>", m + r - 1, wgrad_toom_cook(m, r))
    return "\n".join(lines) + "\n"


def _matrices_struct(name, alpha, mats):
    lines = [f"template <> struct {name} {{", f"    static constexpr int ALPHA = {alpha};"]
    for method, mat in zip(("at", "g", "bt"), mats):
        rows = ", ".join("{" + ", ".join(_c_value(v) for v in row) + "}" for row in mat)
        lines += [f"    static __device__ __forceinline__ double {method}(int i, int j) {{",
                  f"        constexpr double v[{len(mat)}][{len(mat[0])}] = {{{rows}}};",
                  "        return v[i][j];",
                  "    }"]
    return lines + ["};"]


# --- the three stages on NumPy (tests, accuracy measurement) ---------------------------

def emulate(x, w, m, padding=(1, 1), acc_dtype=np.float32, direction="forward"):
    """The three stages of the GPU path on NumPy, NCHW, arithmetic in ``acc_dtype``
    (matrices rounded to it once): forward y = conv(x, w), or, for
    ``direction="backward_data"``, dx from x := dy (same rotation and padding
    r - 1 - p as the kernels).  The filter size r is w's (square).  Returns an
    ``acc_dtype`` array."""
    r = np.shape(w)[2]
    at, g, bt = (a.astype(acc_dtype) for a in matrices(m, r=r))
    alpha = m + r - 1
    x = np.asarray(x).astype(acc_dtype)
    w = np.asarray(w).astype(acc_dtype)
    ph, pw = padding
    if direction == "backward_data":
        w = w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)    # rotated, C and K swapped
        ph, pw = r - 1 - ph, r - 1 - pw
    N, C, H, W = x.shape
    K = w.shape[0]
    P, Q = H + 2 * ph - r + 1, W + 2 * pw - r + 1
    th, tw = ceil_div(P, m), ceil_div(Q, m)
    # Input padded (or cropped, for negative padding) so that every tile is in range.
    canvas = np.zeros((N, C, th * m + r - 1, tw * m + r - 1), acc_dtype)
    h0, h1 = max(0, -ph), min(H, th * m + r - 1 - ph)
    w0, w1 = max(0, -pw), min(W, tw * m + r - 1 - pw)
    canvas[:, :, h0 + ph:h1 + ph, w0 + pw:w1 + pw] = x[:, :, h0:h1, w0:w1]
    s = canvas.strides
    tiles = np.lib.stride_tricks.as_strided(
        canvas, (N, C, th, tw, alpha, alpha), (s[0], s[1], m * s[2], m * s[3], s[2], s[3]))
    v = np.einsum("ai,nctuij,bj->abcntu", bt, tiles, bt).reshape(alpha * alpha, C, N * th * tw)
    u = np.einsum("ai,kcij,bj->abkc", g, w, g).reshape(alpha * alpha, K, C)
    mm = np.matmul(u, v).reshape(alpha, alpha, K, N, th, tw)
    y = np.einsum("ia,abkntu,jb->nktiuj", at, mm, at).reshape(N, K, th * m, tw * m)
    return np.ascontiguousarray(y[:, :, :P, :Q])


def emulate_wgrad(x, dy, m, padding=(1, 1), acc_dtype=np.float32):
    """The backward-filter stages of the GPU path on NumPy, NCHW, arithmetic in
    ``acc_dtype``: dw (K, C, r, r) of an r x r stride-1 convolution from x and dy
    (r = H + 2 pad - P + 1)."""
    ph, pw = padding
    r = np.shape(x)[2] + 2 * ph - np.shape(dy)[2] + 1
    at, g, bt = (a.astype(acc_dtype) for a in matrices(m, wgrad=True, r=r))
    alpha = m + r - 1
    x = np.asarray(x).astype(acc_dtype)
    dy = np.asarray(dy).astype(acc_dtype)
    N, C, H, W = x.shape
    K, P, Q = dy.shape[1:]
    th, tw = ceil_div(P, m), ceil_div(Q, m)
    # th * m + r - 1 >= P + r - 1 = H + 2 ph: the padded image fits the canvas.
    canvas = np.zeros((N, C, th * m + r - 1, tw * m + r - 1), acc_dtype)
    canvas[:, :, ph:ph + H, pw:pw + W] = x
    s = canvas.strides
    x_tiles = np.lib.stride_tricks.as_strided(
        canvas, (N, C, th, tw, alpha, alpha), (s[0], s[1], m * s[2], m * s[3], s[2], s[3]))
    dy_canvas = np.zeros((N, K, th * m, tw * m), acc_dtype)
    dy_canvas[:, :, :P, :Q] = dy
    dy_tiles = dy_canvas.reshape(N, K, th, m, tw, m).transpose(0, 1, 2, 4, 3, 5)
    xt = np.einsum("ai,nctuij,bj->abcntu", bt, x_tiles, bt).reshape(alpha * alpha, C, N * th * tw)
    dt = np.einsum("ai,nktuij,bj->abkntu", g, dy_tiles, g).reshape(alpha * alpha, K, N * th * tw)
    mw = np.matmul(dt, xt.transpose(0, 2, 1)).reshape(alpha, alpha, K, C)
    return np.einsum("ia,abkc,jb->kcij", at, mw, at)


def write_header():
    """Regenerate kernels/conv_winograd_matrices.cuh from :func:`matrices_header`."""
    path = KERNEL_DIR / MATRICES_HEADER
    path.write_text(matrices_header())
    print(f"wrote {path}")


if __name__ == "__main__":
    # `python -m dnnprims.algos.winograd`: the package import has already run this
    # module (and registered its algorithms); stop before registering them twice.
    write_header()
    raise SystemExit(0)


# --- the GPU algorithm ---------------------------------------------------------------

def _expression(kernel, dtype, m, r, nhwc=None):
    t = _dtypes.cuda_type(np.dtype(dtype))
    if nhwc is None:
        return f"{kernel}<{t}, {m}, {r}>"
    return f"{kernel}<{t}, {m}, {r}, {'true' if nhwc else 'false'}>"


FAMILY = KernelFamily("conv_winograd.cu", [
    expr
    for dtype in SUPPORTED_DTYPES for m, r in VARIANTS
    for expr in [_expression(k, dtype, m, r, nhwc) for k in ("winograd_input_transform",
                                                             "winograd_output_transform")
                 for nhwc in (False, True)]
] + [
    expr
    for dtype in SUPPORTED_DTYPES for m, r in WGRAD_VARIANTS
    for expr in ([_expression("winograd_wgrad_output_transform", dtype, m, r)]
                 + [_expression(k, dtype, m, r, nhwc) for k in ("winograd_wgrad_input_transform",
                                                                "winograd_wgrad_grad_transform")
                    for nhwc in (False, True)])
])


def geometry(p, direction):
    """(Cin, Hin, Win, Kout, Pout, Qout, pad_h, pad_w) of the Winograd convolution
    that computes ``direction`` (backward data: over dy, channels swapped,
    padding R - 1 - p)."""
    if direction == "forward":
        return p.C, p.H, p.W, p.K, p.P, p.Q, p.padding[0], p.padding[1]
    return p.K, p.P, p.Q, p.C, p.H, p.W, p.R - 1 - p.padding[0], p.S - 1 - p.padding[1]


@functools.lru_cache(maxsize=4096)
def _sizes_at(p, direction, m, bound):
    """(tiles per image, images per chunk, bytes of U, bytes of V + M per image)."""
    Cin, _, _, Kout, Pout, Qout, _, _ = geometry(p, direction)
    alpha2 = (m + p.R - 1) ** 2
    acc = np.dtype(_dtypes.accumulate_dtype(np.dtype(p.dtype))).itemsize
    tiles = ceil_div(Pout, m) * ceil_div(Qout, m)
    per_image = alpha2 * (Cin + Kout) * tiles * acc
    chunk = max(1, min(p.N, bound // max(1, per_image)))
    return tiles, chunk, alpha2 * Kout * Cin * acc, per_image


def _sizes(p, direction, m):
    return _sizes_at(p, direction, m, WORKSPACE_BOUND)


def _workspace_parts(alpha2, Kout, Cin, tiles):
    """Elements of U, V and M in the one workspace allocation; U and V are
    rounded up to 64 elements so that each part starts 256-byte aligned
    (cuBLAS's vectorised kernels want 16)."""
    return (ceil_div(alpha2 * Kout * Cin, 64) * 64, ceil_div(alpha2 * Cin * tiles, 64) * 64,
            alpha2 * Kout * tiles)


def _workspace_offsets(alpha2, Kout, Cin, full_tiles):
    """Element offsets of V and M in the workspace of a full batch chunk of
    ``full_tiles`` tiles (U starts it); a short last chunk uses the same offsets."""
    u_size, v_size, _ = _workspace_parts(alpha2, Kout, Cin, full_tiles)
    return u_size, u_size + v_size


def workspace_views(workspace, alpha2, Kout, Cin, tiles, nhwc, full_tiles=None):
    """U, V and M of a batch chunk of ``tiles`` tiles as views of the one workspace
    allocation, at the offsets the kernels use (:func:`_workspace_offsets` of the
    full chunk, ``full_tiles``; default ``tiles``)."""
    v_offset, m_offset = _workspace_offsets(alpha2, Kout, Cin, tiles if full_tiles is None else full_tiles)
    u = workspace[:alpha2 * Kout * Cin].reshape(alpha2, Kout, Cin)
    v = workspace[v_offset:v_offset + alpha2 * Cin * tiles]
    m = workspace[m_offset:m_offset + alpha2 * Kout * tiles]
    if nhwc:
        return u, v.reshape(alpha2, tiles, Cin), m.reshape(alpha2, tiles, Kout)
    return u, v.reshape(alpha2, Cin, tiles), m.reshape(alpha2, Kout, tiles)


def _shape_support(p, r, label):
    """(ok, reason) for what every Winograd algorithm here needs of a problem:
    r x r filters, stride and dilation 1, no groups, a supported dtype and
    tensors that 32-bit indices reach (``label`` names the transform)."""
    if (p.R, p.S) != (r, r):
        return False, f"it is {label}: {r}x{r} filters only, not {p.R}x{p.S}"
    if p.stride != (1, 1) or p.dilation != (1, 1):
        return False, "it needs stride 1 and dilation 1"
    if p.groups != 1:
        return False, "it handles ungrouped convolutions only (groups == 1)"
    if p.dtype not in SUPPORTED_DTYPES:
        return False, f"it supports {', '.join(SUPPORTED_DTYPES)}, not {p.dtype}"
    if max(p.N * p.C * p.H * p.W, p.N * p.K * p.P * p.Q) > INT32_LIMIT:
        return False, "it indexes with 32-bit ints; a tensor here has 2^31 elements or more"
    return True, ""


class WinogradConvolution(ConvAlgorithm):
    """Forward and backward data by Winograd F(m x m, r x r)."""
    directions = ("forward", "backward_data")

    def __init__(self, m, r=FILTER_SIZE, fp32_error=None):
        self.m, self.r = m, r
        self.alpha = m + r - 1
        # Within the float32 direct bound (FP32_ERROR: all five are, 6.4e-6 at most),
        # else precision="strict" excludes it.
        self.fp32_error = FP32_ERROR[m, r] if fp32_error is None else fp32_error
        self.strict = self.fp32_error <= FP32_DIRECT_BOUND
        self.name = f"winograd_f{m}x{m}_{r}x{r}"
        self._plans = {}

    def supports(self, problem, direction):
        ok, reason = super().supports(problem, direction)
        if not ok:
            return ok, reason
        p = problem
        ok, reason = _shape_support(p, self.r, f"F({self.m}x{self.m}, {self.r}x{self.r})")
        if not ok:
            return ok, reason
        tiles, chunk, u_bytes, per_image = _sizes(p, direction, self.m)
        acc = np.dtype(_dtypes.accumulate_dtype(np.dtype(p.dtype))).itemsize
        if max(chunk * per_image, u_bytes) // acc > INT32_LIMIT:
            return False, "its workspace for one image has 2^31 elements or more"
        return True, ""

    def workspace_bytes(self, problem, direction):
        tiles, chunk, _, _ = _sizes(problem, direction, self.m)
        Cin, _, _, Kout = geometry(problem, direction)[:4]
        acc = np.dtype(_dtypes.accumulate_dtype(np.dtype(problem.dtype))).itemsize
        return sum(_workspace_parts(self.alpha ** 2, Kout, Cin, chunk * tiles)) * acc

    def _plan(self, p, direction):
        """Everything a call needs but its arrays, cached per (device, problem,
        direction, WORKSPACE_BOUND and the two launch options): per batch
        chunk the input-transform launch scalars, the GEMM's cuBLAS arguments
        and the output-transform scalars."""
        import cupy

        key = (cupy.cuda.runtime.getDevice(), p, direction, WORKSPACE_BOUND, FILTER_IN_INPUT_LAUNCH,
               VECTOR_ROWS, GEMM_GRAPHS, FULL_GRAPHS)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        m, r, alpha2 = self.m, self.r, self.alpha ** 2
        Cin, Hin, Win, Kout, Pout, Qout, ph, pw = geometry(p, direction)
        nhwc = p.layout == "NHWC"
        tiles_h, tiles_w = ceil_div(Pout, m), ceil_div(Qout, m)
        tiles, chunk, _, _ = _sizes(p, direction, m)
        acc = np.dtype(_dtypes.accumulate_dtype(np.dtype(p.dtype)))
        v_offset, m_offset = (np.int64(o) for o in _workspace_offsets(alpha2, Kout, Cin, chunk * tiles))
        i32 = np.int32
        filter_blocks = ceil_div(Kout * Cin, _THREADS)
        # The filter transform's scalars, after the input transform's own.
        filter_args = (i32(Kout), i32(direction == "backward_data"))
        chunks = []
        for n0 in range(0, p.N, chunk):
            t = (min(p.N, n0 + chunk) - n0) * tiles
            input_blocks = ceil_div(Cin * t, _THREADS)
            with_filter = n0 == 0 and FILTER_IN_INPUT_LAUNCH
            chunks.append((
                i32(n0), t,
                (input_blocks + (filter_blocks if with_filter else 0),),
                (i32(Cin), i32(Hin), i32(Win), i32(ph), i32(pw), i32(tiles_h), i32(tiles_w),
                 i32(t), i32(n0), i32(input_blocks)),
                (ceil_div(Kout * t, _THREADS),),
                (i32(Kout), i32(Pout), i32(Qout), i32(tiles_h), i32(tiles_w), i32(t), i32(n0)),
                _gemm_arguments(nhwc, alpha2, Kout, Cin, t, acc.itemsize, v_offset, m_offset)))
        input_expr = _expression("winograd_input_transform", p.dtype, m, r, nhwc)
        plan = dict(
            acc=acc, Cin=Cin, Kout=Kout, alpha2=alpha2, nhwc=nhwc, chunks=chunks, max_tiles=chunk * tiles,
            elements=sum(_workspace_parts(alpha2, Kout, Cin, chunk * tiles)), v_offset=v_offset,
            m_offset=m_offset,
            filter_args=filter_args, options=(WORKSPACE_BOUND, FILTER_IN_INPUT_LAUNCH, VECTOR_ROWS, GEMM_GRAPHS,
                                              FULL_GRAPHS),
            # The filter transform alone (FILTER_IN_INPUT_LAUNCH off): the input
            # kernel with no input blocks; its arguments before x's are unused.
            filter=None if FILTER_IN_INPUT_LAUNCH else (
                input_expr, (filter_blocks,),
                (i32(Cin), i32(1), i32(1), i32(0), i32(0), i32(1), i32(1), i32(0), i32(0), i32(0))),
            vec_rows=VECTOR_ROWS and not nhwc and Qout % m == 0,
            input=input_expr,
            output=_expression("winograd_output_transform", p.dtype, m, r, nhwc))
        if len(self._plans) >= _PLAN_CACHE_SIZE:
            self._plans.clear()
        self._plans[key] = plan
        return plan

    def prepare(self, problem, direction, has_bias=False, activation=None):
        """The call as prepared launches and one raw cuBLAS call per batch chunk:
        per call only the pointers are new (the public path measured ~175 us
        of host time per call with per-call views, over the GPU time of the
        ResNet-50 layers; notes/winobd.md).  The workspace is kept per stream
        (WorkspaceSlot: cupy.empty and its free cost ~4 us a call;
        notes/winohost.md).
        Arrays of a launch: ARRAY0 = a, ARRAY1 = b, ARRAY2 = out, ARRAY3 = bias
        (b stands in for an absent bias: the kernel does not read it),
        ARRAY4 = the workspace."""
        from .._kernels import ARRAY0, ARRAY1, ARRAY2, ARRAY3, ARRAY4

        plan = self._plan(problem, direction)
        options = plan["options"]
        bias_array = ARRAY3 if has_bias else ARRAY1
        i32 = np.int32
        filter_args = (ARRAY1, *plan["filter_args"])
        prep = FAMILY.prepare
        block = (_THREADS,)
        first = []
        if plan["filter"] is not None:
            expr, grid, args = plan["filter"]
            first.append(prep(expr, grid, block, (ARRAY0, ARRAY4, plan["v_offset"], *args, *filter_args)))
        steps = []
        for _, _, in_grid, in_args, out_grid, out_args, gemm_args in plan["chunks"]:
            outputs = tuple(
                prep(plan["output"], out_grid, block,
                     (ARRAY4, plan["m_offset"], bias_array, i32(has_bias), ARRAY2, *out_args, i32(vec)))
                for vec in (False, plan["vec_rows"]))
            steps.append((prep(plan["input"], in_grid, block,
                               (ARRAY0, ARRAY4, plan["v_offset"], *in_args, *filter_args)),
                          gemm_args, outputs))
        first, steps = tuple(first), tuple(steps)
        run_gemm = _GEMM_RUN[plan["acc"]]
        capture = getattr(run_gemm, "capture", None)
        slot = WorkspaceSlot(plan["elements"], plan["acc"])

        def gemm_graph_of(workspace, graphs):
            """The GEMM as a CUDA graph over this kept workspace (all its pointers
            lie in it), kept in ``graphs[0]``; False when it cannot be captured,
            NOT_NOW (falsy, nothing kept) inside a user's capture."""
            base = workspace.array.data.ptr
            (head, b_offset, mid, a_offset, tail, c_offset, last) = steps[0][1]
            calls = [(*head, base + b_offset, *mid, base + a_offset, *tail, base + c_offset, *last)]
            captured = capture(calls, workspace.stream) if capture is not None else None
            if captured is None:
                graphs[0] = False
            elif captured:         # else NOT_NOW (a user's capture): direct now, try again next call
                graphs[0] = captured
            return captured

        capture_work = getattr(run_gemm, "capture_work", None)
        capturing = getattr(run_gemm, "capturing", None) or (lambda: False)
        whole = {"wasted": 0, "on": FULL_GRAPHS and capture_work is not None and len(steps) == 1}

        def launch_all(arrays, vec, graph):
            """The one-chunk call, its GEMM as ``graph`` (the GEMM graph) or, with None, direct."""
            for launch in first:
                launch(*arrays)
            launch_input, (head, b_offset, mid, a_offset, tail, c_offset, last), outputs = steps[0]
            launch_input(*arrays)
            if graph is not None:
                graph.launch()
            else:
                base = arrays[4].data.ptr
                run_gemm(*head, base + b_offset, *mid, base + a_offset, *tail, base + c_offset, *last)
            outputs[vec](*arrays)

        def run_whole(cache, workspace, arrays, vec):
            """The call as one graph over its pointers (captured on a miss, kept in
            ``cache``); False when it did not run so."""
            a, b, out, bias, _ = arrays
            key = (a.data.ptr, b.data.ptr, out.data.ptr, None if bias is None else bias.data.ptr)
            entry = cache.pop(key, None)
            if entry is None:
                if whole["wasted"] >= FULL_GRAPH_MISSES:
                    whole["on"] = False
                    return False
                captured = capture_work(lambda: launch_all(arrays, vec, None), workspace.stream)
                if not captured:   # None: never again; NOT_NOW (a user's capture): not this call
                    if captured is None:
                        whole["on"] = False
                    return False
                if len(cache) >= FULL_GRAPH_CACHE:
                    if not cache.pop(next(iter(cache)))[2]:   # the least recently used, never hit
                        whole["wasted"] += 1
                # [graph, the cuBLAS workspace it runs on (must live as long), hit since captured]
                entry = [*captured, False]
            else:
                entry[2] = True
            cache[key] = entry     # the most recently used last
            entry[0].launch()
            return True

        def run(a, b, out, bias=None):
            if options != (WORKSPACE_BOUND, FILTER_IN_INPUT_LAUNCH, VECTOR_ROWS, GEMM_GRAPHS, FULL_GRAPHS):
                # The module's options changed since this was prepared (tests do that).
                return self.run(problem, direction, a, b, out, bias=bias, activation=activation)
            workspace = slot.take()
            try:   # a kept workspace is counted against the reuse budget: always give it back
                arrays = (a, b, out, bias, workspace.array)
                # Vector rows need 16-byte aligned rows (float4 for F(4x4), float2 for F(2x2)).
                vec = out.data.ptr % 16 == 0
                graphs = workspace.graphs
                if graphs and capturing():
                    # A user capturing this call: our graphs cannot be launched into
                    # their capture (CUDA refuses, and that invalidates it), so the
                    # kernels and GEMMs go into it directly.
                    graphs = False
                elif graphs is None and GEMM_GRAPHS and workspace.kept:
                    # The second call on a kept workspace: [the GEMM graph (captured the first
                    # time the whole-call graph does not run), the whole-call graphs].
                    graphs = workspace.graphs = [None, {}] if len(steps) == 1 else False
                if graphs and whole["on"] and run_whole(graphs[1], workspace, arrays, vec):
                    return out
                gemm = graphs and (graphs[0] if graphs[0] is not None else gemm_graph_of(workspace, graphs))
                if gemm:
                    launch_all(arrays, vec, gemm[0])
                else:
                    for launch in first:
                        launch(*arrays)
                    base = workspace.array.data.ptr
                    for launch_input, (head, b_offset, mid, a_offset, tail, c_offset, last), outputs in steps:
                        launch_input(*arrays)
                        run_gemm(*head, base + b_offset, *mid, base + a_offset, *tail, base + c_offset, *last)
                        outputs[vec](*arrays)
            finally:
                slot.give_back(workspace)
            return out
        return run

    def run(self, problem, direction, a, b, out, bias=None, activation=None):
        plan = self._plan(problem, direction)
        runner = plan.get(("runner", bias is not None))
        if runner is None:
            runner = plan[("runner", bias is not None)] = self.prepare(problem, direction, bias is not None)
        return runner(a, b, out, bias)


def _gemm_arguments(nhwc, alpha2, Kout, Cin, tiles, itemsize, v_offset, m_offset):
    """cuBLAS strided-batched GEMM arguments of M[a] = U[a] V[a] (NCHW: U (Kout, Cin),
    V (Cin, tiles), M (Kout, tiles)) or M[a] = V[a] U[a]^T (NHWC: V (tiles, Cin),
    M (tiles, Kout)), row-major, split around the three operand pointers (byte
    offsets from the workspace start): (head, b offset, mid, a offset, tail, c offset,
    last).  cuBLAS is column-major: the row-major C = A B is C^T = B^T A^T, so B's
    storage is its first operand, "A" in cuBLAS's terms (dnnprims._cublas.gemm does
    the same for arrays)."""
    one, zero = (_cublas._scalar(_dtypes_acc(itemsize), v).ctypes.data for v in (1.0, 0.0))
    u_bytes, v_bytes, m_bytes = 0, int(v_offset) * itemsize, int(m_offset) * itemsize
    if nhwc:
        # C (tiles x Kout) = V (tiles x Cin) @ U^T: cuBLAS C^T (Kout x tiles) = op_T(U) V^T.
        return ((_cublas._OP_T, _cublas._OP_N, Kout, tiles, Cin, one), u_bytes, (Cin, Kout * Cin),
                v_bytes, (Cin, tiles * Cin, zero), m_bytes, (Kout, tiles * Kout, alpha2))
    return ((_cublas._OP_N, _cublas._OP_N, tiles, Kout, Cin, one), v_bytes, (tiles, Cin * tiles),
            u_bytes, (Cin, Kout * Cin, zero), m_bytes, (tiles, Kout * tiles, alpha2))


def _dtypes_acc(itemsize):
    return np.dtype(np.float64 if itemsize == 8 else np.float32)


class _GemmRun(dict):
    """acc dtype -> the cuBLAS strided-batched GEMM (:class:`dnnprims._cublas.StridedBatched`:
    ``run(*cuBLAS arguments but the handle)``, ``run.capture``), made once."""

    def __missing__(self, dtype):
        run = self[dtype] = _cublas.StridedBatched(dtype)
        return run


_GEMM_RUN = _GemmRun()


WINOGRAD_F2 = register(WinogradConvolution(2))
WINOGRAD_F4 = register(WinogradConvolution(4))
WINOGRAD_F2_5X5 = register(WinogradConvolution(2, 5))
WINOGRAD_F3_5X5 = register(WinogradConvolution(3, 5))
WINOGRAD_F4_5X5 = register(WinogradConvolution(4, 5))


# --- backward filter: F(3x3, m x m) ---------------------------------------------------

# Split of the GEMM depth (the tiles of a batch chunk) into runs that are GEMM
# batch entries of their own: aim at WGRAD_TARGET_BLOCKS blocks of 128 x 128 (two
# waves on the H100's 132 SMs) where K x C alone gives fewer, with at least
# WGRAD_MIN_SPLIT_DEPTH tiles a run; and at most WGRAD_MAX_SPLIT_DEPTH tiles a run
# whatever the shape, which bounds the length of cuBLAS's sequential float sums
# (the error of one grows like sqrt(depth) * eps: emulated F(3x3, 4x4) on
# 56 x 56 x 16 images, 1.1e-5 in one 3136-tile sum, 5.6e-6 in 1024-tile splits).  The splits add in order in
# the output transform: deterministic.
WGRAD_TARGET_BLOCKS = 2 * 132
WGRAD_MIN_SPLIT_DEPTH = 512
WGRAD_MAX_SPLIT_DEPTH = 1024
_WGRAD_DEPTH_MULTIPLE = 4     # split_tiles: NCHW rows start 16-byte aligned
_WGRAD_OUTPUT_PAIRS = 32      # (k, c) pairs a block of the output kernel


@functools.lru_cache(maxsize=4096)
def _wgrad_sizes(p, m, bound, target_blocks, min_depth, max_depth):
    """(tiles per image, images per chunk, splits, split tiles of a full chunk)."""
    alpha2 = (m + p.R - 1) ** 2
    acc = np.dtype(_dtypes.accumulate_dtype(np.dtype(p.dtype))).itemsize
    tiles = ceil_div(p.P, m) * ceil_div(p.Q, m)
    chunk = max(1, min(p.N, bound // max(1, alpha2 * (p.C + p.K) * tiles * acc)))
    depth = chunk * tiles
    splits = ceil_div(target_blocks, alpha2 * ceil_div(p.K, 128) * ceil_div(p.C, 128))
    splits = min(splits, max(1, depth // min_depth))
    splits = max(splits, ceil_div(depth, max_depth))
    return tiles, chunk, splits, _split_tiles(depth, splits)


def _split_tiles(depth, splits):
    return ceil_div(ceil_div(depth, splits), _WGRAD_DEPTH_MULTIPLE) * _WGRAD_DEPTH_MULTIPLE


def wgrad_sizes(p, m):
    return _wgrad_sizes(p, m, WORKSPACE_BOUND, WGRAD_TARGET_BLOCKS, WGRAD_MIN_SPLIT_DEPTH,
                        WGRAD_MAX_SPLIT_DEPTH)


def _wgrad_parts(alpha2, K, C, splits, split_tiles):
    """Elements of Mw, Xt and Dt in the one workspace allocation (Mw and Xt
    rounded up to 64 elements: every part starts 256-byte aligned)."""
    return (ceil_div(alpha2 * splits * K * C, 64) * 64, ceil_div(alpha2 * splits * C * split_tiles, 64) * 64,
            alpha2 * splits * K * split_tiles)


def wgrad_workspace_views(workspace, alpha2, K, C, splits, full_split_tiles, split_tiles, nhwc):
    """Mw (alpha2 * splits, K, C), and Xt, Dt of ``split_tiles`` tiles a split
    ((batch, split_tiles, C) and (batch, split_tiles, K) for NHWC, (batch, C,
    split_tiles) and (batch, K, split_tiles) for NCHW), as views of the one
    workspace allocation laid out by :func:`_wgrad_parts` for
    ``full_split_tiles`` (a short last chunk takes a prefix of each part)."""
    mw_size, xt_size, _ = _wgrad_parts(alpha2, K, C, splits, full_split_tiles)
    batch = alpha2 * splits
    mw = workspace[:batch * K * C].reshape(batch, K, C)
    xt = workspace[mw_size:mw_size + batch * C * split_tiles]
    dt = workspace[mw_size + xt_size:mw_size + xt_size + batch * K * split_tiles]
    if nhwc:
        return mw, xt.reshape(batch, split_tiles, C), dt.reshape(batch, split_tiles, K)
    return mw, xt.reshape(batch, C, split_tiles), dt.reshape(batch, K, split_tiles)


class WinogradBackwardFilter(ConvAlgorithm):
    """Backward filter by Winograd F(r x r, m x m): dw = A^T [sum over tiles of
    (G dy G^T) .* (B^T x B)] A (:func:`wgrad_toom_cook`), the sum as
    alpha^2 * splits batched cuBLAS GEMMs over the tiles of each batch chunk."""
    directions = ("backward_filter",)
    strict = True   # set per instance below from the measured error

    def __init__(self, m, strict, r=FILTER_SIZE):
        self.m, self.r = m, r
        self.alpha = m + r - 1
        self.strict = strict
        self.name = f"winograd_wgrad_f{r}x{r}_{m}x{m}"
        self._plans = {}

    def supports(self, problem, direction):
        ok, reason = super().supports(problem, direction)
        if not ok:
            return ok, reason
        p = problem
        ok, reason = _shape_support(p, self.r, f"F({self.r}x{self.r}, {self.m}x{self.m})")
        if not ok:
            return ok, reason
        if self._elements(p) > INT32_LIMIT:
            return False, "its workspace has 2^31 elements or more"
        return True, ""

    def _elements(self, p):
        _, _, splits, split_tiles = wgrad_sizes(p, self.m)
        return sum(_wgrad_parts(self.alpha ** 2, p.K, p.C, splits, split_tiles))

    def workspace_bytes(self, problem, direction):
        acc = np.dtype(_dtypes.accumulate_dtype(np.dtype(problem.dtype))).itemsize
        return self._elements(problem) * acc

    def plan(self, p):
        """Per batch chunk: (n0, split_tiles, beta, input-transform grid and
        scalars, grad-transform grid and scalars); cached per (device, problem)."""
        m, r, alpha2 = self.m, self.r, self.alpha ** 2
        tiles, chunk, splits, full_split_tiles = wgrad_sizes(p, m)
        tiles_h, tiles_w = ceil_div(p.P, m), ceil_div(p.Q, m)
        i32 = np.int32
        chunks = []
        for n0 in range(0, p.N, chunk):
            t = (min(p.N, n0 + chunk) - n0) * tiles
            st = _split_tiles(t, splits)
            chunks.append((
                n0, st, 0.0 if n0 == 0 else 1.0,
                (ceil_div(p.C * splits * st, _THREADS),),
                (i32(p.C), i32(p.H), i32(p.W), i32(p.padding[0]), i32(p.padding[1]), i32(tiles_h),
                 i32(tiles_w), i32(t), i32(n0), i32(splits), i32(st)),
                (ceil_div(p.K * splits * st, _THREADS),),
                (i32(p.K), i32(p.P), i32(p.Q), i32(tiles_h), i32(tiles_w), i32(t), i32(n0),
                 i32(splits), i32(st))))
        nhwc = p.layout == "NHWC"
        acc = np.dtype(_dtypes.accumulate_dtype(np.dtype(p.dtype)))
        xt_offset, dt_offset = _wgrad_offsets(alpha2, p.K, p.C, splits, full_split_tiles)
        gemms = [_wgrad_gemm_arguments(nhwc, alpha2 * splits, p.K, p.C, st, acc.itemsize, xt_offset,
                                       dt_offset, beta) for _, st, beta, _, _, _, _ in chunks]
        return dict(acc=acc, alpha2=alpha2, splits=splits,
                    full_split_tiles=full_split_tiles, nhwc=nhwc, chunks=chunks,
                    elements=self._elements(p), gemms=gemms,
                    xt_offset=np.int64(xt_offset), dt_offset=np.int64(dt_offset),
                    input=_expression("winograd_wgrad_input_transform", p.dtype, m, r, nhwc),
                    grad=_expression("winograd_wgrad_grad_transform", p.dtype, m, r, nhwc),
                    output=(_expression("winograd_wgrad_output_transform", p.dtype, m, r),
                            (ceil_div(p.K * p.C, _WGRAD_OUTPUT_PAIRS),), (i32(p.K), i32(p.C), i32(splits))))

    def _cached_plan(self, p):
        import cupy

        options = _wgrad_options()
        key = (cupy.cuda.runtime.getDevice(), p, options)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= _PLAN_CACHE_SIZE:
                self._plans.clear()
            plan = self._plans[key] = self.plan(p)
            plan["options"] = options
        return plan

    def prepare(self, problem, direction, has_bias=False, activation=None):
        """Prepared launches and a raw cuBLAS call per batch chunk over one
        workspace, kept per stream (as WinogradConvolution.prepare). Arrays of a launch:
        ARRAY0 = x, ARRAY1 = dy, ARRAY2 = dw, ARRAY4 = the workspace."""
        from .._kernels import ARRAY0, ARRAY1, ARRAY2, ARRAY4

        plan = self._cached_plan(problem)
        options = plan["options"]
        block = (_THREADS,)
        prep = FAMILY.prepare
        steps = tuple(
            (prep(plan["input"], x_grid, block, (ARRAY0, ARRAY4, plan["xt_offset"], *x_args)),
             prep(plan["grad"], dy_grid, block, (ARRAY1, ARRAY4, plan["dt_offset"], *dy_args)),
             gemm_args)
            for (_, _, _, x_grid, x_args, dy_grid, dy_args), gemm_args in zip(plan["chunks"], plan["gemms"]))
        expr, grid, args = plan["output"]
        output = prep(expr, grid, block, (ARRAY4, ARRAY2, *args))
        run_gemm = _GEMM_RUN[plan["acc"]]
        slot = WorkspaceSlot(plan["elements"], plan["acc"])

        def run(a, b, out, bias=None):
            if options != _wgrad_options():
                # The module's options changed since this was prepared (tests do that).
                return self.run(problem, direction, a, b, out)
            workspace = slot.take()
            try:   # as WinogradConvolution.prepare: the workspace goes back even when a call raises
                arrays = (a, b, out, None, workspace.array)
                base = workspace.array.data.ptr
                for launch_x, launch_dy, (head, a_offset, mid, b_offset, tail, c_offset, last) in steps:
                    launch_x(*arrays)
                    launch_dy(*arrays)
                    run_gemm(*head, base + a_offset, *mid, base + b_offset, *tail, base + c_offset,
                             *last)
                output(*arrays)
            finally:
                slot.give_back(workspace)
            return out
        return run

    def run(self, problem, direction, a, b, out, bias=None, activation=None):
        plan = self._cached_plan(problem)
        runner = plan.get("runner")
        if runner is None:
            runner = plan["runner"] = self.prepare(problem, direction)
        return runner(a, b, out)


def _wgrad_options():
    return (WORKSPACE_BOUND, WGRAD_TARGET_BLOCKS, WGRAD_MIN_SPLIT_DEPTH, WGRAD_MAX_SPLIT_DEPTH)


def _wgrad_offsets(alpha2, K, C, splits, full_split_tiles):
    """Element offsets of Xt and Dt in the backward-filter workspace (Mw starts it)."""
    mw_size, xt_size, _ = _wgrad_parts(alpha2, K, C, splits, full_split_tiles)
    return mw_size, mw_size + xt_size


def _wgrad_gemm_arguments(nhwc, batch, K, C, split_tiles, itemsize, xt_offset, dt_offset, beta):
    """cuBLAS strided-batched arguments of Mw[b] = Dt[b] Xt[b]^T (+ beta Mw[b]):
    NCHW Dt (K, st), Xt (C, st); NHWC Dt (st, K), Xt (st, C) (Mw[b] = Dt[b]^T Xt[b]);
    Mw (K, C) at the workspace start.  Split as :func:`_gemm_arguments`: (head,
    cuBLAS A = Xt offset, mid, cuBLAS B = Dt offset, tail, Mw offset, last), byte offsets."""
    dtype = _dtypes_acc(itemsize)
    one, beta_ptr = (_cublas._scalar(dtype, v).ctypes.data for v in (1.0, beta))
    st = split_tiles
    xt_bytes, dt_bytes = int(xt_offset) * itemsize, int(dt_offset) * itemsize
    # Row-major C (K x C) = op(Dt) op(Xt): cuBLAS C^T (C x K) = op'(Xt) op'(Dt), m = C, n = K, k = st.
    if nhwc:
        return ((_cublas._OP_N, _cublas._OP_T, C, K, st, one), xt_bytes, (C, st * C),
                dt_bytes, (K, st * K, beta_ptr), 0, (C, K * C, batch))
    return ((_cublas._OP_T, _cublas._OP_N, C, K, st, one), xt_bytes, (st, C * st),
            dt_bytes, (st, K * st, beta_ptr), 0, (C, K * C, batch))


# Measured float32 error against float64 (dnnprims/testing/tolerances.py; H100,
# batch-32 public layers): F(3x3, 2x2) <= 9.7e-7, F(3x3, 4x4) <= 6.0e-6, both
# within the float32 direct bound (2e-5), so precision="strict" keeps them.
WINOGRAD_WGRAD_F2 = register(WinogradBackwardFilter(2, strict=True))
WINOGRAD_WGRAD_F4 = register(WinogradBackwardFilter(4, strict=True))


# F(5x5, 2x2): the 5x5 gradient from 6 x 6 x tiles and 2 x 2 dy tiles (same points
# as F(3x3, 4x4)); measured float32 error in dnnprims/testing/tolerances.py.
WINOGRAD_WGRAD_F2_5X5 = register(WinogradBackwardFilter(2, strict=True, r=5))
# F(5x5, 3x3): 7 x 7 x tiles, 3 x 3 dy tiles (POINTS[7]; 9 x 9 tiles fit alex's 27 x 27).
WINOGRAD_WGRAD_F3_5X5 = register(WinogradBackwardFilter(3, strict=True, r=5))
# F(5x5, 4x4): 8 x 8 x tiles, 4 x 4 dy tiles, points +-1/2 added (POINTS[8]).
WINOGRAD_WGRAD_F4_5X5 = register(WinogradBackwardFilter(4, strict=True, r=5))
