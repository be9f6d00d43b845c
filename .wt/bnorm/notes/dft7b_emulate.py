# Helper dft7b: line-by-line NumPy port of dft_rows_forward<R> and dft_rows_inverse64
# (kernels/conv_dft.cu) against the plain products: index checks, NaN where never written.
#   python notes/dft7b_emulate.py   (~1 min on one core)
import numpy as np
rng = np.random.default_rng(0)

def rows_forward(a, dw, NB, J, Hi, Wi, h, R):
    dpitch, xpitch = 2 * (-(-h // 4) * 4), Wi | 1
    out = np.full((Hi * h * NB * J, 2), np.nan)
    for bx in range(-(-J // 64)):
        for by in range(-(-Hi // R)):
            for nb in range(NB):
                c0, r0 = bx * 64, by * R
                dws = np.full(Wi * dpitch, np.nan); xs = np.full(64 * R * xpitch, np.nan)
                for tid in range(256):
                    lane, warp = tid & 31, tid >> 5
                    for k0 in range(0, dpitch, 32):
                        k = k0 + lane
                        for col0 in range(warp, Wi, 64):
                            for q in range(8):
                                col = col0 + 8 * q
                                val = dw[col * 2 * h + k] if (col < Wi and k < 2 * h) else 0.0
                                if col < Wi and k < dpitch: dws[col * dpitch + k] = val
                    for col0 in range(0, Wi, 32):
                        col = col0 + lane
                        for row0 in range(warp, 64 * R, 64):
                            for q in range(8):
                                row = row0 + 8 * q; rr = row >> 6; c = c0 + (row & 63); r = r0 + rr
                                val = a[((nb * J + c) * Hi + r) * Wi + col] if (row < 64 * R and col < Wi and c < J and r < Hi) else 0.0
                                if row < 64 * R and col < Wi: xs[row * xpitch + col] = val
                groups = (h + 3) >> 2
                for warp in range(8):
                    for grp in range(warp, groups, 8):
                        v0 = 4 * grp
                        for lane in range(32):
                            re = np.zeros((R, 2, 4)); im = np.zeros((R, 2, 4))
                            for col in range(Wi):
                                d0 = dws[col * dpitch + 2 * v0: col * dpitch + 2 * v0 + 4]
                                d1 = dws[col * dpitch + 2 * v0 + 4: col * dpitch + 2 * v0 + 8]
                                assert (col * dpitch + 2 * v0) % 4 == 0
                                for rr in range(R):
                                    for half in range(2):
                                        x = xs[lane * xpitch + (64 * rr + 32 * half) * xpitch + col]
                                        re[rr, half] += x * np.array([d0[0], d0[2], d1[0], d1[2]])
                                        im[rr, half] += x * np.array([d0[1], d0[3], d1[1], d1[3]])
                            for rr in range(R):
                                r = r0 + rr
                                if r >= Hi: continue
                                for u in range(4):
                                    v = v0 + u
                                    if v >= h: continue
                                    base = ((r * h + v) * NB + nb) * J + c0 + lane
                                    for half in range(2):
                                        if c0 + 32 * half + lane < J:
                                            out[base + 32 * half] = (re[rr, half, u], im[rr, half, u])
    return out

def rows_inverse64(y, dwi, B, n0, n1, h):
    yv = y.reshape(-1, 2); out = np.full(B * n0 * n1, np.nan)
    for bx in range(-(-B // 64)):
        for p in range(n0):
            b0 = bx * 64
            ys = np.full((64 * h, 2), np.nan); ds = np.full((h * n1, 2), np.nan)
            for tid in range(256):
                lane, warp = tid & 31, tid >> 5
                for i0 in range(tid, 64 * h, 1024):
                    for q in range(4):
                        i = i0 + 256 * q; v = i >> 6; b = b0 + (i & 63)
                        val = yv[(p * h + v) * B + b] if (i < 64 * h and b < B) else (0.0, 0.0)
                        if i < 64 * h: ys[i] = val
                for q0 in range(0, n1, 32):
                    q = q0 + lane
                    for v0 in range(warp, h, 32):
                        for u in range(4):
                            v = v0 + 8 * u
                            if v < h and q < n1: ds[v * n1 + q] = (dwi[2 * v * n1 + q], dwi[(2 * v + 1) * n1 + q])
            for warp in range(8):
                for lane in range(32):
                    for q0 in range(0, n1, 64):
                        qa, qb = q0 + lane, q0 + 32 + lane
                        ca, cb = min(qa, n1 - 1), min(qb, n1 - 1)
                        acc_a = np.zeros(8); acc_b = np.zeros(8)
                        for v in range(h):
                            da, db = ds[v * n1 + ca], ds[v * n1 + cb]
                            for u in range(0, 8, 2):
                                idx = v * 64 + 8 * warp + u
                                assert idx % 2 == 0
                                y0, y1 = ys[idx], ys[idx + 1]
                                acc_a[u] += y0 @ da; acc_b[u] += y0 @ db
                                acc_a[u + 1] += y1 @ da; acc_b[u + 1] += y1 @ db
                        for u in range(8):
                            b = b0 + 8 * warp + u
                            if b < B:
                                if qa < n1: out[(b * n0 + p) * n1 + qa] = acc_a[u]
                                if qb < n1: out[(b * n0 + p) * n1 + qb] = acc_b[u]
    return out

for (NB, J, Hi, Wi, h, R) in [(2, 70, 5, 9, 6, 2), (1, 3, 4, 40, 35, 2), (1, 5, 3, 7, 3, 1)]:
    a = rng.standard_normal(NB * J * Hi * Wi); dw = rng.standard_normal(Wi * 2 * h)
    out = rows_forward(a, dw, NB, J, Hi, Wi, h, R)
    A = a.reshape(NB, J, Hi, Wi) @ dw.reshape(Wi, h, 2).reshape(Wi, 2 * h)   # (NB, J, Hi, 2h)
    ref = A.reshape(NB, J, Hi, h, 2).transpose(2, 3, 0, 1, 4).reshape(-1, 2)
    print("fwd", NB, J, Hi, Wi, h, R, np.abs(out - ref).max())
for (B, n0, n1, h) in [(70, 3, 9, 6), (130, 2, 70, 5), (5, 1, 33, 35)]:
    y = rng.standard_normal(n0 * h * B * 2); dwi = rng.standard_normal(2 * h * n1)
    out = rows_inverse64(y, dwi, B, n0, n1, h)
    Y = y.reshape(n0, h, B, 2).transpose(2, 0, 1, 3).reshape(B, n0, 2 * h)
    ref = (Y @ dwi.reshape(2 * h, n1)).reshape(-1)
    print("inv", B, n0, n1, h, np.abs(out - ref).max())
