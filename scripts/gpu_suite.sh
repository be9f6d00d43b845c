#!/usr/bin/env bash
# The one project script for the GPU machine: GPU tests, the main job on the
# GPU, and the benchmark against PyTorch/cuDNN, with a summary printed last.
# That machine has numpy, cupy, torch, pytest and hypothesis preinstalled and
# no package registry: nothing is installed here; the repository is imported
# through PYTHONPATH.
#
#   bash scripts/gpu_suite.sh                  # tests, main job, benchmark (all)
#   bash scripts/gpu_suite.sh tests            # GPU tests only
#   bash scripts/gpu_suite.sh tests -k pool    # GPU tests, pytest -k expression
#   bash scripts/gpu_suite.sh bench [conv|memory|rnn|all] [bench options...]
#   bash scripts/gpu_suite.sh main             # the main job on the GPU only
#   bash scripts/gpu_suite.sh overhead         # per-call host overhead against PyTorch only
#   bash scripts/gpu_suite.sh tune [tune options]  # re-measure the heuristic table: written to
#                                                  # $OUT/conv_table.json and installed in the tree
#                                                  # (tune --filters 5 7 --update: only those points)
#
# Logs and bench.json (+ bench.png) go to $OUT when it is set, else ./out.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export CUPY_TF32=0
OUTDIR="${OUT:-$ROOT/out}"
mkdir -p "$OUTDIR"
PY="${PYTHON:-python3}"

what="${1:-all}"
[ $# -gt 0 ] && shift
run_tests=0; run_main=0; run_bench=0; run_overhead=0; run_tune=0; tune_args=()
pytest_args=(); bench_args=()
case "$what" in
    all) run_tests=1; run_main=1; run_bench=1; run_overhead=1; bench_args=(all) ;;
    overhead) run_overhead=1 ;;
    tune) run_tune=1; tune_args=("$@") ;;
    tests) run_tests=1; pytest_args=("$@") ;;
    main) run_main=1 ;;
    bench) run_bench=1; bench_args=("${@:-all}") ;;
    *) echo "usage: bash scripts/gpu_suite.sh [all | tests [pytest args] | main | overhead | tune [options] | bench [suite] [options]]" >&2
       exit 2 ;;
esac

echo "== devices"
nvidia-smi -L || echo "nvidia-smi failed"
"$PY" -c 'import cupy, numpy; print(f"cupy {cupy.__version__}, numpy {numpy.__version__}, CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}")' || true

status=0
tests_summary="(tests not run)"
main_summary="(main job not run)"
if [ "$run_tests" = 1 ]; then
    # Notebooks run on the NumPy path in CI; the GPU machine has no Jupyter.
    # NVRTC first, every kernel in parallel (fills CuPy's on-disk cache), then
    # GPU_TEST_SHARDS pytest processes side by side (conftest: DNNPRIMS_TEST_SHARD).
    shards="${GPU_TEST_SHARDS:-6}"
    echo "== warm kernel cache: scripts/warm_kernels.py"
    "$PY" scripts/warm_kernels.py 16 > "$OUTDIR/warm_kernels.log" 2>&1 || echo "warm compile failed (see warm_kernels.log)"
    tail -n 1 "$OUTDIR/warm_kernels.log"
    echo "== GPU tests: pytest -m gpu ${pytest_args[*]:-} in $shards shards"
    for ((i = 0; i < shards; i++)); do
        DNNPRIMS_TEST_SHARD="$i/$shards" "$PY" -m pytest -q -m gpu tests/ --ignore=tests/test_notebooks.py \
            --tb=short -p no:cacheprovider "${pytest_args[@]}" > "$OUTDIR/gpu_tests.$i.log" 2>&1 &
    done
    rc=0
    for job in $(jobs -p); do wait "$job" || rc=1; done
    [ "$rc" -ne 0 ] && status=1
    cat "$OUTDIR"/gpu_tests.*.log > "$OUTDIR/gpu_tests.log"
    grep -E "^(FAILED|ERROR)" "$OUTDIR/gpu_tests.log" | head -n 40
    tests_summary="$("$PY" - "$OUTDIR" "$shards" <<'PYEOF'
