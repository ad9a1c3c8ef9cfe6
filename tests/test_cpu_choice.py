"""A CPU plan is never slower than the float model (issue #45): INT8 regions (trtopt.backend.cpu.regions) and the
choice among the INT8 plan, its regions in float and the float plan (trtopt.backend.cpu.choice), with injected
timings: no test here depends on how fast anything runs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from model_files import tiny_model_with_images
from quant_helpers import cosine, cpu_config, feeds_for, quantize

from trtopt.backend.cpu import choice as choice_module
from trtopt.backend.cpu.backend import CpuBackend
from trtopt.backend.cpu.builder import kernel_report
from trtopt.backend.cpu.choice import MAX_TRIALS, USELESS_COSINE, Candidate, keep_faster
from trtopt.backend.cpu.lowering import lower_for_cpu
from trtopt.backend.cpu.options import CpuOptions
from trtopt.backend.cpu.regions import float_regions, int8_regions
from trtopt.backend.cpu.speed import Speed
from trtopt.build import BuildConfig, build_plan
from trtopt.cli.summaries import FLOAT_FALLBACK, build_summary, verification_text
from trtopt.data import DataConfig, PreprocessConfig
from trtopt.frontend import graph_from_onnx, onnx_from_graph
from trtopt.metrics.agreement import Agreement
from trtopt.passes import optimize
from trtopt.plan import write_plan
from trtopt.plan.verification import Verification
from trtopt.quant import QuantConfig

SPEED_CHOICE = True  # conftest leaves the choice on in this module


def speed(ratio: float) -> Speed:
    return Speed(10.0, 10.0 * ratio, 5, 1, "this avx2 CPU")


def islands(batch: int = 2) -> onnx.ModelProto:
    """INT8 islands between convs under the 16-channel minimum, as in a small emotion classifier::

    input (3ch) ─ Conv3x3 3->16 (float) ─ Conv3x3 16->16 ─ Conv1x1 16->4 (float) ─ Conv3x3 4->16 (float)
      ─ Conv3x3 16->32 ─ Conv3x3 32->32 ─ GlobalAveragePool ─ Flatten ─ Gemm 32->10 ─ logits
    """
    from trtopt.zoo.builder import GraphBuilder

    b = GraphBuilder("islands", seed=0)
    y = b.conv_bn(b.input("input", [batch, 3, 16, 16]), 3, 16, 3)
    y = b.conv_bn(b.conv_bn(b.conv_bn(y, 16, 16, 3), 16, 4, 1), 4, 16, 3)
    y = b.conv_bn(b.conv_bn(y, 16, 32, 3), 32, 32, 3)
    return b.build([b.gemm(b.pool_flatten(y), 32, 10, out="logits")])


@pytest.fixture(scope="module")
def tiny() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """`islands` quantised for the CPU with the 16-channel minimum: two INT8 regions (the 16->16 conv; the
    two wide convs, with the pool on the integer grid and the Gemm, float under the minimum with its 10 outputs,
    reading the pooled vector through a pair: `trtopt.quant.gates`)."""
    graph = optimize(graph_from_onnx(islands())).graph
    model, _, _ = quantize(graph, cpu_config(QuantConfig(min_channels=16)))
    return model, onnx_from_graph(graph)


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], optimized: bool = True) -> np.ndarray:
    options = ort.SessionOptions()
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def test_regions_split_the_int8_layers_and_float_regions_runs_them_in_float(tiny: Any) -> None:
    model, fp32 = tiny
    regions = int8_regions(model)
    layers = [name for r in regions for name in r.layers]
    assert [len(r.layers) for r in regions] == [1, 3] and len(layers) == len(set(layers))  # disjoint
    assert [r.int8_kernels for r in regions] == [False, True]  # the lone conv has no INT8 reader: no kernel, first
    assert [r.weights for r in regions] == sorted(r.weights for r in regions)  # then smallest first
    feeds = feeds_for(optimize(graph_from_onnx(islands())).graph)
    everything = float_regions(model, regions)
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in everything.graph.node)
    assert cosine(run(everything, feeds), run(fp32, feeds)) > 0.9999  # float math on the INT8 weights' values
    assert len(model.graph.node) > len(everything.graph.node)  # the input model is left as it was


def test_a_region_in_float_leaves_the_rest_exact_and_int8(tiny: Any) -> None:
    """One region in float: ONNX Runtime's kernels (u8u8, exact on every x86 CPU) still compute the lowered Q/DQ
    graph. The lone 16->16 conv has no INT8 reader, so ONNX Runtime ran it in float on dequantised weights behind
    a Q/DQ pair (pure overhead); in float it loses the pair. The two wide convs stop running as QLinearConv."""
    model, _ = tiny
    lone, wide = int8_regions(model)
    feeds = feeds_for(optimize(graph_from_onnx(islands())).graph)
    before = kernel_report(lower_for_cpu(model, encoding="u8u8").SerializeToString())
    assert before.dequantized == lone.layers and before.int8_convs == 2
    for region, int8_convs, dequantized in ((lone, 2, ()), (wide, 0, lone.layers)):
        lowered = lower_for_cpu(float_regions(model, [region]), encoding="u8u8")
        after = kernel_report(lowered.SerializeToString())
        assert after.int8_convs == int8_convs and after.dequantized == dequantized
        assert after.ops["QuantizeLinear"] < before.ops["QuantizeLinear"]
        kernels, reference = run(lowered, feeds), run(lowered, feeds, optimized=False)
        assert np.linalg.norm(kernels - reference) / np.linalg.norm(reference) < 0.02


def trial_world(ratios: dict[int, float], again: float | None = None) -> tuple[Any, Any, list[str]]:
    """A build and a timer whose plans are the models themselves, timed by how many Q nodes they keep: `ratios`
    maps that count to a time ratio (unknown counts: 1.5); `again` is the confirming timing's ratio."""
    calls: list[str] = []

    def build(model: onnx.ModelProto) -> tuple[Any, Any]:
        calls.append("build")
        return model, "verified"

    def timer(plan: onnx.ModelProto) -> Speed:
        calls.append("time")
        count = sum(n.op_type == "QuantizeLinear" for n in plan.graph.node)
        if again is not None and calls.count("time") > 1 and count == 0:
            return speed(again)
        return speed(ratios.get(count, 1.5))

    return build, timer, calls


