#!/usr/bin/env bash
# The lead's device call: GPU tests on main, partial re-tunes, main job, overhead, benches,
# A/B scripts (ab:) and helper GPU scripts (sh:, each in a copy of the tree); logs tarred
# into $OUT (few files come back), summary last.
#   bash notes/lead_call.sh [tests] [tune] [tunesk] [main] [overhead] [bench:SUITE] [ab:SCRIPT.py] [sh:SCRIPT.sh] ...
set -u
cd "$(dirname "$0")/.."
L=/tmp/lead_logs; rm -rf "$L"; mkdir -p "$L"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$L/steps.txt"; }
for step in "$@"; do
    case "$step" in
        tests) OUT=$L timeout 260 bash scripts/gpu_suite.sh tests > "$L/tests.txt" 2>&1; stamp "tests rc $?" ;;
        tune) OUT=$L timeout $(( ${TUNE_S:-80} + 60 )) bash scripts/gpu_suite.sh tune --filters 5 7 --update --max-seconds ${TUNE_S:-80} > "$L/tune.txt" 2>&1
              stamp "tune rc $?"; cp "$L/conv_table.json" "$OUT/conv_table.json" 2>/dev/null ;;
        tunesk) OUT=$L timeout 480 bash scripts/gpu_suite.sh tune --filters 1 3 --directions forward backward_data --update --max-seconds 420 > "$L/tune.txt" 2>&1
              stamp "tune (1x1/3x3 forward + backward data, split-K) rc $?"; cp "$L/conv_table.json" "$OUT/conv_table.json" 2>/dev/null ;;
        main) OUT=$L timeout 60 bash scripts/gpu_suite.sh main > "$L/main.txt" 2>&1; stamp "main rc $?" ;;
        overhead) OUT=$L timeout 90 bash scripts/gpu_suite.sh overhead > "$L/overhead.txt" 2>&1; stamp "overhead rc $?" ;;
        ab:*) f=${step#ab:}; n=$(basename "$f" .py); PYTHONPATH=$PWD PYTHONUNBUFFERED=1 timeout 200 python "$f" > "$L/ab_$n.txt" 2>&1; stamp "ab $n rc $?" ;;
        sh:*) f=${step#sh:}; n=$(basename "$f" .sh); rm -rf /tmp/shcopy; cp -r . /tmp/shcopy; (cd /tmp/shcopy && OUT=$L/$n timeout ${SH_S:-260} bash "$f" > "$L/sh_$n.txt" 2>&1); stamp "sh $n rc $?" ;;
        bench:*) s=${step#bench:}; left=$(( ${DEADLINE_S:-100000} - ($(date +%s) - T0) )); [ "$left" -gt 260 ] && left=260; [ "$left" -lt 20 ] && { stamp "bench $s skipped (deadline)"; continue; }
                 OUT=$L/bench_$s timeout $left bash scripts/gpu_suite.sh bench $s > "$L/bench_$s.txt" 2>&1; stamp "bench $s rc $?" ;;
    esac
done
tar czf "$OUT/lead_logs.tgz" -C /tmp lead_logs
echo "===== SUMMARY"
cat "$L/steps.txt"
for f in "$L"/tests.txt "$L"/tune.txt "$L"/main.txt; do [ -f "$f" ] && { echo "--- $f"; grep -E "^(FAILED|ERROR)" "$f" | head -20; tail -n 8 "$f"; }; done
[ -f "$L/overhead.txt" ] && { echo "--- overhead"; tail -n 20 "$L/overhead.txt"; }
for f in "$L"/ab_*.txt "$L"/sh_*.txt; do [ -f "$f" ] && { echo "--- $f"; tail -n 60 "$f"; }; done
for f in "$L"/bench_*.txt; do [ -f "$f" ] && { echo "--- $f"; grep -A 40 "benchmark summary" "$f" | head -60; }; done
