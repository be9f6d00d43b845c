#!/bin/bash
# Helper gnbwd's second GPU call: warm the row-normalization kernels, its GPU tests in
# 8 shards, then the A/B probe (notes/gnbwd_probe.py).  Output under $OUT.
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH=$PWD CUPY_TF32=0
OUT=${OUT:-/tmp/gnbwd_out}; mkdir -p "$OUT"
timeout ${WARM_S:-35} python notes/gnbwd_warm.py 16 > "$OUT/warm.log" 2>&1; echo "warm rc $? $(tail -1 $OUT/warm.log)"
for i in 0 1 2 3 4 5 6 7; do
  DNNPRIMS_TEST_SHARD=$i/8 timeout ${TESTS_S:-35} python -m pytest -q -m gpu tests/test_row_normalization.py \
    --tb=short -p no:cacheprovider > "$OUT/tests_$i.log" 2>&1 &
done
wait
for i in 0 1 2 3 4 5 6 7; do echo "shard $i: $(tail -1 $OUT/tests_$i.log)"; done
grep -h "^FAILED\|Error" $OUT/tests_*.log | head -20
cat $OUT/tests_*.log > $OUT/tests.log; rm -f $OUT/tests_*.log  # fewer files to bring back
timeout ${PROBE_S:-25} python notes/gnbwd_probe.py "$OUT/probe.json" > "$OUT/probe.log" 2>&1; echo "probe rc $?"
sed -n '/^copy .* floor/,$p' "$OUT/probe.log" | grep -v " diff "
grep -h "_error" "$OUT/probe.log" | head -5
grep -h " diff " "$OUT/probe.log" | head -8
