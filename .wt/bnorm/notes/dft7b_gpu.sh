#!/usr/bin/env bash
# Helper dft7b's GPU run (notes/dft7b.md), from the tree root on the GPU machine.
#   bash notes/dft7b_gpu.sh 1   # warm conv_dft/conv_fft, bench (all configs), GPU tests of test_conv_dft.py (6 shards)
#   bash notes/dft7b_gpu.sh 2   # warm, bench (CONFIGS measured in turn), GPU tests of test_conv_dft.py and
#                               # test_conv.py -k dft in $NS shards (default 12)
# Each part under its own timeout; the short table is printed last.
set -u
export PYTHONPATH=$PWD CUPY_TF32=0 PYTHONUNBUFFERED=1
O=${OUT:-out}
mkdir -p "$O"
part=${1:-1}
nvidia-smi -L 2>/dev/null
timeout ${T_WARM:-40} python - <<'PY' 2>&1 | tail -2
import sys, time
from concurrent.futures import ProcessPoolExecutor
import multiprocessing
sys.path.insert(0, "scripts")
import warm_kernels as W
from dnnprims import _kernels
from dnnprims.algos import dft  # noqa: F401 (registers the family)
fams = _kernels.families()
items = [(f, n) for f in fams if f in ("conv_dft.cu", "conv_fft.cu")
         for n in sorted({e.split("<", 1)[0] for e in fams[f].name_expressions})]
t0 = time.time()
with ProcessPoolExecutor(16, mp_context=multiprocessing.get_context("spawn")) as pool:
    for line in pool.map(W._compile, items):
        print(line, flush=True)
print(f"warm {len(items)} names {time.time() - t0:.1f} s")
PY
NS=${NS:-6}
shards() {  # $1: timeout, rest: pytest args; $NS shards side by side
    local t=$1; shift
    for ((i = 0; i < NS; i++)); do
        DNNPRIMS_TEST_SHARD="$i/$NS" timeout "$t" python -m pytest -q -m gpu -p no:cacheprovider --tb=short -rf "$@" \
            > "$O/tests.$i.log" 2>&1 &
    done
    wait
    cat "$O"/tests.*.log > "$O/all_tests.txt"
    grep -E "^(FAILED|ERROR)" "$O/all_tests.txt" | head -30
    for ((i = 0; i < NS; i++)); do echo "shard $i: $(grep -E '[0-9]+ (passed|failed)' "$O/tests.$i.log" | tail -1)"; done
}
if [ "$part" = 1 ]; then
    timeout ${T_BENCH:-55} python notes/bench_dft7b.py --repeat 25 --json "$O/bench.json" --table "$O/table.md" \
        2>&1 | tee "$O/bench.log" | grep -v '^{' | tail -60
    shards ${T_TESTS:-60} tests/test_conv_dft.py
else
    timeout ${T_BENCH:-28} python notes/bench_dft7b.py --repeat 20 --json "$O/bench2.json" --table "$O/table.md" \
        2>&1 | tee "$O/bench2.log" | grep -v '^{' | tail -40
    NS=${NS2:-12}
    shards ${T_TESTS:-30} tests/test_conv_dft.py tests/test_conv.py -k "dft"
fi
echo "== summary (part $part)"
grep -hE "[0-9]+ (passed|failed)" "$O"/tests.*.log | python -c "
import re, sys
t = {}
for line in sys.stdin:
    for n, w in re.findall(r'(\d+) (passed|failed|errors?|skipped)', line):
        t[w] = t.get(w, 0) + int(n)
print('GPU tests, all shards:', t)"
cat "$O/table.md" 2>/dev/null || echo "bench: no table (timed out?)"
