#!/usr/bin/env bash
# The test suite: set up (once), then pytest (CPU tests, NVRTC compile tests,
# the notebooks; GPU tests run where a GPU is present and skip elsewhere).
#   bash scripts/test.sh [pytest arguments...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
exec .venv/bin/python -m pytest -q "$@"
