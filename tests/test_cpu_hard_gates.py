"""MobileNetV3's HardSwish, HardSigmoid gates and squeeze-excite pools on the integer grid in CPU plans
(`QuantConfig.integer_hard_swish`: pairs placed by `trtopt.quant.gates`, ops written as ONNX Runtime's QLinearAdd /
QLinearMul / QLinearGlobalAveragePool by `trtopt.backend.cpu.hard_gates`), checked against the Q/DQ reference and
FP32 in ONNX Runtime, in encodings every CPU kind runs exactly (u8u8, u8s7)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import numpy_helper
from quant_helpers import cosine, cpu_config, feeds_for, quantize

from trtopt.backend.cpu.builder import kernel_report
from trtopt.backend.cpu.hard_gates import write_hard_gates
from trtopt.backend.cpu.lowering import lower_for_cpu
from trtopt.execution import run_model
from trtopt.frontend import copy_graph, graph_from_onnx, onnx_from_graph
from trtopt.passes import optimize
from trtopt.quant import QuantConfig, plan_quantization
from trtopt.quant.equalize import GATED_SPREAD, equalize_activations, find_sites
from trtopt.quant.gates import channel_offset
from trtopt.zoo import GraphBuilder

FLOAT_OPS = {"HardSigmoid", "HardSwish", "Mul", "Add", "ReduceMean", "GlobalAveragePool"}


def _mobilenetv3_block(opset: int = 17, pool: str = "GlobalAveragePool") -> gs.Graph:
    """A MobileNetV3 block: HardSwish after the expand and the depthwise conv, a squeeze-excite gate (HardSigmoid)
    and its pool (`pool`: GlobalAveragePool, or ReduceMean over H and W as PyTorch's dynamo exporter writes it).
    Below opset 14 HardSwish is x * HardSigmoid(x)::

        input ─ Conv1x1 ─ HardSwish ─ dw Conv3x3 ─ HardSwish ─ x ─┬────────────────────────────── Mul ─ Conv1x1 ─ output
                                                                   └─ pool ─ Conv1x1 ─ Relu ─ Conv1x1 ─ HardSigmoid ─┘
    """
    b = GraphBuilder("mobilenetv3_block", seed=0, opset=opset)
    y = b.hard_swish(b.conv(b.input("input", [2, 16, 10, 10]), 16, 32, 1))
    x = b.hard_swish(b.conv(y, 32, 32, 3, group=32))
    if pool == "ReduceMean":
        s = b.node("ReduceMean", [x, b.const("axes", np.array([2, 3], np.int64))], keepdims=1)
    else:
        s = b.node(pool, [x])
    s = b.conv(b.relu(b.conv(s, 32, 16, 1)), 16, 32, 1)
    gate = b.node("HardSigmoid", [s], alpha=1 / 6, beta=0.5)
    model = b.build([b.conv(b.mul(x, gate), 32, 24, 1, out="output")])
    return optimize(graph_from_onnx(model)).graph


def _gate_ops(graph: gs.Graph, config: QuantConfig) -> set[str]:
    """The op types that read or write a pair `trtopt.quant.gates` placed."""
    plan = plan_quantization(graph, config)
    nodes = {n.name: n for n in graph.nodes}
    producers = {t.name: t.inputs[0].op for t in graph.tensors().values() if t.inputs}
    gated = [s for s in plan.sites if s.role == "gate"]
    return {nodes[s.consumer].op for s in gated} | {producers[s.tensor] for s in gated if s.tensor in producers}


def test_hard_swish_and_its_squeeze_excite_gate_are_placed_on_the_grid_only_with_the_flag() -> None:
    graph = _mobilenetv3_block()
    assert {n.op for n in graph.nodes} >= {"HardSwish", "HardSigmoid", "GlobalAveragePool"}
    assert _gate_ops(graph, cpu_config(QuantConfig())) == {"HardSwish", "HardSigmoid", "GlobalAveragePool", "Mul"}
    off = replace(cpu_config(QuantConfig()), integer_hard_swish=False)
    assert _gate_ops(graph, off) == set()


@pytest.mark.parametrize("encoding", ["u8u8", "u8s7"])
@pytest.mark.parametrize(("opset", "pool"), [(17, "GlobalAveragePool"), (18, "ReduceMean"), (13, "GlobalAveragePool")])
def test_the_block_runs_as_integer_kernels_and_keeps_the_numbers(encoding: str, opset: int, pool: str) -> None:
    """HardSwish (one op, or x * HardSigmoid(x) at opset 13) and the gate become QLinearAdd + QLinearMul in ONNX
    Runtime's optimised graph, the pool QLinearGlobalAveragePool; nothing of the block runs in float."""
    graph = _mobilenetv3_block(opset, pool)
    model, _, _ = quantize(graph, cpu_config(QuantConfig()))
    lowered = lower_for_cpu(model, encoding=encoding, hard_gates=True)
    ops = kernel_report(lowered.SerializeToString()).ops
    assert ops.get("QLinearAdd") == 3 and ops.get("QLinearMul") == 3, ops  # two HardSwish, one gate
    assert ops.get("QLinearGlobalAveragePool") == 1 and ops.get("QLinearConv") == 4, ops  # the last writes float
    assert not FLOAT_OPS & set(ops), ops
    assert ops.get("QuantizeLinear") == 1 and ops.get("DequantizeLinear") == 3, ops  # input; last conv's x, w, b
    before = lower_for_cpu(model, encoding=encoding)  # the same grids, the ops in float between them
    assert "HardSigmoid" in kernel_report(before.SerializeToString()).ops
    feeds = feeds_for(graph, seed=3)
    reference = run_model(onnx_from_graph(graph), feeds)["output"]
    integer, floating = run_model(lowered, feeds)["output"], run_model(before, feeds)["output"]
    assert cosine(integer, floating) > 0.999  # the gate rounded on [0, 1] in 255 steps: within a step or two
    assert cosine(reference, integer) > 0.995


def _pair_around(op: str, scale: float, zero: int, out_scale: float, out_zero: int, **attrs: float) -> onnx.ModelProto:
    """input ─ Q(scale, zero) ─ DQ ─ op ─ Q(out_scale, out_zero) ─ DQ ─ output, uint8 throughout."""
    b = GraphBuilder("pair_around", seed=0)
    grid = [b.const("scale", np.array(scale, np.float32)), b.const("zero", np.array(zero, np.uint8))]
    out_grid = [b.const("scale", np.array(out_scale, np.float32)), b.const("zero", np.array(out_zero, np.uint8))]
    x = b.node("DequantizeLinear", [b.node("QuantizeLinear", [b.input("input", [1, 256]), *grid]), *grid])
    y = b.node("QuantizeLinear", [b.node(op, [x], **attrs), *out_grid])
    model = b.build([b.node("DequantizeLinear", [y, *out_grid], out="output")])
    for tensor in model.graph.initializer:  # scalars, as the lowering writes them
        tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).reshape(()), tensor.name))
    return model


