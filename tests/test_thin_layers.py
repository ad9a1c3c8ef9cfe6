"""Thin layers in INT8 where that costs no fidelity (`trtopt.search.thin`, CPU builds; issue #45)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from trtopt.backend import get_backend
from trtopt.build import BuildConfig, build_plan
from trtopt.data import DataConfig
from trtopt.quant import QuantConfig
from trtopt.search import thin
from trtopt.zoo.builder import GraphBuilder


def stem_model() -> onnx.ModelProto:
    """A MobileNet-like entry: a 3-channel stem conv (thin), a depthwise conv fed by it, then wide layers."""
    b = GraphBuilder("stem", seed=0)
    y = b.conv_bn(b.input("input", [1, 3, 16, 16]), 3, 16, 3)
    y = b.conv_bn(y, 16, 16, 3, group=16)
    y = b.conv_bn(y, 16, 32, 1)
    return b.build([b.gemm(b.pool_flatten(y), 32, 10, out="logits")])


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("thin")
    onnx.save_model(stem_model(), root / "m.onnx")
    np.savez(root / "calib.npz", input=np.random.default_rng(0).standard_normal((24, 3, 16, 16)).astype(np.float32))
    return root


def build(root: Path, quant: QuantConfig | None = None) -> Any:
    config = BuildConfig(backend="cpu", data=DataConfig(sources=(str(root / "calib.npz"),)))
    return build_plan(root / "m.onnx", config if quant is None else BuildConfig(**{**config.__dict__, "quant": quant}))


def thin_reasons(result: Any) -> list[str]:
    return [why for why in result.plan.metadata.quant.float_layers.values()
            if "fewer than" in why or "depthwise" in why]  # fmt: skip


def test_only_the_cpu_backends_own_defaults_widen() -> None:
    cpu, trt = get_backend("cpu"), get_backend("tensorrt")
    assert cpu.quant_config(QuantConfig()).widen_thin
    assert not cpu.quant_config(QuantConfig(min_channels=16)).widen_thin  # the user's choice stands
    assert not cpu.quant_config(QuantConfig(float_leading_depthwise=True)).widen_thin
    assert not trt.quant_config(QuantConfig()).widen_thin


@pytest.mark.parametrize(("errors", "widened"), [((0.0100, 0.0104), True), ((0.0100, 0.0200), False)])
def test_a_build_takes_the_thin_layers_only_where_they_measure_as_faithful(
    files: Path, monkeypatch: pytest.MonkeyPatch, errors: tuple[float, float], widened: bool
) -> None:
    monkeypatch.setattr(thin, "_errors", lambda *args: errors)
    result = build(files)
    assert (not thin_reasons(result)) is widened  # the stem and its depthwise conv: INT8 only where free
    assert result.verification is not None and result.verification.ok


def test_the_two_plans_are_measured_on_the_search_samples(files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real measurement: each plan's relative error to FP32, the wider one taken by the rule, and a user's
    --min-channels left alone (no measurement)."""
    seen: list[tuple[Any, str | None]] = []
    measure = thin.thin_layers_where_free

    def spy(*args: Any) -> Any:
        seen.append(measure(*args))
        return seen[-1]

    monkeypatch.setattr("trtopt.quantize.thin_layers_where_free", spy)
    result = build(files)
    (quant, note), = seen
    assert note is not None and "relative error to FP32 on the search samples" in note
    wider, base = (float(x) for x in note.rsplit("samples ", 1)[1].replace(" without", "").split(
        " with them in INT8, "))  # fmt: skip
    assert (quant.min_channels == 1) is (wider <= base * thin.SLACK + thin.FLOOR)
    assert bool(thin_reasons(result)) is (quant.min_channels != 1)
    seen.clear()
    build(files, QuantConfig(min_channels=16))
    assert seen == [(seen[0][0], None)] and seen[0][0].min_channels == 16
