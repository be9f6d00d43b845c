#!/usr/bin/env bash
# Helper dft7's GPU run (notes/dft7.md).  Run from the tree root on the GPU machine.
#   bash notes/dft7_gpu.sh 1   # GPU tests of tests/test_conv_dft.py, then notes/bench_dft7.py
#   bash notes/dft7_gpu.sh 2   # GPU tests selected by $K (default: tests/test_conv.py -k "dft or fft"),
#                              # then the bench again (shipped flags + old filter path, stage profile)
# Each part runs under its own timeout; the short table is printed last.
set -u
export PYTHONPATH=$PWD CUPY_TF32=0 PYTHONUNBUFFERED=1
O=${OUT:-out}
mkdir -p "$O"
part=${1:-1}
nvidia-smi -L 2>/dev/null
if [ "$part" = 1 ]; then
    timeout ${T_TESTS:-70} python -m pytest -q -m gpu tests/test_conv_dft.py -k "dft or fft" -p no:cacheprovider \
        --tb=short -rf 2>&1 | tee "$O/t_dft.log" | tail -25
    timeout ${T_BENCH:-62} python notes/bench_dft7.py --repeat 30 --json "$O/bench.json" --table "$O/table.md" \
        2>&1 | tee "$O/bench.log" | grep -v '^{' | tail -80
    tlog="$O/t_dft.log"
else
    timeout ${T_TESTS:-45} python -m pytest -q -m gpu ${FILES:-tests/test_conv.py} -k "${K:-dft or fft}" -p no:cacheprovider \
        --tb=short -rf 2>&1 | tee "$O/t_conv.log" | tail -15
    timeout ${T_BENCH:-20} python notes/bench_dft7.py --repeat 30 --shipped-only --json "$O/bench2.json" \
        --table "$O/table.md" 2>&1 | tee "$O/bench2.log" | grep -v '^{' | tail -30
    tlog="$O/t_conv.log"
fi
echo "== summary (part $part)"
grep -E "passed|failed|error" "$tlog" | tail -1 || echo "tests: no summary (timed out?)"
cat "$O/table.md" 2>/dev/null || echo "bench: no table (timed out?)"
