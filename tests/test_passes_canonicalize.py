"""Canonicalisation before the fusions (issue #45): simplify (ONNX Runtime's basic level), remove_noops,
sink_transposes, rewrite_prelu. Each on small graphs as ports and converters write them, checked numerically in
ONNX Runtime against the graph before; a property test inserts layout round trips into random graphs."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from graph_fuzz import random_graphs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from pass_helpers import assert_canonical, assert_same_outputs, ops, random_feeds, run_pass

from trtopt.execution.ort_session import run_model
from trtopt.frontend import graph_from_onnx, onnx_from_graph
from trtopt.passes import optimize
from trtopt.passes.rewrite_prelu import prelu_form
from trtopt.passes.simplify import skip_reason
from trtopt.zoo import GraphBuilder, build_model
from trtopt.zoo.ports import TO_NCHW, TO_NHWC
from trtopt.zoo.random_graphs import RandomGraph

CLEANUP = ["remove_noops", "sink_transposes"]


def count(graph, op: str) -> int:
    return sum(n.op == op for n in graph.nodes)


# -- remove_noops --------------------------------------------------------------------------------------------


def noop_chain(first: int, middle: int) -> onnx.ModelProto:
    """input ─ Identity ─ Dropout ─ Cast(float) ─ Conv ─ Cast(first) ─ Cast(middle) ─ Cast(float) ─ output"""
    b = GraphBuilder("noops", seed=0)
    x = b.input("input", [1, 4, 6, 6])
    y = b.node("Cast", [b.node("Dropout", [b.node("Identity", [x])])], to=TensorProto.FLOAT)
    y = b.conv(y, 4, 4, 3)
    y = b.node("Cast", [b.node("Cast", [y], to=first)], to=middle)
    return b.build([b.node("Cast", [y], to=TensorProto.FLOAT, out="output")])


def test_noops_go_and_an_exact_cast_round_trip_with_them() -> None:
    model = noop_chain(TensorProto.DOUBLE, TensorProto.FLOAT)  # float -> double -> float -> float: exact
    graph, report = run_pass(model, "remove_noops")
    assert ops(graph) == ["Conv"] and graph.outputs[0].name == "output"
    assert report.counts() == {"identity": 1, "dropout": 1, "cast": 2, "cast_chain": 1}
    assert_same_outputs(model, graph)


def test_reshapes_to_the_shape_they_have_go() -> None:
    """input ─ Conv ─ Reshape([-1, 4, 6, 6]) ─ Flatten ─ Reshape([0, 144]) ─ output: the first and the last keep
    their input's shape (the last, given Flatten's [2, 144])"""
    b = GraphBuilder("reshapes", seed=0)
    y = b.node("Reshape", [b.conv(b.input("input", [2, 4, 6, 6]), 4, 4, 3), b.const("s", np.array([-1, 4, 6, 6]))])
    y = b.node("Reshape", [b.node("Flatten", [y], axis=1), b.const("t", np.array([0, 144]))], out="output")
    model = b.build([y])
    graph, report = run_pass(model, "remove_noops")
    assert ops(graph) == ["Conv", "Flatten"] and report.counts() == {"reshape": 2}
    assert_same_outputs(model, graph)


def test_adds_of_zeros_and_muls_by_ones_go_unless_they_broadcast() -> None:
    """input [2,6,6,4] ─ MatMul ─ Add(zeros[4], ·) ─ Mul(ones[1,1,1,4]) ─ Div(1) ─ Sub(0, ·) ─┬ Add(zeros[3,1,1,1,1])
                                                                                       └ Mul(0.5)
    A fresh ConvNeXt's zero Linear biases: the first three compute nothing; 0 - x negates, and an Add of zeros
    that broadcasts to a larger shape grows its input, so those stay."""
    b = GraphBuilder("neutral", seed=0)
    weight = b.const("w", b.rng.standard_normal((4, 4)).astype(np.float32))
    y = b.node("MatMul", [b.input("input", [2, 6, 6, 4]), weight])
    y = b.node("Add", [b.const("bias", np.zeros(4, np.float32)), y])
    y = b.node("Mul", [y, b.const("scale", np.ones((1, 1, 1, 4), np.float32))])
    y = b.node("Div", [y, b.const("one", np.array(1.0, np.float32))])
    y = b.node("Sub", [b.const("zero", np.array(0.0, np.float32)), y])
    grown = b.node("Add", [y, b.const("wide", np.zeros((3, 1, 1, 1, 1), np.float32))], out="grown")
    model = b.build([grown, b.node("Mul", [y, b.const("half", np.full(4, 0.5, np.float32))], out="half")])
    graph, report = run_pass(model, "remove_noops")
    assert report.counts() == {"neutral": 3}
    assert ops(graph) == ["MatMul", "Sub", "Add", "Mul"]
    assert_same_outputs(model, graph)


def test_zero_pads_and_whole_slices_go_and_real_ones_stay() -> None:
    """Swin's pad to the window size and crop back, where the size is a multiple already:
    input [2,4,6,6] ─ Pad(0s) ─ Slice(0:6, axes 2, 3) ─ Slice(0:INT64_MAX, axis -1) ─ Slice(-9:, axis 2) ─┬ Pad(1s) ─ a
                                                                                                └ Slice(1:6) ─ b
    The first four keep every element; a Pad of ones and a Slice from 1 change the shape and stay."""
    b = GraphBuilder("pads", seed=0)
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    y = b.node("Pad", [b.input("input", [2, 4, 6, 6]), b.const("zeros", i64(*[0] * 8))])
    y = b.node("Slice", [y, b.const("s0", i64(0, 0)), b.const("e0", i64(6, 6)), b.const("a0", i64(2, 3))])
    y = b.node("Slice", [y, b.const("s1", i64(0)), b.const("e1", i64(np.iinfo(np.int64).max)), b.const("a1", i64(-1))])
    y = b.node("Slice", [y, b.const("s2", i64(-9)), b.const("e2", i64(6)), b.const("a2", i64(2)),
                         b.const("st2", i64(1))])
    padded = b.node("Pad", [y, b.const("ones", i64(*[1] * 8))], out="a")
    cropped = b.node("Slice", [y, b.const("s3", i64(1)), b.const("e3", i64(6)), b.const("a3", i64(3))], out="b")
    model = b.build([padded, cropped])
    graph, report = run_pass(model, "remove_noops")
    assert report.counts() == {"pad": 1, "slice": 3} and ops(graph) == ["Pad", "Slice"]
    assert_same_outputs(model, graph)


def test_a_lossy_cast_round_trip_stays() -> None:
    model = noop_chain(TensorProto.FLOAT16, TensorProto.FLOAT)  # float16 rounds: the chain must stay
    graph, _ = run_pass(model, "remove_noops")
    assert count(graph, "Cast") >= 1 and count(graph, "Identity") == count(graph, "Dropout") == 0
    assert_same_outputs(model, graph)


def test_a_dropout_whose_mask_is_read_stays() -> None:
    b = GraphBuilder("mask", seed=0)
    x = b.input("input", [1, 4, 6, 6])
    b.nodes.append(helper.make_node("Dropout", [x], ["y", "mask"], name="dropout"))
    model = b.build(["y", b.node("Cast", ["mask"], to=TensorProto.FLOAT, out="mask_float")])
    graph, report = run_pass(model, "remove_noops")
    assert count(graph, "Dropout") == 1 and "dropout" not in report.counts()


# -- sink_transposes ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["nhwc_port", "nhwc_port_prelu"])
def test_a_port_keeps_one_transpose_at_its_nhwc_input(name: str) -> None:
    model = build_model(name, batch=2)
    graph = optimize(graph_from_onnx(model), CLEANUP).graph
    assert count(graph, "Transpose") == 1 and graph.inputs[0].outputs[0].op == "Transpose"
    assert count(graph, "Cast") == 0 and count(graph, "Identity") == 0
    assert [(t.name, list(t.shape)) for t in graph.inputs] == [("input", [2, 32, 32, 3])]
    assert_canonical(graph)
    assert_same_outputs(model, graph)


def nhwc_output_model(*, concat: bool, reduce_keepdims: int | None) -> onnx.ModelProto:
    """input(NCHW) ─ Conv ─ T(NHWC) ─ Mul(c) ─ Relu ─ [Concat(axis 3) with T(NHWC)(input ─ Conv)]
    ─ [ReduceMean(axes 1, 2)] ─ output"""
    b = GraphBuilder("nhwc_out", seed=1)
    x = b.input("input", [1, 4, 8, 8])
    y = b.node("Transpose", [b.conv(x, 4, 6, 3)], perm=TO_NHWC)
    y = b.relu(b.mul(y, b.const("scale", np.linspace(0.5, 1.5, 6, dtype=np.float32))))
    if concat:
        other = b.node("Transpose", [b.conv(x, 4, 2, 1)], perm=TO_NHWC)
        y = b.concat([y, other], axis=-1)
    if reduce_keepdims is not None:
        y = b.node("ReduceMean", [y], axes=[1, 2], keepdims=reduce_keepdims)
    return b.build([b.node("Identity", [y], out="output")])


@pytest.mark.parametrize(("concat", "keepdims", "transposes"), [(False, None, 1), (True, None, 1), (True, 0, 0),
                                                                 (False, 1, 1)])
def test_regions_end_at_the_boundary_or_in_a_reduce(concat: bool, keepdims: int | None, transposes: int) -> None:
    model = nhwc_output_model(concat=concat, reduce_keepdims=keepdims)
    graph = optimize(graph_from_onnx(model), CLEANUP).graph
    assert count(graph, "Transpose") == transposes
    if transposes:  # the NHWC output keeps its layout: one Transpose, writing the graph output
        assert graph.outputs[0].inputs[0].op == "Transpose"
    assert_same_outputs(model, graph)


def test_transpose_pairs_merge_and_cancel() -> None:
    b = GraphBuilder("pairs", seed=0)
    x = b.input("input", [1, 3, 4, 5])
    y = b.node("Transpose", [b.node("Transpose", [x], perm=TO_NHWC)], perm=TO_NCHW)  # cancels
    y = b.node("Transpose", [b.node("Transpose", [b.relu(y)], perm=[0, 2, 1, 3])], perm=[0, 1, 3, 2])  # merges
    model = b.build([b.relu(y, out="output")])
    graph, report = run_pass(model, "sink_transposes")
    assert report.counts() == {"merge_transposes": 2, "sink_transposes": 1}  # the last moves to the output
    assert count(graph, "Transpose") == 1 and graph.outputs[0].inputs[0].op == "Transpose"
    assert_same_outputs(model, graph)


def test_a_region_that_would_not_pay_is_left() -> None:
    """input ─ T(NHWC) ─ Relu ─┬─ output
              other(NHWC) ──── Add ─ sum      (the Add needs NHWC: 1 Transpose removed, 1 added back)"""
    b = GraphBuilder("left", seed=0)
    x, other = b.input("input", [1, 4, 6, 6]), b.input("other", [1, 6, 6, 4])
    y = b.relu(b.node("Transpose", [x], perm=TO_NHWC), out="output")
    model = b.build([y, b.add(y, other, out="sum")])
    graph, report = run_pass(model, "sink_transposes")
    assert not report.changed and count(graph, "Transpose") == 1


# -- rewrite_prelu --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("slope", "form"), [([0.2] * 4, "leaky"), ([0.1, 0.2, 0.3, 1.0], "max"),
                                             ([1.0, 1.5, 2.0, 3.0], "min"), ([-0.5, 0.2, 1.5, 0.0], "split")])
def test_prelu_forms_are_bit_exact(slope: list[float], form: str) -> None:
    b = GraphBuilder("prelu", seed=0)
    x = b.input("input", [2, 4, 5, 5])
    values = np.array(slope, np.float32).reshape(4, 1, 1)
    model = b.build([b.node("PRelu", [x, b.const("slope", values)], out="output")])
    assert prelu_form(values) == form
    graph, report = run_pass(model, "rewrite_prelu")
    assert count(graph, "PRelu") == 0 and report.counts() == {"rewrite_prelu": 1}
    feeds = random_feeds(graph)
    feeds["input"][0, :, 0, 0] = 0.0
    before, after = run_model(model, feeds, opt_level="disable"), run_model(graph, feeds, opt_level="disable")
    assert np.array_equal(before["output"], after["output"])


# -- simplify and the whole clean-up --------------------------------------------------------------------------


def test_simplify_reports_what_onnx_runtime_removed() -> None:
    graph, report = run_pass(build_model("nhwc_port"), "simplify")
    details = [r.detail for r in report.rewrites]
    assert any(d.startswith("Cast: 9 removed") for d in details), details
    assert any(d.startswith("Gemm: 1 added") for d in details), details
    assert count(graph, "Cast") == 0 and count(graph, "Gemm") == 1


def test_simplify_leaves_a_float16_graph_and_hard_swish_alone() -> None:
    half = graph_from_onnx(build_model("tiny_cnn"))
    for tensor in half.tensors().values():
        if isinstance(tensor, gs.Variable) and tensor.dtype == np.float32:
            tensor.dtype = np.float16
    assert skip_reason(half) == "the graph computes in float16 or float64"
    model = build_model("silu_block")  # HardSwish, which ONNX Runtime would expand at opset 17
    graph, report = run_pass(model, "simplify")
    assert not report.changed and count(graph, "HardSwish") == 1


def test_the_default_pipeline_cleans_a_port_at_least_as_well_as_onnx_runtime() -> None:
    model = build_model("nhwc_port")
    graph = optimize(graph_from_onnx(model)).graph
    basic = optimize(graph_from_onnx(model), ["simplify"]).graph
    assert len(graph.nodes) < len(basic.nodes) and count(graph, "Transpose") == 1
    assert count(graph, "Sub") == count(graph, "Mul") == 0  # BN written out, folded into the convs
    assert_same_outputs(model, graph)


# -- property: layout round trips inserted into random graphs go, outputs unchanged ----------------------------

ROUND_TRIPS = ("bare", "identity", "cast", "relu", "scale")


def with_round_trips(model: onnx.ModelProto, picks: list[tuple[int, str]]) -> onnx.ModelProto:
    """`model` with T(NHWC) ─ <op> ─ T(NCHW) inserted on the rank-4 float tensors that `picks` index."""
    inferred = onnx.shape_inference.infer_shapes(model)
    outputs = {o.name for o in model.graph.output}
    rank4 = [v.name for v in inferred.graph.value_info if v.name not in outputs
             and v.type.tensor_type.elem_type == TensorProto.FLOAT and len(v.type.tensor_type.shape.dim) == 4]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for index, kind in picks:
        if rank4:
            _insert_round_trip(out, rank4[index % len(rank4)], kind, inferred)
    return out


def _insert_round_trip(model: onnx.ModelProto, name: str, kind: str, inferred: onnx.ModelProto) -> None:
    tag = f"rt{len(model.graph.node)}"
    channels = next(v.type.tensor_type.shape.dim[1].dim_value for v in inferred.graph.value_info if v.name == name)
    nodes = [helper.make_node("Transpose", [name], [f"{tag}_a"], perm=TO_NHWC, name=f"{tag}_t1")]
    last = f"{tag}_a"
    if kind != "bare":
        op, extra, attrs = {"identity": ("Identity", [], {}), "cast": ("Cast", [], {"to": TensorProto.FLOAT}),
                            "relu": ("Relu", [], {}), "scale": ("Mul", [f"{tag}_c"], {})}[kind]
        if kind == "scale":
            model.graph.initializer.append(onnx.numpy_helper.from_array(
                np.linspace(0.5, 2.0, max(channels, 1), dtype=np.float32), f"{tag}_c"))
        nodes.append(helper.make_node(op, [last, *extra], [f"{tag}_b"], name=f"{tag}_op", **attrs))
        last = f"{tag}_b"
    nodes.append(helper.make_node("Transpose", [last], [f"{tag}_out"], perm=TO_NCHW, name=f"{tag}_t2"))
    for node in model.graph.node:
        node.input[:] = [f"{tag}_out" if i == name else i for i in node.input]
    position = next((i for i, n in enumerate(model.graph.node) if name in n.output), -1) + 1
    for offset, node in enumerate(nodes):
        model.graph.node.insert(position + offset, node)


@settings(derandomize=True, max_examples=25, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs(), st.lists(st.tuples(st.integers(0, 1000), st.sampled_from(ROUND_TRIPS)), min_size=1,
                                  max_size=4), st.sampled_from([None, tuple(CLEANUP)]))
def test_layout_round_trips_in_random_graphs_are_removed(
    graph: RandomGraph, picks: list[tuple[int, str]], passes: tuple[str, ...] | None
) -> None:
    """By the default pipeline, and by trtopt's own passes alone (without ONNX Runtime's transpose optimizer)."""
    model = with_round_trips(graph.model, picks)
    plain = optimize(graph_from_onnx(graph.model), passes).graph
    cleaned = optimize(graph_from_onnx(model), passes).graph
    assert count(cleaned, "Transpose") <= count(plain, "Transpose")
    assert count(cleaned, "Cast") <= count(plain, "Cast") and count(cleaned, "Identity") == 0
    assert_canonical(cleaned)
    assert_same_outputs(onnx_from_graph(graph_from_onnx(model)), cleaned)


def test_prelu_is_rewritten_for_the_cpu_backend_only() -> None:
    from trtopt.backend import BACKENDS
    from trtopt.passes import DEFAULT_ORDER

    cpu = BACKENDS.get("cpu").passes(None)
    assert cpu is not None and "rewrite_prelu" in cpu and cpu.index("rewrite_prelu") > cpu.index("sink_transposes")
    assert "rewrite_prelu" not in DEFAULT_ORDER and BACKENDS.get("tensorrt").passes(None) is None
    assert BACKENDS.get("cpu").passes(["fold_pad"]) == ("fold_pad",)


def test_a_graph_output_read_by_the_inverse_transpose_keeps_both_outputs() -> None:
    """input ─ T(NHWC) ─ Relu ─┬─ mid (output)
                              └─ T(NCHW) ─ back (output)"""
    b = GraphBuilder("edge", seed=0)
    mid = b.relu(b.node("Transpose", [b.input("input", [1, 4, 5, 6])], perm=TO_NHWC), out="mid")
    model = b.build([mid, b.node("Transpose", [mid], perm=TO_NCHW, out="back")])
    graph = optimize(graph_from_onnx(model), CLEANUP).graph
    assert [t.name for t in graph.outputs] == ["mid", "back"] and count(graph, "Transpose") == 2
    assert_same_outputs(model, graph)


# -- hoist_transposes -----------------------------------------------------------------------------------------


def scaled_nhwc_input(*, transpose_is_output: bool = False) -> onnx.ModelProto:
    """input(NHWC) ─ Mul(1/127.5) ─ Sub(per-channel mean, last axis) ─ T(NCHW) ─ Conv1x1 ─ output   (Keras' input)"""
    b = GraphBuilder("keras_input", seed=0)
    y = b.mul(b.input("input", [1, 8, 8, 3]), b.const("scale", np.array(1 / 127.5, np.float32)))
    y = b.node("Sub", [y, b.const("mean", np.array([0.4, 0.5, 0.6], np.float32))])
    if transpose_is_output:
        return b.build([b.node("Transpose", [y], perm=TO_NCHW, out="output")])
    y = b.node("Transpose", [y], perm=TO_NCHW)
    return b.build([b.conv(y, 3, 8, 1, pads=[0, 0, 0, 0], out="output")])


def test_a_transpose_moves_to_the_input_and_the_scaling_into_the_conv() -> None:
    model = scaled_nhwc_input()
    graph, report = run_pass(model, "hoist_transposes")
    assert ops(graph) == ["Transpose", "Mul", "Sub", "Conv"] and report.counts() == {"hoist_transpose": 1}
    assert graph.nodes[0].inputs[0].name == "input"
    assert_same_outputs(model, graph)
    cleaned = optimize(graph_from_onnx(model)).graph
    assert ops(cleaned) == ["Transpose", "Conv"]  # fold_input_affine took the Mul and the Sub
    assert_same_outputs(model, cleaned)


def test_a_transpose_that_writes_a_graph_output_stays_there() -> None:
    graph, report = run_pass(scaled_nhwc_input(transpose_is_output=True), "hoist_transposes")
    assert not report.changed and ops(graph) == ["Mul", "Sub", "Transpose"]


def test_a_hoist_through_a_clip_without_a_min_keeps_it_without_one() -> None:
    """input(NHWC) ─ Clip(max 6 only) ─ T(NCHW) ─ Conv1x1 ─ output: the Clip's missing min stays missing."""
    b = GraphBuilder("clip_max", seed=0)
    y = b.node("Clip", [b.input("input", [1, 8, 8, 3]), "", b.const("high", np.array(6.0, np.float32))])
    model = b.build([b.conv(b.node("Transpose", [y], perm=TO_NCHW), 3, 8, 1, pads=[0, 0, 0, 0], out="output")])
    graph, report = run_pass(model, "hoist_transposes")
    assert ops(graph) == ["Transpose", "Clip", "Conv"] and report.counts() == {"hoist_transpose": 1}
    assert_same_outputs(model, graph)


def test_simplify_keeps_the_shapes_the_residual_fusions_read() -> None:
    """ONNX Runtime's optimised model carries few shapes; the ops its transpose optimiser rewrites come back
    without any. The residual Adds of a port must still be known to add like shapes, or they are no fusion group
    and the CPU plan leaves them float (tf2onnx's MobileNetV2 without its optimizers: 9 of 10)."""
    from trtopt.passes import find_fusion_groups

    graph, _ = run_pass(build_model("nhwc_port"), "simplify")
    adds = [n for n in graph.nodes if n.op == "Add" and all(isinstance(t, gs.Variable) for t in n.inputs)]
    assert adds and all(t.shape is not None for n in adds for t in (*n.inputs, *n.outputs))
    optimized = optimize(graph_from_onnx(build_model("nhwc_port"))).graph
    residual_adds = [n for n in optimized.nodes if n.op == "Add" and all(isinstance(t, gs.Variable) for t in n.inputs)]
    assert len([g for g in find_fusion_groups(optimized) if g.residual]) == len(residual_adds) > 0
