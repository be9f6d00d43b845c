"""Where the holdout misses of the shipped table sit (best time, slowdown)."""
import json, math, sys
from dnnprims import tune, algos
path = sys.argv[1] if len(sys.argv) > 1 else "dnnprims/algos/conv_table.json"
data = json.load(open(path))
h = tune.evaluate_holdout(data["entries"])
held = [e for e in data["entries"] if e["holdout"]]
print("holdout", h["table_within_10pct"], "/", h["points"])
import collections
byt = collections.Counter(); tot = collections.Counter()
for e in held:
    b = min(e["ms"].values())
    k = "<30us" if b < .03 else "<100us" if b < .1 else ">=100us"
    tot[k] += 1
m = h["misses"]
