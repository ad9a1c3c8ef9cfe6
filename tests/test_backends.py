"""Backends are registered objects that own their decisions; the build knows none of them by name.

BACKENDS: cpu, tensorrt  (trtopt/backend/<name>/backend.py, registered where defined)
    status, quant_config, options (typed, from the build config), variants, build,
    strict_verification, report, create_runner, CLI flags, Triton serving (triton, profiled)
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from model_files import tiny_model_with_images

import trtopt
from trtopt.backend import BACKENDS, BackendStatus, get_backend, quantizable_tensors, select_backend
from trtopt.backend.cpu.backend import CpuBackend
from trtopt.backend.cpu.options import CpuOptions
from trtopt.backend.tensorrt.options import TensorRTOptions
from trtopt.build import BuildConfig, build_plan
from trtopt.calib import CalibConfig
from trtopt.calib.thresholds import FP32_AMAX, ZERO_AMAX
from trtopt.errors import BackendUnavailableError, TrtoptError, UnknownNameError
from trtopt.frontend import graph_from_onnx
from trtopt.passes.config import GraphConfig
from trtopt.plan import read_plan, write_plan
from trtopt.quant import QuantConfig, plan_quantization
from trtopt.zoo import build_model

ROOT = Path(__file__).resolve().parents[1]


def test_the_registry_holds_the_backends_and_names_the_valid_ones() -> None:
    assert BACKENDS.names() == ["cpu", "openvino", "tensorrt"]
    assert get_backend("tensorrt").runner_section == "engine" and get_backend("cpu").runner_section == "onnx"
    with pytest.raises(UnknownNameError, match="auto, cpu, openvino, tensorrt"):
        get_backend("fpga")
    with pytest.raises(UnknownNameError, match="Unknown backend 'fpga'"):
        BuildConfig(backend="fpga", int8=False)  # checked when the config is made, not after calibration


def test_backend_objects_need_no_heavy_library_until_used() -> None:
    """Constructing, listing and asking for CLI flags loads neither TensorRT, CUDA, ONNX Runtime nor OpenVINO."""
    code = (
        "import sys, argparse\n"
        "from trtopt.backend import BACKENDS\n"
        "parser = argparse.ArgumentParser()\n"
        "for name in BACKENDS:\n"
        "    BACKENDS.get(name).add_arguments(parser.add_argument_group(name))\n"
        "    BACKENDS.get(name).options_from_args(parser.parse_args([]))\n"
        "heavy = {'tensorrt', 'cuda', 'onnxruntime', 'openvino'} & {m.split('.')[0] for m in sys.modules}\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("module", ["build.py", "quantize.py", "plan_records.py"])
def test_build_py_names_no_backend(module: str) -> None:
    """The orchestrator (and the chains beside it) imports no backend module and names no backend anywhere."""
    source = (ROOT / "trtopt" / module).read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            assert not node.module.startswith("trtopt.backend."), node.module
    names = {n.lower() for n in BACKENDS} | {get_backend(n).title.lower() for n in BACKENDS} | {"onnxruntime"}
    lowered = source.lower()
    assert not [n for n in names if n in lowered]


# Where a backend name may decide: the backends themselves. (The Triton exporter asks the plan's backend which
# Triton models serve it, its instance kind and whether it is profiled: `Backend.triton`, `Backend.profiled`.)
DECIDES_BY_NAME = ("trtopt/backend/",)


def test_no_module_outside_the_backends_decides_by_a_backend_name() -> None:
    """No `x == "cpu"` / `x != "tensorrt"` / `x in ("cpu", ...)` outside trtopt/backend: such a decision is the
    backend object's (a class attribute or method of `Backend`)."""
    names = set(BACKENDS)
    found = []
    for path in sorted((ROOT / "trtopt").rglob("*.py")):
        shown = path.relative_to(ROOT).as_posix()
        if shown.startswith(DECIDES_BY_NAME):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare):
                literals = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
                found += [f"{shown}:{node.lineno} {n!r}" for n in sorted(literals & names)]
    assert not found, found


def test_backends_own_their_notes_on_other_tools_quantisation_and_on_sparsity() -> None:
    cpu, trt = get_backend("cpu"), get_backend("tensorrt")
    assert "uint8 activations" in cpu.prequantized_keeps and not trt.prequantized_keeps
    assert "no 2:4 sparse path" in cpu.sparsity_note and "cannot see that choice" in trt.sparsity_note


