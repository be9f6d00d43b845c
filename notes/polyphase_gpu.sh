#!/usr/bin/env bash
# Helper polyphase's one GPU call (notes/polyphase.md): warm the convolution kernel
# families, run the polyphase GPU tests (and test_conv.py's drawn-auto test, where
# auto now meets dilated problems) in 4 shards, then time dilated_3x3_d2 (our
# breakdown script, then the project benchmark side by side with cuDNN); tables last.
#   bash notes/polyphase_gpu.sh      (from the repository root of a copy of the branch)
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD CUPY_TF32=0 PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
t0=$(date +%s)
timeout 45 python3 scripts/warm_kernels.py 16 conv_direct.cu conv_im2col.cu conv_implicit_gemm.cu conv_implicit_gemm_backward.cu conv_winograd.cu conv_depthwise.cu > "$OUT/warm.log" 2>&1
echo "warm rc $? at $(( $(date +%s) - t0 )) s: $(tail -n 1 "$OUT/warm.log")"
for i in 0 1 2 3; do
    DNNPRIMS_TEST_SHARD=$i/4 timeout 40 python3 -m pytest -q -m gpu tests/test_conv_polyphase.py tests/test_conv.py \
        -k "polyphase or auto_matches_reference_drawn" -p no:cacheprovider --tb=short > "$OUT/tests.$i.log" 2>&1 &
done
wait
echo "tests done at $(( $(date +%s) - t0 )) s"
grep -hE "^(FAILED|ERROR)|Error" "$OUT"/tests.*.log | head -n 20
timeout 40 python3 notes/polyphase_bench.py --json "$OUT/polyphase_bench.json" > "$OUT/bench_polyphase.log" 2>&1
echo "polyphase_bench rc $? at $(( $(date +%s) - t0 )) s"
timeout $(( 135 - ($(date +%s) - t0) )) python3 -m dnnprims.bench conv --only dilated_3x3_d2 \
    --json "$OUT/bench.json" > "$OUT/bench_main.log" 2>&1
echo "bench rc $? at $(( $(date +%s) - t0 )) s"
tail -n 25 "$OUT/bench_main.log"
tail -n 12 "$OUT/bench_polyphase.log"
for i in 0 1 2 3; do tail -n 1 "$OUT/tests.$i.log"; done
