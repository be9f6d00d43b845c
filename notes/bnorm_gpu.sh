#!/usr/bin/env bash
# The one GPU call of helper bnorm (run from .wt/bnorm on the device; main's tree
# two levels up is the A/B's "old"): warm both trees' batch-norm kernels, the A/B
# timing, then the batch-norm GPU tests in 6 shards (the selection of
# `gpu_suite.sh tests -k "batchnorm or (test_normalization and not row_normalization)"`,
# without its warm-up of every other family).  Short tables last.
set -u
OLD="$(cd ../.. && pwd)"
export PYTHONPATH="$PWD" CUPY_TF32=0 PYTHONUNBUFFERED=1
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
t0=$(date +%s)
python notes/bnorm_warm.py "$PWD" 8 > "$OUT/warm_new.log" 2>&1 &
python notes/bnorm_warm.py "$OLD" 8 > "$OUT/warm_old.log" 2>&1
wait
echo "warm $(( $(date +%s) - t0 )) s"; tail -c 300 "$OUT/warm_new.log"; tail -c 300 "$OUT/warm_old.log"
timeout 50 python notes/bnorm_ab.py "$OLD" --json "$OUT/ab.json" > "$OUT/ab.log" 2>&1
echo "ab rc $? at $(( $(date +%s) - t0 )) s"
for i in 0 1 2 3 4 5; do
    DNNPRIMS_TEST_SHARD="$i/6" timeout 70 python -m pytest -q -m gpu tests/test_normalization.py tests/test_fast_path.py \
        -k "batchnorm or (test_normalization and not row_normalization)" -p no:cacheprovider --tb=short \
        > "$OUT/gpu_tests.$i.log" 2>&1 &
done
wait
echo "tests done at $(( $(date +%s) - t0 )) s"
for i in 0 1 2 3 4 5; do tail -n 1 "$OUT/gpu_tests.$i.log"; done
grep -h -E "^(FAILED|ERROR)" "$OUT"/gpu_tests.*.log | head -20
grep -v '^{' "$OUT/ab.log" | tail -n 75
