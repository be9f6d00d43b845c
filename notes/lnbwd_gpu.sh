#!/usr/bin/env bash
# helper lnbwd's GPU script (notes/lnbwd.md): layer / RMS norm backward, the fused pipelined
# kernel's grid and finish (switches row_normalization.LAYER_BACKWARD_EVEN_FILL: the grid
# with equal rows a block, 1024 x 64 rows for 65536 instead of 1056 x 62-63;
# LAYER_BACKWARD_FINISH_LANES: 128 split lanes x 8 columns a block in the new
# norm_param_grads_finish_narrow, 128 SMs for 1024 columns instead of finish_wide's 32).
# Applies notes/wip/lnbwd.patch on a copy of main (the unpatched dnnprims/ + kernels/ are
# the A/B's "old"), warms the row-norm kernel groups the tests and the A/B use (new tree)
# and the old tree's backward groups (the A/B takes its statistics from CuPy: no old
# forward kernels), runs the layer / RMS backward GPU tests (pipelined with the new grid and
# the 128- and 64-lane finishes, pipelined with both off, fused, separate; every dtype; rows
# of 1 to 40000 values, 3000 and 37 rows, misaligned; the reference-match test) and the CPU
# launch / grid tests in 4 shards, then notes/lnbwd_ab.py (old vs variants vs PyTorch: ln /
# rms 65536x1024 fp32 and fp16, ln 4096x1000, ln 8192x4097 (control), group norm
# 64x256x56x56 / 32 (control)).
# Expected ~75-95 s on a warm H100 (warm ~20-30 s, tests <= 25 s, A/B ~30 s, cap 40 s).
#   bash notes/lnbwd_gpu.sh      (from the repository root of a copy of main)
cd "$(dirname "$0")/.."
export PATCH=notes/wip/lnbwd.patch
export MARK=norm_param_grads_finish_narrow MARK_FILE=kernels/row_normalization.cu
B="norm_rows_backward_fused_pipelined norm_param_grads_finish_wide norm_rows_backward norm_param_grads_columns \
norm_param_grads_finish gn_rows_backward_pipelined"
export WARM="$(for k in $B norm_param_grads_finish_narrow norm_rows_backward_fused norm_rows_forward \
norm_rows_forward_regs norm_rows_forward_pipelined; do printf 'row_normalization.cu:%s ' "$k"; done)"
export OLD_WARM="$(for k in $B; do printf 'row_normalization.cu:%s ' "$k"; done)"
export TESTS="tests/test_row_normalization.py"
export K="fused_backward or layer_and_rms_norm_match_reference or even_grid or finish_lanes or finish_wide_launch \
or pipelined_layer_norm_launches"
export AB=notes/lnbwd_ab.py TEST_S=25 AB_S=40
exec bash notes/ab/patch_ab.sh
