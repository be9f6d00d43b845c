#!/usr/bin/env bash
# helper bninfer's GPU call (notes/bninfer.md): batch-norm inference forward through
# batchnorm_infer_packs.  Copies the unpatched dnnprims/ + kernels/ aside (the A/B's
# "old"), applies notes/wip/bninfer.patch all or nothing (taken back out on exit),
# warms the patched batch-norm family (scripts/warm_kernels.py) and the old tree's
# inference kernels in parallel, runs the affected GPU tests in 4 parallel shards,
# then notes/bninfer_ab.py (old vs new vs PyTorch, eager and device time, copy
# bandwidth, one process).  Logs under $OUT; the table is printed last.
# < 150 s on a fresh H100.
#   bash notes/bninfer_gpu.sh
# From the repository root of a copy of main (main itself, or a .wt/ copy).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
export PYTHONPATH=$PWD CUPY_TF32=0 PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
T0=$(date +%s)
PATCH=notes/wip/bninfer.patch
MARK=batchnorm_infer_packs
if grep -q "$MARK" kernels/batchnorm.cu; then
    echo "$PATCH: already in the tree (the A/B's old copy would be patched too: stop)"; exit 1
fi
OLD="$(mktemp -d)/old"
mkdir -p "$OLD" && cp -r dnnprims kernels "$OLD"/
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
if GIT_CEILING_DIRECTORIES="$(dirname "$ROOT")" git apply "$PATCH" 2>>"$OUT/apply.log"; then
    APPLIED=1
elif patch -p1 -F0 --dry-run < "$PATCH" >>"$OUT/apply.log" 2>&1 && patch -p1 -F0 < "$PATCH" >>"$OUT/apply.log" 2>&1; then
    APPLIED=1
else
    echo "$PATCH did not apply (nothing of it applied): rebase it onto this tree"; cat "$OUT/apply.log"; exit 1
fi
grep -q "$MARK" kernels/batchnorm.cu || { echo "$PATCH did not apply"; cat "$OUT/apply.log"; exit 1; }
echo "patch applied; $(nvidia-smi -L 2>/dev/null | head -n 1)"
timeout 70 python3 scripts/warm_kernels.py 12 batchnorm.cu > "$OUT/warm_new.log" 2>&1 &
timeout 70 python3 notes/half16_warm.py "$OLD" batchnorm.cu:batchnorm_normalize batchnorm.cu:batchnorm_infer_flat \
    batchnorm.cu:batchnorm_rows_normalize > "$OUT/warm_old.log" 2>&1 &
wait
echo "[$(( $(date +%s) - T0 )) s] warm: $(tail -n 1 "$OUT/warm_new.log" | cut -c1-150)"
echo "    old: $(tail -n 1 "$OUT/warm_old.log" | cut -c1-300)"
common=(-q -m gpu --tb=short -p no:cacheprovider)
K="inference or matches_reference or non_contiguous or repeated_gpu or empty_batch or channel_last_paths or batchnorm"
left=$(( 95 - ($(date +%s) - T0) )); [ "$left" -lt 25 ] && left=25
for i in 0 1 2 3; do
    DNNPRIMS_TEST_SHARD="$i/4" timeout "$left" python3 -m pytest "${common[@]}" tests/test_normalization.py tests/test_fast_path.py \
        -k "$K" > "$OUT/tests.$i.log" 2>&1 &
done
wait
echo "[$(( $(date +%s) - T0 )) s] tests done"
timeout 45 python3 notes/bninfer_ab.py "$OLD" --json "$OUT/ab.json" > "$OUT/ab.log" 2>&1
rc=$?; echo "[$(( $(date +%s) - T0 )) s] ab rc $rc"
echo "== failures (first 20)"
grep -hE "^(FAILED|ERROR)" "$OUT"/tests.*.log | head -n 20
grep -hE "^E .*(Error|assert)" "$OUT"/tests.*.log | head -n 8
echo "== test summaries (4 shards; a shard cut by its timeout has no summary line)"
for f in "$OUT"/tests.*.log; do
    echo "$(basename "$f"): $(grep -E "[0-9]+ (passed|failed|error|skipped)" "$f" | tail -n 1)"
done
echo "== A/B (old = main's kernels, new = patched; torch side by side)"
grep -vE '^\{' "$OUT/ab.log" | tail -n 30
