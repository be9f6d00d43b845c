#!/usr/bin/env bash
# One device call for the batch-norm cluster kernel: its GPU tests (and every
# batch-norm GPU test), then the A/B of notes/cluster_ab.py.  Logs under $OUT.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T0=$(date +%s)
mkdir -p "$OUT/t"
timeout 150 python -m pytest -q -m gpu tests/test_normalization.py -k "cluster" --tb=short -p no:cacheprovider \
    > "$OUT/t/cluster_tests.log" 2>&1; echo "[$(( $(date +%s) - T0 )) s] cluster tests rc $?"
tail -n 25 "$OUT/t/cluster_tests.log"
timeout 150 python notes/cluster_ab.py > "$OUT/t/ab.log" 2>&1; echo "[$(( $(date +%s) - T0 )) s] ab rc $?"
cat "$OUT/t/ab.log"
OUT=$OUT/t GPU_TEST_SHARDS=6 timeout 200 bash scripts/gpu_suite.sh tests -k "normalization or batchnorm" \
    > "$OUT/t/suite.log" 2>&1; echo "[$(( $(date +%s) - T0 )) s] suite rc $?"
grep -E "^(FAILED|ERROR)" "$OUT"/t/gpu_tests.*.log | head -20; tail -n 4 "$OUT/t/suite.log"
