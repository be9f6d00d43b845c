#!/usr/bin/env bash
# helper rowbwd's GPU script (notes/rowbwd.md): layer / RMS norm forward with the row in
# registers and one block barrier a row (norm_rows_forward_regs, switches
# row_normalization.LAYER_FORWARD_REGISTERS / LAYER_FORWARD_ROWS).  Applies
# notes/wip/rowbwd.patch on a copy of main (the unpatched dnnprims/ + kernels/ are the A/B's
# "old"), warms the row-norm kernel groups the tests and the A/B use (new tree) and the
# old tree's, runs the layer / RMS forward GPU tests (the new kernel with 1 and 2 rows a
# block and switched off, every dtype, odd rows 12 / 1000 / 5000 / 8192 values, the
# fallbacks: 4097 and 3 values, misaligned, 40000 values; the pipelined-forward test; the
# reference-match test incl. backward) in 4 shards, then notes/rowbwd_ab.py (old vs new
# variants vs PyTorch: ln / rms 65536x1024 fp32 forward + backward (controls), fp16, bf16,
# ln 4096x1000, ln / rms 8192x4097).
# Expected ~85-105 s on a warm H100 (warm ~25-35 s, tests <= 25 s, A/B ~25 s, cap 40 s).
#   bash notes/rowbwd_gpu.sh      (from the repository root of a copy of main)
cd "$(dirname "$0")/.."
export PATCH=notes/wip/rowbwd.patch
export MARK=norm_rows_forward_regs MARK_FILE=kernels/row_normalization.cu
G="norm_rows_forward norm_rows_forward_pipelined norm_rows_backward_fused_pipelined norm_param_grads_finish_wide"
export WARM="$(for k in $G norm_rows_forward_regs norm_rows_backward_fused norm_rows_backward \
norm_param_grads_columns norm_param_grads_finish; do printf 'row_normalization.cu:%s ' "$k"; done)"
export OLD_WARM="$(for k in $G; do printf 'row_normalization.cu:%s ' "$k"; done)"
export TESTS="tests/test_row_normalization.py"
export K="register_forward or layer_and_rms_norm_pipelined_forward or layer_and_rms_norm_match_reference"
export AB=notes/rowbwd_ab.py TEST_S=25 AB_S=40
exec bash notes/ab/patch_ab.sh
