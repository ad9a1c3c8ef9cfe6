"""Strided 1x1 convs on a quantised tensor (trtopt.backend.openvino.strides): subsampled after the
DequantizeLinear, the same values on ONNX Runtime, and INT8 on OpenVINO's CPU plugin (the original form ran them
f32 on dequantised weights: OpenVINO's StridesOptimization moved the stride into the dequantisation)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from quant_helpers import assert_left_alone, copied, float_math

from trtopt.backend.openvino.strides import subsample_strided_pointwise


def _entry_model(strides: tuple[tuple[int, int], ...] = ((2, 2), (2, 2)), pads: int = 0, kernel: int = 1,
                 extra_reader: bool = False) -> onnx.ModelProto:  # fmt: skip
    """A ResNet-50 v1 stage entry on the uint8 grid, weights 7-bit (exact on every CPU kind's u8 x s8 kernels)::

        x ─ Q/DQ ─ Conv 3x3 ─ Relu ─ Q/DQ ─┬─ Conv 1x1 stride 2 (branch2a) ─ Relu ─ ya
                                          └─ Conv 1x1 stride 2 (shortcut) ─ yb
    """
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.float32(s), n) for n, s in (("sx", 1 / 127), ("sh", 0.05))]
    inits += [numpy_helper.from_array(np.uint8(0), "zx"), numpy_helper.from_array(np.uint8(0), "zh")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"])]  # fmt: skip
    for name, shape in (("w0", (16, 8, 3, 3)), ("wa", (16, 16, kernel, kernel)), ("wb", (16, 16, kernel, kernel))):
        inits += [numpy_helper.from_array(rng.integers(-64, 64, shape).astype(np.int8), f"{name}q"),
                  numpy_helper.from_array(rng.uniform(0.005, 0.02, shape[0]).astype(np.float32), f"{name}s")]
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}q", f"{name}s"], [name], axis=0))
    nodes += [helper.make_node("Conv", ["xd", "w0"], ["c0"], kernel_shape=[3, 3], pads=[1] * 4),
              helper.make_node("Relu", ["c0"], ["r0"]),
              helper.make_node("QuantizeLinear", ["r0", "sh", "zh"], ["hq"]),
              helper.make_node("DequantizeLinear", ["hq", "sh", "zh"], ["hd"], name="entry/DQ")]
    for name, weight, stride in (("a", "wa", strides[0]), ("b", "wb", strides[1])):
        nodes.append(helper.make_node("Conv", ["hd", weight], [f"c{name}"], name=f"conv_{name}",
                                      kernel_shape=[kernel] * 2, strides=list(stride), pads=[pads] * 4))  # fmt: skip
    nodes.append(helper.make_node("Relu", ["ca"], ["ya"]))
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["n", "c", "h", "w"]) for name in ("ya", "cb")]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["hd"], ["z"]))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", "c", "h", "w"]))
    graph = helper.make_graph(nodes, "entry", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 9, 9])],
                              outputs, inits)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _input() -> np.ndarray:
    return np.random.default_rng(1).uniform(0, 1, (2, 8, 9, 9)).astype(np.float32)  # odd size: ceil(9 / 2)


def test_a_shared_stride_2_entry_is_subsampled_once_with_the_same_values() -> None:
    model = _entry_model()
    rewritten = copied(model)
    assert subsample_strided_pointwise(rewritten) == 1
    onnx.checker.check_model(rewritten)
    pools = [n for n in rewritten.graph.node if n.op_type == "MaxPool"]
    assert len(pools) == 1 and pools[0].input == ["hd"]
    assert [helper.get_attribute_value(a) for a in pools[0].attribute if a.name == "strides"] == [[2, 2]]
    for conv in (n for n in rewritten.graph.node if n.name.startswith("conv_")):
        assert conv.input[0] == pools[0].output[0]
        assert [helper.get_attribute_value(a) for a in conv.attribute if a.name == "strides"] == [[1, 1]]
    for before, after in zip(float_math(model, _input()), float_math(rewritten, _input()), strict=True):
        assert before.shape == after.shape == (2, 16, 5, 5)
        np.testing.assert_array_equal(after, before)  # a kernel-1 pool is a subsample: nothing computed differently


@pytest.mark.parametrize(
    "kwargs",
    [{"strides": ((2, 2), (1, 1))},  # the readers want different strides: OpenVINO propagates nothing either
     {"strides": ((1, 1), (1, 1))},  # nothing strided
     {"pads": 1},  # padded: a subsample first would not be the same conv
     {"kernel": 3, "pads": 1},  # a 3x3 conv keeps its stride in OpenVINO too
     {"extra_reader": True}],  # another reader of the tensor wants every pixel
)  # fmt: skip
def test_other_readers_are_left_alone(kwargs: dict) -> None:
    assert_left_alone(_entry_model(**kwargs), subsample_strided_pointwise, _input())


def _openvino_convs(model: onnx.ModelProto) -> dict[str, str]:
    """Runtime-model convolution -> the precision OpenVINO's CPU plugin runs it in (u8 / i8: INT8 kernels)."""
    ov = pytest.importorskip("openvino")
    compiled = ov.Core().compile_model(ov.Core().read_model(model.SerializeToString()), "CPU",
                                       {"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": "f32"})  # fmt: skip
    precisions = {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if info["layerType"].astype(str) == "Convolution":
            precisions[op.get_friendly_name()] = info["runtimePrecision"].astype(str)
    return precisions


def test_openvino_runs_the_subsampled_entry_int8_as_its_reference_says() -> None:
    pytest.importorskip("openvino")
    from trtopt.backend.cpu.lowering import lower_for_cpu

    model = lower_for_cpu(_entry_model(), encoding="u8s8")
    subsample_strided_pointwise(model)
    precisions = _openvino_convs(model)
    assert len(precisions) == 3 and set(precisions.values()) <= {"u8", "i8"}, precisions
    ov = pytest.importorskip("openvino")
    compiled = ov.Core().compile_model(ov.Core().read_model(model.SerializeToString()), "CPU",
                                       {"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": "f32"})  # fmt: skip
    got = compiled({"x": _input()})
    for i, expected in enumerate(float_math(model, _input())):
        rel = np.linalg.norm(np.asarray(got[i]) - expected) / np.linalg.norm(expected)
        assert rel < 0.01  # 7-bit weights on uint8 inputs: exact products; float sums in another order


def test_the_written_plan_graph_is_subsampled_in_every_form() -> None:
    pytest.importorskip("openvino")
    from trtopt.backend.openvino import builder
    from trtopt.backend.openvino.options import OpenvinoOptions

    model = _entry_model()
    for form in builder.FORMS:
        written = builder.written(model, OpenvinoOptions(form=form))
        assert [n.op_type for n in written.graph.node].count("MaxPool") == 1, form
    assert [n.op_type for n in model.graph.node].count("MaxPool") == 0  # the caller's graph is not changed
