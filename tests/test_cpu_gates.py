"""Element-wise gates on the integer grid in CPU plans (`QuantConfig.integer_gates`, `trtopt.quant.gates`): SiLU
and squeeze-excite blocks as ONNX Runtime's QLinearSigmoid / QLinearMul / QLinearGlobalAveragePool, checked
against the Q/DQ reference and FP32 in ONNX Runtime, in every encoding a CPU kind may run."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from onnx import helper
from quant_helpers import assert_plan_computes, cosine, cpu_config, feeds_for, quantize

from trtopt.backend.cpu.backend import CpuBackend
from trtopt.backend.cpu.builder import kernel_report
from trtopt.backend.cpu.lowering import lower_for_cpu
from trtopt.backend.cpu.movement import move_quantisation
from trtopt.execution import run_model
from trtopt.frontend import graph_from_onnx, onnx_from_graph
from trtopt.passes import optimize
from trtopt.quant import QuantConfig, QuantPlan, plan_quantization
from trtopt.quant.concat_ranges import UNLIKE_RATIO, float_unlike_concats
from trtopt.quant.gates import is_small
from trtopt.zoo import GraphBuilder


def _se_block(squeeze: int = 16, hard: bool = False) -> gs.Graph:
    """An EfficientNet block (``hard``: MobileNetV3's, HardSwish and a HardSigmoid gate)::

        input ─ Conv3x3 ─ SiLU ─ x ─┬───────────────────────────────────────────────── Mul ─ Conv1x1 ─ output
                                    └─ GAP ─ Conv1x1 (32->squeeze) ─ SiLU ─ Conv1x1 ─ Sigmoid ─┘
    """
    b = GraphBuilder("se_block", seed=0)
    act = b.hard_swish if hard else b.silu
    x = act(b.conv(b.input("input", [1, 16, 12, 12]), 16, 32, 3))
    s = b.node("GlobalAveragePool", [x])
    s = b.conv(act(b.conv(s, 32, squeeze, 1)), squeeze, 32, 1)
    gate = b.node("HardSigmoid", [s], alpha=1 / 6, beta=0.5) if hard else b.node("Sigmoid", [s])
    model = b.build([b.conv(b.mul(x, gate), 32, 32, 1, out="output")])
    return optimize(graph_from_onnx(model)).graph


def _on_grid(graph: gs.Graph, plan: QuantPlan, op: str) -> list[bool]:
    """Per `op` node: whether it reads every input and its output is read everywhere through pairs."""
    edges = {(s.tensor, s.consumer) for s in plan.sites if s.kind == "activation"}
    return [all((t.name, n.name) in edges for t in n.inputs)
            and all((n.outputs[0].name, r.name) in edges for r in n.outputs[0].outputs)
            for n in graph.nodes if n.op == op]  # fmt: skip


def test_silu_and_the_squeeze_excite_gate_are_placed_on_the_grid() -> None:
    graph = _se_block()
    plan = plan_quantization(graph, cpu_config(QuantConfig()))
    for op, count in (("Sigmoid", 3), ("Mul", 3), ("GlobalAveragePool", 1)):
        assert _on_grid(graph, plan, op) == [True] * count, op
    (gap,) = [n for n in graph.nodes if n.op == "GlobalAveragePool"]
    assert is_small(gap.outputs[0]) and not is_small(gap.inputs[0])
    off = plan_quantization(graph, replace(cpu_config(QuantConfig()), integer_gates=False))
    assert not [s for s in off.sites if s.role == "gate"]


def test_a_gate_whose_readers_stay_float_stays_float() -> None:
    """Without `integer_hard_swish` MobileNetV3's HardSwish runs in float: the Mul by its gate reads a float tensor as
    large as the image, and quantising it for the Mul would cost more than the float Mul (with it:
    tests/test_cpu_hard_gates.py)."""
    graph = _se_block(hard=True)
    plan = plan_quantization(graph, replace(cpu_config(QuantConfig()), integer_hard_swish=False))
    assert not [s for s in plan.sites if s.role == "gate"]
    assert _on_grid(graph, plan, "Mul") == [False]  # the gate Mul; HardSwish is one op (opset 14)


@pytest.mark.parametrize("encoding", ["u8u8", "u8s7"])
def test_integer_gates_run_as_integer_kernels_and_keep_the_numbers(encoding: str) -> None:
    """u8u8 is exact on every CPU kind, u8s7's 7-bit weights too (`trtopt.backend.cpu.isa`)."""
    graph = _se_block()
    model, _, _ = quantize(graph, cpu_config(QuantConfig()))
    lowered = lower_for_cpu(model, encoding=encoding)
    ops = kernel_report(lowered.SerializeToString()).ops
    assert ops.get("QLinearSigmoid") == 3 and ops.get("QLinearMul") == 3, ops
    assert ops.get("QLinearGlobalAveragePool") == 1 and ops.get("QLinearConv") == 3, ops  # the last writes float
    assert not {"Sigmoid", "Mul", "QuickGelu", "GlobalAveragePool"} & set(ops), ops
    assert_plan_computes(graph, model, lowered, "output")


def test_tiny_squeeze_convs_stay_float_and_the_gate_still_runs_on_the_grid() -> None:
    """Under `min_channels` the squeeze-excite convs stay float; their vectors cost nothing to quantise, so the
    pool and the gate's Mul on the large tensor still run integer."""
    graph = _se_block(squeeze=8)
    plan = plan_quantization(graph, cpu_config(QuantConfig()))
    assert len(plan.float_layers) == 2
    model, _, _ = quantize(graph, cpu_config(QuantConfig()))
    lowered = lower_for_cpu(model, encoding="u8u8")
    ops = kernel_report(lowered.SerializeToString()).ops
    assert ops.get("QLinearGlobalAveragePool") == 1 and ops.get("QLinearMul", 0) >= 2, ops
    feeds = feeds_for(graph, seed=5)
    reference = run_model(onnx_from_graph(graph), feeds)["output"]
    assert cosine(reference, run_model(lowered, feeds)["output"]) > 0.99


def test_what_the_user_keeps_float_stays_float_and_reads_its_input_unrounded() -> None:
    """--exclude (and the sensitivity search, which excludes the same way) keeps a layer float to read its input
    as FP32 computes it: the gate Mul before it stays float; an excluded op type is never put on the grid."""
    graph = _se_block()
    (last,) = [n for n in graph.nodes if n.outputs[0].name == "output"]
    plan = plan_quantization(graph, cpu_config(QuantConfig(exclude=(last.name,))))
    assert _on_grid(graph, plan, "Mul")[-1] is False
    plan = plan_quantization(graph, cpu_config(QuantConfig(exclude=("Sigmoid",))))
    assert _on_grid(graph, plan, "Sigmoid") == [False] * 3


def test_plans_with_integer_gates_leave_silu_out_of_equalisation() -> None:
    """Gated equalisation feeds the gate x * (1 / s) through a float per-channel Mul; on SiLU, which such a plan
    runs on integer kernels, that Mul would cut them apart. HardSwish (float on the CPU either way) keeps it::

        input ─ Conv1x1 ─ SiLU ─ depthwise Conv3x3 ─ Conv1x1 ─ HardSwish ─ depthwise Conv3x3 ─ output
    """
    from trtopt.quant.equalize import find_sites

    b = GraphBuilder("gated_sites", seed=0)
    y = b.conv(b.silu(b.conv(b.input("input", [1, 16, 8, 8]), 16, 32, 1)), 32, 32, 3, group=32)
    y = b.conv(b.hard_swish(b.conv(y, 32, 32, 1)), 32, 32, 3, group=32, out="output")
    graph = optimize(graph_from_onnx(b.build([y]))).graph
    heads = {s.gate_head.op for s in find_sites(graph) if s.gate_head is not None}
    assert heads == {"Sigmoid", "HardSwish"}
    kept = {s.gate_head.op for s in find_sites(graph, integer_gates=True) if s.gate_head is not None}
    assert kept == {"HardSwish"}


def _channel_shuffle(*, gather: bool = False) -> gs.Graph:
    """A ShuffleNetV2 unit and the conv after it (`gather`: with the CPU backend's passes, the shuffle one Gather)::

        input ─ Conv1x1 ─ Relu ─┬─ Conv1x1 ─ SiLU ─┬ Concat ─ Reshape [N,2,16,H,W] ─ Transpose ─ Reshape ─ Split ─┬ Conv
                                └─ Conv1x1 ─ Relu ─┘                                                           └ Conv
    """
    b = GraphBuilder("shuffle", seed=3)
    x = b.relu(b.conv(b.input("input", [1, 16, 8, 8]), 16, 16, 1))
    joined = b.concat([b.silu(b.conv(x, 16, 16, 1)), b.relu(b.conv(x, 16, 16, 1))])
    y = b.node("Reshape", [joined, b.const("grouped", np.array([1, 2, 16, 8, 8], np.int64))])
    y = b.node("Reshape", [b.node("Transpose", [y], perm=[0, 2, 1, 3, 4]), b.const("flat", np.array([1, 32, 8, 8]))])
    b.nodes.append(helper.make_node("Split", [y, b.const("halves", np.array([16, 16], np.int64))], ["h0", "h1"], axis=1,
                                    name="split"))  # fmt: skip
    model = b.build([b.conv("h0", 16, 16, 1, out="a"), b.conv("h1", 16, 16, 1, out="b")])
    return optimize(graph_from_onnx(model), CpuBackend().passes(None) if gather else None).graph


def test_a_channel_shuffle_between_int8_layers_moves_integers() -> None:
    """The Concat, both Reshapes, the Transpose and the Split read and write pairs of one grid (exact: they only move
    values), so ONNX Runtime runs the stretch on uint8 (QLinearConcat, and its QDQ rules drop the pairs around the
    others) where it ran in float between DequantizeLinear and QuantizeLinear."""
    graph = _channel_shuffle()
    plan = plan_quantization(graph, cpu_config(QuantConfig()))
    edges = {(s.tensor, s.consumer) for s in plan.sites if s.kind == "activation"}
    moved = [n for n in graph.nodes if n.op in ("Concat", "Reshape", "Transpose", "Split")]
    assert len(moved) == 5 and all((t.name, n.name) in edges for n in moved for t in n.inputs[:1])
    assert all((t.name, r.name) in edges for n in moved for t in n.outputs for r in t.outputs)
    model, _, _ = quantize(graph, cpu_config(QuantConfig()))
    lowered = lower_for_cpu(model, encoding="u8u8")
    ops = kernel_report(lowered.SerializeToString()).ops
    assert ops.get("QLinearConcat") == 1 and "Concat" not in ops, ops
    assert ops.get("QuantizeLinear") == 1, ops  # the image; the two output convs dequantise their weights
    for output in ("a", "b"):
        assert_plan_computes(graph, model, lowered, output)
    off = plan_quantization(graph, replace(cpu_config(QuantConfig()), integer_gates=False))
    assert not [s for s in off.sites if s.consumer == "split"]


def test_a_channel_shuffle_written_as_a_gather_moves_integers_too() -> None:
    """The CPU backend's `channel_shuffle` writes Reshape, Transpose, Reshape as one Gather: it joins the stretch."""
    graph = _channel_shuffle(gather=True)
    moved = [n for n in graph.nodes if n.op in ("Concat", "Gather", "Split")]
    assert [n.op for n in moved] == ["Concat", "Gather", "Split"] and "Transpose" not in [n.op for n in graph.nodes]
    plan = plan_quantization(graph, cpu_config(QuantConfig()))
    edges = {(s.tensor, s.consumer) for s in plan.sites if s.kind == "activation"}
    assert all((t.name, r.name) in edges for n in moved for t in n.outputs for r in t.outputs)
    model, _, _ = quantize(graph, cpu_config(QuantConfig()))
    lowered = lower_for_cpu(model, encoding="u8u8")
    ops = kernel_report(lowered.SerializeToString()).ops
    assert ops.get("QLinearConcat") == 1 and "Concat" not in ops and ops.get("QuantizeLinear") == 1, ops
    for output in ("a", "b"):
        assert_plan_computes(graph, model, lowered, output)


def test_a_channel_shuffle_that_feeds_a_graph_output_stays_float() -> None:
    """The stretch moves integers only where every reader reads a pair: one half a graph output keeps the Split,
    and so the ops before it, in float."""
    graph = _channel_shuffle()
    (split,) = [n for n in graph.nodes if n.op == "Split"]
    graph.outputs.append(split.outputs[0])
    plan = plan_quantization(graph, cpu_config(QuantConfig()))
    assert not [s for s in plan.sites if s.consumer == split.name or s.role == "concat"]


def test_a_shuffled_concat_of_unlike_ranges_stays_on_the_grid() -> None:
    """`concat_ranges` keeps a Concat of unlike ranges float, except where its output is only moved and quantised
    again (the Split's pairs round the joined tensor onto one grid either way): there it stays integer."""
    graph = _channel_shuffle()
    plan = plan_quantization(graph, cpu_config(QuantConfig()))
    (concat,) = [n for n in graph.nodes if n.op == "Concat"]
    group = next(g for g in plan.shared if g[0] == concat.outputs[0].name)
    ranges = {group[0]: 300.0, group[1]: 300.0, group[2]: 300.0 / (UNLIKE_RATIO * 4)}
    assert float_unlike_concats(graph, plan, ranges) is plan
    (reshape,) = [r for r in concat.outputs[0].outputs]
    reshape.op = "Relu"  # a reader that computes: the Concat goes float as before
    assert concat.name in float_unlike_concats(graph, plan, ranges).float_layers


def _blaze_blocks() -> gs.Graph:
    """Two of BlazeFace's widening blocks: each skip branch pads the channels with zeros before the residual Add::

        input ─ Conv ─ Relu ─┬─ DWConv3x3 ─ Conv1x1 (16 -> 24) ─ Add ─ Relu ─┬─ DWConv3x3 ─ Conv1x1 (24 -> 32) ─ Add
                             └─ Pad (8 zero channels) ───────────┘            └─ Pad (8 zero channels) ───────────┘
        ... ─ Relu ─ Conv ─ output
    """
    b = GraphBuilder("blaze", seed=5)
    x = b.relu(b.conv(b.input("input", [1, 3, 8, 8]), 3, 16, 3, pads=[1, 1, 1, 1]))
    for width in (16, 24):
        y = b.conv(b.conv(x, width, width, 3, pads=[1, 1, 1, 1], group=width), width, width + 8, 1)
        skip = b.node("Pad", [x, b.const("pads", np.array([0, 0, 0, 0, 0, 8, 0, 0], np.int64))])
        x = b.relu(b.add(y, skip))
    return optimize(graph_from_onnx(b.build([b.conv(x, 32, 32, 1, out="output")])), CpuBackend().passes(None)).graph


def test_a_zero_pad_on_the_skip_branch_keeps_the_residual_add_integer() -> None:
    """The Pad is read through the residual Add's pair: it joins the grid (its input's, zeros as the zero point),
    so each Add is a QLinearAdd with its Relu folded (the Relu's every reader reads a pair), and the Pad moves uint8
    on its input's grid (the Relu's, zero point 0: no requantisation before the Add)."""
    graph = _blaze_blocks()
    model, _, _ = quantize(graph, cpu_config(QuantConfig(min_channels=1)))
    lowered = lower_for_cpu(model, encoding="u8u8")
    move_quantisation(lowered)
    made_by = {out: n.op_type for n in lowered.graph.node for out in n.output}
    pads = [n for n in lowered.graph.node if n.op_type == "Pad"]
    assert len(pads) == 2 and all(made_by.get(p.input[0]) != "DequantizeLinear" for p in pads)  # they read uint8
    ops = kernel_report(lowered.SerializeToString()).ops
    assert ops.get("QLinearAdd") == 2 and "Add" not in ops and "Relu" not in ops, ops
    assert ops.get("QuantizeLinear") == 1, ops  # the image's
    assert_plan_computes(graph, model, lowered, "output")
