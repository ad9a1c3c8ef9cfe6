"""The OpenVINO backend (issue #44): a build verified on OpenVINO's kernels, its runner through `trtopt.Engine`,
the refusal where OpenVINO is missing, its Q/DQ forms, and `--backend auto`'s measured choice (injected timings)."""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
import pytest
from model_files import tiny_model_with_images
from require_optional import missing

pytest.importorskip("openvino", reason=missing("openvino", "the OpenVINO backend"))

from trtopt import auto_backend as auto  # noqa: E402
from trtopt.backend import get_backend  # noqa: E402
from trtopt.backend.base import RunOptions  # noqa: E402
from trtopt.backend.openvino import builder  # noqa: E402
from trtopt.backend.openvino.options import SECTION_CONFIG  # noqa: E402
from trtopt.backend.openvino.runner import create_runner  # noqa: E402
from trtopt.build import BuildConfig, build_plan  # noqa: E402
from trtopt.data import DataConfig  # noqa: E402
from trtopt.engine import Engine  # noqa: E402
from trtopt.errors import BackendUnavailableError, TrtoptError  # noqa: E402
from trtopt.plan import read_plan, write_plan  # noqa: E402
from trtopt.quant import QuantConfig  # noqa: E402
from trtopt.quant.config import DEFAULT_MIN_CHANNELS  # noqa: E402
from trtopt.verify.verified import reference_runner  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """tiny_cnn built INT8 for OpenVINO from 16 images (8 held back to verify): (plan path, build result)."""
    root = tiny_model_with_images(tmp_path_factory.mktemp("openvino"), 16)
    config = BuildConfig(backend="openvino", data=DataConfig(sources=(str(root / "images"),)))
    result = build_plan(root / "tiny.onnx", config)
    return write_plan(result.plan, root / "tiny.engine"), result


def feeds(plan_path: Path, batch: int = 2) -> dict[str, np.ndarray]:
    plan = read_plan(plan_path)
    return auto.made_up_feeds(plan, batch)


def test_the_plan_verifies_on_openvino_and_reports_its_layer_precisions(built: tuple[Path, Any]) -> None:
    path, result = built
    assert result.plan.backend == "openvino"
    assert result.verification is not None and result.verification.ok
    assert result.verification.variant in builder.FORMS
    assert result.plan.versions["openvino"]
    report = result.report
    assert report is not None and report.int8_layers + report.float_layers > 0
    assert ("OpenVINO layers", report.rows()[0][1]) == report.rows()[0]
    assert set(read_plan(path).sections) >= {"onnx", SECTION_CONFIG}


def test_engine_runs_the_plan_as_its_q_dq_reference_says_from_many_threads(built: tuple[Path, Any]) -> None:
    path, _ = built
    engine = Engine.load(path, threads=1)
    inputs = feeds(path)
    expected = reference_runner(engine.plan.sections["onnx"])(inputs)
    once = engine.infer(inputs)
    for name, value in expected.items():
        assert once[name].shape == value.shape
        rel = np.linalg.norm(once[name] - value) / max(np.linalg.norm(value), 1e-12)
        assert rel < 0.25  # the build's cap on kernels against the reference (trtopt.verify.KERNEL_CAP)
    outputs: list[dict[str, np.ndarray]] = []
    threads = [threading.Thread(target=lambda: outputs.extend(engine.infer(inputs) for _ in range(3)))
               for _ in range(4)]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(outputs) == 12
    for result in outputs:
        for name, value in once.items():
            np.testing.assert_array_equal(result[name], value)


def test_the_runner_reads_the_callers_arrays_in_place_and_hands_back_its_own_outputs(built: tuple[Path, Any]) -> None:
    """The runner passes the caller's arrays to OpenVINO without a copy (share_inputs): read-only and strided
    arrays run as contiguous ones do, the caller's arrays are not written, and an output stays as it was when the
    caller then overwrites its input and calls again."""
    path, _ = built
    engine = Engine.load(path, threads=1)
    inputs = feeds(path)
    kept = {name: value.copy() for name, value in inputs.items()}
    expected = engine.infer(inputs)
    for value in inputs.values():
        value.setflags(write=False)
    strided = {name: np.repeat(value, 2, axis=-1)[..., ::2] for name, value in kept.items()}
    assert not any(value.flags.c_contiguous for value in strided.values())
    for variant in (inputs, strided):
        for name, value in engine.infer(variant).items():
            np.testing.assert_array_equal(value, expected[name])
    for name, value in inputs.items():
        np.testing.assert_array_equal(value, kept[name])
    reused = {name: value.copy() for name, value in kept.items()}
    first = engine.infer(reused)
    for value in reused.values():
        value[...] = 0
    engine.infer(reused)
    for name, value in first.items():
        np.testing.assert_array_equal(value, expected[name])


