"""collapse_reshapes: a chain of Reshape / Flatten / Squeeze / Unsqueeze whose intermediate results nothing else
reads becomes one Reshape (static shapes, or a dynamic leading batch dimension written as -1)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper
from pass_helpers import assert_same_outputs, ops, run_pass

from trtopt.execution.ort_session import run_model
from trtopt.zoo import GraphBuilder


def head(*, batch: int | str, side: bool = False) -> onnx.ModelProto:
    """input ─ GlobalAveragePool ─ Squeeze(2, 3) ─ Unsqueeze(1) ─ Flatten ─ Reshape(-1, 16) ─ Gemm ─ output
    [the Unsqueeze output also a graph output]"""
    b = GraphBuilder("head", seed=0)
    x = b.input("input", [2, 16, 4, 4])
    y = b.node("GlobalAveragePool", [x])
    y = b.node("Squeeze", [y, b.const("axes", np.array([2, 3], np.int64))])
    y = b.node("Unsqueeze", [y, b.const("axes1", np.array([1], np.int64))], out="unsqueezed" if side else None)
    y = b.node("Flatten", [y], axis=1)
    y = b.node("Reshape", [y, b.const("shape", np.array([-1, 16], np.int64))])
    model = b.build([b.gemm(y, 16, 5, out="output"), *(["unsqueezed"] if side else [])])
    if isinstance(batch, str):
        model.graph.input[0].CopyFrom(helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 16, 4, 4]))
        del model.graph.output[:]
        model.graph.output.extend(helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                  for o in ["output", *(["unsqueezed"] if side else [])])
    return model


def test_a_static_chain_is_one_reshape() -> None:
    model = head(batch=2)
    graph, report = run_pass(model, "collapse_reshapes")
    assert ops(graph) == ["GlobalAveragePool", "Reshape", "Gemm"] and report.counts() == {"collapse_reshapes": 1}
    assert list(graph.nodes[1].inputs[1].values) == [2, 16]
    assert_same_outputs(model, graph)


def test_a_dynamic_batch_is_inferred() -> None:
    model = head(batch="N")
    graph, _ = run_pass(model, "collapse_reshapes")
    assert ops(graph) == ["GlobalAveragePool", "Reshape", "Gemm"]
    assert list(graph.nodes[1].inputs[1].values) == [-1, 16]
    feeds = {"input": np.random.default_rng(0).standard_normal((3, 16, 4, 4)).astype(np.float32)}
    before, after = run_model(model, feeds, opt_level="disable"), run_model(graph, feeds, opt_level="disable")
    assert np.allclose(before["output"], after["output"], rtol=0, atol=1e-6)


def test_a_chain_stops_at_a_result_read_elsewhere() -> None:
    model = head(batch=2, side=True)
    graph, _ = run_pass(model, "collapse_reshapes")
    assert ops(graph).count("Reshape") == 2 and "Flatten" not in ops(graph)  # Squeeze+Unsqueeze, Flatten+Reshape
    assert_same_outputs(model, graph)


def test_a_computed_flatten_shape_becomes_a_constant() -> None:
    """input(N) ─ GlobalAveragePool ─┬──────────────────────────────────── Reshape ─ Gemm ─ output
                                    └─ Shape ─ Slice(0:1) ─ Concat(·, [-1]) ─┘      (Paddle's flatten, dynamic N)"""
    b = GraphBuilder("paddle_flatten", seed=0)
    pooled = b.node("GlobalAveragePool", [b.input("input", [2, 16, 4, 4])])
    batch = b.node("Slice", [b.node("Shape", [pooled]), b.const("s", np.array([0], np.int64)),
                             b.const("e", np.array([1], np.int64))])
    shape = b.concat([batch, b.const("rest", np.array([-1], np.int64))], axis=0)
    model = b.build([b.gemm(b.node("Reshape", [pooled, shape], out="flat"), 16, 5, out="output")])
    model.graph.input[0].CopyFrom(helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 16, 4, 4]))
    # the flattened shape as an exporter records it (ONNX's own inference cannot follow the Shape arithmetic)
    model.graph.value_info.append(helper.make_tensor_value_info("flat", TensorProto.FLOAT, ["N", 16]))
    del model.graph.output[:]
    model.graph.output.extend([helper.make_tensor_value_info("output", TensorProto.FLOAT, None)])
    graph, report = run_pass(model, "collapse_reshapes")
    assert ops(graph) == ["GlobalAveragePool", "Reshape", "Gemm"] and report.counts() == {"collapse_reshapes": 1}
    feeds = {"input": np.random.default_rng(0).standard_normal((3, 16, 4, 4)).astype(np.float32)}
    before, after = run_model(model, feeds, opt_level="disable"), run_model(graph, feeds, opt_level="disable")
    assert np.allclose(before["output"], after["output"], rtol=0, atol=1e-6)


