"""The TensorRT builder's pure parts: profiles from --shapes/--batch, option validation, network
flags and parser-error formatting. Its calls into TensorRT are tested against the real bindings in
tests/test_tensorrt_real_bindings.py."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from trtopt.backend import Profile
from trtopt.backend.tensorrt.builder import (
    EngineOptions,
    ParserErrorInfo,
    format_parser_errors,
    network_flags,
    profiles_for,
    validate_options,
)
from trtopt.errors import ShapeError, TrtoptError


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
        (EngineOptions(workspace_mib=0), "--workspace"),
        (EngineOptions(optimization_level=6), "--opt-level is 6; expected a whole number from 0 to 5"),
        (EngineOptions(threads=0), "--threads"),
        (EngineOptions(profiles={"x": Profile((1, 3), (8, 3), (4, 3))}), "min <= opt <= max"),
        (EngineOptions(profiles={"x": Profile((1, 3), (1, 3, 1), (1, 3))}), "same rank"),
    ],
)
def test_validate_options_rejects_with_a_fix(options: EngineOptions, message: str) -> None:
    with pytest.raises(TrtoptError, match=message):
        validate_options(options)


def test_validate_options_accepts_defaults_and_rejects_a_cache_folder(tmp_path: Path) -> None:
    validate_options(EngineOptions())
    validate_options(
        EngineOptions(workspace_mib=1024, optimization_level=5, timing_cache=tmp_path / "t.cache")
    )
    with pytest.raises(TrtoptError, match="is a folder"):
        validate_options(EngineOptions(timing_cache=tmp_path))


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
