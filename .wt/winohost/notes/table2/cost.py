"""Projected tuning cost of the interleaved scheme against the old one, from the
stored per-algorithm times (kernel+host time of the timed calls, and call counts)."""
import json, sys
data = json.load(open("dnnprims/algos/conv_table.json"))
FINAL = int(sys.argv[1]) if len(sys.argv) > 1 else 8   # finalist samples
old_t = new_t = old_c = new_c = syncs_old = syncs_new = 0
fin_pts = 0
for e in data["entries"]:
    ms = e["ms"]
    if not ms:
        continue
    probed = set(e.get("probed", []))
    best = min(ms.values())
    if len(ms) == 1:
        old_t += 2 * best; new_t += 2 * best; old_c += 2; new_c += 2; continue
    alive = {n: v for n, v in ms.items() if n not in probed}
    for n, v in ms.items():
        if n in probed:
            k = 3 if v <= 12 * best else 2
            old_t += k * v; new_t += k * v; old_c += k; new_c += k
    top = min(alive.values())
    fin = [n for n, v in alive.items() if v <= 1.15 * top]
    if len(fin) > 1:
        fin_pts += 1
    for n, v in alive.items():
        old_t += 10 * v; old_c += 10; syncs_old += 2
        calls = 2 + (6 if v > 2 * top else 9) + (FINAL // 2 * 3 * (2 if top < 0.05 else 1) if (len(fin) > 1 and n in fin) else 0)
        new_t += calls * v; new_c += calls; syncs_new += 1 + calls // 3
host = 40e-3   # ms of host time per public call when the GPU is not the bound (rough)
print(f"timed-call time: old {old_t/1e3:.1f} s, new {new_t/1e3:.1f} s; calls old {old_c} new {new_c} "
      f"(x{new_c/old_c:.2f}); syncs old {syncs_old} new {syncs_new}; points with finalists {fin_pts}")
