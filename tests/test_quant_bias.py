"""Bias correction (trtopt.quant.bias): the expected output shift of INT8 weights, and the graph edit."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper, numpy_helper
from quant_helpers import quantize

from trtopt.execution import run_model
from trtopt.frontend import graph_from_onnx, onnx_from_graph
from trtopt.quant import QuantConfig, plan_quantization
from trtopt.quant.bias import conv_output_shift, correct_biases, gemm_output_shift, weight_error
from trtopt.quant.qdq import quantize_weight
from trtopt.zoo import GraphBuilder


def _circular_conv(x: np.ndarray, w: np.ndarray, group: int) -> np.ndarray:
    """Grouped convolution, NCHW, stride 1, with circular padding: every kernel tap sees every input
    position exactly once."""
    n, _, h, width = x.shape
    m, cg, kh, kw = w.shape
    wrapped = np.pad(x, ((0, 0), (0, 0), (0, kh - 1), (0, kw - 1)), mode="wrap")
    windows = np.lib.stride_tricks.sliding_window_view(wrapped, (kh, kw), axis=(2, 3))  # n c h w kh kw
    windows = windows.reshape(n, group, cg, h, width, kh, kw)
    weights = w.reshape(group, m // group, cg, kh, kw)
    return np.einsum("ngcyxij,gmcij->ngmyx", windows, weights).reshape(n, m, h, width)


@pytest.mark.parametrize("group", [1, 2, 8])
def test_conv_shift_is_the_mean_output_error(group: int) -> None:
    """sum_{c,k} dW[o,c,k] E[x_c] is the mean over samples and positions of conv(x, W_q) - conv(x, W),
    for dense, grouped and depthwise convs alike (exactly so when no tap falls on zero padding)."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((8, 8 // group, 3, 3)) * 3).astype(np.float32)
    x = (rng.standard_normal((4, 8, 9, 9)) + rng.uniform(0, 4, (1, 8, 1, 1))).astype(np.float32)
    error = weight_error(w, axis=0)
    x64 = x.astype(np.float64)
    measured = _circular_conv(x64, error, group).mean(axis=(0, 2, 3))
    np.testing.assert_allclose(conv_output_shift(error, x64.mean(axis=(0, 2, 3)), group), measured, rtol=1e-9)


@pytest.mark.parametrize("trans_b", [False, True])
def test_gemm_shift_is_the_mean_output_error(trans_b: bool) -> None:
    rng = np.random.default_rng(1)
    b = rng.standard_normal((6, 5) if trans_b else (5, 6)).astype(np.float32)
    x = rng.uniform(0, 2, (10, 5))  # K = 5 input features either way
    error = weight_error(b, axis=0 if trans_b else 1)
    measured = (x @ (error.T if trans_b else error)).mean(axis=0)
    np.testing.assert_allclose(gemm_output_shift(error, x.mean(axis=0), trans_b=trans_b), measured, rtol=1e-9)


def test_weight_error_is_what_insert_qdq_rounds_to() -> None:
    w = np.random.default_rng(2).standard_normal((4, 3, 3, 3)).astype(np.float32)
    q, scale = quantize_weight(w, axis=0)
    np.testing.assert_allclose(weight_error(w, 0) + w, q * scale.reshape(-1, 1, 1, 1), rtol=1e-6, atol=1e-7)


def _relu6_net() -> gs.Graph:
    """input ─ Conv 3x3 ─ Clip(0,6) ─ depthwise Conv 3x3 (no bias) ─ Clip(0,6) ─ Conv 1x1 ─ output

    The depthwise conv reads ReLU6 outputs (mean far from 0) and has large weights: the case where
    INT8 weights shift the output mean (Nagel et al. 2019, section 4.2)."""
    b = GraphBuilder("relu6_net", seed=3)
    x = b.input("input", [4, 8, 12, 12])
    y = b.clip(b.conv(x, 8, 16, 3), 0.0, 6.0)
    dw_weight = b.const("dw_w", (b.rng.standard_normal((16, 1, 3, 3)) * 4).astype(np.float32))
    y = b.clip(b.node("Conv", [y, dw_weight], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=16), 0.0, 6.0)
    return graph_from_onnx(b.build([b.conv(y, 16, 8, 1, out="output")]))


