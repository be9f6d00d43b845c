#!/usr/bin/env bash
# helper half16's GPU call (notes/half16.md): 16-bit GELU backward and channel
# softmax forward.  Copies the unpatched dnnprims/ + kernels/ aside (the A/B's
# "old"), applies notes/wip/gelu16_backward.patch then notes/wip/softmax16_forward.patch
# (each all or nothing; both taken back out on exit), warms the kernels of both
# trees in parallel, runs the A/B of notes/half16_ab.py (old vs new vs PyTorch,
# copy bandwidth, one process), then the affected GPU tests (exhaustive float16 /
# bfloat16 gelu backward, softmax packs incl. special values).  Logs under $OUT;
# the table is printed last.  < 2 min.
#   bash notes/half16_gpu.sh
# From the repository root of a copy of main (e.g. .wt/half16, or main itself).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
export PYTHONPATH=$PWD CUPY_TF32=0 PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
T0=$(date +%s)
OLD="$(mktemp -d)/old"
mkdir -p "$OLD" && cp -r dnnprims kernels "$OLD"/
PATCHES=(notes/wip/gelu16_backward.patch notes/wip/softmax16_forward.patch)
MARKS=("gelu_derivative_fast:kernels/activation_math.cuh" "PairMax:kernels/softmax.cu")
APPLIED=()
revert() {  # newest first
    local i
    for ((i = ${#APPLIED[@]} - 1; i >= 0; i--)); do
        GIT_CEILING_DIRECTORIES="$(dirname "$ROOT")" git apply -R "${APPLIED[$i]}" 2>/dev/null \
            || patch -R -p1 < "${APPLIED[$i]}" > /dev/null
    done
}
trap revert EXIT
# All or nothing (notes/splitk_gpu.sh): `git apply` is atomic; the `patch` fallback
# checks every hunk first (--dry-run, no fuzz).  The ceiling keeps git from taking
# paths from an enclosing repository (.wt/ of main).
for i in 0 1; do
    p=${PATCHES[$i]}; mark=${MARKS[$i]%%:*}; file=${MARKS[$i]#*:}
    grep -q "$mark" "$file" && { echo "$p: already in the tree"; continue; }
    if GIT_CEILING_DIRECTORIES="$(dirname "$ROOT")" git apply "$p" 2>>"$OUT/apply.log"; then
        APPLIED+=("$p")
    elif patch -p1 -F0 --dry-run < "$p" >>"$OUT/apply.log" 2>&1 && patch -p1 -F0 < "$p" >>"$OUT/apply.log" 2>&1; then
        APPLIED+=("$p")
    else
        echo "$p did not apply (nothing of it applied): rebase it onto this tree (notes/half16.md)"
        cat "$OUT/apply.log"; exit 1
    fi
    grep -q "$mark" "$file" || { echo "$p did not apply"; cat "$OUT/apply.log"; exit 1; }
done
echo "patches applied: ${APPLIED[*]}; $(nvidia-smi -L 2>/dev/null | head -n 1)"
timeout 55 python3 scripts/warm_kernels.py 12 activation.cu softmax.cu > "$OUT/warm_new.log" 2>&1 &
timeout 55 python3 notes/half16_warm.py "$OLD" activation.cu:activation_backward \
    softmax.cu:softmax_forward_channels_packs > "$OUT/warm_old.log" 2>&1 &
wait
echo "[$(( $(date +%s) - T0 )) s] warm: $(tail -n 1 "$OUT/warm_new.log" | cut -c1-150)"
echo "    old: $(tail -n 1 "$OUT/warm_old.log" | cut -c1-200)"
timeout 45 python3 notes/half16_ab.py "$OLD" --json "$OUT/ab.json" > "$OUT/ab.log" 2>&1
rc=$?; echo "[$(( $(date +%s) - T0 )) s] ab rc $rc"
left=$(( 115 - ($(date +%s) - T0) )); [ "$left" -lt 20 ] && left=20
common=(-q -m gpu --tb=short -p no:cacheprovider)
for i in 0 1 2 3; do
    DNNPRIMS_TEST_SHARD="$i/4" timeout "$left" python3 -m pytest "${common[@]}" tests/test_activation.py \
        tests/test_softmax.py -k "gelu or every_16bit or channel_packs or special_values or forward_and_backward or minus_infinity" \
        > "$OUT/tests.$i.log" 2>&1 &
done
wait
echo "[$(( $(date +%s) - T0 )) s] tests done"
echo "== failures (first 20)"
grep -hE "^(FAILED|ERROR)" "$OUT"/tests.*.log | head -n 20
grep -hE "^E .*(Error|assert)" "$OUT"/tests.*.log | head -n 8
echo "== test summaries (4 shards)"
for f in "$OUT"/tests.*.log; do
    echo "$(basename "$f"): $(grep -E "[0-9]+ (passed|failed|error|skipped)" "$f" | tail -n 1)"
done
echo "== A/B (old = main's kernels, new = patched; torch side by side)"
grep -vE '^\{' "$OUT/ab.log" | tail -n 40
rm -rf "$(dirname "$OLD")"
