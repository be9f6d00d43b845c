#!/usr/bin/env bash
# helper smallbn's GPU script (notes/smallbn.md): NCHW batch-norm training forward of
# small L2-resident planes (bn_r50_late) through batchnorm_train_queued -- the strided
# kernel's mapping and arithmetic with Q = 2 (or 4) groups of G channels a block, all
# loads issued first, so that a block's early groups are reduced and stored while its
# later groups' loads are still arriving.  notes/ab/patch_ab.sh with these settings:
# applies notes/wip/smallbn.patch, warms the batch-norm kernel groups the tests and the
# A/B run (new tree: queued + strided + the grouped / fused / two-pass fallbacks of the
# odd shapes; old tree: its strided training kernel), runs the training-path GPU tests
# with the switch off ("strided": STRIDED_QUEUE = 1) and on ("queued2", "queued4"), every
# dtype, odd sizes, in 4 shards, then notes/smallbn_ab.py (old vs new vs variants vs
# PyTorch, one process).  Expected ~100 s on a warm H100 (warm <= 40: the 40-spec groups and
# the 28 queued specs, 4 unrolled groups for Q = 4, bound it; tests <= 40; A/B ~20).
#   bash notes/smallbn_gpu.sh     (from the root of a copy of main)
cd "$(dirname "$0")/.." || exit 1
export PATCH=notes/wip/smallbn.patch
export MARK=STRIDED_QUEUE_MIN_BLOCKS MARK_FILE=dnnprims/normalization.py
export WARM="batchnorm.cu:batchnorm_train_queued batchnorm.cu:batchnorm_train_strided
batchnorm.cu:batchnorm_backward_strided batchnorm.cu:batchnorm_train_grouped batchnorm.cu:batchnorm_backward_grouped
batchnorm.cu:batchnorm_train_fused batchnorm.cu:batchnorm_backward_fused batchnorm.cu:batchnorm_statistics
batchnorm.cu:batchnorm_normalize batchnorm.cu:batchnorm_backward_reduce batchnorm.cu:batchnorm_backward_data"
export OLD_WARM="batchnorm.cu:batchnorm_train_strided"
export TESTS="tests/test_normalization.py"
export K="grouped_training_path and (queued2 or queued4 or strided)"
export AB=notes/smallbn_ab.py
export TEST_S=40 AB_S=35
exec bash notes/ab/patch_ab.sh
