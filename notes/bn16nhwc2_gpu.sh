#!/usr/bin/env bash
# helper bn16nhwc2's GPU script (notes/bn16nhwc2.md): channel-last 16-bit batch norm on
# batchnorm_rows_{train,backward}_ahead, the resident rows kernels with the next batch's
# loads issued before the current batch is used (two batches in flight a thread: 64 KB an
# SM instead of 32 KB), bitwise the old results.  notes/ab/patch_ab.sh with these
# settings: applies notes/wip/bn16nhwc2.patch, warms the batch-norm kernel groups the
# tests and the A/B run (new tree: ahead + resident + fused rows kernels, the recompute's
# statistics; old tree: its resident kernels), runs the GPU tests in 4 shards (the new
# bitwise AHEAD on / off test, 60 cases; the resident-vs-fused bitwise test in float16 with
# the default switch = AHEAD on, 60 cases), then notes/bn16nhwc2_ab.py (old vs new
# variants vs PyTorch, one process; fp16, bf16, fp32 at 64x56x56x256, fp16 at C = 200).
# Expected ~95-105 s on a warm H100 (warm ~30: the train_resident group of 60
# specialisations, the ahead groups of 8 alongside; tests <= 30; A/B <= 40).
#   bash notes/bn16nhwc2_gpu.sh     (from the root of a copy of main)
cd "$(dirname "$0")/.." || exit 1
export PATCH=notes/wip/bn16nhwc2.patch
export MARK=ROWS_16BIT_AHEAD MARK_FILE=dnnprims/normalization.py
export WARM="batchnorm.cu:batchnorm_rows_train_ahead batchnorm.cu:batchnorm_rows_backward_ahead
batchnorm.cu:batchnorm_rows_train_resident batchnorm.cu:batchnorm_rows_backward_resident
batchnorm.cu:batchnorm_rows_train_fused batchnorm.cu:batchnorm_rows_backward_fused
batchnorm.cu:batchnorm_rows_statistics batchnorm.cu:batchnorm_rows_merge_statistics"
export OLD_WARM="batchnorm.cu:batchnorm_rows_train_resident batchnorm.cu:batchnorm_rows_backward_resident"
export TESTS="tests/test_normalization.py"
export K="resident_ahead_is_bitwise or (resident_kernels_equal and float16 and not bfloat16)"
export AB=notes/bn16nhwc2_ab.py
export TEST_S=30 AB_S=40
exec bash notes/ab/patch_ab.sh
