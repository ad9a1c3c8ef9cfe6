"""The TensorRT builder and runner held against NVIDIA's real Python bindings (TensorRT 11, and 10).

tools/trt_stub_bindings.py fetches the bindings wheel from PyPI and builds stub native libraries; with them
``import tensorrt`` works here, and `trt_native_double` replays every call trtopt makes on the real
pybind11 layer (its docstring says how, and what that cannot check). The builder and runner run through
their real entry points (`builder.build`, `create_runner`); only the objects native code would create are
doubles. The subprocess tests run them with no double at all, up to the first native call.

Planted mistakes - the ones the old hand-written stand-ins let through - must fail here: a misspelt
keyword, a missing argument, a property called as a method, a method that does not exist, strings where
enums, Dims, DataType, IHostMemory or Severity are needed.

Missing compiler or bindings wheel: skipped with the reason; failed under TRTOPT_REQUIRE_TRT_BINDINGS=1 (CI).
TRTOPT_TRT_BINDINGS_VERSION picks the version (default 11.4.0.106); the last test reruns this module with
TensorRT 10 in a subprocess (one pybind11 module per process).
"""

from __future__ import annotations

import ctypes
import inspect
import os
import re
import subprocess
import sys
import textwrap
import types
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
import pytest
import trt_stand_in
from fake_cudart import install_fake_cudart
from onnx import TensorProto, helper
from trt_native_double import (
    DEFAULT_VERSION,
    ROOT,
    BindingMismatch,
    Boundary,
    NativeDouble,
    accepts_parameters,
    bindings_site,
    bindings_version,
    declared_returns,
    real_tensorrt,
)

from trtopt.backend import Profile, RunOptions
from trtopt.backend.tensorrt import builder, detect, runner
from trtopt.backend.tensorrt.builder import EngineOptions
from trtopt.errors import ModelError, PlanError, ShapeError, TrtoptError

TRT10 = "10.13.3.9.post1"


@pytest.fixture(scope="module")
def trt() -> ModuleType:
    return real_tensorrt()


@pytest.fixture
def boundary(trt: ModuleType, monkeypatch: pytest.MonkeyPatch) -> Boundary:
    monkeypatch.setattr(detect, "require", lambda: trt)
    return Boundary(trt)


def tiny_model() -> onnx.ModelProto:
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# --- the builder ------------------------------------------------------------------------------------


def install_builder(b: Boundary, monkeypatch: pytest.MonkeyPatch, **answers: Any) -> list[Any]:
    """Doubles for what `trt.Builder` / `trt.OnnxParser` create; `answers` override single answers by
    "Class.member". Returns the loggers trtopt passed to `trt.Builder` (native TensorRT logs through them)."""
    trt, loggers = b.trt, []

    def answer(key: str, default: Any) -> Any:
        return answers.get(key, default)

    tensor = b.double("ITensor", name="x", shape=trt.Dims([-1, 4]))
    network = b.double("INetworkDefinition", num_inputs=1, get_input=lambda i: tensor)
    profile = b.double("IOptimizationProfile", set_shape=None)
    cache = b.double("ITimingCache", serialize=b.double("IHostMemory", __bytes__=b"CACHE"))
    config = b.double(
        "IBuilderConfig", set_memory_pool_limit=None, set_flag=None, create_timing_cache=cache, get_timing_cache=cache,
        set_timing_cache=answer("IBuilderConfig.set_timing_cache", True),
        add_optimization_profile=answer("IBuilderConfig.add_optimization_profile", 0), builder_optimization_level=3,
    )  # fmt: skip
    engine = answer("Builder.build_serialized_network", b.double("IHostMemory", __bytes__=b"ENGINE"))
    builder_double = b.double(
        "Builder", create_network=network, create_builder_config=config, create_optimization_profile=profile,
        build_serialized_network=engine, max_threads=0,
    )  # fmt: skip
    error = b.double(
        "ParserError", code=answer("ParserError.code", trt.ErrorCode.UNSUPPORTED_NODE),
        desc="No importer registered for op: Foo", node=3, node_name="head/foo", node_operator="Foo",
    )  # fmt: skip
    parse_ok = answer("OnnxParser.parse", True)
    parser = b.double("OnnxParser", parse=parse_ok, num_errors=0 if parse_ok else 1, get_error=error)
    monkeypatch.setattr(trt, "Builder", b.factory("Builder", lambda logger: loggers.append(logger) or builder_double))
    monkeypatch.setattr(trt, "OnnxParser", b.factory("OnnxParser", lambda network, logger: parser))
    return loggers


