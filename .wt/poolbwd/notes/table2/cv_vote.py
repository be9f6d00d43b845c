"""CV of a re-ranking: among the algorithms predicted within BAND x the predicted best,
prefer the one that was within 10 % of the fastest at the largest weighted share of the
neighbours (the target is "within 10 %", not "fastest")."""
import sys, math
sys.argv = [sys.argv[0], "--quick"] + sys.argv[1:]
sys.path.insert(0, "notes/table2")
import cv
T = cv.T
orig = T.Table.ranking


def make(band):
    def ranking(self, problem, direction):
        r = orig(self, problem, direction)
        if r is None or not r[1].startswith("interpolated"):
            return r
        ranked, how, entry, distance = r
        near = [(d, e) for d, e in self.neighbours(problem, direction, T.NEIGHBOURS) if e["ms"]]
        top = ranked[0][0]
        band_names = [n for ms, n in ranked if ms <= band * top]
        def share(n):
            w = g = 0.0
            for d, e in near:
                best = min(e["ms"].values()); wt = 1 / (d + 0.5)
                w += wt; g += wt * (e["ms"].get(n, math.inf) <= 1.1 * best)
            return g / w
        order = sorted(band_names, key=lambda n: (-share(n), [x for _, x in ranked].index(n)))
        rest = [(ms, n) for ms, n in ranked if n not in band_names]
        times = dict((n, ms) for ms, n in ranked)
        return [(times[n], n) for n in order] + rest, how, entry, distance
    return ranking


for band in (1.03, 1.05, 1.1):
    T.Table.ranking = make(band)
    cv.score(f"share vote within {band}")
T.Table.ranking = orig
