"""NumPy emulation of split-K implicit GEMM (kernels/conv_implicit_gemm.cu,
conv_implicit_gemm<..., SPLIT_K> + conv_implicit_gemm_split_sum), in float64.

The real plan is used: ``ImplicitGemmConvolution(split_k=...)._plan`` (with
cupy's getDevice / asarray stood in for, no GPU) gives the name expression,
grid, block, tap table, kernel scalars and the split sum's scalars; the tile
(BM, BN, BK, TM, TN), NHWC and SPLIT_K are parsed back from the expression.
Then, block by block (blockIdx.z = g * splits + split), the threads of a block
are a NumPy vector and the kernel runs stage by stage with the CUDA's own index
arithmetic: the A gather through the tap table, the B load, the shared-memory
stores, the register tile of each thread, the epilogue's vector / scalar store
paths (the vector paths write 4 consecutive elements from the FIRST index, as
the float4 store does), then the split sum, one "thread" per element.

Checked as it runs (an AssertionError names the case):
- every tap-table, x, w and bias read is in range;
- the shared tiles: every cell of As[BK][BM] and Bs[BK][BN] written exactly
  once per stage;
- the split ranges: chunk a multiple of BK, every split non-empty,
  (splits - 1) * chunk < Kgemm <= splits * chunk, groups * splits <= 65535;
- every float4 store is 16-byte aligned (index % 4 == 0 from a 256-aligned base);
- every element of the partials (splits > 1) or of y (splits == 1) is written
  exactly once, nothing outside;
- the split sum reads only written partials, and y matches the float64
  reference (dnnprims.reference.conv) with bias and activation, relative 1e-12.

    PYTHONPATH=$PWD python notes/splitk_emulate.py           # all cases
    PYTHONPATH=$PWD python notes/splitk_emulate.py --quick   # a subset (CPU tests use it)
    PYTHONPATH=$PWD python notes/splitk_emulate.py --bugs    # planted bugs: each must be caught
"""
import contextlib
import itertools
import re
import sys
import types

import numpy as np

from dnnprims import conv as _conv
from dnnprims.activations import _KERNEL_MODE
from dnnprims.algos import implicit_gemm as ig
from dnnprims.reference import activations as ref_act
from dnnprims.reference import conv as ref

OUTSIDE = -(1 << 29)
_MODE_NAME = {v: k for k, v in _KERNEL_MODE.items()}

# Planted bugs (``--bugs``): name -> what it changes.  Each must make the emulation fail.
BUGS = {
    "chunk_not_whole_steps": "chunk = ceil(Kgemm / splits), not rounded to BK: a split's last k-step "
                             "reads the next split's taps",
    "k_end_ignored": "each split runs its k-steps to Kgemm instead of to its chunk's end",
    "no_split_offset": "every split stores its partial tile into plane 0",
    "no_group_offset": "the split epilogue forgets the group's first channel",
    "sum_skips_split0": "the split sum starts from split 1",
    "sum_channel_nchw_rule": "the split sum takes the channel as (i / (P*Q)) % K for NHWC too",
    "vector_store_unaligned": "NCHW float4 partial stores without the P*Q % 4 == 0 test",
    "bias_in_partials": "the split epilogue adds the bias, and the sum adds it again",
}


@contextlib.contextmanager
def _no_gpu():
    """Let ImplicitGemmConvolution._plan run without a GPU (device 0, NumPy table)."""
    import cupy
    saved = cupy.cuda.runtime.getDevice, cupy.asarray
    cupy.cuda.runtime.getDevice, cupy.asarray = (lambda: 0), np.asarray
    try:
        yield
    finally:
        cupy.cuda.runtime.getDevice, cupy.asarray = saved


def _parse(expression):
    m = re.fullmatch(r"conv_implicit_gemm<(\w+), (true|false), (\d+), (\d+), (\d+), (\d+), (\d+), (true|false)>",
                     expression)
    assert m, expression
    T, nhwc, bm, bn, bk, tm, tn, split = m.groups()
    return dict(T=T, NHWC=nhwc == "true", BM=int(bm), BN=int(bn), BK=int(bk), TM=int(tm), TN=int(tn),
                SPLIT_K=split == "true")


