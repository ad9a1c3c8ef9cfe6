"""Concats of unlike ranges stay float (trtopt.quant.concat_ranges), and a YOLO head's boxes-and-scores
output keeps its scores (issue #21, part 2). Numeric checks run the CPU plans in ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from auto_models import image_like, unlike_concat, yolo_head

from trtopt.build import BuildConfig, build_plan
from trtopt.data.config import DataConfig
from trtopt.engine import Engine
from trtopt.execution import OrtSession
from trtopt.frontend import graph_from_onnx
from trtopt.passes import optimize
from trtopt.quant import QuantConfig, concat_ranges, plan_quantization
from trtopt.quant import QuantConfig as StageQuantConfig
from trtopt.quant.concat_ranges import UNLIKE_RATIO, float_unlike_concats, unlike_ratio


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_unlike_ratio() -> None:
    assert unlike_ratio([1.0, 16.0]) == 16.0 and unlike_ratio([640.0, 1.0]) == 640.0
    assert unlike_ratio([0.0, 1.0]) == float("inf") and unlike_ratio([0.0, 0.0]) == 1.0


def _planned() -> tuple[object, object, str]:
    graph = optimize(graph_from_onnx(unlike_concat())).graph
    from trtopt.backend import get_backend

    plan = plan_quantization(graph, get_backend("cpu").quant_config(QuantConfig()))  # ONNX Runtime's form
    concat = next(n for n in graph.nodes if n.op == "Concat")
    return graph, plan, concat.name


def test_unlike_concat_loses_its_shared_scale_and_its_output_pairs() -> None:
    graph, plan, concat = _planned()
    group = next(g for g in plan.shared)  # type: ignore[attr-defined]
    assert any(s.consumer == concat for s in plan.sites)  # type: ignore[attr-defined]
    like = float_unlike_concats(graph, plan, dict.fromkeys(group, 1.0))  # type: ignore[arg-type]
    assert like is plan
    ranges = {group[0]: 300.0, group[1]: 300.0, group[2]: 300.0 / (UNLIKE_RATIO * 1.5)}
    split = float_unlike_concats(graph, plan, ranges)  # type: ignore[arg-type]
    assert split.shared == () and "unlike ranges" in split.float_layers[concat]
    assert not [s for s in split.sites if s.role == "concat" or s.tensor == group[0]]
    # what stays on the Concat's inputs are the INT8 outputs of the layers producing them, each its own scale
    assert {s.role for s in split.sites if s.consumer == concat} == {"output"}
    kept = {(s.tensor, s.consumer, s.index) for s in split.sites}
    assert kept < {(s.tensor, s.consumer, s.index) for s in plan.sites}  # type: ignore[attr-defined]


def _build(tmp_path: Path, model: onnx.ModelProto, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, object]:
    onnx.save_model(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", x=image_like(80, shape, 0))
    held = {"x": image_like(16, shape, 1)}
    # automatic exclusion off: these tests isolate the Concat rule and the placement of graph outputs
    config = BuildConfig(backend="cpu", data=DataConfig(sources=(str(tmp_path / "calib.npz"),)),
                         quant=StageQuantConfig(auto_exclude=False))
    result = build_plan(tmp_path / "m.onnx", config)
    with Engine(result.plan) as engine:
        got = engine.infer(held)["out"]
    return got, OrtSession(model).run(held)["out"], result


def test_unlike_concat_plan_follows_fp32_and_a_shared_scale_would_not(tmp_path: Path, monkeypatch) -> None:
    got, expected, result = _build(tmp_path, unlike_concat(), (3, 12, 12))
    assert any("unlike ranges" in why for why in result.qdq.float_layers.values())  # type: ignore[attr-defined]
    monkeypatch.setattr(concat_ranges, "UNLIKE_RATIO", float("inf"))  # the rule off: one scale for all
    shared, _, _ = _build(tmp_path, unlike_concat(), (3, 12, 12))
    assert _cosine(got, expected) > 0.999
    assert 1 - _cosine(shared, expected) > 5 * (1 - _cosine(got, expected))


def test_yolo_scores_survive_next_to_pixel_boxes(tmp_path: Path) -> None:
    got, expected, result = _build(tmp_path, yolo_head(), (3, 16, 16))
    boxes, scores = slice(0, 4), slice(4, None)
    assert expected[:, boxes].max() > 100 and expected[:, scores].max() > 0.5  # the ranges the head mixes
    assert _cosine(got[:, scores], expected[:, scores]) > 0.999
    assert _cosine(got[:, boxes], expected[:, boxes]) > 0.999
    confident = expected[:, scores] > 0.5
    assert got[:, scores][confident].min() > 0.3  # no detection lost
    plan = onnx.load_from_string(result.plan.sections["onnx"])  # type: ignore[attr-defined]
    concat = next(n for n in plan.graph.node if n.op_type == "Concat")
    producers = {o: n.op_type for n in plan.graph.node for o in n.output}
    assert "DequantizeLinear" not in [producers[i] for i in concat.input]  # the output Concat runs in float


@pytest.mark.parametrize("ratio", [2.0, 15.9])
def test_like_ranges_keep_sharing(ratio: float) -> None:
    graph, plan, _ = _planned()
    group = plan.shared[0]  # type: ignore[attr-defined]
    ranges = {group[0]: 10.0, group[1]: 10.0, group[2]: 10.0 / ratio}
    assert float_unlike_concats(graph, plan, ranges) is plan  # type: ignore[arg-type]
