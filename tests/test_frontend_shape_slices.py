"""`Shape` with `start` / `end` (opset 15+) survives constant folding (trtopt.frontend.shape_slices):
onnx-graphsurgeon 0.6.1 folded it as the input's whole shape."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from trtopt.frontend.loader import graph_from_onnx, onnx_from_graph


def _model(attrs: dict[str, int], static: bool) -> onnx.ModelProto:
    """x [2, 3, 4, 5] -> Shape(attrs) -> ReduceProd -> Reshape y [120] to [product, -1]: the output's shape is
    the sliced shape's product, so a wrong slice shows."""
    dims: list[int | str] = [2, 3, 4, 5] if static else ["n", 3, 4, 5]
    nodes = [helper.make_node("Shape", ["x"], ["s"], **attrs),
             helper.make_node("ReduceProd", ["s"], ["p"], keepdims=1),
             helper.make_node("Concat", ["p", "minus_one"], ["target"], axis=0),
             helper.make_node("Reshape", ["y", "target"], ["z"])]  # fmt: skip
    graph = helper.make_graph(
        nodes, "shape_slice",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [120])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [helper.make_tensor("minus_one", TensorProto.INT64, [1], [-1])],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("attrs", [{"start": 1, "end": 3}, {"start": -2}, {"end": 1}, {"start": 2, "end": -1}, {}])
@pytest.mark.parametrize("static", [True, False])
def test_folded_graph_computes_the_sliced_shape(attrs: dict[str, int], static: bool) -> None:
    model = _model(attrs, static)
    feeds = {"x": np.zeros((2, 3, 4, 5), np.float32), "y": np.arange(120, dtype=np.float32)}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    folded = onnx_from_graph(graph_from_onnx(model))
    got = ort.InferenceSession(folded.SerializeToString()).run(None, feeds)[0]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    # where the slice keeps the dynamic batch the shape does not fold: one Shape node again, as written
    assert len(folded.graph.node) <= len(model.graph.node) and "Slice" not in {n.op_type for n in folded.graph.node}
    shapes = [n for n in folded.graph.node if n.op_type == "Shape"]
    assert len(shapes) == (0 if static or attrs.get("start", 0) % 4 > 0 else 1)
    assert all({a.name: a.i for a in shape.attribute} == attrs for shape in shapes)


def _window_pad_model() -> onnx.ModelProto:
    """Swin's pad to a multiple of the window, then a reshape by the padded size, batch symbolic:
    x [n, 4, 6, 6] -> pads = (8 - Shape(x)[3]) % 8 at the end of the last axis -> Pad -> y [n, 4, 6, 8]
      -> Reshape(y, [-1, Shape(y)[3]]) -> z [n * 24, 8]
    Folding Shape(x)[3] makes the pads constant; only shape inference after that knows y's last dimension, which
    the second Shape reads: two rounds of folding."""
    i64 = TensorProto.INT64
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "three"], ["w"], axis=0),
             helper.make_node("Sub", ["eight", "w"], ["short"]),
             helper.make_node("Mod", ["short", "eight"], ["extra"]),
             helper.make_node("Concat", ["zeros7", "extra"], ["pads"], axis=0),
             helper.make_node("Pad", ["x", "pads"], ["y"]),
             helper.make_node("Shape", ["y"], ["t"]),
             helper.make_node("Gather", ["t", "three1"], ["v"], axis=0),
             helper.make_node("Concat", ["minus_one", "v"], ["target"], axis=0),
             helper.make_node("Reshape", ["y", "target"], ["z"])]  # fmt: skip
    graph = helper.make_graph(
        nodes, "window_pad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, 6, 6])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [helper.make_tensor("three", i64, [1], [3]), helper.make_tensor("three1", i64, [1], [3]),
         helper.make_tensor("eight", i64, [1], [8]), helper.make_tensor("zeros7", i64, [7], [0] * 7),
         helper.make_tensor("minus_one", i64, [1], [-1])],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_shapes_fold_round_after_round_where_inference_learns_more() -> None:
    model = _window_pad_model()
    graph = graph_from_onnx(model)
    assert [n.op for n in graph.nodes] == ["Pad", "Reshape"]
    assert list(graph.nodes[0].inputs[1].values) == [0, 0, 0, 0, 0, 0, 0, 2]
    x = np.random.default_rng(0).standard_normal((3, 4, 6, 6)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    folded = onnx_from_graph(graph)
    actual = ort.InferenceSession(folded.SerializeToString()).run(None, {"x": x})[0]
    assert expected.shape == (72, 8)
    np.testing.assert_array_equal(actual, expected)
