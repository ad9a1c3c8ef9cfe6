"""End to end on CPU: build INT8 plans from zoo models and images, load, run, compare, reuse caches."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from model_files import tiny_model_with_images

import trtopt
from trtopt.build import BuildConfig, build_plan
from trtopt.calib import CalibConfig, load_cache, save_cache
from trtopt.data import DataConfig, PreprocessConfig
from trtopt.errors import BackendUnavailableError, CalibrationError, PlanError, ShapeError, TrtoptError
from trtopt.execution import OrtSession
from trtopt.plan import Plan, read_plan, write_plan
from trtopt.quant import QuantConfig
from trtopt.zoo import build_model


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_with_images(tmp_path_factory.mktemp("e2e"), 12)


@pytest.fixture(scope="module")
def built(workdir: Path):  # type: ignore[no-untyped-def]
    config = BuildConfig(
        backend="cpu",
        data=DataConfig(sources=(str(workdir / "images"),)),
        preprocess=PreprocessConfig(preset="imagenet"),
        calib=CalibConfig(save_cache=workdir / "c.json"),
    )
    result = build_plan(workdir / "tiny.onnx", config)
    write_plan(result.plan, workdir / "tiny.engine")
    return result


def _images(workdir: Path) -> list[Path]:
    return sorted((workdir / "images").glob("*.png"))


def test_plan_is_int8_and_self_describing(workdir: Path, built) -> None:  # type: ignore[no-untyped-def]
    plan = read_plan(workdir / "tiny.engine")
    assert plan.backend == "cpu" and set(plan.sections) == {"onnx"}
    assert plan.versions["trtopt"] == trtopt.__version__ and "onnxruntime" in plan.versions
    meta, quant = plan.metadata, plan.metadata.quant
    assert meta.precision == "int8" and quant is not None and quant.samples == 12
    assert meta.preprocess is not None and meta.preprocess["crop"] == [32, 32] and quant.int8_layers
    assert all(t > 0 for t in quant.thresholds.values())
    assert quant.bias_corrected_layers and set(quant.bias_corrected_layers) <= set(quant.int8_layers)
    assert meta.optimizer is not None and meta.optimizer.fusion_groups > 0
    assert meta.optimizer.passes[:2] == ("simplify", "remove_noops")
    float_convs = [n for n in quant.float_layers if n.startswith("conv")]
    assert built.report.float_convs == len(float_convs)  # every quantised conv became QLinearConv
    assert built.report.int8_convs == len([n for n in quant.int8_layers if n.startswith("conv")])


def test_engine_matches_fp32_on_real_inputs(workdir: Path, built) -> None:  # type: ignore[no-untyped-def]
    engine = trtopt.Engine.load(workdir / "tiny.engine")
    batch = engine.preprocess(_images(workdir))
    assert batch.shape == (12, 3, 32, 32) and batch.dtype == np.float32
    reference = OrtSession(build_model("tiny_cnn", seed=1))
    for row in batch:  # the zoo model fixes batch 1
        x = row[None]
        ref, got = reference.run({"input": x})["logits"], engine(x)
        cos = float((ref * got).sum() / np.linalg.norm(ref) / np.linalg.norm(got))
        assert cos > 0.98


def test_engine_is_safe_under_concurrent_load(workdir: Path, built) -> None:  # type: ignore[no-untyped-def]
    """One Engine shared by 8 threads, 25 calls each: every result equals the single-threaded one."""
    engine = trtopt.Engine.load(workdir / "tiny.engine", threads=1)
    inputs = [x[None] for x in engine.preprocess(_images(workdir))]
    expected = [engine(x) for x in inputs]
    failures: list[str] = []

    def worker(seed: int) -> None:
        order = np.random.default_rng(seed).integers(0, len(inputs), 25)
        for i in order:
            if not np.array_equal(engine(inputs[i]), expected[i]):
                failures.append(f"thread {seed} input {i}")

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_engines_without_spinning_threads_compute_the_same(workdir: Path, built) -> None:  # type: ignore[no-untyped-def]
    """`spin=False` (several engines in one process) changes how ONNX Runtime's threads wait, not what they compute;
    the option reaches the runner's session options (`trtopt.execution.ort_session.session_options`, which writes
    it as `session.intra_op.allow_spinning`; the suite's conftest turns spinning off in every session it makes)."""
    from trtopt.backend.cpu import runner

    seen: list[bool] = []
    make = runner.session_options

    def options(**kwargs: Any) -> Any:
        seen.append(kwargs.get("spin", True))
        return make(**kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runner, "session_options", options)
        quiet = trtopt.Engine.load(workdir / "tiny.engine", threads=2, spin=False)
        spinning = trtopt.Engine.load(workdir / "tiny.engine", threads=2)
    assert seen == [False, True]
    x = trtopt.Engine.load(workdir / "tiny.engine").preprocess(_images(workdir))
    assert all(np.array_equal(quiet(row[None]), spinning(row[None])) for row in x)


