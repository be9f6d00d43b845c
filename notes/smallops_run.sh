#!/usr/bin/env bash
# The smallops GPU run (one call): the base family's kernels compiled in the
# background, then the softmax GPU tests (warm compile + 6 shards), the A/B probe
# (notes/smallops_probe.py: old vs new kernels and launches, PyTorch side by side),
# and the benchmark's classifier rows; short tables last.  Expects the branch
# base's kernels/softmax.cu at probe_base/softmax.cu (copied in, not committed).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD CUPY_TF32=0 PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
t0=$(date +%s)
"$PY" notes/smallops_probe.py "$OUT" --warm-base > "$OUT/warm_base.log" 2>&1 &
warm_pid=$!
timeout "${SUITE_S:-80}" env GPU_TEST_SHARDS=6 bash scripts/gpu_suite.sh tests -k softmax > "$OUT/suite.log" 2>&1
echo "suite exit $? after $(( $(date +%s) - t0 )) s"
grep -E "^(FAILED|ERROR)|warm compile" "$OUT/suite.log" | head -20
grep -A2 "== summary\|======== summary" "$OUT/suite.log" | head -4
wait "$warm_pid"; echo "base warm exit $?: $(tail -1 "$OUT/warm_base.log")"
timeout "${PROBE_S:-40}" "$PY" notes/smallops_probe.py "$OUT" > "$OUT/probe.log" 2>&1
echo "probe exit $? after $(( $(date +%s) - t0 )) s"
timeout "${BENCH_S:-20}" "$PY" -m dnnprims.bench memory --only classifier_256x1000 --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
echo "bench exit $? after $(( $(date +%s) - t0 )) s"
grep -E "classifier" "$OUT/bench.log" | tail -8
sed -n '/^== classifier_256x1000/,$p' "$OUT/probe.log"
[ -s "$OUT/probe.json" ] || tail -25 "$OUT/probe.log"
