"""The short table printed last in the norms helper's GPU run: ours, torch, ratio,
fraction of copy, from the benchmark's JSON (or its progress lines when the run
was cut short).   python notes/norms_table.py OUT_DIR"""
import json
import os
import re
import sys

out = sys.argv[1]
rows, copy = [], None
try:
    with open(os.path.join(out, "bench.json")) as f:
        d = json.load(f)
    rows, copy = d["rows"], d.get("ceilings", {}).get("copy_GBps")
except Exception:
    try:
        with open(os.path.join(out, "bench.log")) as f:
            for line in f:
                if "kind=memory" in line:
                    kv = dict(re.findall(r"(\w+)=([^,]+)", line))
                    rows.append({"op": kv.get("op"), "name": kv.get("name"), "ms": float(kv.get("ms", "nan")),
                                 "torch_ms": float(kv.get("torch_ms", "nan"))})
    except Exception as e:
        print("no benchmark output:", e)
copy = copy or 3000.0
print(f"\n== norms: ours vs torch (copy {copy:.0f} GB/s{'' if rows and 'GBps' in rows[0] else ', assumed'})")
print(f"{'op':36s} {'problem':24s} {'ours ms':>8s} {'torch ms':>8s} {'x torch':>7s} {'of copy':>7s}")
for r in rows:
    if r.get("kind", "memory") != "memory" or "ms" not in r:
        continue
    frac = r["GBps"] / copy if "GBps" in r else float("nan")
    torch_ms = r.get("torch_ms", float("nan"))
    print(f"{r['op'][:36]:36s} {r['name'][:24]:24s} {r['ms']:8.4f} {torch_ms:8.4f} {torch_ms / r['ms']:7.2f} {frac:7.2f}")
