"""scripts/setup.sh's decisions, run for real on a copy of the script with a fake
``python3`` (it logs what it is asked and installs nothing) and a fake ``nvidia-smi``:
which extras it installs for each driver, that a re-run installs nothing, and that a
Python older than 3.10 is refused with a clear message."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FAKE_PYTHON = r"""#!/bin/bash
# Logs its arguments; answers the version check from $FAKE_PYTHON_OLD; -m venv makes a
# venv whose python is this script; pip installs nothing.
echo "$*" >> "$FAKE_LOG"
case "$1" in
    --version) [ -n "$FAKE_PYTHON_OLD" ] && echo "Python 3.9.18" || echo "Python 3.12.1" ;;
    -c) case "$2" in *version_info*) [ -z "$FAKE_PYTHON_OLD" ] ;; *) echo "setup: fake import" ;; esac ;;
    -m) if [ "$2" = venv ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; fi ;;
esac
"""

FAKE_SMI = """#!/bin/bash
[ -n "$FAKE_SMI_FAIL" ] && { echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver" >&2; exit 9; }
echo "| NVIDIA-SMI 580.65.06    Driver Version: 580.65.06    CUDA Version: $FAKE_CUDA     |"
"""


def _tool_dir(tmp_path, smi):
    """A PATH with only what setup.sh uses (so a real nvidia-smi cannot leak in)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "cat", "sed", "head", "mkdir", "cp"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    for name, text in (("python3", FAKE_PYTHON), ("nvidia-smi", FAKE_SMI if smi else None)):
        if text is not None:
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
    return bin_dir


def _setup(tmp_path, smi=True, **env):
    """Run a copy of scripts/setup.sh in a tree of its own; returns (result, pip calls)."""
    tree = tmp_path / "tree"
    if not tree.exists():
        (tree / "scripts").mkdir(parents=True)
        shutil.copy(ROOT / "scripts" / "setup.sh", tree / "scripts" / "setup.sh")
        shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():
        _tool_dir(tmp_path, smi)
    log = tmp_path / "log"
    log.write_text("")
    result = subprocess.run(["bash", str(tree / "scripts" / "setup.sh")], capture_output=True, text=True,
                            env={"PATH": str(bin_dir), "FAKE_LOG": str(log), "HOME": str(tmp_path), **env})
    pip = [line for line in log.read_text().splitlines() if line.startswith("-m pip install") and "-e" in line]
    return result, pip


@pytest.mark.parametrize("smi, env, extras", [
    (False, {}, "test,nvrtc"),                                     # no nvidia-smi
    (True, {"FAKE_SMI_FAIL": "1", "FAKE_CUDA": "13.0"}, "test,nvrtc"),  # nvidia-smi present, no driver
    (True, {"FAKE_CUDA": "12.4"}, "test,cuda12"),
    (True, {"FAKE_CUDA": "13.0"}, "test,nvrtc,cuda13"),
    (True, {"FAKE_CUDA": "11.8"}, "test,nvrtc"),                   # CUDA 11: the CPU set, with a warning
], ids=["no-smi", "smi-fails", "cuda12", "cuda13", "cuda11"])
def test_setup_picks_the_extras_for_the_driver(tmp_path, smi, env, extras):
    result, pip = _setup(tmp_path, smi, **env)
    assert result.returncode == 0, result.stderr
    assert pip == [f"-m pip install --quiet -e .[{extras}]"], (pip, result.stdout, result.stderr)
    assert ("needs CUDA 12 or newer" in result.stderr) == (env.get("FAKE_CUDA") == "11.8"), result.stderr


def test_setup_rerun_installs_nothing(tmp_path):
    first, pip = _setup(tmp_path, FAKE_CUDA="13.0")
    assert first.returncode == 0 and len(pip) == 1, first.stderr
    again, pip = _setup(tmp_path, FAKE_CUDA="13.0")
    assert again.returncode == 0 and pip == [] and again.stdout == "", (again.stdout, again.stderr)
    changed, pip = _setup(tmp_path, FAKE_CUDA="12.2")   # another driver: other extras, reinstall
    assert changed.returncode == 0 and pip == ["-m pip install --quiet -e .[test,cuda12]"], changed.stderr


def test_setup_refuses_python_older_than_3_10(tmp_path):
    result, pip = _setup(tmp_path, smi=False, FAKE_PYTHON_OLD="1")
    assert result.returncode == 1 and pip == []
    assert "needs Python >= 3.10" in result.stderr and "Python 3.9" in result.stderr, result.stderr
    assert not (tmp_path / "tree" / ".venv").exists()


def test_setup_names_a_missing_python_plainly(tmp_path):
    result, pip = _setup(tmp_path, smi=False, PYTHON="python9")
    assert result.returncode == 1 and pip == []
    assert result.stderr.strip() == ("setup: dnnprims needs Python >= 3.10; 'python9' was not found "
                                     "(PYTHON=python3.12 bash scripts/setup.sh to choose)"), result.stderr
