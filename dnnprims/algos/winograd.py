"""The "winograd" algorithms: Winograd minimal filtering F(m x m, 3 x 3) for 3x3
filters, stride 1, dilation 1, any padding, groups 1; forward and backward data
(kernels/conv_winograd.cu).

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

Backward data of a 3x3 stride-1 convolution is a 3x3 stride-1 convolution of
dy with the filter rotated by 180 degrees, C and K swapped, padding 2 - p (the
filter transform reads the rotated filter; nothing is copied).

The transforms are derived here, in exact rational arithmetic, from the
interpolation points (:func:`toom_cook`); ``kernels/conv_winograd_matrices.cuh``
is generated from them (``python -m dnnprims.algos.winograd`` rewrites it, and
a test checks it is current).  :func:`emulate` runs the same three stages on
NumPy: the tests and the accuracy measurement use it.
"""
import functools
import math
from fractions import Fraction

import numpy as np

from .. import _dtypes
from .._cublas import gemm
from .._kernels import KERNEL_DIR, KernelFamily, ceil_div
from .._validate import INT32_LIMIT
from . import ConvAlgorithm, register

# Interpolation points of the Toom-Cook construction; None is the point at
# infinity (the product's leading coefficient, g[r-1] * d-term: free of growth).
# Why these: alpha - 1 finite points plus infinity give alpha evaluations; the
# transform entries grow like |p|^(alpha-2), so the smallest magnitudes are best
# -- 0 and +-1 (exact, entries 0/+-1), then +-2 for F(4, 3) (powers of two,
# still exact in binary floating point).  The ill-conditioning that +-2 brings
# is what makes F(4x4, 3x3) lose precision (measured: notes/conv_wino.md).
POINTS = {
    2: (0, 1, -1, None),
    4: (0, 1, -1, 2, -2, None),
}
FILTER_SIZE = 3

SUPPORTED_DTYPES = ("float32", "float64", "float16", "bfloat16")
# V and M of one batch chunk stay under this many bytes (at least one image).
WORKSPACE_BOUND = 512 * 2**20
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
    points = POINTS[m] if points is None else tuple(points)
    alpha = m + r - 1
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


def correlate_1d(d, g):
    """y[i] = sum_j d[i + j] g[j], the definition the transforms must reproduce."""
    m = len(d) - len(g) + 1
    return [sum(d[i + j] * g[j] for j in range(len(g))) for i in range(m)]


def apply_1d(m, d, g):
    """A^T [(G g) * (B^T d)] in exact arithmetic."""
    at, gm, bt = toom_cook(m)
    u = [sum(row[j] * g[j] for j in range(len(g))) for row in gm]
    v = [sum(row[j] * d[j] for j in range(len(d))) for row in bt]
    return [sum(row[a] * u[a] * v[a] for a in range(len(u))) for row in at]


def matrices(m, dtype=np.float64):
    """(A^T, G, B^T) of F(m, 3) as arrays (each entry rounded once from the exact value)."""
    return tuple(np.array([[float(v) for v in row] for row in mat], dtype=dtype)
                 for mat in toom_cook(m))


def _c_value(v):
    """An exact C literal (or constant quotient) for a Fraction."""
    if v.denominator == 1:
        return f"{v.numerator}.0"
    return f"{v.numerator}.0 / {v.denominator}.0"


def matrices_header():
    """The text of kernels/conv_winograd_matrices.cuh, generated from toom_cook()."""
    lines = [
        "// Winograd F(m x m, 3 x 3) transform matrices, GENERATED by",
        "// `python -m dnnprims.algos.winograd` from the Toom-Cook points in",
        "// dnnprims/algos/winograd.py (POINTS; derivation in toom_cook()). Do not edit:",
        "// tests/test_conv_winograd.py checks this file against the generator.",
        "//",
        "// winograd_matrices<M>::at(i, j) = A^T[i][j] (M x ALPHA), g(i, j) = G[i][j]",
        "// (ALPHA x 3), bt(i, j) = B^T[i][j] (ALPHA x ALPHA), exact rationals evaluated",
        "// in double at compile time; with the transform loops fully unrolled the",
        "// lookups fold into immediate operands and the zero terms disappear.",
        "#pragma once",
        "",
        "template <int M> struct winograd_matrices;",
    ]
    for m in sorted(POINTS):
        at, g, bt = toom_cook(m)
        alpha = len(bt)
        points = ", ".join("inf" if p is None else str(p) for p in POINTS[m])
        lines += ["", f"// F({m}x{m}, 3x3), points {points}",
                  f"template <> struct winograd_matrices<{m}> {{",
                  f"    static constexpr int ALPHA = {alpha};"]
        for name, mat in (("at", at), ("g", g), ("bt", bt)):
            rows = ", ".join("{" + ", ".join(_c_value(v) for v in row) + "}" for row in mat)
            lines += [f"    static __device__ __forceinline__ double {name}(int i, int j) {{",
                      f"        constexpr double v[{len(mat)}][{len(mat[0])}] = {{{rows}}};",
                      "        return v[i][j];",
                      "    }"]
        lines.append("};")
    return "\n".join(lines) + "\n"