def _channel_means(graph: gs.Graph, feeds: dict[str, np.ndarray], tensors: list[str]) -> dict[str, np.ndarray]:
    acts = run_model(onnx_from_graph(graph), feeds, expose=tensors)
    return {t: acts[t].mean(axis=(0, 2, 3)) for t in tensors}


def test_corrected_biases_cancel_the_mean_error_of_each_layer() -> None:
    graph = _relu6_net()
    feeds = {"input": np.random.default_rng(4).standard_normal((4, 8, 12, 12)).astype(np.float32)}
    config = QuantConfig(min_channels=1)
    plan = plan_quantization(graph, config)
    convs = [n for n in graph.nodes if n.op == "Conv"]
    means = _channel_means(graph, feeds, [n.inputs[0].name for n in convs])
    original_bias = np.asarray(convs[0].inputs[2].values).copy()

    corrected = graph.copy()
    report = correct_biases(corrected, plan, means)
    assert report.corrected == tuple(n.name for n in convs) and not report.skipped
    dw = next(n for n in corrected.nodes if n.attrs.get("group", 1) == 16)
    assert len(dw.inputs) == 3 and dw.inputs[2].name.endswith("/bias_corrected")  # a bias was added
    np.testing.assert_array_equal(convs[0].inputs[2].values, original_bias)  # the source graph is untouched

    reference = run_model(onnx_from_graph(graph), feeds)["output"]
    errors = {}
    for name, g in (("plain", graph), ("corrected", corrected)):
        model, _, _ = quantize(g, config)
        quantized = run_model(model, feeds, opt_level="disable")["output"]  # the Q/DQ math, on any CPU kind
        errors[name] = np.abs((quantized - reference).mean(axis=(0, 2, 3))).mean()
    assert errors["corrected"] < 0.5 * errors["plain"], errors


def test_gemm_gets_a_bias_and_other_layers_say_why_not() -> None:
    """input ─ Gemm (no C, alpha 2) ─ MatMul ─ output: the Gemm gains C = -shift; MatMul has no bias."""
    rng = np.random.default_rng(5)
    weight = rng.standard_normal((6, 4)).astype(np.float32)
    gemm_w = numpy_helper.from_array(weight, "gemm_w")
    mm_w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "mm_w")
    nodes = [
        helper.make_node("Gemm", ["input", "gemm_w"], ["h"], name="gemm", transB=1, alpha=2.0),
        helper.make_node("MatMul", ["h", "mm_w"], ["output"], name="matmul"),
    ]
    inputs = [helper.make_tensor_value_info("input", TensorProto.FLOAT, [5, 4])]
    outputs = [helper.make_tensor_value_info("output", TensorProto.FLOAT, [5, 3])]
    graph = graph_from_onnx(helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, [gemm_w, mm_w])))
    plan = plan_quantization(graph, QuantConfig(min_channels=1))
    means = {"input": np.array([1.0, 2.0, 3.0, 4.0]), "h": np.ones(6)}
    report = correct_biases(graph, plan, means)
    assert report.corrected == ("gemm",) and "no bias input" in report.skipped["matmul"]
    gemm = next(n for n in graph.nodes if n.name == "gemm")
    expected = -2.0 * gemm_output_shift(weight_error(weight, 0), means["input"], trans_b=True)
    np.testing.assert_allclose(np.asarray(gemm.inputs[2].values), expected, rtol=1e-6)
    assert gemm.attrs["beta"] == 1.0


def test_layers_without_a_channel_mean_keep_their_bias() -> None:
    graph = _relu6_net()
    plan = plan_quantization(graph, QuantConfig(min_channels=1))
    before = [list(n.inputs) for n in graph.nodes]
    report = correct_biases(graph, plan, {})
    assert not report.corrected and set(report.skipped.values()) == {"no channel mean for its input"}
    assert [list(n.inputs) for n in graph.nodes] == before