@pytest.mark.parametrize(("op", "attrs", "out_scale", "out_zero"), [
    ("HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}, 1 / 255, 0),
    ("HardSigmoid", {"alpha": 0.2, "beta": 0.5}, 0.8 / 255, 0),  # a calibrated top below 1: the grid's clip
    ("HardSigmoid", {"alpha": 0.25, "beta": -0.25}, 1 / 255, 0),
    ("HardSwish", {}, 7.5 / 255, 17),
])  # fmt: skip
def test_the_integer_form_is_the_op_rounded_once(op: str, attrs: dict[str, float], out_scale: float,
                                                 out_zero: int) -> None:  # fmt: skip
    """Every value of the input grid: the integer form (as ONNX Runtime fuses it) against the float op and its
    QuantizeLinear. HardSigmoid: the same rounding, off by at most one step where the two round a tie apart;
    HardSwish adds the gate's rounding on [0, 1] in 255 steps: at most |x| / 510 more."""
    model = _pair_around(op, 0.05, 123, out_scale, out_zero, **attrs)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert write_hard_gates(rewritten.graph) == 1
    assert {n.op_type for n in rewritten.graph.node}.isdisjoint({"HardSigmoid", "HardSwish"})
    feeds = {"input": (0.05 * (np.arange(256, dtype=np.float32) - 123)).reshape(1, 256)}
    reference = run_model(model, feeds, opt_level="disable")["output"]
    fused = run_model(rewritten, feeds)["output"]
    assert {n.op_type for n in onnx.load_model_from_string(_optimized(rewritten)).graph.node} >= (
        {"QLinearAdd"} if op == "HardSigmoid" else {"QLinearAdd", "QLinearMul"})
    x = feeds["input"]
    allowed = out_scale * (1.001 if op == "HardSigmoid" else 1.001 + np.abs(x) / 510 / out_scale)
    assert (np.abs(fused - reference) <= allowed).all()
    assert np.mean(fused == reference) > 0.9


def _optimized(model: onnx.ModelProto) -> bytes:
    import tempfile
    from pathlib import Path

    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(Path(tmp, "optimized.onnx"))
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return Path(tmp, "optimized.onnx").read_bytes()


@pytest.mark.parametrize(("scale", "zero"), [(1.5 / 255, 0), (1 / 255, 5)])
def test_a_hard_sigmoid_whose_grid_does_not_clip_at_zero_and_one_stays_float(scale: float, zero: int) -> None:
    """A top above 1 or a zero point above 0 (another tool's cache): the QuantizeLinear's saturation is not the clip."""
    model = _pair_around("HardSigmoid", 0.05, 123, scale, zero, alpha=1 / 6, beta=0.5)
    assert write_hard_gates(model.graph) == 0
    assert "HardSigmoid" in {n.op_type for n in model.graph.node}


def _equalized_site(opset: int, spread: float = 30.0, affine: bool = False, equalize: bool = True) -> gs.Graph:
    """input ─ Conv1x1 ─ HardSwish ─ depthwise Conv3x3 ─ output (x * HardSigmoid(x) at opset 13), the HardSwish input's
    channels `spread` apart (undone by the depthwise weights), then equalised as a build does: the gate reads the
    rescaled x through a per-channel Mul. `affine`: PP-LCNetV3's learnable affine block (y * a + b, scalars) after the
    HardSwish, whose offset equalisation makes one per channel. `equalize=False`: the graph before it."""
    b = GraphBuilder("gated_site", seed=0, opset=opset)
    y = b.hard_swish(b.conv(b.input("input", [2, 16, 8, 8]), 16, 32, 1))
    if affine:
        y = b.add(b.mul(y, b.const("a", np.array([0.8], np.float32))), b.const("b", np.array([0.3], np.float32)))
    y = b.conv(y, 32, 32, 3, group=32, out="output")
    graph = optimize(graph_from_onnx(b.build([y]))).graph
    producer, depthwise = [n for n in graph.nodes if n.op == "Conv"]
    factors = np.geomspace(1.0 / spread, 1.0, 32).astype(np.float32)
    producer.inputs[1].values = producer.inputs[1].values * factors[:, None, None, None] * 4
    producer.inputs[2].values = producer.inputs[2].values * factors * 4
    depthwise.inputs[1].values = depthwise.inputs[1].values / factors[:, None, None, None]
    if not equalize:
        return graph
    assert len(find_sites(graph, integer_gates=True)) == 1  # HardSwish sites stay in CPU plans' equalisation
    report = equalize_activations(graph, [feeds_for(graph, seed=s) for s in range(4)], integer_gates=True)
    assert report.gains and graph.tensors()["output"].outputs == []
    return graph


def test_a_hard_swish_site_of_like_channel_ranges_keeps_the_faster_gate() -> None:
    """Where the channels' ranges lie within `GATED_SPREAD` of each other, rescaling buys a CPU plan less than its
    depthwise gate costs (the corpus's MobileNetV3s on photos, spread 1.6-2.8: nothing gained, 7-16% slower):
    integer-gate builds leave such a site as it is, other builds rescale it."""
    graph = _equalized_site(17, spread=1.0, equalize=False)
    batches = [feeds_for(graph, seed=s) for s in range(4)]
    other = equalize_activations(copy_graph(graph), batches)
    assert len(other.gains) == 1 and next(iter(other.spread.values()))[0] < GATED_SPREAD
    assert not equalize_activations(graph, batches, integer_gates=True).gains


@pytest.mark.parametrize(("opset", "affine"), [(13, False), (17, False), (17, True)])
def test_an_equalised_hard_swish_runs_its_rescaled_gate_as_an_integer_depthwise_conv(opset: int, affine: bool) -> None:
    """The gate reads the original x: HardSigmoid(x' * c), c one per channel. The pair goes before the Mul, and the
    lowering writes Mul and HardSigmoid as one depthwise 1x1 QLinearConv (weights alpha * c, bias beta) whose output
    grid's saturation is the clip; an affine block after it (Mul by a, Add of b per channel) is one more: nothing of
    the site runs in float, and it computes what the Q/DQ reference does."""
    graph = _equalized_site(opset, affine=affine)
    fp32 = onnx_from_graph(graph)
    model, _, _ = quantize(graph, cpu_config(QuantConfig()))
    assert "HardSigmoid" in {n.op for n in graph_from_onnx(model).nodes}
    lowered = lower_for_cpu(model, encoding="u8s7", hard_gates=True)
    ops = kernel_report(lowered.SerializeToString()).ops
    assert ops.get("QLinearConv") == 2 + affine and ops.get("QLinearMul") == 1, ops  # the producer, gate, affine
    assert ops.get("Conv") == 1 and ops.get("DequantizeLinear") == 3, ops  # the depthwise conv writes float output
    assert not FLOAT_OPS & set(ops), ops
    feeds = feeds_for(graph, seed=7)
    reference = run_model(lower_for_cpu(model, encoding="u8s7"), feeds, opt_level="disable")["output"]
    integer, want = run_model(lowered, feeds)["output"], run_model(fp32, feeds)["output"]
    assert cosine(integer, reference) > 0.999
    assert cosine(integer, want) > 0.99


@pytest.mark.parametrize(("op", "scale", "offset"), [
    ("Add", np.array([0.8], np.float32), np.array([0.5, -1.0, 0.0, 2.0], np.float32).reshape(1, 4, 1, 1)),
    ("Sub", np.array([-1.0, 0.5, 2.0, 0.01], np.float32).reshape(1, 4, 1, 1), np.array([0.25], np.float32)),
    ("Add", None, np.array([0.3], np.float32)),
])  # fmt: skip
def test_an_affine_map_between_pairs_is_the_map_rounded_once(op: str, scale: np.ndarray | None,
                                                             offset: np.ndarray) -> None:  # fmt: skip
    """x * a + b (or x - b), a and b one per channel or one for all, between pairs
    (`trtopt.quant.gates.channel_offset`): one depthwise 1x1 QLinearConv (or a QLinearAdd for scalars), every value
    of the input grid within a step of the float map and its QuantizeLinear."""
    b = GraphBuilder("affine", seed=0)
    grid = [b.const("scale", np.array(0.05, np.float32)), b.const("zero", np.array(123, np.uint8))]
    out_grid = [b.const("scale", np.array(0.06, np.float32)), b.const("zero", np.array(140, np.uint8))]
    x = b.node("DequantizeLinear", [b.node("QuantizeLinear", [b.input("input", [1, 4, 16, 16]), *grid]), *grid])
    y = b.node(op, [b.mul(x, b.const("a", scale)) if scale is not None else x, b.const("b", offset)])
    model = b.build([b.node("DequantizeLinear", [b.node("QuantizeLinear", [y, *out_grid]), *out_grid],
                            out="output")])  # fmt: skip
    for tensor in model.graph.initializer:
        if "scale" in tensor.name or "zero" in tensor.name:  # scalars, as the lowering writes them
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).reshape(()), tensor.name))
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert write_hard_gates(rewritten.graph) == 1
    assert {n.op_type for n in rewritten.graph.node}.isdisjoint({"Mul", "Sub"})
    fused = {n.op_type for n in onnx.load_model_from_string(_optimized(rewritten)).graph.node}
    assert fused & {"QLinearConv", "QLinearAdd"} and not fused & {"Add", "Mul", "Sub"}, fused
    values = 0.05 * (np.arange(256, dtype=np.float32) - 123)
    feeds = {"input": np.broadcast_to(values.reshape(1, 1, 16, 16), (1, 4, 16, 16)).copy()}
    reference = run_model(model, feeds, opt_level="disable")["output"]
    assert (np.abs(run_model(rewritten, feeds)["output"] - reference) <= 0.06 * 1.001).all()