FULL_OPTIONS = dict(
    profiles={"x": Profile((1, 4), (8, 4), (8, 4))}, workspace_mib=256, optimization_level=4, sparsity=True, threads=2
)


def build_everything(b: Boundary, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, module: Any = builder) -> None:
    """Every option that reaches TensorRT, through `build`; the result is what the doubles scripted."""
    install_builder(b, monkeypatch)
    cache = tmp_path / "timing.cache"
    sections, versions = module.build(tiny_model(), EngineOptions(**FULL_OPTIONS, timing_cache=cache))
    assert sections["engine"] == b"ENGINE" and cache.read_bytes() == b"CACHE"
    assert versions["tensorrt"] == b.trt.__version__


def fail_a_build(b: Boundary, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, module: Any = builder) -> None:
    """TensorRT logs an error through trtopt's logger and returns no engine: the error reaches the user."""
    trt = b.trt

    def log_and_fail(network: NativeDouble, config: NativeDouble) -> None:
        loggers[0].log(trt.ILogger.Severity.ERROR, "no implementation for node head/foo")
        loggers[0].log(trt.ILogger.Severity.WARNING, "a warning, not in the error")

    loggers = install_builder(b, monkeypatch, **{"Builder.build_serialized_network": log_and_fail})
    with pytest.raises(TrtoptError) as caught:
        module.build(tiny_model(), EngineOptions(profiles=FULL_OPTIONS["profiles"]))
    assert "  - no implementation for node head/foo" in str(caught.value)
    assert "a warning" not in str(caught.value)