def quantize_count(model: onnx.ModelProto) -> int:
    return sum(n.op_type == "QuantizeLinear" for n in model.graph.node)


def test_a_plan_faster_than_fp32_is_kept_without_trials(tiny: Any) -> None:
    model, fp32 = tiny
    build, timer, calls = trial_world({})
    first = Candidate(model, "verified", speed(0.7))
    assert keep_faster(first, model, fp32, build, timer) is first and calls == []


def test_a_region_that_pays_in_float_stays_float(tiny: Any) -> None:
    model, fp32 = tiny
    regions = int8_regions(model)
    cheaper = quantize_count(float_regions(model, regions[:1]))
    build, timer, _ = trial_world({cheaper: 0.8})
    kept = keep_faster(Candidate(model, "verified", speed(1.3)), model, fp32, build, timer)
    assert not kept.float_plan and kept.kept_float == regions[0].layers and kept.speed.ratio == pytest.approx(0.8)
    assert "kept float, where INT8 did not pay on this CPU (the all-INT8 plan took 1.30x" in kept.speed.text()


def test_a_gain_within_the_margin_is_not_taken(tiny: Any) -> None:
    model, fp32 = tiny
    cheaper = quantize_count(float_regions(model, int8_regions(model)[:1]))
    build, timer, _ = trial_world({cheaper: 0.95})
    kept = keep_faster(Candidate(model, "verified", speed(0.9)), model, fp32, build, timer)
    assert kept.kept_float == () and kept.speed.ratio == pytest.approx(0.9)  # clearly faster than FP32: no trial
    build, timer, _ = trial_world({cheaper: 0.97, quantize_count(model): 0.98})
    kept = keep_faster(Candidate(model, "verified", speed(0.99)), model, fp32, build, timer)
    assert kept.kept_float == () and not kept.float_plan and kept.plan is model
    build, timer, _ = trial_world({cheaper: 0.99, quantize_count(model): 0.9})
    kept = keep_faster(Candidate(model, "verified", speed(1.01)), model, fp32, build, timer)
    assert kept.kept_float == () and not kept.float_plan and kept.plan is model  # 0.99 x PAYS > 1.01; 0.9: faster


def test_a_plan_faster_within_the_noise_is_timed_again(tiny: Any) -> None:
    """0.99x FP32's time once: kept where a second timing agrees, tried cheaper where it says 1.5x."""
    model, fp32 = tiny
    build, timer, calls = trial_world({quantize_count(model): 0.98})
    kept = keep_faster(Candidate(model, "verified", speed(0.99)), model, fp32, build, timer)
    assert kept.plan is model and not kept.float_plan and calls == ["time"] and kept.speed.ratio == pytest.approx(0.99)
    build, timer, calls = trial_world({})
    kept = keep_faster(Candidate(model, "verified", speed(0.99)), model, fp32, build, timer)
    assert kept.float_plan and kept.plan is fp32 and calls[:2] == ["time", "build"]
    assert kept.speed.ratio == pytest.approx(1.5)  # judged by the slower timing


