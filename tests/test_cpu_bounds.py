"""Lower bounds read from the graph (trtopt.backend.cpu.bounds), and the finer uint8 grids the CPU lowering
gives the tensors that have one: checked against the functions' values and, numerically, against FP32."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from quant_helpers import cosine, cpu_config, feeds_for, optimized_zoo_graph, quantize

from trtopt.backend.cpu import lowering
from trtopt.backend.cpu.bounds import lower_bounds
from trtopt.backend.cpu.builder import exact_encoding
from trtopt.backend.cpu.lowering import lower_for_cpu, uint8_grid
from trtopt.execution import run_model
from trtopt.frontend import onnx_from_graph

_CONSTS = {"one": 1.0, "half": 0.5, "three": 3.0, "six": 6.0, "zero": 0.0, "root2": math.sqrt(2), "c": 0.7978846,
           "k": 0.044715, "sixth": 1 / 6}  # fmt: skip
_N = helper.make_node
# name -> (nodes from "x" to "y", opset, the function's least value)
SPELLINGS = {
    "SiLU as x * Sigmoid(x)": ([_N("Sigmoid", ["x"], ["s"]), _N("Mul", ["s", "x"], ["y"])], 13, -0.278465),
    "HardSwish op": ([_N("HardSwish", ["x"], ["y"])], 14, -0.375),
    "HardSwish as x * HardSigmoid(x)": (
        [_N("HardSigmoid", ["x"], ["h"], alpha=1 / 6, beta=0.5), _N("Mul", ["x", "h"], ["y"])], 13, -0.375),
    "HardSwish as PaddlePaddle writes it": (
        [_N("Add", ["x", "three"], ["a"]), _N("Clip", ["a", "zero", "six"], ["c6"]), _N("Mul", ["x", "c6"], ["m"]),
         _N("Div", ["m", "six"], ["y"])], 12, -0.375),  # fmt: skip
    "GELU, erf form": (
        [_N("Div", ["x", "root2"], ["d"]), _N("Erf", ["d"], ["e"]), _N("Add", ["e", "one"], ["a"]),
         _N("Mul", ["x", "a"], ["m"]), _N("Mul", ["m", "half"], ["y"])], 13, -0.169971),  # fmt: skip
    "GELU, tanh form": (
        [_N("Pow", ["x", "three"], ["p"]), _N("Mul", ["p", "k"], ["pk"]), _N("Add", ["x", "pk"], ["in"]),
         _N("Mul", ["in", "c"], ["ic"]), _N("Tanh", ["ic"], ["t"]), _N("Add", ["t", "one"], ["t1"]),
         _N("Mul", ["x", "t1"], ["m"]), _N("Mul", ["m", "half"], ["y"])], 13, -0.170041),  # fmt: skip
    "Mish op": ([_N("Mish", ["x"], ["y"])], 18, -0.308840),
    "Tanh (flat at the grid's end)": ([_N("Tanh", ["x"], ["y"])], 13, -1.0),
    "Clip at -1": ([_N("Clip", ["x", "minus_one", "six"], ["y"])], 13, -1.0),
    "Relu": ([_N("Relu", ["x"], ["y"])], 13, 0.0),
}
UNBOUNDED = {
    "x + 1": [_N("Add", ["x", "one"], ["y"])],
    "LeakyRelu": [_N("LeakyRelu", ["x"], ["y"], alpha=0.1)],
    "two tensors": [_N("Sigmoid", ["x"], ["s"]), _N("Mul", ["s", "z"], ["y"])],
    "a per-channel constant": [
        _N("Sigmoid", ["x"], ["s"]), _N("Mul", ["s", "x"], ["m"]), _N("Mul", ["m", "gamma"], ["y"])],
    "a conv": [_N("Conv", ["x4", "w"], ["y"])],
}  # fmt: skip


def _model(nodes: list[onnx.NodeProto], opset: int = 13) -> onnx.ModelProto:
    consts = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in _CONSTS.items()]
    consts += [numpy_helper.from_array(np.array(-1.0, np.float32), "minus_one"),
               numpy_helper.from_array(np.array([1.0, -2.0], np.float32), "gamma"),
               numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "w")]  # fmt: skip
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("x", "z", "x4")]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _values(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(ReferenceEvaluator(model).run(["y"], {"x": x.astype(np.float32)})[0], np.float64)


@pytest.mark.parametrize("name", SPELLINGS)
def test_each_spelling_of_an_activation_gets_its_least_value(name: str) -> None:
    nodes, opset, least = SPELLINGS[name]
    model = _model(nodes, opset)
    bound = lower_bounds(model)["y"]
    assert bound == pytest.approx(least, rel=2e-3, abs=1e-6)
    dense = np.linspace(-20, 20, 400_001)  # finer than the bounds' grid: the bound is below every value
    assert bound <= _values(model, dense).min()


@pytest.mark.parametrize("name", UNBOUNDED)
def test_no_bound_where_the_graph_does_not_give_one(name: str) -> None:
    assert "y" not in lower_bounds(_model(UNBOUNDED[name]))


def test_a_concat_has_the_least_bound_of_its_inputs_and_none_if_one_has_none() -> None:
    nodes = [_N("Sigmoid", ["x"], ["s"]), _N("Mul", ["s", "x"], ["silu"]), _N("Relu", ["z"], ["r"]),
             _N("Concat", ["silu", "r"], ["y"], axis=0), _N("Concat", ["silu", "z"], ["open"], axis=0),
             _N("MaxPool", ["y"], ["pooled"], kernel_shape=[1])]  # fmt: skip
    bounds = lower_bounds(_model(nodes))
    assert bounds["y"] == bounds["silu"] == bounds["pooled"] < 0 and bounds["r"] == 0.0
    assert "open" not in bounds


_UNARY = ("Sigmoid", "Tanh", "Relu", "Erf", "HardSigmoid", "HardSwish", "Softplus", "Abs", "Neg", "Elu", "LeakyRelu")
_BINARY = ("Add", "Sub", "Mul", "Max", "Min")


@st.composite
def element_wise_chains(draw: st.DrawFn) -> onnx.ModelProto:
    """A random element-wise function of x: unary ops, and binary ones with a scalar constant or with an
    earlier tensor of the chain (so x may be read several times, as gated activations read it)."""
    tensors, nodes, consts = ["x"], [], []
    for i in range(draw(st.integers(1, 6))):
        out = f"t{i}"
        if draw(st.booleans()):
            nodes.append(_N(draw(st.sampled_from(_UNARY)), [draw(st.sampled_from(tensors))], [out]))
        else:
            op, left = draw(st.sampled_from(_BINARY)), draw(st.sampled_from(tensors))
            if draw(st.booleans()):
                right = f"k{i}"
                value = draw(st.floats(-4, 4, allow_nan=False).map(lambda v: round(v, 2)))
                consts.append(numpy_helper.from_array(np.array(value, np.float32), right))
            else:
                right = draw(st.sampled_from(tensors))
            nodes.append(_N(op, [left, right], [out]))
        tensors.append(out)
    nodes.append(_N("Identity", [tensors[-1]], ["y"]))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], consts)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(element_wise_chains())
def test_a_bound_is_never_above_a_value_the_function_takes(model: onnx.ModelProto) -> None:
    """Soundness on random chains: no input, dense near zero or far out, gives a value below the bound found
    (the ONNX reference evaluator computes both, so the test checks the bound, not an op's implementation)."""
    bound = lower_bounds(model).get("y")
    if bound is None:
        return
    x = np.concatenate([np.linspace(-50, 50, 200_001), np.random.default_rng(0).standard_normal(10_000) * 1e4])
    values = _values(model, x)
    assert np.all(values[np.isfinite(values)] >= bound), (bound, float(np.nanmin(values)))


def test_uint8_grid_reaches_the_bound_and_the_threshold_in_finer_steps() -> None:
    scale = 6.0 / 127  # a HardSwish output with threshold 6
    finer, zero = uint8_grid(scale, -0.375)
    assert finer < scale * 0.55 and 0 < zero < 128
    assert -zero * finer <= -0.375 and (255 - zero) * finer >= 6.0 - 1e-6
    assert uint8_grid(scale, None) == (scale, 128) and uint8_grid(scale, 0.0) == (scale * 127 / 255, 0)
    assert uint8_grid(scale, -5.9) == (scale, 128), "a bound near -T saves nothing: the symmetric grid"
    tiny = 1e-9 / 127  # a HardSwish whose values are ~1e-9 (random-weight MobileNetV3): its bound, -0.375, is far below
    assert uint8_grid(tiny, -0.375) == (tiny, 128)


def test_gated_activations_get_finer_cpu_grids_and_the_plan_comes_closer_to_fp32(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """silu_block (SiLU and HardSwish between convs): the pairs after them get a zero point below 128 and a
    finer scale, and the CPU plan's error against FP32 falls below that of the same plan on the symmetric
    grid there (ONNX Runtime's kernels, in the encoding they compute exactly on this CPU: the test holds on
    CPUs with VNNI and without)."""
    graph = optimized_zoo_graph("silu_block")
    model, _, report = quantize(graph, cpu_config())
    feeds = [feeds_for(graph, seed=s) for s in range(4)]
    fp32 = onnx_from_graph(graph)

    def error(lowered: onnx.ModelProto) -> float:
        errs = []
        for f in feeds:
            want, got = run_model(fp32, f), run_model(lowered, f)
            errs += [1 - cosine(want[k], got[k]) for k in want]
        return float(np.mean(errs))

    lowered = lower_for_cpu(model, encoding=exact_encoding())  # the encoding this CPU's kernels run exactly
    inits = {t.name: numpy_helper.to_array(t) for t in lowered.graph.initializer}
    shifted = [q for q in lowered.graph.node if q.op_type == "QuantizeLinear" and 0 < int(inits[q.input[2]]) < 128]
    assert len(shifted) >= 2, "the SiLU and HardSwish outputs"
    for q in shifted:
        assert float(inits[q.input[1]]) < report.thresholds[q.input[0]] / 127 * 0.6
    finer = error(lowered)
    monkeypatch.setattr(lowering, "lower_bounds", lambda m, wanted: {
        k: v for k, v in lower_bounds(m, wanted).items() if v >= 0})  # fmt: skip
    assert finer < error(lower_for_cpu(model, encoding=exact_encoding()))
