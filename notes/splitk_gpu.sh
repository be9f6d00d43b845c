#!/usr/bin/env bash
# helper splitk's GPU call (notes/splitk.md): apply the WIP patch (split-K for the
# forward implicit GEMM, not registered), warm the conv kernel families it needs,
# time the batch-1 ResNet-50 layers (auto pick / one-pass implicit_gemm / split-K
# 2, 4, 8 and the rule / PyTorch cuDNN, one process), run the split-K GPU tests and
# the existing implicit_gemm GPU tests of test_conv.py (the patch changes the
# single-pass kernel's signature and epilogue code), then print the table last.
#   bash notes/splitk_gpu.sh [seconds of budget, default 120]
# From the repository root of a copy of the splitk8 branch (e.g. .wt/splitk8), or of
# main with the branch merged.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD CUPY_TF32=0 PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
budget=${1:-120}
t0=$(date +%s)
PATCH=notes/wip/splitk_forward_unverified.patch
# This copy may sit inside another repository (.wt/ of main): keep git from finding
# it, or `git apply` would take paths from that repository's root and skip them all.
# A patch applied here is taken back out on exit, so that a later call on the same
# machine finds the tree as it was sent.
# All or nothing: `git apply` is atomic, and the `patch` fallback first checks every
# hunk (--dry-run, no fuzz).  A partly applied patch (session 8: one hunk of
# implicit_gemm.py rejected, the rest applied with fuzz) ran the tests on a tree
# whose _plan and prepare disagreed, and every test failed for that alone.
if ! grep -q conv_implicit_gemm_split_sum kernels/conv_implicit_gemm.cu; then
    if GIT_CEILING_DIRECTORIES="$(dirname "$PWD")" git apply "$PATCH" 2>"$OUT/apply.log"; then
        trap 'GIT_CEILING_DIRECTORIES="$(dirname "$PWD")" git apply -R "$PATCH"' EXIT
    elif patch -p1 -F0 --dry-run < "$PATCH" >>"$OUT/apply.log" 2>&1 \
            && patch -p1 -F0 < "$PATCH" >>"$OUT/apply.log" 2>&1; then
        trap 'patch -R -p1 < "$PATCH" > /dev/null' EXIT
    else
        echo "patch did not apply (nothing applied): rebase it onto this tree (notes/splitk.md, Session 8 rebase)"
        cat "$OUT/apply.log"; exit 1
    fi
fi
if ! grep -q conv_implicit_gemm_split_sum kernels/conv_implicit_gemm.cu || [ ! -f tests/test_conv_splitk.py ] \
        || ! grep -q "def split_k_plan" dnnprims/algos/implicit_gemm.py; then
    echo "patch did not apply"; cat "$OUT/apply.log"; exit 1
fi
echo "patch applied: $(grep -c SPLIT_K kernels/conv_implicit_gemm.cu) SPLIT_K mentions"
nvidia-smi -L 2>/dev/null | head -n 1
# NVRTC in parallel for the families the tests and the bench's auto picks use.
timeout 60 python3 scripts/warm_kernels.py 16 conv_implicit_gemm.cu conv_implicit_gemm_backward.cu \
    conv_direct.cu conv_im2col.cu activation.cu tensor_ops.cu > "$OUT/warm.log" 2>&1
echo "warm rc $?: $(tail -n 1 "$OUT/warm.log")"
# Timing first (the figures matter most): forward fp32, then backward data (stride 1).
timeout 45 python3 notes/splitk_bench.py --directions forward > "$OUT/bench_forward.log" 2>&1
echo "bench forward rc $?"
left=$((budget - ($(date +%s) - t0) - 10))
echo "tests get $left s"
common=(-q -m gpu --tb=short -p no:cacheprovider)
for i in 0 1 2 3; do
    DNNPRIMS_TEST_SHARD="$i/4" timeout "$left" python3 -m pytest "${common[@]}" \
        tests/test_conv_splitk.py > "$OUT/tests_splitk.$i.log" 2>&1 &
done
for i in 0 1; do
    DNNPRIMS_TEST_SHARD="$i/2" timeout "$left" python3 -m pytest "${common[@]}" tests/test_conv.py \
        -k "implicit_gemm and not wgrad and not subpixel" > "$OUT/tests_igemm.$i.log" 2>&1 &
done
wait
left=$((budget - ($(date +%s) - t0) - 3))
if [ "$left" -gt 20 ]; then
    timeout "$left" python3 notes/splitk_bench.py --directions backward_data > "$OUT/bench_bdata.log" 2>&1
    echo "bench backward_data rc $?"
fi
echo "== failures (first 30)"
grep -hE "^(FAILED|ERROR)" "$OUT"/tests_*.log | head -n 30
grep -hE "Error|error:" "$OUT"/bench_*.log | grep -v '^ROW' | head -n 5
echo "== test summaries (split-K x4, test_conv.py implicit_gemm x2)"
for f in "$OUT"/tests_splitk.*.log "$OUT"/tests_igemm.*.log; do
    echo "$(basename "$f"): $(grep -E "[0-9]+ (passed|failed|error)" "$f" | tail -n 1)"
done
echo "== batch-1 ResNet-50 layers: ours vs cuDNN"
python3 notes/splitk_bench.py --table "$OUT"/bench_forward.log $(ls "$OUT"/bench_bdata.log 2>/dev/null)
