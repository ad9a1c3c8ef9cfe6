"""GELU and SiLU written as ONNX Runtime's fused kernels in CPU plans (trtopt.backend.cpu.activations): every
spelling an exporter writes is found, the values are those of the unfused graph, ONNX Runtime then runs one
kernel per activation behind a DequantizeLinear, and chains that are not exactly the activation are left alone."""

from __future__ import annotations

import itertools
import math
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtopt.backend.cpu.activations import fuse_activations

SHAPE = [1, 4, 6, 6]


def _model(
    body: list[onnx.NodeProto], consts: dict[str, float], qdq: bool, extra_out: str | None = None
) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in consts.items()]
    nodes = []
    if qdq:  # the activation reads a DequantizeLinear, as in an INT8 plan
        inits += [
            numpy_helper.from_array(np.array(0.05, np.float32), "qs"),
            numpy_helper.from_array(np.array(128, np.uint8), "z"),
        ]
        nodes += [
            helper.make_node("QuantizeLinear", ["inp", "qs", "z"], ["q"]),
            helper.make_node("DequantizeLinear", ["q", "qs", "z"], ["x"]),
        ]
    else:
        nodes.append(helper.make_node("Identity", ["inp"], ["x"]))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)]
    if extra_out:
        outputs.append(helper.make_tensor_value_info(extra_out, TensorProto.FLOAT, SHAPE))
    graph = helper.make_graph(
        nodes + body, "act", [helper.make_tensor_value_info("inp", TensorProto.FLOAT, SHAPE)], outputs, inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _gelu(scale_op: str, grouping: str, swap: bool) -> tuple[list[onnx.NodeProto], dict[str, float]]:
    """GELU in one of its spellings: Div by sqrt 2 or Mul by 1/sqrt 2, the two Muls grouped three ways, the
    operands of each binary op in either order."""

    def op(kind: str, a: str, b: str, out: str) -> onnx.NodeProto:
        return helper.make_node(kind, [b, a] if swap else [a, b], [out])

    consts = {"one": 1.0, "half": 0.5, "r2": math.sqrt(2) if scale_op == "Div" else 1 / math.sqrt(2)}
    nodes = [
        helper.make_node(scale_op, ["x", "r2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        op("Add", "e", "one", "a"),
    ]
    if grouping == "x*a then half":
        nodes += [op("Mul", "x", "a", "m"), op("Mul", "m", "half", "y")]
    elif grouping == "a*half then x":
        nodes += [op("Mul", "a", "half", "m"), op("Mul", "m", "x", "y")]
    else:  # "x*half then a"
        nodes += [op("Mul", "x", "half", "h"), op("Mul", "h", "a", "y")]
    return nodes, consts


def _silu(swap: bool) -> tuple[list[onnx.NodeProto], dict[str, float]]:
    mul = ["s", "x"] if swap else ["x", "s"]
    return [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", mul, ["y"])], {}


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(["y"], {"inp": x})[0]


def _optimised_ops(model: onnx.ModelProto) -> Counter[str]:
    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(Path(tmp, "o.onnx"))
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return Counter(n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node)


GELUS = list(itertools.product(("Div", "Mul"), ("x*a then half", "a*half then x", "x*half then a"), (False, True)))


@pytest.mark.parametrize(("scale_op", "grouping", "swap"), GELUS)
def test_every_gelu_spelling_becomes_one_gelu_with_the_same_values(scale_op: str, grouping: str, swap: bool) -> None:
    body, consts = _gelu(scale_op, grouping, swap)
    x = np.random.default_rng(0).normal(0, 3, SHAPE).astype(np.float32)
    for qdq in (False, True):
        model = _model(body, consts, qdq)
        want = _run(model, x)
        fused = onnx.ModelProto()
        fused.CopyFrom(model)
        assert fuse_activations(fused) == {"Gelu": 1}
        onnx.checker.check_model(fused)
        assert [n.op_type for n in fused.graph.node][-1] == "Gelu"
        np.testing.assert_allclose(_run(fused, x), want, rtol=1e-5, atol=1e-6)
        if qdq:  # what the rewrite is for: ONNX Runtime alone leaves five float ops and a second DQ
            assert _optimised_ops(model)["Erf"] == 1 and _optimised_ops(model)["DequantizeLinear"] == 2
            assert _optimised_ops(fused)["Gelu"] == 1 and "Erf" not in _optimised_ops(fused)


@pytest.mark.parametrize("swap", [False, True])
def test_silu_becomes_quickgelu_with_alpha_one(swap: bool) -> None:
    body, consts = _silu(swap)
    x = np.random.default_rng(1).normal(0, 4, SHAPE).astype(np.float32)
    model = _model(body, consts, qdq=True)
    fused = onnx.ModelProto()
    fused.CopyFrom(model)
    assert fuse_activations(fused) == {"QuickGelu": 1}
    (node,) = [n for n in fused.graph.node if n.op_type == "QuickGelu"]
    assert node.domain == "com.microsoft" and helper.get_attribute_value(node.attribute[0]) == 1.0
    np.testing.assert_allclose(_run(fused, x), _run(model, x), rtol=1e-5, atol=1e-6)
    assert _optimised_ops(model)["Sigmoid"] == 1 and _optimised_ops(fused)["QuickGelu"] == 1


def test_chains_that_are_not_the_activation_are_left_alone() -> None:
    body, consts = _gelu("Div", "x*a then half", False)
    wrong = {**consts, "r2": 1.5}  # not sqrt 2
    assert fuse_activations(_model(body, wrong, qdq=True)) == {}
    assert fuse_activations(_model(body, {**consts, "half": 0.25}, qdq=True)) == {}
    assert fuse_activations(_model(body, consts, qdq=True, extra_out="e")) == {}  # erf(x / sqrt 2) is also an output
    scaled = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["s", "s"], ["y"])]
    assert fuse_activations(_model(scaled, {}, qdq=True)) == {}  # sigmoid(x)^2, not x * sigmoid(x)
    gate = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["inp", "s"], ["y"])]
    assert fuse_activations(_model(gate, {}, qdq=True)) == {}  # a gate on another tensor (squeeze-excite)


def test_mul_by_the_root_either_way_and_no_fusion_in_float16_graphs() -> None:
    body, consts = _gelu("Mul", "x*a then half", False)
    body[0] = helper.make_node("Mul", ["r2", "x"], ["d"])  # the constant first
    x = np.random.default_rng(2).normal(0, 3, SHAPE).astype(np.float32)
    model = _model(body, consts, qdq=True)
    fused = onnx.ModelProto()
    fused.CopyFrom(model)
    assert fuse_activations(fused) == {"Gelu": 1}
    np.testing.assert_allclose(_run(fused, x), _run(model, x), rtol=1e-5, atol=1e-6)
    half = _model(body, consts, qdq=True)
    half.graph.value_info.append(helper.make_tensor_value_info("d", TensorProto.FLOAT16, SHAPE))
    assert fuse_activations(half) == {}


def test_the_cpu_lowering_writes_the_fused_kernel() -> None:
    """`lower_for_cpu` (what a CPU plan's ONNX is) holds the fused Gelu and drops the constants it no longer reads;
    whole builds with GELU are covered by the random-graph properties (tests/test_graph_fuzz.py)."""
    from trtopt.backend.cpu.lowering import lower_for_cpu

    body, consts = _gelu("Div", "x*a then half", False)
    lowered = lower_for_cpu(_model(body, consts, qdq=True))
    assert [n.op_type for n in lowered.graph.node].count("Gelu") == 1
    assert not any(t.name in ("one", "half", "r2") for t in lowered.graph.initializer)  # dropped, unused
