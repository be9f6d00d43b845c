#!/usr/bin/env bash
# The main job: set up (once), then run a small network forward and backward
# through dnnprims, checked against the float64 NumPy reference.
#   bash scripts/main.sh [--device cpu|gpu|auto] [--batch N]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
exec .venv/bin/python -m dnnprims "$@"
