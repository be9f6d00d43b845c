"""Cross-validation of lookup variants inside the non-held-out points of a table
(second split: crc32('cv|' + key) < 0.25 are the CV test points), as notes/table.md did.
Usage: python notes/table2/cv.py [table.json] [--quick | --feat | --exact | --holdout]
(default: the constants' variants; --feat: log2 N as a 4th coordinate; --exact: twins
interpolated; --quick: the shipped rule only; --holdout: the one final look)."""
import json, math, sys, zlib, time
import numpy as np
from dnnprims import tune, algos
from dnnprims.algos import table as T

args = [a for a in sys.argv[1:] if not a.startswith("--")]
path = args[0] if args else "dnnprims/algos/conv_table.json"
data = json.load(open(path))
entries = data["entries"]


def key(e):
    return tune.point_key(e["direction"], tune.entry_problem(e))


if "--holdout" in sys.argv:
    train = [e for e in entries if not e["holdout"]]
    test = [e for e in entries if e["holdout"]]
else:
    pool = [e for e in entries if not e["holdout"]]
    cv = [zlib.crc32(("cv|" + key(e)).encode()) / 2**32 < 0.25 for e in pool]
    train = [e for e, c in zip(pool, cv) if not c]
    test = [e for e, c in zip(pool, cv) if c]
problems = [tune.entry_problem(e) for e in test]


def score(label, **patch):
    saved = {k: getattr(T, k) for k in patch}
    for k, v in patch.items():
        setattr(T, k, v)
    try:
        t = T.Table({"version": 1, "entries": train})
        good, logs, blocks = 0, [], {}
        grid = data["grid"]["spec"]
        for e, p in zip(test, problems):
            best = min(e["ms"].values())
            ch = t.explain(p, e["direction"], algos.DEFAULT_OPTIONS, algos.REGISTRY, algos.admits)
            pick = ch[0] if ch else tune.rule_pick(p, e["direction"])
            v = e["ms"].get(pick)
            ok = v is not None and v <= 1.1 * best
            good += ok
            logs.append(math.log((v or 10 * best) / best))
            b = blocks.setdefault(tune.block_of(e, grid), [0, 0]); b[0] += ok; b[1] += 1
        print(f"{label:40s} {good}/{len(test)} = {good / len(test):.2%}  slowdown {math.exp(np.mean(logs)):.4f}  "
              + " ".join(f"{k} {a}/{n}" for k, (a, n) in sorted(blocks.items())), flush=True)
        return good / len(test)
    finally:
        for k, v in saved.items():
            setattr(T, k, v)


def main():
    print(f"train {len(train)} test {len(test)}")
    t0 = time.time()
    score("shipped (CAP 2, k 8, ridge 1)")
    print(f"({time.time() - t0:.1f} s per variant)")
    if "--holdout" not in sys.argv and "--quick" not in sys.argv and "--feat" not in sys.argv:
        for cap in (1.5, 3.0):
            score(f"CAP {cap}", CAP=cap)
        for k in (6, 10, 12):
            score(f"NEIGHBOURS {k}", NEIGHBOURS=k)
        for r in (0.3, 3.0):
            score(f"RIDGE {r}", RIDGE=r)


def with_batch_feature(alpha):
    """Patch table.features / NUMERIC so that alpha * log2(N) is a 4th coordinate."""
    orig = T.features

    def features(problem, direction):
        f = orig(problem, direction)
        f["log2_n"] = round(alpha * math.log2(problem.N), 3)
        return f
    for e in train + test:
        e["log2_n"] = round(alpha * math.log2(e["problem"]["N"]), 3)
    return dict(features=features, NUMERIC=T.NUMERIC + ("log2_n",))


if __name__ == "__main__":
    main()
    if "--feat" in sys.argv:
        for alpha in (0.25, 0.5, 1.0):
            score(f"+ {alpha} log2 N", **with_batch_feature(alpha))
    if "--exact" in sys.argv:
        score("twins interpolated (EXACT -1)", EXACT=-1.0)
        score("twins interpolated + 0.25 log2 N", EXACT=-1.0, **with_batch_feature(0.25))