def test_backends_say_how_triton_serves_their_plans() -> None:
    """Each backend's Triton models load its runner's own plan section; the default is one of them or the
    Python model; the instance kind and profile policy follow the device it runs on."""
    from types import SimpleNamespace

    from trtopt.serving.triton.config import DTYPES

    for name in BACKENDS:
        backend = get_backend(name)
        assert all(m.section == backend.runner_section and m.dtypes <= set(DTYPES) for m in backend.triton.models)
        assert backend.triton.default in {m.name for m in backend.triton.models} | {"python"}
    cpu, trt = get_backend("cpu"), get_backend("tensorrt")
    assert (cpu.triton.default, cpu.triton.instance_kind, cpu.profiled) == ("python", "KIND_CPU", False)
    assert (trt.triton.default, trt.triton.instance_kind, trt.profiled) == ("tensorrt", "KIND_GPU", True)
    assert [m.file for m in (*cpu.triton.models, *trt.triton.models)] == ["model.onnx", "model.plan"]
    u8s8 = SimpleNamespace(metadata={"verification": {"variant": "u8s8", "isa": "amx"}}, versions={})
    (onnx_model,) = cpu.triton.models
    assert "exact only on servers with AVX-512 VNNI" in " ".join(cpu.triton_notes(u8s8, onnx_model))  # type: ignore[arg-type]
    u8u8 = SimpleNamespace(metadata={"verification": {"variant": "u8u8"}}, versions={})
    assert cpu.triton_notes(u8u8, onnx_model) == []  # type: ignore[arg-type]
    trt_plan = SimpleNamespace(versions={"tensorrt": "11.0"})
    assert "TensorRT 11.0 engine" in trt.triton_notes(trt_plan, trt.triton.models[0])[0]  # type: ignore[arg-type]


# --- quantisation defaults ---------------------------------------------------------------------------


def _graph(name: str = "inception") -> gs.Graph:
    from trtopt.passes import optimize

    return optimize(graph_from_onnx(build_model(name))).graph


def test_each_backend_fills_in_its_quantisation_defaults() -> None:
    cpu, trt = get_backend("cpu"), get_backend("tensorrt")
    plain = QuantConfig()
    assert cpu.quant_config(plain).quantize_outputs and cpu.quant_config(plain).output_folds == {"Relu", "Clip"}
    assert cpu.quant_config(plain).float_leading_depthwise is True
    assert not trt.quant_config(plain).quantize_outputs and trt.quant_config(plain).float_leading_depthwise is False
    # The user's explicit choice wins over the backend's default; the user's other fields are kept.
    mine = QuantConfig(float_leading_depthwise=False, exclude=("Gemm",), min_channels=4)
    assert cpu.quant_config(mine) == replace(mine, quantize_outputs=True, output_folds=frozenset({"Relu", "Clip"}),
                                                  integer_pools=True, integer_gates=True, integer_hard_swish=True,
                                                  min_amax=FP32_AMAX,
                                                  float_ops=frozenset({"ConvTranspose"}))  # fmt: skip
    assert trt.quant_config(mine).min_amax == ZERO_AMAX  # TensorRT may hold scales in FP16: float16's floor


def test_quantizable_tensors_cover_every_backends_plan() -> None:
    """What calibration measures (and a cache holds) covers each backend's plan, whatever --min-channels."""
    graph = _graph()
    covered = set(quantizable_tensors(graph))
    for name in BACKENDS:
        for config in (QuantConfig(), QuantConfig(min_channels=1, float_leading_depthwise=False)):
            tensors = plan_quantization(graph, get_backend(name).quant_config(config)).activation_tensors
            assert set(tensors) <= covered, (name, config)
    cpu_wide = get_backend("cpu").quant_config(QuantConfig(min_channels=1, float_leading_depthwise=False))
    assert quantizable_tensors(graph) == plan_quantization(graph, cpu_wide).activation_tensors  # in this order


