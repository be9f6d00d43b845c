#!/usr/bin/env bash
# helper smallcalls' GPU call (notes/smallcalls.md): the small public memory-bound
# problems of issue 5 (global_avg_r50, bn_r50_late, classifier_256x1000).  Copies
# the unpatched dnnprims/ + kernels/ aside (the A/B's "old"), applies
# notes/wip/smallcalls.patch all or nothing (taken back out on exit), warms the
# patched families and the old tree's A/B kernels in parallel, runs the affected
# GPU tests in 4 shards, then notes/smallcalls_ab.py (old vs new vs PyTorch, eager
# and CUDA-graph timing, same-size copy).  Logs under $OUT; the table is printed
# last.  < 150 s on a fresh H100.
#   bash notes/smallcalls_gpu.sh
# From the repository root of a copy of main (main itself, or a .wt/ copy).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
export PYTHONPATH=$PWD CUPY_TF32=0 PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
T0=$(date +%s)
OLD="$(mktemp -d)/old"
mkdir -p "$OLD" && cp -r dnnprims kernels "$OLD"/
PATCH=notes/wip/smallcalls.patch
MARK=batchnorm_train_strided
APPLIED=""
revert() {
    if [ -n "$APPLIED" ]; then
        GIT_CEILING_DIRECTORIES="$(dirname "$ROOT")" git apply -R "$PATCH" 2>/dev/null \
            || patch -R -p1 < "$PATCH" > /dev/null
    fi
    rm -rf "$(dirname "$OLD")"
}
trap revert EXIT
# All or nothing: `git apply` is atomic; the `patch` fallback checks every hunk
# first (--dry-run, no fuzz).  The ceiling keeps git from taking paths from an
# enclosing repository (.wt/ of main).
if grep -q "$MARK" kernels/batchnorm.cu; then
    echo "$PATCH: already in the tree (the A/B's old copy is then patched too: stop)"; exit 1
fi
if GIT_CEILING_DIRECTORIES="$(dirname "$ROOT")" git apply "$PATCH" 2>>"$OUT/apply.log"; then
    APPLIED=1
elif patch -p1 -F0 --dry-run < "$PATCH" >>"$OUT/apply.log" 2>&1 && patch -p1 -F0 < "$PATCH" >>"$OUT/apply.log" 2>&1; then
    APPLIED=1
else
    echo "$PATCH did not apply (nothing of it applied): rebase it onto this tree"; cat "$OUT/apply.log"; exit 1
fi
grep -q "$MARK" kernels/batchnorm.cu || { echo "$PATCH did not apply"; cat "$OUT/apply.log"; exit 1; }
echo "patch applied; $(nvidia-smi -L 2>/dev/null | head -n 1)"
timeout 70 python3 scripts/warm_kernels.py 12 pooling.cu softmax.cu batchnorm.cu > "$OUT/warm_new.log" 2>&1 &
timeout 70 python3 notes/half16_warm.py "$OLD" pooling.cu:pool_global_avg_forward_small \
    pooling.cu:pool_global_avg_backward_flat batchnorm.cu:batchnorm_train_grouped \
    batchnorm.cu:batchnorm_backward_grouped batchnorm.cu:batchnorm_infer_flat \
    batchnorm.cu:batchnorm_train_fused batchnorm.cu:batchnorm_backward_fused \
    softmax.cu:softmax_forward_rows_registers softmax.cu:softmax_backward_rows_registers \
    > "$OUT/warm_old.log" 2>&1 &
wait
echo "[$(( $(date +%s) - T0 )) s] warm: $(tail -n 1 "$OUT/warm_new.log" | cut -c1-150)"
echo "    old: $(tail -n 1 "$OUT/warm_old.log" | cut -c1-300)"
common=(-q -m gpu --tb=short -p no:cacheprovider)
K="grouped_training_path or matches_reference or by_hand or finite_differences or running_stats or inference_flat"
K="$K or repeated_gpu or non_contiguous or global_average or row_thread or capped or forward_and_backward_against"
left=$(( 100 - ($(date +%s) - T0) )); [ "$left" -lt 25 ] && left=25
for i in 0 1 2 3; do
    DNNPRIMS_TEST_SHARD="$i/4" timeout "$left" python3 -m pytest "${common[@]}" tests/test_normalization.py \
        tests/test_pooling.py tests/test_softmax.py -k "$K" > "$OUT/tests.$i.log" 2>&1 &
done
wait
echo "[$(( $(date +%s) - T0 )) s] tests done"
timeout 50 python3 notes/smallcalls_ab.py "$OLD" --json "$OUT/ab.json" > "$OUT/ab.log" 2>&1
rc=$?; echo "[$(( $(date +%s) - T0 )) s] ab rc $rc"
echo "== failures (first 20)"
grep -hE "^(FAILED|ERROR)" "$OUT"/tests.*.log | head -n 20
grep -hE "^E .*(Error|assert)" "$OUT"/tests.*.log | head -n 8
echo "== test summaries (4 shards; a shard cut by its timeout has no summary line)"
for f in "$OUT"/tests.*.log; do
    echo "$(basename "$f"): $(grep -E "[0-9]+ (passed|failed|error|skipped)" "$f" | tail -n 1)"
done
echo "== A/B (old = main's kernels, new = patched; torch side by side)"
grep -vE '^\{' "$OUT/ab.log" | tail -n 45
