#!/usr/bin/env bash
# helper mpnhwc's GPU script (notes/mpnhwc.md): NHWC float32 max-pool 3x3 / 2 / 1 backward
# walking DOWN the image one window row a step (pool_nhwc_k3s2_backward_walk: a warp = 8
# window columns x 4 channel vectors, the right neighbour's window by shuffles; 64
# registers, 4 blocks an SM) against main's pool_nhwc_k3s2_backward_shfl.
# notes/ab/patch_ab.sh with these settings: applies notes/wip/mpnhwc.patch, warms the
# pooling groups the tests and the A/B run (both trees), runs the GPU tests in 4 shards
# (every S / MINB / PF + one-block grids, edge sizes, column groups, segment seams, ties /
# NaN / +-inf exactly, dx bitwise the shfl kernel's, the switches keying the calls; the
# shfl tests pinned to the shfl kernel; since call 5's r50 fault -- an idle slot's x read
# past x's end, fixed: notes/mpnhwc.md "Out-of-bounds fix" -- the r50 class [2,H,W,64],
# H = W = 111 / 112 / 113, every A/B variant, x and dy at the end of their allocations: 27
# GPU tests), then notes/mpnhwc_ab.py (old vs new variants vs PyTorch, one process).
# Expected ~95-105 s on a warm H100 (warm ~30-40; tests <= 40; A/B <= 30).
#   bash notes/mpnhwc_gpu.sh     (from the root of a copy of main)
cd "$(dirname "$0")/.." || exit 1
export PATCH=notes/wip/mpnhwc.patch
export MARK=NHWC_WALK_BACKWARD MARK_FILE=dnnprims/pooling.py
export WARM="pooling.cu:pool_nhwc_k3s2_backward_walk pooling.cu:pool_nhwc_k3s2_backward_shfl
pooling.cu:pool_nhwc_k3s2_backward pooling.cu:pool_nhwc_k3s2_forward pooling.cu:pool_k3s2_backward_walk
pooling.cu:pool_k3s2_forward"
export OLD_WARM="pooling.cu:pool_nhwc_k3s2_backward_shfl pooling.cu:pool_k3s2_backward_walk"
export TESTS="tests/test_pooling.py"
export K="nhwc_walk or nhwc_k3s2_backward_walk or shfl_variants or (walk_switches and NHWC)"
export AB=notes/mpnhwc_ab.py
export TEST_S=40 AB_S=40
exec bash notes/ab/patch_ab.sh
