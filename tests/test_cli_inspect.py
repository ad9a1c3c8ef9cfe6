"""`trtopt inspect`: tables and JSON for a good model; for every bad input, a clean one-paragraph
error on stderr, a non-zero exit and no traceback (in-process and, once, as a real subprocess)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from model_files import EXPECTED_MESSAGE, save, with_dynamic_hw, write_bad_file

from trtopt.cli.main import main
from trtopt.zoo import build_model

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture()
def tiny(tmp_path: Path) -> Path:
    return save(build_model("tiny_cnn"), tmp_path / "tiny.onnx")


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["inspect", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_clean_error(code: int, out: str, err: str, message: str) -> None:
    assert code == 2
    assert out == ""
    assert "Traceback" not in err
    assert err.startswith("error: ") and "\nfix: " in err
    assert err.count("\n") == 2, "one line of what, one line of fix"
    assert re.search(message, err.replace("\n", " ")), err


def test_tables(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, str(tiny))
    assert code == 0 and err == ""
    for text in ("Inputs and outputs", "1x3x32x32", "logits", "BatchNormalization", "Top 10 layers by MACs",
                 "MACs 7.25M", "pass by pass", "7 fold_bn", "1 fuse_parallel", "1 concat_in_place",
                 "2 conv+add+relu", "no match"):
        assert text in out, text
    assert "Every match" not in out


def test_matches_lists_every_match(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_cli(capsys, str(tiny), "--matches")
    assert "Every match" in out and out.count("fold_bn ") >= 7 and "in place:" in out


def test_layers_lists_every_node(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_cli(capsys, str(tiny), "--layers")
    assert "Layers" in out and "concat_1" in out and "flatten_1" in out and "Top 10" not in out


def test_json(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, str(tiny), "--json")
    data = json.loads(out)
    assert code == 0
    assert data["inputs"] == [{"name": "input", "shape": [1, 3, 32, 32], "dtype": "float32"}]
    assert data["outputs"][0]["shape"] == [1, 10] and data["opset"] == 17
    assert data["op_histogram"]["Conv"] == 13 and data["nodes"] == len(data["layers"])
    assert data["macs"] == sum(layer["macs"] for layer in data["layers"])
    fusions = data["fusions"]
    assert fusions["changes"]["fold_batchnorm"] == {"fold_bn": 7}
    assert fusions["recorded"]["fuse_cbr"] == {"conv+relu": 8, "conv+add+relu": 2}
    assert [r["name"] for r in fusions["reports"]] == fusions["passes"] and fusions["not_fused"] == []


def test_dynamic_dims_get_a_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save(with_dynamic_hw(), tmp_path / "dyn.onnx")
    code, out, err = run_cli(capsys, str(path))
    assert code == 0 and "1x3xheightxwidth" in out
    assert "note:" in err and "--shapes" in err
    code, out, err = run_cli(capsys, str(path), "--shapes", "input:1x3x32x32", "--json")
    assert code == 0 and err == "" and json.loads(out)["macs"] > 7_000_000


@pytest.mark.parametrize("kind", sorted(EXPECTED_MESSAGE))
def test_bad_files(kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert_clean_error(*run_cli(capsys, str(write_bad_file(kind, tmp_path))), EXPECTED_MESSAGE[kind])


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("input=1x3x32x32", "Cannot read shape spec"),
        ("input:1x3xHx32", "Cannot read shape spec"),
        ("image:1x3x32x32", "no such input.*Model inputs: input"),
        ("input:1x3x32", "rank 3.*rank 4"),
    ],
)
def test_bad_shapes(spec: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save(with_dynamic_hw(), tmp_path / "dyn.onnx")
    assert_clean_error(*run_cli(capsys, str(path), "--shapes", spec), message)


def test_subprocess_has_no_traceback(tmp_path: Path) -> None:
    bad = write_bad_file("truncated", tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "trtopt.cli.main", "inspect", str(bad)],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert result.stderr.startswith("error: ") and "truncated" in result.stderr


@pytest.mark.parametrize(("flags", "severity"), [((), [3]), (("-v",), [3]), (("-vv",), [])])
def test_onnxruntime_warnings_are_quiet_below_debug(tiny: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...],
                                                    severity: list[int]) -> None:
    """Graph optimisers log through ONNX Runtime's default logger, which session options do not reach: the
    CLI sets it to errors only unless -vv asks for debug output."""
    import onnxruntime

    set_to: list[int] = []
    monkeypatch.setattr(onnxruntime, "set_default_logger_severity", set_to.append)
    code = main([*flags, "inspect", str(tiny)])
    assert code == 0 and set_to == severity
