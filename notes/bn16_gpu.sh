#!/usr/bin/env bash
# helper bn16's GPU call (notes/bn16.md): apply notes/wip/bn_cluster16.patch
# (batch-norm cluster kernels with 16-block, non-portable clusters behind
# normalization.CLUSTER_MAX_SIZE), warm batchnorm.cu with NVRTC in parallel, run
# the cluster GPU tests (the CL <= 8 ones as a regression, the CL = 16 variant
# N = 16 / 17 / 64, the two-shape opt-in test), then the A/B of
# notes/bn16_ab.py (CLUSTER_MAX_SIZE 8 vs 16, PyTorch side by side, copy
# bandwidth, one process).  Logs under $OUT; the table is printed last.  < 3 min.
#   bash notes/bn16_gpu.sh
# From the repository root of a copy of main (e.g. .wt/bn16, or main itself).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD CUPY_TF32=0 PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
T0=$(date +%s)
PATCH=notes/wip/bn_cluster16.patch
# All or nothing, and taken back out on exit (notes/splitk_gpu.sh): `git apply` is
# atomic; the `patch` fallback checks every hunk first (--dry-run, no fuzz).  The
# ceiling keeps git from taking paths from an enclosing repository (.wt/ of main).
if ! grep -q CLUSTER_MAX_SIZE dnnprims/normalization.py; then
    if GIT_CEILING_DIRECTORIES="$(dirname "$PWD")" git apply "$PATCH" 2>"$OUT/apply.log"; then
        trap 'GIT_CEILING_DIRECTORIES="$(dirname "$PWD")" git apply -R "$PATCH"' EXIT
    elif patch -p1 -F0 --dry-run < "$PATCH" >>"$OUT/apply.log" 2>&1 \
            && patch -p1 -F0 < "$PATCH" >>"$OUT/apply.log" 2>&1; then
        trap 'patch -R -p1 < "$PATCH" > /dev/null' EXIT
    else
        echo "patch did not apply (nothing applied): rebase it onto this tree (notes/bn16.md)"
        cat "$OUT/apply.log"; exit 1
    fi
fi
if ! grep -q CLUSTER_MAX_SIZE dnnprims/normalization.py || ! grep -q "def test_cluster_of_sixteen_blocks" \
        tests/test_normalization.py; then
    echo "patch did not apply"; cat "$OUT/apply.log"; exit 1
fi
echo "patch applied; $(nvidia-smi -L 2>/dev/null | head -n 1)"
timeout 75 python3 scripts/warm_kernels.py 16 batchnorm.cu > "$OUT/warm.log" 2>&1
rc=$?; echo "[$(( $(date +%s) - T0 )) s] warm rc $rc: $(tail -n 1 "$OUT/warm.log")"
common=(-q -m gpu --tb=short -p no:cacheprovider)
for i in 0 1 2 3; do
    DNNPRIMS_TEST_SHARD="$i/4" timeout 70 python3 -m pytest "${common[@]}" tests/test_normalization.py \
        -k "cluster_training or sixteen or two_shapes" > "$OUT/tests.$i.log" 2>&1 &
done
wait
echo "[$(( $(date +%s) - T0 )) s] tests done"
timeout 70 python3 notes/bn16_ab.py > "$OUT/ab.log" 2>&1
rc=$?; echo "[$(( $(date +%s) - T0 )) s] ab rc $rc"
echo "== failures (first 20)"
grep -hE "^(FAILED|ERROR)" "$OUT"/tests.*.log | head -n 20
grep -h -B2 -A8 "refused the 16-block" "$OUT"/tests.*.log | head -n 20
echo "== test summaries (4 shards: CL <= 8 regression, CL = 16 variant, two shapes)"
for f in "$OUT"/tests.*.log; do
    echo "$(basename "$f"): $(grep -E "[0-9]+ (passed|failed|error|skipped)" "$f" | tail -n 1)"
done
echo "== A/B: CLUSTER_MAX_SIZE 8 vs 16 (CL: the cluster size prepared; refused: launches the driver refused)"
cat "$OUT/ab.log"
