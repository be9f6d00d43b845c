#!/usr/bin/env bash
# helper bn16nhwc3's GPU script (notes/bn16nhwc3.md): channel-last 16-bit batch norm on
# two switchable paths -- ROWS_16BIT_NARROW (batchnorm_rows_{train,backward}_narrow: the
# resident kernels at 4 channels a thread, float32's lanes / batches / merge) and
# ROWS_16BIT_LAUNCHES (the three-launch path, PyTorch's shape).  notes/ab/patch_ab.sh with
# these settings: applies notes/wip/bn16nhwc3.patch, warms the batch-norm kernel groups the
# tests and the A/B run (new tree: narrow + resident + fused + the multi-launch rows
# kernels; old tree: its resident kernels), runs the GPU tests in 4 shards (the new
# narrow / launches test, 63 cases x 3 modes; the fused-paths test's narrow and
# launches16 paths in float16, 42 cases), then notes/bn16nhwc3_ab.py (old vs narrow vs
# launches vs PyTorch in one process: fp16, bf16, fp32 control at 64x56x56x256, fp16 at
# C = 200).  Expected ~95-110 s on a warm H100 (warm ~40: the train_resident group of 60
# specialisations bounds it, 12 new + 2 old groups in parallel; tests <= 30; A/B <= 40).
#   bash notes/bn16nhwc3_gpu.sh     (from the root of a copy of main)
cd "$(dirname "$0")/.." || exit 1
export PATCH=notes/wip/bn16nhwc3.patch
export MARK=ROWS_16BIT_NARROW MARK_FILE=dnnprims/normalization.py
export WARM="batchnorm.cu:batchnorm_rows_train_narrow batchnorm.cu:batchnorm_rows_backward_narrow
batchnorm.cu:batchnorm_rows_train_resident batchnorm.cu:batchnorm_rows_backward_resident
batchnorm.cu:batchnorm_rows_train_fused batchnorm.cu:batchnorm_rows_backward_fused
batchnorm.cu:batchnorm_rows_statistics batchnorm.cu:batchnorm_rows_merge_statistics
batchnorm.cu:batchnorm_rows_normalize batchnorm.cu:batchnorm_rows_backward_reduce
batchnorm.cu:batchnorm_rows_backward_merge batchnorm.cu:batchnorm_rows_backward_data"
export OLD_WARM="batchnorm.cu:batchnorm_rows_train_resident batchnorm.cu:batchnorm_rows_backward_resident"
export TESTS="tests/test_normalization.py"
export K="16bit_narrow_and_launches or (fused_paths and (narrow or launches16) and float16 and not bfloat16)"
export AB=notes/bn16nhwc3_ab.py
export TEST_S=30 AB_S=40
exec bash notes/ab/patch_ab.sh
