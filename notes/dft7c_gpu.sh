#!/usr/bin/env bash
# Helper dft7c (notes/dft7c.md): big_7x7_s1 "dft" timing in several fresh processes.
#   bash notes/dft7c_gpu.sh [diag|tests]   (output under $OUT)
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUPY_TF32=0
OUT="${OUT:-out}"; mkdir -p "$OUT"
what="${1:-diag}"
t0=$(date +%s)
if [ "$what" = tests ]; then
    GPU_TEST_SHARDS=6 timeout 75 bash scripts/gpu_suite.sh tests -k "dft or fft" > "$OUT/tests.log" 2>&1
    grep -E "^(FAILED|ERROR)|GPU tests:" "$OUT/tests.log" | head -30
else
    # NVRTC: only the families the runs use, their kernel names in parallel.
    python - <<'PYEOF'
import sys, multiprocessing
from concurrent.futures import ProcessPoolExecutor
sys.path.insert(0, "scripts")
import warm_kernels
from dnnprims import _kernels
items = []
for f, fam in _kernels.families().items():
    if f in ("conv_dft.cu", "conv_fft.cu"):
        items += sorted({(f, e.split("<", 1)[0]) for e in fam.name_expressions})
with ProcessPoolExecutor(16, mp_context=multiprocessing.get_context("spawn")) as pool:
    for line in pool.map(warm_kernels._compile, items):
        print(line, flush=True)
PYEOF
fi
echo "== warm/tests done at $(( $(date +%s) - t0 )) s"
for mode in dft_first cudnn_first bench_like dft_first cudnn_first; do
    prof=""; [ "$mode" = bench_like ] && prof="--profile"
    timeout 40 python notes/dft7c_diag.py $mode $prof 2>&1 | tee -a "$OUT/diag.log" | grep -v "^RESULT" | head -40
    echo "== $mode done at $(( $(date +%s) - t0 )) s"
done
if [ $(( $(date +%s) - t0 )) -lt 95 ]; then
    timeout 35 python -m dnnprims.bench conv --only big_7x7_s1 --repeat 30 > "$OUT/bench.log" 2>&1
    grep -E "big_7x7_s1 +32" "$OUT/bench.log" | head
fi
python - "$OUT/diag.log" <<'PYEOF'
import json, sys
rows = [json.loads(l[7:]) for l in open(sys.argv[1]) if l.startswith("RESULT ")]
print("| process | mode | b2b ms (1st / 2nd) | host us/call | queued GPU ms | cuDNN b2b / queued | cuDNN/dft b2b |")
print("|---|---|---|---|---|---|---|")
for i, r in enumerate(rows):
    print(f"| {i + 1} | {r['mode']} | {r['b2b_1']:.3f} / {r['b2b_2']:.3f} | {r['host_us_1']:.0f} / {r['host_us_2']:.0f} | "
          f"{r['queued_1']:.3f} / {r['queued_2']:.3f} | {r['cudnn_b2b']:.3f} / {r['cudnn_queued']:.3f} | "
          f"{r['cudnn_b2b'] / r['b2b_2']:.2f} |")
PYEOF