def test_engine_validates_inputs_once(workdir: Path, built) -> None:  # type: ignore[no-untyped-def]
    engine = trtopt.Engine.load(workdir / "tiny.engine")
    good = np.zeros((1, 3, 32, 32), np.float32)
    with pytest.raises(ShapeError, match="dtype float64"):
        engine(good.astype(np.float64))
    with pytest.raises(ShapeError, match=r"shape \[1, 3, 16, 16\]"):
        engine(np.zeros((1, 3, 16, 16), np.float32))
    with pytest.raises(ShapeError, match="missing"):
        engine.infer({"other": good})
    assert engine.infer({"input": good})["logits"].shape == (1, 10)
    outputs, device_ms = engine.timed_infer({"input": good})  # the CPU runner has no device clock
    assert engine.timing == "host" and device_ms is None and outputs["logits"].shape == (1, 10)


def test_cache_reuse_gives_the_same_plan(workdir: Path, built) -> None:  # type: ignore[no-untyped-def]
    """The same thresholds, Q/DQ and weights from the cache as from the data. Compared in an encoding that reads
    no data: the u8s7 encoding picks its 7-bit layers by measuring on the
    calibration samples, which a cache-only build does not have (it keeps 8-bit weights, exact too)."""
    from dataclasses import replace

    from trtopt.backend.cpu.options import CpuOptions

    cache = load_cache(workdir / "c.json")
    assert cache.amax == pytest.approx(dict(built.calibration.amax))
    u8u8 = (CpuOptions(encoding="u8u8"),)
    from_data = BuildConfig(backend="cpu", data=DataConfig(sources=(str(workdir / "images"),)),
                            preprocess=PreprocessConfig(preset="imagenet"), backend_options=u8u8)  # fmt: skip
    first_build = build_plan(workdir / "tiny.onnx", from_data)
    again = build_plan(workdir / "tiny.onnx", replace(_from_cache(workdir / "c.json"), backend_options=u8u8))
    assert again.qdq.thresholds == built.qdq.thresholds == first_build.qdq.thresholds
    first, second = (onnx.load_model_from_string(r.plan.sections["onnx"]) for r in (first_build, again))
    assert [(n.op_type, list(n.input)) for n in first.graph.node] == [
        (n.op_type, list(n.input)) for n in second.graph.node
    ]
    assert {t.name: t.raw_data for t in first.graph.initializer} == {
        t.name: t.raw_data for t in second.graph.initializer
    }


def test_cache_only_build_says_which_searches_it_could_not_run(workdir: Path, built) -> None:  # type: ignore[no-untyped-def]
    """The sensitivity analysis and the 7-bit search measure on calibration samples: a build from the cache alone
    skips them and records so (the summary's "not measured" row); with the images beside the cache both run, on the
    cache's thresholds. u8s7 asks for the 7-bit search on every CPU kind."""
    from dataclasses import replace

    from trtopt.backend.cpu.options import CpuOptions
    from trtopt.cli.summaries import build_summary, not_measured_text

    u8s7 = (CpuOptions(encoding="u8s7"),)
    cache_only = build_plan(workdir / "tiny.onnx", replace(_from_cache(workdir / "c.json"), backend_options=u8s7))
    assert cache_only.plan.metadata.extra["not_measured"] == ["sensitivity analysis", "7-bit weight search"]
    quant = cache_only.plan.metadata.quant
    assert "seven_bit_weights" not in cache_only.plan.metadata.extra and quant is not None and not quant.sensitivity
    assert "--calib DIR beside --calib-cache" in not_measured_text(["7-bit weight search"])
    with_data = replace(_from_cache(workdir / "c.json"), backend_options=u8s7,
                        data=DataConfig(sources=(str(workdir / "images"),)),
                        preprocess=PreprocessConfig(preset="imagenet"))  # fmt: skip
    both = build_plan(workdir / "tiny.onnx", with_data)
    assert "not_measured" not in both.plan.metadata.extra and "seven_bit_weights" in both.plan.metadata.extra
    assert both.qdq.thresholds == cache_only.qdq.thresholds
    assert "not_measured" not in built.plan.metadata.extra
    write_plan(cache_only.plan, workdir / "cache_only.engine")
    summary = build_summary(cache_only, workdir / "cache_only.engine")
    assert summary["not_measured"] == ["sensitivity analysis", "7-bit weight search"]


