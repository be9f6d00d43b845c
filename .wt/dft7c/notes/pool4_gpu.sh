#!/usr/bin/env bash
# GPU run of branch pool4 (notes/pool4.md), on the device machine at the tree root:
#   bash notes/pool4_gpu.sh [TEST_SECONDS] [BENCH_PROBLEMS]
# warm compile of the pooling kernels (parallel), all pooling GPU tests in 4 shards
# side by side, the pool rows of the memory benchmark against torch, then
# notes/pool4_gpu.py (16-bit backward rows, bitwise check against the scalar
# paths, global-average kernel time) and the short table last.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PYTHONPATH="$ROOT" PYTHONUNBUFFERED=1 CUPY_TF32=0
OUTDIR="${OUT:-$ROOT/out}"; mkdir -p "$OUTDIR"
T="${1:-40}"
PROBLEMS="${2:-max3x3s2_big_f16,max3x3s2_big_nhwc,global_avg_r50}"
timeout 45 python notes/pool4_gpu.py --warm > "$OUTDIR/warm.log" 2>&1; tail -n 1 "$OUTDIR/warm.log"
for i in 0 1 2 3; do
    DNNPRIMS_TEST_SHARD="$i/4" timeout "$T" python -m pytest -q -m gpu tests/test_pooling.py --tb=short \
        -p no:cacheprovider > "$OUTDIR/tests.$i.log" 2>&1 &
done
wait
cat "$OUTDIR"/tests.?.log > "$OUTDIR/tests.log"
grep -E "^(FAILED|ERROR)" "$OUTDIR/tests.log" | head -20
for i in 0 1 2 3; do echo "shard $i: $(tail -n 1 "$OUTDIR/tests.$i.log")"; done
timeout 30 python -m dnnprims.bench memory --only "$PROBLEMS" --json "$OUTDIR/bench.json" > "$OUTDIR/bench.log" 2>&1
echo "bench exit $?"
timeout 25 python notes/pool4_gpu.py "$OUTDIR/bench.json" 2>&1 | tee "$OUTDIR/check.log"
