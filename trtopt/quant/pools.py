"""Pooling on the integer grid between INT8 layers (`QuantConfig.integer_pools`, the CPU backend's default).

ONNX Runtime keeps a stretch of INT8 layers in uint8 and in NHWC only where every op in it has an integer
kernel: a MaxPool between DequantizeLinear and QuantizeLinear of one grid becomes its uint8 NhwcMaxPool, a
GlobalAveragePool between a DequantizeLinear and a QuantizeLinear its QLinearGlobalAveragePool, an Add read and
written through pairs its QLinearAdd. A float op in the stretch costs a DequantizeLinear, a QuantizeLinear and
layout Transposes around it. On the real-export corpus's torchvision ResNet-18 (docs/exports.md, *Placement
against ONNX Runtime's quantizer*: avx2, 1 thread, interleaved) the float stem conv -> Relu -> MaxPool left
layer1 in NCHW with four Transposes, and the last residual Add and pool ran in float; with the rules below
the plan has the op counts of ONNX Runtime's own (20 QLinearConv, 8 QLinearAdd, NhwcMaxPool,
QLinearGlobalAveragePool, one QuantizeLinear, two Transposes) and its speed.

- `shared_maxpools`: a MaxPool whose input and output are both quantised shares one threshold, so both pairs
  get one grid: max pooling commutes with rounding onto a grid, so this is exact (one rounding fewer).
- `pooled_stem`: a thin conv (under `min_channels`: a stem on 3 colour channels) whose output, past its folded
  activation, only MaxPools read stays INT8; in float its MaxPool runs outside the integer stretch (and a
  uint8 MaxPool in NCHW, where the float conv writes, is ONNX Runtime's slow one: 0.80x the plan's speed).
- `average_pool_edges`: a GlobalAveragePool (or a global ReduceMean, `is_global_mean`) whose output (through
  Flatten / Reshape / Squeeze / Unsqueeze) only INT8 layers read gets a pair on its output sharing that tensor's
  threshold, and a pair on its input where the input is the output of a residual Add or a Concat (past its folded
  activation) whose inputs are all quantised: the Add becomes a QLinearAdd (the Concat a QLinearConcat), the pool
  a QLinearGlobalAveragePool. A pool reading a float tensor (a squeeze-excite block's SiLU output) is left alone:
  a QuantizeLinear of its whole input would cost more than the float pool. torchvision's ResNeXt-50 from the
  dynamo exporter (ReduceMean) ran its last residual Add and pool in float behind two DequantizeLinear.
- `max_pool_edges`: a MaxPool whose output is read through a pair, and whose input is quantised for another
  reader (Inception's pool branch beside the 1x1 convs reading the same tensor) or is the output of a
  Concat or residual Add (past folded activations) whose data inputs are all quantised, gets a pair on its
  input too: the Concat becomes a QLinearConcat (or the Add a QLinearAdd) and the pool a uint8 NhwcMaxPool
  (`shared_maxpools` then gives both pairs one grid). SqueezeNet's fire modules (Concat -> MaxPool -> Conv):
  without it two Concats and two MaxPools ran in float between DequantizeLinear, QuantizeLinear and layout
  changes, where ONNX Runtime's own quantizer's plan has none (torchvision squeezenet1_0, avx2).
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import onnx_graphsurgeon as gs

from trtopt.passes.query import constant_array

SHAPE_OPS = ("Flatten", "Reshape", "Squeeze", "Unsqueeze")

Edge = tuple[str, str, int]  # (tensor, consumer node, input index) read through a Q/DQ pair


def pooled_stem(node: gs.Node, folds: Collection[str]) -> bool:
    """Whether `node` is a dense Conv whose output, past a sole activation in `folds`, only MaxPools read."""
    if node.op != "Conv" or int(node.attrs.get("group", 1)) != 1:
        return False
    out = node.outputs[0]
    while len(out.outputs) == 1 and out.outputs[0].op in folds:
        out = out.outputs[0].outputs[0]
    return bool(out.outputs) and all(c.op == "MaxPool" for c in out.outputs)


def shared_maxpools(graph: gs.Graph, edges: Collection[Edge]) -> list[tuple[str, str]]:
    """(output, input) of each MaxPool that reads its input through a pair and whose output some pair reads."""
    read = {(tensor, consumer) for tensor, consumer, _ in edges}
    quantized = {tensor for tensor, _, _ in edges}
    return [(node.outputs[0].name, node.inputs[0].name) for node in graph.nodes
            if node.op == "MaxPool" and (node.inputs[0].name, node.name) in read
            and node.outputs[0].name in quantized]  # fmt: skip


def max_pool_edges(graph: gs.Graph, edges: Collection[Edge], folds: Collection[str]) -> list[Edge]:
    """The input edges to quantise before MaxPools whose output is quantised and whose input is quantised for
    another reader or comes from an integer join (see the module)."""
    read = {(tensor, consumer) for tensor, consumer, _ in edges}
    quantized = {tensor for tensor, _, _ in edges}
    return [(node.inputs[0].name, node.name, 0) for node in graph.nodes
            if node.op == "MaxPool" and node.outputs[0].name in quantized
            and (node.inputs[0].name, node.name) not in read
            and (node.inputs[0].name in quantized or _integer_join(node.inputs[0], node, read, folds))]  # fmt: skip


def average_pool_edges(
    graph: gs.Graph, edges: Collection[Edge], folds: Collection[str]
) -> tuple[list[Edge], list[tuple[str, str]]]:
    """The edges to quantise around each GlobalAveragePool (see the module), and the (tensor, pool output)
    pairs that share a threshold."""
    read = {(tensor, consumer) for tensor, consumer, _ in edges}
    added: list[Edge] = []
    shared: list[tuple[str, str]] = []
    for node in graph.nodes:
        if node.op != "GlobalAveragePool" and not is_global_mean(node):
            continue
        source, out = node.inputs[0], node.outputs[0]
        target = out
        while len(target.outputs) == 1 and target.outputs[0].op in SHAPE_OPS:
            target = target.outputs[0].outputs[0]
        if not target.outputs or not all((target.name, reader.name) in read for reader in target.outputs):
            continue
        if (source.name, node.name) not in read:
            if not _integer_join(source, node, read, folds):
                continue
            added.append((source.name, node.name, 0))
        if target is not out:
            reader = out.outputs[0]
            added.append((out.name, reader.name, next(i for i, t in enumerate(reader.inputs) if t is out)))
            shared.append((target.name, out.name))
    return added, shared


def is_global_mean(node: gs.Node) -> bool:
    """A ReduceMean over every axis after the channels, keeping them: a GlobalAveragePool (how PyTorch's dynamo
    exporter writes one; the CPU lowering writes it as one, `trtopt.backend.cpu.hard_gates`)."""
    if node.op != "ReduceMean" or not node.inputs:
        return False
    shape = node.inputs[0].shape
    axes = constant_array(node.inputs[1]) if len(node.inputs) > 1 else node.attrs.get("axes")
    if not shape or len(shape) < 3 or axes is None or int(node.attrs.get("keepdims", 1)) != 1:
        return False
    return sorted(int(a) % len(shape) for a in np.atleast_1d(np.asarray(axes)).tolist()) == list(range(2, len(shape)))


def _integer_join(source: gs.Tensor, pool: gs.Node, read: Collection[tuple[str, str]], folds: Collection[str]) -> bool:
    """Whether `source`, read only by `pool`, is the output of an Add of two tensors or of a Concat (past
    activations in `folds`, each the sole reader of its input) whose data inputs are all read through pairs."""
    if [c.name for c in source.outputs] != [pool.name] or not source.inputs:
        return False
    producer = source.inputs[0]
    while producer.op in folds and len(producer.inputs[0].outputs) == 1 and producer.inputs[0].inputs:
        producer = producer.inputs[0].inputs[0]
    data = [t for t in producer.inputs if isinstance(t, gs.Variable)]
    joins = (producer.op == "Add" and len(data) == 2) or (producer.op == "Concat" and len(data) == len(producer.inputs))
    return joins and all((t.name, producer.name) in read for t in data)