def test_a_plan_refuses_to_load_where_openvino_is_missing(built: tuple[Path, Any],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    path, _ = built
    monkeypatch.setitem(sys.modules, "openvino", None)  # `import openvino` raises ImportError
    status = get_backend("openvino").status()
    assert not status.available and "not installed" in status.reason
    with pytest.raises(BackendUnavailableError) as caught:
        Engine.load(path)
    assert "pip install" in (caught.value.fix or "") and "openvino" in caught.value.what


def test_the_cli_runs_and_benches_the_plan(built: tuple[Path, Any], capsys: pytest.CaptureFixture[str]) -> None:
    from trtopt.cli.main import main

    path, _ = built
    images = path.parent / "images"
    assert main(["run", str(path), str(images / "img00.png"), "--json"]) == 0
    assert main(["bench", str(path), "--iterations", "3", "--warmup", "1", "--threads", "1"]) == 0
    assert "openvino" in capsys.readouterr().out.lower()


def test_the_stem_conv_runs_int8_as_its_q_dq_reference_says(built: tuple[Path, Any]) -> None:
    """OpenVINO quantises layers of every width by default (the 3-channel stem conv too: 10% of a ResNet-18's
    time on OpenVINO, trtopt.backend.openvino); the stem's INT8 kernels compute what its Q/DQ graph says."""
    path, result = built
    model = onnx.load_from_string(read_plan(path).sections["onnx"])
    made_by = {out: node.op_type for node in model.graph.node for out in node.output}
    stem = next(n for n in model.graph.node if n.op_type == "Conv")
    assert made_by.get(stem.input[0]) == "DequantizeLinear" and made_by.get(stem.input[1]) == "DequantizeLinear"
    assert not any("channels" in why for why in result.plan.metadata.quant.float_layers.values())
    stem_only = onnx.utils.Extractor(model).extract_model([model.graph.input[0].name], [stem.output[0]])
    plan = replace(read_plan(path), sections={**read_plan(path).sections, "onnx": stem_only.SerializeToString()})
    inputs = {model.graph.input[0].name: feeds(path, 4)[model.graph.input[0].name]}
    expected = reference_runner(plan.sections["onnx"])(inputs)[stem.output[0]]
    runner = create_runner(plan, RunOptions(threads=1))
    got = runner.infer(inputs)[stem.output[0]]
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 0.02  # a rounding step here and there


def test_openvino_quantises_every_width_unless_told() -> None:
    from trtopt.quant import QuantConfig
    from trtopt.quant.config import DEFAULT_MIN_CHANNELS

    openvino, cpu = get_backend("openvino"), get_backend("cpu")
    assert openvino.quant_config(QuantConfig()).channels == 1
    assert openvino.quant_config(QuantConfig(min_channels=16)).channels == 16  # --min-channels 16 is kept
    assert cpu.quant_config(QuantConfig()).channels == DEFAULT_MIN_CHANNELS == 16  # the other backends' as before


def test_forms_follow_what_the_cpu_kind_computes_exactly() -> None:
    assert builder.candidate_forms("auto", "avx512_vnni") == ["lowered"]
    assert builder.candidate_forms("auto", "amx") == ["lowered"]
    assert builder.candidate_forms("auto", "avx2") == ["lowered-pairs", "lowered-w7"]
    assert builder.candidate_forms("auto", "arm64") == ["lowered", "lowered-pairs", "lowered-w7"]
    assert builder.candidate_forms("qdq", "avx2") == ["qdq"]


def test_seven_bit_weights_halve_dense_weights_and_leave_depthwise_ones() -> None:
    """A dense conv's int8 weights go to [-64, 63] at twice the scale; a depthwise conv's stay 8-bit::

        x ─ Q/DQ ─ Conv 8->8 (dense, int8 weights) ─ Conv group 8 (depthwise, int8 weights) ─ y
    """
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    dense = numpy_helper.from_array(rng.integers(-127, 128, (8, 8, 1, 1)).astype(np.int8), "wd")
    depthwise = numpy_helper.from_array(rng.integers(-127, 128, (8, 1, 3, 3)).astype(np.int8), "ww")
    inits = [dense, depthwise, numpy_helper.from_array(np.full(8, 0.01, np.float32), "sd"),
             numpy_helper.from_array(np.full(8, 0.02, np.float32), "sw")]  # fmt: skip
    nodes = [helper.make_node("DequantizeLinear", ["wd", "sd"], ["fd"], axis=0),
             helper.make_node("DequantizeLinear", ["ww", "sw"], ["fw"], axis=0),
             helper.make_node("Conv", ["x", "fd"], ["h"], name="dense"),
             helper.make_node("Conv", ["h", "fw"], ["y"], name="dw", group=8, pads=[1, 1, 1, 1])]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4, 4])], inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    before = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert builder.seven_bit_weights(model) == 1
    after = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert after["wd"].min() >= -64 and after["wd"].max() <= 63
    np.testing.assert_allclose(after["sd"], before["sd"] * 2)
    assert np.abs(after["wd"] * after["sd"][:, None, None, None] - before["wd"] * before["sd"][:, None, None, None]
                  ).max() <= 0.75 * 0.02 + 1e-7  # at most 0.75 of a 7-bit step from the 8-bit value  # fmt: skip
    np.testing.assert_array_equal(after["ww"], before["ww"])
    onnx.checker.check_model(model)


