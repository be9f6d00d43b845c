#!/usr/bin/env bash
# The one GPU call of helper `table` (session 3): re-tune (bounded), then time every
# algorithm on the public problems at batch 1 (all) and batch 32 (a few), with the
# new table's and the old table's picks; summary last.  Run from the worktree root.
set -u
OUT="${OUT:-./out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" CUPY_TF32=0 PYTHONUNBUFFERED=1
cp dnnprims/algos/conv_table.json /tmp/old_table.json
timeout 160 bash scripts/gpu_suite.sh tune --max-seconds "${TUNE_SECONDS:-120}" > "$OUT/suite_tune.out" 2>&1
echo "tune exit $?"
timeout 50 python3 notes/table_gpu_check.py --out "$OUT/check_b1.jsonl" --old /tmp/old_table.json \
    --batches 1 --deadline 35 2>&1 | tail -3
timeout 20 python3 notes/table_gpu_check.py --out "$OUT/check_b32.jsonl" --old /tmp/old_table.json \
    --batches 32 --only r50_2_3x3,r50_3_3x3,r50_4_1x1_dn,vgg_3_2 --deadline 8 2>&1 | tail -3
[ -s "$OUT/conv_table.json" ] && gzip -kf "$OUT/conv_table.json"
echo "================ summary"
grep -E "^(tuning|stopping|wrote|holdout)" "$OUT/tune.log" | cut -c1-400
grep -c '"probed":\["' "$OUT/conv_table.json" 2>/dev/null | sed 's/^/entries with a single-call time: /'
python3 notes/table_gpu_check.py --out x --summary-of "$OUT"/check_b*.jsonl