def test_bias_correction_needs_channel_means_and_can_be_switched_off(workdir: Path, built) -> None:  # type: ignore[no-untyped-def]
    """A TensorRT cache has thresholds only: the plan is built as before, without bias correction, which
    is exactly what `bias_correction=False` gives from trtopt's cache."""
    save_cache(workdir / "trt.cache", built.calibration, format="tensorrt")
    from_trt = build_plan(workdir / "tiny.onnx", _from_cache(workdir / "trt.cache"))
    switched_off = build_plan(workdir / "tiny.onnx", _from_cache(workdir / "c.json", bias_correction=False))
    assert from_trt.bias is None and switched_off.bias is None and built.bias is not None
    assert from_trt.plan.metadata.quant is not None and from_trt.plan.metadata.quant.bias_corrected_layers == ()
    corrected, from_trt_biases, plain = (_biases(r) for r in (built, from_trt, switched_off))
    assert corrected.keys() == from_trt_biases.keys() == plain.keys()
    for layer, values in plain.items():  # the TensorRT cache rounds thresholds to float32 scales
        np.testing.assert_allclose(from_trt_biases[layer], values, rtol=1e-4, atol=1e-6)
    assert any(not np.allclose(corrected[layer], plain[layer]) for layer in built.bias.corrected)


def _from_cache(cache: Path, *, bias_correction: bool = True) -> BuildConfig:
    quant = QuantConfig(bias_correction=bias_correction)
    return BuildConfig(backend="cpu", calib=CalibConfig(cache=cache), quant=quant)


def _biases(result) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    """Layer name -> the float value of its int32 bias, in a CPU plan."""
    model = onnx.load_model_from_string(result.plan.sections["onnx"])
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    biases = {}
    for node in model.graph.node:
        dq = producers.get(node.input[2]) if node.op_type in ("Conv", "Gemm") and len(node.input) > 2 else None
        if dq is not None and dq.op_type == "DequantizeLinear":
            biases[node.name] = inits[dq.input[0]] * inits[dq.input[1]]
    return biases


def test_cache_for_another_model_is_refused(workdir: Path, built) -> None:  # type: ignore[no-untyped-def]
    onnx.save_model(build_model("resnet_basic"), workdir / "other.onnx")
    with pytest.raises(CalibrationError, match="does not fit this model") as info:
        build_plan(workdir / "other.onnx", _from_cache(workdir / "c.json"))
    assert "another graph" in str(info.value) and info.value.fix  # its equalisation record names the graph it rewrote
    save_cache(workdir / "other.cache", built.calibration, format="tensorrt")  # no record: the thresholds decide
    with pytest.raises(CalibrationError, match="does not fit this model") as info:
        build_plan(workdir / "other.onnx", _from_cache(workdir / "other.cache"))
    assert "no threshold" in str(info.value) and info.value.fix


def test_int8_without_data_is_a_clear_error(workdir: Path) -> None:
    with pytest.raises(TrtoptError, match="needs calibration data"):
        build_plan(workdir / "tiny.onnx", BuildConfig(backend="cpu"))


def test_fp32_plan_builds_without_calibration(workdir: Path) -> None:
    result = build_plan(workdir / "tiny.onnx", BuildConfig(backend="cpu", int8=False))
    model = onnx.load_model_from_string(result.plan.sections["onnx"])
    assert not [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]


def test_plan_for_a_backend_not_here_is_refused(workdir: Path, built) -> None:  # type: ignore[no-untyped-def]
    plan = read_plan(workdir / "tiny.engine")
    foreign = Plan("tensorrt", plan.inputs, plan.outputs, {"engine": b"x"}, plan.metadata, plan.versions)
    write_plan(foreign, workdir / "gpu.engine")
    with pytest.raises(BackendUnavailableError, match="tensorrt"):
        trtopt.Engine.load(workdir / "gpu.engine")
    alien = Plan("fpga", plan.inputs, plan.outputs, {}, {}, {})
    write_plan(alien, workdir / "alien.engine")
    with pytest.raises(TrtoptError, match="Unknown backend 'fpga'"):
        trtopt.Engine.load(workdir / "alien.engine")


def test_truncated_plan_is_a_plan_error(workdir: Path, built) -> None:  # type: ignore[no-untyped-def]
    data = (workdir / "tiny.engine").read_bytes()
    (workdir / "cut.engine").write_bytes(data[: len(data) - 1000])
    with pytest.raises(PlanError, match="integrity"):
        trtopt.Engine.load(workdir / "cut.engine")
