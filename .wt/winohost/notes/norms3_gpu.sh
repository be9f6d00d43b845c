#!/usr/bin/env bash
# Helper norms3's GPU call: parallel warm compile (notes/norms_warm.py, the
# batchnorm and row-normalization kernel names), the normalization GPU tests
# (pytest -m gpu -k "$NORMS3_K", default "norm"), the A/B probe of the new
# paths, `python -m dnnprims.bench memory --only bn_,gn_` side by side with
# PyTorch, and a short table last.  Every step has its own time cap.
#   bash notes/norms3_gpu.sh            (from the repository root; logs in $OUT)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH="$PWD" CUPY_TF32=0 PYTHONUNBUFFERED=1
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
K="${NORMS3_K:-norm}"
nvidia-smi -L
NAMES="$("$PY" -c "from dnnprims import normalization as a, row_normalization as b
print(','.join(sorted({e.split('<', 1)[0] for f in (a.FAMILY, b.FAMILY) for e in f.name_expressions})))")"
timeout "${WARM_S:-40}" "$PY" notes/norms_warm.py 16 "$NAMES" > "$OUT/warm.log" 2>&1; tail -n 1 "$OUT/warm.log"
timeout "${TESTS_S:-75}" "$PY" -m pytest -m gpu ${NORMS3_FILES:-tests/ --ignore=tests/test_notebooks.py} -k "$K" --tb=line -v \
    -p no:cacheprovider > "$OUT/tests.log" 2>&1
echo "tests exit $? ($K)"
grep -cE " PASSED" "$OUT/tests.log"; grep -E "FAILED|ERROR" "$OUT/tests.log" | head -n 20
timeout "${PROBE_S:-30}" "$PY" notes/norms3_probe.py "$OUT/probe.json" > "$OUT/probe.log" 2>&1 || echo "probe exit $?"
if [ "${BENCH_S:-40}" -gt 0 ]; then  # BENCH_S=0: the probe's PyTorch columns only
    timeout "${BENCH_S:-40}" "$PY" -m dnnprims.bench memory --only bn_,gn_ --json "$OUT/bench.json" --quiet \
        > "$OUT/bench.log" 2>&1 || echo "bench exit $?"
fi
echo "== tests: $(grep -E '[0-9]+ (passed|failed)' "$OUT/tests.log" | tail -n 1)"
"$PY" notes/norms3_table.py "$OUT/bench.json" "$OUT/probe.json"
