#!/usr/bin/env bash
# helper chsoft3x's GPU call (notes/chsoft3x.md): the float32 channel softmax forward split
# over a thread-block cluster (notes/wip/chsoft3x.patch, softmax_forward_channels_cluster,
# softmaxes.CHANNEL_CLUSTER) -- the softmax GPU tests of the new kernel (every declared
# (CL, TW, MINB, ONE) and off, packs and scalar variants, odd sizes, special values,
# misaligned views, FLOAT_FORWARD on / off; plus the default paths: reference cases and
# hypothesis; 230 tests), then notes/chsoft3x_ab.py: old vs off / cl2 / cl4 / cl8 / cl2one /
# cl4one vs PyTorch, fp32 softmax / log_softmax forward on 64x256x56x56, 64x192x28x28 and
# 32x256x29x31.
# ~75-95 s on a warm H100 (warm ~25-35 s: the softmax family new (the cluster group, 28
# specs, the longest), the floats + tile forward old; tests ~15-25 s; A/B ~25 s); limits
# 70 + 40 + 40 s (worst case 150 s: the warm or a shard cut by its limit shows in the logs).
#   bash notes/chsoft3x_gpu.sh        (from the root of a copy of main)
cd "$(dirname "$0")/.."
export PATCH=notes/wip/chsoft3x.patch
export MARK=softmax_forward_channels_cluster MARK_FILE=kernels/softmax.cu
export WARM="softmax.cu"
export OLD_WARM="softmax.cu:softmax_forward_channels_floats softmax.cu:softmax_forward_channels"
export TESTS=tests/test_softmax.py
export K="cluster or float_forward or misaligned or hypothesis or forward_and_backward_against_reference"
export AB=notes/chsoft3x_ab.py
export TEST_S=40 AB_S=40
exec bash notes/ab/patch_ab.sh
