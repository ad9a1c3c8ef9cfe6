"""`If` nodes whose condition folds to a constant are replaced by the branch they take, every output of it
(trtopt.frontend.conditionals; onnx-graphsurgeon's own flattening kept only the first, and silero-vad's 16 kHz
export then loaded into a model ONNX Runtime refused). The loaded graph must compute what the model does.

    x [1, 4] ─┬─ If (cond: Constant, folded) ─┬─ a: Split(x)[0] + 1       (a multi-output node in the branch)
              │   then / else                 ├─ b: Split(x)[1]           (its second output)
              │                               ├─ c: Identity(x)           (an outer tensor, folded away)
              │                               ├─ d: Constant [3]          (a constant the branch returns)
              │                               └─ e: inner If(cond2) ─ x*2 (nested, constant too)
              └─ If (cond: input flag, stays) ─ x * 3 / x
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from trtopt.frontend import graph_from_onnx, onnx_from_graph


def _value(name: str, shape: list[int], dtype: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def _constant(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(value, name))


def _taken(tag: str) -> onnx.GraphProto:
    inner = helper.make_graph(
        [helper.make_node("Mul", ["x", f"two_{tag}"], [f"x2_{tag}"])], f"inner_then_{tag}", [],
        [_value(f"x2_{tag}", [1, 4])])  # fmt: skip
    inner_else = helper.make_graph(
        [helper.make_node("Identity", ["x"], [f"xi_{tag}"])], f"inner_else_{tag}", [], [_value(f"xi_{tag}", [1, 4])]
    )
    nodes = [
        helper.make_node("Split", ["x", f"halves_{tag}"], [f"s0_{tag}", f"s1_{tag}"], axis=1),
        helper.make_node("Add", [f"s0_{tag}", f"one_{tag}"], [f"a_{tag}"]),
        helper.make_node("Identity", ["x"], [f"c_{tag}"]),
        _constant(f"d_{tag}", np.array([3.0], np.float32)),
        helper.make_node("If", [f"cond2_{tag}"], [f"e_{tag}"], then_branch=inner, else_branch=inner_else),
    ]
    for name, value in [(f"halves_{tag}", np.array([2, 2], np.int64)), (f"one_{tag}", np.ones(1, np.float32)),
                        (f"two_{tag}", np.full(1, 2, np.float32)), (f"cond2_{tag}", np.array(True))]:  # fmt: skip
        nodes.insert(0, _constant(name, value))
    outputs = [_value(f"a_{tag}", [1, 2]), _value(f"s1_{tag}", [1, 2]), _value(f"c_{tag}", [1, 4]),
               _value(f"d_{tag}", [1]),
               _value(f"e_{tag}", [1, 4])]  # fmt: skip
    return helper.make_graph(nodes, f"taken_{tag}", [], outputs)


def _skipped() -> onnx.GraphProto:
    names = ["a_s", "b_s", "c_s", "d_s", "e_s"]
    shapes = [[1, 2], [1, 2], [1, 4], [1], [1, 4]]
    nodes = [_constant("halves_s", np.array([2, 2], np.int64)), helper.make_node("Neg", ["x"], ["neg"]),
             helper.make_node("Split", ["neg", "halves_s"], names[:2], axis=1),
             helper.make_node("Identity", ["neg"], ["c_s"]), _constant("d_s", np.array([7.0], np.float32)),
             helper.make_node("Identity", ["neg"], ["e_s"])]  # fmt: skip
    return helper.make_graph(nodes, "skipped", [], [_value(n, s) for n, s in zip(names, shapes, strict=True)])


def _model(condition: bool) -> onnx.ModelProto:
    then, other = (_taken("t"), _skipped()) if condition else (_skipped(), _taken("t"))
    outs = ["a", "b", "c", "d", "e"]
    times3 = helper.make_graph([helper.make_node("Mul", ["x", "three"], ["x3"])], "x3", [], [_value("x3", [1, 4])])
    plain = helper.make_graph([helper.make_node("Identity", ["x"], ["xp"])], "xp", [], [_value("xp", [1, 4])])
    nodes = [
        _constant("cond", np.array(condition)),
        _constant("three", np.full(1, 3, np.float32)),
        helper.make_node("If", ["cond"], outs, then_branch=then, else_branch=other),
        helper.make_node("Add", ["c", "e"], ["ce"]),
        helper.make_node("If", ["flag"], ["f"], then_branch=times3, else_branch=plain),
    ]
    outputs = [_value("a", [1, 2]), _value("b", [1, 2]), _value("ce", [1, 4]), _value("d", [1]), _value("f", [1, 4])]
    graph = helper.make_graph(nodes, "conditionals", [_value("x", [1, 4]), _value("flag", [], TensorProto.BOOL)],
                              outputs)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.parametrize("condition", [True, False])
@pytest.mark.parametrize("flag", [True, False])
def test_every_output_of_a_decided_if_comes_from_the_branch_taken(condition: bool, flag: bool) -> None:
    model = _model(condition)
    onnx.checker.check_model(model, full_check=True)
    feeds = {"x": np.array([[1.0, -2.0, 3.5, 4.0]], np.float32), "flag": np.array(flag)}
    graph = graph_from_onnx(model)
    ops = [n.op for n in graph.nodes]
    assert ops.count("If") == 1, ops  # only the one whose condition is an input stays
    for want, got in zip(_run(model, feeds), _run(onnx_from_graph(graph), feeds), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_branch_output_its_own_nodes_also_read() -> None:
    """then: half = x / 2 (returned) and start = half + 1 (returned too, reading half inside the branch), as in
    ONNX's expanded AffineGrid function. Flattened, `start` must still find `half`'s producer."""
    then = helper.make_graph(
        [_constant("two", np.full(1, 2, np.float32)), _constant("one", np.ones(1, np.float32)),
         helper.make_node("Div", ["x", "two"], ["half_then"]),
         helper.make_node("Add", ["half_then", "one"], ["start_then"])],
        "then", [], [_value("half_then", [1, 4]), _value("start_then", [1, 4])])  # fmt: skip
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["half_else"]), helper.make_node("Identity", ["x"], ["start_else"])],
        "else", [], [_value("half_else", [1, 4]), _value("start_else", [1, 4])])  # fmt: skip
    nodes = [_constant("cond", np.array(True)),
             helper.make_node("If", ["cond"], ["half", "start"], then_branch=then, else_branch=other),
             helper.make_node("Mul", ["half", "start"], ["y"])]  # fmt: skip
    model = helper.make_model(helper.make_graph(nodes, "g", [_value("x", [1, 4])], [_value("y", [1, 4])]),
                              opset_imports=[helper.make_opsetid("", 17)])  # fmt: skip
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    loaded = onnx_from_graph(graph_from_onnx(model))
    assert not any(n.op_type == "If" for n in loaded.graph.node)
    got = ort.InferenceSession(loaded.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, (x / 2) * (x / 2 + 1))
