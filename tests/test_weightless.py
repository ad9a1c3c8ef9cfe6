"""trtopt.frontend.weightless: shape inference, the checker and the size of a model without encoding its weights give
what onnx gives with them (byte for byte), and the checker still refuses a weight whose bytes do not fit its dims."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtopt.frontend import weightless


def _conv_net(ir_version: int = 8, listed: bool = False) -> onnx.ModelProto:
    """x -> Conv (18 KiB of raw weights) -> Reshape (to a shape held in a small initializer) -> MatMul (float_data
    weights, 8 KiB) -> y, with a tiny raw bias; `listed` also lists the initializers as graph inputs (IR < 4)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((32, 16, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b")
    shape = numpy_helper.from_array(np.array([0, -1], np.int64), "shape")
    m = helper.make_tensor("m", TensorProto.FLOAT, [32 * 8 * 8, 8], rng.standard_normal(32 * 64 * 8).tolist())
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c", "shape"], ["r"]), helper.make_node("MatMul", ["r", "m"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16, 8, 8])]
    inits = [w, b, shape, m]
    if listed:
        inputs += [helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in inits]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])],
                              inits)  # fmt: skip
    return helper.make_model(graph, ir_version=ir_version, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("ir_version, listed", [(8, False), (3, True)])
def test_shape_inference_without_the_weights_gives_onnx_own_result(ir_version: int, listed: bool) -> None:
    model = _conv_net(ir_version, listed)
    before = model.SerializeToString()
    expected = onnx.shape_inference.infer_shapes(model, data_prop=True)
    assert weightless.infer_shapes(model, data_prop=True).SerializeToString() == expected.SerializeToString()
    graph = weightless.inferred_graph(model, data_prop=True)
    assert gs.export_onnx(graph).SerializeToString() == gs.export_onnx(gs.import_onnx(expected)).SerializeToString()
    assert graph.tensors()["r"].shape == ["n", 2048]  # the Reshape's shape came through data propagation
    assert model.SerializeToString() == before, "the caller's model is not changed"
    if not listed:  # the weight left the inference and came back: the same object's values, not a copy
        w, stored = graph.tensors()["w"], numpy_helper.to_array(model.graph.initializer[0])
        assert isinstance(w, gs.Constant) and np.array_equal(w.values, stored)


def test_the_checker_without_the_weights_passes_a_valid_model_and_names_a_short_weight() -> None:
    model = _conv_net()
    weightless.check_model(model)
    model.graph.initializer[0].raw_data = model.graph.initializer[0].raw_data[:-4]
    with pytest.raises(onnx.checker.ValidationError, match=r"tensor name: w\).*raw_data size"):
        weightless.check_model(model)
    model = _conv_net()
    del model.graph.initializer[3].float_data[-1:]  # a large weight not in raw bytes stays in the checked model
    with pytest.raises(onnx.checker.ValidationError, match=r"tensor name: m\).*float_data size"):
        weightless.check_model(model)


def test_the_size_without_encoding_bounds_protobuf_own_from_above_by_little() -> None:
    model = _conv_net()
    exact = model.ByteSize()
    assert exact <= weightless.serialized_size(model) <= exact + 8192