def test_auto_keeps_the_faster_of_equally_faithful_plans() -> None:
    name, why = auto.choose([auto.Candidate("cpu", 10.0, 0.05), auto.Candidate("openvino", 8.0, 0.055)], 8)
    assert name == "openvino" and "kept the fastest" in why and "batch 8" in why


def test_auto_does_not_keep_a_faster_plan_that_is_less_faithful() -> None:
    name, why = auto.choose([auto.Candidate("cpu", 10.0, 0.05), auto.Candidate("openvino", 5.0, 0.15)], 1)
    assert name == "cpu" and "not as faithful" in why and "openvino" in why


def test_auto_holds_int8_plans_to_the_most_faithful_int8_plan_not_to_a_float_plan() -> None:
    """A backend on which INT8 did not pay writes a float plan (error None): it is faithful by definition, and the
    INT8 plans are held to each other's errors, not to its 0 (MobileNetV3-Small: a slower float plan was kept)."""
    name, why = auto.choose([auto.Candidate("cpu", 2.1, 0.016), auto.Candidate("openvino", 3.6, None)], 8)
    assert name == "cpu" and "not as faithful" not in why and "openvino (float plan) 3.6 ms" in why
    assert auto.choose([auto.Candidate("cpu", 5.0, 0.016), auto.Candidate("openvino", 3.6, None)], 8)[0] == "openvino"
    name, why = auto.choose([auto.Candidate("cpu", 5.0, 0.01), auto.Candidate("openvino", 2.0, 0.05),
                             auto.Candidate("x", 9.0, None)], 8)  # fmt: skip
    assert name == "cpu" and "openvino's INT8 error to FP32 0.050 against 0.010" in why
    assert auto.refused_faster([auto.Candidate("cpu", 2.1, 0.016), auto.Candidate("openvino", 3.6, None)], "cpu") == []


def test_auto_keeps_the_first_ranked_within_the_noise() -> None:
    name, why = auto.choose([auto.Candidate("cpu", 10.0, 0.05), auto.Candidate("openvino", 9.9, 0.05)], 1)
    assert name == "cpu" and "no other as faithful" in why
    name, why = auto.choose([auto.Candidate("cpu", 10.0, 0.05), auto.Candidate("openvino", 12.0, 0.05)], 1)
    assert name == "cpu" and why.endswith("kept the fastest, cpu"), "slower, not merely within the noise"
    with pytest.raises(TrtoptError):
        auto.choose([], 1)


def test_auto_times_only_cpu_runtimes_and_those_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(auto.ENVIRONMENT, "")
    assert [b.name for b in auto.measured_backends()] == ["cpu", "openvino"]
    monkeypatch.setenv(auto.ENVIRONMENT, "cpu")
    assert [b.name for b in auto.measured_backends()] == ["cpu"]
    monkeypatch.setattr(auto, "select_backend", lambda name: (get_backend("tensorrt"), "tensorrt"))
    monkeypatch.setenv(auto.ENVIRONMENT, "")
    assert auto.measured_backends() == []  # a GPU with TensorRT: auto takes it, nothing is timed


