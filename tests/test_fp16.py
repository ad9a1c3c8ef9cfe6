"""FP16 graph conversion: structure (types, Casts, Q/DQ scales) and numbers (ONNX Runtime vs FP32).

Tolerance: float16 keeps 11 significant bits, unit roundoff u = 2^-11 ~ 4.9e-4. Each layer rounds its
weights, its input and its output once, so a few-layer net accumulates a few u of error relative to
the output's magnitude: we allow 3e-3 of max|y| (about 6u). Q/DQ models get 2e-2 (see that test).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtopt.errors import ModelError
from trtopt.precision import convert_to_fp16
from trtopt.quant.qdq import quantize_weight

FLOAT, FLOAT16 = TensorProto.FLOAT, TensorProto.FLOAT16
RNG = np.random.default_rng(0)


def _f32(name: str, *shape: int, std: float = 0.3) -> onnx.TensorProto:
    return numpy_helper.from_array(RNG.normal(0, std, shape).astype(np.float32), name)


def _model(nodes, inputs, outputs, inits, opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    return model


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _rel_err(reference: np.ndarray, value: np.ndarray) -> float:
    return float(np.abs(reference - value.astype(np.float32)).max() / np.abs(reference).max())


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def _node(model: onnx.ModelProto, op: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.op_type == op)


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    graph = model.graph
    infos = list(graph.input) + list(graph.output) + list(graph.value_info)
    return {v.name: v.type.tensor_type.elem_type for v in infos}


def conv_net() -> onnx.ModelProto:
    """x -> Conv -> Relu -+-> Conv -> Add -> GlobalAveragePool -> Flatten -> Gemm -> logits -> Softmax -> prob
    |                      |_____________^
    """
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["a"]),
        helper.make_node("GlobalAveragePool", ["a"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["prob"]),
    ]
    inits = [_f32("w1", 8, 3, 3, 3), _f32("b1", 8, std=0.1), _f32("w2", 8, 8, 3, 3, std=0.2)]
    inits += [_f32("b2", 8, std=0.1), _f32("wf", 10, 8), _f32("bf", 10, std=0.1)]
    x = helper.make_tensor_value_info("x", FLOAT, ["N", 3, 16, 16])
    outs = [helper.make_tensor_value_info(n, FLOAT, ["N", 10]) for n in ("prob", "logits")]
    return _model(nodes, [x], outs, inits)


def test_conv_net_converts_weights_and_compute_and_keeps_io_fp32() -> None:
    model = conv_net()
    converted = convert_to_fp16(model)
    onnx.checker.check_model(converted, full_check=True)
    assert {i.name: i.data_type for i in converted.graph.initializer} == dict.fromkeys(
        ["w1", "b1", "w2", "b2", "wf", "bf"], FLOAT16
    )
    types = _elem_types(converted)
    assert types["x"] == FLOAT and types["prob"] == FLOAT and types["logits"] == FLOAT
    assert types["c1"] == FLOAT16 and types["a"] == FLOAT16
    # Casts: x -> fp16 at the input, logits back to fp32 (shared by the output and the kept Softmax).
    assert _ops(converted).count("Cast") == 2
    assert _node(converted, "Softmax").input[0] == "logits"

    x = RNG.normal(size=(2, 3, 16, 16)).astype(np.float32)
    for reference, value in zip(_run(model, {"x": x}), _run(converted, {"x": x}), strict=True):
        assert value.dtype == np.float32
        assert _rel_err(reference, value) < 3e-3


def test_gemm_head_matches_fp32() -> None:
    """x -> Gemm -> Relu -> Gemm -> Sigmoid -> y"""
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["z"], transB=1),
        helper.make_node("Sigmoid", ["z"], ["y"]),
    ]
    inits = [_f32("w1", 64, 32, std=0.2), _f32("b1", 64, std=0.1), _f32("w2", 5, 64, std=0.2), _f32("b2", 5)]
    x_info = helper.make_tensor_value_info("x", FLOAT, [4, 32])
    model = _model(nodes, [x_info], [helper.make_tensor_value_info("y", FLOAT, [4, 5])], inits)
    converted = convert_to_fp16(model)
    assert _ops(converted) == ["Cast", "Gemm", "Relu", "Gemm", "Sigmoid", "Cast"]
    x = RNG.normal(size=(4, 32)).astype(np.float32)
    assert _rel_err(_run(model, {"x": x})[0], _run(converted, {"x": x})[0]) < 3e-3


def test_kept_softmax_runs_fp32_between_casts() -> None:
    """x -> MatMul -> Softmax (kept FP32) -> MatMul -> y"""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "w2"], ["y"]),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", FLOAT, [2, 16])],
        [helper.make_tensor_value_info("y", FLOAT, [2, 8])],
        [_f32("w1", 16, 16, std=1.0), _f32("w2", 16, 8)],
    )
    converted = convert_to_fp16(model)
    types = _elem_types(converted)
    softmax = _node(converted, "Softmax")
    assert types[softmax.input[0]] == FLOAT and types[softmax.output[0]] == FLOAT
    assert types["s"] == FLOAT16  # the MatMul before it computes in fp16; a Cast widens its output
    assert _ops(converted) == ["Cast", "MatMul", "Cast", "Softmax", "Cast", "MatMul", "Cast"]
    x = RNG.normal(size=(2, 16)).astype(np.float32)
    assert _rel_err(_run(model, {"x": x})[0], _run(converted, {"x": x})[0]) < 3e-3


def test_keep_nodes_and_fp16_io() -> None:
    model = conv_net()
    converted = convert_to_fp16(model, keep_io_fp32=False, keep_nodes=[_name_first_conv(model)])
    types = _elem_types(converted)
    assert types["x"] == FLOAT16 and types["prob"] == FLOAT16
    first = converted.graph.node[[n.op_type for n in converted.graph.node].index("Conv")]
    assert types[first.output[0]] == FLOAT  # the kept conv computes in fp32
    x = RNG.normal(size=(1, 3, 16, 16)).astype(np.float16)
    reference = _run(model, {"x": x.astype(np.float32)})[0]
    assert _rel_err(reference, _run(converted, {"x": x})[0]) < 3e-3


def _name_first_conv(model: onnx.ModelProto) -> str:
    _node(model, "Conv").name = "conv1"
    return "conv1"


def test_unknown_keep_node_is_a_clear_error() -> None:
    with pytest.raises(ModelError, match="does not have"):
        convert_to_fp16(conv_net(), keep_nodes=["nope"])


def qdq_conv(opset: int) -> onnx.ModelProto:
    """x -> Q -> DQ -+
    wq(int8) -> DQ -+-> Conv -> Relu -> y      (per-channel weights, per-tensor activation)"""
    w = RNG.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32)
    wq, ws = quantize_weight(w, axis=0)  # per output channel, as trtopt's quantizer writes it
    inits = [
        numpy_helper.from_array(wq, "wq"),
        numpy_helper.from_array(ws, "ws"),
        numpy_helper.from_array(np.zeros(8, np.int8), "wz"),
        numpy_helper.from_array(np.array(3.0 / 127, np.float32), "xs"),
        numpy_helper.from_array(np.array(0, np.int8), "xz"),
        _f32("b", 8, std=0.1),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
        helper.make_node("Conv", ["xd", "wd", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", FLOAT, [1, 3, 8, 8])
    return _model(nodes, [x], [helper.make_tensor_value_info("y", FLOAT, [1, 8, 8, 8])], inits, opset=opset)


def test_qdq_opset19_gets_fp16_scales_and_no_cast_after_dq() -> None:
    model = qdq_conv(19)
    converted = convert_to_fp16(model)
    onnx.checker.check_model(converted, full_check=True)
    dtypes = {i.name: i.data_type for i in converted.graph.initializer}
    assert dtypes["xs"] == dtypes["ws"] == dtypes["b"] == FLOAT16 and dtypes["wq"] == TensorProto.INT8
    conv = _node(converted, "Conv")
    assert conv.input[0] == "xd" and conv.input[1] == "wd"  # DQ feeds the conv directly: INT8 pattern intact
    assert _ops(converted) == [
        "Cast",
        "QuantizeLinear",
        "DequantizeLinear",
        "DequantizeLinear",
        "Conv",
        "Relu",
        "Cast",
    ]
    # fp16 input rounding can move x/scale across a rounding boundary: one quantisation step (1/127 of
    # the activation range) on a few of the conv's 27 taps, well under 2% of the output range.
    x = RNG.normal(size=(1, 3, 8, 8)).astype(np.float32)
    assert _rel_err(_run(model, {"x": x})[0], _run(converted, {"x": x})[0]) < 2e-2


def test_qdq_below_opset19_keeps_int8_compute_fp32_without_cast_after_dq() -> None:
    model = qdq_conv(13)
    converted = convert_to_fp16(model)
    dtypes = {i.name: i.data_type for i in converted.graph.initializer}
    assert dtypes["xs"] == dtypes["ws"] == dtypes["b"] == FLOAT  # DequantizeLinear-13 takes float scales only
    conv = _node(converted, "Conv")
    assert conv.input[:2] == ["xd", "wd"]
    assert _ops(converted) == [
        "QuantizeLinear",
        "DequantizeLinear",
        "DequantizeLinear",
        "Conv",
        "Cast",
        "Relu",
        "Cast",
    ]
    x = RNG.normal(size=(1, 3, 8, 8)).astype(np.float32)
    assert _rel_err(_run(model, {"x": x})[0], _run(converted, {"x": x})[0]) < 3e-3


def test_nodes_with_weights_beyond_fp16_range_stay_fp32() -> None:
    """x -> Conv -> BatchNormalization(variance 9.8e7 in one channel) -> Relu -> y

    PP-OCRv4-det's unfolded BatchNormalization has such a variance. Clamped to 65504, the converted model computed
    something else (cosine 0.04 with the original on photos); the BatchNormalization now stays FP32 between Casts,
    and the Conv and Relu around it are FP16."""
    variance = np.array([1.0, 9.8e7, 0.5], np.float32)
    params = [_f32("k", 3, 2, 1, 1), numpy_helper.from_array(np.ones(3, np.float32), "scale"),
              numpy_helper.from_array(np.zeros(3, np.float32), "bias"),
              numpy_helper.from_array(np.array([0, 100, 0], np.float32), "mean"),
              numpy_helper.from_array(variance, "var")]  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "k"], ["c"], kernel_shape=[1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["b"]),
        helper.make_node("Relu", ["b"], ["y"]),
    ]
    model = _model(nodes, [helper.make_tensor_value_info("x", FLOAT, [1, 2, 4, 4])],
                   [helper.make_tensor_value_info("y", FLOAT, [1, 3, 4, 4])], params)  # fmt: skip
    converted = convert_to_fp16(model)
    types = {i.name: i.data_type for i in converted.graph.initializer}
    assert types["var"] == FLOAT and types["k"] == FLOAT16
    assert _elem_types(converted)["c"] == FLOAT16 and _ops(converted).count("Cast") >= 2
    x = RNG.normal(size=(1, 2, 4, 4)).astype(np.float32) * 1e4  # channel 1: (c - 100) / 9900, not clamped noise
    assert _rel_err(_run(model, {"x": x})[0], _run(converted, {"x": x})[0]) < 3e-3


def test_resize_scales_stay_fp32_and_constants_convert() -> None:
    """x -> Mul(Constant 2.0) -> Resize(scales fp32) -> y"""
    nodes = [
        helper.make_node("Constant", [], ["two"], value_float=2.0),
        helper.make_node("Mul", ["x", "two"], ["m"]),
        helper.make_node("Resize", ["m", "", "scales"], ["y"], mode="nearest"),
    ]
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", FLOAT, [1, 1, 2, 2])],
        [helper.make_tensor_value_info("y", FLOAT, [1, 1, 4, 4])],
        [scales],
    )
    converted = convert_to_fp16(model)
    assert next(i for i in converted.graph.initializer if i.name == "scales").data_type == FLOAT
    assert _node(converted, "Constant").attribute[0].t.data_type == FLOAT16
    x = RNG.normal(size=(1, 1, 2, 2)).astype(np.float32)
    assert _rel_err(_run(model, {"x": x})[0], _run(converted, {"x": x})[0]) < 3e-3


@pytest.mark.parametrize("flag", [1.0, -1.0], ids=["then", "else"])
def test_branches_read_a_float32_copy_of_outer_values(flag: float) -> None:
    """x -> Conv -> c -> If(flag > 0; then: Relu(c), else: c * w) -> y   (the branches read c and w by name)

    `If` stays FP32 and its branches are not descended into, so they must read float32: a Cast of the FP16 conv's
    output, and the weight `w` left float32. Found by tests/test_int8_float_types.py's random graphs: the
    converted model did not load ("Type (tensor(float)) of output arg ... does not match expected type
    (tensor(float16))")."""
    c_info = helper.make_tensor_value_info("b", FLOAT, [1, 4, 3, 3])
    then = helper.make_graph([helper.make_node("Relu", ["c"], ["b"])], "then", [], [c_info])
    other = helper.make_graph([helper.make_node("Mul", ["c", "w"], ["b"])], "else", [], [c_info])
    nodes = [
        helper.make_node("Conv", ["x", "k"], ["c"], kernel_shape=[1, 1]),
        helper.make_node("Greater", ["flag", "zero"], ["cond"]),
        helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", FLOAT, [1, 2, 3, 3]), helper.make_tensor_value_info("flag", FLOAT, [])],
        [helper.make_tensor_value_info("y", FLOAT, [1, 4, 3, 3])],
        [_f32("k", 4, 2, 1, 1), _f32("w", 1, 4, 1, 1), numpy_helper.from_array(np.array(0, np.float32), "zero")],
    )
    converted = convert_to_fp16(model)
    onnx.checker.check_model(converted, full_check=True)
    assert next(i for i in converted.graph.initializer if i.name == "k").data_type == FLOAT16
    assert next(i for i in converted.graph.initializer if i.name == "w").data_type == FLOAT
    feeds = {"x": RNG.normal(size=(1, 2, 3, 3)).astype(np.float32), "flag": np.array(flag, np.float32)}
    assert _rel_err(_run(model, feeds)[0], _run(converted, feeds)[0]) < 3e-3
