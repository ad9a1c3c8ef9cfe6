"""fold_batchnorm: BN and constant per-channel Mul/Add/Sub/Div fold into Conv, ConvTranspose and Gemm."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from pass_helpers import assert_same_outputs, ops, run_pass

from trtopt.frontend import graph_from_onnx
from trtopt.zoo import GraphBuilder, build_model


def conv_bn_relu(opset: int = 17) -> onnx.ModelProto:
    """input ─ Conv3x3 (no bias) ─ BN ─ Relu ─ output"""
    b = GraphBuilder("conv_bn_relu", seed=1, opset=opset)
    x = b.input("input", [2, 8, 10, 10])
    return b.build([b.relu(b.batchnorm(b.conv(x, 8, 16, 3, bias=False), 16), out="output")])


@pytest.mark.parametrize("opset", [11, 13, 17, 21])
def test_conv_bn_folds_into_conv_with_bias(opset: int) -> None:
    model = conv_bn_relu(opset)
    graph, report = run_pass(model, "fold_batchnorm")
    assert ops(graph) == ["Conv", "Relu"]
    assert report.counts() == {"fold_bn": 1} and report.nodes_before - report.nodes_after == 1
    assert len(graph.nodes[0].inputs) == 3  # a bias was created
    assert_same_outputs(model, graph)


def test_conv_transpose_grouped_and_affine_chain() -> None:
    """input ─ ConvTranspose (group 2, bias) ─ BN ─ Mul[1,C,1,1] ─ Add[C,1,1] ─ Sub scalar
    ─ Div[1,C,1,1] ─ output"""
    b = GraphBuilder("deconv", seed=2, opset=17)
    x = b.input("input", [1, 8, 6, 6])
    w = b.const("w", b.he_weight((8, 3, 3, 3), 36))
    y = b.node("ConvTranspose", [x, w, b.const("b", b.bias(6))], group=2, strides=[2, 2], kernel_shape=[3, 3])
    y = b.batchnorm(y, 6)
    y = b.mul(y, b.const("s", np.linspace(0.5, 1.5, 6, dtype=np.float32).reshape(1, 6, 1, 1)))
    y = b.add(y, b.const("t", np.linspace(-1, 1, 6, dtype=np.float32).reshape(6, 1, 1)))
    y = b.node("Sub", [y, b.const("c", np.array(0.25, np.float32))])
    y = b.node(
        "Div", [y, b.const("d", np.linspace(1, 2, 6, dtype=np.float32).reshape(1, 6, 1, 1))], out="output"
    )
    model = b.build([y])
    graph, report = run_pass(model, "fold_batchnorm")
    assert ops(graph) == ["ConvTranspose"]
    assert report.counts() == {"fold_bn": 1, "fold_mul": 1, "fold_add": 1, "fold_sub": 1, "fold_div": 1}
    assert graph.outputs[0].name == "output" and graph.nodes[0].outputs[0].name == "output"
    assert_same_outputs(model, graph)


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_bn_folds_alpha_and_beta(trans_b: int) -> None:
    """input ─ Gemm (alpha 0.5, beta 2, transB) ─ BN ─ output"""
    b = GraphBuilder("gemm_bn", seed=3, opset=13)
    x = b.input("input", [4, 12])
    w = b.he_weight((10, 12), 12)
    w = w if trans_b else np.ascontiguousarray(w.T)
    y = b.node("Gemm", [x, b.const("w", w), b.const("c", b.bias(10))], alpha=0.5, beta=2.0, transB=trans_b)
    model = b.build([b.batchnorm(y, 10, out="output")])
    graph, _ = run_pass(model, "fold_batchnorm")
    assert ops(graph) == ["Gemm"] and graph.nodes[0].attrs["alpha"] == 1.0
    assert_same_outputs(model, graph)


def test_shared_weight_is_not_modified_in_place() -> None:
    """Two convs share one weight; only the first is followed by a BN.

    input ─┬─ Conv(W) ─ BN ─ out_a
           └─ Conv(W) ─────── out_b
    """
    b = GraphBuilder("shared", seed=4, opset=17)
    x = b.input("input", [1, 4, 8, 8])
    w = b.const("w", b.he_weight((4, 4, 3, 3), 36))
    a = b.node("Conv", [x, w], pads=[1, 1, 1, 1])
    out_a = b.batchnorm(a, 4, out="out_a")
    out_b = b.node("Conv", [x, w], out="out_b", pads=[1, 1, 1, 1])
    model = b.build([out_a, out_b])
    original = onnx.numpy_helper.to_array(model.graph.initializer[0]).copy()
    graph, report = run_pass(model, "fold_batchnorm")
    assert report.counts() == {"fold_bn": 1}
    other = next(n for n in graph.nodes if n.outputs[0].name == "out_b")
    np.testing.assert_array_equal(other.inputs[1].values, original)
    assert_same_outputs(model, graph)


def test_no_fold_across_graph_output_or_second_consumer() -> None:
    """input ─ Conv ─┬─ BN ─ out          (conv output is also a graph output)
                  └──────── conv_out
    input ─ Conv2 ─┬─ BN ─ out2        (conv output has a second reader)
                   └─ Relu ─ out3
    """
    b = GraphBuilder("negatives", seed=5, opset=17)
    x = b.input("input", [1, 4, 8, 8])
    c1 = b.conv(x, 4, 4, 3, out="conv_out")
    c2 = b.conv(x, 4, 4, 3)
    model = b.build(
        [b.batchnorm(c1, 4, out="out"), c1, b.batchnorm(c2, 4, out="out2"), b.relu(c2, out="out3")]
    )
    graph, report = run_pass(model, "fold_batchnorm")
    assert not report.changed and report.summary() == "no match (unchanged)"
    assert ops(graph).count("BatchNormalization") == 2


def test_last_axis_constant_is_not_a_channel_scale() -> None:
    """A Mul by shape (C,) broadcasts along W, not channels, even when W == C: must not fold.

    input (1x6x6x6) ─ Conv ─ Mul[6] ─ output
    """
    b = GraphBuilder("last_axis", seed=6, opset=17)
    x = b.input("input", [1, 6, 6, 6])
    y = b.mul(b.conv(x, 6, 6, 3), b.const("s", np.linspace(0.5, 2, 6, dtype=np.float32)), out="output")
    graph, report = run_pass(b.build([y]), "fold_batchnorm")
    assert not report.changed and ops(graph) == ["Conv", "Mul"]


def test_nhwc_model_wrapped_in_transposes() -> None:
    """NHWC in and out; only the BN right after the conv folds, not the one on the NHWC tensor.

    input (NHWC) ─ Transpose ─ Conv ─ BN ─ Relu ─ Transpose ─ BN(axis 1 = H) ─ output (NHWC)
    """
    b = GraphBuilder("nhwc", seed=7, opset=17)
    x = b.input("input", [1, 8, 8, 4])
    y = b.node("Transpose", [x], perm=[0, 3, 1, 2])
    y = b.relu(b.batchnorm(b.conv(y, 4, 8, 3, bias=False), 8))
    y = b.node("Transpose", [y], perm=[0, 2, 3, 1])
    model = b.build([b.batchnorm(y, 8, out="output")])
    graph, report = run_pass(model, "fold_batchnorm")
    assert report.counts() == {"fold_bn": 1}
    assert ops(graph) == ["Transpose", "Conv", "Relu", "Transpose", "BatchNormalization"]
    assert_same_outputs(model, graph)


def test_standalone_batchnorm_and_grouped_conv_from_zoo() -> None:
    graph, report = run_pass(build_model("bn_standalone", batch=2), "fold_batchnorm")
    assert not report.changed and ops(graph).count("BatchNormalization") == 2
    model = build_model("grouped_conv", batch=2)
    graph, report = run_pass(model, "fold_batchnorm")
    assert report.counts() == {"fold_bn": 1} and graph.nodes[0].attrs["group"] == 4
    assert_same_outputs(model, graph)


def test_caller_graph_of_optimize_is_untouched() -> None:
    from trtopt.passes import optimize

    graph = graph_from_onnx(conv_bn_relu())
    result = optimize(graph, ["fold_batchnorm"])
    assert "BatchNormalization" in ops(graph) and "BatchNormalization" not in ops(result.graph)
