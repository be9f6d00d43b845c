#!/usr/bin/env bash
# Session 6's last device call: the GPU tests touched after the full run (dft tolerance
# attribution fix; Winograd full-graph path on by default) and the conv overhead rows.
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD CUPY_TF32=0 PYTHONUNBUFFERED=1
L=/tmp/fc; mkdir -p $L
timeout 70 python3 scripts/warm_kernels.py 16 > $L/warm.log 2>&1; echo "warm rc $?"
for i in 0 1 2 3 4 5; do
  DNNPRIMS_TEST_SHARD="$i/6" timeout 120 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider \
    tests/test_conv_winograd.py tests/test_fast_path.py tests/test_cublas.py tests/test_conv_dft.py \
    tests/test_conv_polyphase.py > $L/t.$i.log 2>&1 &
done; wait
grep -hE "^(FAILED|ERROR)" $L/t.*.log | head -20
for i in 0 1 2 3 4 5; do tail -n 1 $L/t.$i.log; done
timeout 60 python3 -m dnnprims.bench.overhead --only conv2d --no-pieces 2>&1 | tail -8
tar czf $OUT/fc.tgz -C /tmp fc
