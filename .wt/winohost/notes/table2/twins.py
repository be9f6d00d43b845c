"""Twin noise in the shipped table: implicit_gemm runs the same kernel as
implicit_gemm_<pick_tile>; their ratio at one point is pure timing noise."""
import json, math, statistics, sys
from dnnprims import tune
from dnnprims.algos.implicit_gemm import pick_tile
path = sys.argv[1] if len(sys.argv) > 1 else "dnnprims/algos/conv_table.json"
data = json.load(open(path))
rows = []
for e in data["entries"]:
    ms = e["ms"]
    if "implicit_gemm" not in ms:
        continue
    p = tune.entry_problem(e)
    twin = "implicit_gemm_" + pick_tile(p, e["direction"])
    if twin not in ms:
        continue
    pr = set(e.get("probed", []))
    if "implicit_gemm" in pr or twin in pr:
        continue
    rows.append((abs(math.log(ms["implicit_gemm"] / ms[twin])), ms[twin], e))
r = sorted(x for x, _, _ in rows)
n = len(r)
print(f"{n} twin pairs (both fully timed)")
for q in (0.5, 0.75, 0.9, 0.95, 0.98, 0.99):
    print(f"  |log ratio| q{q}: {math.exp(r[int(q * (n - 1))]):.3f}x")
for thr in (1.05, 1.1, 1.2, 1.3, 2.0):
    print(f"  pairs differing by > {thr}x: {sum(x > math.log(thr) for x in r) / n:.3%}")
# by size of the time
for lo, hi in ((0, .03), (.03, .1), (.1, .5), (.5, 100)):
    s = [x for x, t, _ in rows if lo <= t < hi]
    if s:
        print(f"  t in [{lo},{hi}) ms: n={len(s)} >1.1x {sum(x > math.log(1.1) for x in s) / len(s):.2%} "
              f">1.05x {sum(x > math.log(1.05) for x in s) / len(s):.2%}")
# sign: is the one timed first (registry order: implicit_gemm before its tile twin) slower?
small = [(math.log(e["ms"]["implicit_gemm"] / t), e) for _, t, e in rows if t < 0.03]
print("tiny: implicit_gemm slower than twin in", sum(x > 0 for x, _ in small), "of", len(small),
      "; by > 10 %:", sum(x > math.log(1.1) for x, _ in small), "faster by > 10 %:", sum(x < -math.log(1.1) for x, _ in small))
for d in ("forward", "backward_data"):
    s = [x for x, e in small if e["direction"] == d]
    print(" ", d, len(s), "mean log", round(statistics.mean(s), 3) if s else None)
for N in (1, 8, 32):
    s = [x for x, e in small if e["problem"]["N"] == N]
    print("  N", N, len(s), ">1.1", sum(abs(x) > math.log(1.1) for x in s))
# holdout misses by best time
h = tune.evaluate_holdout(data["entries"])
print("holdout", h["table_within_10pct"], h["points"])
