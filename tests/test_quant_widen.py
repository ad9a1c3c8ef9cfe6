"""Wider thresholds, the sensitivity search's last stage (trtopt.search._widen; issue #16 part 3)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from auto_models import heavy_tail_conv, heavy_tail_data
from onnx import numpy_helper

from trtopt.build import BuildConfig, build_plan
from trtopt.calib.config import CalibConfig
from trtopt.data.config import DataConfig
from trtopt.engine import Engine
from trtopt.execution import OrtSession
from trtopt.quant import QuantConfig
from trtopt.search import _widen as widen
from trtopt.search.sensitivity import MIN_COSINE, MIN_GAIN, find_sensitive_layers


def _clipped(costs: dict[str, float], clip: dict[str, tuple[float, float]]):  # type: ignore[no-untyped-def]
    """A plan whose cosine is 1 minus its INT8 layers' costs and its clipped tensors' costs; a move of a
    tensor to at least `clip[tensor][0]` removes that tensor's cost `clip[tensor][1]`."""

    def measure(exclude: Sequence[str]) -> float:
        floats, moves = widen.split(exclude)
        clipped = sum(cost for tensor, (enough, cost) in clip.items() if moves.get(tensor, 0.0) < enough)
        return 1.0 - sum(cost for layer, cost in costs.items() if layer not in floats) - clipped

    return measure


def test_when_no_float_layer_pays_the_search_widens_the_threshold_that_does() -> None:
    """Ten layers costing under MIN_GAIN each (none pays for float), one clipped tensor costing 0.005: the
    last stage tries its moves, keeps the wider one that removes the cost, and reaches the aim; the record
    names the move, not a float layer."""
    costs = {f"l{i}": MIN_GAIN * 0.8 for i in range(10)}
    tried: list[tuple[Sequence[str], tuple[str, ...]]] = []

    def wider(layers: Sequence[str], kept: Any) -> list[str]:
        tried.append((list(layers), tuple(kept)))
        return [widen.key("t", 1.5), widen.key("t", 2.25), widen.key("u", 3.0)]

    measure = _clipped(costs, {"t": (2.0, 0.005)})
    found = find_sensitive_layers(measure, list(costs), wider=wider)
    assert found.before < MIN_COSINE <= found.after and found.layers == {}
    assert list(found.thresholds) == ["t"] and found.thresholds["t"]["to"] == 2.25
    assert found.thresholds["t"]["why"].startswith(widen.REASON) and "lifts" in found.thresholds["t"]["why"]
    assert tried == [(list(costs), ())]  # asked once, after the float stages
    without = find_sensitive_layers(measure, list(costs))
    assert without.after == found.before and without.thresholds == {}


def test_a_plan_that_reaches_the_aim_with_float_layers_tries_no_threshold() -> None:
    costs = {"big": 0.02, "small": 0.0002}
    asked: list[int] = []
    found = find_sensitive_layers(_clipped(costs, {}), list(costs), wider=lambda *_: asked.append(1) or [])
    assert list(found.layers) == ["big"] and found.thresholds == {} and asked == []


def _calibrated(amax: dict[str, float], ranges: dict[str, float]) -> Any:
    """What `moves_for` reads of a `trtopt.calib.Calibration`: thresholds and the maxima seen."""
    return SimpleNamespace(amax=amax, ranges=ranges)


def test_moves_are_tried_only_for_clipped_activations_of_layers_left_int8() -> None:
    graph = gs.import_onnx(heavy_tail_conv())
    conv = next(n for n in graph.nodes if n.op == "Conv")
    calibration = _calibrated({"x": 0.1, "y": 1.0}, {"x": 0.42, "y": 1.0})
    moves = widen.moves_for(graph, calibration, [conv.name, "missing"], ())
    assert [widen.split([m])[1] for m in moves] == [{"x": 0.1 * 1.5}, {"x": 0.1 * 2.25}]
    capped = widen.moves_for(graph, _calibrated({"x": 0.3}, {"x": 0.42}), [conv.name], ())
    assert [widen.split([m])[1]["x"] for m in capped] == [0.42]  # both factors reach the maximum: one move
    assert widen.moves_for(graph, calibration, [conv.name], {conv.name}) == []  # kept float: nothing to widen
    unclipped = _calibrated({"x": 0.42}, {"x": 0.42})
    assert widen.moves_for(graph, unclipped, [conv.name], ()) == []
    assert widen.split(["Conv_0", *moves]) == (["Conv_0"], {"x": 0.1 * 2.25})  # a later move of a tensor wins
    assert widen.shown(moves[0]) == "x's threshold -> 0.15" and widen.shown("Conv_0") == "Conv_0"


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a.ravel() @ b.ravel() / np.linalg.norm(a) / np.linalg.norm(b))


