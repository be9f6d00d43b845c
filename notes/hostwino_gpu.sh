#!/usr/bin/env bash
# helper hostwino's one GPU call (notes/hostwino.md): warm the Winograd family, run the
# Winograd / fast-path / cuBLAS GPU tests, then the overhead bench on main's library
# ("before": a copy of the repository root with this branch's bench/overhead.py, the
# same measurement) and on this branch ("after"), then the probe; tables last.
#   bash notes/hostwino_gpu.sh [seconds of budget, default 135]
# From .wt/hostwino inside main's checkout on the device machine.
set -u
cd "$(dirname "$0")/.."
HERE=$PWD
MAIN_ROOT="$(cd ../.. && pwd)"
export CUPY_TF32=0 PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
budget=${1:-135}
t0=$(date +%s)
BEFORE=/tmp/hostwino_before
rm -rf "$BEFORE" && mkdir -p "$BEFORE"
tar -C "$MAIN_ROOT" -cf - dnnprims kernels | tar -C "$BEFORE" -xf -
cp dnnprims/bench/overhead.py "$BEFORE/dnnprims/bench/overhead.py"
cp kernels/bench_spin.cu "$BEFORE/kernels/bench_spin.cu"
echo "main at $(git -C "$MAIN_ROOT" log --oneline -1 2>/dev/null); same winograd source: $(cmp -s kernels/conv_winograd.cu "$BEFORE/kernels/conv_winograd.cu" && echo yes || echo NO)"
PYTHONPATH=$HERE timeout 75 python3 scripts/warm_kernels.py 9 conv_winograd.cu bench_spin.cu > "$OUT/warm.log" 2>&1
echo "warm rc $? at $(( $(date +%s) - t0 )) s: $(tail -n 1 "$OUT/warm.log")"
# Tests: Winograd, cuBLAS, the fast paths' Winograd / workspace / graph tests, in 6 shards.
common=(-q -m gpu --tb=short -p no:cacheprovider)
for i in 0 1 2 3 4 5; do
    PYTHONPATH=$HERE DNNPRIMS_TEST_SHARD="$i/6" timeout 40 python3 -m pytest "${common[@]}" \
        tests/test_conv_winograd.py tests/test_cublas.py tests/test_fast_path.py \
        -k "winograd or cublas or strided or workspace or gemm or conv" > "$OUT/tests.$i.log" 2>&1 &
done
wait
echo "tests done at $(( $(date +%s) - t0 )) s"
only="conv2d_forward 3x3,conv2d_backward_data"
(cd "$BEFORE" && PYTHONPATH="$BEFORE" timeout 60 python3 -m dnnprims.bench.overhead --only "$only" --no-pieces \
    --calls 1000) > "$OUT/overhead_before.log" 2>&1
echo "before rc $? at $(( $(date +%s) - t0 )) s"
PYTHONPATH=$HERE timeout 60 python3 -m dnnprims.bench.overhead --only "$only" --no-pieces --calls 1000 \
    > "$OUT/overhead_after.log" 2>&1
echo "after rc $? at $(( $(date +%s) - t0 )) s"
left=$((budget - ($(date +%s) - t0) - 3))
PYTHONPATH=$HERE timeout "$left" python3 notes/hostwino_probe.py > "$OUT/probe.log" 2>&1
echo "probe rc $? at $(( $(date +%s) - t0 )) s"
echo "== failures (first 25)"
grep -hE "^(FAILED|ERROR)" "$OUT"/tests.*.log | head -n 25
grep -hE "Error|error" "$OUT"/overhead_*.log "$OUT/probe.log" | head -n 8
echo "== test summaries"
for f in "$OUT"/tests.*.log; do echo "$(basename "$f"): $(grep -E "[0-9]+ (passed|failed|error)" "$f" | tail -n 1)"; done
sed -n '/^== cached conv/,$p' "$OUT/probe.log"
echo "== overhead BEFORE (main's library)"; cat "$OUT/overhead_before.log"
echo "== overhead AFTER (branch hostwino)"; cat "$OUT/overhead_after.log"
