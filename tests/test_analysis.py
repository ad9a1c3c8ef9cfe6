"""Model analysis: MACs and parameter counts checked by hand; the optimiser's report as `inspect` shows it
(what each pass rewrites and records, from the passes' own matchers) on zoo models; and what stays unfused
(a Conv + Elu, sibling depthwise convs) on small hand-built graphs."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtopt.analysis import fusion_report, summarize
from trtopt.frontend import graph_from_onnx
from trtopt.zoo import GraphBuilder, build_model


def graph_of(name: str, **kwargs: int):  # noqa: ANN201
    return graph_from_onnx(build_model(name, **kwargs), fold_constants=False)


def changes_and_records(graph: gs.Graph) -> tuple[dict[str, object], dict[str, object]]:
    """Per pass, what it rewrites and what it records, leaving out passes with nothing."""
    report = fusion_report(graph).to_dict()
    return (
        {name: counts for name, counts in report["changes"].items() if counts},
        {name: counts for name, counts in report["recorded"].items() if counts},
    )


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


# -- the optimiser's report on zoo models ------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "changes", "records"),
    [
        ("resnet_basic", {"fold_batchnorm": {"fold_bn": 2}}, {"fuse_cbr": {"conv+relu": 1, "conv+add+relu": 1}}),
        ("mobilenetv2_block", {"fold_batchnorm": {"fold_bn": 3}}, {"fuse_cbr": {"conv+relu6": 2, "conv+add": 1}}),
        ("pad_conv", {"simplify": {"ort_basic": 1}}, {"fuse_cbr": {"conv+relu": 1}}),  # ONNX Runtime folds the Pad
        ("bn_standalone", {}, {"fuse_cbr": {"conv+add": 1}}),
        ("grouped_conv", {"fold_batchnorm": {"fold_bn": 1}}, {"fuse_cbr": {"conv+leaky_relu": 1}}),
        (
            "inception",
            {"fuse_parallel_convs": {"fuse_parallel": 1}},
            {"eliminate_concat": {"concat_in_place": 1}, "fuse_cbr": {"conv+relu": 5}},
        ),
        ("classifier_head", {"simplify": {"ort_basic": 3}}, {"fuse_cbr": {"gemm+relu": 1}}),  # MatMul+Add: Gemm
    ],
)
def test_report_per_zoo_model(name: str, changes: dict[str, object], records: dict[str, object]) -> None:
    """Conv+BN+ReLU reads as fold_bn then a conv+relu group: the fold comes first, as in optimize."""
    assert changes_and_records(graph_of(name)) == (changes, records)


@pytest.mark.parametrize("opset", [13, 17])
def test_activation_names(opset: int) -> None:
    _, records = changes_and_records(graph_of("silu_block", opset=opset))
    assert records == {"fuse_cbr": {"conv+silu": 1, "conv+hard_swish": 1, "conv+hard_sigmoid": 1}}
    _, records = changes_and_records(graph_of("mobilenetv2_block", opset=opset))
    assert records["fuse_cbr"] == {"conv+relu6": 2, "conv+add": 1}  # type: ignore[index]


def test_shufflenet_sum_residuals_are_reported(light_graph: Callable[[str], gs.Graph]) -> None:
    """Caffe2 writes residuals as Sum: fuse_cbr rewrites each to Add, and each then fuses with its conv."""
    changes, records = changes_and_records(light_graph("shufflenet"))
    assert changes["fuse_cbr"] == {"sum_to_add": 13}
    assert records["fuse_cbr"]["conv+add+relu"] == 13  # type: ignore[index]


def test_summary_json_carries_the_report() -> None:
    graph = graph_of("resnet_basic")
    summary = summarize(graph, fusions=fusion_report(graph))
    data = json.loads(json.dumps(summary.to_dict()))
    assert data["fusions"]["passes"][:2] == ["simplify", "remove_noops"] and data["fusions"]["not_fused"] == []
    assert data["fusions"]["changes"]["fold_batchnorm"] == {"fold_bn": 2}
    assert summarize(graph).to_dict()["fusions"] is None


# -- what stays unfused, on hand-built graphs ---------------------------------------------------------


def builder(opset: int = 17) -> tuple[GraphBuilder, str]:
    b = GraphBuilder("t", seed=0, opset=opset)
    return b, b.input("input", [1, 8, 8, 8])


def test_conv_elu_is_a_note_not_a_group() -> None:
    """input ─ Conv ─ Elu ─ a;   input ─ Conv ─ Relu ─ Selu ─ b (the group conv+relu, then Selu)"""
    b, x = builder()
    a = b.node("Elu", [b.conv(x, 8, 8, 3)], out="a")
    c = b.node("Selu", [b.relu(b.conv(x, 8, 8, 1))], out="c")
    report = fusion_report(graph_from_onnx(b.build([a, c])))
    assert [g.kind for g in report.result.fusion_groups] == ["conv+relu"]
    assert [n.kind for n in report.not_fused] == ["conv+elu", "conv+selu"]
    assert "relu6" in report.not_fused[0].reason


def test_sibling_depthwise_convs_are_a_note() -> None:
    """input ─┬─ DWConv3x3 ─ a     (group 8: fuse_parallel_convs leaves them apart)
              └─ DWConv3x3 ─ b"""
    b, x = builder()
    outs = [b.conv(x, 8, 8, 3, group=8, out=name) for name in ("a", "b")]
    report = fusion_report(graph_from_onnx(b.build(outs)))
    assert not report.result.changed
    (note,) = report.not_fused
    assert note.kind == "sibling_grouped_convs" and len(note.nodes) == 2 and "group=1" in note.reason


def test_siblings_with_other_geometry_are_neither_fused_nor_noted() -> None:
    """input ─┬─ Conv1x1 ─ a;  ├─ Conv1x1 stride 2 ─ b;  └─ Conv1x1 pads 1 ─ c"""
    b, x = builder()
    outs = [
        b.conv(x, 8, 4, 1, out="a"),
        b.conv(x, 8, 4, 1, stride=2, out="b"),
        b.conv(x, 8, 4, 1, pads=[1] * 4, out="c"),
    ]
    report = fusion_report(graph_from_onnx(b.build(outs)))
    assert not report.result.changed and report.not_fused == ()


def test_computed_clip_bound_is_no_activation() -> None:
    """input ─ Conv ─ Clip(0, 3) ─ a;  input ─ Conv ─ Clip(0, input-dependent max) ─ b"""
    b, x = builder()
    a = b.clip(b.conv(x, 8, 8, 1), 0.0, 3.0, out="a")
    zero = b.const("zero", np.array(0.0, np.float32))
    bound = b.node("ReduceMax", [x], keepdims=0)
    c = b.node("Clip", [b.conv(x, 8, 8, 3), zero, bound], out="b")
    report = fusion_report(graph_from_onnx(b.build([a, c]), fold_constants=False))
    assert [g.kind for g in report.result.fusion_groups] == ["conv+clip"]
