#!/usr/bin/env bash
# helper lnodd's GPU script (notes/lnodd.md): layer / RMS norm forward on rows that are not
# 16-byte vectors (8192 x 4097, 4096 x 1001, misaligned views) through the new
# norm_rows_forward_odd (switch row_normalization.LAYER_FORWARD_ODD), and the backward of
# such rows longer than 2048 values through norm_rows_backward_odd (LAYER_BACKWARD_ODD).
# Applies notes/wip/lnodd.patch on a copy of main (the unpatched dnnprims/ + kernels/ are the
# A/B's "old"), warms the row-norm kernel groups the tests and the A/B use (new tree) and the
# old tree's forward / unfused backward groups; runs the GPU tests (each new path on and off:
# every dtype, rows of 1, 3, 7, 13, 1000, 1001, 2049, 3000, 4097, 5001, 9001, 20000 values,
# misaligned views; the register- and pipelined-forward tests, whose 4097 / 3 / misaligned rows
# (layer, RMS and one-group group norm) now take the
# new kernel) in 4 shards, then notes/lnodd_ab.py (old vs new vs PyTorch: forward ln / rms
# 8192x4097 fp32 and fp16, 4096x1001 fp32, 65536x1024 fp32 as the untouched control; backward
# ln / rms 8192x4097 fp32, ln fp16).
# Expected ~75-90 s on a warm H100 (warm ~25-30 s, tests <= 25 s, A/B ~30 s, cap 45 s).
#   bash notes/lnodd_gpu.sh      (from the repository root of a copy of main)
cd "$(dirname "$0")/.."
export PATCH=notes/wip/lnodd.patch
export MARK=norm_rows_forward_odd MARK_FILE=kernels/row_normalization.cu
B="norm_rows_forward norm_rows_forward_regs norm_rows_backward norm_param_grads_columns norm_param_grads_finish"
export WARM="$(for k in $B norm_rows_forward_odd norm_rows_backward_odd norm_rows_forward_pipelined \
norm_rows_backward_fused norm_rows_backward_fused_pipelined norm_param_grads_finish_wide; do
    printf 'row_normalization.cu:%s ' "$k"; done)"
export OLD_WARM="$(for k in $B; do printf 'row_normalization.cu:%s ' "$k"; done)"
export TESTS="tests/test_row_normalization.py"
export K="odd_forward or odd_backward or layer_and_rms_norm_register_forward or layer_and_rms_norm_pipelined_forward"
export AB=notes/lnodd_ab.py TEST_S=35 AB_S=45
exec bash notes/ab/patch_ab.sh
