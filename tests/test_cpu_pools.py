"""Pooling on the integer grid in CPU plans (`QuantConfig.integer_pools`, `trtopt.quant.pools`), checked against
the Q/DQ reference and FP32 in ONNX Runtime."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from quant_helpers import assert_plan_computes, cpu_config, feeds_for, quantize

from trtopt.backend.cpu.builder import exact_encoding, kernel_report
from trtopt.backend.cpu.lowering import lower_for_cpu
from trtopt.execution import run_model
from trtopt.frontend import graph_from_onnx
from trtopt.passes import optimize
from trtopt.quant import QuantConfig, plan_quantization
from trtopt.zoo import GraphBuilder


def _resnet_like() -> gs.Graph:
    """input (3ch) ─ Conv3x3/2 ─ BN ─ Relu ─ MaxPool3x3/2 ─ x ─ [Conv ─ Relu ─ Conv] + x ─ Relu ─ GAP ─ Flatten ─ Gemm:
    a ResNet's thin stem, one residual block and its tail."""
    b = GraphBuilder("resnet_like", seed=0)
    x = b.maxpool(b.conv_bn(b.input("input", [1, 3, 32, 32]), 3, 16, 3, stride=2), 3, stride=2, pad=1)
    y = b.conv_bn(b.conv_bn(x, 16, 16, 3), 16, 16, 3, act=None)
    model = b.build([b.gemm(b.pool_flatten(b.relu(b.add(y, x))), 16, 16, out="logits")])
    return optimize(graph_from_onnx(model)).graph


def _ops(graph: gs.Graph, op: str) -> list[gs.Node]:
    return [n for n in graph.nodes if n.op == op]


def test_the_stem_pool_and_tail_are_placed_for_integer_kernels() -> None:
    graph = _resnet_like()
    plan = plan_quantization(graph, cpu_config(QuantConfig()))
    (stem,) = [n for n in graph.nodes if n.op == "Conv" and n.inputs[0].name == "input"]
    assert stem.name in plan.quantized_layers  # 3 input channels, under min_channels, but it feeds a MaxPool
    (pool,) = _ops(graph, "MaxPool")
    assert any({pool.inputs[0].name, pool.outputs[0].name} <= set(group) for group in plan.shared)
    (gap,) = _ops(graph, "GlobalAveragePool")
    pool_edges = {(s.tensor, s.consumer) for s in plan.sites if s.role == "pool"}
    assert (gap.inputs[0].name, gap.name) in pool_edges and gap.outputs[0].name in {t for t, _ in pool_edges}
    # Without the option the stem stays float, and the pools get no pairs of their own.
    off = plan_quantization(graph, replace(cpu_config(QuantConfig()), integer_pools=False))
    assert stem.name not in off.quantized_layers and not [s for s in off.sites if s.role == "pool"]


def test_integer_pools_run_as_integer_kernels_and_keep_the_numbers() -> None:
    graph = _resnet_like()
    model, _, _ = quantize(graph, cpu_config(QuantConfig()))
    lowered = lower_for_cpu(model, encoding=exact_encoding())
    ops = kernel_report(lowered.SerializeToString()).ops
    assert ops.get("QLinearAdd") == 1 and ops.get("QLinearGlobalAveragePool") == 1, ops
    assert "Add" not in ops and "GlobalAveragePool" not in ops and ops.get("QLinearConv") == 3, ops
    assert ops.get("QuantizeLinear") == 1 and not ops.get("DequantizeLinear"), ops  # only the image is converted
    assert_plan_computes(graph, model, lowered, "logits")


def test_a_shared_maxpool_grid_is_exact() -> None:
    """Max pooling commutes with rounding onto one grid: the pair after the MaxPool changes no value of the Q/DQ
    graph (taken out, the outputs are the same bit for bit)."""
    graph = _resnet_like()
    model, _, _ = quantize(graph, cpu_config(QuantConfig()))
    (pool,) = [n for n in model.graph.node if n.op_type == "MaxPool"]
    readers = [n for n in model.graph.node if pool.output[0] in n.input]
    assert readers and all(n.op_type == "QuantizeLinear" for n in readers)
    bypassed = onnx.ModelProto()
    bypassed.CopyFrom(model)
    dequantized = {dq.output[0] for dq in model.graph.node if dq.op_type == "DequantizeLinear"
                   and any(dq.input[0] == q.output[0] for q in readers)}  # fmt: skip
    for node in bypassed.graph.node:
        node.input[:] = [pool.output[0] if name in dequantized else name for name in node.input]
    feeds = feeds_for(graph, seed=4)
    ours, without = (run_model(m, feeds, opt_level="disable")["logits"] for m in (model, bypassed))
    assert np.array_equal(ours, without)


def test_a_pool_reading_a_float_activation_stays_float() -> None:
    """A squeeze-excite pool reads a SiLU output that stays float: quantising its whole input to pool it in
    integer would cost more than the float pool."""
    b = GraphBuilder("se_pool", seed=0)
    x = b.silu(b.conv_bn(b.input("input", [1, 16, 16, 16]), 16, 32, 3, act=None))
    model = b.build([b.gemm(b.pool_flatten(x), 32, 16, out="logits")])
    graph = optimize(graph_from_onnx(model)).graph
    plan = plan_quantization(graph, cpu_config(QuantConfig()))
    assert not [s for s in plan.sites if s.role == "pool"]


