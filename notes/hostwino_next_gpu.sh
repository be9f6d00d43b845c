#!/usr/bin/env bash
# Next session's check of notes/wip/hostwino_full_graph_unverified.patch (the whole cached
# Winograd call as one CUDA graph per pointer set; notes/hostwino.md section 5): apply it
# in this copy, warm the Winograd family, run the graph / workspace / Winograd GPU tests,
# then the probe (modes cupy / ctypes / graph / full) and the overhead bench; tables last.
#   bash notes/hostwino_next_gpu.sh [seconds of budget, default 135]
# From a copy of the branch (e.g. .wt/hostwino inside main's checkout on the device).
set -u
cd "$(dirname "$0")/.."
HERE=$PWD
export CUPY_TF32=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-out}
mkdir -p "$OUT"
budget=${1:-135}
t0=$(date +%s)
if ! grep -q FULL_GRAPHS dnnprims/algos/winograd.py; then
    GIT_CEILING_DIRECTORIES="$(dirname "$PWD")" git apply notes/wip/hostwino_full_graph_unverified.patch \
        2>"$OUT/apply.log" || patch -p1 < notes/wip/hostwino_full_graph_unverified.patch >>"$OUT/apply.log" 2>&1
fi
grep -q FULL_GRAPHS dnnprims/algos/winograd.py || { echo "patch did not apply"; cat "$OUT/apply.log"; exit 1; }
timeout 75 python3 scripts/warm_kernels.py 9 conv_winograd.cu bench_spin.cu > "$OUT/warm.log" 2>&1
echo "warm rc $? at $(( $(date +%s) - t0 )) s: $(tail -n 1 "$OUT/warm.log")"
for i in 0 1 2 3 4 5; do
    DNNPRIMS_TEST_SHARD="$i/6" timeout 40 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider \
        tests/test_conv_winograd.py tests/test_cublas.py tests/test_fast_path.py \
        -k "winograd or cublas or strided or workspace or graph" > "$OUT/tests.$i.log" 2>&1 &
done
wait
echo "tests done at $(( $(date +%s) - t0 )) s"
left=$((budget - ($(date +%s) - t0) - 5))
timeout "$left" python3 notes/hostwino_probe.py > "$OUT/probe.log" 2>&1
echo "probe rc $? at $(( $(date +%s) - t0 )) s"
echo "== failures (first 25)"
grep -hE "^(FAILED|ERROR)" "$OUT"/tests.*.log | head -n 25
echo "== test summaries"
for f in "$OUT"/tests.*.log; do echo "$(basename "$f"): $(grep -E "[0-9]+ (passed|failed|error)" "$f" | tail -n 1)"; done
sed -n '/^== cached conv/,$p' "$OUT/probe.log"
