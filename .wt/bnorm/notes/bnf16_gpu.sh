#!/usr/bin/env bash
# bnf16's one GPU call (run from the repository root of main's tree; this branch in .wt/bnf16).
set -u
ROOT=$PWD
cd .wt/bnf16
export PYTHONPATH=$PWD CUPY_TF32=0 PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}; mkdir -p $O
t0=$(date +%s)
timeout 36 python scripts/warm_kernels.py 16 > $O/warm.log 2>&1; echo "warm rc=$? $(( $(date +%s) - t0 )) s"
for i in 0 1 2 3; do
  DNNPRIMS_TEST_SHARD=$i/4 timeout 40 python -m pytest -q -m gpu tests/test_normalization.py tests/test_fast_path.py -p no:cacheprovider > $O/t$i.log 2>&1 &
done
wait; echo "tests $(( $(date +%s) - t0 )) s"; for i in 0 1 2 3; do tail -1 $O/t$i.log; done
timeout 12 python notes/bnf16_probe.py bnf16 > $O/probe_bnf16.log 2>&1; echo "probe $(( $(date +%s) - t0 )) s"
timeout 15 python notes/bnf16_probe.py bnf16 big > $O/probe_big.log 2>&1; echo "big $(( $(date +%s) - t0 )) s"
timeout 22 python -m dnnprims.bench memory --only bn_big_f16,bn_big_nhwc,bn_r50_late --json $O/bench.json > $O/bench.log 2>&1
(cd $ROOT && PYTHONPATH=$ROOT timeout 12 python .wt/bnf16/notes/bnf16_probe.py main > $O/probe_main.log 2>&1)
timeout 8 python -m dnnprims.bench.overhead --calls 200 > $O/overhead.log 2>&1
echo "total $(( $(date +%s) - t0 )) s"
grep -h "passed\|failed\|rror" $O/t*.log | tail -8
tail -22 $O/bench.log; tail -12 $O/overhead.log; cat $O/probe_big.log
cat $O/probe_main.log $O/probe_bnf16.log | tail -24