def _store_tile(out, written, base, acc, m0, n0, tm, tn, M, PQ, Ky, Kg, k, S_is_4_bytes, bug=None):
    """conv_implicit_gemm_store_tile for every thread of a block: ``out[base + index] = acc``.
    acc: (threads, TM, TN); tm, tn: (threads,)."""
    BM, BN, TM, TN, NHWC = k["BM"], k["BN"], k["TM"], k["TN"], k["NHWC"]
    M_GROUP, N_GROUP = BM * 4 // TM, BN * 4 // TN

    def put(index, value, vector):
        index = np.asarray(index)
        assert (index >= 0).all() and (index < out.size).all(), "store out of range"
        if vector:
            assert index % 4 == 0, "float4 store not 16-byte aligned"
            index = index + np.arange(4)
            assert (index < out.size).all(), "float4 store out of range"
        np.add.at(written, index, 1)
        out[index] = value

    for t in range(len(tm)):
        for i4 in range(TM // 4):
            m_first = m0 + i4 * M_GROUP + tm[t] * 4
            if m_first >= M:
                continue
            if NHWC:
                for ii in range(4):
                    m = m_first + ii
                    if m >= M:
                        break
                    row = base + m * Ky
                    for j4 in range(TN // 4):
                        n_first = n0 + j4 * N_GROUP + tn[t] * 4
                        if n_first >= Kg:
                            continue
                        v = acc[t, 4 * i4 + ii, 4 * j4:4 * j4 + 4]
                        if S_is_4_bytes and Ky % 4 == 0 and Kg % 4 == 0:
                            put(row + n_first, v, True)
                        else:
                            for jj in range(4):
                                if n_first + jj < Kg:
                                    put(row + n_first + jj, v[jj], False)
            else:
                vector_ok = S_is_4_bytes and (PQ % 4 == 0 or bug == "vector_store_unaligned")
                if vector_ok:
                    image, pq = divmod(m_first, PQ)
                    column = base + image * Ky * PQ + pq
                    for j in range(TN):
                        n = n0 + (j // 4) * N_GROUP + tn[t] * 4 + (j % 4)
                        if n >= Kg:
                            continue
                        put(column + n * PQ, acc[t, 4 * i4:4 * i4 + 4, j], True)
                else:
                    for ii in range(4):
                        m = m_first + ii
                        if m >= M:
                            break
                        image, pq = divmod(m, PQ)
                        column = base + image * Ky * PQ + pq
                        for j in range(TN):
                            n = n0 + (j // 4) * N_GROUP + tn[t] * 4 + (j % 4)
                            if n < Kg:
                                put(column + n * PQ, acc[t, 4 * i4 + ii, j], False)


def emulate(algorithm, problem, direction, a, b, bias=None, act=None, bug=None):
    """y (flat, float64) as the kernels compute it, with every check above."""
    with _no_gpu():
        algorithm._plans.clear()
        expression, grid, block, table, scalars, splits, sum_scalars = algorithm._plan(problem, direction)
    k = _parse(expression)
    (H, W, Cx, xgc, P, Q, Ky, Kg, Kgemm, w_n_stride, w_group_stride, sh, sw, ph, pw, M, chunk,
     splits_arg) = (int(v) for v in scalars)
    total, sum_splits, channels, inner = (int(v) for v in sum_scalars)
    BM, BN, BK, TM, TN, NHWC = k["BM"], k["BN"], k["BK"], k["TM"], k["TN"], k["NHWC"]
    THREADS = (BM // TM) * (BN // TN)
    assert block == (THREADS,)
    assert k["SPLIT_K"] == (splits > 1) and splits_arg == splits == sum_splits
    groups = problem.groups
    assert grid[0] * BM >= M and grid[1] * BN >= Kg and grid[2] == groups * splits <= ig.MAX_GRID_YZ
    assert total == M * Ky and channels == Ky and inner == (1 if NHWC else P * Q)
    if bug == "chunk_not_whole_steps" and splits > 1:
        chunk = -(-Kgemm // splits)
    else:
        assert chunk % BK == 0 and (splits - 1) * chunk < Kgemm <= splits * chunk, (splits, chunk, Kgemm)
    assert splits * total <= ig.INT32_LIMIT
    assert len(table) % ig.TAP_TABLE_MULTIPLE == 0 and len(table) >= Kgemm
    has_bias = bias is not None
    act_mode = int(ig.activation_arguments(act)[0])
    xs, ws = a.ravel(), b.ravel()
    PQ = P * Q

    A_LOADS, B_LOADS = BM * BK // THREADS, BN * BK // THREADS
    A_ROWS = A_LOADS if NHWC else 1
    tid = np.arange(THREADS)
    a_k0 = tid % BK if NHWC else tid // BM
    a_m0 = tid // BK if NHWC else tid % BM
    A_K_STEP = 0 if NHWC else THREADS // BM
    A_M_STEP = THREADS // BK if NHWC else 0
    b_k, b_n0, B_N_STEP = tid % BK, tid // BK, THREADS // BK
    tm = tid // (BN // TN) if NHWC else tid % (BM // TM)
    tn = tid % (BN // TN) if NHWC else tid // (BM // TM)
    M_GROUP, N_GROUP = BM * 4 // TM, BN * 4 // TN
    rows_of = (np.arange(TM) // 4)[None, :] * M_GROUP + tm[:, None] * 4 + (np.arange(TM) % 4)[None, :]
    cols_of = (np.arange(TN) // 4)[None, :] * N_GROUP + tn[:, None] * 4 + (np.arange(TN) % 4)[None, :]

    split_k = splits > 1
    out = np.full(splits * total if split_k else total, np.nan)
    written = np.zeros(out.size, np.int64)
    for z, bx, by in itertools.product(range(grid[2]), range(grid[0]), range(grid[1])):
        g = z // splits if split_k else z
        split = z - g * splits if split_k else 0
        k_begin = split * chunk if split_k else 0
        k_end = min(Kgemm, k_begin + chunk) if split_k and bug != "k_end_ignored" else Kgemm
        m0, n0 = bx * BM, by * BN
        x_off = g * xgc if NHWC else g * xgc * H * W
        w_off_g = g * w_group_stride
        # the A rows each thread decodes once
        a_h0 = np.empty((THREADS, A_ROWS), np.int64)
        a_w0 = np.empty((THREADS, A_ROWS), np.int64)
        a_base = np.empty((THREADS, A_ROWS), np.int64)
        for i in range(A_ROWS):
            m = m0 + a_m0 + i * A_M_STEP
            image, pq = np.divmod(m, PQ)
            p, q = np.divmod(pq, Q)
            h0, w0 = p * sh - ph, q * sw - pw
            ok = m < M
            a_h0[:, i] = np.where(ok, h0, OUTSIDE)
            a_w0[:, i] = np.where(ok, w0, 0)
            a_base[:, i] = np.where(ok, image * Cx * H * W + ((h0 * W + w0) * Cx if NHWC else h0 * W + w0), 0)
        acc = np.zeros((BM, BN))     # the block's accumulators; thread t owns acc[rows_of[t], cols_of[t]]
        stages = (k_end - k_begin + BK - 1) // BK
        for t in range(stages):
            k0 = k_begin + t * BK
            As = np.full((BK, BM), np.nan)
            Bs = np.full((BK, BN), np.nan)
            As_count = np.zeros((BK, BM), np.int64)
            Bs_count = np.zeros((BK, BN), np.int64)
            for i in range(A_LOADS):
                row = i if NHWC else 0
                kk = k0 + a_k0 + i * A_K_STEP
                assert (kk >= 0).all() and (kk < len(table)).all(), "tap table read out of range"
                tap = table[kk]
                hh, ww = a_h0[:, row] + tap[:, 1], a_w0[:, row] + tap[:, 2]
                inside = (hh >= 0) & (hh < H) & (ww >= 0) & (ww < W)
                index = x_off + a_base[:, row] + tap[:, 0]
                assert ((index[inside] >= 0) & (index[inside] < xs.size)).all(), "x read out of range"
                value = np.where(inside, xs[np.where(inside, index, 0)], 0.0)
                cols = a_m0 + i * A_M_STEP
                np.add.at(As_count, (a_k0 + i * A_K_STEP, cols), 1)
                As[a_k0 + i * A_K_STEP, cols] = value
            kb = k0 + b_k
            assert (kb < len(table)).all(), "tap table read out of range (B)"
            w_off = table[kb, 3]
            for i in range(B_LOADS):
                n = n0 + b_n0 + i * B_N_STEP
                ok = (kb < Kgemm) & (n < Kg)
                index = w_off_g + n * w_n_stride + w_off
                assert ((index[ok] >= 0) & (index[ok] < ws.size)).all(), "w read out of range"
                np.add.at(Bs_count, (b_k, b_n0 + i * B_N_STEP), 1)
                Bs[b_k, b_n0 + i * B_N_STEP] = np.where(ok, ws[np.where(ok, index, 0)], 0.0)
            assert (As_count == 1).all() and (Bs_count == 1).all(), "shared tile cell not written exactly once"
            acc += As.T @ Bs
        tile = acc[rows_of[:, :, None], cols_of[:, None, :]]       # (threads, TM, TN)
        if split_k:
            if bug == "bias_in_partials" and has_bias:
                n = n0 + cols_of
                tile = tile + np.where(n < Kg, bias[g * Kg + np.minimum(n, Kg - 1)], 0.0)[:, None, :]
            base = (0 if bug == "no_split_offset" else split * (M * Ky)) + \
                (0 if bug == "no_group_offset" else (g * Kg if NHWC else g * Kg * PQ))
            _store_tile(out, written, base, tile, m0, n0, tm, tn, M, PQ, Ky, Kg, k, True, bug)
        else:
            n = n0 + cols_of                                               # (threads, TN)
            bias_of = np.where(has_bias & (n < Kg), bias[g * Kg + np.minimum(n, Kg - 1)] if has_bias else 0.0,
                               0.0)
            tile = tile + bias_of[:, None, :]
            if act_mode >= 0:
                tile = ref_act.activation(tile, _MODE_NAME[act_mode], alpha=act[1])
            base = g * Kg if NHWC else g * Kg * PQ
            _store_tile(out, written, base, tile, m0, n0, tm, tn, M, PQ, Ky, Kg, k, k["T"] == "float", bug)
    assert (written == 1).all(), (f"{(written == 0).sum()} elements never written, "
                                  f"{(written > 1).sum()} written more than once")
    if not split_k:
        return out
    # conv_implicit_gemm_split_sum: y[i] = act(sum_s partials[s][i] + bias[(i / inner) % K])
    i = np.arange(total)
    first = 1 if bug == "sum_skips_split0" else 0
    s = out[first * total + i].copy()
    for sp in range(first + 1, sum_splits):
        index = sp * total + i
        assert (index < out.size).all(), "split sum read out of range"
        s += out[index]
    assert not np.isnan(s).any(), "split sum read an unwritten partial"
    if has_bias:
        use_inner = P * Q if bug == "sum_channel_nchw_rule" else inner
        channel = (i // use_inner) % channels
        assert (channel < len(bias)).all()
        s = s + bias[channel]
    if act_mode >= 0:
        s = ref_act.activation(s, _MODE_NAME[act_mode], alpha=act[1])
    return s


# (N, C, H, W, K, R, S, stride, padding, groups): stride 1 and 2, padding 0-3,
# 1x1 and 3x3 (and 5x1), groups 1 and 2, sizes 1, 3, 7, 13, channel counts that
# straddle 4 (vector stores) and the tiles' 64 / 128.
CASES = [
    (1, 3, 7, 7, 5, 3, 3, 1, 1, 1),
    (2, 8, 13, 13, 12, 3, 3, 2, 1, 1),
    (1, 13, 7, 13, 7, 1, 1, 1, 0, 1),
    (2, 6, 13, 7, 10, 3, 3, 1, 3, 2),
    (1, 16, 8, 8, 8, 1, 1, 2, 0, 2),
    (3, 5, 3, 3, 68, 3, 3, 1, 2, 1),
    (1, 24, 13, 13, 130, 1, 1, 1, 0, 1),
    (1, 4, 1, 1, 9, 1, 1, 1, 0, 1),
    (1, 7, 13, 13, 6, 5, 1, 2, 2, 1),
    (2, 10, 7, 7, 8, 3, 3, 1, 0, 2),
    (1, 33, 4, 4, 4, 3, 3, 1, 1, 1),
]
# The four batch-1 ResNet-50 layers split-K is for, and two more (forward; fp32 tiles).
R50 = [
    ("r50_3a_3x3_s2", (1, 128, 56, 56, 128, 3, 3, 2, 1, 1)),
    ("r50_3_1x1_dn", (1, 512, 28, 28, 128, 1, 1, 1, 0, 1)),
    ("r50_4_1x1_dn", (1, 1024, 14, 14, 256, 1, 1, 1, 0, 1)),
    ("r50_5_1x1_up", (1, 512, 7, 7, 2048, 1, 1, 1, 0, 1)),
    ("r50_4_3x3", (1, 256, 14, 14, 256, 3, 3, 1, 1, 1)),
    ("r50_5_3x3", (1, 512, 7, 7, 512, 3, 3, 1, 1, 1)),
]
SPLITS = [1, 2, 3, 4, 5, 7, 8, "auto"]
ACTS = [None, ("relu", None), ("leaky_relu", 0.1), ("gelu", None)]


def problem_of(case, layout, dtype="float32"):
    N, C, H, W, K, R, S, stride, padding, groups = case
    return _conv._describe((N, C, H, W) if layout == "NCHW" else (N, H, W, C), (K, C // groups, R, S),
                           stride, padding, 1, groups, layout, np.dtype(dtype))


def check(case, layout, direction, split_k, tile=None, dtype="float32", act=None, bias=True, seed=0, bug=None):
    """Emulate one case; return (relative error, splits, chunk, Kgemm)."""
    p = problem_of(case, layout, dtype)
    rng = np.random.default_rng(seed)
    algorithm = ig.ImplicitGemmConvolution(tile=tile, split_k=split_k)
    w = rng.uniform(-1, 1, p.w_shape)
    opts = (p.stride, p.padding, p.dilation, p.groups, layout)
    if direction == "forward":
        a = rng.uniform(-1, 1, p.x_shape)
        b_ = rng.uniform(-1, 1, p.K) if bias else None
        want = ref.conv2d_forward(a, w, b_, *opts)
    else:
        a = rng.uniform(-1, 1, p.y_shape)
        b_, act = None, None
        want = ref.conv2d_backward_data(a, w, p.x_shape, *opts)
    if act is not None:
        want = ref_act.activation(want, act[0], alpha=act[1])
    got = emulate(algorithm, p, direction, a, w, b_, act, bug)
    err = np.linalg.norm(got - want.ravel()) / max(np.linalg.norm(want), 1e-300)
    _, splits, chunk = algorithm.splits(p, direction)
    _, _, kgemm = ig.gemm_shape(p, direction)
    return err, splits, chunk, kgemm


def run_cases(quick=False, verbose=True):
    """Every case; raises on the first failure.  Returns (cases, worst error, splits seen)."""
    count, worst, seen, shorter = 0, 0.0, set(), 0
    cases = CASES[:5] if quick else CASES
    splits_list = [1, 3, 8, "auto"] if quick else SPLITS
    for n, (case, layout, split_k) in enumerate(itertools.product(cases, ("NCHW", "NHWC"), splits_list)):
        tiles = [None] if quick else [None, "128x128", "128x64"]
        directions = ["forward"] + (["backward_data"] if case[7] == 1 else [])
        for tile, direction in itertools.product(tiles, directions):
            dtype = ("float32", "float16", "bfloat16")[n % 3]
            act = ACTS[n % len(ACTS)]
            try:
                err, splits, chunk, kgemm = check(case, layout, direction, split_k, tile, dtype, act,
                                                  bias=n % 4 != 3, seed=n)
            except AssertionError as e:
                raise AssertionError(f"case {case} {layout} {direction} split_k={split_k} tile={tile} "
                                     f"{dtype}: {e}") from None
            assert err < 1e-12, f"case {case} {layout} {direction} split_k={split_k} tile={tile}: error {err:.3g}"
            count += 1
            worst = max(worst, err)
            seen.add(splits)
            shorter += splits > 1 and kgemm - (splits - 1) * chunk < chunk
    if not quick:
        for name, case in R50:
            for split_k in ("auto", 4):
                err, splits, chunk, kgemm = check(case, "NCHW", "forward", split_k, act=("relu", None))
                assert err < 1e-12, (name, split_k, err)
                count += 1
                worst = max(worst, err)
                seen.add(splits)
                if verbose:
                    print(f"  {name} split_k={split_k}: {splits} splits of {chunk} taps (Kgemm {kgemm}), "
                          f"error {err:.2g}", flush=True)
    if verbose:
        print(f"{count} cases, worst relative error {worst:.3g}, splits seen {sorted(seen)}, "
              f"{shorter} with a last split shorter than the others")
    return count, worst, seen


def run_bugs():
    """Each planted bug on cases that exercise it; returns {bug: caught?}."""
    targets = [((2, 8, 13, 13, 12, 3, 3, 1, 1, 2), "NCHW", 3), ((2, 8, 13, 13, 12, 3, 3, 1, 1, 2), "NHWC", 3),
               ((1, 13, 7, 13, 7, 1, 1, 1, 0, 1), "NCHW", 5)]
    caught = {}
    for bug in BUGS:
        how = []
        for case, layout, split_k in targets:
            try:
                err, *_ = check(case, layout, "forward", split_k, act=("relu", None), bug=bug)
                if err > 1e-12:
                    how.append(f"{layout}: error {err:.2g}")
            except AssertionError as e:
                how.append(f"{layout}: {e}")
        caught[bug] = bool(how)
        print(f"  {bug} ({BUGS[bug]}): {'; '.join(how) if how else 'NOT CAUGHT'}")
    return caught


if __name__ == "__main__":
    if "--bugs" in sys.argv:
        results = run_bugs()
        sys.exit(0 if all(results.values()) else 1)
    run_cases(quick="--quick" in sys.argv)
