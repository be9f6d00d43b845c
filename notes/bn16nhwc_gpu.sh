#!/usr/bin/env bash
# helper bn16nhwc's GPU script (notes/bn16nhwc.md): channel-last 16-bit batch norm on the
# resident rows kernels with one count a thread (training forward: 1 IEEE division a
# batch instead of 16) and 16-bit rows as 32-bit words (both directions: no PRMT byte
# moves), both bitwise the old results.  notes/ab/patch_ab.sh with these settings:
# applies notes/wip/bn16nhwc.patch, warms the batch-norm kernel groups the tests and the
# A/B run (new tree: resident + fused rows kernels, the recompute's statistics; old
# tree: its resident kernels), runs the bitwise GPU tests in 4 shards, then
# notes/bn16nhwc_ab.py (old vs new variants vs PyTorch, one process; fp16, bf16, fp32).
# Expected ~85 s on a warm H100 (warm ~25: the train_resident group of 60
# specialisations bounds it; tests <= 30; A/B <= 35).
#   bash notes/bn16nhwc_gpu.sh     (from the root of a copy of main)
cd "$(dirname "$0")/.." || exit 1
export PATCH=notes/wip/bn16nhwc.patch
export MARK=ROWS_16BIT_WORDS MARK_FILE=dnnprims/normalization.py
export WARM="batchnorm.cu:batchnorm_rows_train_resident batchnorm.cu:batchnorm_rows_backward_resident
batchnorm.cu:batchnorm_rows_train_fused batchnorm.cu:batchnorm_rows_backward_fused
batchnorm.cu:batchnorm_rows_statistics batchnorm.cu:batchnorm_rows_merge_statistics"
export OLD_WARM="batchnorm.cu:batchnorm_rows_train_resident batchnorm.cu:batchnorm_rows_backward_resident"
export TESTS="tests/test_normalization.py"
export K="resident_flags_are_bitwise or (resident_kernels_equal and (float16 or bfloat16))"
export AB=notes/bn16nhwc_ab.py
export TEST_S=30 AB_S=35
exec bash notes/ab/patch_ab.sh
