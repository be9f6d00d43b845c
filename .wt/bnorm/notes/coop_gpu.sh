#!/usr/bin/env bash
# helper coop's GPU call: run from .wt/coop inside the device's copy of /work/main.
# Warm compile, the -m gpu tests of the three files (in parallel) while main's
# batchnorm kernels compile, the before (main) / after (this tree) probe, the
# overhead table and the memory bench's bn_ rows, with a cap per step; table last.
set -u
W=$PWD; ROOT=$(cd ../.. && pwd); O=${OUT:-$W/out}; mkdir -p "$O"
export CUPY_TF32=0 PYTHONUNBUFFERED=1
T0=$SECONDS
left() { echo $(( ${BUDGET:-185} - (SECONDS - T0) - ${1:-0} )); }
cap() { local c=$1 l; l=$(left "${2:-0}"); [ "$l" -lt "$c" ] && c=$l; [ "$c" -lt 1 ] && c=1; echo "$c"; }
nvidia-smi -L
PYTHONPATH=$W timeout "$(cap 40)" python "$ROOT/scripts/warm_kernels.py" 16 > "$O/warm.log" 2>&1; tail -n 1 "$O/warm.log"
echo "== tests at $((SECONDS - T0)) s"
for f in ${FILES:-test_normalization test_row_normalization test_fast_path}; do
    (PYTHONPATH=$W timeout "$(cap ${TESTS_S:-75} 60)" python -m pytest -q -m gpu "tests/$f.py" -p no:cacheprovider \
        > "$O/t_$f.log" 2>&1; echo "rc=$?" >> "$O/t_$f.log") &
done
(cd "$ROOT" && PYTHONPATH=$ROOT timeout 70 python "$W/notes/coop_warm_bn.py" > "$O/warm_main.log" 2>&1) &
wait
echo "== probes at $((SECONDS - T0)) s"
(cd "$ROOT" && PYTHONPATH=$ROOT timeout "$(cap 20 20)" python "$W/notes/coop_probe.py" before \
    > "$O/probe_before.json" 2> "$O/probe_before.err")
PYTHONPATH=$W timeout "$(cap 20 5)" python notes/coop_probe.py after > "$O/probe_after.json" 2> "$O/probe_after.err"
echo "== overhead at $((SECONDS - T0)) s"
PYTHONPATH=$W timeout "$(cap 25 3)" python -m dnnprims.bench.overhead --calls 500 > "$O/overhead.log" 2>&1
echo "== bench bn_ at $((SECONDS - T0)) s"
PYTHONPATH=$W timeout "$(cap 60 2)" python -m dnnprims.bench memory --only ${BENCH_ONLY:-bn_} --repeat 20 \
    --json "$O/bench_bn.json" > "$O/bench_bn.log" 2>&1
echo "== summary at $((SECONDS - T0)) s"
for f in "$O"/t_*.log; do echo "$(basename "$f"): $(grep -E "passed|failed|error" "$f" | tail -n 1) $(tail -n 1 "$f")"; done
grep -E "^(FAILED|ERROR)" "$O"/t_*.log | head -n 20
grep -iE "batchnorm|operation" "$O/overhead.log"
grep -iE "batchnorm" "$O/bench_bn.log" | head -n 20
tail -n 3 "$O"/probe_*.err
python notes/coop_table.py "$O/probe_before.json" "$O/probe_after.json"