class NamedPlan(str):
    """A backend's name standing in for its plan; `metadata.quant` set: an INT8 plan (None: a float plan)."""

    metadata = SimpleNamespace(quant="int8")


@dataclass
class FakeResult:
    plan: Any
    verification: Any
    backend_reason: str = ""


def test_build_fastest_builds_each_runtime_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(auto.ENVIRONMENT, "")
    built: list[str] = []

    def build(name: str) -> FakeResult:
        built.append(name)
        error = {"cpu": 0.05, "openvino": 0.052}[name]
        verification = SimpleNamespace(reference_vs_fp32=SimpleNamespace(rel_error=error))
        return FakeResult(NamedPlan(name), verification)

    monkeypatch.setattr(auto, "time_plans", lambda plans, batch, threads=1: {"cpu": 12.0, "openvino": 7.0})
    monkeypatch.setattr(auto, "_timed_batch", lambda plan, batch: batch)  # the plans here are names, not plans
    result: Any = auto.build_fastest(build, 8)
    assert built == ["cpu", "openvino"]
    assert result.plan == "openvino" and result.backend_reason.startswith("openvino (auto: timed")


def test_auto_judges_a_dynamic_batch_at_batch_1_and_the_build_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keras MobileNetV2 on an avx2 EPYC: OpenVINO 4% faster at batch 8, 25% slower at batch 1; the CPU plan wins."""
    monkeypatch.setenv(auto.ENVIRONMENT, "")
    timed: list[int] = []

    def time_plans(plans: Any, batch: int, threads: int | None = 1) -> dict[str, float]:
        timed.append(batch)
        return {"cpu": 10.0, "openvino": 12.5} if batch == 1 else {"cpu": 60.0, "openvino": 57.6}

    def build(name: str) -> FakeResult:
        return FakeResult(NamedPlan(name), SimpleNamespace(reference_vs_fp32=SimpleNamespace(rel_error=0.05)))

    monkeypatch.setattr(auto, "time_plans", time_plans)
    monkeypatch.setattr(auto, "timed_threads", lambda: (1,))
    monkeypatch.setattr(auto, "_timed_batch", lambda plan, batch: batch)  # a dynamic batch
    result: Any = auto.build_fastest(build, 8)
    assert timed == [1, 8] and result.plan == "cpu"
    assert "timed at batch 1 and 8" in result.backend_reason and "cpu 10.0 / 60.0 ms" in result.backend_reason
    assert "geometric mean" in result.backend_reason
    timed.clear()
    monkeypatch.setattr(auto, "_timed_batch", lambda plan, batch: 4)  # a fixed batch of 4: timed once, at 4
    auto.build_fastest(build, 8)
    assert timed == [4]


def test_auto_times_on_one_thread_and_on_all_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """YOLOv8n (AVX-512 VNNI EPYC): the CPU plan 6% faster on one thread, OpenVINO's 23% faster on both cores, which
    `trtopt run` uses unless told; judged on both, OpenVINO's is kept."""
    monkeypatch.setenv(auto.ENVIRONMENT, "")
    timed: list[tuple[int, int | None]] = []

    def time_plans(plans: Any, batch: int, threads: int | None = 1) -> dict[str, float]:
        timed.append((batch, threads))
        return {"cpu": 10.0, "openvino": 10.6} if threads == 1 else {"cpu": 12.7, "openvino": 9.8}

    def build(name: str) -> FakeResult:
        return FakeResult(NamedPlan(name), SimpleNamespace(reference_vs_fp32=SimpleNamespace(rel_error=0.05)))

    monkeypatch.setattr(auto, "time_plans", time_plans)
    monkeypatch.setattr(auto, "_timed_batch", lambda plan, batch: 1)  # a static batch of 1
    monkeypatch.setattr(auto.os, "cpu_count", lambda: 2)
    result: Any = auto.build_fastest(build, 8)
    assert timed == [(1, 1), (1, None)] and result.plan == "openvino"
    assert "timed at batch 1, 1 thread then all 2 cores: cpu 10.0 ms and 12.7 ms" in result.backend_reason
    timed.clear()
    monkeypatch.setattr(auto.os, "cpu_count", lambda: 1)  # one core: one thread count to time
    assert auto.build_fastest(build, 8).plan == "cpu" and timed == [(1, 1)]