# --- typed options, from the build config ------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: CpuOptions(gemm="fast"), "--cpu-gemm"),
        (lambda: CpuOptions(encoding="s7"), "Unknown CPU encoding 's7'"),
        (lambda: TensorRTOptions(workspace_mib=0), "--workspace"),
        (lambda: TensorRTOptions(optimization_level=6), "--opt-level"),
        (lambda: TensorRTOptions(batch=0), "--batch"),
        (lambda: TensorRTOptions(threads=0), "--threads"),
    ],
)
def test_backend_options_are_checked_when_made(make, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TrtoptError, match=message) as info:
        make()
    assert info.value.fix


def test_tensorrt_options_resolve_profiles_and_fp16_from_the_config_and_graph(tmp_path: Path) -> None:
    graph = gs.import_onnx(build_model("tiny_cnn"))
    graph.inputs[0].shape = ["N", 3, 32, 32]
    config = BuildConfig(int8=False, fp16=True, backend_options=(TensorRTOptions(batch=16, workspace_mib=512),))
    options = get_backend("tensorrt").options(config.target(), graph)
    assert options.fp16 and options.workspace_mib == 512 and not options.sparsity
    assert options.profiles is not None and options.profiles["input"].max == (16, 3, 32, 32)
    assert get_backend("tensorrt").profiles(options) == options.profiles  # recorded in the plan for Triton
    assert get_backend("cpu").profiles(get_backend("cpu").options(BuildConfig(int8=False).target(), graph)) is None
    assert (
        get_backend("tensorrt").options(BuildConfig(int8=False, sparsity=True).target(), graph).sparsity
    )  # SPARSE_WEIGHTS
    report = get_backend("tensorrt").report(_any_plan(), options)
    assert report is not None and report.to_dict()["input"]["max"] == [16, 3, 32, 32]
    assert "TensorRT profiles" in report.rows()[0][0]
    with pytest.raises(TrtoptError, match="--timing-cache .* is a folder"):
        TensorRTOptions(timing_cache=tmp_path)


def _any_plan():  # type: ignore[no-untyped-def]
    """The TensorRT report reads only the resolved options; any plan will do."""
    return read_plan(ROOT / "tests" / "data" / "plans" / "v1_tiny_cpu_int8.engine")


def test_the_cpu_backend_refuses_fp16_before_any_work() -> None:
    with pytest.raises(TrtoptError, match="--fp16 is for the TensorRT backend") as info:
        get_backend("cpu").options(BuildConfig(int8=False, fp16=True).target(), _graph("tiny_cnn"))
    assert "Drop --fp16" in info.value.fix
    config = BuildConfig(int8=False, backend_options=CpuOptions(encoding="u8u8"))  # one, or a sequence
    assert get_backend("cpu").options(config.target(), _graph("tiny_cnn")) == CpuOptions(encoding="u8u8")
    assert config.target().options_for(TensorRTOptions) == TensorRTOptions()  # absent: the backend's defaults


def test_build_config_checks_its_stages_and_options() -> None:
    with pytest.raises(TrtoptError, match="BuildConfig.calib is a str; expected a CalibConfig") as info:
        BuildConfig(calib="calib_data/")  # type: ignore[arg-type]  # the flat field of trtopt 0.1
    assert "README.md" in info.value.fix
    with pytest.raises(TrtoptError, match="two entries for the 'cpu' backend"):
        BuildConfig(backend_options=(CpuOptions(), CpuOptions(gemm="on")))
    with pytest.raises(TrtoptError, match="expected backend options"):
        BuildConfig(backend_options=("u8u8",))  # type: ignore[arg-type]
    with pytest.raises(TrtoptError, match="--passes"):
        GraphConfig(passes="fuse_cbr")  # type: ignore[arg-type]
    with pytest.raises(UnknownNameError, match="pass"):
        GraphConfig(passes=("fuse_cbr", "fuse_everything"))


# --- a new backend needs no change to the build --------------------------------------------------------


class EchoBackend(CpuBackend):
    """The CPU backend under another name and rank, registered only for a test."""

    name = "echo"
    title = "Echo"
    auto_rank = -1
    auto_reason = "echo answers first"


@pytest.fixture
def echo(monkeypatch: pytest.MonkeyPatch) -> Iterator[EchoBackend]:
    backend = EchoBackend()
    monkeypatch.setitem(BACKENDS._items, "echo", backend)
    yield backend


