"""eliminate_concat: Split->Concat round trips, nested and single-input Concats, in-place groups."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from pass_helpers import assert_same_outputs, ops, run_pass

from trtopt.frontend import graph_from_onnx
from trtopt.passes import find_concat_groups, optimize
from trtopt.zoo import GraphBuilder


def split(b: GraphBuilder, x: str, sizes: list[int], names: list[str]) -> list[str]:
    """A channel Split in the opset's form (sizes as an input from opset 13)."""
    node = onnx.helper.make_node("Split", [x, b.const("sizes", np.array(sizes, np.int64))], names, axis=1)
    if b.opset < 13:
        node = onnx.helper.make_node("Split", [x], names, axis=1, split=sizes)
    b.nodes.append(node)
    return names


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_split_then_concat_in_order_is_identity(opset: int) -> None:
    """input ─ Relu ─ Split(3) ─ Concat (same order, same axis) ─ output  =>  input ─ Relu ─ output"""
    b = GraphBuilder("roundtrip", seed=1, opset=opset)
    x = b.relu(b.input("input", [1, 6, 4, 4]))
    pieces = split(b, x, [1, 2, 3], ["p0", "p1", "p2"])
    model = b.build([b.concat(pieces, out="output")])
    graph, report = run_pass(model, "eliminate_concat")
    assert ops(graph) == ["Relu"] and graph.nodes[0].outputs[0].name == "output"
    assert report.counts() == {"split_concat_identity": 1, "drop_single_concat": 1}
    assert_same_outputs(model, graph)


def test_partial_run_merges_split_outputs() -> None:
    """Two of three pieces go to the Concat in order; the third is used elsewhere.

    input ─ Relu ─ Split ─┬─ p0 ┐
                          ├─ p1 ┴─ Concat(p0, p1, input) ─ output
                          └─ p2 ─ Sigmoid ─ side
    """
    b = GraphBuilder("partial", seed=2, opset=17)
    x = b.input("input", [1, 6, 4, 4])
    p0, p1, p2 = split(b, b.relu(x), [1, 2, 3], ["p0", "p1", "p2"])
    model = b.build([b.concat([p0, p1, x], out="output"), b.node("Sigmoid", [p2], out="side")])
    graph, report = run_pass(model, "eliminate_concat")
    assert report.counts() == {"merge_split_pieces": 1}
    split_node = next(n for n in graph.nodes if n.op == "Split")
    assert len(split_node.outputs) == 2 and list(split_node.inputs[1].values) == [3, 3]
    assert_same_outputs(model, graph)


def test_out_of_order_or_other_axis_is_kept() -> None:
    """input ─ Split ─ Concat(p1, p0) ─ o1   and   input ─ Split(axis 1) ─ Concat(axis 2) ─ o2"""
    b = GraphBuilder("keep", seed=3, opset=17)
    x = b.input("input", [1, 4, 4, 4])
    p0, p1 = split(b, x, [2, 2], ["p0", "p1"])
    q0, q1 = split(b, b.relu(x), [2, 2], ["q0", "q1"])
    model = b.build([b.concat([p1, p0], out="o1"), b.concat([q0, q1], axis=2, out="o2")])
    graph, report = run_pass(model, "eliminate_concat")
    assert not report.changed and ops(graph).count("Concat") == 2


def test_nested_concats_flatten_only_on_the_same_axis() -> None:
    """a, b, c, d: Relu outputs.

    Concat1(a, b) ─┐
    c ─────────────┼─ Concat0 (axis 1) ─ o1     Concat1 flattens into Concat0
    Concat2(axis 2)(c, d) ─ Concat3(axis 1, + a) ─ o2   different axis: kept
    """
    b = GraphBuilder("nested", seed=4, opset=17)
    x = b.input("input", [1, 2, 4, 4])
    a, bb, c, d = (b.relu(x), b.node("Sigmoid", [x]), b.node("Tanh", [x]), b.node("Abs", [x]))
    o1 = b.concat([b.concat([a, bb]), c], out="o1")
    o2 = b.concat([b.concat([c, d], axis=2), b.concat([a, a], axis=2)], out="o2")
    model = b.build([o1, o2])
    graph, report = run_pass(model, "eliminate_concat")
    assert report.counts() == {"flatten_concat": 1}
    flat = next(n for n in graph.nodes if n.outputs[0].name == "o1")
    assert [t.name for t in flat.inputs] == [a, bb, c]
    assert_same_outputs(model, graph)


def test_single_input_concat_dropped_unless_it_is_the_whole_interface() -> None:
    """input ─ Relu ─ Concat(one input) ─ o1      dropped, o1 keeps its name
    input ─ Concat(one input) ─ o2             kept: would rename a graph input to an output
    """
    b = GraphBuilder("single", seed=5, opset=17)
    x = b.input("input", [1, 2, 3, 3])
    model = b.build([b.concat([b.relu(x)], out="o1"), b.concat([x], out="o2")])
    graph, report = run_pass(model, "eliminate_concat")
    assert report.counts() == {"drop_single_concat": 1} and ops(graph) == ["Relu", "Concat"]
    assert [t.name for t in graph.outputs] == ["o1", "o2"]
    assert_same_outputs(model, graph)


def test_in_place_concat_groups() -> None:
    """Concat A (a, b): in place.  Concat B (a2, input): graph input => not.
    Concat C (c, c2) with c also read by a Relu => not."""
    b = GraphBuilder("groups", seed=6, opset=17)
    x = b.input("input", [1, 2, 3, 3])
    ca = b.concat([b.relu(x), b.node("Sigmoid", [x])], out="A")
    cb = b.concat([b.node("Tanh", [x]), x], out="B")
    c = b.node("Abs", [x])
    cc = b.concat([c, b.node("Neg", [x])], out="C")
    graph = graph_from_onnx(b.build([ca, cb, cc, b.relu(c, out="r")]))
    flags = {g.output: g.in_place for g in find_concat_groups(graph)}
    assert flags == {"A": True, "B": False, "C": False}


def test_horizontal_fusion_feeding_a_concat_collapses() -> None:
    """Two 1x1+Relu siblings that go straight into a Concat: after horizontal fusion the Split's two
    pieces are the whole Concat, so both disappear.

        input ─┬─ Conv1x1 ─ Relu ─┐
               └─ Conv1x1 ─ Relu ─┴─ Concat ─ output   =>   input ─ Conv1x1 (wide) ─ Relu ─ output
    """
    b = GraphBuilder("hf_concat", seed=7, opset=17)
    x = b.input("input", [1, 4, 5, 5])
    model = b.build([b.concat([b.relu(b.conv(x, 4, 3, 1)), b.relu(b.conv(x, 4, 5, 1))], out="output")])
    result = optimize(graph_from_onnx(model))
    assert ops(result.graph) == ["Conv", "Relu"]
    assert [r.name for r in result.reports if r.changed] == ["fuse_parallel_convs", "eliminate_concat"]
    assert_same_outputs(model, result.graph)
