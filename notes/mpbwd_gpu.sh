#!/usr/bin/env bash
# helper mpbwd's GPU script (notes/mpbwd.md): float32 max-pool 3x3 / 2 / 1 backward --
# NCHW walking down the plane one window row a step (pool_k3s2_backward_walk: 56-71
# registers, 3-4 blocks an SM, the next step's loads in flight), NHWC shfl kernel with
# each step's loads one step ahead (PF) and a 2-channel-a-lane variant (VB 8, 3-4 blocks).  notes/ab/patch_ab.sh with these settings:
# applies notes/wip/mpbwd.patch, warms the pooling kernel groups the tests and the A/B
# run (both trees), runs the new GPU tests in 4 shards (every walk S / MINB / PF, a
# one-block grid, odd sizes, ties / NaN / +-inf exactly, dx bitwise the old kernels',
# the switches keying the calls, repeated calls on ties bit-identical), then
# notes/mpbwd_ab.py (old vs new variants vs PyTorch, one process).
# Expected ~100 s on a warm H100 (warm ~35-45: the rolled / k3s2_backward groups bound
# it; tests <= 30; A/B <= 30).
#   bash notes/mpbwd_gpu.sh     (from the root of a copy of main)
cd "$(dirname "$0")/.." || exit 1
export PATCH=notes/wip/mpbwd.patch
export MARK=WALK_BACKWARD MARK_FILE=dnnprims/pooling.py
export WARM="pooling.cu:pool_k3s2_backward_walk pooling.cu:pool_nhwc_k3s2_backward_shfl
pooling.cu:pool_k3s2_backward pooling.cu:pool_k3s2_forward pooling.cu:pool_nhwc_k3s2_forward
pooling.cu:pool_k3s2_backward_rolled"
export OLD_WARM="pooling.cu:pool_k3s2_backward pooling.cu:pool_nhwc_k3s2_backward_shfl
pooling.cu:pool_k3s2_forward pooling.cu:pool_k3s2_backward_rolled"
export TESTS="tests/test_pooling.py"
export K="walk or shfl_prefetch"
export AB=notes/mpbwd_ab.py
export TEST_S=35 AB_S=40
exec bash notes/ab/patch_ab.sh
