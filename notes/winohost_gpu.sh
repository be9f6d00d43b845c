#!/usr/bin/env bash
# helper winohost's GPU call: warm kernels, the probe (A/B of workspace reuse, the
# pieces, why a graph capture fails), the overhead bench, then the conv GPU tests
# in 6 shards side by side with the Winograd / workspace subset in 2; a summary last.
# (Session 5 ran the graph version of this script: notes/wip/winohost_graphs_unverified.patch.)
#   bash notes/winohost_gpu.sh [seconds of budget, default 140]
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD CUPY_TF32=0 PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
budget=${1:-140}
t0=$(date +%s)
timeout 55 python3 scripts/warm_kernels.py 16 > "$OUT/warm.log" 2>&1
tail -n 1 "$OUT/warm.log"
timeout 30 python3 notes/winohost_probe.py > "$OUT/probe.log" 2>&1; echo "probe rc $?"
timeout 25 python3 -m dnnprims.bench.overhead > "$OUT/overhead.log" 2>&1; echo "overhead rc $?"
left=$((budget - ($(date +%s) - t0) - 6))
echo "tests get $left s"
common=(-q -m gpu tests/ --ignore=tests/test_notebooks.py --tb=short -p no:cacheprovider)
for i in 0 1 2 3 4 5; do
    DNNPRIMS_TEST_SHARD="$i/6" timeout "$left" python3 -m pytest "${common[@]}" -k conv > "$OUT/tests_conv.$i.log" 2>&1 &
done
for i in 0 1; do
    DNNPRIMS_TEST_SHARD="$i/2" timeout "$left" python3 -m pytest "${common[@]}" \
        -k "(winograd or workspace) and not conv" > "$OUT/tests_wino.$i.log" 2>&1 &
done
wait
echo "== failures"
grep -hE "^(FAILED|ERROR)" "$OUT"/tests_*.log | head -n 30
echo "== test summaries (conv x6, winograd/workspace not matching conv x2)"
for f in "$OUT"/tests_conv.*.log "$OUT"/tests_wino.*.log; do
    echo "$(basename "$f"): $(grep -E "[0-9]+ (passed|failed|error)" "$f" | tail -n 1)"
done
echo "== overhead bench (ours, torch, ours without output reuse)"
head -n 6 "$OUT/overhead.log"
grep -E "^  (cupy.empty|PreparedLaunch \(relu|OutputSlot)" "$OUT/overhead.log"
echo "== probe"
sed -n '/== winohost probe/,$p' "$OUT/probe.log"
grep -E "chosen|capture|Error" "$OUT/probe.log" | head -n 8
echo "total $(( $(date +%s) - t0 )) s"
