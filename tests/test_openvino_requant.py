"""No requantisation after a max pool of a quantised tensor (trtopt.backend.openvino.requant): the pool's readers
read it on its input's grid, the same values on ONNX Runtime where the grids agree and within half a step of the
dropped grid where they do not, and on OpenVINO no FakeQuantize node of its own after the pool."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from quant_helpers import assert_left_alone, copied, float_math

from trtopt.backend.openvino.requant import drop_pool_requantisation

SCALE_A = 0.02
WEIGHT_SCALE = 0.01


def _stem_model(scale_b: float = SCALE_A, pool_input_float: bool = False, other_reader: str = "",
                pool_is_output: bool = False) -> onnx.ModelProto:  # fmt: skip
    """A ResNet stem's tail on the uint8 grid, weights 7-bit (exact on every CPU kind's u8 x s8 kernels)::

        x ─ Q/DQ (a) ─ MaxPool 3x3 s2 ─ Q/DQ (b) ─┬─ Conv 3x3 ─ Add ─ y
                                                  └──────────────┘   (the block's identity input)

    `pool_input_float`: no Q/DQ before the pool; `other_reader` "pool": a Relu also reads the pool's output,
    "q": a Cast reads the quantised (int) tensor; `pool_is_output`: the pool's output is a graph output too.
    """
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.float32(SCALE_A), "sa"), numpy_helper.from_array(np.uint8(0), "za"),
             numpy_helper.from_array(np.float32(scale_b), "sb"), numpy_helper.from_array(np.uint8(0), "zb"),
             numpy_helper.from_array(rng.integers(-64, 64, (8, 8, 3, 3)).astype(np.int8), "wq"),
             numpy_helper.from_array(np.full(8, WEIGHT_SCALE, np.float32), "ws")]  # fmt: skip
    nodes = [helper.make_node("QuantizeLinear", ["x", "sa", "za"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sa", "za"], ["xd"])]  # fmt: skip
    if pool_input_float:
        nodes = [helper.make_node("Relu", ["x"], ["xd"])]
    nodes += [helper.make_node("MaxPool", ["xd"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
              helper.make_node("QuantizeLinear", ["p", "sb", "zb"], ["pq"]),
              helper.make_node("DequantizeLinear", ["pq", "sb", "zb"], ["pd"]),
              helper.make_node("DequantizeLinear", ["wq", "ws"], ["w"], axis=0),
              helper.make_node("Conv", ["pd", "w"], ["c"], kernel_shape=[3, 3], pads=[1] * 4),
              helper.make_node("Add", ["c", "pd"], ["y"])]  # fmt: skip
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8, "h", "w"])]
    if other_reader:
        nodes.append(helper.make_node("Relu", ["p"], ["z"]) if other_reader == "pool" else
                     helper.make_node("Cast", ["pq"], ["z"], to=TensorProto.FLOAT))  # fmt: skip
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 8, "h", "w"]))
    if pool_is_output:
        outputs.append(helper.make_tensor_value_info("p", TensorProto.FLOAT, ["n", 8, "h", "w"]))
    graph = helper.make_graph(nodes, "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 11, 11])],
                              outputs, inits)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _input() -> np.ndarray:
    return np.random.default_rng(1).uniform(0, 255 * SCALE_A, (2, 8, 11, 11)).astype(np.float32)


def test_the_pair_after_the_pool_goes_and_its_readers_read_the_pool() -> None:
    model = _stem_model()
    rewritten = copied(model)
    assert drop_pool_requantisation(rewritten) == 1
    onnx.checker.check_model(rewritten)
    ops = [n.op_type for n in rewritten.graph.node]
    assert ops.count("QuantizeLinear") == 1 and ops.count("DequantizeLinear") == 2  # x's pair and the weights'
    readers = [n for n in rewritten.graph.node if "p" in n.input]
    assert sorted(n.op_type for n in readers) == ["Add", "Conv"]
    for before, after in zip(float_math(model, _input()), float_math(rewritten, _input()), strict=True):
        np.testing.assert_array_equal(after, before)  # one grid: the requantisation changed nothing


def test_a_second_grid_is_no_longer_applied_the_difference_within_its_half_step() -> None:
    scale_b = SCALE_A * 0.7  # finer than grid a and covering less than its range: rounding and clipping differ
    model = _stem_model(scale_b=scale_b)
    rewritten = copied(model)
    assert drop_pool_requantisation(rewritten) == 1
    x = _input()
    before, after = float_math(model, x)[0], float_math(rewritten, x)[0]
    pooled = float_math(_stem_model(pool_is_output=True), x)[1]  # the pool's output, on grid a
    assert (pooled > 255 * scale_b).any()  # some values were clipped by grid b
    reference = float_math(_stem_model(scale_b=SCALE_A), x)[0]  # grid b = grid a: what the rewritten graph computes
    np.testing.assert_allclose(after, reference, rtol=0, atol=1e-5)
    assert not np.allclose(after, before, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs",
    [{"pool_input_float": True},  # nothing quantised before the pool: its output grid is the only one
     {"other_reader": "pool"},  # the pool's float output is read by another op too
     {"other_reader": "q"},  # the quantised tensor is read by something else than its DequantizeLinear
     {"pool_is_output": True}],  # the pool's output leaves the graph
)  # fmt: skip
def test_other_graphs_are_left_alone(kwargs: dict) -> None:
    assert_left_alone(_stem_model(**kwargs), drop_pool_requantisation, _input())


def test_openvino_runs_the_pool_and_conv_int8_without_a_requantising_node() -> None:
    ov = pytest.importorskip("openvino")
    from trtopt.backend.cpu.lowering import lower_for_cpu

    def runtime_layers(model: onnx.ModelProto) -> tuple[dict[str, tuple[str, str]], ov.CompiledModel]:
        """Runtime layers that run (no constants): original layer names -> (type, precision)."""
        compiled = ov.Core().compile_model(ov.Core().read_model(model.SerializeToString()), "CPU",
                                           {"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": "f32"})  # fmt: skip
        layers = {}
        for op in compiled.get_runtime_model().get_ordered_ops():
            info = op.get_rt_info()
            if info["layerType"].astype(str) != "Const":
                layers[op.get_friendly_name()] = (info["layerType"].astype(str), info["runtimePrecision"].astype(str))
        return layers, compiled

    model = lower_for_cpu(_stem_model(scale_b=SCALE_A * 0.7), encoding="u8s8")
    before, _ = runtime_layers(model)
    assert drop_pool_requantisation(model) == 1
    after, compiled = runtime_layers(model)
    assert set(after) < set(before) and len(after) == len(before) - 1  # one node less: the requantisation
    assert after["p"] == ("Pooling", "u8")
    assert [p for t, p in after.values() if t == "Convolution"] == ["u8"]
    got = np.asarray(compiled({"x": _input()})[0])
    expected = float_math(model, _input())[0]
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 0.01  # 7-bit weights: exact products


def test_the_written_plan_graph_drops_it_in_every_form() -> None:
    pytest.importorskip("openvino")
    from trtopt.backend.openvino import builder
    from trtopt.backend.openvino.options import OpenvinoOptions

    model = _stem_model(scale_b=SCALE_A * 0.7)
    for form in builder.FORMS:
        written = builder.written(model, OpenvinoOptions(form=form))
        pool = next(n for n in written.graph.node if n.op_type == "MaxPool")
        assert all(n.op_type != "QuantizeLinear" for n in written.graph.node if pool.output[0] in n.input), form
    assert [n.op_type for n in model.graph.node].count("QuantizeLinear") == 2  # the caller's graph is not changed
