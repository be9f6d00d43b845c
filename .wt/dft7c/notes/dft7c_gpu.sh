#!/usr/bin/env bash
# Helper dft7c (notes/dft7c.md): "dft" timing in several fresh processes, then the
# dft / fft GPU tests (the pytest part of scripts/gpu_suite.sh: 6 shards, -m gpu,
# -k "dft or fft"; without its compile-everything warm-up, for time).  Output in $OUT.
#   bash notes/dft7c_gpu.sh [seconds for the whole script, default 140]
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUPY_TF32=0
OUT="${OUT:-out}"; mkdir -p "$OUT"
budget="${1:-140}"
t0=$(date +%s)
left() { echo $(( budget - ($(date +%s) - t0) )); }
run_diag() {
    timeout 40 python notes/dft7c_diag.py "$@" 2>&1 | tee -a "$OUT/diag.log" | grep -v "^RESULT" | head -30
    echo "== $1 done at $(( $(date +%s) - t0 )) s"
}
run_diag dft_first --problems big_7x7_s1,big_11x11_s1 --directions forward,backward_data
run_diag cudnn_first --problems big_7x7_s1,big_11x11_s1 --directions forward,backward_data
run_diag bench_like --directions forward,backward_data --profile
run_diag dft_first --directions forward,backward_data
[ "$(left)" -gt 80 ] && run_diag cudnn_first --directions forward
python - "$OUT/diag.log" > "$OUT/table.md" <<'PYEOF'
import json, sys
rows = [json.loads(l[7:]) for l in open(sys.argv[1]) if l.startswith("RESULT ")]
print("| # | mode | problem | direction | dft b2b ms (1st / 2nd) | dft host us | dft GPU ms (queued) | generic path b2b / host us | cuDNN b2b / queued | cuDNN / dft b2b |")
print("|---|---|---|---|---|---|---|---|---|---|")
proc, last = 0, None
for r in rows:
    if r["mode"] != last or (r["problem"], r["direction"]) == ("big_7x7_s1", "forward"):
        proc += 1
    last = r["mode"]
    print(f"| {proc} | {r['mode']} | {r['problem']} | {r['direction']} | {r['b2b_1']:.3f} / {r['b2b_2']:.3f} | "
          f"{r['host_us_1']:.0f} / {r['host_us_2']:.0f} | {r['queued_1']:.3f} | {r['b2b_generic']:.3f} / "
          f"{r['host_us_generic']:.0f} | {r['b2b_cudnn']:.3f} / {r['queued_cudnn']:.3f} | "
          f"{r['b2b_cudnn'] / max(r['b2b_1'], r['b2b_2']):.2f} |")
PYEOF
t=$(( $(left) - 8 ))
echo "== GPU tests (-k 'dft or fft', 6 shards, ${t} s)"
for i in 0 1 2 3 4 5; do
    DNNPRIMS_TEST_SHARD="$i/6" timeout "$t" python -m pytest -q -m gpu tests/ --ignore=tests/test_notebooks.py \
        --tb=short -p no:cacheprovider -k "dft or fft" > "$OUT/gpu_tests.$i.log" 2>&1 &
done
wait
cat "$OUT"/gpu_tests.*.log > "$OUT/gpu_tests.log"
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -20
for i in 0 1 2 3 4 5; do echo "shard $i: $(tail -n 1 "$OUT/gpu_tests.$i.log" | cut -c1-150)"; done
echo "progress dots (passed): $(grep -E '^[.sFE]+ *(\[|$)' "$OUT/gpu_tests.log" | tr -cd '.' | wc -c), F: $(grep -E '^[.sFE]+ *(\[|$)' "$OUT/gpu_tests.log" | tr -cd 'F' | wc -c), E: $(grep -E '^[.sFE]+ *(\[|$)' "$OUT/gpu_tests.log" | tr -cd 'E' | wc -c)"
cat "$OUT/table.md"
