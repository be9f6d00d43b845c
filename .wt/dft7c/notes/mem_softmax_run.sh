#!/usr/bin/env bash
# The GPU run behind notes/mem_softmax.md: softmax/activation GPU tests (and the
# torch cross-check), then the benchmark rows of this work against PyTorch.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD CUPY_TF32=0 PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
BENCH_S=${BENCH_S:-100}; TEST_S=${TEST_S:-75}; ONLY=${ONLY:-rows_,classifier_,channel_,act_}
timeout "$BENCH_S" "$PY" -m dnnprims.bench memory --only "$ONLY" \
    --json "$OUT/bench_mem_softmax.json" > "$OUT/bench.log" 2>&1
echo "bench exit $?"
timeout "$TEST_S" "$PY" -m pytest -q -m gpu tests/test_softmax.py tests/test_activation.py tests/test_against_torch.py \
    -k "${TESTS_K:-softmax or activation}" --maxfail=30 --tb=short -p no:cacheprovider > "$OUT/tests.log" 2>&1
echo "tests exit $?"
grep -E "FAILED|Error|error" "$OUT/tests.log" | head -30
tail -3 "$OUT/tests.log"
if grep -q "== benchmark summary" "$OUT/bench.log"; then
    sed -n '/== benchmark summary/,$p' "$OUT/bench.log"
else  # cut short: the rows measured so far
    grep "kind=memory" "$OUT/bench.log" | sed 's/kind=memory, //' | cut -c1-170
    grep "copy" "$OUT/bench.log" | head -3
fi
