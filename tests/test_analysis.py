"""Model analysis: MACs and parameter counts checked by hand, and each fusion matcher on zoo models
(positive) and small hand-built graphs (negative)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtopt.analysis import find_opportunities, summarize
from trtopt.analysis.opportunities import (
    match_concats,
    match_conv_activation,
    match_conv_add,
    match_conv_bn,
    match_sibling_convs,
)
from trtopt.frontend import graph_from_onnx
from trtopt.zoo import GraphBuilder, build_model


def graph_of(name: str, **kwargs: int):  # noqa: ANN201
    return graph_from_onnx(build_model(name, **kwargs), fold_constants=False)


def kinds(graph) -> dict[str, int]:  # noqa: ANN001
    counts: dict[str, int] = {}
    for match in find_opportunities(graph):
        counts[match.kind] = counts.get(match.kind, 0) + 1
    return counts


# -- summary --------------------------------------------------------------------------------------


def test_resnet_basic_counts() -> None:
    summary = summarize(graph_of("resnet_basic"), source="x.onnx", opset=17)
    assert summary.macs == 2 * (16 * 16 * 16) * (16 * 3 * 3)
    assert summary.params == 2 * 16 * 16 * 9 + 2 * 4 * 16  # two bias-free convs, two BNs
    assert summary.op_histogram == {"BatchNormalization": 2, "Conv": 2, "Relu": 2, "Add": 1}
    assert summary.elementwise == 5 * 16 * 16 * 16  # 2 BN, 2 Relu, 1 Add
    expected_input = {"name": "input", "shape": [1, 16, 16, 16], "dtype": "float32"}
    assert [t.to_dict() for t in summary.inputs] == [expected_input]
    data = json.loads(json.dumps(summary.to_dict()))
    assert data["macs"] == summary.macs and data["nodes"] == 7 and data["unknown_cost"] == []


def test_grouped_conv_and_head_macs() -> None:
    assert summarize(graph_of("grouped_conv")).macs == 32 * 16 * 16 * (16 // 4) * 9
    head = summarize(graph_of("classifier_head"))
    assert head.macs == 64 * 32 + 32 * 10  # Gemm + MatMul
    assert head.params == 64 * 32 + 32 + 32 * 10 + 10


def test_clip_bounds_are_not_parameters() -> None:
    summary = summarize(graph_of("mobilenetv2_block"))
    assert summary.params == 16 * 96 + 96 * 9 + 96 * 16 + 4 * (96 + 96 + 16)


def test_conv_transpose_and_constant_nodes() -> None:
    """input (4x8x8) ─ ConvTranspose stride 2 (4->2) ─ Add(Constant node [1,2,1,1]) ─ output"""
    weight = numpy_helper.from_array(np.ones((4, 2, 3, 3), np.float32), "w")
    shift = numpy_helper.from_array(np.ones((1, 2, 1, 1), np.float32))
    nodes = [
        helper.make_node("ConvTranspose", ["input", "w"], ["y"], strides=[2, 2], name="up"),
        helper.make_node("Constant", [], ["k"], value=shift),
        helper.make_node("Add", ["y", "k"], ["output"], name="shift"),
    ]
    graph = helper.make_graph(
        nodes, "t", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, None)], [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    summary = summarize(graph_from_onnx(model, fold_constants=False))
    assert summary.macs == 4 * 8 * 8 * 2 * 3 * 3
    assert summary.params == 4 * 2 * 9 + 2
    layer = summary.layers[0]
    assert (layer.op, layer.output_shape) == ("ConvTranspose", (1, 2, 17, 17))


def test_dynamic_batch_counts_per_sample_and_unknown_dims_are_listed() -> None:
    model = build_model("resnet_basic")
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[0].dim_param = "N"
    assert summarize(graph_from_onnx(model, fold_constants=False)).macs == 2 * 16**4 * 9
    dims[2].dim_param = "H"
    summary = summarize(graph_from_onnx(model, fold_constants=False))
    assert summary.inputs[0].shape == ("N", 16, "H", 16)
    assert "conv_1" in summary.unknown_cost and summary.macs == 0


def test_top_layers() -> None:
    top = summarize(graph_of("tiny_cnn")).top_layers(3)
    assert [layer.op for layer in top] == ["Conv"] * 3
    assert top[0].macs >= top[1].macs >= top[2].macs  # type: ignore[operator]


# -- matchers on zoo models -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("resnet_basic", {"conv_bn": 2, "conv_act": 1, "conv_add": 1}),
        ("resnet_bottleneck", {"conv_bn": 4, "conv_act": 2, "conv_add": 1}),
        ("inception", {"conv_act": 7, "sibling_convs": 1, "concat": 1}),
        ("mobilenetv2_block", {"conv_bn": 3, "conv_act": 2, "conv_add": 1}),
        ("bn_standalone", {"conv_add": 1}),
        ("pad_conv", {"conv_act": 1}),
        ("grouped_conv", {"conv_bn": 1, "conv_act": 1}),
        ("silu_block", {"conv_act": 3}),
        ("classifier_head", {}),
    ],
)
def test_opportunities_per_zoo_model(name: str, expected: dict[str, int]) -> None:
    assert kinds(graph_of(name)) == expected


@pytest.mark.parametrize("opset", [13, 17])
def test_activation_names(opset: int) -> None:
    assert [m.activation for m in match_conv_activation(graph_of("silu_block", opset=opset))] == [
        "silu", "hard_swish", "hard_sigmoid",
    ]
    relu6 = match_conv_activation(graph_of("mobilenetv2_block", opset=opset))
    assert [m.activation for m in relu6] == ["relu6", "relu6"]
    assert [m.activation for m in match_conv_activation(graph_of("grouped_conv"))] == ["leaky_relu"]


def test_conv_add_details() -> None:
    (basic,) = match_conv_add(graph_of("resnet_basic"))
    assert basic.residual == "input" and basic.bn is not None and basic.relu is not None
    (inverted,) = match_conv_add(graph_of("mobilenetv2_block"))
    assert inverted.relu is None


def test_siblings_and_concat_in_inception() -> None:
    graph = graph_of("inception")
    (group,) = match_sibling_convs(graph)
    assert group.input == "input" and len(group.convs) == 3
    assert group.signature == ((1, 1), (1, 1), (0, 0, 0, 0), (1, 1), (1,))
    (concat,) = match_concats(graph)
    assert concat.in_place and concat.axis == 1 and not concat.nested and concat.split is None
    assert concat.to_dict()["kind"] == "concat"


# -- negative and edge cases on hand-built graphs -------------------------------------------------


def builder(opset: int = 17) -> tuple[GraphBuilder, str]:
    b = GraphBuilder("t", seed=0, opset=opset)
    return b, b.input("input", [1, 8, 8, 8])


def test_conv_read_twice_does_not_fold_or_fuse() -> None:
    """input ─ Conv ─┬─ BN ─ Relu ─ a
                     └──────────── b   (the conv output is also a graph output's source)"""
    b, x = builder()
    y = b.conv(x, 8, 8, 3)
    model = b.build([b.relu(b.batchnorm(y, 8), out="a"), b.node("Identity", [y], out="b")])
    graph = graph_from_onnx(model, fold_constants=False)
    assert match_conv_bn(graph) == [] and match_conv_activation(graph) == []


def test_siblings_need_identical_geometry() -> None:
    """input ─┬─ Conv1x1 ─ a;  ├─ Conv1x1 stride 2 ─ b;  └─ Conv1x1 pads 1 ─ c"""
    b, x = builder()
    outs = [
        b.conv(x, 8, 4, 1, out="a"),
        b.conv(x, 8, 4, 1, stride=2, out="b"),
        b.conv(x, 8, 4, 1, pads=[1] * 4, out="c"),
    ]
    assert match_sibling_convs(graph_from_onnx(b.build(outs), fold_constants=False)) == []


def test_clip_variants() -> None:
    """input ─ Conv ─ Clip(0, 3) ─ a;  input ─ Conv ─ Clip(0, input-dependent max) ─ b"""
    b, x = builder()
    a = b.clip(b.conv(x, 8, 8, 1), 0.0, 3.0, out="a")
    zero = b.const("zero", np.array(0.0, np.float32))
    bound = b.node("ReduceMax", [x], keepdims=0)
    c = b.node("Clip", [b.conv(x, 8, 8, 3), zero, bound], out="b")
    matches = match_conv_activation(graph_from_onnx(b.build([a, c]), fold_constants=False))
    assert [m.activation for m in matches] == ["clip"]


def test_nested_concat_and_identity_split() -> None:
    """input ─ Split(axis 1) ─ s0, s1 ─ Concat ─ a;   Concat(Concat(r1, r2), r3) ─ b"""
    b, x = builder(opset=18)  # Split's num_outputs
    split = helper.make_node("Split", [x], ["s0", "s1"], axis=1, num_outputs=2, name="split")
    b.nodes.append(split)
    a = b.concat(["s0", "s1"], out="a")
    inner = b.concat([b.relu(x), b.relu(x)])
    outer = b.concat([inner, b.relu(x)], out="b")
    model = b.build([a, outer])
    matches = match_concats(graph_from_onnx(model, fold_constants=False))
    by_name = {m.concat.outputs[0].name: m for m in matches}
    assert by_name["a"].split is not None and not by_name["a"].in_place
    assert len(by_name["b"].nested) == 1 and by_name["b"].in_place
