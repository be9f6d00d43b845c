#!/usr/bin/env bash
# helper chsoft16's GPU call (notes/chsoft16.md): the 16-bit channel softmax forward in
# words (notes/wip/chsoft16.patch) -- old vs new vs PyTorch A/B and the softmax GPU tests
# that exercise the new kernel (every PACKED16_FORWARD setting) and the default paths.
# ~85 s on a warm H100 (warm ~25 s, tests ~25 s, A/B ~30 s); limits 70 + 35 + 45 s.
#   bash notes/chsoft16_gpu.sh        (from the root of a copy of main)
cd "$(dirname "$0")/.."
export PATCH=notes/wip/chsoft16.patch
export MARK=softmax_forward_channels_words MARK_FILE=kernels/softmax.cu
export WARM="softmax.cu"
export OLD_WARM="softmax.cu:softmax_forward_channels_packs softmax.cu:softmax_backward_channels_packs"
export TESTS=tests/test_softmax.py
export K="words or special_values or forward_and_backward_against_reference or minus_infinity"
export AB=notes/chsoft16_ab.py
export TEST_S=35 AB_S=45
exec bash notes/ab/patch_ab.sh