def test_the_per_channel_gate_is_the_op_rounded_once() -> None:
    """Every value of the input grid, each channel its own scale c: the depthwise form (as ONNX Runtime runs it)
    against DQ ─ Mul(c) ─ HardSigmoid ─ Q in float: off by at most one step where the two round a tie apart (the
    bias lies on the int32 grid ONNX Runtime requires, within 1/254 of an input step)."""
    c = np.array([1.0, 0.5, 0.1, 1 / 128], np.float32).reshape(1, 4, 1, 1)
    b = GraphBuilder("scaled_gate", seed=0)
    grid = [b.const("scale", np.array(0.05, np.float32)), b.const("zero", np.array(123, np.uint8))]
    out_grid = [b.const("scale", np.array(1 / 255, np.float32)), b.const("zero", np.array(0, np.uint8))]
    x = b.node("DequantizeLinear", [b.node("QuantizeLinear", [b.input("input", [1, 4, 16, 16]), *grid]), *grid])
    gate = b.node("HardSigmoid", [b.mul(x, b.const("c", c))], alpha=1 / 6, beta=0.5)
    model = b.build([b.node("DequantizeLinear", [b.node("QuantizeLinear", [gate, *out_grid]), *out_grid],
                            out="output")])  # fmt: skip
    for tensor in model.graph.initializer:
        if numpy_helper.to_array(tensor).size == 1:  # scalars, as the lowering writes them
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).reshape(()), tensor.name))
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert write_hard_gates(rewritten.graph) == 1
    assert {n.op_type for n in rewritten.graph.node}.isdisjoint({"HardSigmoid", "Mul"})
    assert "QLinearConv" in {n.op_type for n in onnx.load_model_from_string(_optimized(rewritten)).graph.node}
    values = 0.05 * (np.arange(256, dtype=np.float32) - 123)
    feeds = {"input": np.broadcast_to(values.reshape(1, 1, 16, 16), (1, 4, 16, 16)).copy()}
    reference = run_model(model, feeds, opt_level="disable")["output"]
    fused = run_model(rewritten, feeds)["output"]
    assert (np.abs(fused - reference) <= 1.001 / 255).all()
    assert np.mean(fused == reference) > 0.95