def test_the_build_widens_a_clipped_threshold_when_float_layers_may_not_help(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forced entropy clips the PP-OCR miniature's heavy-tailed input (cosine 0.85). With float layers refused
    (as where none pays), the search widens that input's threshold instead: the record, the plan's Q/DQ scale
    and the held-out cosine against the plan without the search all show it (ONNX Runtime's numbers)."""
    from trtopt.search import sensitivity

    real = sensitivity.greedy  # the greedy stage, offered threshold moves only
    monkeypatch.setattr(
        sensitivity, "greedy", lambda found, order, *rest: real(found, [k for k in order if widen.MARK in k], *rest)
    )
    onnx.save_model(heavy_tail_conv(), tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", x=heavy_tail_data(96, 0))
    held = {"x": heavy_tail_data(16, 2)}
    expected = OrtSession(heavy_tail_conv()).run(held)["y"]
    config = BuildConfig(backend="cpu", data=DataConfig(sources=(str(tmp_path / "calib.npz"),)),
                         calib=CalibConfig(method="entropy"), quant=QuantConfig(auto_exclude=True))  # fmt: skip
    result = build_plan(tmp_path / "m.onnx", config)
    record = result.plan.metadata["sensitivity"]
    assert record["layers"] == {} and list(record["thresholds"]) == ["x"]
    move = record["thresholds"]["x"]
    assert result.plan.metadata.quant.threshold_methods["x"] == "entropy, widened"
    assert result.plan.metadata.quant.thresholds["x"] == pytest.approx(move["to"])
    assert move["to"] > move["from"] == pytest.approx(result.calibration.amax["x"])
    scales = [numpy_helper.to_array(i) for i in onnx.load_from_string(result.plan.sections["onnx"]).graph.initializer
              if i.name.startswith("x") and "scale" in i.name]  # fmt: skip
    assert any(np.isclose(float(s), move["to"] / 127) for s in scales if s.size == 1)
    plain = build_plan(tmp_path / "m.onnx", replace(config, quant=QuantConfig(auto_exclude=False)))
    with Engine(result.plan) as engine, Engine(plain.plan) as clipped:
        widened, before = _cosine(engine.infer(held)["y"], expected), _cosine(clipped.infer(held)["y"], expected)
    assert widened > before + 0.05 and widened > 0.95  # 0.85 -> 0.98 (the rest: the small channels' resolution)


def test_the_build_summary_names_the_widened_thresholds_beside_the_float_layers() -> None:
    from trtopt.cli.summaries import sensitivity_row

    move = {"from": 0.857, "to": 1.285, "why": f"{widen.REASON} (alone it lifts ...)"}
    row = sensitivity_row({"before": 0.96, "after": 0.9905, "layers": {"Conv_2": "why"}, "trials": 120,
                           "thresholds": {"hardswish_76": move}})  # fmt: skip
    assert row is not None and row[0] == "sensitivity analysis"
    assert "Conv_2, hardswish_76's threshold 0.857 -> 1.285: worst output score" in row[1] and "short" not in row[1]
    alone = sensitivity_row({"before": 0.96, "after": 0.9905, "layers": {}, "trials": 60,
                             "thresholds": {"hardswish_76": move}})  # fmt: skip
    assert alone is not None and "no layer kept float" not in alone[1] and "0.9600 -> 0.9905" in alone[1]