import re, sys
out, shards = sys.argv[1], int(sys.argv[2])
totals = {}
for i in range(shards):
    lines = open(f"{out}/gpu_tests.{i}.log").read().splitlines()
    last = next((l for l in reversed(lines) if re.search(r"\d+ (passed|failed|error)", l)), "")
    for count, what in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected)", last):
        totals[what] = totals.get(what, 0) + int(count)
print(", ".join(f"{v} {k}" for k, v in totals.items()) or "no summary line")
PYEOF
) (any pytest failed: $rc)"
fi
if [ "$run_main" = 1 ]; then
    echo "== main job on the GPU: python -m dnnprims --device gpu"
    "$PY" -m dnnprims --device gpu 2>&1 | tee "$OUTDIR/main_job.log"
    rc=$?
    [ "$rc" -ne 0 ] && status=1
    main_summary="$(tail -n 1 "$OUTDIR/main_job.log") (exit $rc)"
fi
tune_summary=""
if [ "$run_tune" = 1 ]; then
    echo "== tuning: python -m dnnprims.tune ${tune_args[*]:-}"
    # --update re-measures part of the grid into the shipped table: start from a copy of it.
    case " ${tune_args[*]:-} " in *" --update "*) cp dnnprims/algos/conv_table.json "$OUTDIR/conv_table.json" ;; esac
    "$PY" -m dnnprims.tune "${tune_args[@]}" --out "$OUTDIR/conv_table.json" 2>&1 | tee "$OUTDIR/tune.log"
    tune_rc=${PIPESTATUS[0]}
    partial=0   # --filters without --update measures part of the grid: never install that as the table
    case " ${tune_args[*]:-} " in *" --filters "*) case " ${tune_args[*]:-} " in *" --update "*) ;; *) partial=1 ;; esac ;; esac
    if [ "$tune_rc" -eq 0 ] && [ -s "$OUTDIR/conv_table.json" ] && [ "$partial" = 1 ]; then
        tune_summary="partial table in $OUTDIR/conv_table.json (--filters without --update: not installed)"
    elif [ "$tune_rc" -eq 0 ] && [ -s "$OUTDIR/conv_table.json" ]; then
        cp "$OUTDIR/conv_table.json" dnnprims/algos/conv_table.json
        tune_summary="$(grep -iE 'holdout|within|points' "$OUTDIR/tune.log" | tail -n 6); failed: $(grep -c failed "$OUTDIR/tune.log")"
    else
        status=1
        tune_summary="tuning failed (see $OUTDIR/tune.log)"
    fi
fi
overhead_table=""
if [ "$run_overhead" = 1 ]; then
    echo "== per-call host overhead: python -m dnnprims.bench.overhead"
    "$PY" -m dnnprims.bench.overhead 2>&1 | tee "$OUTDIR/overhead.log"
    [ "${PIPESTATUS[0]}" -ne 0 ] && status=1
    overhead_table="$(cat "$OUTDIR/overhead.log")"
fi
bench_table=""
if [ "$run_bench" = 1 ]; then
    echo "== benchmark: python -m dnnprims.bench ${bench_args[*]}"
    "$PY" -m dnnprims.bench "${bench_args[@]}" --json "$OUTDIR/bench.json" 2>&1 | tee "$OUTDIR/bench.log"
    rc=$?
    [ "$rc" -ne 0 ] && status=1
    # The summary table: everything after the last blank line that precedes it.
    # The short summary the benchmark prints last (the full tables are in bench.log).
    bench_table="$(sed -n '/^== benchmark summary/,$p' "$OUTDIR/bench.log")"
fi

echo
echo "================ summary ================"
echo "GPU tests: $tests_summary"
echo "main job:  $main_summary"
[ -n "$tune_summary" ] && echo "tuning: $tune_summary"
if [ -n "$overhead_table" ]; then
    echo "per-call host overhead (us, cached problem, no sync):"
    echo "$overhead_table"
fi
if [ -n "$bench_table" ]; then
    echo "benchmark (full numbers in $OUTDIR/bench.json):"
    echo "$bench_table"
fi
exit $status
