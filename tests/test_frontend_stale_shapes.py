"""--shapes on a model whose exporter declared sizes for the inputs it traced with (LORE's lore_process.onnx:
outputs [batch, 54, 4] for any number of cells, value_info spread from them by onnx's version converter).
The declared sizes must give way to the ones inferred from the new inputs, and the graph must still compute
what the original does in ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from trtopt.execution import run_model
from trtopt.frontend import graph_from_onnx, onnx_from_graph


def stale_model(traced: int) -> onnx.ModelProto:
    """x [b, n, 4] -> Relu -> Concat with x -> MatMul -> y; the Relu, the Concat and y are declared at n =
    `traced`, whatever n the inputs have."""
    weight = helper.make_tensor("w", TensorProto.FLOAT, [8, 3], np.linspace(-1, 1, 24).tolist())
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Concat", ["r", "x"], ["c"], axis=2, name="concat"),
             helper.make_node("MatMul", ["c", "w"], ["y"], name="matmul")]  # fmt: skip
    graph = helper.make_graph(
        nodes, "stale",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", traced, 3])],
        [weight],
        value_info=[helper.make_tensor_value_info("r", TensorProto.FLOAT, ["b", traced, 4]),
                    helper.make_tensor_value_info("c", TensorProto.FLOAT, ["b", traced, 8])],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_declared_sizes_from_the_trace_give_way_to_the_shapes_set() -> None:
    model = stale_model(traced=3)
    x = np.random.default_rng(0).normal(size=(1, 5, 4)).astype(np.float32)
    want = run_model(model, {"x": x})["y"]  # ONNX Runtime runs the original (it only checks outputs at run time)
    graph = graph_from_onnx(model, shapes={"x": (1, 5, 4)})
    shapes = {name: tensor.shape for name, tensor in graph.tensors().items()}
    assert shapes["r"] == [1, 5, 4] and shapes["c"] == [1, 5, 8] and shapes["y"] == [1, 5, 3]
    got = run_model(onnx_from_graph(graph), {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_sizes_the_shapes_do_not_change_are_kept() -> None:
    model = stale_model(traced=5)  # declared sizes right for n = 5
    graph = graph_from_onnx(model, shapes={"x": (2, 5, 4)})
    assert graph.outputs[0].shape == [2, 5, 3]
