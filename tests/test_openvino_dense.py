"""INT8 fully connected layers written as 1x1 convs for OpenVINO (trtopt.backend.openvino.dense): the same values
on ONNX Runtime, OpenVINO's conv kernels, and the layers the rewrite must leave alone."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtopt.backend.openvino.dense import fc_as_pointwise_conv

K, N = 24, 10


def _dense_model(op: str = "Gemm", *, trans_b: int = 1, alpha: float = 1.0, rows: int = 2,
                 float_weights: bool = False, input_rank: int = 2) -> onnx.ModelProto:  # fmt: skip
    """x ─ Q/DQ (uint8) ─ Gemm / MatMul (+ Add) with int8 weights (per output channel) and an int32 bias ─ y."""
    rng = np.random.default_rng(0)
    shape = (N, K) if op == "Gemm" and trans_b else (K, N)
    q = rng.integers(-64, 64, shape).astype(np.int8)
    scales = rng.uniform(0.01, 0.02, N).astype(np.float32)
    bias = rng.integers(-500, 500, N).astype(np.int32)
    inits = [numpy_helper.from_array(np.float32(1 / 255), "sx"), numpy_helper.from_array(np.uint8(0), "zx"),
             numpy_helper.from_array(bias, "bq"), numpy_helper.from_array(scales / 255, "bs")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["bq", "bs"], ["b"], axis=0)]
    if float_weights:
        inits.append(numpy_helper.from_array(q.astype(np.float32), "w"))
    else:
        inits += [numpy_helper.from_array(q, "wq"), numpy_helper.from_array(scales, "ws")]
        nodes.append(helper.make_node("DequantizeLinear", ["wq", "ws"], ["w"], axis=0 if shape[0] == N else 1))
    if op == "Gemm":
        nodes.append(helper.make_node("Gemm", ["xd", "w", "b"], ["y"], name="fc", transB=trans_b, alpha=alpha))
    else:
        nodes += [helper.make_node("MatMul", ["xd", "w"], ["m"], name="fc"), helper.make_node("Add", ["m", "b"], ["y"])]
    x_shape = [rows, K] if input_rank == 2 else [rows, 3, K]
    y_shape = [rows, N] if input_rank == 2 else [rows, 3, N]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], inits)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]  # fmt: skip


def _input(model: onnx.ModelProto) -> np.ndarray:
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return np.random.default_rng(1).uniform(0, 1, shape).astype(np.float32)


@pytest.mark.parametrize("op, trans_b", [("Gemm", 1), ("Gemm", 0), ("MatMul", 0)])
def test_a_quantised_fc_becomes_a_1x1_conv_with_the_same_values(op: str, trans_b: int) -> None:
    model = _dense_model(op, trans_b=trans_b)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert fc_as_pointwise_conv(rewritten) == 1
    onnx.checker.check_model(rewritten, full_check=True)
    ops = [n.op_type for n in rewritten.graph.node]
    assert "Conv" in ops and op not in ops
    weights = {t.name: numpy_helper.to_array(t) for t in rewritten.graph.initializer}["wq"]
    assert weights.shape == (N, K, 1, 1)
    np.testing.assert_allclose(_ort(rewritten, _input(model)), _ort(model, _input(model)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs",
    [{"float_weights": True},  # not INT8: OpenVINO runs it in f32 either way
     {"alpha": 2.0},  # a scaled product: not a plain conv
     {"op": "MatMul", "input_rank": 3}],  # a batched matmul over 3-D rows
)  # fmt: skip
def test_other_dense_layers_are_left_alone(kwargs: dict) -> None:
    model = _dense_model(**kwargs)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert fc_as_pointwise_conv(rewritten) == 0
    assert rewritten == model


def test_openvino_runs_the_fc_on_its_int8_conv_kernel_as_its_reference_says() -> None:
    ov = pytest.importorskip("openvino")
    from trtopt.backend.cpu.lowering import lower_for_cpu

    model = lower_for_cpu(_dense_model("MatMul"), encoding="u8s8")
    fc_as_pointwise_conv(model)
    compiled = ov.Core().compile_model(ov.Core().read_model(model.SerializeToString()), "CPU",
                                       {"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": "f32"})  # fmt: skip
    infos = [op.get_rt_info() for op in compiled.get_runtime_model().get_ordered_ops()]
    layers = {i["layerType"].astype(str): i["runtimePrecision"].astype(str) for i in infos}
    assert layers.get("Convolution") in {"u8", "i8"} and "FullyConnected" not in layers, layers
    got, expected = np.asarray(compiled({"x": _input(model)})[0]), _ort(model, _input(model))
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 1e-3  # 7-bit weights: exact products
