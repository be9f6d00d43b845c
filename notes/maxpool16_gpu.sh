#!/usr/bin/env bash
# helper maxpool16's GPU call (notes/maxpool16.md): NCHW float16 / bfloat16 max 3x3 / 2 / 1
# pooling backward (pool_k3s2_backward_rolled).  Copies the unpatched dnnprims/ + kernels/
# aside (the A/B's "old"), applies notes/wip/maxpool16.patch all or nothing (taken back
# out on exit), warms the pooling kernels of both trees in parallel, runs the affected
# pooling GPU tests in 4 shards, then the A/B of notes/maxpool16_ab.py (old vs every new
# variant vs PyTorch, copy bandwidth, one process).  Logs under $OUT; the table is printed
# last.  < 2 min on a fresh H100.
#   bash notes/maxpool16_gpu.sh
# From the repository root of a copy of main (main itself, or a copy with the patch
# already applied: then "old" is made by taking the patch back out of the copy aside).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
export PYTHONPATH=$PWD CUPY_TF32=0 PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
T0=$(date +%s)
PATCH=notes/wip/maxpool16.patch
MARK=k3s2_tail_row_pairs
FILE=kernels/pooling.cu
OLD="$(mktemp -d)/old"
mkdir -p "$OLD" && cp -r dnnprims kernels "$OLD"/
APPLIED=0
revert() {
    if [ "$APPLIED" = 1 ]; then
        GIT_CEILING_DIRECTORIES="$(dirname "$ROOT")" git apply -R "$PATCH" 2>/dev/null \
            || patch -R -p1 < "$PATCH" > /dev/null
    fi
    rm -rf "$(dirname "$OLD")"
}
trap revert EXIT
if grep -q "$MARK" "$FILE"; then
    # already patched: old = the copy with the patch's library part taken back out
    (cd "$OLD" && GIT_CEILING_DIRECTORIES="$(dirname "$OLD")" git apply -R --include='dnnprims/*' \
        --include='kernels/*' "$ROOT/$PATCH") 2>>"$OUT/apply.log" \
        || { echo "tree already patched and the patch does not come back out of the copy"; cat "$OUT/apply.log"; exit 1; }
    echo "$PATCH: already in the tree (old = the tree without it)"
else
    # All or nothing: `git apply` is atomic; the `patch` fallback checks every hunk first.
    # The ceiling keeps git from taking paths from an enclosing repository (.wt/ of main).
    if GIT_CEILING_DIRECTORIES="$(dirname "$ROOT")" git apply "$PATCH" 2>>"$OUT/apply.log"; then
        APPLIED=1
    elif patch -p1 -F0 --dry-run < "$PATCH" >>"$OUT/apply.log" 2>&1 && patch -p1 -F0 < "$PATCH" >>"$OUT/apply.log" 2>&1; then
        APPLIED=1
    else
        echo "$PATCH did not apply (nothing of it applied): rebase it onto this tree (notes/maxpool16.md)"
        cat "$OUT/apply.log"; exit 1
    fi
    grep -q "$MARK" "$FILE" || { echo "$PATCH did not apply"; cat "$OUT/apply.log"; exit 1; }
fi
grep -q "$MARK" "$OLD/$FILE" && { echo "old tree is patched: stop"; exit 1; }
echo "patch applied; $(nvidia-smi -L 2>/dev/null | head -n 1)"
timeout 60 python3 scripts/warm_kernels.py 12 pooling.cu > "$OUT/warm_new.log" 2>&1 &
timeout 60 python3 notes/half16_warm.py "$OLD" pooling.cu:pool_k3s2_backward_rolled \
    pooling.cu:pool_k3s2_backward > "$OUT/warm_old.log" 2>&1 &
wait
echo "[$(( $(date +%s) - T0 )) s] warm: $(tail -n 1 "$OUT/warm_new.log" | cut -c1-150)"
echo "    old: $(tail -n 1 "$OUT/warm_old.log" | cut -c1-200)"
# tests: every GPU test of the changed path (rolled variants: S 1 / 2 / 4, MINB 1 / 2 / 3,
# hint, one-block grid; bitwise against pool_k3s2_backward) and the pooling paths around
# it against the NumPy reference (every dtype, odd sizes, overlapping / non-overlapping
# windows, padding, NCHW / NHWC); at most until 75 s, leaving the A/B 40 s
left=$(( 75 - ($(date +%s) - T0) )); [ "$left" -lt 20 ] && left=20
common=(-q -m gpu --tb=short -p no:cacheprovider)
for i in 0 1 2 3; do
    DNNPRIMS_TEST_SHARD="$i/4" timeout "$left" python3 -m pytest "${common[@]}" tests/test_pooling.py \
        -k "rolled or k3s2 or matches_reference or ties or fast_paths or nan_propagates" \
        > "$OUT/tests.$i.log" 2>&1 &
done
wait
echo "[$(( $(date +%s) - T0 )) s] tests done"
timeout 40 python3 notes/maxpool16_ab.py "$OLD" --json "$OUT/ab.json" > "$OUT/ab.log" 2>&1
rc=$?; echo "[$(( $(date +%s) - T0 )) s] ab rc $rc"
echo "== failures (first 20)"
grep -hE "^(FAILED|ERROR)" "$OUT"/tests.*.log | head -n 20
grep -hE "^E .*(Error|assert)" "$OUT"/tests.*.log | head -n 8
echo "== test summaries (4 shards; a shard cut by its timeout shows no summary)"
for f in "$OUT"/tests.*.log; do
    echo "$(basename "$f"): $(grep -E "[0-9]+ (passed|failed|error|skipped)" "$f" | tail -n 1)"
done
echo "== kernels (new variants, max3x3s2_big_f16)"
python3 -c "import json; r = json.load(open('$OUT/ab.json'))[0]; print('\n'.join(f'{k}: {v}' for k, v in r['kernels'].items()))" 2>/dev/null | head -n 24
echo "== A/B (old = main's kernels, new = patched; torch side by side)"
grep -vE '^\{' "$OUT/ab.log" | tail -n 100
