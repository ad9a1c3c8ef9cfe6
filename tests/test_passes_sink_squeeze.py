"""sink_squeeze: tf2onnx's Conv1D (Unsqueeze -> Conv -> Squeeze -> bias Add -> activation) becomes a Conv the
later passes fuse with its bias and activation; every rewrite is checked against the model in ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from pass_helpers import assert_same_outputs, ops, run_pass

from trtopt.frontend import graph_from_onnx
from trtopt.passes import optimize
from trtopt.zoo import GraphBuilder


def keras_conv1d(*, opset: int = 17, layers: int = 2, act: str = "Relu", tap: bool = False,
                 bias_shape: tuple[int, ...] = (1, 8, 1)) -> onnx.ModelProto:  # fmt: skip
    """input [1, 8, 12] ─ (Unsqueeze(2) ─ Conv 1x3 ─ Squeeze(2) ─ Add(bias) ─ act) x layers ─ output
    [tap: the first layer's Squeeze output is also a graph output]"""
    b = GraphBuilder("keras_conv1d", seed=5, opset=opset)
    x = b.input("input", [1, 8, 12])
    side = []

    def axes_node(op: str, data: str) -> str:
        if opset < 13:
            return b.node(op, [data], axes=[2])
        return b.node(op, [data, b.const(f"axes_{op}", np.array([2], np.int64))])

    for i in range(layers):
        wide = axes_node("Unsqueeze", x)
        conv = b.node("Conv", [wide, b.const(f"w{i}", b.he_weight((8, 8, 1, 3), 24))], kernel_shape=[1, 3],
                      pads=[0, 1, 0, 1])  # fmt: skip
        narrow = axes_node("Squeeze", conv)
        side += [narrow] if tap and i == 0 else []
        bias = b.node("Add", [narrow, b.const(f"bias{i}", np.resize(b.bias(8), bias_shape).astype(np.float32))])
        bounds = [b.const(f"lo{i}", np.array(0, np.float32)), b.const(f"hi{i}", np.array(6, np.float32))]
        x = b.node("Clip", [bias, *bounds]) if act == "Clip" else b.node(act, [bias])
    return b.build([b.node("Identity", [x], out="output"), *side])


@pytest.mark.parametrize("opset", [11, 13, 17])
@pytest.mark.parametrize("act", ["Relu", "Clip", "Sigmoid"])
def test_conv1d_layers_become_convs_with_bias_and_activation(opset: int, act: str) -> None:
    model = keras_conv1d(opset=opset, act=act)
    graph, report = run_pass(model, "sink_squeeze")
    # each layer's Squeeze moves below its Add and activation; between layers it meets the next Unsqueeze
    assert report.counts() == {"sink_squeeze": 4, "squeeze_unsqueeze": 1}
    assert ops(graph) == ["Unsqueeze", "Conv", "Add", act, "Conv", "Add", act, "Squeeze", "Identity"]
    assert_same_outputs(model, graph)
    optimized = optimize(graph_from_onnx(model))  # then the bias goes into the Conv and the activation fuses
    # remove_noops takes the Identity: the Squeeze writes the graph output itself
    assert ops(optimized.graph) == ["Unsqueeze", "Conv", act, "Conv", act, "Squeeze"]
    assert all(len(n.inputs) == 3 for n in optimized.graph.nodes if n.op == "Conv")
    assert_same_outputs(model, optimized.graph)


@pytest.mark.parametrize("bias_shape", [(8, 1), (1, 1, 12), (1,)])
def test_constants_of_other_shapes_broadcast_as_before(bias_shape: tuple[int, ...]) -> None:
    """A per-channel bias without the batch axis, one along the sequence, a scalar: the same values after."""
    model = keras_conv1d(layers=1, bias_shape=bias_shape)
    graph, report = run_pass(model, "sink_squeeze")
    assert report.counts() == {"sink_squeeze": 2} and ops(graph)[-2:] == ["Squeeze", "Identity"]
    assert_same_outputs(model, graph)


def test_a_squeeze_output_read_elsewhere_stays() -> None:
    """The first layer's Squeeze output is a graph output: nothing moves across it; the second layer's does."""
    model = keras_conv1d(tap=True)
    graph, report = run_pass(model, "sink_squeeze")
    assert report.counts() == {"sink_squeeze": 2}
    assert [o.name for o in graph.outputs] == [o.name for o in model.graph.output]
    assert_same_outputs(model, graph)


def test_ops_that_are_not_elementwise_stop_it() -> None:
    """Softmax over an axis, and an Unsqueeze of other axes, keep the Squeeze above them."""
    b = GraphBuilder("softmax", seed=1, opset=17)
    x = b.input("input", [2, 1, 5])
    narrow = b.node("Squeeze", [x, b.const("axes", np.array([1], np.int64))])
    soft = b.node("Softmax", [narrow], axis=-1)
    wide = b.node("Unsqueeze", [soft, b.const("axes2", np.array([0], np.int64))])
    model = b.build([b.node("Identity", [wide], out="output")])
    graph, report = run_pass(model, "sink_squeeze")
    assert not report.changed and ops(graph) == ["Squeeze", "Softmax", "Unsqueeze", "Identity"]


def test_a_constant_wider_than_the_squeezed_tensor_stops_it() -> None:
    """x [1, 8, 12] + c [3, 8, 12] gives [3, 8, 12]: moved above the Squeeze it would change the tensor's batch,
    so it stays (the values would agree, but the shapes the later passes read would not)."""
    b = GraphBuilder("wide", seed=2, opset=17)
    x = b.input("input", [1, 8, 1, 12])
    narrow = b.node("Squeeze", [x, b.const("axes", np.array([2], np.int64))])
    wide = b.node("Add", [narrow, b.const("c", np.ones((3, 8, 12), np.float32))])
    model = b.build([b.node("Relu", [wide], out="output")])
    graph, report = run_pass(model, "sink_squeeze")
    assert not report.changed and ops(graph) == ["Squeeze", "Add", "Relu"]
