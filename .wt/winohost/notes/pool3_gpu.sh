#!/usr/bin/env bash
# GPU run of branch pool3 (notes/pool3.md), on the device machine at the tree root:
#   bash notes/pool3_gpu.sh [TEST_SECONDS]        call 1: all pooling GPU tests, the pool rows of
#                                                 the memory benchmark, the NHWC sweep, short table last
#   bash notes/pool3_gpu.sh TEST_SECONDS final    call 2: the tests of the paths changed after call 1,
#                                                 kernel-only times and the changed rows against torch
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PYTHONPATH="$ROOT" PYTHONUNBUFFERED=1 CUPY_TF32=0
OUTDIR="${OUT:-$ROOT/out}"; mkdir -p "$OUTDIR"
K="pool"
[ "${2:-}" = final ] && K="pool and (k3s2 or global_average or repeated or misaligned or empty or mixing or int32_range)"
timeout "${1:-60}" python -m pytest -q -m gpu tests/ --ignore=tests/test_notebooks.py -k "$K" --tb=short \
    -p no:cacheprovider > "$OUTDIR/tests.log" 2>&1
echo "pytest exit $?"; grep -E "^(FAILED|ERROR)" "$OUTDIR/tests.log" | head -20; tail -n 3 "$OUTDIR/tests.log"
if [ "${2:-}" = final ]; then
    timeout 25 python notes/pool3_gpu.py --final 2>&1 | tee "$OUTDIR/check.log"
    exit 0
fi
timeout 40 python -m dnnprims.bench memory --only r50_maxpool,max3x3s2_big,avg2x2s2,global_avg_r50 \
    --json "$OUTDIR/bench.json" > "$OUTDIR/bench.log" 2>&1
echo "bench exit $?"
timeout 30 python notes/pool3_gpu.py "$OUTDIR/bench.json" 2>&1 | tee "$OUTDIR/check.log"
