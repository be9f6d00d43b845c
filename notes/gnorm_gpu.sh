#!/usr/bin/env bash
# helper gnorm's GPU script (notes/gnorm.md): group / instance norm forward as a
# thread-block cluster per row (gn_rows_forward_cluster, switch
# row_normalization.CLUSTER_FORWARD).  Applies notes/wip/gnorm.patch on a copy of
# main (the unpatched dnnprims/ + kernels/ are the A/B's "old"), warms the
# row-normalization family (new) and the old tree's kernel groups the A/B runs, runs
# the group / instance norm forward GPU tests (cluster on and off, forced cluster
# sizes 1-8, odd sizes, misaligned fallbacks, the hypothesis shapes) in 4 shards,
# then notes/gnorm_ab.py (old vs new variants vs PyTorch: 64x256x56x56 / 32 fp32,
# fp16, bf16 forward + backward, 32x640x40x40 / 32, instance norm, layer norm control).
# Expected ~90-105 s on a warm H100 (warm ~35 s, tests <= 30 s, A/B ~25 s, cap 40 s).
#   bash notes/gnorm_gpu.sh      (from the repository root of a copy of main)
cd "$(dirname "$0")/.."
export PATCH=notes/wip/gnorm.patch
export MARK=gn_rows_forward_cluster MARK_FILE=kernels/row_normalization.cu
export WARM="row_normalization.cu"
export OLD_WARM="row_normalization.cu:gn_rows_forward_pipelined row_normalization.cu:norm_rows_forward \
row_normalization.cu:gn_rows_backward_cluster row_normalization.cu:norm_param_grads_finish"
export TESTS="tests/test_row_normalization.py"
export K="cluster_forward or group_norm_pipelined_forward or group_and_instance or instance_norm or group_norm_hypothesis or vector_paths"
export AB=notes/gnorm_ab.py TEST_S=30 AB_S=40
exec bash notes/ab/patch_ab.sh
