#!/usr/bin/env bash
# helper winosmall's GPU call (notes/winosmall.md): apply the WIP patch (the fused
# GEMM + output-transform Winograd kernel, behind winograd.FUSED_GEMM_OUTPUT), warm
# the Winograd family, run its GPU tests (the new file, plus the old path's Winograd
# GPU tests: the patch touches the shared plan), then time host us/call and GPU ms of
# the cuBLAS path against the fused path; the table last.
#   bash notes/winosmall_gpu.sh [seconds of budget, default 140]
# From the repository root of a copy of the winosmall branch (e.g. .wt/winosmall).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD CUPY_TF32=0 PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
budget=${1:-140}
t0=$(date +%s)
# This copy may sit inside another repository (.wt/ of main): keep git from finding
# it, or `git apply` would take paths from that repository's root and skip them all.
if ! grep -q winograd_fused_gemm_output kernels/conv_winograd.cu; then
    GIT_CEILING_DIRECTORIES="$(dirname "$PWD")" git apply notes/wip/winosmall_fused_gemm_output.patch \
        2>"$OUT/apply.log" \
        || patch -p1 < notes/wip/winosmall_fused_gemm_output.patch >>"$OUT/apply.log" 2>&1
fi
if ! grep -q winograd_fused_gemm_output kernels/conv_winograd.cu || [ ! -f tests/test_conv_winograd_fused.py ]; then
    echo "patch did not apply"; cat "$OUT/apply.log"; exit 1
fi
echo "patch applied: $(grep -c winograd_fused_gemm_output kernels/conv_winograd.cu) kernel mentions"
timeout 60 python3 notes/winosmall_warm.py 8 > "$OUT/warm.log" 2>&1; echo "warm rc $?: $(tail -n 1 "$OUT/warm.log")"
# Timing first (short, and the figures matter most), one process per path.
DNNPRIMS_WINOGRAD_FUSED=0 timeout 30 python3 notes/winosmall_bench.py gemm > "$OUT/bench_gemm.log" 2>&1
echo "bench gemm rc $?"
DNNPRIMS_WINOGRAD_FUSED=1 timeout 30 python3 notes/winosmall_bench.py fused > "$OUT/bench_fused.log" 2>&1
echo "bench fused rc $?"
left=$((budget - ($(date +%s) - t0) - 8))
echo "tests get $left s"
common=(-q -m gpu --tb=short -p no:cacheprovider)
for i in 0 1 2 3 4 5; do
    DNNPRIMS_TEST_SHARD="$i/6" timeout "$left" python3 -m pytest "${common[@]}" \
        tests/test_conv_winograd_fused.py > "$OUT/tests_fused.$i.log" 2>&1 &
done
for i in 0 1; do
    DNNPRIMS_TEST_SHARD="$i/2" timeout "$left" python3 -m pytest "${common[@]}" \
        tests/test_conv_winograd.py -k "not wgrad" > "$OUT/tests_wino.$i.log" 2>&1 &
done
wait
echo "== failures (first 30)"
grep -hE "^(FAILED|ERROR)" "$OUT"/tests_*.log | head -n 30
grep -hE "Error|error:" "$OUT"/bench_*.log | head -n 5
echo "== test summaries (fused x6, old-path winograd x2)"
for f in "$OUT"/tests_fused.*.log "$OUT"/tests_wino.*.log; do
    echo "$(basename "$f"): $(grep -E "[0-9]+ (passed|failed|error)" "$f" | tail -n 1)"
done
echo "== host us / GPU ms: cuBLAS path (gemm) vs fused WIP path"
python3 notes/winosmall_bench.py --table "$OUT/bench_gemm.log" "$OUT/bench_fused.log"