@pytest.mark.parametrize(("axes", "keepdims", "pooled"), [([2, 3], 1, True), ([-1, -2], 1, True), ([1], 1, False),
                                                          ([2, 3], 0, False)])  # fmt: skip
def test_only_a_mean_over_every_spatial_axis_keeping_them_becomes_a_global_pool(axes: list[int], keepdims: int,
                                                                                 pooled: bool) -> None:  # fmt: skip
    """input ─ Q ─ DQ ─ ReduceMean ─ Q ─ DQ ─ output: GlobalAveragePool computes the same only over H and W, kept."""
    b = GraphBuilder("reduce_mean", seed=0, opset=18)
    grid = [b.const("scale", np.array(0.05, np.float32)), b.const("zero", np.array(128, np.uint8))]
    x = b.node("DequantizeLinear", [b.node("QuantizeLinear", [b.input("input", [2, 8, 5, 5]), *grid]), *grid])
    y = b.node("ReduceMean", [x, b.const("axes", np.array(axes, np.int64))], keepdims=keepdims)
    model = b.build([b.node("DequantizeLinear", [b.node("QuantizeLinear", [y, *grid]), *grid], out="output")])
    for tensor in model.graph.initializer:
        if tensor.data_type != onnx.TensorProto.INT64:
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).reshape(()), tensor.name))
    model = onnx.shape_inference.infer_shapes(model)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert write_hard_gates(rewritten.graph) == int(pooled)
    if pooled:
        feeds = feeds_for(graph_from_onnx(model), seed=2)
        assert np.array_equal(run_model(model, feeds)["output"], run_model(rewritten, feeds)["output"])


@pytest.mark.parametrize(("shape", "constant", "taken"), [
    ([2, 8, 4, 4], [1, 8, 1, 1], True), ([2, 8, 4, 4], [1], True), ([2, 8, 4, 4], [], True),
    ([2, 8], [1, 8], False),  # a Gemm's output: no depthwise conv reads it
    ([2, 8, 4, 4], [1, 1, 1, 1, 1], False),  # broadcasting would add an axis
    ([2, 8, 4, 4], [1, 8, 4, 4], False),  # one value per element, not per channel
])  # fmt: skip
def test_an_affine_map_is_taken_only_per_channel_or_for_all(shape: list[int], constant: list[int],
                                                            taken: bool) -> None:  # fmt: skip
    """`channel_offset` reads x + b only where the CPU lowering's depthwise 1x1 conv (or QLinearAdd) computes it."""
    x = gs.Variable("x", np.float32, shape)
    node = gs.Node("Add", inputs=[x, gs.Constant("b", np.full(constant, 0.5, np.float32))],
                   outputs=[gs.Variable("y", np.float32, shape)])  # fmt: skip
    assert (channel_offset(node) is node) == taken
