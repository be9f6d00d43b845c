#!/usr/bin/env bash
# The GPU run behind notes/mem_softmax.md: softmax/activation GPU tests (and the
# torch cross-check), then the benchmark rows of this work against PyTorch.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD CUPY_TF32=0 PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
BENCH_S=${BENCH_S:-100}; TEST_S=${TEST_S:-75}
timeout "$BENCH_S" "$PY" -m dnnprims.bench memory --only rows_,classifier_,channel_,act_ \
    --json "$OUT/bench_mem_softmax.json" > "$OUT/bench.log" 2>&1
echo "bench exit $?"
timeout "$TEST_S" "$PY" -m pytest -q -m gpu tests/test_softmax.py tests/test_activation.py tests/test_against_torch.py \
    -k "softmax or activation" --maxfail=30 --tb=short -p no:cacheprovider > "$OUT/tests.log" 2>&1
echo "tests exit $?"
grep -E "FAILED|Error|error" "$OUT/tests.log" | head -30
tail -3 "$OUT/tests.log"
sed -n '/== benchmark summary/,$p' "$OUT/bench.log"
