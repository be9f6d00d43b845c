#!/usr/bin/env bash
# helper chsoftf32's GPU call (notes/chsoftf32.md): the float32 channel softmax forward with
# fewer instructions a value (notes/wip/chsoftf32.patch, softmax_forward_channels_floats,
# softmaxes.FLOAT_FORWARD) -- the softmax GPU tests that exercise the new kernel (every
# FLOAT_FORWARD setting, on and off, float32 odd sizes; the other dtypes unchanged) and the
# default paths, then notes/chsoftf32_ab.py: old vs new (+ new4, newExpf, newCs) vs PyTorch,
# fp32 softmax / log_softmax forward on 64x256x56x56 and 64x192x28x28.
# ~90 s on a warm H100 (warm ~30 s: the whole softmax family new, the packs forward old;
# tests ~30 s; A/B ~25 s); limits 70 + 40 + 45 s.
#   bash notes/chsoftf32_gpu.sh        (from the root of a copy of main)
cd "$(dirname "$0")/.."
export PATCH=notes/wip/chsoftf32.patch
export MARK=softmax_forward_channels_floats MARK_FILE=kernels/softmax.cu
export WARM="softmax.cu"
export OLD_WARM="softmax.cu:softmax_forward_channels_packs"
export TESTS=tests/test_softmax.py
export K="floats or float_forward or forward_and_backward_against_reference or special_values or minus_infinity or misaligned or hypothesis"
export AB=notes/chsoftf32_ab.py
export TEST_S=40 AB_S=45
exec bash notes/ab/patch_ab.sh
