#!/usr/bin/env bash
# helper dedupebn's GPU script (notes/dedupebn.md): the batch-norm folds of
# notes/wip/dedupebn.patch (kernels/batchnorm.cu helpers, the one-launch rows plan builder of
# dnnprims/normalization.py).  Every batch-norm specialisation compiles to byte-identical SASS
# under NVRTC 13.0 (notes/dedupebn.md), so NO timing decides: this checks the refolded
# Python plan builders on the device.  notes/ab/patch_ab.sh with these settings: applies the
# patch, warms the kernel groups the channel-last / cooperative tests run (new tree) and the
# old tree's one-launch rows kernels (the control), runs the channel-last, cooperative-launch
# and NHWC reference GPU tests of tests/test_normalization.py (~660 tests) in 4 shards, then
# notes/dedupebn_ab.py (old vs new BITWISE, same kernels / grids / shared bytes in the plans,
# old / new / PyTorch times as a control; fp32 and fp16, resident and fused rows kernels).
# Expected ~90 s on a warm H100 (warm ~35, tests <= 45, control <= 25).
#   bash notes/dedupebn_gpu.sh     (from the root of a copy of main)
cd "$(dirname "$0")/.." || exit 1
export PATCH=notes/wip/dedupebn.patch
export MARK=_rows_one_launch MARK_FILE=dnnprims/normalization.py
export WARM="batchnorm.cu:batchnorm_rows_train_resident batchnorm.cu:batchnorm_rows_backward_resident
batchnorm.cu:batchnorm_rows_train_fused batchnorm.cu:batchnorm_rows_backward_fused
batchnorm.cu:batchnorm_rows_statistics batchnorm.cu:batchnorm_rows_merge_statistics
batchnorm.cu:batchnorm_rows_normalize batchnorm.cu:batchnorm_rows_backward_reduce
batchnorm.cu:batchnorm_rows_backward_merge batchnorm.cu:batchnorm_rows_backward_data
batchnorm.cu:batchnorm_infer_rows_packs batchnorm.cu:batchnorm_train_fused batchnorm.cu:batchnorm_backward_fused
batchnorm.cu:batchnorm_statistics batchnorm.cu:batchnorm_normalize batchnorm.cu:batchnorm_backward_reduce
batchnorm.cu:batchnorm_backward_data"
export OLD_WARM="batchnorm.cu:batchnorm_rows_train_resident batchnorm.cu:batchnorm_rows_backward_resident
batchnorm.cu:batchnorm_rows_train_fused batchnorm.cu:batchnorm_rows_backward_fused"
export TESTS="tests/test_normalization.py"
export K="channel_last or cooperative or (matches_reference and NHWC)"
export AB=notes/dedupebn_ab.py
export TEST_S=45 AB_S=30
exec bash notes/ab/patch_ab.sh
