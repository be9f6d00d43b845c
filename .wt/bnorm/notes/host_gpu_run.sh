#!/usr/bin/env bash
# The host helper's one GPU call: fast-path tests, the overhead table, two bench rows.
# Each part has its own time limit so that a slow NVRTC first compile cannot eat the rest.
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD CUPY_TF32=0 PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
timeout ${T_TESTS:-120} python -m pytest -q -m gpu tests/test_fast_path.py tests/test_softmax.py \
    tests/test_conv.py tests/test_activation.py tests/test_normalization.py \
    -k "fast_path or reuse_the_validated_plan or test_softmax or (test_activation and not bias)" -x --tb=short -p no:cacheprovider \
    > "$OUT/tests.log" 2>&1
echo "tests exit $?"; tail -n 15 "$OUT/tests.log"
timeout ${T_OVERHEAD:-60} python -m dnnprims.bench.overhead --calls 1000 > "$OUT/overhead.log" 2>&1
echo "overhead exit $?"
timeout ${T_BENCH:-45} python -m dnnprims.bench memory --only classifier_256x1000 > "$OUT/bench_memory.log" 2>&1
echo "bench memory exit $?"; tail -n 12 "$OUT/bench_memory.log"
timeout ${T_CONV:-45} python -m dnnprims.bench conv --only r50_3_3x3 > "$OUT/bench_conv.log" 2>&1
echo "bench conv exit $?"; tail -n 20 "$OUT/bench_conv.log"
echo "================ overhead (us per call, ours vs torch) ================"
cat "$OUT/overhead.log"
