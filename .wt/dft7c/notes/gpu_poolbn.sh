# GPU check + timing for mem_poolbn (run from the worktree root on the device machine).
export PYTHONPATH=$PWD CUPY_TF32=0 PYTHONUNBUFFERED=1
nvidia-smi -L
timeout 85 python3 -m pytest -q -m gpu tests/test_pooling.py tests/test_normalization.py --maxfail=15 --tb=short -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/tests.log | tail -20
timeout 30 python3 -m pytest -q -m gpu tests/test_large_tensors.py tests/test_against_torch.py -k "pool or batchnorm" --maxfail=5 --tb=short -p no:cacheprovider > $OUT/tests2.log 2>&1
echo "tests2 rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/tests2.log | tail -8
timeout 75 python3 notes/bench_poolbn.py $OUT/bench.json > $OUT/bench.log 2>&1
echo "bench rc=$?"; grep -v "^  kind=" $OUT/bench.log | tail -40 ; grep "^  kind=" $OUT/bench.log | tail -3
