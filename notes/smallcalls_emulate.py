"""CPU emulation (pure Python / NumPy, float64) of the patch's index maps and sums, no GPU:
(1) the strided batch-norm mapping covers every element of x exactly once with its channel;
(2) pool_global_avg_backward_flat (4 vectors a thread, the next plane's dy loaded up front)
writes exactly dy / count everywhere, capped grid or not; (3) the strided batch-norm kernels'
arithmetic (per-thread (lo, hi) partials, channel_sums, outputs) against the textbook formulas.
    python notes/smallcalls_emulate.py"""
import math

import numpy as np

def check(outer, C, inner, VEC):
    G = VEC // math.gcd(inner, VEC)
    sv = G * inner // VEC; m = 256 // sv
    assert sv <= 256 and C % G == 0 and inner > VEC and -(-outer // m) <= 8
    threads = 32 * -(-(sv * m) // 32)
    seen = {}
    for b in range(C // G):
        for t in range(threads):
            pv, o0 = t % sv, t // sv
            items = 0
            if t < sv * m and o0 < outer:
                items = min((outer - 1 - o0) // m + 1, 8)
            off = (o0 * C + b * G) * inner + pv * VEC
            step = m * C * inner
            e = pv * VEC; c = e // inner; left = inner - (e - c * inner); split = min(left, VEC)
            for k in range(items):
                base = off + k * step
                assert base % VEC == 0
                for v in range(VEC):
                    idx = base + v
                    ch_local = c if v < split else c + 1
                    assert ch_local < G
                    # true channel of element idx
                    true_c = (idx // inner) % C
                    assert true_c == b * G + ch_local, (outer, C, inner, VEC, b, t, k, v)
                    assert idx not in seen; seen[idx] = 1
    assert len(seen) == outer * C * inner, (len(seen), outer * C * inner)
for args in [(32, 8, 49, 4), (40, 4, 49, 4), (3, 8, 6, 4), (5, 16, 5, 4), (7, 16, 13, 4), (13, 8, 25, 8),
             (5, 8, 255, 4), (5, 8, 255, 8), (5, 8, 255, 2), (33, 16, 9, 4), (33, 16, 9, 8), (33, 16, 9, 2),
             (32, 16, 49, 8), (32, 16, 49, 2), (1, 4, 7, 4), (2, 8, 3, 2), (200, 2, 1 * 3, 2)]:
    try:
        check(*args); print("ok", args)
    except AssertionError as e:
        print("SKIP/FAIL", args, e)

def emu(planes, count, VEC, UNROLL=4, block=256, grid=None):
    total = planes * count; vectors = -(-total // VEC)
    dy = np.random.rand(planes).astype(np.float64)
    dx = np.full(total, np.nan)
    blocks = grid or max(1, -(-vectors // (block * UNROLL)))
    for b in range(blocks):
        for t in range(block):
            i0 = b * block * UNROLL + t
            while i0 < vectors:
                plane = [0]*UNROLL; off=[0]*UNROLL; g=[0.]*UNROLL; g2=[0.]*UNROLL
                for u in range(UNROLL):
                    i = i0 + u*block
                    if i < vectors:
                        e0 = i*VEC; plane[u] = e0//count; off[u] = e0 - plane[u]*count; g[u] = dy[plane[u]]
                        if off[u] + VEC > count and (plane[u]+1)*count < total: g2[u] = dy[plane[u]+1]
                for u in range(UNROLL):
                    i = i0 + u*block
                    if i < vectors:
                        e0 = i*VEC; pl = plane[u]; o = off[u]; v = g[u]/count; pk=[]
                        for w in range(VEC):
                            if o == count:
                                o = 0; pl += 1
                                if e0 + w < total: v = (g2[u] if pl == plane[u]+1 else dy[pl]) / count
                            pk.append(v); o += 1
                        for w in range(VEC):
                            if e0+w < total: dx[e0+w] = pk[w]
                i0 += block*blocks*UNROLL
    want = np.repeat(dy/count, count)
    assert np.array_equal(dx, want), (planes, count, VEC)
for planes, count in [(300*3, 49), (10, 6), (7, 1), (3, 2), (1, 1), (258, 15), (35, 81), (4*300, 49)]:
    for VEC in (2, 4, 8):
        emu(planes, count, VEC); emu(planes, count, VEC, grid=1)
print("flat ok")

def emulate(outer, C, inner, VEC, eps=1e-5, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 3, outer * C * inner); dy = rng.uniform(-1, 1, x.size)
    gamma = rng.uniform(0.5, 1.5, C); beta = rng.uniform(-.5, .5, C)
    G = VEC // math.gcd(inner, VEC); sv = G * inner // VEC; m = 256 // sv
    threads = 32 * -(-(sv * m) // 32)
    y = np.full(x.size, np.nan); dx = np.full(x.size, np.nan)
    mean_out = np.full(C, np.nan); inv_out = np.full(C, np.nan); dg = np.full(C, np.nan); db = np.full(C, np.nan)
    count = outer * inner
    for b in range(C // G):
        c0 = b * G
        places = []
        for t in range(threads):
            pv, o0 = t % sv, t // sv
            items = min((outer - 1 - o0) // m + 1, 8) if (t < sv * m and o0 < outer) else 0
            off = (o0 * C + c0) * inner + pv * VEC; step = m * C * inner
            e = pv * VEC; c = e // inner; left = inner - (e - c * inner); split = min(left, VEC)
            places.append((items, off, step, c, split))
        def channel_sums(lohi):  # lohi[t] = (lo list, hi list)
            K = len(lohi[0][0]); tot = np.zeros((K, G))
            for t, (lo, hi) in enumerate(lohi):
                c = places[t][3]
                for k in range(K):
                    tot[k][c] += lo[k]
                    if c + 1 < G: tot[k][c + 1] += hi[k]
                    else: assert hi[k] == 0
            c1 = lambda c: c + 1 if c + 1 < G else c
            return tot, [([tot[k][p[3]] for k in range(K)], [tot[k][c1(p[3])] for k in range(K)]) for p in places]
        def vals(arr, t):
            items, off, step, c, split = places[t]
            return [arr[off + k * step: off + k * step + VEC] for k in range(items)]
        # train
        lohi = []
        for t in range(threads):
            split = places[t][4]; v = vals(x, t)
            part = np.zeros(VEC)
            for r in v: part += r
            lohi.append(([part[:split].sum()], [part[split:].sum()]))
        tot, back = channel_sums(lohi)
        means = [(lo[0] / count, hi[0] / count) for lo, hi in back]
        lohi = []
        for t in range(threads):
            split = places[t][4]; mlo, mhi = means[t]
            part = np.zeros(VEC)
            for r in vals(x, t):
                mv = np.where(np.arange(VEC) < split, mlo, mhi); part += (r - mv) ** 2
            lohi.append(([part[:split].sum()], [part[split:].sum()]))
        tot2, back2 = channel_sums(lohi)
        for g in range(G):
            mean_out[c0 + g] = tot[0][g] / count; inv_out[c0 + g] = 1 / math.sqrt(tot2[0][g] / count + eps)
        for t in range(threads):
            items, off, step, c, split = places[t]; c1 = c + 1 if c + 1 < G else c
            mlo, mhi = means[t]; lo, hi = back2[t]
            slo = 1 / math.sqrt(lo[0] / count + eps) * gamma[c0 + c]; shi = 1 / math.sqrt(hi[0] / count + eps) * gamma[c0 + c1]
            for k in range(items):
                r = x[off + k * step: off + k * step + VEC]; low = np.arange(VEC) < split
                y[off + k * step: off + k * step + VEC] = (r - np.where(low, mlo, mhi)) * np.where(low, slo, shi) + np.where(low, beta[c0 + c], beta[c0 + c1])
    # reference
    X = x.reshape(outer, C, inner); Y = y.reshape(outer, C, inner)
    mu = X.mean(axis=(0, 2)); var = X.var(axis=(0, 2)); inv = 1 / np.sqrt(var + eps)
    Yr = (X - mu[None, :, None]) * (inv * gamma)[None, :, None] + beta[None, :, None]
    assert np.allclose(Y, Yr, atol=1e-12), np.abs(Y - Yr).max()
    assert np.allclose(mean_out, mu) and np.allclose(inv_out, inv)
    # backward (saved stats mean_out, inv_out)
    for b in range(C // G):
        c0 = b * G
        places = []
        for t in range(threads):
            pv, o0 = t % sv, t // sv
            items = min((outer - 1 - o0) // m + 1, 8) if (t < sv * m and o0 < outer) else 0
            off = (o0 * C + c0) * inner + pv * VEC; step = m * C * inner
            e = pv * VEC; c = e // inner; left = inner - (e - c * inner); split = min(left, VEC)
            places.append((items, off, step, c, split))
        tot = np.zeros((2, G)); per = []
        for t in range(threads):
            items, off, step, c, split = places[t]; c1 = c + 1 if c + 1 < G else c
            mlo, mhi = mean_out[c0 + c], mean_out[c0 + c1]
            d_lo = d_hi = x_lo = x_hi = 0.0
            for k in range(items):
                for v in range(VEC):
                    i = off + k * step + v; low = v < split
                    p = dy[i] * (x[i] - (mlo if low else mhi))
                    if low: d_lo += dy[i]; x_lo += p
                    else: d_hi += dy[i]; x_hi += p
            tot[0][c] += d_lo; tot[1][c] += x_lo
            if c + 1 < G: tot[0][c + 1] += d_hi; tot[1][c + 1] += x_hi
        for g in range(G):
            db[c0 + g] = tot[0][g]; dg[c0 + g] = tot[1][g] * inv_out[c0 + g]
        n = count
        for t in range(threads):
            items, off, step, c, split = places[t]; c1 = c + 1 if c + 1 < G else c
            mlo, mhi = mean_out[c0 + c], mean_out[c0 + c1]; ilo, ihi = inv_out[c0 + c], inv_out[c0 + c1]
            slo, shi = gamma[c0 + c] * ilo, gamma[c0 + c1] * ihi
            dlo, dhi = tot[0][c] / n, tot[0][c1] / n
            xlo, xhi = tot[1][c] * ilo / n, tot[1][c1] * ihi / n
            for k in range(items):
                for v in range(VEC):
                    i = off + k * step + v; low = v < split
                    xhat = (x[i] - (mlo if low else mhi)) * (ilo if low else ihi)
                    dx[i] = (slo if low else shi) * (dy[i] - (dlo if low else dhi) - xhat * (xlo if low else xhi))
    DY = dy.reshape(outer, C, inner); xhat = (X - mu[None, :, None]) * inv[None, :, None]
    dbr = DY.sum(axis=(0, 2)); dgr = (DY * xhat).sum(axis=(0, 2))
    dxr = (gamma * inv)[None, :, None] * (DY - dbr[None, :, None] / count - xhat * dgr[None, :, None] / count)
    assert np.allclose(db, dbr) and np.allclose(dg, dgr)
    assert np.allclose(dx.reshape(X.shape), dxr, atol=1e-10), np.abs(dx.reshape(X.shape) - dxr).max()
for a in [(32, 8, 49, 4), (5, 8, 255, 8), (33, 16, 9, 4), (13, 8, 25, 8), (3, 8, 6, 4), (7, 4, 49, 2)]:
    emulate(*a); print("ok", a)
