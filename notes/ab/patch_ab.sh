#!/usr/bin/env bash
# One GPU call for a work-in-progress patch: copies the tree's dnnprims/ + kernels/
# aside as "old", applies the patch all or nothing (taken back out on exit), warms the
# patched families and the old tree's kernels in parallel, runs the named GPU tests in
# 4 parallel shards, then the A/B script (old vs new vs PyTorch in one process, given
# the old root).  Logs under $OUT; table last.  Every helper's notes/<name>_gpu.sh is
# this script with its settings (environment):
#   PATCH      notes/wip/<name>.patch
#   MARK       a string of the patched tree only;  MARK_FILE  the file that holds it
#   WARM       families to warm in the patched tree (e.g. "batchnorm.cu")
#   OLD_WARM   the old tree's kernel groups the A/B runs ("batchnorm.cu:batchnorm_normalize ...")
#   TESTS      test files;  K  pytest -k expression;  AB  the A/B script (argv: OLD_ROOT --json PATH)
#   TEST_S / AB_S  seconds for the tests / the A/B (defaults 60 / 45)
# Run from the repository root of a copy of main:  PATCH=... bash notes/ab/patch_ab.sh
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
export PYTHONPATH=$PWD CUPY_TF32=0 PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
T0=$(date +%s)
: "${PATCH:?}" "${MARK:?}" "${MARK_FILE:?}" "${WARM:?}" "${TESTS:?}" "${K:?}" "${AB:?}"
OLD_WARM=${OLD_WARM:-}
TEST_S=${TEST_S:-60}
AB_S=${AB_S:-45}
if grep -q "$MARK" "$MARK_FILE"; then
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
# All or nothing: `git apply` is atomic; the `patch` fallback checks every hunk first
# (--dry-run, no fuzz).  The ceiling keeps git from taking paths from an enclosing
# repository (a .wt/ copy inside main).
if GIT_CEILING_DIRECTORIES="$(dirname "$ROOT")" git apply "$PATCH" 2>>"$OUT/apply.log"; then
    APPLIED=1
elif patch -p1 -F0 --dry-run < "$PATCH" >>"$OUT/apply.log" 2>&1 && patch -p1 -F0 < "$PATCH" >>"$OUT/apply.log" 2>&1; then
    APPLIED=1
else
    echo "$PATCH did not apply (nothing of it applied): rebase it onto this tree"; cat "$OUT/apply.log"; exit 1
fi
grep -q "$MARK" "$MARK_FILE" || { echo "$PATCH did not apply"; cat "$OUT/apply.log"; exit 1; }
echo "$PATCH applied; $(nvidia-smi -L 2>/dev/null | head -n 1)"
# shellcheck disable=SC2086
timeout 70 python3 scripts/warm_kernels.py 12 $WARM > "$OUT/warm_new.log" 2>&1 &
if [ -n "$OLD_WARM" ]; then
    # shellcheck disable=SC2086
    timeout 70 python3 scripts/warm_kernels.py --root "$OLD" 12 $OLD_WARM > "$OUT/warm_old.log" 2>&1 &
fi
wait
echo "[$(( $(date +%s) - T0 )) s] warm: $(tail -n 1 "$OUT/warm_new.log" | cut -c1-150)"
[ -n "$OLD_WARM" ] && echo "    old: $(tail -n 1 "$OUT/warm_old.log" | cut -c1-300)"
for i in 0 1 2 3; do
    # shellcheck disable=SC2086
    DNNPRIMS_TEST_SHARD="$i/4" timeout "$TEST_S" python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider \
        $TESTS -k "$K" > "$OUT/tests.$i.log" 2>&1 &
done
wait
echo "[$(( $(date +%s) - T0 )) s] tests done"
timeout "$AB_S" python3 "$AB" "$OLD" --json "$OUT/ab.json" > "$OUT/ab.log" 2>&1
echo "[$(( $(date +%s) - T0 )) s] ab rc $?"
echo "== failures (first 20)"
grep -hE "^(FAILED|ERROR)" "$OUT"/tests.*.log | head -n 20
grep -hE "^E .*(Error|assert)" "$OUT"/tests.*.log | head -n 8
echo "== test summaries (4 shards; a shard cut by its timeout has no summary line)"
for f in "$OUT"/tests.*.log; do
    echo "$(basename "$f"): $(grep -E "[0-9]+ (passed|failed|error|skipped)" "$f" | tail -n 1)"
done
echo "== A/B (old = the tree's kernels, new = patched; torch side by side)"
grep -vE '^\{' "$OUT/ab.log" | tail -n 40
