#!/usr/bin/env bash
# One device call for gn_rows_backward_cluster (helper gncluster): the
# row-normalization kernels compiled in parallel, the group / instance norm GPU
# tests of tests/test_row_normalization.py (the new cluster test included) in 6
# shards, then the A/B of notes/gncluster_ab.py.  Logs under $OUT/t.  < 4 min.
#   bash notes/gncluster_gpu.sh      (from the repository root)
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUPY_TF32=0
OUT=${OUT:-$PWD/out}
T0=$(date +%s)
mkdir -p "$OUT/t"
nvidia-smi -L
timeout 60 python scripts/warm_kernels.py 16 row_normalization.cu > "$OUT/t/warm.log" 2>&1
echo "[$(( $(date +%s) - T0 )) s] warm rc $?: $(tail -n 1 "$OUT/t/warm.log")"
for i in 0 1 2 3 4 5; do
    DNNPRIMS_TEST_SHARD="$i/6" timeout 90 python -m pytest -q -m gpu tests/test_row_normalization.py \
        -k "group or instance" --tb=short -p no:cacheprovider > "$OUT/t/tests.$i.log" 2>&1 &
done
wait
echo "[$(( $(date +%s) - T0 )) s] tests done"
grep -hE "^(FAILED|ERROR)" "$OUT"/t/tests.*.log | head -30
for i in 0 1 2 3 4 5; do tail -n 1 "$OUT/t/tests.$i.log"; done
grep -h "test_group_norm_cluster_backward" "$OUT"/t/tests.*.log | head -5
timeout 90 python notes/gncluster_ab.py > "$OUT/t/ab.log" 2>&1
echo "[$(( $(date +%s) - T0 )) s] ab rc $?"
cat "$OUT/t/ab.log"
