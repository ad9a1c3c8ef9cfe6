"""tools/bench_zoo.py in quick mode on a small detector built in code (the real zoo needs its cache), and the
rule that held-out data never shares a file with calibration data."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from task_models import detector
from test_benchmark_tools import check_header, table_rows

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from zoo_variants import Data, _check_disjoint  # noqa: E402


@pytest.mark.slow
def test_quick_run_on_a_synthetic_detector_reports_every_variant(tmp_path: Path) -> None:
    model, out = tmp_path / "tiny_det.onnx", tmp_path / "zoo.md"
    onnx.save_model(detector(), model)
    args = ["tools/bench_zoo.py", "--model", str(model), "--task", "detect-yolov8", "--preprocess",
            "--preset imagenet", "--quick", "--methods", "max", "--out", str(out)]  # fmt: skip
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert out.read_text() == done.stdout
    check_header(done.stdout, "tools/bench_zoo.py")
    assert "CPU class `" in done.stdout
    (row,) = table_rows(done.stdout, "| model | task: metric | trtopt builds |")
    assert row[:3] == ["tiny_det", "detect-yolov8: box F1", "yes"]
    assert row[4] == "–" or int(row[4]) >= 0, row  # layers the sensitivity analysis kept float
    ort, ort_reference = row[6].removesuffix(")").split(" (ref ")
    for cell in (row[3], row[5].split(": ", 1)[1], ort, ort_reference):  # "F1% / worst cosine"
        f1, cosine = (float(v.strip().rstrip("%")) for v in cell.split("/"))
        assert 0 <= f1 <= 100 and 0 < cosine <= 1.0 + 1e-9, cell
    assert row[7].split(" (ref: ")[0] in ("yes", "no") and row[7].endswith(("(ref: yes)", "(ref: no)")), row
    assert all(math.isfinite(float(v)) and float(v) > 0 for v in " / ".join(row[8:10]).split(" / ")), row
    details = table_rows(done.stdout, "| model | variant | build |")
    assert [r[1].split(" (")[0] for r in details] == ["trtopt default", "trtopt max", "ORT QDQ MinMax"]
    for r in details:
        assert "boxes FP32 " in r[3] and int(r[3].split("boxes FP32 ")[1].split(",")[0]) > 0, r
    assert "held-out: 4 of `tests/data/heldout*`" in done.stdout


def test_held_out_data_sharing_a_calibration_file_is_refused(tmp_path: Path) -> None:
    calib, held = tmp_path / "calib", tmp_path / "held"
    calib.mkdir(), held.mkdir()
    (calib / "a.jpg").write_bytes(b"same bytes")
    (held / "renamed.jpg").write_bytes(b"same bytes")  # a copy under another name is still the same image
    with pytest.raises(SystemExit, match="1 held-out files are also calibration files"):
        _check_disjoint(Data((str(calib),), 1, (str(held),), 1, 0, ""))
    (held / "renamed.jpg").write_bytes(b"other bytes")
    _check_disjoint(Data((str(calib),), 1, (str(held),), 1, 0, ""))
