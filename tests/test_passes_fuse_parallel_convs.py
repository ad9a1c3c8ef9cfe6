"""fuse_parallel_convs: sibling convs on one tensor become one wide conv + Split."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from pass_helpers import assert_same_outputs, ops, run_pass

from trtopt.passes import find_fusion_groups
from trtopt.zoo import GraphBuilder, build_model


@pytest.mark.parametrize("opset", [11, 13, 18, 21])
def test_inception_1x1_siblings_fuse_and_3x3_stays(opset: int) -> None:
    """The zoo inception block: three 1x1+Relu siblings fuse; the 3x3 side conv and the pool branch stay."""
    model = build_model("inception", batch=2, opset=opset)
    graph, report = run_pass(model, "fuse_parallel_convs")
    assert report.counts() == {"fuse_parallel": 1}
    wide = [n for n in graph.nodes if n.op == "Conv" and n.inputs[0].name == "input"]
    assert sorted(n.inputs[1].shape[0] for n in wide) == [8, 8 + 8 + 4]  # 3x3 side conv + wide 1x1
    split = next(n for n in graph.nodes if n.op == "Split")
    assert split.inputs[0].inputs[0].op == "Relu"  # activation hoisted above the Split
    assert ("split" in split.attrs) == (opset < 13)
    assert "conv+relu" in {g.kind for g in find_fusion_groups(graph)}
    assert_same_outputs(model, graph)


def siblings_with_mixed_epilogues() -> onnx.ModelProto:
    """Five 1x1 siblings on one tensor, grouped by what follows them:

             ┌─ Conv a ─ Relu ─────── ra     ┐ fuse, Relu hoisted
             ├─ Conv b ─ Relu ─────── rb     ┘
    input ───┼─ Conv c ─ Sigmoid ──── sc       alone: stays
             ├─ Conv d ────────────── d      ┐ fuse as plain convs
             ├─ Conv e ─ Reshape ──── e      ┘
             └─ Conv f ─ Add(input) ─ af       keeps its residual fusion
    """
    b = GraphBuilder("mixed", seed=1, opset=17)
    x = b.input("input", [1, 4, 5, 5])
    outs = [b.relu(b.conv(x, 4, 3, 1), out="ra"), b.relu(b.conv(x, 4, 5, 1), out="rb")]
    outs.append(b.node("Sigmoid", [b.conv(x, 4, 2, 1)], out="sc"))
    outs.append(b.conv(x, 4, 3, 1, out="d"))
    shape = b.const("shape", np.array([1, -1], np.int64))
    outs.append(b.node("Reshape", [b.conv(x, 4, 2, 1), shape], out="e"))
    outs.append(b.add(b.conv(x, 4, 4, 1), x, out="af"))
    return b.build(outs)


def test_siblings_with_different_activations() -> None:
    model = siblings_with_mixed_epilogues()
    graph, report = run_pass(model, "fuse_parallel_convs")
    assert report.counts() == {"fuse_parallel": 2}
    convs = sorted(n.inputs[1].shape[0] for n in graph.nodes if n.op == "Conv")
    assert convs == [2, 4, 3 + 2, 3 + 5]
    kinds = sorted(g.kind for g in find_fusion_groups(graph))
    assert kinds == ["conv+add", "conv+relu", "conv+sigmoid"]
    assert_same_outputs(model, graph)


def test_negative_cases_are_left_alone() -> None:
    """Siblings that must not fuse: grouped convs, mirrored asymmetric pads, different strides.

    input ─┬─ Conv3x3 g=2 ┐ grouped
           ├─ Conv3x3 g=2 ┘
           ├─ Conv3x3 pads [0,0,1,1] ┐ mirrored asymmetric pads
           ├─ Conv3x3 pads [1,1,0,0] ┘
           ├─ Conv1x1 stride 1 ┐ different strides
           └─ Conv1x1 stride 2 ┘
    """
    b = GraphBuilder("neg", seed=2, opset=17)
    x = b.input("input", [1, 4, 8, 8])
    outs = [b.conv(x, 4, 4, 3, group=2), b.conv(x, 4, 4, 3, group=2)]
    outs += [b.conv(x, 4, 4, 3, pads=[0, 0, 1, 1]), b.conv(x, 4, 4, 3, pads=[1, 1, 0, 0])]
    outs += [b.conv(x, 4, 4, 1, stride=1), b.conv(x, 4, 4, 1, stride=2)]
    graph, report = run_pass(b.build(outs), "fuse_parallel_convs")
    assert not report.changed and ops(graph).count("Conv") == 6


def test_identical_asymmetric_pads_and_shared_weight() -> None:
    """Two siblings with the same asymmetric pads, one sharing its weight with a conv elsewhere.

    input ─┬─ Conv(W) pads [0,1,1,0] ─ Relu ─ o1
           ├─ Conv(V) pads [0,1,1,0] ─ Relu ─ o2
           └─ Relu ─ Conv(W) pads [0,1,1,0] ─ o3   (W shared, must keep its values)
    """
    b = GraphBuilder("asym", seed=3, opset=17)
    x = b.input("input", [1, 4, 6, 6])
    w = b.const("w", b.he_weight((4, 4, 2, 2), 16))
    v = b.const("v", b.he_weight((6, 4, 2, 2), 16))
    attrs = {"kernel_shape": [2, 2], "pads": [0, 1, 1, 0]}
    o1 = b.relu(b.node("Conv", [x, w], **attrs), out="o1")
    o2 = b.relu(b.node("Conv", [x, v], **attrs), out="o2")
    o3 = b.node("Conv", [b.relu(x), w], out="o3", **attrs)
    model = b.build([o1, o2, o3])
    original = onnx.numpy_helper.to_array(model.graph.initializer[0]).copy()
    graph, report = run_pass(model, "fuse_parallel_convs")
    assert report.counts() == {"fuse_parallel": 1}
    elsewhere = next(n for n in graph.nodes if n.outputs[0].name == "o3")
    np.testing.assert_array_equal(elsewhere.inputs[1].values, original)
    assert_same_outputs(model, graph)


def test_sibling_output_that_is_a_graph_output_keeps_its_name() -> None:
    """input ─┬─ Conv ─ c1 (graph output)
    └─ Conv ─ c2 (graph output)"""
    b = GraphBuilder("outs", seed=4, opset=13)
    x = b.input("input", [2, 4, 5, 5])
    model = b.build([b.conv(x, 4, 3, 1, out="c1"), b.conv(x, 4, 6, 1, out="c2")])
    graph, report = run_pass(model, "fuse_parallel_convs")
    assert report.changed and ops(graph) == ["Conv", "Split"]
    assert [t.name for t in graph.outputs] == ["c1", "c2"]
    assert_same_outputs(model, graph)
