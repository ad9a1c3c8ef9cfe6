"""Thin layers in INT8 where they pay (trtopt.quant.thin, trtopt.backend.cpu.choice): the second Q/DQ model a CPU
build writes, checked numerically against the float model, and the speed check's choice between it and the plan,
with injected timings (no test here depends on how fast anything runs)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
import pytest
from model_files import tiny_model_with_images
from quant_helpers import cosine, cpu_config, feeds_for
from test_cpu_choice import checked, islands, quantize_count, speed

from trtopt.backend.cpu.backend import CpuBackend
from trtopt.backend.cpu.choice import THIN_PAYS, Candidate, keep_faster
from trtopt.backend.cpu.options import CpuOptions
from trtopt.backend.cpu.speed import Speed
from trtopt.build import BuildConfig, build_plan
from trtopt.data import DataConfig, PreprocessConfig
from trtopt.execution import run_model
from trtopt.frontend import graph_from_onnx, onnx_from_graph
from trtopt.passes import optimize
from trtopt.quant import QuantConfig, plan_quantization
from trtopt.quant.qdq import insert_qdq
from trtopt.quant.thin import Wider, wider_model

SPEED_CHOICE = True  # conftest leaves the choice on in this module


def thin_quant(**changes: Any) -> QuantConfig:
    """The CPU backend's placement of a default build (16-channel minimum, a depthwise conv after a float layer
    float), asking for the wider model; no bias correction (the test's calibration has no channel means)."""
    config = cpu_config(QuantConfig())
    return replace(config, **{"float_leading_depthwise": True, "widen_thin": True, "bias_correction": False, **changes})


def max_amax(graph: Any) -> dict[str, float]:
    """max |x| over a few random inputs, for every tensor any placement here quantises."""
    tensors = plan_quantization(graph, replace(thin_quant(), min_channels=1)).activation_tensors
    amax: dict[str, float] = {}
    for seed in range(3):
        acts = run_model(onnx_from_graph(graph), feeds_for(graph, seed), expose=tensors)
        for t in tensors:
            amax[t] = max(amax.get(t, 0.0), float(np.abs(acts[t]).max()))
    return amax


@pytest.fixture(scope="module")
def graph() -> Any:
    return optimize(graph_from_onnx(islands())).graph


CALIBRATION = SimpleNamespace(ranges={}, channel_means={})


def test_the_wider_model_has_the_thin_layers_in_int8_and_computes_the_float_model(graph: Any) -> None:
    quant = thin_quant()
    plan = plan_quantization(graph, quant)
    before = onnx_from_graph(graph)
    wider = wider_model(graph, quant, plan, max_amax(graph), CALIBRATION, ())
    assert wider is not None and wider.layers
    thin = {name for name, why in plan.float_layers.items() if "channels" in why}
    assert set(wider.layers) == thin and not thin & set(plan.quantized_layers)
    assert onnx_from_graph(graph).SerializeToString() == before.SerializeToString()  # the build's graph untouched
    layers = {n.name: n for n in wider.model.graph.node}
    producers = {o: n for n in wider.model.graph.node for o in n.output}
    for name in wider.layers:  # each thin layer reads its input through a Q/DQ pair now
        assert producers[layers[name].input[0]].op_type == "DequantizeLinear"
    assert set(wider.thresholds) > set(insert_qdq(graph.copy(), plan, max_amax(graph)).thresholds)
    feeds = feeds_for(graph, seed=5)
    expected = run_model(before, feeds)["logits"]
    found = run_model(wider.model, feeds, opt_level="disable")["logits"]  # the Q/DQ math, as float
    assert cosine(found, expected) > 0.99


def test_layers_kept_float_for_another_reason_stay_float_in_the_wider_model(graph: Any) -> None:
    quant = thin_quant()
    plan = plan_quantization(graph, quant)
    searched = plan.quantized_layers[0]  # as if the sensitivity search had kept it float
    plan = plan_quantization(graph, replace(quant, exclude=(searched,)))
    plan = replace(plan, float_layers={**plan.float_layers, searched: "sensitivity"})
    wider = wider_model(graph, quant, plan, max_amax(graph), CALIBRATION, ())
    assert wider is not None and searched not in wider.layers
    assert not any(n.name == searched and _reads_pair(wider.model, n) for n in wider.model.graph.node)


def _reads_pair(model: onnx.ModelProto, node: onnx.NodeProto) -> bool:
    producers = {o: n for n in model.graph.node for o in n.output}
    return node.input[0] in producers and producers[node.input[0]].op_type == "DequantizeLinear"


def test_no_wider_model_where_not_asked_for_or_nothing_is_thin(graph: Any) -> None:
    amax = max_amax(graph)
    quant = thin_quant(widen_thin=False)
    assert wider_model(graph, quant, plan_quantization(graph, quant), amax, CALIBRATION, ()) is None
    wide = thin_quant(min_channels=1, float_leading_depthwise=False)
    assert wider_model(graph, wide, plan_quantization(graph, wide), amax, CALIBRATION, ()) is None


def test_the_cpu_backend_asks_for_it_only_where_the_user_left_both_settings_to_it() -> None:
    backend, options = CpuBackend(), CpuOptions()
    assert backend.quant_config(QuantConfig(), options).widen_thin
    assert not backend.quant_config(QuantConfig(min_channels=16), options).widen_thin
    assert not backend.quant_config(QuantConfig(float_leading_depthwise=True), options).widen_thin
    assert not backend.quant_config(QuantConfig(), CpuOptions(fallback="off")).widen_thin
    assert not backend.quant_config(QuantConfig()).widen_thin  # no build options: no build to time it


@pytest.fixture(scope="module")
def models(graph: Any) -> tuple[onnx.ModelProto, Wider, onnx.ModelProto]:
    """The plan's Q/DQ model of `islands`, its wider model, and the float model."""
    quant, amax = thin_quant(), max_amax(graph)
    plan = plan_quantization(graph, quant)
    wider = wider_model(graph, quant, plan, amax, CALIBRATION, ())
    assert wider is not None
    work = graph.copy()
    insert_qdq(work, plan, amax)
    return onnx_from_graph(work), wider, onnx_from_graph(graph)


def world(model: onnx.ModelProto, *ratios: tuple[float, float], errors: tuple[float, float] = (0.02, 0.02)) -> Any:
    """A build whose plans are the models themselves, verified with the plan's error (as many Q nodes as `model`)
    or the wider model's (more), and a side-by-side timer that answers `ratios` in turn (the plan's, the wider
    plan's: the last pair again once they run out) for the two plans it is given, in that order; it records what
    it timed."""
    plan_qs, timed = quantize_count(model), list[list[int]]()

    def build(candidate: onnx.ModelProto) -> tuple[Any, Any]:
        return candidate, checked(1.0 - errors[1] if quantize_count(candidate) > plan_qs else 1.0 - errors[0])

    def pair(one: onnx.ModelProto, other: onnx.ModelProto) -> tuple[Speed, Speed]:
        timed.append([quantize_count(one), quantize_count(other)])
        now = ratios[min(len(timed), len(ratios)) - 1]
        return speed(now[0]), speed(now[1])

    def timer(plan: onnx.ModelProto) -> Speed:
        raise AssertionError("the thin layers' choice times the two plans side by side")

    return build, timer, pair, timed


def test_the_wider_plan_is_kept_where_it_runs_faster_at_the_same_fidelity(models: Any) -> None:
    model, wider, fp32 = models
    build, timer, pair, timed = world(model, (0.72, 0.65))
    kept = keep_faster(Candidate(model, checked(0.98), speed(0.75)), model, fp32, build, timer, wider, pair)
    assert kept.plan is wider.model and kept.wider is wider and not kept.float_plan
    assert timed == [[quantize_count(model), quantize_count(wider.model)]]
    assert kept.speed.ratio == pytest.approx(0.65)
    assert f"{len(wider.layers)} thin layer(s) in INT8, where they paid" in kept.speed.text()
    assert "0.72x FP32's time with them float, side by side" in kept.speed.text()


@pytest.mark.parametrize(
    "ratios, errors, timings, why",
    [
        ([(0.72, 0.717)], (0.02, 0.02), 2, "faster by less than THIN_PAYS, in two timings"),
        ([(0.72, 0.69), (0.72, 0.76)], (0.02, 0.02), 2, "faster by 4%, then slower when timed again"),
        ([(0.72, 0.80)], (0.02, 0.02), 1, "slower, clearly: timed once"),
        ([(0.72, 0.60)], (0.02, 0.03), 0, "faster, less faithful: not even timed"),
    ],
)
def test_the_plan_stays_where_the_wider_plan_does_not_pay(
    models: Any, ratios: list[tuple[float, float]], errors: tuple[float, float], timings: int, why: str
) -> None:
    model, wider, fp32 = models
    assert 0.717 * THIN_PAYS >= 0.72  # the first case is within the margin
    build, timer, pair, timed = world(model, *ratios, errors=errors)
    first = Candidate(model, checked(1 - errors[0]), speed(0.75))
    kept = keep_faster(first, model, fp32, build, timer, wider, pair)
    assert kept is first, why
    assert "thin layer" not in kept.speed.text()
    assert len(timed) == timings, why


def test_a_close_gain_is_confirmed_by_a_second_timing(models: Any) -> None:
    model, wider, fp32 = models
    build, timer, pair, timed = world(model, (0.72, 0.70), (0.72, 0.69))  # 3% and 4%: within NOISE, then confirmed
    kept = keep_faster(Candidate(model, checked(0.98), speed(0.75)), model, fp32, build, timer, wider, pair)
    assert kept.wider is wider and len(timed) == 2


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tiny_model_with_images(tmp_path_factory.mktemp("thin"), 10)
    onnx.save_model(islands(batch=1), root / "islands.onnx")
    return root


def test_a_build_records_the_thin_layers_it_took_into_int8(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counts: list[int] = []

    def timed(self: CpuBackend, plans: Any, fp32: onnx.ModelProto, feeds: Any) -> list[Speed]:
        found = [quantize_count(onnx.load_from_string(plan.sections["onnx"])) for plan in plans]
        counts.extend(found)
        return [speed(0.8 if count > counts[0] else 0.9) for count in found]  # the wider plan (more pairs): faster

    monkeypatch.setattr(CpuBackend, "_timed", timed)
    data, preset = DataConfig(sources=(str(workdir / "images"),)), PreprocessConfig(preset="imagenet")
    result = build_plan(workdir / "islands.onnx", BuildConfig(backend="cpu", data=data, preprocess=preset))
    quant = result.plan.metadata.quant
    assert quant is not None and result.verification is not None and result.verification.ok
    assert "thin layer(s) in INT8, where they paid" in result.speed.text()
    assert not any("channels" in why for why in quant.float_layers.values())  # every thin layer moved to INT8
    assert len(quant.int8_layers) == len(set(quant.int8_layers)) == 7  # 3 wide convs and 4 thin layers
    assert set(quant.bias_corrected_layers) <= set(quant.int8_layers)  # the wider model's corrections
    thin = {"conv_1", "conv_3", "conv_4", "gemm_1"}  # under the 16-channel minimum
    assert thin <= set(quant.int8_layers) and set(quant.bias_corrected_layers) & thin
    plan_model = onnx.load_from_string(result.plan.sections["onnx"])
    assert quantize_count(plan_model) > counts[0]
