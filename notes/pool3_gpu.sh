#!/usr/bin/env bash
# GPU run of branch pool3 (notes/pool3.md): pooling GPU tests, the pool rows of
# the memory benchmark (ours vs PyTorch), the NHWC sweep and kernel-only times,
# the short table last.  Usage (device machine, tree root): bash notes/pool3_gpu.sh [TEST_SECONDS]
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PYTHONPATH="$ROOT" PYTHONUNBUFFERED=1 CUPY_TF32=0
OUTDIR="${OUT:-$ROOT/out}"; mkdir -p "$OUTDIR"
timeout "${1:-60}" python -m pytest -q -m gpu tests/ --ignore=tests/test_notebooks.py -k pool --tb=short \
    -p no:cacheprovider > "$OUTDIR/tests.log" 2>&1
echo "pytest exit $?"; grep -E "^(FAILED|ERROR)" "$OUTDIR/tests.log" | head -20; tail -n 3 "$OUTDIR/tests.log"
timeout 40 python -m dnnprims.bench memory --only r50_maxpool,max3x3s2_big,avg2x2s2,global_avg_r50 \
    --json "$OUTDIR/bench.json" > "$OUTDIR/bench.log" 2>&1
echo "bench exit $?"
timeout 30 python notes/pool3_gpu.py "$OUTDIR/bench.json" 2>&1 | tee "$OUTDIR/check.log"
