"""Facts with one home each (issue #17): a layer's channels, a Clip's bounds (on both IRs), the shape text of
messages, the stable topological order; each checked on small cases built here."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import helper, numpy_helper

from trtopt.errors import format_dims, format_shape
from trtopt.frontend.edit import stable_topological_order
from trtopt.passes.query import clip_bounds, input_channels, output_channels, read_clip_bounds


def layer(op: str, weight_shape: tuple[int, ...], *, constant_node: bool = False, **attrs: object) -> gs.Node:
    """x ─ op(x, W) ─ y, W an initializer or (constant_node=True) a Constant node's output."""
    values = np.zeros(weight_shape, np.float32)
    weight: gs.Tensor = gs.Constant("w", values)
    if constant_node:
        weight = gs.Variable("w_out")
        gs.Node("Constant", "const", {"value": gs.Constant("w", values)}, [], [weight])
    return gs.Node(op, "layer", dict(attrs), [gs.Variable("x"), weight], [gs.Variable("y")])


@pytest.mark.parametrize(
    ("op", "shape", "attrs", "channels"),
    [
        ("Conv", (16, 8, 3, 3), {}, (8, 16)),
        ("Conv", (32, 1, 3, 3), {"group": 32}, (32, 32)),  # depthwise
        ("Conv", (16, 8, 3), {}, (8, 16)),  # 1-D conv
        ("ConvTranspose", (8, 4, 3, 3), {"group": 2}, (8, 8)),  # (Cin, Cout/group, k, k)
        ("Gemm", (10, 64), {"transB": 1}, (64, 10)),
        ("Gemm", (64, 10), {}, (64, 10)),
        ("MatMul", (64, 10), {}, (64, 10)),
        ("MatMul", (2, 64, 10), {}, (64, 10)),  # batched weight: features on the last axis
        ("MatMul", (64,), {}, (None, None)),  # 1-D operand: no feature axis
        ("Gemm", (2, 64, 10), {}, (None, None)),  # not a Gemm weight
        ("Conv", (16, 8), {}, (None, None)),  # not a conv weight
        ("Relu", (3,), {}, (None, None)),
    ],
)
def test_channels_of_a_layer(op: str, shape: tuple[int, ...], attrs: dict[str, object], channels: tuple) -> None:
    node = layer(op, shape, **attrs)
    assert (input_channels(node), output_channels(node)) == channels


def test_channels_read_a_constant_node_weight_and_not_a_computed_one() -> None:
    """The rule counts what the weight is, not how the file stores it (the quantizer used to miss
    Constant-node weights, the BatchNorm folder to see them)."""
    assert output_channels(layer("Conv", (16, 8, 3, 3), constant_node=True)) == 16
    computed = gs.Node("Conv", "c", {}, [gs.Variable("x"), gs.Variable("w")], [gs.Variable("y")])
    assert output_channels(computed) is None and input_channels(computed) is None


def clip(*bounds: object, **attrs: float) -> gs.Node:
    """Clip(x, min, max) with each bound a float (initializer), "computed", or None (omitted)."""
    inputs: list[gs.Tensor] = [gs.Variable("x")]
    for i, bound in enumerate(bounds):
        if bound is None:
            inputs.append(gs.Variable(""))
        elif bound == "computed":
            inputs.append(gs.Variable(f"b{i}"))
        else:
            inputs.append(gs.Constant(f"b{i}", np.array(bound, np.float32)))
    return gs.Node("Clip", "clip", attrs, inputs, [gs.Variable("y")])


@pytest.mark.parametrize(
    ("node", "bounds"),
    [
        (clip(0.0, 6.0), (0.0, 6.0)),
        (clip(0.0), (0.0, np.inf)),
        (clip(None, 1.0), (-np.inf, 1.0)),
        (clip(), (-np.inf, np.inf)),
        (clip(0.0, "computed"), (0.0, None)),
        (clip(min=0.0, max=6.0), (0.0, 6.0)),  # opset < 11: attributes
    ],
)
def test_clip_bounds(node: gs.Node, bounds: tuple[float | None, float | None]) -> None:
    assert clip_bounds(node) == bounds


def test_clip_bounds_on_node_protos_as_the_cpu_lowering_reads_them() -> None:
    inits = {"lo": numpy_helper.from_array(np.array(0.0, np.float32), "lo")}
    node = helper.make_node("Clip", ["x", "lo", "hi"], ["y"])

    def value(name: str) -> np.ndarray | None:
        return numpy_helper.to_array(inits[name]) if name in inits else None

    assert read_clip_bounds({}, node.input[1:3], value, lambda n: not n) == (0.0, None)  # hi is computed
    node = helper.make_node("Clip", ["x", "", "lo"], ["y"])
    assert read_clip_bounds({}, node.input[1:3], value, lambda n: not n) == (-np.inf, 0.0)


@pytest.mark.parametrize(
    ("dims", "text"),
    [
        ((1, 3, 224, 224), "[1, 3, 224, 224]"),
        (("batch", 3, None, -1), "[batch, 3, ?, ?]"),
        ([np.int64(2), ""], "[2, ?]"),
        ((), "[]"),
        (None, "unknown"),
    ],
)
def test_format_shape(dims: object, text: str) -> None:
    assert format_shape(dims) == text  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("dims", "unknown", "text"),
    [
        ((1, 3, 224, 224), None, "1x3x224x224"),
        (("batch", 3, None, -1), None, "batchx3x?x?"),
        (("batch", 3, None, np.int64(7)), "N", "Nx3xNx7"),
        ((), None, "scalar"),
        (None, None, "?"),
    ],
)
def test_format_dims(dims: object, unknown: str | None, text: str) -> None:
    """The table form of the same dimensions (inspect, sparsity tables, TensorRT's --shapes example)."""
    assert format_dims(dims, unknown=unknown) == text  # type: ignore[arg-type]


def test_stable_topological_order() -> None:
    assert stable_topological_order([set(), {0}, {0}, {1, 2}]) == [0, 1, 2, 3]  # sorted: unchanged
    assert stable_topological_order([{2}, set(), {1}]) == [1, 2, 0]
    assert stable_topological_order([{1}, {0}, set()]) == [2]  # 0 and 1 form a cycle: left out


def test_clip_model_round_trip_keeps_bounds() -> None:
    """A Clip exported by onnx-graphsurgeon and read back gives the same bounds (Constant-node bounds too)."""
    lo = helper.make_node("Constant", [], ["lo"], value=numpy_helper.from_array(np.array(0.0, np.float32)))
    hi = helper.make_node("Constant", [], ["hi"], value=numpy_helper.from_array(np.array(6.0, np.float32)))
    node = helper.make_node("Clip", ["x", "lo", "hi"], ["y"], name="clip")
    value_info = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1]) for n in ("x", "y")]
    graph = gs.import_onnx(helper.make_model(helper.make_graph([lo, hi, node], "g", value_info[:1], value_info[1:])))
    (clip_node,) = [n for n in graph.nodes if n.op == "Clip"]
    assert clip_bounds(clip_node) == (0.0, 6.0)
