#!/usr/bin/env bash
# Helper dw28's GPU run: depthwise GPU tests, the depthwise sweep (notes/bench_dw28.py)
# and the official benchmark rows of the depthwise problems; short tables last.
#   bash notes/dw28_gpu.sh [tests|sweep|bench]...   (default: all three)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 CUPY_TF32=0
OUTDIR="${OUT:-$ROOT/out}"; mkdir -p "$OUTDIR"
parts=("${@:-tests sweep bench}"); parts=(${parts[*]})
summary=""
for part in "${parts[@]}"; do
    case "$part" in
    tests)
        python3 -m pytest -q -m gpu tests/test_conv.py -k depthwise --tb=short -p no:cacheprovider -x \
            > "$OUTDIR/gpu_tests.log" 2>&1
        summary+="GPU tests (-m gpu -k depthwise): $(tail -n 1 "$OUTDIR/gpu_tests.log")"$'\n'
        grep -E "^(FAILED|ERROR)|Error|assert" "$OUTDIR/gpu_tests.log" | head -n 20 ;;
    sweep)
        python3 notes/bench_dw28.py "$OUTDIR" > "$OUTDIR/bench_dw28.log" 2>&1
        summary+="$(sed -n '/^== dw28 sweep/,$p' "$OUTDIR/bench_dw28.log")"$'\n'
        tail -n 5 "$OUTDIR/bench_dw28.log" | grep -i -E "error|traceback" ;;
    bench)
        python3 -m dnnprims.bench conv --only mbv2_dw --json "$OUTDIR/bench_conv.json" --quiet \
            > "$OUTDIR/bench_conv.log" 2>&1
        summary+="$(grep -E "^(mbv2_dw|problem|geomean)|^name" "$OUTDIR/bench_conv.log" | tail -n 20)"$'\n' ;;
    esac
done
echo "================ dw28 summary"
printf '%s' "$summary"
