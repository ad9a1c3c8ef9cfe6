"""Pair-bounded 8-bit weights (trtopt.backend.openvino.pairs): every same-sign pair of neighbouring weights fits
AVX2's int16 sums, channels that already fit keep their grid, and OpenVINO computes what the Q/DQ graph says."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtopt.backend.openvino.pairs import PAIR_LIMIT, bound_weight_pairs, pair_sums


def _conv_model(weights: np.ndarray, scales: np.ndarray, op: str = "Conv") -> onnx.ModelProto:
    """x (uint8 grid, 0..255 steps of 1/255) ─ Q/DQ ─ Conv 1x1 (or Gemm, transB=0) with int8 weights ─ y."""
    channels = weights.shape[1] if op == "Conv" else weights.shape[0]
    axis = 0 if op == "Conv" else 1
    inits = [numpy_helper.from_array(weights, "wq"), numpy_helper.from_array(scales, "ws"),
             numpy_helper.from_array(np.float32(1 / 255), "sx"), numpy_helper.from_array(np.uint8(0), "zx")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws"], ["w"], axis=axis),
             helper.make_node(op, ["xd", "w"], ["y"], **({"kernel_shape": [1, 1]} if op == "Conv" else {}))]
    shape = [2, channels, 3, 3] if op == "Conv" else [2, channels]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])  # fmt: skip


def _weights() -> tuple[np.ndarray, np.ndarray]:
    """8 output channels of 6 inputs: channel 0 has a pair 127 + 127 (two ones at 255 give 64770 > 32767),
    channel 1 a pair of opposite signs, channel 2 a pair 100 + 29 = 129, the rest small random weights."""
    rng = np.random.default_rng(0)
    q = rng.integers(-40, 41, (8, 6, 1, 1)).astype(np.int8)
    q[0, 2:4, 0, 0] = 127
    q[1, 0:2, 0, 0] = (127, -127)
    q[2, 4:6, 0, 0] = (-100, -29)
    return q, rng.uniform(0.01, 0.02, 8).astype(np.float32)


def _ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]  # fmt: skip


def _initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def test_pair_sums_count_same_sign_neighbours_along_the_reduction_axis() -> None:
    q, _ = _weights()
    sums = pair_sums(q, 1)
    assert sums[0] == 254 and sums[1] == 127 and sums[2] == 129
    assert (sums[3:] <= 80).all()


def test_only_the_channels_that_could_overflow_get_a_coarser_scale() -> None:
    q, scales = _weights()
    model = _conv_model(q, scales)
    before = _initializers(model)
    assert bound_weight_pairs(model) == 1
    after = _initializers(model)
    assert (pair_sums(after["wq"], 1) <= PAIR_LIMIT).all()
    np.testing.assert_array_equal(after["wq"][1:2], before["wq"][1:2])  # opposite signs: already fits
    np.testing.assert_array_equal(after["wq"][3:], before["wq"][3:])
    np.testing.assert_array_equal(after["ws"][3:], before["ws"][3:])
    assert after["ws"][0] >= 254 / PAIR_LIMIT * before["ws"][0] * 0.999 and after["ws"][2] > before["ws"][2]
    dequantized = after["wq"].astype(np.float64) * after["ws"][:, None, None, None]
    original = before["wq"].astype(np.float64) * before["ws"][:, None, None, None]
    assert np.abs(dequantized - original).max() <= 0.5 * after["ws"].max() + 0.5 * before["ws"].max()
    assert bound_weight_pairs(model) == 0  # a second pass finds nothing left to do


def test_the_bounded_graph_computes_what_it_did_within_its_rounding() -> None:
    q, scales = _weights()
    model = _conv_model(q, scales)
    x = np.random.default_rng(1).uniform(0, 1, (2, 6, 3, 3)).astype(np.float32)
    expected = _ort(model, x)
    bound_weight_pairs(model)
    got = _ort(model, x)
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 0.02


def test_gemm_weights_pair_along_k() -> None:
    q, scales = _weights()
    gemm = q[:, :, 0, 0].T.copy()  # (K=6, N=8), per-column scales (axis 1)
    model = _conv_model(gemm, scales, op="Gemm")
    assert bound_weight_pairs(model) == 1
    after = _initializers(model)["wq"]
    assert (pair_sums(after.T, 1) <= PAIR_LIMIT).all()
    np.testing.assert_array_equal(after[:, 3:], gemm[:, 3:])


def test_openvino_runs_pair_bounded_weights_as_their_reference_says() -> None:
    """Inputs at the top of the uint8 grid meet the pair 127 + 127: on a CPU without VNNI plain 8-bit weights
    overflow int16 there; bounded, OpenVINO's INT8 kernels compute the Q/DQ graph's values on every CPU kind."""
    ov = pytest.importorskip("openvino")
    from trtopt.backend.cpu.lowering import lower_for_cpu

    q, scales = _weights()
    model = lower_for_cpu(_conv_model(q, scales), encoding="u8s8")
    bound_weight_pairs(model)
    x = np.ones((2, 6, 3, 3), np.float32)
    x[1] = np.random.default_rng(2).uniform(0, 1, (6, 3, 3))
    compiled = ov.Core().compile_model(ov.Core().read_model(model.SerializeToString()), "CPU",
                                       {"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": "f32"})  # fmt: skip
    got, expected = np.asarray(compiled({"x": x})[0]), _ort(model, x)
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 1e-3
    infos = [op.get_rt_info() for op in compiled.get_runtime_model().get_ordered_ops()]
    precisions = {i["runtimePrecision"].astype(str) for i in infos if i["layerType"].astype(str) == "Convolution"}
    assert precisions <= {"u8", "i8"}  # the INT8 kernel, not f32 on dequantised weights
