"""The build's speed check on CPU (trtopt.backend.cpu.speed): the plan's time against FP32's, measured in
interleaved rounds within a budget, in the summary and its JSON, and the note when INT8 is the slower."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from model_files import tiny_model_with_images

from trtopt.backend.cpu import speed as speed_module
from trtopt.backend.cpu.speed import MAX_ROUNDS, MIN_ROUNDS, WARMUP, Speed, measure_speeds
from trtopt.build import BuildConfig, build_plan
from trtopt.cli.summaries import build_summary, print_build_summary
from trtopt.data import DataConfig, PreprocessConfig
from trtopt.plan import write_plan


@pytest.fixture(autouse=True)
def _real_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rounds this module tests, which the suite's other builds cut to one call (tests/conftest.py)."""
    monkeypatch.setattr(speed_module, "MIN_ROUNDS", MIN_ROUNDS)
    monkeypatch.setattr(speed_module, "WARMUP", WARMUP)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_with_images(tmp_path_factory.mktemp("speed"), 10)


def test_the_text_says_when_int8_is_slower() -> None:
    faster, slower = Speed(10.0, 8.0, 5, 1, "this avx2 CPU"), Speed(10.0, 12.5, 5, 1, "this avx2 CPU")
    assert faster.ratio == pytest.approx(0.8) and "0.80x FP32's time on this avx2 CPU" in faster.text()
    assert "slower" not in faster.text() and "median of 5" in faster.text()
    assert "1.25x" in slower.text() and "slower than FP32 here" in slower.text() and "without --int8" in slower.text()
    assert slower.to_dict()["ratio"] == pytest.approx(1.25) and slower.rows()[0][0] == "speed"
    same = Speed(2.80, 2.81, 10, 8, "this avx2 CPU")  # 1.00x: noise, not "slower"
    assert "1.00x" in same.text() and "slower" not in same.text() and "about as fast as FP32" in same.text()
    vnni = Speed(10.0, 12.5, 5, 1, "this amx CPU", int8_dot_products=True)  # no "without VNNI" on such a CPU
    assert "slower than FP32 here" in vnni.text() and "VNNI" not in vnni.text() and "profiler" in vnni.text()


def test_rounds_stay_within_their_bounds(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import onnx

    fp32 = onnx.load(workdir / "tiny.onnx")
    dims = [d.dim_value or 1 for d in fp32.graph.input[0].type.tensor_type.shape.dim]
    feeds = {fp32.graph.input[0].name: np.zeros(dims, np.float32)}
    calls = []
    monkeypatch.setattr(speed_module, "BUDGET_S", float("inf"))  # however slow this machine: the round cap stops it
    (quick,) = measure_speeds(fp32, [lambda f: calls.append(1)], feeds, "here")  # a plan call that costs nothing
    assert quick.rounds == MAX_ROUNDS == len(calls) - WARMUP and quick.batch == dims[0] and quick.fp32_ms > 0
    monkeypatch.setattr(speed_module, "BUDGET_S", 0.0)
    (slow,) = measure_speeds(fp32, [lambda f: time.sleep(0.002)], feeds, "here")
    assert slow.rounds == MIN_ROUNDS and slow.plan_ms >= 2.0


def test_plans_timed_side_by_side_share_their_rounds_and_rotate_their_order(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnx

    fp32 = onnx.load(workdir / "tiny.onnx")
    dims = [d.dim_value or 1 for d in fp32.graph.input[0].type.tensor_type.shape.dim]
    feeds = {fp32.graph.input[0].name: np.zeros(dims, np.float32)}
    order: list[str] = []
    monkeypatch.setattr(speed_module, "BUDGET_S", 0.0)
    one, other = measure_speeds(fp32, [lambda f: order.append("a"), lambda f: time.sleep(0.002) or order.append("b")],
                                feeds, "here")  # fmt: skip
    assert one.rounds == other.rounds == MIN_ROUNDS and one.fp32_ms == other.fp32_ms  # one FP32 figure for both
    assert other.plan_ms >= 2.0 > one.plan_ms and other.ratio > one.ratio
    timed = order[2 * WARMUP :]
    assert timed.count("a") == timed.count("b") == MIN_ROUNDS
    assert {tuple(timed[i : i + 2]) for i in range(0, len(timed), 2)} == {("a", "b"), ("b", "a")}  # it rotates


def test_int8_builds_report_it_and_fp32_builds_do_not(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, preset = DataConfig(sources=(str(workdir / "images"),)), PreprocessConfig(preset="imagenet")
    result = build_plan(workdir / "tiny.onnx", BuildConfig(backend="cpu", data=data, preprocess=preset))
    assert isinstance(result.speed, Speed) and result.speed.fp32_ms > 0 and result.speed.plan_ms > 0
    assert "speed check" in result.stage_seconds
    write_plan(result.plan, workdir / "tiny.engine")
    summary = build_summary(result, workdir / "tiny.engine")
    assert summary["speed"]["ratio"] == pytest.approx(result.speed.ratio)
    print_build_summary(summary, result.backend_reason, result.report, result.speed)
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "speed INT8 plan" in text and "FP32's time on this" in text
    fp32 = build_plan(workdir / "tiny.onnx", BuildConfig(backend="cpu", int8=False))
    write_plan(fp32.plan, workdir / "fp32.engine")
    assert fp32.speed is None and "speed" not in build_summary(fp32, workdir / "fp32.engine")
    assert "speed check" not in fp32.stage_seconds


def test_a_failed_timing_is_a_warning_not_a_failed_build(workdir: Path, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    from trtopt.errors import TrtoptError

    def broken(*args: object) -> Speed:
        raise TrtoptError("ONNX Runtime rejected the inputs")

    monkeypatch.setattr(speed_module, "measure_speeds", broken)
    data, preset = DataConfig(sources=(str(workdir / "images"),)), PreprocessConfig(preset="imagenet")
    result = build_plan(workdir / "tiny.onnx", BuildConfig(backend="cpu", data=data, preprocess=preset))
    assert result.speed is None and "speed check" not in result.stage_seconds
    assert "no speed figure: timing the plan against FP32 failed (ONNX Runtime rejected the inputs)" in caplog.text
