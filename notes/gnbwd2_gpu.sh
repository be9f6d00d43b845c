#!/usr/bin/env bash
# helper gnbwd2's GPU script (notes/gnbwd2.md): group / instance norm backward with
# each cluster block's x and dy in registers (gn_rows_backward_registers, switch
# row_normalization.REGISTER_BACKWARD).  Applies notes/wip/gnbwd2.patch on a copy of
# main (the unpatched dnnprims/ + kernels/ are the A/B's "old"), warms the kernel
# groups the tests and the A/B run (new tree) and the old tree's, runs the new GPU test
# (register kernel: forced cluster sizes 1-8, ITEMS 4 / 8, odd planes, misaligned,
# switch off / tuple / minimum row, wide and serial finish; 36 tests) with the
# shared-memory cluster backward test (it pins the switch off) and the default-path
# group / instance norm tests (121 GPU tests) in 4 shards, then notes/gnbwd2_ab.py (old vs variants vs PyTorch: 64x256x56x56 /
# 32 fp32 fp16 bf16, 32x640x40x40 / 32 fp32 fp16, instance norm, small rows, layer
# norm backward control).  Expected ~85-105 s on a warm H100 (warm ~30-40 s: the new
# 96-specialisation group is the long pole; tests <= 30 s; A/B ~25-30 s, cap 40 s).
#   bash notes/gnbwd2_gpu.sh      (from the repository root of a copy of main)
cd "$(dirname "$0")/.."
export PATCH=notes/wip/gnbwd2.patch
export MARK=gn_rows_backward_registers MARK_FILE=kernels/row_normalization.cu
RN=row_normalization.cu
export WARM="$RN:gn_rows_backward_registers $RN:norm_param_grads_finish_wide $RN:norm_param_grads_finish \
$RN:gn_rows_backward_cluster $RN:gn_rows_forward_cluster $RN:norm_rows_forward $RN:norm_rows_backward \
$RN:gn_rows_backward_pipelined $RN:gn_rows_forward_pipelined $RN:gn_rows_backward $RN:norm_param_grads_planes \
$RN:norm_param_grads_columns $RN:norm_rows_backward_fused_pipelined $RN:norm_rows_backward_fused"
export OLD_WARM="$RN:gn_rows_backward_cluster $RN:norm_param_grads_finish $RN:gn_rows_forward_cluster \
$RN:norm_rows_forward $RN:gn_rows_forward_pipelined $RN:norm_rows_backward_fused_pipelined $RN:norm_param_grads_finish_wide"
export TESTS="tests/test_row_normalization.py"
export K="register_backward or cluster_backward or group_and_instance or group_norm_hypothesis or vector_paths"
export AB=notes/gnbwd2_ab.py TEST_S=35 AB_S=40
exec bash notes/ab/patch_ab.sh
