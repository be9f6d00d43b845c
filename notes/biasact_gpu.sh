#!/usr/bin/env bash
# helper biasact's GPU call (notes/biasact.md): fused bias + activation backward
# (NCHW bias_activation_backward_plane_packs, NHWC bias_activation_backward_rows_sweep)
# and the 16-bit activation forward (per-mode packs a thread, gelu_one_exp).  Applies
# notes/wip/biasact.patch to a copy of main, warms the activation family (new) and the
# old tree's groups the A/B runs, the activation GPU tests in 4 shards, then
# notes/biasact_ab.py (old vs new vs PyTorch, one process).  ~100 s on a warm H100.
#   bash notes/biasact_gpu.sh      (from the repository root of a copy of main)
cd "$(dirname "$0")/.." || exit 1
export PATCH=notes/wip/biasact.patch
export MARK=bias_activation_backward_rows_sweep
export MARK_FILE=kernels/activation.cu
export WARM="activation.cu"
export OLD_WARM="activation.cu:activation_forward activation.cu:bias_activation_backward_planes activation.cu:bias_activation_backward_rows_packed activation.cu:bias_grad_reduce"
export TESTS=tests/test_activation.py
export K="bias_activation or every_16bit or switches or forward_and_backward or misaligned or packs_per_thread"
export AB=notes/biasact_ab.py
export TEST_S=${TEST_S:-40}
export AB_S=${AB_S:-45}
exec bash notes/ab/patch_ab.sh
