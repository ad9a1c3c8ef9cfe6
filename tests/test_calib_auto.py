"""`--method auto`: candidates scored by the error they cause in the nodes that read the tensor, on held-back
samples; the choice per tensor in the cache, the plan and the summary (issue #21)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from auto_models import heavy_tail_conv, heavy_tail_data
from onnx import TensorProto, helper

from trtopt.build import BuildConfig, build_plan
from trtopt.calib import (
    CalibConfig,
    CalibProgress,
    Calibration,
    calibrate,
    histogram_from_values,
    load_cache,
    save_cache,
    threshold,
)
from trtopt.calib.auto import SCORE_SAMPLES, choose_thresholds, fake_quantize, scoring_split
from trtopt.calib.collect import AUTO_PHASE
from trtopt.calib.config import CalibConfig as StageCalibConfig
from trtopt.calib.thresholds import AUTO_CANDIDATES, candidate_thresholds
from trtopt.data.config import DataConfig
from trtopt.engine import Engine
from trtopt.errors import CalibrationError
from trtopt.execution import OrtSession
from trtopt.quant import QuantConfig as StageQuantConfig


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_fake_quantize_is_the_symmetric_int8_grid() -> None:
    values = np.array([-3.0, -0.26, 0.0, 0.24, 0.26, 1.0, 2.0], np.float32)
    got = fake_quantize(values, 1.27)  # step 0.01, clip at 1.27
    assert got.tolist() == pytest.approx([-1.27, -0.26, 0.0, 0.24, 0.26, 1.0, 1.27])


def test_candidates_are_each_methods_threshold() -> None:
    hist = histogram_from_values(np.random.default_rng(0).standard_normal(50_000), name="t")
    found = candidate_thresholds(hist, CalibConfig())
    assert tuple(found) == AUTO_CANDIDATES
    for method, value in found.items():
        assert value == threshold(hist, CalibConfig(method=method))


def test_auto_from_a_histogram_alone_is_mse() -> None:
    hist = histogram_from_values(np.random.default_rng(1).laplace(size=20_000), name="t")
    assert threshold(hist, CalibConfig(method="auto")) == threshold(hist, CalibConfig(method="mse"))


def test_heavy_tail_conv_keeps_the_tail_its_weights_amplify() -> None:
    """The PP-OCR recogniser's failure in miniature: entropy clips the one channel a large weight reads."""
    model = heavy_tail_conv()
    calib = heavy_tail_data(64, 0)
    hist = histogram_from_values(calib, name="x")
    options = {"x": candidate_thresholds(hist, CalibConfig())}
    assert options["x"]["entropy"] < 0.2 * hist.amax  # entropy clips the tail
    choice = choose_thresholds(model, options, [({"x": heavy_tail_data(8, 1)}, 8)])["x"]
    assert choice.scored_by == "consumers" and choice.method != "entropy"
    assert choice.scores[choice.method] == min(choice.scores.values())
    assert choice.scores[choice.method] < choice.scores["entropy"] / 10


def test_heavy_tail_plan_follows_fp32_with_auto_and_not_with_entropy(tmp_path: Path) -> None:
    """Numerically, in ONNX Runtime: the CPU plan's conv output against FP32 on samples it never saw."""
    onnx.save_model(heavy_tail_conv(), tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", x=heavy_tail_data(96, 0))
    held = {"x": heavy_tail_data(16, 2)}
    expected = OrtSession(heavy_tail_conv()).run(held)["y"]
    cosines = {}
    for method in ("entropy", "auto"):
        config = BuildConfig(backend="cpu", data=DataConfig(sources=(str(tmp_path / "calib.npz"),)),
                             calib=StageCalibConfig(method=method), quant=StageQuantConfig(auto_exclude=False))
        with Engine(build_plan(tmp_path / "m.onnx", config).plan) as engine:
            cosines[method] = _cosine(engine.infer(held)["y"], expected)
    assert cosines["auto"] > 0.999 and cosines["entropy"] < 0.95, cosines


def _reshape_model() -> onnx.ModelProto:
    """x -> Reshape to a fixed [2, 64] -> y: runs in FP32, cannot run on candidates stacked along the batch."""
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [2, 64])
    node = helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])], [shape],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_a_node_that_cannot_run_alone_falls_back_to_the_tensors_own_error() -> None:
    values = np.random.default_rng(3).standard_normal((2, 4, 4, 4)).astype(np.float32)
    values[0, 0, 0, 0] = 30.0  # an outlier: max wastes the grid, the other candidates clip it
    hist = histogram_from_values(values, name="x")
    options = {"x": candidate_thresholds(hist, CalibConfig())}
    choice = choose_thresholds(_reshape_model(), options, [({"x": values}, 2)])["x"]
    assert choice.scored_by == "tensor"
    energy = np.sum(values**2)
    own = {m: float(np.sum((fake_quantize(values, t) - values) ** 2) / energy) for m, t in options["x"].items()}
    assert choice.method == min((m for m in choice.scores), key=own.__getitem__)
    assert choice.method != "max"


