#!/usr/bin/env bash
# Helper host2's one GPU call: warm compile, GPU tests of batch norm / pooling / the fast
# paths, the overhead table, three bench rows; each part under its own time limit.
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD CUPY_TF32=0 PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
t0=$(date +%s)
timeout ${T_WARM:-55} python notes/host2_warm.py 16 > "$OUT/warm.log" 2>&1
echo "warm exit $? at $(( $(date +%s) - t0 )) s"; tail -n 2 "$OUT/warm.log"
timeout ${T_TESTS:-80} bash scripts/gpu_suite.sh tests \
    -k "test_normalization or test_pooling or (test_fast_path and not conv)" --maxfail=25 \
    > "$OUT/tests_full.log" 2>&1
echo "tests exit $? at $(( $(date +%s) - t0 )) s"
grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" "$OUT/tests_full.log" | tail -n 30
timeout ${T_OVERHEAD:-35} python -m dnnprims.bench.overhead --calls 1000 > "$OUT/overhead.log" 2>&1
echo "overhead exit $? at $(( $(date +%s) - t0 )) s"
timeout ${T_BENCH:-25} python -m dnnprims.bench memory --only bn_r50_late,global_avg_r50,r50_maxpool \
    > "$OUT/bench_memory.log" 2>&1
echo "bench exit $? at $(( $(date +%s) - t0 )) s"
echo "================ bench rows"; grep -E "bn_r50_late|global_avg_r50|r50_maxpool|op " "$OUT/bench_memory.log" | tail -n 14
echo "================ overhead (us per call, ours vs torch)"; cat "$OUT/overhead.log"
