"""Every notebook in notebooks/ runs top to bottom without a cell error.

Notebooks run on the NumPy path here (a notebook that needs a GPU must guard
itself).  The kernel is this interpreter (a temporary kernelspec pointing at
sys.executable), so the notebook sees the same installed dnnprims."""
import json
import pathlib
import sys

import ipykernel  # noqa: F401  (the test extra installs nbformat, nbclient, ipykernel)
import nbclient
import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_notebooks_exist():
    assert NOTEBOOKS, "notebooks/ holds no notebook"
    names = {p.name for p in NOTEBOOKS}
    assert {"01_quickstart.ipynb", "02_convolution_algorithms.ipynb"} <= names


@pytest.fixture
def this_python_kernel(tmp_path, monkeypatch):
    """A 'python3' kernelspec for sys.executable, found before any system-wide one."""
    spec_dir = tmp_path / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (dnnprims tests)", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    return "python3"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, this_python_kernel):
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name=this_python_kernel, timeout=300,
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    errors = [out for cell in nb.cells if cell.cell_type == "code"
              for out in cell.get("outputs", []) if out.get("output_type") == "error"]
    assert not errors, f"{path.name}: {errors[0]['ename']}: {errors[0]['evalue']}"