def test_an_int8_plan_as_fast_as_fp32_within_the_noise_gives_way_to_the_float_plan(tiny: Any) -> None:
    """As fast, not faster (1.02x and 1.01x FP32's time): the float plan costs nothing in speed and is exact."""
    model, fp32 = tiny
    build, timer, _ = trial_world({}, again=1.01)
    kept = keep_faster(Candidate(model, "verified", speed(1.02)), model, fp32, build, timer)
    assert kept.float_plan and kept.plan is fp32


def test_where_int8_pays_nowhere_the_float_plan_is_written(tiny: Any) -> None:
    model, fp32 = tiny
    build, timer, calls = trial_world({}, again=1.4)
    kept = keep_faster(Candidate(model, "verified", speed(1.5)), model, fp32, build, timer)
    assert kept.float_plan and kept.plan is fp32 and kept.kept_float == ()
    assert calls.count("build") == min(MAX_TRIALS, len(int8_regions(model)) - 1) + 1  # never every region
    text = kept.speed.text()
    assert "the float plan is the faster on this avx2 CPU" in text and "1.50x and 1.50x" in text
    assert "without VNNI or AMX" in text


def checked(cosine: float) -> Verification:
    """A verification record whose Q/DQ reference has `cosine` with FP32 on its worst output."""
    return Verification(samples=8, source="held back", isa="avx2", variant="u8s8p",
                        reference_vs_fp32=Agreement(cosine, 1.0 - cosine, None),
                        kernels_vs_reference=Agreement(0.9999, 0.01, None), tolerance=0.25)  # fmt: skip


def test_an_int8_plan_unrelated_to_fp32_gives_way_to_the_float_plan_however_fast(tiny: Any) -> None:
    """A MobileNetV3 with random weights returned zeros at 1.2x FP32's speed: no timing keeps such a plan."""
    model, fp32 = tiny
    build, timer, calls = trial_world({})
    kept = keep_faster(Candidate(model, checked(0.0), speed(0.6)), model, fp32, build, timer)
    assert kept.float_plan and kept.plan is fp32 and calls == ["build"]
    assert "nothing in common with FP32's" in kept.speed.text() and "cosine 0.000" in kept.speed.text()
    build, timer, calls = trial_world({})
    kept = keep_faster(Candidate(model, checked(USELESS_COSINE + 0.1), speed(0.6)), model, fp32, build, timer)
    assert not kept.float_plan and kept.plan is model and calls == []  # far from FP32 is a warning, not this


