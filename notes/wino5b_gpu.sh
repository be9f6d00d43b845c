#!/usr/bin/env bash
# The one GPU call of helper wino5b (notes/wino5b.md): warm the Winograd kernels,
# time every 5x5 Winograd variant against cuDNN (notes/bench_wino5b.py), then the
# Winograd GPU tests in 8 shards; the short table last.  Run from the repo root.
set -u
export CUPY_TF32=0 PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
python notes/wino5b_warm.py > "$OUT/warm.log" 2>&1   # (the H100 run had this inline from stdin: spawn failed, kernels compiled in the tests)
tail -n 1 "$OUT/warm.log"
(cd notes && timeout 55 python bench_wino5b.py --json "$OUT/wino5b_h100.json" > "$OUT/bench.log" 2>&1)
echo "bench exit $?"
K="test_conv_winograd or winograd_f3x3_5x5 or winograd_f4x4_5x5 or winograd_wgrad_f5x5_3x3"
for i in 0 1 2 3 4 5 6 7; do
    DNNPRIMS_TEST_SHARD="$i/8" timeout 55 python -m pytest -q -m gpu tests/test_conv_winograd.py tests/test_conv.py \
        -k "$K" -p no:cacheprovider --tb=short > "$OUT/tests.$i.log" 2>&1 &
done
wait
cat "$OUT"/tests.*.log > "$OUT/tests.log"
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -n 30
grep -hE "[0-9]+ (passed|failed)" "$OUT"/tests.*.log
sed -n '/^GEMMs alone/,$p' "$OUT/bench.log"
