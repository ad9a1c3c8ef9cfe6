"""The TensorRT builder's pure parts: profiles from --shapes/--batch, option validation, network
flags and parser-error formatting; plus two wiring tests against a stand-in `tensorrt` module."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

from trtopt.backend import BuildOptions, Profile
from trtopt.backend.tensorrt import builder, detect
from trtopt.backend.tensorrt.builder import (
    ParserErrorInfo,
    format_parser_errors,
    network_flags,
    profiles_for,
    validate_options,
)
from trtopt.errors import ModelError, ShapeError, TrtoptError


@dataclass(frozen=True)
class In:
    name: str
    shape: tuple[Any, ...]


def test_dynamic_batch_gets_min_1_opt_and_max_batch() -> None:
    profiles = profiles_for([In("images", (-1, 3, 224, 224))], None, 32)
    assert profiles == {"images": Profile(min=(1, 3, 224, 224), opt=(32, 3, 224, 224), max=(32, 3, 224, 224))}


def test_batch_defaults_to_the_shapes_batch_then_1() -> None:
    inputs = [In("x", ("N", 3, 8, 8))]
    assert profiles_for(inputs, {"x": (8, 3, 8, 8)}, None)["x"].max == (8, 3, 8, 8)
    assert profiles_for(inputs, None, None)["x"] == Profile((1, 3, 8, 8), (1, 3, 8, 8), (1, 3, 8, 8))
    # --batch takes precedence over the batch size written in --shapes.
    assert profiles_for(inputs, {"x": (8, 3, 8, 8)}, 16)["x"].opt == (16, 3, 8, 8)


def test_other_dynamic_dims_come_from_shapes_and_are_fixed() -> None:
    inputs = [In("x", (None, 3, "h", "w")), In("mask", (1, 4))]
    profiles = profiles_for(inputs, {"x": (4, 3, 320, 640)}, 4)
    assert profiles == {"x": Profile(min=(1, 3, 320, 640), opt=(4, 3, 320, 640), max=(4, 3, 320, 640))}
    fixed = profiles_for([In("x", (1, 3, "h", "w"))], {"x": (1, 3, 64, 64)}, None)
    assert fixed["x"] == Profile((1, 3, 64, 64), (1, 3, 64, 64), (1, 3, 64, 64))


def test_missing_non_batch_sizes_say_how_to_pass_them() -> None:
    with pytest.raises(ShapeError, match=r"--shapes x:Nx3xNxN"):
        profiles_for([In("x", (-1, 3, -1, -1))], None, 8)


def test_shapes_must_match_the_model() -> None:
    with pytest.raises(ShapeError, match="rank 3"):
        profiles_for([In("x", (-1, 3, 8, 8))], {"x": (1, 3, 8)}, None)
    with pytest.raises(ShapeError, match="fixes it at 3"):
        profiles_for([In("x", (-1, 3, 8, 8))], {"x": (1, 4, 8, 8)}, None)


def test_batch_on_a_static_model_explains_the_reexport() -> None:
    with pytest.raises(ShapeError, match=r"fixes it: .x. \[1, 3, 8, 8\].*dynamic_axes"):
        profiles_for([In("x", (1, 3, 8, 8))], None, 8)
    assert profiles_for([In("x", (8, 3, 8, 8))], None, 8) == {}  # static and matching: no profile needed
    with pytest.raises(ShapeError, match="at least 1"):
        profiles_for([In("x", (-1, 3))], None, 0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (BuildOptions(workspace_mib=0), "--workspace"),
        (BuildOptions(optimization_level=6), "0..5"),
        (BuildOptions(threads=0), "--threads"),
        (BuildOptions(profiles={"x": Profile((1, 3), (8, 3), (4, 3))}), "min <= opt <= max"),
        (BuildOptions(profiles={"x": Profile((1, 3), (1, 3, 1), (1, 3))}), "same rank"),
    ],
)
def test_validate_options_rejects_with_a_fix(options: BuildOptions, message: str) -> None:
    with pytest.raises(TrtoptError, match=message):
        validate_options(options)


def test_validate_options_accepts_defaults_and_rejects_a_cache_folder(tmp_path: Path) -> None:
    validate_options(BuildOptions())
    validate_options(
        BuildOptions(workspace_mib=1024, optimization_level=5, timing_cache=tmp_path / "t.cache")
    )
    with pytest.raises(TrtoptError, match="is a folder"):
        validate_options(BuildOptions(timing_cache=tmp_path))


def test_network_flags_strongly_typed_on_10_and_nothing_on_11() -> None:
    assert network_flags(10, strongly_typed_bit=1) == 2
    assert network_flags(11, strongly_typed_bit=1) == 0


def test_parser_errors_name_node_and_op() -> None:
    text = format_parser_errors(
        [
            ParserErrorInfo("UNSUPPORTED_NODE", "No importer registered for op: Foo", 3, "head/foo", "Foo"),
            ("INVALID_GRAPH", "Network has no outputs\n"),
        ]
    )
    assert text.splitlines() == [
        "  - node 'head/foo' (Foo) #3: No importer registered for op: Foo [UNSUPPORTED_NODE]",
        "  - Network has no outputs [INVALID_GRAPH]",
    ]


# --- wiring against a stand-in `tensorrt` (these do not verify TensorRT) --------------------------


class _Recorder:
    """Every attribute is a callable that records its calls; a few return canned values."""

    def __init__(self, log: list[tuple[str, tuple[Any, ...]]], **returns: Any) -> None:
        self._log, self._returns = log, returns

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self._log.append((name, args + tuple(kwargs.values())))
            return self._returns.get(name)

        return call


def _fake_trt(calls: list[tuple[str, tuple[Any, ...]]], parse_ok: bool) -> types.ModuleType:
    trt = types.ModuleType("tensorrt")
    trt.__version__ = "11.0.0.1"  # type: ignore[attr-defined]

    class ILogger:
        INTERNAL_ERROR, ERROR, WARNING, INFO = range(4)

        def __init__(self) -> None:
            pass

    class Error:
        def code(self) -> str:
            return "UNSUPPORTED_NODE"

        def desc(self) -> str:
            return "unsupported"

        def node(self) -> int:
            return 0

        def node_name(self) -> str:
            return "n0"

        def node_operator(self) -> str:
            return "Foo"

    class Tensor:
        name, shape = "x", (-1, 4)

    network = _Recorder(calls, get_input=Tensor())
    network.num_inputs = 1  # type: ignore[attr-defined]
    cache = _Recorder(calls, serialize=b"CACHE")
    config = _Recorder(calls, create_timing_cache=cache, get_timing_cache=cache)
    builder_obj = _Recorder(
        calls,
        create_network=network,
        create_builder_config=config,
        create_optimization_profile=_Recorder(calls),
        build_serialized_network=b"ENGINE",
    )
    parser = _Recorder(calls, parse=parse_ok, get_error=Error())
    parser.num_errors = 1  # type: ignore[attr-defined]
    trt.ILogger = ILogger  # type: ignore[attr-defined]
    trt.Builder = lambda logger: builder_obj  # type: ignore[attr-defined]
    trt.OnnxParser = lambda network, logger: parser  # type: ignore[attr-defined]
    trt.NetworkDefinitionCreationFlag = types.SimpleNamespace(STRONGLY_TYPED=0)  # type: ignore[attr-defined]
    trt.MemoryPoolType = types.SimpleNamespace(WORKSPACE="WORKSPACE")  # type: ignore[attr-defined]
    trt.BuilderFlag = types.SimpleNamespace(SPARSE_WEIGHTS="SPARSE_WEIGHTS")  # type: ignore[attr-defined]
    return trt


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, tuple[Any, ...]]]]:
    log: list[tuple[str, tuple[Any, ...]]] = []
    monkeypatch.setattr(detect, "require", lambda: sys.modules["tensorrt"])
    monkeypatch.setattr(detect, "tensorrt_major", lambda trt: 11)
    yield log


def _tiny_model() -> onnx.ModelProto:
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_wiring_build_sets_the_documented_config(
    calls: list[tuple[str, tuple[Any, ...]]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Stand-in TensorRT: checks which documented calls builder.build makes, not TensorRT itself."""
    monkeypatch.setitem(sys.modules, "tensorrt", _fake_trt(calls, parse_ok=True))
    cache = tmp_path / "timing.cache"
    options = BuildOptions(
        profiles={"x": Profile((1, 4), (8, 4), (8, 4))},
        workspace_mib=256,
        optimization_level=4,
        sparsity=True,
        timing_cache=cache,
    )
    sections, versions = builder.build(_tiny_model(), options)
    assert (
        sections["engine"] == b"ENGINE"
        and onnx.load_from_string(sections["onnx"]).graph.node[0].op_type == "Relu"
    )
    assert versions["tensorrt"] == "11.0.0.1"
    made = dict(calls)
    assert made["create_network"] == (0,)  # TensorRT 11: no STRONGLY_TYPED flag (always on)
    assert made["set_memory_pool_limit"] == ("WORKSPACE", 256 << 20)
    assert made["set_flag"] == ("SPARSE_WEIGHTS",)
    assert made["set_shape"] == ("x", (1, 4), (8, 4), (8, 4))
    assert made["create_timing_cache"] == (b"",) and cache.read_bytes() == b"CACHE"


def test_wiring_parser_errors_become_a_model_error(
    calls: list[tuple[str, tuple[Any, ...]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stand-in TensorRT: checks error reporting, not TensorRT itself."""
    monkeypatch.setitem(sys.modules, "tensorrt", _fake_trt(calls, parse_ok=False))
    with pytest.raises(ModelError, match=r"node 'n0' \(Foo\) #0: unsupported \[UNSUPPORTED_NODE\]"):
        builder.build(_tiny_model(), BuildOptions())