def test_auto_build_failures(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A backend whose build fails is left out with a warning; where every build fails (a missing model file fails
    each the same way) the first failure is raised alone, with no warning per backend before it."""
    import logging
    monkeypatch.setenv(auto.ENVIRONMENT, "")

    def build(name: str) -> FakeResult:
        if name == "openvino" or absent:
            raise TrtoptError(f"{name}: Model file 'm.onnx' does not exist.", fix="Check the path.")
        return FakeResult(NamedPlan(name), SimpleNamespace(reference_vs_fp32=SimpleNamespace(rel_error=0.05)))

    absent = False
    with caplog.at_level(logging.WARNING):
        assert auto.build_fastest(build, 8).plan == "cpu"
    assert [r.getMessage() for r in caplog.records] == ["--backend auto: the openvino build was left out: openvino: "
                                                        "Model file 'm.onnx' does not exist."]
    caplog.clear()
    absent = True
    with caplog.at_level(logging.WARNING), pytest.raises(TrtoptError, match="^cpu: Model file"):
        auto.build_fastest(build, 8)
    assert caplog.records == []


def test_auto_says_each_build_warning_once(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Both builds load the same model: the opset conversion note was printed once per runtime (six times in a
    benchmark log); a warning about one runtime's build still appears."""
    import logging
    monkeypatch.setenv(auto.ENVIRONMENT, "")

    def build(name: str) -> FakeResult:
        logging.getLogger("trtopt.frontend.opset").warning("m.onnx uses ONNX opset 9; converted it to opset 13")
        logging.getLogger("trtopt.build").warning("only the %s build says this", name)
        return FakeResult(NamedPlan(name), SimpleNamespace(reference_vs_fp32=SimpleNamespace(rel_error=0.05)))

    monkeypatch.setattr(auto, "time_plans", lambda plans, batch, threads=1: {"cpu": 12.0, "openvino": 7.0})
    monkeypatch.setattr(auto, "_timed_batch", lambda plan, batch: batch)
    with caplog.at_level(logging.WARNING):
        auto.build_fastest(build, 8)
        logging.getLogger("trtopt.frontend.opset").warning("m.onnx uses ONNX opset 9; converted it to opset 13")
    said = [r.getMessage() for r in caplog.records]
    assert said.count("m.onnx uses ONNX opset 9; converted it to opset 13") == 2  # once in auto, once after it
    assert "only the cpu build says this" in said and "only the openvino build says this" in said


def test_auto_rebuilds_a_faster_less_faithful_plan_with_narrow_layers_float(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo on an AVX-512 VNNI EPYC: OpenVINO's plan (stem conv INT8) 1.2x faster than the CPU plan, INT8 error
    0.084 against 0.054; rebuilt with the stem float, 0.054 and still faster: kept."""
    monkeypatch.setenv(auto.ENVIRONMENT, "")
    errors = {"cpu": 0.054, "openvino": 0.084}
    built: list[str] = []

    def result(name: str, quant: Any = None) -> FakeResult:
        if quant is not None:  # the second build: the CPU backend's width rule
            assert quant.min_channels == DEFAULT_MIN_CHANNELS
            built.append(name)
            errors[name] = 0.054 if narrowing else errors[name]
        return FakeResult(NamedPlan(name), SimpleNamespace(reference_vs_fp32=SimpleNamespace(rel_error=errors[name])))

    monkeypatch.setattr(auto, "time_plans", lambda plans, batch, threads=1: {"cpu": 32.0, "openvino": 27.0})
    monkeypatch.setattr(auto, "_timed_batch", lambda plan, batch: 8)
    narrowing = True
    kept: Any = auto.build_fastest(result, 8, QuantConfig())
    assert built == ["openvino"] and kept.plan == "openvino"
    assert "rebuilt with its layers narrower" in kept.backend_reason and "0.084" in kept.backend_reason
    errors.update(cpu=0.054, openvino=0.084)
    built.clear()
    monkeypatch.setattr(auto, "time_plans", lambda plans, batch, threads=1: {"cpu": 32.0, "openvino": 40.0})
    assert auto.build_fastest(result, 8, QuantConfig()).plan == "cpu" and built == []  # slower: no second build
    monkeypatch.setattr(auto, "time_plans", lambda plans, batch, threads=1: {"cpu": 32.0, "openvino": 27.0})
    assert auto.build_fastest(result, 8, QuantConfig(min_channels=1)).plan == "cpu" and built == []  # the user's
    narrowing = False
    kept = auto.build_fastest(result, 8, QuantConfig())  # the second build no more faithful: the CPU plan
    assert built == ["openvino"] and kept.plan == "cpu" and "not as faithful" in kept.backend_reason
