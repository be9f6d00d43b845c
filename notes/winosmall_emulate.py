"""NumPy emulation of the WIP fused Winograd path (helper winosmall, notes/winosmall.md):
the input (+ filter) transform kernel and the new `winograd_fused_gemm_output`
kernel of kernels/conv_winograd.cu (notes/wip/winosmall_fused_gemm_output.patch),
mirroring their index math line by line, driven by the real plan of
`WinogradConvolution._plan` (grids, scalars, workspace offsets and size) so the
Python side is checked too.

Every kernel runs block by block; within a block, the threads are a NumPy
vector (tid = arange(256)).  Loops `for (e = tid; e < n; e += 256)` become one
vector over e (each e is one thread's iteration; the targets are checked to be
written exactly once).  The workspace starts as NaN (uninitialised memory, and
the fused path's workspace has no M part: any read outside U and V raises);
y starts as NaN and every element must be written exactly once.

    PYTHONPATH=$PWD python notes/winosmall_emulate.py      # random odd sizes, both directions

Needs the patch applied (winograd._fused_shape, FUSED_GEMM_OUTPUT); no GPU.
"""
import itertools
import sys
from unittest import mock

import numpy as np

THREADS = 256


def fused_shape(alpha, itemsize):
    """winograd_fused_shape<A, ALPHA> of the kernel, written again from the CUDA."""
    KB, TB, A2 = 8, 32, alpha * alpha
    pt_raw = (72 * 4) // (A2 * itemsize)
    PT = 1 if pt_raw < 1 else (4 if pt_raw > 4 else pt_raw)
    TT = TB * PT
    STAGE = A2 * (KB + TT) * itemsize
    CC = 4 if 4 * STAGE <= 48 * 1024 else (2 if 2 * STAGE <= 48 * 1024 else 1)
    return KB, TB, PT, TT, CC


class Memory:
    """A flat device allocation: reads must be in range and not NaN-initialised
    (unless allowed); writes are counted."""

    def __init__(self, values, name):
        self.values, self.name = values, name
        self.writes = np.zeros(values.size, np.int64)

    def read(self, index):
        index = np.asarray(index, np.int64)
        assert index.size == 0 or (index.min() >= 0 and index.max() < self.values.size), \
            f"{self.name}: read out of range"
        out = self.values[index]
        assert not np.isnan(out).any(), f"{self.name}: read of unwritten memory"
        return out

    def write(self, index, values):
        index = np.asarray(index, np.int64)
        assert index.size == 0 or (index.min() >= 0 and index.max() < self.values.size), \
            f"{self.name}: write out of range"
        np.add.at(self.writes, index, 1)
        self.values[index] = values


def transform_2d(L, x):
    """transform_2d<L, OUT, IN>: y = L x L^T, x (..., IN, IN) -> (..., OUT, OUT)."""
    return np.einsum("rj,...js,ts->...rt", L, x, L)


