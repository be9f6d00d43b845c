#!/usr/bin/env bash
# The bw16 GPU run: warm compile of the named families (one process per kernel name, in
# parallel), the GPU tests, the launch-bound probe (notes/bw16_probe.py), the bench rows with
# PyTorch (notes/bw16_bench.py), a short table last.  Env: FAMILIES (modules), TESTS (files),
# TEST_K, ONLY (bench problems), STAGES (default "warm tests probe bench"), *_S stage limits.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD CUPY_TF32=0 PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
STAGES=${STAGES:-warm tests probe bench}
FAMILIES=${FAMILIES:-softmaxes}
TESTS=${TESTS:-tests/test_softmax.py}
ONLY=${ONLY:-channel_64x256x56x56}
has() { case " $STAGES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
nvidia-smi -L
has warm && FAMILIES=$FAMILIES timeout "${WARM_S:-45}" "$PY" - > "$OUT/warm.log" 2>&1 <<'PYEOF'
import importlib, os, subprocess, sys, time
t = time.time()
jobs = []
for name in os.environ["FAMILIES"].split():
    mod = importlib.import_module(f"dnnprims.{name}")
    groups = {}
    for e in mod.FAMILY.name_expressions:
        groups.setdefault(e.split("<", 1)[0], []).append(e)
    for kernel, exprs in groups.items():
        code = (f"import cupy, dnnprims.{name} as m; from dnnprims import _kernels; "
                f"cupy.RawModule(code=m.FAMILY.source, options=_kernels.COMPILE_OPTIONS, "
                f"name_expressions={tuple(exprs)!r}).compile()")
        jobs.append((kernel, subprocess.Popen([sys.executable, "-c", code])))
for e, p in jobs:
    print(f"{p.wait()} {e}", flush=True)
print(f"warm: {len(jobs)} kernel groups in {time.time() - t:.1f} s", flush=True)
PYEOF
has warm && echo "warm exit $?: $(tail -1 "$OUT/warm.log")"
if has tests; then
    pids=()
    for i in 0 1 2 3; do
        DNNPRIMS_TEST_SHARD=$i/4 timeout "${TEST_S:-45}" "$PY" -m pytest -q -m gpu $TESTS -k "${TEST_K:-}" \
            --tb=short -p no:cacheprovider > "$OUT/tests_$i.log" 2>&1 &
        pids+=($!)
    done
    for i in 0 1 2 3; do wait "${pids[$i]}"; echo "tests shard $i exit $?: $(tail -1 "$OUT/tests_$i.log")"; done
    grep -hE "^FAILED|Error:" "$OUT"/tests_*.log | head -12
fi
has probe && { timeout "${PROBE_S:-30}" "$PY" notes/bw16_probe.py "$OUT" > "$OUT/probe.log" 2>&1; echo "probe exit $?"; }
has bench && { timeout "${BENCH_S:-45}" "$PY" notes/bw16_bench.py "$OUT" "$ONLY" > "$OUT/bench.log" 2>&1; echo "bench exit $?"; }
echo "== probe (forward; ms, of copy, x torch)"
grep -E "forward|choice|copy" "$OUT/probe.log" 2>/dev/null | cut -c1-150
echo "== bench"
"$PY" - "$OUT" <<'PYEOF'
import json, pathlib, re, sys
out = pathlib.Path(sys.argv[1])
bj = out / "bench.json"
if bj.exists():
    b = json.loads(bj.read_text())
    copy = b.get("ceilings", {}).get("copy_GBps")
    print(f"copy {copy or 0:.0f} GB/s")
    print(f"{'op':46s} {'ours':>7s} {'torch':>7s} {'x':>5s} {'copy':>5s}")
    for r in b["rows"]:
        if r.get("kind") != "memory":
            continue
        oc = r["bytes"] / (r["ms"] * 1e-3) / 1e9 / copy if copy and r.get("ms") else float("nan")
        print(f"{r['op'][:46]:46s} {r.get('ms', float('nan')):7.4f} {r.get('torch_ms', float('nan')):7.4f} "
              f"{r.get('ratio', float('nan')):5.2f} {oc:5.2f} {str(r.get('error', ''))[:30]}")
else:
    for line in (out / "bench.log").read_text().splitlines()[-25:] if (out / "bench.log").exists() else []:
        print(line[:150])
PYEOF
true
