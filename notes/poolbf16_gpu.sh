#!/usr/bin/env bash
# helper poolbf16's GPU call (notes/poolbf16.md): NCHW bfloat16 max 3x3 / 2 / 1 pooling
# backward (pool_k3s2_backward_rolled's SHARES 1 / 2 and per-type settings; SHARES 0 is
# main's code, the same SASS under NVRTC 13.0 and 13.5: notes/poolbf16_sass.py).
# notes/ab/patch_ab.sh: main's dnnprims/ + kernels/ copied aside as "old",
# notes/wip/poolbf16.patch applied (taken back out on exit), the pooling family warmed (the
# old tree's rolled group and the float32 control's in parallel), the rolled / k3s2 /
# reference pooling GPU tests in 4 shards (~12 s), then notes/poolbf16_ab.py (old vs new on
# the four decision rows, ~10 s).  Table last.  About 60 s on a warm H100 (session 10's
# first call of this script: 61 s; warm ~32 s, the rolled group, 48 specs, is the longest).
#   bash notes/poolbf16_gpu.sh        (from the repository root of a copy of main)
cd "$(dirname "$0")/.." || exit 1
export PATCH=notes/wip/poolbf16.patch
export MARK=first_max_shares_pairwise
export MARK_FILE=kernels/pooling.cu
export WARM="pooling.cu"
export OLD_WARM="pooling.cu:pool_k3s2_backward_rolled pooling.cu:pool_k3s2_backward"
export TESTS="tests/test_pooling.py"
export K="rolled or k3s2 or matches_reference or ties or fast_paths or nan_propagates"
export AB=notes/poolbf16_ab.py
export TEST_S=35
export AB_S=30
exec bash notes/ab/patch_ab.sh