# --- the three stages on NumPy (tests, accuracy measurement) ---------------------------

def emulate(x, w, m, padding=(1, 1), acc_dtype=np.float32, direction="forward"):
    """The three stages of the GPU path on NumPy, NCHW, arithmetic in ``acc_dtype``
    (matrices rounded to it once): forward y = conv(x, w), or, for
    ``direction="backward_data"``, dx from x := dy (same rotation and padding
    2 - p as the kernels).  Returns an ``acc_dtype`` array."""
    at, g, bt = (a.astype(acc_dtype) for a in matrices(m))
    alpha = m + 2
    x = np.asarray(x).astype(acc_dtype)
    w = np.asarray(w).astype(acc_dtype)
    ph, pw = padding
    if direction == "backward_data":
        w = w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)    # rotated, C and K swapped
        ph, pw = 2 - ph, 2 - pw
    N, C, H, W = x.shape
    K = w.shape[0]
    P, Q = H + 2 * ph - 2, W + 2 * pw - 2
    th, tw = ceil_div(P, m), ceil_div(Q, m)
    # Input padded (or cropped, for negative padding) so that every tile is in range.
    canvas = np.zeros((N, C, th * m + 2, tw * m + 2), acc_dtype)
    h0, h1 = max(0, -ph), min(H, th * m + 2 - ph)
    w0, w1 = max(0, -pw), min(W, tw * m + 2 - pw)
    canvas[:, :, h0 + ph:h1 + ph, w0 + pw:w1 + pw] = x[:, :, h0:h1, w0:w1]
    s = canvas.strides
    tiles = np.lib.stride_tricks.as_strided(
        canvas, (N, C, th, tw, alpha, alpha), (s[0], s[1], m * s[2], m * s[3], s[2], s[3]))
    v = np.einsum("ai,nctuij,bj->abcntu", bt, tiles, bt).reshape(alpha * alpha, C, N * th * tw)
    u = np.einsum("ai,kcij,bj->abkc", g, w, g).reshape(alpha * alpha, K, C)
    mm = np.matmul(u, v).reshape(alpha, alpha, K, N, th, tw)
    y = np.einsum("ia,abkntu,jb->nktiuj", at, mm, at).reshape(N, K, th * m, tw * m)
    return np.ascontiguousarray(y[:, :, :P, :Q])


# --- the GPU algorithm ---------------------------------------------------------------

def _expression(kernel, dtype, m, nhwc=None):
    t = _dtypes.cuda_type(np.dtype(dtype))
    if nhwc is None:
        return f"{kernel}<{t}, {m}>"
    return f"{kernel}<{t}, {m}, {'true' if nhwc else 'false'}>"


FAMILY = KernelFamily("conv_winograd.cu", [
    expr
    for dtype in SUPPORTED_DTYPES for m in sorted(POINTS)
    for expr in ([_expression("winograd_filter_transform", dtype, m)]
                 + [_expression(k, dtype, m, nhwc) for k in ("winograd_input_transform",
                                                             "winograd_output_transform")
                    for nhwc in (False, True)])
])


def geometry(p, direction):
    """(Cin, Hin, Win, Kout, Pout, Qout, pad_h, pad_w) of the Winograd convolution
    that computes ``direction`` (backward data: over dy, channels swapped)."""
    if direction == "forward":
        return p.C, p.H, p.W, p.K, p.P, p.Q, p.padding[0], p.padding[1]
    return p.K, p.P, p.Q, p.C, p.H, p.W, 2 - p.padding[0], 2 - p.padding[1]


@functools.lru_cache(maxsize=4096)
def _sizes_at(p, direction, m, bound):
    """(tiles per image, images per chunk, bytes of U, bytes of V + M per image)."""
    Cin, _, _, Kout, Pout, Qout, _, _ = geometry(p, direction)
    alpha2 = (m + 2) ** 2
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


def _batched_gemm(nhwc, u, v, mm):
    """mm[a] = u[a] @ v[a] (NCHW) or v[a] @ u[a]^T (NHWC): cuBLAS strided-batched
    GEMMs in u's dtype (no TF32), called directly (dnnprims._cublas): cupy.matmul
    costs tens of microseconds of host time per call, which small layers feel."""
    import cupy
    if nhwc:
        gemm(cupy, v, u, mm, trans_b=True)
    else:
        gemm(cupy, u, v, mm)


def workspace_views(workspace, alpha2, Kout, Cin, tiles, nhwc):
    """U, V and M of ``tiles`` tiles, as views of the one workspace allocation
    (laid out by :func:`_workspace_parts`)."""
    u_size, v_size, _ = _workspace_parts(alpha2, Kout, Cin, tiles)
    u = workspace[:alpha2 * Kout * Cin].reshape(alpha2, Kout, Cin)
    v = workspace[u_size:u_size + alpha2 * Cin * tiles]
    m = workspace[u_size + v_size:u_size + v_size + alpha2 * Kout * tiles]
    if nhwc:
        return u, v.reshape(alpha2, tiles, Cin), m.reshape(alpha2, tiles, Kout)
    return u, v.reshape(alpha2, Cin, tiles), m.reshape(alpha2, Kout, tiles)


