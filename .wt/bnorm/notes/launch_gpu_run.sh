#!/usr/bin/env bash
# Helper launch's GPU call: parallel warm compile of every kernel name, the overhead
# table (with a "no reuse" column), the small memory-bound bench rows with output reuse
# on and off, then the GPU test suite in 6 round-robin shards (files this change
# touches first) until the time limit.  Each part under its own time limit.
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD:$PWD/notes CUPY_TF32=0 PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
END=${END_S:-203}
timeout ${T_WARM:-70} python notes/launch_warm.py 16 > "$OUT/warm.log" 2>&1
echo "warm exit $? at $(el) s: $(tail -n 1 "$OUT/warm.log")"
timeout ${T_OVERHEAD:-40} python -m dnnprims.bench.overhead --calls 1000 > "$OUT/overhead.log" 2>&1
echo "overhead exit $? at $(el) s"
ONLY=classifier_256x1000,global_avg_r50,bn_r50_late
timeout ${T_BENCH:-25} python -m dnnprims.bench memory --only $ONLY --quiet > "$OUT/bench_reuse.log" 2>&1
echo "bench (reuse) exit $? at $(el) s"
DNNPRIMS_OUTPUT_REUSE=0 timeout ${T_BENCH:-25} python -m dnnprims.bench memory --only $ONLY --quiet \
    > "$OUT/bench_noreuse.log" 2>&1
echo "bench (no reuse) exit $? at $(el) s"
left=$(( END - $(el) )); [ $left -lt 20 ] && left=20
export SHARD_FIRST=test_fast_path,test_softmax,test_activation,test_pooling,test_normalization,test_conv,test_conv_winograd,test_conv_dft
for i in 0 1 2 3 4 5; do
    SHARD=$i/6 timeout $left python -m pytest -p launch_shard -v -m gpu tests/ \
        --ignore=tests/test_notebooks.py --tb=short -p no:cacheprovider > "$OUT/t$i.log" 2>&1 &
done
wait
echo "tests done at $(el) s (limit $left s each)"
cat "$OUT"/t?.log | grep -E "^(FAILED|ERROR)|::.* (FAILED|ERROR)" | head -n 40
for i in 0 1 2 3 4 5; do echo "shard $i: $(tail -n 1 "$OUT/t$i.log")"; done
echo "passed per file:"; cat "$OUT"/t?.log | grep -E "::.* PASSED" | cut -d: -f1 | sort | uniq -c
echo "failed/error: $(cat "$OUT"/t?.log | grep -cE '::.* (FAILED|ERROR)')"
gzip -f "$OUT"/t?.log
echo "================ bench rows (reuse on)"; sed -n '/^op /,/^== benchmark summary/p' "$OUT/bench_reuse.log" | head -n 16
echo "================ bench rows (reuse off)"; sed -n '/^op /,/^== benchmark summary/p' "$OUT/bench_noreuse.log" | head -n 16
echo "================ overhead (us per call)"; cat "$OUT/overhead.log"
