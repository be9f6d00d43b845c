#!/usr/bin/env bash
# helper rownorm's GPU call (notes/rownorm.md): layer / RMS norm forward and backward
# through persistent kernels whose threads keep their own vectors of the next rows in
# flight (cp.async into their own shared-memory slots): norm_rows_forward_pipelined,
# norm_rows_backward_fused_pipelined (+ the finish with 32 split lanes).  Applies
# notes/wip/rownorm.patch on a copy of main (the unpatched dnnprims/ + kernels/ are the
# A/B's "old"), warms the row-normalization family and the old tree's kernels the A/B
# runs, runs the layer / RMS GPU tests (both switches on and off, grid capped so a
# block walks its ring many times) in 4 shards, then notes/rownorm_ab.py (old vs new
# vs PyTorch on ln_65536x1024, rms_65536x1024, gn_64x256x56x56_g32 forward and
# backward, and fp16 layer norm forward and backward).  Expected ~90 s on a warm H100
# (warm ~25 s, tests ~25 s, A/B ~35 s).
#   bash notes/rownorm_gpu.sh      (from the repository root of a copy of main)
cd "$(dirname "$0")/.."
export PATCH=notes/wip/rownorm.patch
export MARK=norm_rows_backward_fused_pipelined MARK_FILE=kernels/row_normalization.cu
export WARM="row_normalization.cu"
export OLD_WARM="row_normalization.cu:norm_rows_forward row_normalization.cu:norm_rows_backward_fused \
row_normalization.cu:norm_param_grads_finish_wide row_normalization.cu:gn_rows_forward_pipelined \
row_normalization.cu:gn_rows_backward_cluster row_normalization.cu:norm_param_grads_finish"
export TESTS="tests/test_row_normalization.py"
export K="layer or rms or fused or vector_paths or non_contiguous or zero_output"
export AB=notes/rownorm_ab.py TEST_S=35 AB_S=50
exec bash notes/ab/patch_ab.sh