class WinogradConvolution(ConvAlgorithm):
    directions = ("forward", "backward_data")
    # Measured float32 error (dnnprims/testing/tolerances.py): F(2x2) 5.1e-7,
    # F(4x4) 3.4e-6 normwise at C = 512, both within the float32 direct bound
    # (2e-5), so precision="strict" admits both.
    strict = True

    def __init__(self, m):
        self.m = m
        self.alpha = m + 2
        self.name = f"winograd_f{m}x{m}_3x3"
        self._plans = {}

    def supports(self, problem, direction):
        ok, reason = super().supports(problem, direction)
        if not ok:
            return ok, reason
        p = problem
        if (p.R, p.S) != (3, 3):
            return False, f"it is F({self.m}x{self.m}, 3x3): 3x3 filters only, not {p.R}x{p.S}"
        if p.stride != (1, 1) or p.dilation != (1, 1):
            return False, "it needs stride 1 and dilation 1"
        if p.groups != 1:
            return False, "it handles ungrouped convolutions only (groups == 1)"
        if p.dtype not in SUPPORTED_DTYPES:
            return False, f"it supports {', '.join(SUPPORTED_DTYPES)}, not {p.dtype}"
        if max(p.N * p.C * p.H * p.W, p.N * p.K * p.P * p.Q) > INT32_LIMIT:
            return False, "it indexes with 32-bit ints; a tensor here has 2^31 elements or more"
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
        import cupy

        key = (cupy.cuda.runtime.getDevice(), p, direction, WORKSPACE_BOUND)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        m, alpha2 = self.m, self.alpha ** 2
        Cin, Hin, Win, Kout, Pout, Qout, ph, pw = geometry(p, direction)
        nhwc = p.layout == "NHWC"
        tiles_h, tiles_w = ceil_div(Pout, m), ceil_div(Qout, m)
        tiles, chunk, _, _ = _sizes(p, direction, m)
        i32 = np.int32
        chunks = []
        for n0 in range(0, p.N, chunk):
            t = (min(p.N, n0 + chunk) - n0) * tiles
            chunks.append((
                i32(n0), t,
                (ceil_div(Cin * t, _THREADS),),
                (i32(Cin), i32(Hin), i32(Win), i32(ph), i32(pw), i32(tiles_h), i32(tiles_w),
                 i32(t), i32(n0)),
                (ceil_div(Kout * t, _THREADS),),
                (i32(Kout), i32(Pout), i32(Qout), i32(tiles_h), i32(tiles_w), i32(t), i32(n0))))
        plan = dict(
            acc=_dtypes.accumulate_dtype(np.dtype(p.dtype)), Cin=Cin, Kout=Kout, alpha2=alpha2,
            nhwc=nhwc, chunks=chunks, max_tiles=chunk * tiles,
            filter=(_expression("winograd_filter_transform", p.dtype, m),
                    (ceil_div(Kout * Cin, _THREADS),),
                    (i32(Kout), i32(Cin), i32(direction == "backward_data"))),
            input=_expression("winograd_input_transform", p.dtype, m, nhwc),
            output=_expression("winograd_output_transform", p.dtype, m, nhwc))
        if len(self._plans) >= _PLAN_CACHE_SIZE:
            self._plans.clear()
        self._plans[key] = plan
        return plan

    def run(self, problem, direction, a, b, out, bias=None, activation=None):
        import cupy

        plan = self._plan(problem, direction)
        Cin, Kout, alpha2, nhwc = plan["Cin"], plan["Kout"], plan["alpha2"], plan["nhwc"]
        workspace = cupy.empty(sum(_workspace_parts(alpha2, Kout, Cin, plan["max_tiles"])),
                               dtype=plan["acc"])
        u, _, _ = workspace_views(workspace, alpha2, Kout, Cin, plan["max_tiles"], nhwc)
        expr, grid, args = plan["filter"]
        FAMILY.launch(expr, grid, (_THREADS,), (b, u, *args))
        has_bias = np.int32(bias is not None)
        bias = b if bias is None else bias
        for n0, t, in_grid, in_args, out_grid, out_args in plan["chunks"]:
            # A short last chunk uses less of the workspace.
            _, v, mm = workspace_views(workspace, alpha2, Kout, Cin, t, nhwc)
            FAMILY.launch(plan["input"], in_grid, (_THREADS,), (a, v, *in_args))
            _batched_gemm(nhwc, u, v, mm)
            FAMILY.launch(plan["output"], out_grid, (_THREADS,), (mm, bias, has_bias, out, *out_args))
        return out


WINOGRAD_F2 = register(WinogradConvolution(2))
WINOGRAD_F4 = register(WinogradConvolution(4))


if __name__ == "__main__":   # regenerate the constant header
    path = KERNEL_DIR / MATRICES_HEADER
    path.write_text(matrices_header())
    print(f"wrote {path}")