def test_calibrate_records_the_choice_per_tensor_and_falls_back_to_mse_without_samples() -> None:
    model = heavy_tail_conv()
    batches = [{"x": heavy_tail_data(16, s)} for s in range(3)]
    scoring = [({"x": heavy_tail_data(8, 9)}, 8)]
    scored = calibrate(model, batches, ["x"], CalibConfig(method="auto"), score_batches=scoring)
    assert scored.method == "auto" and scored.choices is not None and scored.choices["x"] in AUTO_CANDIDATES
    assert scored.method_counts() == {scored.choices["x"]: 1}
    unscored = calibrate(model, batches, ["x"], CalibConfig(method="auto"))
    assert unscored.choices == {"x": "mse"}
    assert unscored.amax["x"] == threshold(unscored.histograms["x"], CalibConfig(method="mse"))  # type: ignore[index]


def test_cache_keeps_the_choices_and_old_caches_still_load(tmp_path: Path) -> None:
    chosen = Calibration(amax={"a": 1.0, "b": 2.0}, method="auto", choices={"a": "max", "b": "entropy"})
    loaded = load_cache(save_cache(tmp_path / "c.json", chosen))
    assert loaded.choices == {"a": "max", "b": "entropy"} and loaded.method_counts() == {"entropy": 1, "max": 1}
    doc = json.loads((tmp_path / "c.json").read_text())
    del doc["methods"]  # as written before auto existed
    (tmp_path / "old.json").write_text(json.dumps(doc))
    old = load_cache(tmp_path / "old.json")
    assert old.choices is None and old.amax == {"a": 1.0, "b": 2.0} and old.method_counts() == {"auto": 2}
    doc["methods"] = {"a": 3}
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(CalibrationError, match="methods"):
        load_cache(tmp_path / "bad.json")


class _Samples:
    """The part of `trtopt.data.Dataset` that `scoring_split` uses."""

    def __init__(self, start: int, count: int) -> None:
        self.start, self.count = start, count

    def __len__(self) -> int:
        return self.count

    def split_tail(self, tail: int) -> tuple[_Samples, _Samples]:
        return _Samples(self.start, self.count - tail), _Samples(self.start + self.count - tail, tail)

    def batches(self, size: int):  # type: ignore[no-untyped-def]
        class Batch:
            def __init__(self, ids: list[int]) -> None:
                self.feeds = {"x": np.array(ids)}
                self.ids = ids

            def __len__(self) -> int:
                return len(self.ids)

            @property
            def feed_rows(self) -> int:  # every row real: no padding, no whole feeds
                return len(self.ids)

        ids = list(range(self.start, self.start + self.count))
        return [Batch(ids[i : i + size]) for i in range(0, len(ids), size)]


def test_scoring_holds_back_its_samples_when_the_set_is_large_enough() -> None:
    rest, scored = scoring_split(_Samples(0, 40), 8)
    assert len(rest) == 40 - SCORE_SAMPLES
    assert [int(i) for feeds, _ in scored for i in feeds["x"]] == list(range(40 - SCORE_SAMPLES, 40))
    small, shared = scoring_split(_Samples(0, 10), 8)
    assert len(small) == 10  # every sample still calibrates; scoring reuses the first ones
    assert [int(i) for feeds, _ in shared for i in feeds["x"]] == list(range(min(10, SCORE_SAMPLES)))


def test_build_records_choices_in_the_plan(tmp_path: Path) -> None:
    onnx.save_model(heavy_tail_conv(), tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", x=heavy_tail_data(80, 0))
    data = DataConfig(sources=(str(tmp_path / "calib.npz"),))
    reports: list[CalibProgress] = []
    result = build_plan(tmp_path / "m.onnx", BuildConfig(backend="cpu", data=data), progress=reports.append)
    # auto's scoring reports tensors scored of those to score, not samples (a 1024 x 1024 model scores for
    # minutes after its histogram pass), and the stage leaves its total alone
    scoring = [(r.samples, r.total_samples) for r in reports if r.phase == AUTO_PHASE]
    assert scoring == [(0, 1), (1, 1)]
    assert {r.total_samples for r in reports if r.phase == "histogram"} == {80 - 8 - SCORE_SAMPLES}
    meta = result.plan.metadata
    assert meta["calibration"]["method"] == "auto"
    assert meta["threshold_methods"] == {"x": result.calibration.choices["x"]}
    assert sum(meta["calibration"]["methods"].values()) == len(result.calibration.amax)
    # 80 samples: 8 verify the plan, SCORE_SAMPLES score the candidates, the rest are histogrammed
    assert result.calibration.num_samples == 80 - 8 - SCORE_SAMPLES


def test_cli_reports_the_methods_auto_chose(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trtopt.cli.main import main

    onnx.save_model(heavy_tail_conv(), tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", x=heavy_tail_data(40, 0))
    assert main(["calibrate", str(tmp_path / "m.onnx"), "--calib", str(tmp_path / "calib.npz"),
                 "-o", str(tmp_path / "c.json"), "--json"]) == 0  # fmt: skip
    summary = json.loads(capsys.readouterr().out)
    assert summary["method"] == "auto" and sum(summary["methods"].values()) == summary["tensors"] == 1
    assert load_cache(tmp_path / "c.json").choices == {"x": next(iter(summary["methods"]))}
    assert main(["build", str(tmp_path / "m.onnx"), "--int8", "--calib", str(tmp_path / "calib.npz"),
                 "-o", str(tmp_path / "p.engine"), "--json"]) == 0  # fmt: skip
    built = json.loads(capsys.readouterr().out)
    assert built["calibration"]["method"] == "auto" and sum(built["calibration"]["methods"].values()) == 1
