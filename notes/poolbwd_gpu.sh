#!/usr/bin/env bash
# GPU run of branch poolbwd (notes/poolbwd.md), on the device machine at the tree root:
# the pooling GPU tests (gpu_suite.sh: warm compile + 6 shards), notes/poolbwd_gpu.py
# (old vs new max backward kernels, global average pooling host / kernel time, torch
# side by side), then the benchmark's pool rows; summaries last.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PYTHONPATH="$ROOT" PYTHONUNBUFFERED=1 CUPY_TF32=0
OUTDIR="${OUT:-$ROOT/out}"; mkdir -p "$OUTDIR"
GPU_TEST_SHARDS=6 timeout "${1:-85}" bash scripts/gpu_suite.sh tests -k pool > "$OUTDIR/suite.log" 2>&1
echo "suite exit $?"
timeout "${2:-45}" python notes/poolbwd_gpu.py > "$OUTDIR/timing.log" 2>&1
echo "timing exit $?"
timeout "${3:-20}" python -m dnnprims.bench memory --only max3x3s2_big_f16,max3x3s2_big_nhwc,global_avg_r50 \
    --json "$OUTDIR/bench.json" > "$OUTDIR/bench.log" 2>&1
echo "bench exit $?"
grep -E "^(FAILED|ERROR)|passed|failed|warm compile" "$OUTDIR/suite.log" | head -30
grep -E "ms=|kind=" "$OUTDIR/bench.log" | head -12
cat "$OUTDIR/timing.log"
