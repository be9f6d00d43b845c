#!/usr/bin/env bash
# The single GPU run behind the "v2" section of notes/mem_softmax.md:
# 1. warm the NVRTC compile of the softmax and activation families in parallel
#    (CuPy's disk cache then serves every later process);
# 2. GPU tests of softmax/activations;
# 3. benchmark rows (new code), then the same channel / NHWC-bias rows with the
#    new paths switched off (A/B in the same run; the old kernels are still there);
# 4. a short table last.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD CUPY_TF32=0 PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
warm() {  # $1 = module: compile its whole family once, on a tiny launch
    timeout "${WARM_S:-62}" "$PY" - "$1" <<'PYEOF'
import sys, time, importlib
t = time.time()
mod = importlib.import_module("dnnprims." + sys.argv[1])
mod.FAMILY.function(mod.FAMILY.name_expressions[0])
print(f"warm {sys.argv[1]}: {len(mod.FAMILY.name_expressions)} kernels compiled in {time.time() - t:.1f} s", flush=True)
PYEOF
}
warm softmaxes > "$OUT/warm_softmax.log" 2>&1 &
W1=$!
warm activations > "$OUT/warm_activation.log" 2>&1 &
W2=$!
wait $W1; wait $W2
cat "$OUT"/warm_*.log | tail -6
timeout "${TEST_S:-28}" "$PY" -m pytest -q -m gpu tests/test_softmax.py tests/test_activation.py -x --tb=short \
    -p no:cacheprovider > "$OUT/tests.log" 2>&1
echo "tests exit $?"; grep -E "FAILED|Error" "$OUT/tests.log" | head -10; tail -2 "$OUT/tests.log"
timeout "${BENCH_S:-40}" "$PY" notes/softmax_v2_bench.py new "$OUT" > "$OUT/bench_new.log" 2>&1
echo "bench exit $?"
timeout "${OLD_S:-16}" "$PY" notes/softmax_v2_bench.py old "$OUT" > "$OUT/bench_old.log" 2>&1
echo "old-path bench exit $?"
grep -h "copy" "$OUT/bench_new.log" | head -2
echo "== old paths (shared-memory channel tile, scalar NHWC bias backward), same run"
grep "kind=memory" "$OUT/bench_old.log" | grep -v "NCHW" | sed 's/kind=memory, //' | cut -c1-150
echo "== new"
if grep -q "== benchmark summary" "$OUT/bench_new.log"; then
    sed -n '/== benchmark summary/,$p' "$OUT/bench_new.log"
else
    grep "kind=memory" "$OUT/bench_new.log" | sed 's/kind=memory, //' | cut -c1-150
fi
