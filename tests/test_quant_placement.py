"""Q/DQ placement and insertion in TensorRT's explicit-quantization form (DESIGN.md "Where Q/DQ go")."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from pass_helpers import assert_canonical
from quant_helpers import cosine, cpu_config, feeds_for, optimized_zoo_graph, quantize

from trtopt.errors import CalibrationError
from trtopt.execution import run_model
from trtopt.frontend import graph_from_onnx, onnx_from_graph
from trtopt.passes import find_fusion_groups, optimize
from trtopt.quant import QuantConfig, plan_quantization
from trtopt.quant.qdq import insert_qdq, quantize_weight, shared_thresholds
from trtopt.zoo import NAMES, GraphBuilder


def _producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in model.graph.node for o in n.output}


@pytest.mark.parametrize("name", NAMES)
def test_quantized_zoo_models_stay_close_to_fp32(name: str) -> None:
    """Every zoo model, quantised with max thresholds, runs in ONNX Runtime and keeps its outputs'
    direction (cosine > 0.99: 8-bit grids on a few layers; a misplaced scale or axis gives < 0.9)."""
    graph = optimized_zoo_graph(name)
    model, plan, report = quantize(graph)
    onnx.checker.check_model(model)
    feeds = feeds_for(graph, seed=7)
    reference = run_model(onnx_from_graph(graph), feeds)
    quantized = run_model(model, feeds, opt_level="disable")  # the Q/DQ math itself, on any CPU kind
    for out, ref in reference.items():
        assert cosine(ref, quantized[out]) > 0.99, out
    assert report.activation_pairs > 0 and report.weight_dequantizers > 0


@pytest.mark.parametrize("name", NAMES)
def test_no_qdq_inside_a_fused_group_and_graph_outputs_stay_float(name: str) -> None:
    graph = optimized_zoo_graph(name)
    inside = set()
    for group in find_fusion_groups(graph):
        nodes = {n.name: n for n in graph.nodes}
        members = [nodes[m] for m in group.nodes]
        inside |= {t.name for n in members[:-1] for t in n.outputs}  # edges between members
    plan = plan_quantization(graph, QuantConfig(min_channels=1))
    assert not {s.tensor for s in plan.sites} & inside
    model, _, _ = quantize(graph)
    producers = _producers(model)
    for out in model.graph.output:
        assert producers[out.name].op_type not in ("QuantizeLinear", "DequantizeLinear")
        assert out.type.tensor_type.elem_type == onnx.TensorProto.FLOAT


def test_conv_inputs_and_per_channel_weights() -> None:
    """Every Conv reads its activation through Q->DQ (int8, zero point 0) and its weight through a DQ of
    an INT8 constant with one scale per output channel (axis 0)."""
    graph = optimized_zoo_graph("resnet_bottleneck")
    model, _, _ = quantize(graph)
    producers = _producers(model)
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    assert convs
    for conv in convs:
        act_dq, w_dq = producers[conv.input[0]], producers[conv.input[1]]
        assert act_dq.op_type == w_dq.op_type == "DequantizeLinear"
        assert producers[act_dq.input[0]].op_type == "QuantizeLinear"
        assert inits[act_dq.input[2]].dtype == np.int8 and inits[act_dq.input[2]] == 0
        weight, scale = inits[w_dq.input[0]], inits[w_dq.input[1]]
        assert weight.dtype == np.int8 and scale.shape == (weight.shape[0],)
        assert {a.name: a.i for a in w_dq.attribute}.get("axis", 1) == 0


def test_residual_identity_branch_is_quantized() -> None:
    """resnet_basic: Add(conv branch, identity); the identity input of the fused Add gets Q/DQ, the conv
    branch does not (it fuses into the conv's epilogue)."""
    graph = optimized_zoo_graph("resnet_basic")
    groups = [g for g in find_fusion_groups(graph) if g.residual]
    assert groups, "resnet_basic should have a conv+add group"
    plan = plan_quantization(graph, QuantConfig(min_channels=1))
    residual_sites = [s for s in plan.sites if s.role == "residual"]
    assert {s.tensor for s in residual_sites} == {g.residual for g in groups}
    conv_branch = {g.nodes[0] for g in groups}
    outputs_of_conv_branch = {t.name for n in graph.nodes if n.name in conv_branch for t in n.outputs}
    assert not {s.tensor for s in plan.sites} & outputs_of_conv_branch


def test_concat_inputs_share_the_output_threshold() -> None:
    """All Concat inputs get Q/DQ with the same scale as the Concat output that a conv reads:

    input ─ Conv1x1 ─ Relu ─┐
          └ Conv3x3 ─ Relu ─ Concat ─ Conv1x1 ─ output
    """
    b = GraphBuilder("concat_conv", seed=4)
    x = b.input("input", [1, 16, 8, 8])
    joined = b.concat([b.relu(b.conv(x, 16, 16, 1)), b.relu(b.conv(x, 16, 24, 3))])
    graph = optimize(graph_from_onnx(b.build([b.conv(joined, 40, 16, 1, out="output")]))).graph
    plan = plan_quantization(graph, QuantConfig(min_channels=1))
    assert plan.shared, "expected a Concat group"
    assert len(plan.shared) == 1 and len(plan.shared[0]) == 3  # output + two inputs
    assert sum(s.role == "concat" for s in plan.sites) == 2
    model, _, report = quantize(graph)
    values = {report.thresholds[t] for t in plan.shared[0]}
    assert len(values) == 1, report.thresholds
    feeds = feeds_for(graph)
    quantized = run_model(model, feeds, opt_level="disable")["output"]
    assert cosine(run_model(onnx_from_graph(graph), feeds)["output"], quantized) > 0.99


def test_one_qdq_pair_per_consumer() -> None:
    graph = optimized_zoo_graph("inception")  # the input feeds several sibling convs
    model, _, _ = quantize(graph)
    q_nodes = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    consumers: dict[str, list[str]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n.op_type)
    for q in q_nodes:
        assert consumers[q.output[0]] == ["DequantizeLinear"]
    dq_outputs = [n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"]
    assert all(len(consumers.get(o, [])) <= 1 for o in dq_outputs)


def test_exclude_keep_first_last_and_tiny_layers() -> None:
    graph = optimized_zoo_graph("tiny_cnn")
    convs = [n.name for n in graph.nodes if n.op == "Conv"]
    full = plan_quantization(graph, QuantConfig(min_channels=1))
    by_name = plan_quantization(graph, QuantConfig(min_channels=1, exclude=(convs[1],)))
    assert (
        convs[1] not in by_name.quantized_layers and by_name.float_layers[convs[1]] == "excluded by --exclude"
    )
    by_op = plan_quantization(graph, QuantConfig(min_channels=1, exclude=("Gemm",)))
    assert not [n for n in by_op.quantized_layers if n.startswith("gemm")] and len(
        by_op.quantized_layers
    ) < len(full.quantized_layers)
    first_last = plan_quantization(graph, QuantConfig(min_channels=1, keep_first_last=True))
    assert full.quantized_layers[0] not in first_last.quantized_layers
    assert full.quantized_layers[-1] not in first_last.quantized_layers
    tiny = plan_quantization(graph, QuantConfig(min_channels=16))  # the stem reads 3 channels
    assert "fewer than 16 channels" in tiny.float_layers.values()


def test_quantize_weight_per_channel() -> None:
    w = np.array([[[1.0, -2.0]], [[0.5, 0.25]], [[0.0, 0.0]]], dtype=np.float32)  # 3 output channels
    q, scale = quantize_weight(w, axis=0)
    np.testing.assert_allclose(scale[:2], [2 / 127, 0.5 / 127], rtol=1e-6)
    assert q.dtype == np.int8 and q[0, 0, 1] == -127 and q[1, 0, 0] == 127 and not q[2].any()
    assert scale[2] > 0  # an all-zero channel still gets a usable scale
    np.testing.assert_allclose(q * scale.reshape(3, 1, 1), w, atol=scale.max() / 2)
    with pytest.raises(CalibrationError, match="'conv.weight' has non-finite values"):
        quantize_weight(np.array([[np.inf, 1.0]], np.float32), axis=0, name="conv.weight")


def test_shared_thresholds_merge_overlapping_groups() -> None:
    amax = {"a": 1.0, "b": 3.0, "c": 2.0, "d": 5.0, "e": 0.5}
    merged = shared_thresholds(amax, (("a", "b"), ("b", "c"), ("d",)))
    assert merged["a"] == merged["b"] == merged["c"] == 3.0
    assert merged["d"] == 5.0 and merged["e"] == 0.5


def test_bounded_tensors_follow_relu6_through_zero_padding() -> None:
    """input ─ Conv ─ Clip(0,6) ─ Pad(0) ─ MaxPool ─ Conv ─ Relu ─ output: Clip, Pad and MaxPool outputs are
    bounded by 6; conv outputs and the unbounded Relu are not."""
    from trtopt.calib.ranges import bounded_tensors

    b = GraphBuilder("bounded", seed=5)
    x = b.input("input", [1, 8, 8, 8])
    six = b.clip(b.conv(x, 8, 8, 3), 0.0, 6.0)
    padded = b.node("Pad", [six, b.const("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))])
    pooled = b.maxpool(padded, 2, stride=2)
    out = b.relu(b.conv(pooled, 8, 8, 1), out="output")
    graph = graph_from_onnx(b.build([out]))
    assert bounded_tensors(graph) == {six, padded, pooled}


def test_a_depthwise_conv_fed_by_a_float_layer_stays_float() -> None:
    """input ─ Conv 3->16 ─ Clip ─ dw Conv 16 ─ Clip ─ Conv 1x1 ─ dw Conv 16 ─ output

    The stem reads 3 channels (float under min_channels=16), so INT8 would start at the first depthwise
    conv: with `float_leading_depthwise` it stays float. The second depthwise conv reads an INT8 layer and
    is quantised. When the stem itself is INT8 (min_channels=1), nothing changes."""
    b = GraphBuilder("leading_dw", seed=6)
    x = b.input("input", [1, 3, 16, 16])
    y = b.clip(b.conv(x, 3, 16, 3), 0.0, 6.0)
    y = b.clip(b.conv(y, 16, 16, 3, group=16), 0.0, 6.0)
    out = b.conv(b.conv(y, 16, 16, 1), 16, 16, 3, group=16, out="output")
    graph = graph_from_onnx(b.build([out]))
    stem, dw1, _, dw2 = (n.name for n in graph.nodes if n.op == "Conv")

    plan = plan_quantization(graph, QuantConfig(float_leading_depthwise=True))
    assert plan.float_layers == {stem: "fewer than 16 channels", dw1: "depthwise conv fed by a float layer"}
    assert dw2 in plan.quantized_layers
    assert dw1 in plan_quantization(graph, QuantConfig()).quantized_layers  # the TensorRT form: INT8
    everything = plan_quantization(graph, QuantConfig(min_channels=1, float_leading_depthwise=True))
    assert not everything.float_layers


def test_concat_input_from_an_int8_conv_gets_one_pair_on_the_cpu_form() -> None:
    """On the CPU form an INT8 conv's output edge into a Concat is quantised twice over (its output pair
    and the Concat's input pair); it must get one pair, with the Concat group's threshold (issue #13)::

        input ─ Conv1x1 (16) ─ Relu ─┐
              └ Conv3x3 (24) ─ Relu ─ Concat ─ Conv1x1 ─ output
    """
    b = GraphBuilder("concat_conv", seed=4)
    x = b.input("input", [1, 16, 8, 8])
    joined = b.concat([b.relu(b.conv(x, 16, 16, 1)), b.relu(b.conv(x, 16, 24, 3))])
    graph = optimize(graph_from_onnx(b.build([b.conv(joined, 40, 16, 1, out="output")]))).graph
    plan = plan_quantization(graph, cpu_config())
    edges = [(s.consumer, s.index) for s in plan.sites]
    assert len(edges) == len(set(edges)), edges
    model, _, report = quantize(graph, cpu_config())
    onnx.checker.check_model(model)  # two pairs under one name break single assignment
    assert len({report.thresholds[t] for t in plan.shared[0]}) == 1
    feeds = feeds_for(graph)
    assert cosine(run_model(onnx_from_graph(graph), feeds)["output"], run_model(model, feeds)["output"]) > 0.99


@pytest.mark.parametrize("name", ["tiny_cnn", "inception_pool_net"])
def test_qdq_graph_is_canonical_and_runs_like_graphsurgeons_order(name: str) -> None:
    """insert_qdq leaves the graph with the passes' own canonical form (linear-time cleanup and stable
    topological sort, not onnx-graphsurgeon's), and the ONNX Runtime outputs are bit for bit those of the
    same Q/DQ graph put in order by onnx-graphsurgeon."""
    graph = optimized_zoo_graph(name)
    model, _, report = quantize(graph)
    assert report.activation_pairs > 0
    ours = gs.import_onnx(model)  # the order insert_qdq left, not re-sorted on import
    assert_canonical(ours)
    theirs = ours.copy()
    theirs.nodes.reverse()
    theirs.cleanup(remove_unused_graph_inputs=False).toposort()
    feeds = feeds_for(ours)
    expected = run_model(onnx_from_graph(theirs), feeds, opt_level="disable")
    for key, value in run_model(model, feeds, opt_level="disable").items():
        np.testing.assert_array_equal(value, expected[key])


def test_a_depthwise_conv_after_a_float_stem_and_a_hard_swish_written_as_nodes_stays_float() -> None:
    """input ─ Conv 3->16 ─ x * Clip(x + 3, 0, 6) / 6 ─ dw Conv 16 ─ output

    The HardSwish is four nodes whose Mul reads both x and the gate: the walk back from the depthwise conv
    goes through it to the float stem (the form MobileNetV3 / LCNet exports take)."""
    b = GraphBuilder("leading_dw_hswish", seed=6)
    x = b.input("input", [1, 3, 16, 16])
    y = b.conv(x, 3, 16, 3)
    gate = b.clip(b.add(y, b.const("three", np.array(3.0, np.float32))), 0.0, 6.0)
    y = b.node("Div", [b.mul(y, gate), b.const("six", np.array(6.0, np.float32))])
    graph = graph_from_onnx(b.build([b.conv(y, 16, 16, 3, group=16, out="output")]))
    stem, dw = (n.name for n in graph.nodes if n.op == "Conv")
    plan = plan_quantization(graph, QuantConfig(float_leading_depthwise=True))
    assert plan.float_layers == {stem: "fewer than 16 channels", dw: "depthwise conv fed by a float layer"}


def _wide_range_head(reads_int8: bool) -> tuple[gs.Graph, dict[str, np.ndarray]]:
    """input ─ Conv1x1 16->16 ─ Relu ─ Conv1x1 16->2 (float: fewer than 16 channels) ─ output
                                     └ (reads_int8) Conv1x1 16->16 ─ output2

    A head like LORE's cell detector (docs/holdout.md): the Relu output spans four decades (channel 0 is
    1e4 times the others, and the head weighs it 1e-4 times), so one per-tensor INT8 grid rounds the
    other 15 channels, which carry the head's output, to zero."""
    b = GraphBuilder("wide_head", seed=3)
    x = b.input("input", [1, 16, 8, 8])
    y = b.relu(b.conv(x, 16, 16, 1))
    outs = [b.conv(y, 16, 2, 1, out="output")] + ([b.conv(y, 16, 16, 1, out="output2")] if reads_int8 else [])
    graph = graph_from_onnx(b.build(outs))
    first, head = [n for n in graph.nodes if n.op == "Conv"][:2]
    first.inputs[1].values[0] *= 1e4
    first.inputs[2].values[0] = abs(first.inputs[2].values[0]) * 1e4
    head.inputs[1].values[:, 0] *= 1e-4
    feeds = {"input": np.random.default_rng(0).standard_normal((1, 16, 8, 8)).astype(np.float32)}
    return graph, feeds


def test_a_layer_kept_float_reads_its_input_unrounded_on_the_cpu_form() -> None:
    """The CPU form puts a pair on the output edges of an INT8 conv (its kernel writes INT8), but not when
    every consumer is a layer kept float: there the pair would be the only rounding of that layer's input,
    which TensorRT's form does not have. A consumer that is INT8 keeps every edge's pair."""
    graph, feeds = _wide_range_head(reads_int8=False)
    first, head = (n for n in graph.nodes if n.op == "Conv")
    plan = plan_quantization(graph, cpu_config(QuantConfig()))
    assert head.name in plan.float_layers and first.name in plan.quantized_layers
    assert not [s for s in plan.sites if s.consumer == head.name]
    fp32 = onnx_from_graph(graph)
    amax = {t: float(np.abs(run_model(fp32, feeds, expose=[t])[t]).max()) for t in plan.activation_tensors}
    work = graph.copy()
    insert_qdq(work, plan, amax)
    ref, out = run_model(fp32, feeds)["output"], run_model(onnx_from_graph(work), feeds, opt_level="disable")["output"]
    assert np.median(np.abs(out - ref)) < 0.05 * np.median(np.abs(ref))  # with a pair there: 85%

    shared, _ = _wide_range_head(reads_int8=True)
    relu = next(n for n in shared.nodes if n.op == "Relu").outputs[0].name
    both = plan_quantization(shared, cpu_config(QuantConfig()))
    readers = {n.name for n in shared.nodes if n.op == "Conv" and relu in [t.name for t in n.inputs]}
    assert len(readers) == 2 and {s.consumer for s in both.sites if s.tensor == relu} == readers


def test_an_op_without_an_int8_kernel_on_the_backend_stays_float_behind_a_quantised_input() -> None:
    """input ─ Conv 16->16 ─ Relu ─ ConvTranspose 2x2/2 ─ Relu ─ Conv 16->16 ─ output

    The CPU backend's `float_ops` (ONNX Runtime has no INT8 ConvTranspose): the deconvolution stays float with
    that reason and its weight keeps no pair, while the conv before it still quantises its output (a layer kept
    float for fidelity would read it unrounded), so that conv keeps ONNX Runtime's QLinearConv. The Q/DQ model
    stays close to FP32 in ONNX Runtime."""
    b = GraphBuilder("deconv", seed=2)
    x = b.input("input", [1, 16, 8, 8])
    y = b.relu(b.conv(x, 16, 16, 3))
    up = b.node("ConvTranspose", [y, b.const("up_w", b.rng.standard_normal((16, 16, 2, 2)).astype(np.float32) * 0.2)],
                kernel_shape=[2, 2], strides=[2, 2])  # fmt: skip
    graph = graph_from_onnx(b.build([b.conv(b.relu(up), 16, 16, 1, out="output")]))
    first, deconv, last = (n for n in graph.nodes if n.op in ("Conv", "ConvTranspose"))
    config = cpu_config()
    assert "ConvTranspose" in config.float_ops
    plan = plan_quantization(graph, config)
    assert plan.float_layers == {deconv.name: "no INT8 ConvTranspose kernel on this backend"}
    assert plan.quantized_layers == (first.name, last.name)
    assert not [s for s in plan.sites if s.consumer == deconv.name and s.kind == "weight"]
    assert [s.role for s in plan.sites if s.consumer == deconv.name] == ["output"]  # the first conv's Relu output
    model, _, _ = quantize(graph, config)
    feeds = feeds_for(graph, seed=3)
    reference = run_model(onnx_from_graph(graph), feeds)["output"]
    assert cosine(reference, run_model(model, feeds, opt_level="disable")["output"]) > 0.99
