"""Layers whose INT8 tensor would round most of its non-zero values to zero stay float
(trtopt.quant.underflow): LORE's heat-map head in miniature, built and run in ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from auto_models import image_like

from trtopt.build import BuildConfig, build_plan
from trtopt.calib.histogram import histogram_from_values
from trtopt.data.config import DataConfig
from trtopt.engine import Engine
from trtopt.execution import OrtSession
from trtopt.quant import QuantConfig, underflow
from trtopt.quant.underflow import underflow_share
from trtopt.zoo.builder import GraphBuilder


def wide_range_head() -> onnx.ModelProto:
    """x (16 channels) -> Conv 3x3 (INT8) -> Relu -> Conv 1x1 (channel c scaled by 10^(c/6): 5 decades) -> Relu
    -> Conv 1x1 to 2 logits (channel c's weights scaled by 10^(-c/6), so every channel counts alike; bias -1.7) -> out.
    The last conv has 2 outputs (fewer than 16: float); the ReLU output it reads is the wide tensor."""
    g = GraphBuilder("wide_range_head", seed=11, opset=13)
    x = g.input("x", [-1, 16, 16, 16])
    features = g.relu(g.conv(x, 16, 32, 3))
    gains = 10.0 ** (np.arange(32) / 6.0)
    spread_w = g.he_weight((32, 32, 1, 1), 32) * gains[:, None, None, None]
    spread_b = g.bias(32) * gains
    wide = g.relu(g.node("Conv", [features, g.const("spread_w", spread_w.astype(np.float32)),
                                  g.const("spread_b", spread_b.astype(np.float32))], kernel_shape=[1, 1]))  # fmt: skip
    head_w = g.he_weight((2, 32, 1, 1), 32) / gains[None, :, None, None]
    head_b = np.full(2, -1.7, np.float32)
    out = g.node("Conv", [wide, g.const("head_w", head_w.astype(np.float32)), g.const("head_b", head_b)],
                 kernel_shape=[1, 1], out="out")  # fmt: skip
    return g.build([out])


def test_underflow_share_counts_non_zero_values_below_half_a_step() -> None:
    rng = np.random.default_rng(0)
    small = rng.uniform(0.0, 0.2, 3000)  # evenly spread: the histogram's bins hold them evenly too
    values = np.concatenate([np.zeros(5000), small, np.full(2000, 100.0)]).astype(np.float32)
    histogram = histogram_from_values(values)
    assert histogram.zeros == 5000
    # threshold 100: half a step is 100 / 254 = 0.39 > 0.2, so the 3000 small of the 5000 non-zero values round to 0
    assert underflow_share(histogram, 100.0) == pytest.approx(0.6, abs=0.01)
    # threshold 25.4: half a step is 0.1, half of the small values round to 0 (the exact zeros never count)
    assert underflow_share(histogram, 25.4) == pytest.approx(0.3, abs=0.02)
    assert underflow_share(histogram, 4.0) == pytest.approx(0.3 * (4.0 / 254) / 0.1, abs=0.02)
    assert underflow_share(histogram_from_values(np.zeros(10, np.float32)), 1.0) == 0.0


def _build(tmp_path: Path) -> tuple[np.ndarray, np.ndarray, object]:
    model = wide_range_head()
    onnx.save_model(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", x=image_like(64, (16, 16, 16), 0))
    held = {"x": image_like(16, (16, 16, 16), 1)}
    config = BuildConfig(backend="cpu", data=DataConfig(sources=(str(tmp_path / "calib.npz"),)),
                         quant=QuantConfig(auto_exclude=False))  # fmt: skip
    result = build_plan(tmp_path / "m.onnx", config)
    with Engine(result.plan) as engine:
        got = engine.infer(held)["out"]
    return got, OrtSession(model).run(held)["out"], result


def _decisions_differ(got: np.ndarray, expected: np.ndarray) -> float:
    """The share of positions on the other side of a threshold that FP32's top tenth of positions cross
    (what a detector thresholding its heat map reads)."""
    threshold = np.quantile(expected, 0.9)
    return float(((got > threshold) != (expected > threshold)).mean())


def test_wide_tensor_stays_float_and_the_decisions_follow_fp32(tmp_path: Path, monkeypatch) -> None:
    got, expected, result = _build(tmp_path)
    reasons = result.qdq.float_layers.values()  # type: ignore[attr-defined]
    assert any("round" in why and "to zero" in why for why in reasons)
    monkeypatch.setattr(underflow, "UNDERFLOW_SHARE", 1.0)  # the rule off
    rounded, _, off = _build(tmp_path)
    assert not any("to zero" in why for why in off.qdq.float_layers.values())  # type: ignore[attr-defined]
    assert np.abs(got - expected).mean() * 5 < np.abs(rounded - expected).mean()
    assert _decisions_differ(got, expected) < 0.01
    assert _decisions_differ(rounded, expected) > 2 * _decisions_differ(got, expected) + 0.02
