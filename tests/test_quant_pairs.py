"""Pair-bounded 8-bit weights (trtopt.quant.pairs, the CPU backend's u8s8p encoding): which weights ONNX Runtime's
saturating kernels pair, the grids that keep every pair within 128, and plans that compute their reference."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtopt.backend.cpu.isa import EXACT_U8S8, SATURATING_U8S8, cpu_isa
from trtopt.backend.cpu.lowering import store_unsigned_weights
from trtopt.quant.pairs import PAIR_LIMIT, fits_pairs, pair_bounded, pair_sums, reduction_rows
from trtopt.quant.qdq import quantize_weight


def _qconv(q: np.ndarray) -> onnx.ModelProto:
    """uint8 input (steps of 1/255) -> QLinearConv-able Q/DQ conv with int8 weights `q` (scale 0.01) -> uint8."""
    cout, cin, k = q.shape[0], q.shape[1], q.shape[2]
    inits = [numpy_helper.from_array(q, "wq"), numpy_helper.from_array(np.full(cout, 0.01, np.float32), "ws"),
             numpy_helper.from_array(np.zeros(cout, np.int8), "wz"), numpy_helper.from_array(np.float32(1 / 255), "sx"),
             numpy_helper.from_array(np.uint8(0), "zx"), numpy_helper.from_array(np.float32(0.05), "sy"),
             numpy_helper.from_array(np.uint8(0), "zy")]  # fmt: skip
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=0),
             helper.make_node("Conv", ["xd", "w"], ["c"], kernel_shape=[k, k]),
             helper.make_node("QuantizeLinear", ["c", "sy", "zy"], ["cq"]),
             helper.make_node("DequantizeLinear", ["cq", "sy", "zy"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, 5, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _run(model: onnx.ModelProto, x: np.ndarray, kernels: bool) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    if not kernels:  # the Q/DQ graph as float math: the reference
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _two_weights(cin: int, k: int, first: tuple[int, int, int], second: tuple[int, int, int]) -> np.ndarray:
    q = np.zeros((8, cin, k, k), np.int8)
    for c, i, j in (first, second):
        q[0, c, i, j] = 127
    return q


def test_pair_sums_follow_the_nhwc_reduction_order() -> None:
    q = _two_weights(3, 3, (2, 0, 0), (0, 0, 1))  # flattened (kh, kw, C_in): elements 2 and 3, one pair
    assert pair_sums(reduction_rows(q, "Conv", {}))[0] == 254 and not fits_pairs(q, "Conv", {})
    q = _two_weights(3, 3, (1, 0, 0), (2, 0, 0))  # elements 1 and 2: two pairs
    assert pair_sums(reduction_rows(q, "Conv", {}))[0] == 127 and fits_pairs(q, "Conv", {})
    q[0, 1, 0, 0] = -127  # opposite signs never saturate
    q[0, 0, 0, 0] = 127
    assert fits_pairs(q, "Conv", {})
    assert reduction_rows(np.zeros((4, 1, 3, 3), np.int8), "Conv", {"group": 4}) is None  # depthwise: no pairs
    gemm = np.zeros((6, 4), np.int8)  # MatMul / Gemm (transB 0): [K, N], pairs along K
    gemm[2:4, 1] = 100
    assert not fits_pairs(gemm, "MatMul", {}) and fits_pairs(gemm.T.copy(), "MatMul", {})
    assert not fits_pairs(gemm.T.copy(), "Gemm", {"transB": 1})


@pytest.mark.parametrize(
    ("first", "second", "paired"),
    [((0, 0, 0), (1, 0, 0), True), ((1, 0, 0), (2, 0, 0), False), ((2, 0, 0), (0, 0, 1), True),
     ((0, 0, 0), (0, 0, 1), False)],  # fmt: skip
)
def test_onnx_runtime_pairs_what_the_module_says(first: tuple, second: tuple, paired: bool) -> None:
    """Two weights of 127 against inputs of 255: the kernels saturate exactly where `pair_sums` pairs them, on
    CPUs whose u8s8 kernels saturate; where they are exact (VNNI, AMX) nothing saturates."""
    q = _two_weights(3, 3, first, second)
    model, x = _qconv(q), np.ones((1, 3, 5, 5), np.float32)
    kernels, reference = _run(model, x, True), _run(model, x, False)
    assert (pair_sums(reduction_rows(q, "Conv", {}))[0] > PAIR_LIMIT) == paired
    isa = cpu_isa()
    if isa in SATURATING_U8S8:
        assert np.allclose(kernels, reference) != paired
    elif isa in EXACT_U8S8:
        assert np.allclose(kernels, reference)
    else:
        pytest.skip(f"a {isa} CPU: its kernels' pairing is not described")


def test_only_channels_that_could_saturate_get_a_coarser_grid() -> None:
    rng = np.random.default_rng(0)
    values = rng.normal(0, 0.02, (16, 8, 3, 3)).astype(np.float32)
    values[3, 0:2, 0, 0] = 0.5  # a same-sign neighbouring pair at the channel's maximum
    values[5, 0:2, 0, 0] = (0.5, -0.5)  # opposite signs: fits as it is
    plain_q, plain_scale = quantize_weight(values, 0)
    q, scale = quantize_weight(values, 0, pairs=("Conv", {}))
    assert fits_pairs(q, "Conv", {}) and not fits_pairs(plain_q, "Conv", {})
    changed = np.flatnonzero(scale != plain_scale)
    assert 3 in changed and 5 not in changed
    assert (scale[changed] <= plain_scale[changed] * 2.0).all()  # at most 254 / 128 coarser (and rounding)
    untouched = np.setdiff1d(np.arange(16), changed)
    np.testing.assert_array_equal(q[untouched], plain_q[untouched])
    same, _ = pair_bounded(values, 1, plain_scale[:8], "Conv", {})  # a channel axis other than the output's
    assert same.shape == values.shape


def test_pair_bounded_weights_run_their_reference_and_stay_int8() -> None:
    """A plan's pair-bounded weights are not re-encoded on saturating CPUs (`store_unsigned_weights` leaves them),
    and the kernels compute the Q/DQ graph at inputs of 255 on every CPU kind."""
    rng = np.random.default_rng(1)
    values = rng.normal(0, 0.05, (8, 6, 3, 3)).astype(np.float32)
    values[:, 0:2] = np.abs(values[:, 0:2]) + 0.2  # every channel has large same-sign neighbours
    q, _ = quantize_weight(values, 0, pairs=("Conv", {}))
    model = _qconv(q)
    assert store_unsigned_weights(model) == 0
    x = np.ones((1, 6, 5, 5), np.float32)
    x[0, :, 2:] = rng.uniform(0, 1, (6, 3, 5))
    np.testing.assert_allclose(_run(model, x, True), _run(model, x, False), atol=0.051)  # one output step
    plain, _ = quantize_weight(values, 0)
    assert store_unsigned_weights(_qconv(plain)) == 1  # 8-bit weights whose pairs overflow: stored as uint8


@pytest.mark.parametrize(("first", "second", "paired"), [(0, 1, True), (1, 2, False), (2, 3, True)])
def test_onnx_runtime_pairs_a_matmul_along_k(first: int, second: int, paired: bool) -> None:
    """MatMul weights [K, N]: elements 2i and 2i + 1 of K pair, as `reduction_rows` says (saturating CPUs)."""
    q = np.zeros((16, 8), np.int8)
    q[[first, second], 0] = 127
    inits = [numpy_helper.from_array(q, "wq"), numpy_helper.from_array(np.full(8, 0.01, np.float32), "ws"),
             numpy_helper.from_array(np.zeros(8, np.int8), "wz"), numpy_helper.from_array(np.float32(1 / 255), "sx"),
             numpy_helper.from_array(np.uint8(0), "zx"), numpy_helper.from_array(np.float32(0.05), "sy"),
             numpy_helper.from_array(np.uint8(0), "zy")]  # fmt: skip
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=1),
             helper.make_node("MatMul", ["xd", "w"], ["c"]),
             helper.make_node("QuantizeLinear", ["c", "sy", "zy"], ["cq"]),
             helper.make_node("DequantizeLinear", ["cq", "sy", "zy"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)  # fmt: skip
    model, x = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), np.ones((2, 16), np.float32)
    assert fits_pairs(q, "MatMul", {}) != paired
    isa = cpu_isa()
    if isa in SATURATING_U8S8:
        assert np.allclose(_run(model, x, True), _run(model, x, False)) != paired
    elif isa in EXACT_U8S8:
        assert np.allclose(_run(model, x, True), _run(model, x, False))
    else:
        pytest.skip(f"a {isa} CPU: its kernels' pairing is not described")
