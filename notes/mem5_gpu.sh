#!/usr/bin/env bash
# Helper mem5's one GPU call (notes/mem5.md), from the tree root on the device:
#   cd .wt/mem5 && bash notes/mem5_gpu.sh
# 1. warm the three touched families (batchnorm.cu, row_normalization.cu, pooling.cu);
# 2. the A/B (notes/mem5_ab.py: old / new paths by module flags, PyTorch side by side);
# 3. the GPU tests of the touched families in SHARDS parallel shards;
# 4. if time is left (elapsed < BENCH_IF_BEFORE s), the benchmark's rows of the three items;
# summaries, then the A/B table last.  Output under $OUT.
set -u
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH="$PWD" CUPY_TF32=0 PYTHONUNBUFFERED=1
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
timeout "${WARM_S:-40}" python scripts/warm_kernels.py 16 batchnorm.cu row_normalization.cu pooling.cu > "$OUT/warm.log" 2>&1
echo "warm rc $? at $(el) s: $(tail -n 1 "$OUT/warm.log")"
timeout "${AB_S:-45}" python notes/mem5_ab.py "$OUT/ab.json" > "$OUT/ab.log" 2>&1
echo "ab rc $? at $(el) s"
SH="${SHARDS:-12}"
for ((i = 0; i < SH; i++)); do
    DNNPRIMS_TEST_SHARD="$i/$SH" timeout "${TESTS_S:-50}" python -m pytest -q -m gpu -p no:cacheprovider --tb=short \
        tests/test_pooling.py tests/test_normalization.py tests/test_fast_path.py tests/test_row_normalization.py \
        -k "pool or batchnorm or (test_normalization and not row_normalization) or group or instance" \
        > "$OUT/gpu_tests.$i.log" 2>&1 &
done
wait
echo "tests done at $(el) s"
for ((i = 0; i < SH; i++)); do echo "shard $i: $(tail -n 1 "$OUT/gpu_tests.$i.log")"; done
grep -h -E "^(FAILED|ERROR)" "$OUT"/gpu_tests.*.log | head -n 25
python - "$OUT" "$SH" <<'PY'
import re, sys
out, shards = sys.argv[1], int(sys.argv[2])
totals = {}
for i in range(shards):
    lines = open(f"{out}/gpu_tests.{i}.log").read().splitlines()
    last = next((l for l in reversed(lines) if re.search(r"\d+ (passed|failed|error)", l)), "")
    for count, what in re.findall(r"(\d+) (passed|failed|errors?|skipped)", last):
        totals[what] = totals.get(what, 0) + int(count)
print("GPU tests:", ", ".join(f"{v} {k}" for k, v in totals.items()) or "no summary line")
PY
cat "$OUT"/gpu_tests.*.log > "$OUT/gpu_tests.log"; rm -f "$OUT"/gpu_tests.*.log
left=$(( ${BENCH_IF_BEFORE:-112} - $(el) ))
if [ "$left" -gt 8 ]; then
    timeout "$left" python -m dnnprims.bench memory --only bn_big_f16,gn_64x256x56x56_g32,max3x3s2_big_f16 \
        --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
    echo "bench rc $? at $(el) s"
    grep -E "ms=|kind=" "$OUT/bench.log" | head -n 12
fi
grep -v "^{" "$OUT/ab.log" | grep -v "^|" | tail -n 12
sed -n '/^copy .*rounds/,$p' "$OUT/ab.log"