def test_build_makes_only_calls_the_real_bindings_accept(
    boundary: Boundary, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    build_everything(boundary, monkeypatch, tmp_path)
    trt, called = boundary.trt, boundary.called
    flags = 0 if detect.tensorrt_major(trt) >= 11 else 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    assert called("Builder.create_network") == [((flags,), {})]
    assert called("IBuilderConfig.set_memory_pool_limit") == [((trt.MemoryPoolType.WORKSPACE, 256 << 20), {})]
    assert called("IBuilderConfig.builder_optimization_level=") == [((4,), {})]
    assert called("IBuilderConfig.set_flag") == [((trt.BuilderFlag.SPARSE_WEIGHTS,), {})]
    assert called("Builder.max_threads=") == [((2,), {})]
    assert called("IOptimizationProfile.set_shape") == [(("x", (1, 4), (8, 4), (8, 4)), {})]
    assert called("IBuilderConfig.create_timing_cache") == [((b"",), {})]
    assert [kw for _, kw in called("IBuilderConfig.set_timing_cache")] == [{"ignore_mismatch": True}]
    assert len(called("OnnxParser()")) == len(called("Builder.build_serialized_network")) == 1


def test_failed_build_shows_what_tensorrt_logged(
    boundary: Boundary, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fail_a_build(boundary, monkeypatch, tmp_path)


def test_parser_error_code_is_printed_by_name(boundary: Boundary, monkeypatch: pytest.MonkeyPatch) -> None:
    install_builder(boundary, monkeypatch, **{"OnnxParser.parse": False})
    with pytest.raises(ModelError) as caught:
        builder.build(tiny_model(), EngineOptions(profiles=FULL_OPTIONS["profiles"]))
    assert "node 'head/foo' (Foo) #3: No importer registered for op: Foo [UNSUPPORTED_NODE]" in str(caught.value)


@pytest.mark.parametrize(
    ("refusal", "error", "message"),
    [
        ({"IBuilderConfig.set_timing_cache": False}, TrtoptError, r"refused the timing cache '.*' \(0 bytes\)"),
        ({"IBuilderConfig.add_optimization_profile": -1}, ShapeError, r"refused the shape profile: 'x' \(model"),
    ],
)  # fmt: skip
def test_a_refusal_returned_by_tensorrt_is_a_clear_error(
    boundary: Boundary, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, refusal: dict[str, Any], error: type,
    message: str,
) -> None:  # fmt: skip
    install_builder(boundary, monkeypatch, **refusal)
    options = EngineOptions(profiles=FULL_OPTIONS["profiles"], timing_cache=tmp_path / "timing.cache")
    with pytest.raises(error, match=message):
        builder.build(tiny_model(), options)


# --- the runner -------------------------------------------------------------------------------------


class Plan:
    sections = {"engine": b"ENGINE"}
    versions = {"tensorrt": "11.4.0.106"}


def install_runner(b: Boundary, monkeypatch: pytest.MonkeyPatch, **answers: Any) -> None:
    """An engine x (N, 4) -> y = 2x, N up to 8, whose execution runs on host memory posing as device memory
    (fake_cudart). `answers` override "IExecutionContext.<method>" or "ICudaEngine.<method>"."""
    trt = b.trt
    install_fake_cudart(monkeypatch)

    def new_context() -> NativeDouble:
        state: dict[str, Any] = {"shape": (1, 4)}

        def set_input_shape(name: str, shape: Any) -> bool:
            state["shape"] = tuple(shape)
            return True

        def set_address(name: str, ptr: int) -> bool:
            state[name] = ptr
            return True

        def execute(stream: int) -> bool:
            n = int(np.prod(state["shape"]))
            x = np.ctypeslib.as_array((ctypes.c_float * n).from_address(state["x"]))
            np.ctypeslib.as_array((ctypes.c_float * n).from_address(state["y"]))[:] = 2 * x
            return True

        own = {k.split(".")[1]: v for k, v in answers.items() if k.startswith("IExecutionContext.")}
        methods = {"set_input_shape": set_input_shape, "set_tensor_address": set_address, "execute_async_v3": execute}
        shape = {"get_tensor_shape": lambda name: trt.Dims(state["shape"])}
        return b.double("IExecutionContext", **shape, **{**methods, **own})

    engine = b.double(
        "ICudaEngine", num_io_tensors=2, get_tensor_name=lambda i: ["x", "y"][i],
        get_tensor_mode=lambda name: trt.TensorIOMode.INPUT if name == "x" else trt.TensorIOMode.OUTPUT,
        get_tensor_shape=lambda name: trt.Dims([-1, 4]),
        get_tensor_dtype=answers.get("ICudaEngine.get_tensor_dtype", trt.DataType.FLOAT),
        get_tensor_profile_shape=lambda name, index: [trt.Dims([1, 4]), trt.Dims([8, 4]), trt.Dims([8, 4])],
        create_execution_context=new_context,
    )  # fmt: skip
    runtime = b.double("Runtime", deserialize_cuda_engine=engine)
    monkeypatch.setattr(trt, "Runtime", b.factory("Runtime", lambda logger: runtime))


def run_inference(b: Boundary, monkeypatch: pytest.MonkeyPatch, module: Any = runner) -> None:
    install_runner(b, monkeypatch)
    engine = module.create_runner(Plan(), RunOptions(cuda_graph=True))
    for batch in (2, 8):
        x = np.arange(batch * 4, dtype=np.float32).reshape(batch, 4)
        np.testing.assert_array_equal(engine.infer({"x": x})["y"], 2 * x)
    engine.close()


def test_runner_makes_only_calls_the_real_bindings_accept(boundary: Boundary, monkeypatch: pytest.MonkeyPatch) -> None:
    run_inference(boundary, monkeypatch)
    assert boundary.called("Runtime.deserialize_cuda_engine") == [((b"ENGINE",), {})]
    shapes = [args for args, _ in boundary.called("IExecutionContext.set_input_shape")]
    assert shapes == [("x", (8, 4)), ("x", (2, 4)), ("x", (8, 4))]  # the probe's max, then per change
    assert all(isinstance(args[0], int) for args, _ in boundary.called("IExecutionContext.execute_async_v3"))


@pytest.mark.parametrize("dtype", ["BF16", "FP8", "INT4", "FP4"])
def test_io_without_a_numpy_type_names_the_tensor(
    boundary: Boundary, monkeypatch: pytest.MonkeyPatch, dtype: str
) -> None:
    install_runner(boundary, monkeypatch, **{"ICudaEngine.get_tensor_dtype": getattr(boundary.trt.DataType, dtype)})
    with pytest.raises(PlanError, match=rf"Tensor 'x' of this engine is {dtype}, which has no numpy type"):
        runner.create_runner(Plan(), RunOptions())


@pytest.mark.parametrize(
    ("refusal", "error", "message"),
    [
        ("set_input_shape", ShapeError, r"TensorRT refused shape \[8, 4\] for input 'x'"),
        ("set_tensor_address", PlanError, r"TensorRT refused the device address 0x[0-9a-f]+ for tensor '[xy]'"),
    ],
)
def test_a_refused_set_call_is_a_clear_error(
    boundary: Boundary, monkeypatch: pytest.MonkeyPatch, refusal: str, error: type, message: str
) -> None:
    install_runner(boundary, monkeypatch, **{f"IExecutionContext.{refusal}": False})
    with pytest.raises(error, match=message):
        runner.create_runner(Plan(), RunOptions()).infer({"x": np.ones((8, 4), np.float32)})


# --- planted mistakes -------------------------------------------------------------------------------

Scenario = Callable[[Boundary, pytest.MonkeyPatch, Path, Any], None]

PLANTED = [  # (module, what is right, the mistake, the scenario that must then fail)
    ("builder", "ignore_mismatch=True)", "ignore_missmatch=True)", "build"),
    ("builder", "set_timing_cache(cache, ignore_mismatch=True)", "set_timing_cache(cache)", "build"),
    ("builder", "builder.max_threads = options.threads\n", "builder.max_threads(options.threads)\n", "build"),
    ("builder", "config.builder_optimization_level = ", "config.set_builder_optimization_level = ", "build"),
    ("builder", "trt.MemoryPoolType.WORKSPACE", '"WORKSPACE"', "build"),
    ("builder", "trt.BuilderFlag.SPARSE_WEIGHTS", '"SPARSE_WEIGHTS"', "build"),
    ("builder", "profile.set_shape(name, p.min,", 'profile.set_shape(name, "x".join(map(str, p.min)),', "build"),
    ("builder", "(trt.ILogger.INTERNAL_ERROR, trt.ILogger.ERROR)", '("INTERNAL_ERROR", "ERROR")', "fail"),
    ("runner", "self._numpy_dtype(name, engine.get_tensor_dtype(name))", 'self._numpy_dtype(name, "float32")', "run"),
    ("runner", "self.context.set_tensor_address(name, ptr)", "self.context.set_tensor_adress(name, ptr)", "run"),
    ("runner", "not context.set_input_shape(name, shape)", "not context.set_input_shape(name, str(shape))", "run"),
]  # fmt: skip


def mutant(module: types.ModuleType, right: str, wrong: str, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A copy of `module` with one mistake planted (registered in sys.modules: dataclasses look it up)."""
    source = Path(module.__file__ or "").read_text()
    assert source.count(right) == 1, f"{right!r} is not once in {module.__name__}: update PLANTED"
    copy = types.ModuleType(module.__name__ + "_planted")
    monkeypatch.setitem(sys.modules, copy.__name__, copy)
    exec(compile(source.replace(right, wrong), module.__file__ or "", "exec"), copy.__dict__)
    return copy


@pytest.mark.parametrize(("module", "right", "wrong", "scenario"), PLANTED, ids=[p[2][:40] for p in PLANTED])
def test_a_planted_mistake_fails_the_suite(
    boundary: Boundary, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, module: str, right: str, wrong: str,
    scenario: str,
) -> None:  # fmt: skip
    planted = mutant({"builder": builder, "runner": runner}[module], right, wrong, monkeypatch)
    run = {
        "build": lambda: build_everything(boundary, monkeypatch, tmp_path, planted),
        "fail": lambda: fail_a_build(boundary, monkeypatch, tmp_path, planted),
        "run": lambda: run_inference(boundary, monkeypatch, planted),
    }[scenario]
    with pytest.raises((AssertionError, TypeError, TrtoptError)):  # BindingMismatch is an AssertionError
        run()


@pytest.mark.parametrize(
    ("answers", "runs"),
    [
        ({"ParserError.code": "UNSUPPORTED_NODE", "OnnxParser.parse": False}, "build"),  # a string for an enum
        ({"Builder.build_serialized_network": b"ENGINE"}, "build"),  # bytes for IHostMemory
        ({"ICudaEngine.get_tensor_dtype": "float32"}, "run"),  # a string for DataType
        ({"IExecutionContext.set_tensor_address": None}, "run"),  # nothing where TensorRT returns bool
    ],
)
def test_a_double_cannot_answer_what_tensorrt_cannot(
    boundary: Boundary, monkeypatch: pytest.MonkeyPatch, answers: dict[str, Any], runs: str
) -> None:
    with pytest.raises(BindingMismatch, match="TensorRT returns"):
        if runs == "build":
            install_builder(boundary, monkeypatch, **answers)
            builder.build(tiny_model(), EngineOptions(profiles=FULL_OPTIONS["profiles"]))
        else:
            install_runner(boundary, monkeypatch, **answers)
            runner.create_runner(Plan(), RunOptions()).infer({"x": np.ones((1, 4), np.float32)})


# --- the stand-ins are the real API's shape -----------------------------------------------------------

STAND_IN_CLASSES = {"Engine": "ICudaEngine", "StandInContext": "IExecutionContext", "Runtime": "Runtime"}
RETURN_KINDS = {  # the stand-ins' plain Python types for what TensorRT returns (the runner converts both)
    "tensorrt_bindings.tensorrt.Dims": "tuple[int, ...]",
    "list[tensorrt_bindings.tensorrt.Dims]": "list[tuple[int, ...]]",
    "tensorrt_bindings.tensorrt.TensorIOMode": "str",
    "tensorrt_bindings.tensorrt.DataType": "str",
    "tensorrt_bindings.tensorrt.ICudaEngine": "Engine",
    "tensorrt_bindings.tensorrt.IExecutionContext": "StandInContext",
}


def stand_in_classes() -> dict[str, type]:
    module = trt_stand_in.stand_in_tensorrt(features=4, max_batch=8, execute=lambda c, s: True, contexts=[])
    engine = module.Runtime(None).deserialize_cuda_engine(b"")
    return {"Engine": type(engine), "StandInContext": trt_stand_in.StandInContext, "Runtime": module.Runtime}


def test_the_runner_stand_in_matches_the_real_api(trt: ModuleType) -> None:
    """tests/trt_stand_in.py: names, method vs property, parameter names and return kinds of the real API."""
    for stand_in_name, cls in stand_in_classes().items():
        real = getattr(trt, STAND_IN_CLASSES[stand_in_name])
        for name, member in vars(cls).items():
            if name.startswith("_"):
                continue
            found = inspect.getattr_static(real, name, None)
            assert found is not None, f"{stand_in_name}.{name}: no {real.__name__}.{name} in TensorRT"
            if not callable(member):
                assert isinstance(found, property), f"{stand_in_name}.{name} is data, {real.__name__}.{name} is not"
                continue
            assert not isinstance(found, property), f"{stand_in_name}.{name} is a method, TensorRT's a property"
            params = [p for p in inspect.signature(member).parameters if p != "self"]
            assert accepts_parameters(found, name, params), f"{stand_in_name}.{name}{params} vs {real.__name__}"
            declared = [re.sub(r"^(typing\.)?List\[", "list[", d) for d in declared_returns(trt, found, name)]
            wanted = {RETURN_KINDS.get(d, d) for d in declared}
            assert member.__annotations__["return"] in wanted, f"{stand_in_name}.{name} returns {wanted} in TensorRT"
    module = trt_stand_in.stand_in_tensorrt(features=4, max_batch=8, execute=lambda c, s: True, contexts=[])
    assert set(vars(module.TensorIOMode)) <= set(trt.TensorIOMode.__members__)
    assert {n for n in vars(module.ILogger) if n.isupper()} <= set(trt.ILogger.Severity.__members__)
    assert all(hasattr(trt, n) for n in ("Builder", "Runtime", "ILogger", "TensorIOMode", "nptype", "__version__"))


# --- the real entry points with no double, up to TensorRT's first native call --------------------------

ENTRY_POINTS = {
    "build": """
        from trtopt.backend.tensorrt.builder import EngineOptions
        from trtopt.backend.tensorrt import builder
        builder.build(model, EngineOptions(workspace_mib=64))
    """,
    "run": """
        from trtopt.backend import RunOptions
        from trtopt.backend.tensorrt import cuda, runner
        cuda.set_device = lambda device: None
        runner.create_runner(types.SimpleNamespace(sections={"engine": b"x"}, versions={}), RunOptions())
    """,
}


@pytest.mark.parametrize(("entry", "native"), [("build", "createInferBuilder"), ("run", "createInferRuntime")])
def test_entry_points_reach_tensorrt_native_code(trt: ModuleType, tmp_path: Path, entry: str, native: str) -> None:
    """`import tensorrt` is the real module here; CUDA is said to be present. The process must get as far
    as the stub of TensorRT's native factory (so everything before it was accepted) and die there."""
    script = textwrap.dedent(
        """
        import types
        import onnx
        from trtopt.backend import BackendStatus
        from trtopt.backend.tensorrt import detect
        detect.status = lambda: BackendStatus(True, "stub libraries")
        model = onnx.load_from_string(open("model.onnx", "rb").read())
        """
    ) + textwrap.dedent(ENTRY_POINTS[entry])
    (tmp_path / "model.onnx").write_bytes(tiny_model().SerializeToString())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(bindings_site(bindings_version())), str(ROOT)])}
    result = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True
    )  # fmt: skip
    assert result.returncode < 0, result.stderr  # killed by SIGABRT in the stub, not a Python exception
    assert f"trtopt stub: native TensorRT function {native}_INTERNAL() called" in result.stderr, result.stderr


def test_the_same_checks_hold_against_tensorrt_10() -> None:
    if bindings_version() != DEFAULT_VERSION:
        pytest.skip("this run is the TensorRT 10 rerun")
    env = {**os.environ, "TRTOPT_TRT_BINDINGS_VERSION": TRT10}
    tool = str(ROOT / "tools" / "trt_stub_bindings.py")
    check = subprocess.run([sys.executable, tool, "--version", TRT10], capture_output=True, text=True)
    if check.returncode != 0:
        pytest.skip(f"no TensorRT 10 bindings for this Python: {check.stderr.strip()}")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__], cwd=ROOT, env=env,
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:]


