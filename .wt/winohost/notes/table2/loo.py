"""Training points whose leave-one-out lookup disagrees with their own measurement:
how many, how many are tiny; and CV with them dropped (do they carry structure or noise?)."""
import sys, time
sys.argv = [sys.argv[0], "--quick"] + sys.argv[1:]
sys.path.insert(0, "notes/table2")
import cv
from dnnprims import algos, tune

def loo_disagreements(entries):
    from dnnprims.algos import table as T
    out = []
    by_cat = {}
    for i, e in enumerate(entries):
        by_cat.setdefault(T._category(e), []).append(i)
    t = T.Table({"version": 1, "entries": entries})
    for i, e in enumerate(entries):
        if len(e["ms"]) < 2:
            continue
        cands = t.index[T._category(e)]
        saved = list(cands)
        t.index[T._category(e)] = [c for c in cands if c[1] is not e]
        p = tune.entry_problem(e)
        ch = t.explain(p, e["direction"], algos.DEFAULT_OPTIONS, algos.REGISTRY, algos.admits)
        t.index[T._category(e)] = saved
        pick = ch[0] if ch else tune.rule_pick(p, e["direction"])
        best = min(e["ms"].values())
        v = e["ms"].get(pick)
        if v is None or v > 1.1 * best:
            out.append((e, pick))
    return out

t0 = time.time()
bad = loo_disagreements(cv.train)
print(f"{len(bad)} of {len(cv.train)} training points disagree with their LOO lookup ({time.time()-t0:.1f} s); "
      f"tiny (<30 us best): {sum(min(e['ms'].values()) < .03 for e, _ in bad)}")
ids = {id(e) for e, _ in bad}
full = cv.train
cv.train = [e for e in full if id(e) not in ids]
cv.score("CV, LOO-disagreeing training points dropped")
tiny = {id(e) for e, _ in bad if min(e["ms"].values()) < .03}
cv.train = [e for e in full if id(e) not in tiny]
cv.score("CV, tiny LOO-disagreeing dropped")
cv.train = full
cv.score("CV, all")