def _fire_pool() -> gs.Graph:
    """input ─ Conv1x1 ─ Relu ─┬ Conv1x1 ─ Relu ─┬ Concat ─ MaxPool 3x3/2 (ceil) ─ Conv1x1 ─ output
                               └ Conv3x3 ─ Relu ─┘
    SqueezeNet's fire module and the pool after it."""
    b = GraphBuilder("fire_pool", seed=1)
    squeeze = b.relu(b.conv(b.input("input", [1, 16, 15, 15]), 16, 16, 1))
    joined = b.concat([b.relu(b.conv(squeeze, 16, 16, 1)), b.relu(b.conv(squeeze, 16, 16, 3))])
    pooled = b.node("MaxPool", [joined], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    return optimize(graph_from_onnx(b.build([b.conv(pooled, 32, 16, 1, out="output")]))).graph


def test_a_maxpool_after_a_concat_of_int8_layers_runs_on_the_integer_grid() -> None:
    """The Concat's inputs are quantised and the MaxPool's output is: a pair on the pool's input too makes the
    Concat a QLinearConcat and the pool a uint8 one, where both ran in float between conversions."""
    graph = _fire_pool()
    plan = plan_quantization(graph, cpu_config(QuantConfig()))
    (concat,), (pool,) = _ops(graph, "Concat"), _ops(graph, "MaxPool")
    assert (concat.outputs[0].name, pool.name) in {(s.tensor, s.consumer) for s in plan.sites if s.role == "pool"}
    assert any({concat.outputs[0].name, pool.outputs[0].name} <= set(group) for group in plan.shared)
    model, _, _ = quantize(graph, cpu_config(QuantConfig()))
    lowered = lower_for_cpu(model, encoding=exact_encoding())
    ops = kernel_report(lowered.SerializeToString()).ops
    assert ops.get("QLinearConcat") == 1 and "Concat" not in ops, ops
    assert ops.get("QLinearConv") == 3, ops  # the last conv writes the float graph output: float on its weights
    assert ops.get("QuantizeLinear") == 1, ops  # only the image is converted
    assert_plan_computes(graph, model, lowered, "output")
    off = plan_quantization(graph, replace(cpu_config(QuantConfig()), integer_pools=False))
    assert not [s for s in off.sites if s.consumer == pool.name]


def test_an_inception_pool_branch_reads_the_tensor_its_siblings_quantise() -> None:
    """input ─┬ Conv ─ Relu ─┬ Concat ─┬ Conv1x1 ─ Relu ───────────────┬ Concat ─ Conv1x1 ─ output
             └ Conv ─ Relu ─┘         └ MaxPool 3x3/1 ─ Conv1x1 ─ Relu ┘
    GoogLeNet's pool branch: the previous block's Concat output is quantised for the 1x1 conv beside the pool, so the
    pool reads it through a pair too and runs as ONNX Runtime's uint8 pool, not in float between conversions."""
    b = GraphBuilder("inception", seed=2)
    x = b.input("input", [1, 16, 12, 12])
    x = b.concat([b.relu(b.conv(x, 16, 16, 3)), b.relu(b.conv(x, 16, 16, 1))])
    pooled = b.conv(b.maxpool(x, 3, pad=1), 32, 16, 1)
    joined = b.concat([b.relu(b.conv(x, 32, 16, 1)), b.relu(pooled)])
    graph = optimize(graph_from_onnx(b.build([b.conv(joined, 32, 16, 1, out="output")]))).graph
    plan = plan_quantization(graph, cpu_config(QuantConfig()))
    (pool,) = _ops(graph, "MaxPool")
    assert (pool.inputs[0].name, pool.name) in {(s.tensor, s.consumer) for s in plan.sites if s.role == "pool"}
    model, _, _ = quantize(graph, cpu_config(QuantConfig()))
    lowered = lower_for_cpu(model, encoding=exact_encoding())
    ops = kernel_report(lowered.SerializeToString()).ops
    assert ops.get("QLinearConcat") == 2 and ops.get("QLinearConv") == 4 and ops.get("QuantizeLinear") == 1, ops
    assert ops.get("DequantizeLinear") == 3, ops  # only the last conv's input, weight and bias: it writes float
    assert_plan_computes(graph, model, lowered, "output")


def test_a_global_reducemean_pool_after_the_last_residual_add_runs_as_integer_kernels() -> None:
    """PyTorch's dynamo exporter writes the global pool as ReduceMean over H and W (torchvision ResNeXt-50): it gets
    the pairs a GlobalAveragePool gets, so the last Add is a QLinearAdd (the CPU lowering writes such a pool as a
    GlobalAveragePool where the plan records its rank: `trtopt.backend.cpu.hard_gates`)."""
    b = GraphBuilder("reduce_mean_tail", seed=4)
    x = b.relu(b.conv(b.input("input", [1, 16, 8, 8]), 16, 16, 3))
    y = b.relu(b.add(b.conv(b.relu(b.conv(x, 16, 16, 3)), 16, 16, 3), x))
    pooled = b.node("ReduceMean", [y, b.const("axes", np.array([2, 3], np.int64))], keepdims=1)
    model = b.build([b.gemm(b.node("Flatten", [pooled], axis=1), 16, 16, out="logits")])
    model.opset_import[0].version = 18  # ReduceMean's axes as an input
    graph = optimize(graph_from_onnx(model)).graph
    (mean,) = _ops(graph, "ReduceMean")
    plan = plan_quantization(graph, cpu_config(QuantConfig()))
    assert (mean.inputs[0].name, mean.name) in {(s.tensor, s.consumer) for s in plan.sites if s.role == "pool"}
    model, _, _ = quantize(graph, cpu_config(QuantConfig()))
    lowered = lower_for_cpu(model, encoding=exact_encoding())
    ops = kernel_report(lowered.SerializeToString()).ops
    assert ops.get("QLinearAdd") == 1 and "Add" not in ops and ops.get("QLinearConv") == 3, ops
    assert_plan_computes(graph, model, lowered, "logits")