def test_a_confirming_timing_that_finds_int8_faster_keeps_it(tiny: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    model, fp32 = tiny
    monkeypatch.setattr(choice_module, "MAX_TRIALS", 0)
    calls: list[str] = []
    timings = iter([speed(0.9)])
    kept = keep_faster(Candidate(model, "verified", speed(1.2)), model, fp32, lambda m: calls.append("b"),  # type: ignore[arg-type,return-value]
                       lambda p: next(timings))  # fmt: skip
    assert not kept.float_plan and kept.plan is model and calls == []
    assert kept.speed.ratio == pytest.approx(0.9) and "after 1.20x" in kept.speed.text()


def test_a_confirming_timing_faster_only_within_the_noise_writes_the_float_plan(
    tiny: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1.05x, then 0.99x FP32's time: as fast, not faster; the float plan costs nothing and is exact."""
    model, fp32 = tiny
    monkeypatch.setattr(choice_module, "MAX_TRIALS", 0)
    timings = iter([speed(0.99)])
    kept = keep_faster(Candidate(model, "verified", speed(1.05)), model, fp32, lambda m: (fp32, "verified"),
                       lambda p: next(timings))  # fmt: skip
    assert kept.float_plan and kept.plan is fp32


def test_trials_that_fail_to_verify_are_skipped(tiny: Any) -> None:
    model, fp32 = tiny
    built: list[onnx.ModelProto] = []

    def build(candidate: onnx.ModelProto) -> tuple[Any, Any] | None:
        built.append(candidate)
        return None  # no variant verified

    kept = keep_faster(Candidate(model, "verified", speed(1.5)), model, fp32, build, lambda p: speed(1.5))
    assert kept.plan is model and not kept.float_plan and built[-1] is fp32


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tiny_model_with_images(tmp_path_factory.mktemp("choice"), 10)
    onnx.save_model(islands(batch=1), root / "islands.onnx")
    return root


def build_with(workdir: Path, monkeypatch: pytest.MonkeyPatch, ratio: Any, model: str = "tiny.onnx") -> Any:
    """A CPU build of `model` whose timings come from `ratio(plan_onnx) -> float`, with the 16-channel minimum that
    `islands` is built around said explicitly."""

    def timed(self: CpuBackend, plans: Any, fp32: onnx.ModelProto, feeds: Any) -> list[Speed]:
        return [speed(ratio(onnx.load_from_string(plan.sections["onnx"]))) for plan in plans]

    monkeypatch.setattr(CpuBackend, "_timed", timed)
    data, preset = DataConfig(sources=(str(workdir / "images"),)), PreprocessConfig(preset="imagenet")
    quant = QuantConfig(min_channels=16)
    return build_plan(workdir / model, BuildConfig(backend="cpu", data=data, preprocess=preset, quant=quant))


def test_a_build_writes_the_float_plan_where_int8_is_slower(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = build_with(workdir, monkeypatch, lambda plan: 1.6 if quantize_count(plan) else 1.0)
    plan = result.plan
    assert plan.metadata.precision == "fp32" and plan.metadata.quant is None and not plan.metadata.int8
    assert not any(n.op_type == "QuantizeLinear" for n in onnx.load_from_string(plan.sections["onnx"]).graph.node)
    assert result.verification is not None and result.verification.ok and result.report is None
    assert "the float plan is the faster" in result.speed.text() and result.speed.ratio == pytest.approx(1.6)
    write_plan(plan, workdir / "fallback.engine")
    summary = build_summary(result, workdir / "fallback.engine")
    assert summary["verification"]["reference"] == FLOAT_FALLBACK and summary["int8_layers"] == 0
    assert "the float plan, written instead of the INT8 plan" in verification_text(summary["verification"])
    assert "the float plan is the faster" in summary["speed"]["outcome"]


def test_openvino_builds_write_the_float_plan_where_int8_is_slower(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenVINO plans follow the same rule (`OpenvinoBackend.faster`), and say which runtime's kernels gained little."""
    pytest.importorskip("openvino", reason="the openvino extra is not installed")
    from trtopt.backend.openvino.backend import OpenvinoBackend

    def timed(self: OpenvinoBackend, plans: Any, fp32: onnx.ModelProto, feeds: Any) -> list[Speed]:
        counts = [quantize_count(onnx.load_from_string(plan.sections["onnx"])) for plan in plans]
        return [replace(speed(1.6 if count else 1.0), runtime="OpenVINO") for count in counts]

    monkeypatch.setattr(OpenvinoBackend, "_timed", timed)
    data, preset = DataConfig(sources=(str(workdir / "images"),)), PreprocessConfig(preset="imagenet")
    result = build_plan(workdir / "tiny.onnx", BuildConfig(backend="openvino", data=data, preprocess=preset))
    assert result.plan.backend == "openvino" and not result.plan.metadata.int8
    assert "the float plan is the faster" in result.speed.text() and "OpenVINO's INT8 kernels" in result.speed.text()


def test_a_build_keeps_float_the_region_that_does_not_pay(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first: list[int] = []

    def ratio(plan: onnx.ModelProto) -> float:
        first.append(first[0] if first else quantize_count(plan))
        return 1.3 if quantize_count(plan) >= first[0] else 0.7

    result = build_with(workdir, monkeypatch, ratio, "islands.onnx")
    quant = result.plan.metadata.quant
    kept = [name for name, why in quant.float_layers.items() if why.startswith("its INT8 region ran slower")]
    assert kept and not set(kept) & set(quant.int8_layers) and result.plan.metadata.precision == "int8"
    assert "INT8 layer(s) in 1 region(s) kept float" in result.speed.text()
    assert result.verification is not None and result.verification.ok


def test_cpu_builds_leave_out_the_passes_that_cost_on_onnx_runtime(workdir: Path) -> None:
    """fuse_parallel_convs gives ONNX Runtime a Split with Q/DQ of its own between INT8 convs, for no speed
    (CpuBackend's LEFT_OUT_PASSES); a list the user gives is run as given, and `optimize` keeps its default."""
    from trtopt.backend import get_backend
    from trtopt.passes import DEFAULT_ORDER

    cpu = get_backend("cpu")
    assert "fuse_parallel_convs" in DEFAULT_ORDER and "fuse_parallel_convs" not in cpu.passes(None)
    assert cpu.passes(("fuse_parallel_convs",)) == ("fuse_parallel_convs",)
    data, preset = DataConfig(sources=(str(workdir / "images"),)), PreprocessConfig(preset="imagenet")
    config = BuildConfig(backend="cpu", data=data, preprocess=preset, backend_options=(CpuOptions(fallback="off"),))
    result = build_plan(workdir / "tiny.onnx", config)  # the INT8 plan, whatever this machine's timing says
    assert "fuse_parallel_convs" not in result.plan.metadata.optimizer.passes
    assert not any("wide" in name for name in result.plan.metadata.quant.int8_layers)  # tiny_cnn's 1x1 siblings


def test_the_fallback_option_is_checked() -> None:
    from trtopt.errors import UnknownNameError

    assert CpuOptions().fallback == "auto" and CpuOptions(fallback="off").fallback == "off"
    with pytest.raises(UnknownNameError, match="auto, off"):
        CpuOptions(fallback="float")
