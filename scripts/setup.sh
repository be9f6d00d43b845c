#!/usr/bin/env bash
# Set up a development environment from a fresh clone: .venv with the project
# installed editable, the test tools and NVRTC (enough to compile every kernel
# without a GPU).  Where an NVIDIA driver answers, also CuPy for its CUDA major
# version.  Idempotent: a second run with an unchanged pyproject.toml returns
# at once.
#
#   bash scripts/setup.sh            # uses the python3 on PATH (>= 3.10)
#   PYTHON=python3.12 bash scripts/setup.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
VENV="$ROOT/.venv"

if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "setup: dnnprims needs Python >= 3.10; '$PYTHON' was not found (PYTHON=python3.12 bash scripts/setup.sh to choose)" >&2
    exit 1
fi
if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null; then
    echo "setup: dnnprims needs Python >= 3.10; '$PYTHON' is $("$PYTHON" --version 2>&1 || echo missing)" >&2
    exit 1
fi

# Which extras: CPU-only machines get NVRTC alone (compile tests, no GPU);
# a machine whose driver answers gets the CuPy wheel for its CUDA major version.
extras="test,nvrtc"
cuda_major=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    cuda_major="$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\)\..*/\1/p' | head -n 1)"
    case "$cuda_major" in
        12) extras="test,cuda12" ;;
        1[3-9] | [2-9][0-9] | [1-9][0-9][0-9]) extras="test,nvrtc,cuda13" ;;
        "") ;;
        *)  # no CuPy wheel of ours runs on an older driver: the CPU set, and say so
            echo "setup: the driver supports CUDA $cuda_major only; dnnprims' GPU path needs CUDA 12 or newer:" \
                 "installing the CPU set (NumPy path; NVRTC for the compile tests)" >&2
            cuda_major="" ;;
    esac
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv "$VENV"
fi

# Reinstall only when the project's metadata or the chosen extras changed.
stamp="$VENV/.dnnprims-setup"
want="$(cat pyproject.toml; echo "extras=$extras")"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi

echo "setup: installing dnnprims (editable) with extras [$extras]${cuda_major:+ for CUDA $cuda_major}"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -e ".[$extras]"
"$VENV/bin/python" -c 'import dnnprims, numpy; print(f"setup: dnnprims {dnnprims.__version__} with numpy {numpy.__version__} in .venv")'
printf '%s' "$want" > "$stamp"
