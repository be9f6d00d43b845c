#!/usr/bin/env bash
# The softmax3 GPU run: warm compile (one process per kernel name, in parallel; CuPy's
# disk cache serves the later processes), the softmax/activation GPU tests, the A/B
# probe (notes/softmax3_probe.py), the benchmark rows with PyTorch
# (notes/softmax3_bench.py), a short table last.  Stage limits: WARM_S TEST_S PROBE_S BENCH_S;
# STAGES (default "warm tests probe bench") picks stages, e.g. STAGES="warm tests".
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD CUPY_TF32=0 PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
STAGES=${STAGES:-warm tests probe bench}
has() { case " $STAGES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
nvidia-smi -L
rc=0
has warm && timeout "${WARM_S:-45}" "$PY" - > "$OUT/warm.log" 2>&1 <<'PYEOF'
import subprocess, sys, time
from dnnprims import activations, softmaxes
t = time.time()
jobs = []
for mod in (softmaxes, activations):
    seen = {}
    for e in mod.FAMILY.name_expressions:
        seen.setdefault(e.split("<", 1)[0], e)
    for e in seen.values():
        code = f"import dnnprims.{mod.__name__.split('.')[-1]} as m; m.FAMILY.function({e!r})"
        jobs.append((e, subprocess.Popen([sys.executable, "-c", code])))
for e, p in jobs:
    print(f"{p.wait()} {e}", flush=True)
print(f"warm: {len(jobs)} kernel groups in {time.time() - t:.1f} s", flush=True)
PYEOF
rc=$?
has warm && echo "warm exit $rc: $(tail -1 "$OUT/warm.log")"
has tests && timeout "${TEST_S:-45}" "$PY" -m pytest -q -m gpu tests/test_softmax.py tests/test_activation.py \
    -k "softmax or activation" --tb=short -p no:cacheprovider > "$OUT/tests.log" 2>&1
rc=$?
has tests && { echo "tests exit $rc"; grep -E "^FAILED|Error:" "$OUT/tests.log" | head -12; tail -1 "$OUT/tests.log"; }
has probe && timeout "${PROBE_S:-30}" "$PY" notes/softmax3_probe.py "$OUT" > "$OUT/probe.log" 2>&1
rc=$?
has probe && echo "probe exit $rc"
has bench && timeout "${BENCH_S:-55}" "$PY" notes/softmax3_bench.py "$OUT" > "$OUT/bench.log" 2>&1
rc=$?
has bench && echo "bench exit $rc"
has probe && "$PY" - "$OUT" <<'PYEOF'
import json, pathlib, re, sys
out = pathlib.Path(sys.argv[1])
if (out / "probe.json").exists():
    probe = json.loads((out / "probe.json").read_text())
    copy = probe["copy_GBps"]
    print(f"== probe, channel_64x256x56x56 (ms; same process; copy {copy:.0f} GB/s); best path's of-copy / x torch")
    piv = {}
    for r in probe["rows"]:
        if "path" in r:
            piv.setdefault((r["op"], r["dtype"]), {})[r["path"]] = r
    names = ["main", "packs8x256", "packs8x512", "packs4x256", "packs4x512"]
    print(f"{'op':22s} {'dtype':8s} " + " ".join(f"{n[-7:]:>7s}" for n in names) + "   torch  best: of copy, x torch")
    for (op, dt), d in piv.items():
        best = min(d.values(), key=lambda r: r["ms"])
        print(f"{op:22s} {dt:8s} " + " ".join(f"{d[n]['ms']:7.4f}" if n in d else "      -" for n in names)
              + f" {best['torch_ms']:7.4f}  {best['of_copy']:.2f} x{best['ratio']:.2f} ({best['path']})")
    for r in probe["rows"]:
        if "packed_ms" in r:
            print(f"{r['op']} {r['dtype']}: packed {r['packed_ms']:.4f} ms ({r['of_copy']:.2f} of copy), "
                  f"scalar {r['scalar_ms']:.4f}")
else:
    print("no probe.json")
    print("".join((out / "probe.log").read_text().splitlines(True)[-20:]) if (out / "probe.log").exists() else "")
bj = out / "bench.json"
if bj.exists():
    b = json.loads(bj.read_text())
    copy = b.get("ceilings", {}).get("copy_GBps")
    print(f"== bench (python -m dnnprims.bench memory; copy {copy or 0:.0f} GB/s)")
    print(f"{'op':42s} {'ours':>7s} {'torch':>7s} {'x':>5s} {'copy':>5s} {'err':>7s}")
    for r in b["rows"]:
        if r.get("kind") != "memory":
            continue
        oc = r["bytes"] / (r["ms"] * 1e-3) / 1e9 / copy if copy and r.get("ms") else float("nan")
        print(f"{r['op'][:42]:42s} {r.get('ms', float('nan')):7.4f} {r.get('torch_ms', float('nan')):7.4f} "
              f"{r.get('ratio', float('nan')):5.2f} {oc:5.2f} {r.get('rel_error', float('nan')):7.1e} {r.get('error', '')[:30]}")
else:
    print("no bench.json; progress lines:")
    for line in (out / "bench.log").read_text().splitlines() if (out / "bench.log").exists() else []:
        if "kind=memory" in line:
            print(re.sub(r"kind=memory, ", "", line)[:140])
PYEOF
true  # the last stage test may be false: exit 0