def input_transform(grid, args, x, ws, w, mats, M, R, nhwc):
    """winograd_input_transform<T, M, R, NHWC>(x, workspace, v_offset, C, H, W, pad_h,
    pad_w, tiles_h, tiles_w, tiles, n0, input_blocks, w, Kout, rotate)."""
    at, g, bt = mats
    ALPHA = M + R - 1
    (v_offset, C, H, W, pad_h, pad_w, tiles_h, tiles_w, tiles, n0, input_blocks, Kout, rotate) = (
        int(a) for a in args)
    tid = np.arange(THREADS)
    for block in range(grid[0]):
        if block >= input_blocks:
            i = (block - input_blocks) * THREADS + tid
            i = i[i < Kout * C]                                   # filter_transform_pair
            cin, kout = i % C, i // C
            rr, ss = np.arange(R)[:, None], np.arange(R)[None, :]
            if rotate:
                idx = ((cin[:, None, None] * Kout + kout[:, None, None]) * R + R - 1 - rr) * R + R - 1 - ss
            else:
                idx = ((kout[:, None, None] * C + cin[:, None, None]) * R + rr) * R + ss
            ggg = transform_2d(g, w.read(idx))
            plane = Kout * C
            a = np.arange(ALPHA * ALPHA)
            ws.write(i[:, None] + a[None, :] * plane, ggg.reshape(-1, ALPHA * ALPHA))   # U: offset 0
            continue
        i = block * THREADS + tid
        i = i[i < C * tiles]
        c = i % C if nhwc else i // tiles
        t = i // C if nhwc else i % tiles
        tw = t % tiles_w
        th = (t // tiles_w) % tiles_h
        n = n0 + t // (tiles_w * tiles_h)
        h = (th * M - pad_h)[:, None, None] + np.arange(ALPHA)[None, :, None]
        ww = (tw * M - pad_w)[:, None, None] + np.arange(ALPHA)[None, None, :]
        inside = (h >= 0) & (h < H) & (ww >= 0) & (ww < W)
        nn, cc = n[:, None, None], c[:, None, None]
        idx = ((nn * H + h) * W + ww) * C + cc if nhwc else ((nn * C + cc) * H + h) * W + ww
        d = np.zeros(idx.shape)
        d[inside] = x.read(idx[inside])
        bdb = transform_2d(bt, d)
        plane = C * tiles
        off = t * C + c if nhwc else c * tiles + t
        a = np.arange(ALPHA * ALPHA)
        ws.write(v_offset + off[:, None] + a[None, :] * plane, bdb.reshape(-1, ALPHA * ALPHA))


def fused_gemm_output(grid, args, ws, bias, y, mats, M, R, nhwc, itemsize):
    """winograd_fused_gemm_output<T, M, R, NHWC>(workspace, v_offset, bias, has_bias, y,
    Cin, K, P, Q, tiles_h, tiles_w, tiles, n0, vec_rows, pt_shift), block by block."""
    at = mats[0]
    ALPHA = M + R - 1
    KB, TB, PT, TT, CC = fused_shape(ALPHA, itemsize)
    A2 = ALPHA * ALPHA
    assert KB * TB == THREADS
    (v_offset, has_bias, Cin, K, P, Q, tiles_h, tiles_w, tiles, n0, vec_rows, pt_shift) = (int(a) for a in args)
    assert PT & (PT - 1) == 0 and CC & (CC - 1) == 0          # the kernel's static_assert
    pt = 1 << pt_shift
    TTr = TB << pt_shift
    assert pt <= PT                                           # Python's promise (vs holds TT = TB * PT)
    u_plane, v_plane = K * Cin, Cin * tiles
    tid = np.arange(THREADS)
    tt, tk = tid % TB, tid // TB
    for by, bx in itertools.product(range(grid[1]), range(grid[0])):
        for k0 in range(by * KB, K, grid[1] * KB):
            for t0 in range(bx * TTr, tiles, grid[0] * TTr):
                acc = np.zeros((A2, PT, THREADS))               # acc[a][j] of every thread
                for c0 in range(0, Cin, CC):
                    us = np.full((A2, CC, KB), np.nan)
                    vs = np.full((A2, CC, TT), np.nan)
                    # U stage: e = (a * KB + kk) * CC + cc
                    e = np.arange(A2 * KB * CC)
                    cc, kk, a = e % CC, (e // CC) % KB, e // (CC * KB)
                    c, k = c0 + cc, k0 + kk
                    live = (c < Cin) & (k < K)
                    val = np.zeros(e.size)
                    val[live] = ws.read(a[live] * u_plane + k[live] * Cin + c[live])
                    assert np.unique((a * CC + cc) * KB + kk).size == e.size == us.size   # each cell once
                    us[a, cc, kk] = val
                    # V stage
                    e = np.arange((A2 * CC * TB) << pt_shift)
                    if nhwc:
                        cc, tl, a = e % CC, (e // CC) & (TTr - 1), (e // CC) >> (5 + pt_shift)
                    else:
                        tl, cc, a = e & (TTr - 1), (e >> (5 + pt_shift)) % CC, (e >> (5 + pt_shift)) // CC
                    c, t = c0 + cc, t0 + tl
                    live = (c < Cin) & (t < tiles)
                    val = np.zeros(e.size)
                    off = t * Cin + c if nhwc else c * tiles + t
                    val[live] = ws.read(v_offset + a[live] * v_plane + off[live])
                    assert np.unique((a * CC + cc) * TT + tl).size == e.size == A2 * CC * TTr
                    assert tl.max() < TTr
                    vs[a, cc, tl] = val                      # cells tl >= TTr stay NaN: never read
                    # __syncthreads(); the products in the kernel's order: cc, then a, then j
                    for cc in range(CC):
                        for a in range(A2):
                            uv = us[a, cc, tk]
                            for j in range(PT):
                                if j < pt:
                                    acc[a, j] += uv * vs[a, cc, tt + j * TB]
                    # __syncthreads()
                k = k0 + tk
                b = np.where(k < K, bias.read(np.minimum(k, K - 1)) if has_bias else 0.0, 0.0)
                for j in range(PT):
                    t = t0 + tt + j * TB
                    live = (k < K) & (t < tiles) & (j < pt)
                    if not live.any():
                        continue
                    mt = acc[:, j, live].T.reshape(-1, ALPHA, ALPHA)   # mt[r][s] = acc[r * ALPHA + s][j]
                    out = transform_2d(at, mt)
                    tl_, kl, bl = t[live], k[live], b[live]
                    tw = tl_ % tiles_w
                    th = (tl_ // tiles_w) % tiles_h
                    n = n0 + tl_ // (tiles_w * tiles_h)
                    store_tile(y, out, bl, n, kl, K, P, Q, th * M, tw * M, M, nhwc, vec_rows != 0)


def store_tile(y, out, b, n, k, K, P, Q, p0, q0, M, nhwc, vec):
    """winograd_store_tile<T, M, NHWC> (and store_row) for a vector of threads."""
    out = out + b[:, None, None]
    for r in range(M):
        p = p0 + r
        row = p < P                                   # `break` once p >= P: rows are increasing
        for s in range(M):
            if nhwc:
                ok = row & (q0 + s < Q)
                y.write((((n * P + p) * Q + q0 + s) * K + k)[ok], out[ok, r, s])
            else:
                count = Q - q0
                # vector store when vec && count >= M: the same M values as the scalar stores
                ok = row & ((vec & (count >= M)) | (s < count))
                y.write((((n * K + k) * P + p) * Q + q0 + s)[ok], out[ok, r, s])


def run_plan(algorithm, problem, direction, a, b, bias):
    """WinogradConvolution's fused run (_prepare_fused) on NumPy: the plan's launches, in order."""
    from dnnprims.algos import winograd
    with mock.patch("cupy.cuda.runtime.getDevice", return_value=0), \
            mock.patch.object(winograd, "FUSED_GEMM_OUTPUT", True):
        plan = algorithm._plan(problem, direction)
    assert plan["fused"] is not None
    m, r = algorithm.m, algorithm.r
    mats = winograd.matrices(m, np.float64, r=r)
    itemsize = plan["acc"].itemsize
    assert winograd._fused_shape(algorithm.alpha, itemsize) == fused_shape(algorithm.alpha, itemsize)
    nhwc = plan["nhwc"]
    ws = Memory(np.full(plan["elements"], np.nan), "workspace")
    x = Memory(np.asarray(a, np.float64).ravel().copy(), "x")
    w = Memory(np.asarray(b, np.float64).ravel().copy(), "w")
    Cin, _, _, Kout, Pout, Qout, _, _ = winograd.geometry(problem, direction)
    out_shape = problem.y_shape if direction == "forward" else problem.x_shape
    y = Memory(np.full(int(np.prod(out_shape)), np.nan), "y")
    bias_mem = Memory(np.asarray(bias, np.float64).copy() if bias is not None else np.zeros(1), "bias")
    assert plan["filter"] is None or not winograd.FILTER_IN_INPUT_LAUNCH
    if plan["filter"] is not None:
        expr, grid, args = plan["filter"]
        input_transform(grid, (plan["v_offset"], *args, *plan["filter_args"]), x, ws, w, mats, m, r, nhwc)
    for (n0, t, in_grid, in_args, _, _, _), (grid, args, pt_shift) in zip(plan["chunks"], plan["fused"]):
        input_transform(in_grid, (plan["v_offset"], *in_args, *plan["filter_args"]), x, ws, w, mats, m, r, nhwc)
        fused_gemm_output(grid, (plan["v_offset"], bias is not None, *args, plan["vec_rows"], pt_shift),
                          ws, bias_mem, y, mats, m, r, nhwc, itemsize)
    assert (y.writes == 1).all(), f"y: {np.sum(y.writes == 0)} unwritten, {np.sum(y.writes > 1)} written twice"
    return y.values.reshape(out_shape), plan


def check(m, r, N, C, H, W, K, padding, layout, direction, seed, bound=None, dtype="float32", min_blocks=None):
    """One case against the float64 reference; returns (relative error, plan).  ``min_blocks``:
    winograd.FUSED_MIN_BLOCKS for the plan (1: every thread takes the kernel's PT tiles;
    the default, 132, gives small problems one tile a thread)."""
    import dnnprims
    from dnnprims import algos
    from dnnprims.algos import winograd
    from dnnprims.conv import conv2d_backward_data, conv2d_forward
    rng = np.random.default_rng(seed)
    x_shape = (N, C, H, W) if layout == "NCHW" else (N, H, W, C)
    p = dnnprims.conv._describe(x_shape, (K, C, r, r), 1, padding, 1, 1, layout, dtype)
    name = f"winograd_f{m}x{m}_{r}x{r}"
    algorithm = algos.REGISTRY[name]
    assert algorithm.supports(p, direction)[0], algorithm.supports(p, direction)
    w = rng.standard_normal((K, C, r, r))
    with mock.patch.object(winograd, "WORKSPACE_BOUND", bound or winograd.WORKSPACE_BOUND), \
            mock.patch.object(winograd, "FUSED_MIN_BLOCKS", min_blocks or winograd.FUSED_MIN_BLOCKS):
        if direction == "forward":
            x, b = rng.standard_normal(x_shape), rng.standard_normal(K)
            got, plan = run_plan(algorithm, p, direction, x, w, b)
            want = conv2d_forward(x, w, b, padding=padding, layout=layout)
        else:
            dy = rng.standard_normal(p.y_shape)
            got, plan = run_plan(algorithm, p, direction, dy, w, None)
            want = conv2d_backward_data(dy, w, x_shape, padding=padding, layout=layout)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want)), plan


CASES = [
    # (N, C, H, W, K, padding, layout): sizes 1, 3, 7, 13; odd channel counts straddling
    # the block's 8 channels and the CC stage; tiles straddling TT.
    (1, 1, 1, 1, 1, 1, "NCHW"),
    (2, 3, 7, 13, 7, 1, "NCHW"),
    (1, 13, 13, 7, 3, 1, "NHWC"),
    (3, 7, 3, 7, 13, 0, "NCHW"),
    (2, 5, 9, 11, 9, 2, "NHWC"),
    (1, 9, 13, 13, 17, 3, "NCHW"),          # backward data crops (padding r - 1 - 3 < 0)
    (1, 6, 16, 24, 5, 1, "NCHW"),           # Q % 4 == 0: the vector rows
    (2, 4, 20, 12, 3, 1, "NHWC"),
]


def main():
    from dnnprims.algos import winograd
    worst = 0.0
    rows = 0
    shifts = set()
    for (m, r), case, direction in itertools.product(winograd.VARIANTS, CASES, ("forward", "backward_data")):
        N, C, H, W, K, pad, layout = case
        pad = pad + r - 3
        if H + 2 * pad < r or W + 2 * pad < r:
            continue
        for dtype, min_blocks in itertools.product(("float32", "float64"), (None, 1)):
            err, plan = check(m, r, N, C, H, W, K, pad, layout, direction, seed=rows, dtype=dtype,
                              min_blocks=min_blocks)
            shifts.add(int(plan["fused"][0][2]))
            rows += 1
            worst = max(worst, err)
            assert err < 1e-12, (m, r, case, direction, dtype, err)
    # Several batch chunks (a workspace bound of one image: the filter blocks ride on the first).
    for (m, r), direction in itertools.product(winograd.VARIANTS, ("forward", "backward_data")):
        err, plan = check(m, r, 3, 5, 7, 9, 6, (r - 1) // 2, "NCHW", direction, seed=rows, bound=1)
        assert len(plan["chunks"]) == 3, plan["chunks"]
        rows += 1
        worst = max(worst, err)
        assert err < 1e-12, (m, r, direction, err)
    assert shifts == {0, 1, 2}, shifts          # one, two and four tiles a thread all ran
    print(f"winosmall emulation: {rows} cases (5 variants x sizes 1/3/7/13 x NCHW/NHWC x forward/backward data "
          f"x acc float32/float64 shapes x pt 1 / PT, + chunked), tiles a thread {sorted(1 << s for s in shifts)}, "
          f"worst relative error vs float64 reference {worst:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
