"""Each conv's bias in the quantiser after it, in the graph OpenVINO compiles (trtopt.backend.openvino.biases):
OpenVINO computes what the stored Q/DQ graph computes on ONNX Runtime, and each INT8 conv runs with the quantiser as
its only post-operation (no dequantising Multiply, no bias input)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from quant_helpers import assert_left_alone, copied, float_math

from trtopt.backend.openvino.biases import DOMAIN, fold_biases

SCALE_X, SCALE_A, SCALE_B = 0.02, 0.05, 0.04
SHAPE = [2, 8, 9, 9]


def _chain(clamp: str = "Relu", clip_max: float = 6.0, second_reader: bool = False,
           per_channel: bool = False) -> onnx.ModelProto:  # fmt: skip
    """Two quantised convs as trtopt's lowering writes them, weights 7-bit (exact products on every CPU kind)::

        x ─ Q/DQ (x) ─ Conv(w1, int32 bias through DQ) ─ clamp ─ Q/DQ (a) ─ Conv(w2, float bias) ─ Q/DQ (b) ─ y

    `clamp`: "Relu", "Clip" (0, `clip_max`) or "" (none); `second_reader`: a Sigmoid also reads the first conv's
    output (a graph output z); `per_channel`: the first pair has one scale per channel."""
    rng = np.random.default_rng(0)
    channels = SHAPE[1]
    scale_a = np.full(channels, SCALE_A, np.float32) if per_channel else np.float32(SCALE_A)
    zero_a = np.zeros(channels, np.uint8) if per_channel else np.uint8(0)
    arrays = {"sx": np.float32(SCALE_X), "zx": np.uint8(0), "sa": scale_a, "za": zero_a, "sb": np.float32(SCALE_B),
              "zb": np.uint8(0),
              "w1": rng.integers(-64, 64, (channels, channels, 3, 3)).astype(np.int8),
              "w2": rng.integers(-64, 64, (channels, channels, 1, 1)).astype(np.int8),
              "ws": np.full(channels, 0.01, np.float32), "b1": rng.integers(-2000, 2000, channels).astype(np.int32),
              "b1s": np.full(channels, SCALE_X * 0.01, np.float32),
              "b2": rng.normal(0, 0.3, channels).astype(np.float32),
              "clip_lo": np.float32(0), "clip_hi": np.float32(clip_max)}  # fmt: skip
    pair = lambda src, s, z, out: [helper.make_node("QuantizeLinear", [src, s, z], [out + "q"], axis=1),  # noqa: E731
                                   helper.make_node("DequantizeLinear", [out + "q", s, z], [out], axis=1)]  # fmt: skip
    nodes = [*pair("x", "sx", "zx", "xd"),
             helper.make_node("DequantizeLinear", ["w1", "ws"], ["w1d"], axis=0),
             helper.make_node("DequantizeLinear", ["b1", "b1s"], ["b1d"], axis=0),
             helper.make_node("Conv", ["xd", "w1d", "b1d"], ["c1"], pads=[1] * 4)]  # fmt: skip
    if clamp == "Relu":
        nodes.append(helper.make_node("Relu", ["c1"], ["r1"]))
    elif clamp == "Clip":
        nodes.append(helper.make_node("Clip", ["c1", "clip_lo", "clip_hi"], ["r1"]))
    first = "r1" if clamp else "c1"
    nodes += [*pair(first, "sa", "za", "ad"),
              helper.make_node("DequantizeLinear", ["w2", "ws"], ["w2d"], axis=0),
              helper.make_node("Conv", ["ad", "w2d", "b2"], ["c2"]), *pair("c2", "sb", "zb", "y")]  # fmt: skip
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)]
    if second_reader:
        nodes.append(helper.make_node("Sigmoid", ["c1"], ["z"]))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, SHAPE))
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in arrays.items()]
    graph = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              outputs, inits)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _input() -> np.ndarray:
    return np.random.default_rng(1).uniform(0, 255 * SCALE_X, SHAPE).astype(np.float32)


def _openvino(model: onnx.ModelProto) -> tuple[np.ndarray, dict[str, tuple[str, list[str]]]]:
    """OpenVINO's output for `_input()` and its runtime convolutions: name -> (original layers, input types)."""
    ov = pytest.importorskip("openvino")
    core = ov.Core()
    compiled = core.compile_model(core.read_model(model.SerializeToString()), "CPU",
                                  {"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": "f32"})  # fmt: skip
    convs = {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if info["layerType"].astype(str) == "Convolution":
            types = [i.get_element_type().get_type_name() for i in op.inputs()]
            convs[op.get_friendly_name()] = (info["originalLayersNames"].astype(str).split(","), types)
    return np.asarray(compiled({"x": _input()})[0]), convs


@pytest.mark.parametrize("clamp", ["Relu", "Clip", ""])
def test_openvino_computes_the_stored_graph_with_each_bias_in_its_quantiser(clamp: str) -> None:
    model = _chain(clamp=clamp, clip_max=20.0)  # a Clip at 20 beyond the pair's 12.75: the pair's clipping rules
    folded = copied(model)
    assert fold_biases(folded) == 2
    ops = [n.op_type for n in folded.graph.node]
    assert ops.count("FakeQuantize") == 2 and "Relu" not in ops and "Clip" not in ops
    assert all(len(n.input) == 2 for n in folded.graph.node if n.op_type == "Conv")
    assert any(o.domain == DOMAIN for o in folded.opset_import)
    expected = float_math(model, _input())[0]  # the stored graph on ONNX Runtime: the plan's reference
    got, convs = _openvino(folded)
    step = np.abs(got - expected) / SCALE_B
    assert step.max() <= 1.0 + 1e-4 and (step > 1e-4).mean() < 0.01  # a rounding tie at most, rarely
    unfolded, before = _openvino(model)
    np.testing.assert_allclose(got, unfolded, rtol=0, atol=SCALE_B * 1.0001)
    assert all(types == ["u8", "i8"] for _, types in convs.values())  # no bias input left
    assert all(not any(n.startswith("Multiply") for n in names) for names, _ in convs.values())
    assert any(len(types) == 3 for _, types in before.values())  # what the fold removes: a bias input


@pytest.mark.parametrize(
    "kwargs",
    [{"second_reader": True},  # the first conv's output is read twice
     {"per_channel": True}],  # the first pair has a scale per channel: not a per-tensor grid
)  # fmt: skip
def test_the_first_conv_is_left_when_its_chain_is_not_one_path_to_a_per_tensor_pair(kwargs: dict) -> None:
    folded = copied(_chain(**kwargs))
    assert fold_biases(folded) == 1  # the second conv only
    first = next(n for n in folded.graph.node if n.op_type == "Conv" and n.output[0] == "c1")
    assert len(first.input) == 3


def test_a_clamp_that_cuts_inside_the_quantisers_range_stays_and_so_does_the_bias() -> None:
    # the pair after the Clip spans 0 .. 255 * 0.05 = 12.75, the Clip cuts at 6: the Clip does work the pair cannot
    folded = copied(_chain(clamp="Clip", clip_max=6.0))
    model = _chain(clamp="Clip", clip_max=20.0)
    assert fold_biases(folded) == 1 and fold_biases(copied(model)) == 2
    assert "Clip" in [n.op_type for n in folded.graph.node]


def test_a_relu_before_a_pair_that_reaches_below_zero_stays() -> None:
    # an int8 pair with zero point 0 holds negative values: the Relu's zeros are not the pair's clipping
    model = _chain(clamp="Relu")
    relu_pair = next(t for t in model.graph.initializer if t.name == "za")
    relu_pair.CopyFrom(numpy_helper.from_array(np.int8(0), "za"))
    folded = copied(model)
    assert fold_biases(folded) == 1 and "Relu" in [n.op_type for n in folded.graph.node]


def test_graphs_without_a_biased_conv_before_a_pair_are_left_alone() -> None:
    model = _chain(clamp="")
    for node in model.graph.node:
        if node.op_type == "Conv":
            del node.input[2]
    assert_left_alone(model, fold_biases, _input())


def test_the_runner_compiles_the_folded_graph_and_the_plan_keeps_the_standard_one() -> None:
    pytest.importorskip("openvino")
    from trtopt.backend.openvino.runner import compiled_graph

    stored = _chain().SerializeToString()
    compiled = onnx.load_from_string(compiled_graph(stored))
    assert [n.op_type for n in compiled.graph.node].count("FakeQuantize") == 2
    assert onnx.load_from_string(stored) == _chain()  # the stored bytes are not touched
    plain = _chain(clamp="")
    for node in plain.graph.node:
        if node.op_type == "Conv":
            del node.input[2]
    assert compiled_graph(plain.SerializeToString()) == plain.SerializeToString()