def test_a_registered_backend_is_built_selected_and_run_with_no_change_to_the_build(echo, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    work = tiny_model_with_images(tmp_path, 2)
    result = build_plan(work / "tiny.onnx", BuildConfig(backend="auto", int8=False, preprocess=_imagenet()))
    assert result.plan.backend == "echo" and result.backend_reason == "echo (echo answers first)"
    assert result.verification is not None and result.verification.ok
    path = write_plan(result.plan, tmp_path / "echo.engine")
    x = np.zeros((1, 3, 32, 32), np.float32)
    with trtopt.Engine.load(path, threads=1) as engine:
        assert engine.backend == "echo" and engine(x).shape == (1, 10)
    echo.status = lambda: BackendStatus(False, "echo is switched off")  # type: ignore[method-assign]
    _, why = select_backend("auto")
    assert why.startswith("cpu (Echo not used: echo is switched off; TensorRT not used: ")
    with pytest.raises(BackendUnavailableError, match="echo is switched off"):
        trtopt.Engine.load(path)
    assert read_plan(path).backend == "echo"


def _imagenet():  # type: ignore[no-untyped-def]
    from trtopt.data import PreprocessConfig

    return PreprocessConfig(preset="imagenet")


def test_a_cache_calibrated_for_one_backend_serves_the_other(tmp_path: Path) -> None:
    """Thresholds cover every backend's tensors, so a CPU build's cache also fits the TensorRT form."""
    work = tiny_model_with_images(tmp_path, 2)
    config = BuildConfig(backend="cpu", preprocess=_imagenet(), calib=CalibConfig(save_cache=tmp_path / "c.json"),
                         data=_data(work))  # fmt: skip
    build_plan(work / "tiny.onnx", config)
    from trtopt.calib import load_cache

    cache = load_cache(tmp_path / "c.json")
    graph = _optimized(work / "tiny.onnx")
    trt_tensors = plan_quantization(graph, get_backend("tensorrt").quant_config(QuantConfig())).activation_tensors
    assert set(trt_tensors) <= set(cache.amax)


def _data(work: Path):  # type: ignore[no-untyped-def]
    from trtopt.data import DataConfig

    return DataConfig(sources=(str(work / "images"),))


def _optimized(path: Path) -> gs.Graph:
    from trtopt.passes import optimize
    from trtopt.passes.config import load_graph

    return optimize(load_graph(path, GraphConfig(), int8=True, batch=8)).graph


def test_a_plan_without_its_runners_section_is_refused_before_it_runs(tmp_path: Path) -> None:
    from hostile_files import sealed_plan, split_plan

    from trtopt.engine import Engine
    from trtopt.errors import PlanError
    from trtopt.plan.format import plan_from_bytes

    header, sections = split_plan((ROOT / "tests" / "data" / "plans" / "v1_tiny_cpu_int8.engine").read_bytes())
    header["backend"] = "tensorrt"  # a TensorRT plan without its engine
    plan = plan_from_bytes(sealed_plan(header, sections))  # the format is sound; what is missing is the backend's
    with pytest.raises(PlanError, match="a tensorrt plan needs an 'engine' section"):
        Engine(plan)
    assert onnx.load_from_string(sections[0]).graph.node  # the section itself is intact


def test_tensorrt_says_to_add_fp16_for_a_float16_model(caplog: pytest.LogCaptureFixture) -> None:
    """An INT8 build of a float16 model calibrates a float32 copy (trtopt.frontend.float_types), so TensorRT's strongly
    typed network would run the float layers in FP32 unless --fp16 writes FP16 back: the options say so."""
    graph = gs.import_onnx(build_model("tiny_cnn"))
    graph.inputs[0].dtype = np.float16
    with caplog.at_level("WARNING", logger="trtopt.backend.tensorrt.backend"):
        get_backend("tensorrt").options(BuildConfig().target(), graph)
    assert "add --fp16" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="trtopt.backend.tensorrt.backend"):
        get_backend("tensorrt").options(BuildConfig(fp16=True).target(), graph)
        get_backend("tensorrt").options(BuildConfig().target(), gs.import_onnx(build_model("tiny_cnn")))
    assert "add --fp16" not in caplog.text
