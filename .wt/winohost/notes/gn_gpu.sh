#!/bin/bash
# Helper gn's one GPU call: warm compile, row-normalization GPU tests in 4 shards,
# the A/B probe, the bench rows (ours vs PyTorch).  Output under $OUT.
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH=$PWD
OUT=${OUT:-/tmp/gn_out}; mkdir -p "$OUT"
timeout ${WARM_S:-45} python scripts/warm_kernels.py 16 > "$OUT/warm.log" 2>&1; echo "warm rc $? $(tail -1 $OUT/warm.log)"
for i in 0 1 2 3; do
  DNNPRIMS_TEST_SHARD=$i/4 timeout ${TESTS_S:-45} python -m pytest -q -m gpu tests/test_row_normalization.py \
    -p no:cacheprovider > "$OUT/tests_$i.log" 2>&1 &
done
wait
for i in 0 1 2 3; do echo "shard $i: $(tail -1 $OUT/tests_$i.log)"; done
grep -h "^FAILED\|Error" $OUT/tests_*.log | head -20
timeout ${PROBE_S:-30} python notes/gn_probe.py "$OUT/probe.json" > "$OUT/probe.log" 2>&1; echo "probe rc $?"
timeout ${BENCH_S:-40} python -m dnnprims.bench memory --only gn_64x256x56x56_g32,ln_65536x1024,rms_65536x1024 \
  --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1; echo "bench rc $?"
tail -25 "$OUT/bench.log"
sed -n '/^| case/,$p' "$OUT/probe.log"
grep -i "error\|diff" "$OUT/probe.log" | head
