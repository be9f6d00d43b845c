#!/usr/bin/env bash
# helper bnnhwc's GPU call (notes/bnnhwc.md): channel-last batch-norm training forward and
# backward on batchnorm_rows_{train,backward}_resident (more rows on chip, L2 hints).
# notes/ab/patch_ab.sh with these settings: applies notes/wip/bnnhwc.patch, warms the
# patched batch-norm family and the old tree's fused rows kernels, runs the channel-last
# GPU tests (the resident path of the channel-last tests, bitwise resident == fused, cooperative
# refusal) in 4 shards, then notes/bnnhwc_ab.py (old vs new variants vs PyTorch, one
# process).  Expected ~100 s on a warm H100 (warm ~40, tests <= 35, A/B <= 30).
#   bash notes/bnnhwc_gpu.sh     (from the root of a copy of main)
cd "$(dirname "$0")/.." || exit 1
export PATCH=notes/wip/bnnhwc.patch
export MARK=batchnorm_rows_train_resident MARK_FILE=kernels/batchnorm.cu
export WARM="batchnorm.cu"
export OLD_WARM="batchnorm.cu:batchnorm_rows_train_fused batchnorm.cu:batchnorm_rows_backward_fused"
export TESTS="tests/test_normalization.py"
export K="(channel_last_fused_paths and resident) or channel_last_resident or channel_last_plans or cooperatively or refused_cooperative"
export AB=notes/bnnhwc_ab.py
export TEST_S=35 AB_S=40
exec bash notes/ab/patch_ab.sh
