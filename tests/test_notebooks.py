"""The notebooks in notebooks/ run top to bottom, headless, on their small settings.

Each notebook reads TRTOPT_NOTEBOOK_SMALL=1 (16 calibration photos, 8 held-out photos, a few timing
runs) and TRTOPT_REPO_ROOT (where the models and photos are). It runs from a copy in tmp_path, which is
also the kernel's working directory and temporary folder: the committed notebooks, saved with the
outputs of a full run, are never rewritten, and nothing a notebook writes lands in the checkout. Any
cell error fails the test with the cell and its traceback.

The copy starts with one added cell, `SUITE_SETTINGS`: the kernel is a process of its own, so it gets the settings
tests/conftest.py gives every build in the suite's processes (a CPU INT8 build keeps its INT8 plan and times it
against FP32 in one call of each, not for 2 s nor in 3 rounds after 2 warm-up calls; ONNX Runtime sessions given no
thread count run one intra-op thread without spinning, as the suite's two xdist workers share two cores). No notebook
checks those timings or thread counts; they cost seconds per build (02_calibration alone, on a machine loaded by other
work: 59.5 s with only the budget set, 42.7 s with all of these).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from require_optional import missing

nbformat = pytest.importorskip("nbformat", reason=missing("nbformat", "executing the notebooks needs it"))
nbclient = pytest.importorskip("nbclient", reason=missing("nbclient", "executing the notebooks needs it"))
pytest.importorskip("ipykernel", reason=missing("ipykernel", "executing the notebooks needs a Python kernel"))
pytest.importorskip("matplotlib", reason=missing("matplotlib", "the notebooks draw with it"))

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 180  # per cell; a whole small run takes seconds
SUITE_SETTINGS = """\
# Added by tests/test_notebooks.py to its copy: the settings tests/conftest.py gives the suite's builds.
try:
    from trtopt.backend.cpu import choice, speed
except ImportError:  # trtopt is not installed: the notebook finds it in the checkout, and builds time in full
    pass
else:
    from trtopt.backend.cpu import builder, runner
    from trtopt.execution import ort_session

    speed.BUDGET_S, speed.MIN_ROUNDS, speed.WARMUP = 0.0, 1, 0
    choice.keep_faster = lambda first, *args: first

    def _one_thread(*, threads=None, spin=True, _default=ort_session.session_options, **options):
        return _default(threads=1 if threads is None else threads, spin=False, **options)

    for _module in (ort_session, runner, builder):  # each holds its own reference to the function
        _module.session_options = _one_thread
"""


def test_the_notebooks_are_there() -> None:
    assert [p.name for p in NOTEBOOKS] == ["01_quickstart.ipynb", "02_calibration.ipynb", "03_optimizer.ipynb"]


@pytest.mark.slow(seconds=50)  # 02_calibration's five builds; 01 half that
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_on_small_settings(notebook: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / notebook.name
    shutil.copyfile(notebook, copy)
    monkeypatch.setenv("TRTOPT_NOTEBOOK_SMALL", "1")  # the kernel inherits this environment
    monkeypatch.setenv("TRTOPT_REPO_ROOT", str(ROOT))
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the notebooks' tempfile.mkdtemp() work folders land here
    nb = nbformat.read(copy, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(SUITE_SETTINGS))
    client = nbclient.NotebookClient(
        nb, kernel_name="python3", timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError (cell source + traceback) on the first failing cell
    errors = [o for cell in nb.cells for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    assert any(  # the figures were drawn
        "image/png" in o.get("data", {}) for cell in nb.cells for o in cell.get("outputs", [])
    ), f"{notebook.name} produced no figure"