def test_a_transpose_of_unit_axes_is_a_reshape_and_one_that_moves_data_is_not() -> None:
    """input [N,16,4,4] ─ GlobalAveragePool ─ Conv1x1 ─ Transpose(0,2,3,1) ─ Reshape [-1,8] ─ Softmax ─ output
                                                     └ Transpose(0,3,2,1) of [N,8,1,2] ─ moved
    tf2onnx's Keras logits: [N, 8, 1, 1] to NHWC moves only size-1 axes, so it and its Reshape are one Reshape;
    a Transpose that swaps two axes of size > 1 stays."""
    b = GraphBuilder("keras_logits", seed=0)
    pooled = b.conv(b.node("GlobalAveragePool", [b.input("input", [2, 16, 4, 4])]), 16, 8, 1)
    y = b.node("Reshape", [b.node("Transpose", [pooled], perm=[0, 2, 3, 1]), b.const("s", np.array([-1, 8]))])
    wide = b.node("Reshape", [pooled, b.const("w", np.array([2, 4, 1, 2]))])
    model = b.build([b.node("Softmax", [y], out="output"), b.node("Transpose", [wide], perm=[0, 3, 2, 1], out="moved")])
    graph, report = run_pass(model, "collapse_reshapes")
    assert report.counts() == {"collapse_reshapes": 1} and ops(graph).count("Transpose") == 1
    assert [n.op for n in graph.nodes if n.outputs[0].name == "output"] == ["Softmax"]
    (conv,), (softmax,) = ([n for n in graph.nodes if n.op == op] for op in ("Conv", "Softmax"))
    reshape = softmax.inputs[0].inputs[0]
    assert reshape.op == "Reshape" and reshape.inputs[0] is conv.outputs[0]  # the conv's output, no Transpose
    assert_same_outputs(model, graph)


def test_a_sequence_first_head_split_gets_a_constant_shape() -> None:
    """torchvision's ViT splits heads on [tokens, batch, features]: x [5, N, 12] -> Reshape to
    [5, Shape(x)[1] * 3, 4]. The one unknown dimension is not the first; it is written -1 all the same."""
    i64 = TensorProto.INT64
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
             helper.make_node("Mul", ["n", "three"], ["heads"]),
             helper.make_node("Unsqueeze", ["heads", "zero"], ["heads1"]),
             helper.make_node("Concat", ["five", "heads1", "four"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]  # fmt: skip
    graph = helper.make_graph(
        nodes, "head_split", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, "N", 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("one", i64, [], [1]), helper.make_tensor("three", i64, [], [3]),
         helper.make_tensor("zero", i64, [1], [0]), helper.make_tensor("five", i64, [1], [5]),
         helper.make_tensor("four", i64, [1], [4])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    graph_after, report = run_pass(model, "collapse_reshapes")
    assert ops(graph_after) == ["Reshape", "Relu"] and report.counts() == {"collapse_reshapes": 1}
    assert list(graph_after.nodes[0].inputs[1].values) == [5, -1, 4]
    feeds = {"x": np.random.default_rng(0).standard_normal((5, 2, 12)).astype(np.float32)}
    np.testing.assert_array_equal(run_model(model, feeds, opt_level="disable")["y"],
                                  run_model(graph_after, feeds, opt_level="disable")["y"])
