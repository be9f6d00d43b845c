#!/usr/bin/env bash
# helper bn16bwd's GPU script (notes/bn16bwd.md): ROWS_BLOCKS_PER_SM, a cap on the blocks an
# SM of the channel-last resident rows kernels, keyed (direction, itemsize), so the fp16
# backward_narrow (66 registers: 3 blocks an SM, grid 396, cached 4, window 2) can run in
# bf16's shape (2 blocks, grid 264, cached 7, window 3).  notes/ab/patch_ab.sh with these
# settings: applies notes/wip/bn16bwd.patch (dnnprims/normalization.py + tests; NO kernel
# change, so the old tree's kernels are the same source and need no warm of their own),
# warms the narrow + resident rows groups, runs the GPU test test_channel_last_blocks_per_sm
# (30 cases x 6 settings) in 4 shards, then notes/bn16bwd_ab.py (old vs b2 / b2w4 / b2c5 /
# b3w3 vs PyTorch: fp16 + bf16 backward 64x56x56x256, fp16 backward C = 200, fp16 train as a
# control).  Expected ~80-95 s on a warm H100 (warm <= 40: the train_resident group bounds it;
# tests <= 25; A/B <= 35).
#   bash notes/bn16bwd_gpu.sh     (from the root of a copy of main)
cd "$(dirname "$0")/.." || exit 1
export PATCH=notes/wip/bn16bwd.patch
export MARK=ROWS_BLOCKS_PER_SM MARK_FILE=dnnprims/normalization.py
export WARM="batchnorm.cu:batchnorm_rows_train_narrow batchnorm.cu:batchnorm_rows_backward_narrow
batchnorm.cu:batchnorm_rows_train_resident batchnorm.cu:batchnorm_rows_backward_resident"
export OLD_WARM=""
export TESTS="tests/test_normalization.py"
export K="blocks_per_sm"
export AB=notes/bn16bwd_ab.py
export TEST_S=25 AB_S=35
exec bash notes/ab/patch_ab.sh
