"""The main job (python -m dnnprims) on the NumPy path: its first line says where it
runs, it exits 0 when every check passes and 1 when one fails, and it refuses bad
options before any work."""
import numpy as np
import pytest

import dnnprims as dp
from dnnprims.__main__ import main


def test_cpu_run_passes_and_says_where_it_runs(capsys):
    assert main(["--device", "cpu", "--batch", "2", "--repeat", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "NO GPU" in lines[0] and "running on NumPy" in lines[0]
    assert lines[-1].endswith("checks passed") and "FAILED" not in lines[-1]


def test_a_wrong_result_fails_the_run(monkeypatch, capsys):
    relu = dp.activation
    wrong = lambda x, mode, **k: relu(x, mode, **k) * (1.01 if x.dtype == np.float32 else 1)  # noqa: E731
    monkeypatch.setattr(dp, "activation", wrong)
    assert main(["--device", "cpu", "--batch", "2", "--repeat", "1"]) == 1
    assert "FAILED: activation relu forward" in capsys.readouterr().out


def test_a_stage_that_raises_fails_the_run(monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("broken kernel")
    monkeypatch.setattr(dp, "lstm_cell", broken)
    assert main(["--device", "cpu", "--batch", "2", "--repeat", "1"]) == 1
    out = capsys.readouterr().out
    assert "stopped: lstm_cell forward: RuntimeError: broken kernel" in out and "FAILED: lstm_cell" in out


@pytest.mark.parametrize("repeat", ["0", "-1"])
def test_repeat_below_one_is_refused(repeat, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--device", "cpu", "--batch", "2", "--repeat", repeat])
    assert exc.value.code == 2 and "--repeat" in capsys.readouterr().err
