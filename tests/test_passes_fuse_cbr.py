"""fuse_cbr: conv + bias + activation and conv + residual Add (+ activation) groups."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from pass_helpers import assert_same_outputs, ops, run_pass

from trtopt.frontend import graph_from_onnx
from trtopt.passes import find_fusion_groups
from trtopt.zoo import GraphBuilder


def conv_then(act: str, opset: int = 17) -> onnx.ModelProto:
    """input ─ Conv3x3 ─ <activation> ─ output"""
    b = GraphBuilder(f"conv_{act}", seed=1, opset=opset)
    x = b.input("input", [2, 4, 8, 8])
    y = b.conv(x, 4, 8, 3)
    if act == "relu6":
        y = b.clip(y, 0.0, 6.0, out="output")
    elif act == "silu":
        y = b.silu(y, out="output")
    elif act == "hard_swish":
        y = b.hard_swish(y, out="output")
    else:
        op = {"relu": "Relu", "leaky_relu": "LeakyRelu", "sigmoid": "Sigmoid", "hard_sigmoid": "HardSigmoid"}[
            act
        ]
        y = b.node(op, [y], out="output")
    return b.build([y])


@pytest.mark.parametrize(
    "act", ["relu", "relu6", "leaky_relu", "sigmoid", "hard_sigmoid", "hard_swish", "silu"]
)
def test_conv_activation_group(act: str) -> None:
    model = conv_then(act)
    graph, _ = run_pass(model, "fuse_cbr")
    (group,) = find_fusion_groups(graph)
    assert group.kind == f"conv+{act}" and group.nodes[0] == graph.nodes[0].name
    assert group.input == "input" and group.output == "output" and group.residual is None
    assert_same_outputs(model, graph)


@pytest.mark.parametrize("opset", [13, 14, 21])
def test_hard_sigmoid_gate_becomes_hard_swish_where_the_opset_has_it(opset: int) -> None:
    b = GraphBuilder("hs", seed=2, opset=opset)
    x = b.input("input", [1, 4, 6, 6])
    y = b.conv(x, 4, 4, 3)
    y = b.mul(y, b.node("HardSigmoid", [y], alpha=1 / 6, beta=0.5), out="output")
    model = b.build([y])
    graph, report = run_pass(model, "fuse_cbr")
    expected = ["Conv", "HardSwish"] if opset >= 14 else ["Conv", "HardSigmoid", "Mul"]
    assert ops(graph) == expected and report.changed == (opset >= 14)
    assert [g.kind for g in find_fusion_groups(graph)] == ["conv+hard_swish"]
    assert_same_outputs(model, graph)


def test_bias_add_and_sum_residual() -> None:
    """Caffe2 style: a conv without bias, a separate bias Add, a Sum residual.

    input ─┬─ Conv(no bias) ─ Add[1,C,1,1] ─┐
           └──────────────────────────────── Sum ─ Relu ─ output
    """
    b = GraphBuilder("caffe2", seed=3, opset=13)
    x = b.input("input", [1, 8, 6, 6])
    y = b.add(b.conv(x, 8, 8, 3, bias=False), b.const("bias", b.bias(8).reshape(1, 8, 1, 1)))
    model = b.build([b.relu(b.node("Sum", [y, x]), out="output")])
    graph, report = run_pass(model, "fuse_cbr")
    assert report.counts() == {"fold_bias": 1, "sum_to_add": 1}
    assert ops(graph) == ["Conv", "Add", "Relu"]
    (group,) = find_fusion_groups(graph)
    assert group.kind == "conv+add+relu" and group.residual == "input" and group.output == "output"
    assert_same_outputs(model, graph)


def test_two_conv_branches_fuse_the_later_one() -> None:
    """ResNet projection block: the conv computed last takes the Add; the other is its residual.

    input ─┬─ Conv a (shortcut) ───────┐
           └─ Conv b ─ Relu ─ Conv c ─ Add ─ output
    """
    b = GraphBuilder("proj", seed=4, opset=17)
    x = b.input("input", [1, 4, 8, 8])
    shortcut = b.conv(x, 4, 8, 1)
    main = b.conv(b.relu(b.conv(x, 4, 8, 3)), 8, 8, 3)
    model = b.build([b.add(main, shortcut, out="output")])
    graph, _ = run_pass(model, "fuse_cbr")
    groups = {g.kind: g for g in find_fusion_groups(graph)}
    assert set(groups) == {"conv+relu", "conv+add"}
    assert groups["conv+add"].residual == shortcut
    assert_same_outputs(model, graph)


def test_never_fused_across_a_materialised_tensor() -> None:
    """No group where the conv output is a graph output, has two readers, or the Add broadcasts.

    input ─ Conv1 ─ Relu ─ r1          (Conv1 output is a graph output too)
    input ─ Conv2 ─┬─ Sigmoid ─ s2     (two readers)
                   └─ Tanh ─ t2
    input ─ Conv3 (1 channel) ─ Add(input: 4 channels, broadcast) ─ a3
    """
    b = GraphBuilder("neg", seed=5, opset=17)
    x = b.input("input", [1, 4, 6, 6])
    c1 = b.conv(x, 4, 4, 3, out="c1")
    c2 = b.conv(x, 4, 4, 3)
    c3 = b.conv(x, 4, 1, 3)
    outputs = [b.relu(c1), c1, b.node("Sigmoid", [c2]), b.node("Tanh", [c2]), b.add(c3, x)]
    model = b.build(outputs)
    graph, report = run_pass(model, "fuse_cbr")
    assert not report.changed and find_fusion_groups(graph) == []
    assert_same_outputs(model, graph)


def test_group_nodes_get_names_when_the_model_has_none() -> None:
    model = conv_then("relu")
    for node in model.graph.node:
        node.name = ""
    graph, _ = run_pass(model, "fuse_cbr")
    assert [g.nodes for g in find_fusion_groups(graph)] == [("Conv_0", "Relu_1")]


def test_silu_with_a_third_reader_is_not_a_group() -> None:
    b = GraphBuilder("silu3", seed=6, opset=17)
    x = b.input("input", [1, 4, 6, 6])
    y = b.conv(x, 4, 4, 3)
    model = b.build([b.silu(y, out="output"), b.relu(y, out="side")])
    graph = graph_from_onnx(model)
    assert find_fusion_groups(graph) == []
    assert np.isfinite(assert_same_outputs(model, run_pass(model, "fuse_cbr")[0]))
