"""CPU emulation of softmax_forward_channels_cluster's index math and reduction order
(kernels/softmax.cu; notes/chsoft3x.md), float32 in NumPy, against the float64 reference:
every (cluster tile, rank, ty, tx, slot k, position e) as the kernel maps it, loads of rows
not held = -inf, the block reduce in ty order, the cluster merge in rank order, the ONE
(offset, sum) exchange with its guards, the scalar (VEC4 false) position layout.  Checks that
every output element is written exactly once and matches the reference.
    python notes/chsoft3x_emulate.py"""
import itertools
import sys

import numpy as np

sys.path.insert(0, ".")
from dnnprims.reference import softmaxes as ref  # noqa: E402

F = np.float32
NINF = F(-np.inf)


def emulate(x, log, cl, tw, vec4, one):
    outer, n, inner = x.shape
    cy, K, VEC = 256 // tw, 8, 4
    slice_ = cy * K
    flat = x.reshape(-1)
    y = np.full(flat.shape, np.nan, F)
    written = np.zeros(flat.shape, np.int32)
    tiles_per_outer = -(-inner // (tw * VEC))
    for t in range(outer * tiles_per_outer):
        o = t // tiles_per_outer
        p0 = (t - o * tiles_per_outer) * tw * VEC
        # per block: v[ty][tx][k][e], addresses
        V, addr = {}, {}
        for rank, ty, tx in itertools.product(range(cl), range(cy), range(tw)):
            r0 = rank * slice_ + ty
            first = o * n * inner + min(r0, n) * inner + p0 + (tx * VEC if vec4 else tx)
            for k, e in itertools.product(range(K), range(VEC)):
                row = r0 + k * cy < n
                pos = p0 + tx * VEC + e if vec4 else p0 + tx + e * tw
                ok = row and (p0 + tx * VEC < inner if vec4 else pos < inner)
                a = first + k * cy * inner + (e if vec4 else e * tw)
                if ok:
                    assert a == o * n * inner + (r0 + k * cy) * inner + pos
                V[rank, ty, tx, k, e] = flat[a] if ok else NINF
                addr[rank, ty, tx, k, e] = a if ok else None

        def thread_partial(rank, ty, tx, e, f, init, vals):
            acc = F(init)
            for k in range(K):
                acc = f(acc, vals[rank, ty, tx, k, e])
            return acc

        def block_reduce(part, f):  # part[rank, ty, tx, e] -> [rank, tx, e] in ty order
            out = {}
            for rank, tx, e in itertools.product(range(cl), range(tw), range(VEC)):
                acc = part[rank, 0, tx, e]
                for j in range(1, cy):
                    acc = f(acc, part[rank, j, tx, e])
                out[rank, tx, e] = acc
            return out

        fmax = lambda a, b: F(np.fmax(a, b))  # noqa: E731
        fadd = lambda a, b: F(a + b)  # noqa: E731
        keys = list(itertools.product(range(cl), range(cy), range(tw)))
        m = {(r, ty, tx, e): thread_partial(r, ty, tx, e, fmax, NINF, V) for r, ty, tx in keys for e in range(VEC)}
        mb = block_reduce(m, fmax)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            if not one:
                mg = {}
                for tx, e in itertools.product(range(tw), range(VEC)):
                    acc = mb[0, tx, e]
                    for r in range(1, cl):
                        acc = fmax(acc, mb[r, tx, e])
                    mg[tx, e] = acc
                off = {(r, tx, e): mg[tx, e] for r in range(cl) for tx in range(tw) for e in range(VEC)}
            else:
                off = {k_: (F(0) if v == NINF else v) for k_, v in mb.items()}
            C, D = {}, {}
            for (r, ty, tx, k, e), v in V.items():
                c = F(v - off[r, tx, e])
                C[r, ty, tx, k, e], D[r, ty, tx, k, e] = c, F(np.exp(np.float64(c)))
            s = {(r, ty, tx, e): thread_partial(r, ty, tx, e, fadd, 0, D) for r, ty, tx in keys for e in range(VEC)}
            sb = block_reduce(s, fadd)
            scale = {}
            for tx, e in itertools.product(range(tw), range(VEC)):
                if not one:
                    acc = sb[0, tx, e]
                    for r in range(1, cl):
                        acc = fadd(acc, sb[r, tx, e])
                    for r in range(cl):
                        scale[r, tx, e] = F(np.log(acc)) if log else F(F(1) / acc)
                else:
                    gm = NINF
                    for r in range(cl):
                        if sb[r, tx, e] != 0:
                            gm = fmax(gm, off[r, tx, e])
                    gs = F(0)
                    for r in range(cl):
                        if sb[r, tx, e] != 0:
                            gs = F(gs + F(sb[r, tx, e] * F(np.exp(np.float64(F(off[r, tx, e] - gm))))))
                    for r in range(cl):
                        ob, sl = off[r, tx, e], sb[r, tx, e]
                        if log:
                            scale[r, tx, e] = F(F(gm - ob) + F(np.log(gs)))
                        else:
                            scale[r, tx, e] = (F(F(np.exp(np.float64(F(ob - gm)))) / gs) if sl != 0
                                               else F(0) if gs != 0 else F(np.nan))
            for (r, ty, tx, k, e), a in addr.items():
                if a is None:
                    continue
                y[a] = F(C[r, ty, tx, k, e] - scale[r, tx, e]) if log else F(D[r, ty, tx, k, e] * scale[r, tx, e])
                written[a] += 1
    assert (written == 1).all(), "every output written exactly once"
    return y.reshape(x.shape)


def main():
    rng = np.random.default_rng(3)
    cases = [((2, 200, 128), True), ((1, 256, 130), False), ((2, 129, 64), True), ((1, 160, 136), False),
             ((1, 256, 260), True)]
    for (shape, vec4), (cl, tw), one, log in itertools.product(cases, ((2, 16), (4, 32), (8, 64)), (False, True),
                                                               (False, True)):
        if (not vec4 or one) and cl == 8:
            continue
        if vec4 and shape[2] % 4:
            continue
        outer, n, inner = shape
        if not (max(129, cl * (256 // tw) * 8 // 2 + 1) <= n <= cl * (256 // tw) * 8) or inner < 4 * tw:
            continue
        x = rng.uniform(-8, 8, shape).astype(F)
        x[:, :, 0] = -np.inf                      # fully masked column -> NaN
        x[0, 5, 1] = np.nan                       # one NaN -> the column NaN
        x[:, ::3, 2] = -np.inf                    # partly masked
        x[:, n // 2:, 3] = -np.inf                # upper ranks' blocks all -inf (ONE's guard)
        x[:, :, 5] = rng.uniform(-1, 1, n) * 1e30
        x[:, :, 6] = rng.uniform(-60, 60, n) - 1000.0
        got = emulate(x, log, cl, tw, vec4, one)
        with np.errstate(invalid="ignore", over="ignore"):
            want = (ref.log_softmax if log else ref.softmax)(x.astype(np.float64), 1)
        assert (np.isnan(got) == np.isnan(want)).all(), (shape, cl, one, log)
        fin = np.isfinite(want)
        assert (got[~fin & ~np.isnan(want)] == want[~fin & ~np.isnan(want)]).all()
        err = np.linalg.norm(got[fin] - want[fin]) / np.linalg.norm(want[fin])
        assert err <= 2e-6, (shape, cl, one, log, err)
        print(f"{str(shape):15s} vec4={vec4!s:5s} CL={cl} TW={tw} one={one!s:5s} log={log!s:5s} normwise err {err:.1e}")
    print("emulation: all passed")


if __name__ == "__main__":
    main()
