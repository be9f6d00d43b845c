"""CPU emulation of batchnorm_train_queued's addressing (mirrors the CUDA, does not run it):
for every block, thread, group q < here and item k < items, the 16-byte pack the thread
copies (base + q * gstep + k * step, StridedPlace's off / step / items / c / split) and the
channel each of its VEC values is counted in (c while v < split, else c + 1, of group
first + q).  Checks that every element of x is covered exactly once, by the right channel,
for the launch _prepare_queued makes (grid ceil(groups / Q), 32 * ceil(SV * M / 32)
threads), Q = 2 and 4, VEC 4 and 8, shapes with a ragged last block.
    python notes/smallbn_emulate.py"""
import math


def strided(vec, channels, outer, inner):
    group = vec // math.gcd(inner, vec)
    sv = group * inner // vec
    if channels % group or sv > 256 or inner % vec == 0 or inner <= vec:
        return None
    m = 256 // sv
    if -(-outer // m) > 8:
        return None
    return group, sv, m, 32 * -(-(sv * m) // 32)


def check(vec, channels, outer, inner, q_size):
    plan = strided(vec, channels, outer, inner)
    if plan is None:
        return None
    G, sv, m, threads = plan
    groups = channels // G
    seen = [0] * (outer * channels * inner)
    for block in range(-(-groups // q_size)):
        first = block * q_size
        here = min(groups - first, q_size)
        assert here >= 1
        for t in range(threads):
            pv, o0 = t % sv, t // sv
            items = 0
            if t < sv * m and o0 < outer:
                items = min((outer - 1 - o0) // m + 1, 8)
            off = (o0 * channels + block * G) * inner + pv * vec
            step = m * channels * inner
            e = pv * vec
            c = e // inner
            split = min(inner - (e - c * inner), vec)
            base = off + (first - block) * G * inner
            for q in range(here):
                for k in range(items):
                    start = base + q * G * inner + k * step
                    for v in range(vec):
                        i = start + v
                        o, rest = divmod(i, channels * inner)
                        ch = rest // inner
                        want = (first + q) * G + (c if v < split else c + 1)
                        assert ch == want, (vec, channels, outer, inner, q_size, block, t, q, k, v)
                        assert o == o0 + k * m
                        seen[i] += 1
    assert all(n == 1 for n in seen), (vec, channels, outer, inner, q_size)
    return groups


if __name__ == "__main__":
    cases = 0
    for vec, shapes in ((4, [(32, 8, 49), (9, 20, 49), (33, 16, 9), (13, 8, 25), (5, 8, 255), (32, 40, 49),
                             (3, 12, 7)]),
                        (8, [(6, 24, 49), (32, 16, 49), (13, 24, 25), (32, 6, 196), (7, 40, 9)])):
        for outer, channels, inner in shapes:
            for q in (2, 4):
                groups = check(vec, channels, outer, inner, q)
                if groups is not None:
                    cases += 1
                    print(f"VEC {vec} x [{outer}, {channels}, {inner}] Q {q}: {groups} groups, "
                          f"{-(-groups // q)} blocks: every element once, right channel")
    print(f"{cases} cases passed")
