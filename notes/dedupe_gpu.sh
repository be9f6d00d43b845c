#!/usr/bin/env bash
# Session 10's last GPU call, part 2: GPU tests of the families helper dedupe folded
# (this tree: activation, softmax, row norms), then the batch-norm folds
# (notes/wip/dedupe_batchnorm.patch) in a copy of the tree with the batch-norm tests.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT/folded" "$OUT/batchnorm"
GPU_TEST_SHARDS=8 OUT=$OUT/folded timeout 170 bash scripts/gpu_suite.sh tests tests/test_activation.py \
    tests/test_softmax.py tests/test_row_normalization.py > "$OUT/folded.txt" 2>&1
echo "folded families: $(grep -E '^GPU tests:' "$OUT/folded.txt" | tail -n 1)"
grep -E "^FAILED" "$OUT"/folded/gpu_tests.*.log 2>/dev/null | head -n 10
copy=$(mktemp -d)/tree
mkdir -p "$copy" && cp -r dnnprims kernels tests scripts pyproject.toml "$copy"/
(cd "$copy" && patch -p1 -F0 < "$OLDPWD/notes/wip/dedupe_batchnorm.patch" > /dev/null) || { echo "dedupe_batchnorm.patch did not apply"; exit 1; }
(cd "$copy" && GPU_TEST_SHARDS=8 OUT=$OUT/batchnorm timeout 170 bash scripts/gpu_suite.sh tests tests/test_normalization.py \
    tests/test_fast_path.py) > "$OUT/batchnorm.txt" 2>&1
echo "batch norm with the folds: $(grep -E '^GPU tests:' "$OUT/batchnorm.txt" | tail -n 1)"
grep -E "^FAILED" "$OUT"/batchnorm/gpu_tests.*.log 2>/dev/null | head -n 10
