"""INT8 regions of a Q/DQ model, and the same model with some regions run in float.

An INT8 region is a set of ops that read activations through DequantizeLinear and are linked by Q/DQ pairs:
an INT8 conv, the conv after it that reads its output through a pair, the residual Add that reads both
through pairs... (a float op in between ends a region). On ONNX Runtime's CPU kernels each region is one
stretch of integer kernels, entered through QuantizeLinear and left through DequantizeLinear. Its integer
kernels save time only where their work outweighs those conversions: on a CPU without VNNI, ONNX Runtime's
exact u8u8 kernels barely beat float convs, and a region of a few small convs between float layers can cost
more than it saves (issue #45: a Keras emotion classifier's plan took 1.50x FP32's time, 7 of its 23 convs
float under the 16-channel minimum). `float_regions` writes the model with chosen regions in float: their
activation pairs bypassed, their weights dequantized into float constants (the values the plan's reference
computes with, so the result is still exactly the Q/DQ graph it says it is). The CPU backend measures
which regions pay (`trtopt.backend.cpu.choice`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

# Ops an INT8 kernel absorbs between its output and the QuantizeLinear after it (ONNX Runtime drops them).
FOLDED = ("Relu", "Clip")
LAYERS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


@dataclass(frozen=True)
class Region:
    """One INT8 region: the indices of its ops in the graph, the layers among them (names), how many weight
    values they hold (the ranking's proxy for the integer work they do), and whether any of its ops writes a
    QuantizeLinear. One that writes none runs no integer kernel at all: ONNX Runtime fuses DQ -> Conv -> Q only,
    so its layers run in float on dequantised weights behind their input's Q/DQ, rounding without a speed-up
    (an INT8 conv whose only readers are float layers; `trtopt.backend.cpu.builder.KernelReport.dequantized`)."""

    nodes: frozenset[int]
    layers: tuple[str, ...]
    weights: int
    int8_kernels: bool = True


def int8_regions(model: onnx.ModelProto) -> list[Region]:
    """The INT8 regions of `model` (TensorRT-form or lowered Q/DQ), those that run no integer kernel first (pure
    overhead), then smallest first (fewest weight values)."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producers = {out: i for i, node in enumerate(graph.node) for out in node.output}
    quantized = [i for i, node in enumerate(graph.node) if _activation_dqs(graph, i, producers, inits)]
    parent = {i: i for i in quantized}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in quantized:
        for dq in _activation_dqs(graph, i, producers, inits):
            writer = _writer(graph, graph.node[dq].input[0], producers)
            if writer is not None and writer in parent:
                parent[root(i)] = root(writer)
    groups: dict[int, set[int]] = {}
    for i in quantized:
        groups.setdefault(root(i), set()).add(i)
    writers = {_writer(graph, q.output[0], producers) for q in graph.node if q.op_type == "QuantizeLinear"}
    regions = [_region(graph, members, producers, inits, writers) for members in groups.values()]
    return sorted(regions, key=lambda r: (r.int8_kernels, r.weights, min(r.nodes)))


def float_regions(model: onnx.ModelProto, regions: Iterable[Region]) -> onnx.ModelProto:
    """A copy of `model` with every op of `regions` in float: activation pairs it reads bypassed, weights it
    reads through DequantizeLinear stored dequantized; Q/DQ nodes left unread are dropped."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inits = {t.name: t for t in graph.initializer}
    producers = {o: i for i, node in enumerate(graph.node) for o in node.output}
    for index in sorted({i for r in regions for i in r.nodes}):
        node = graph.node[index]
        for k, name in enumerate(node.input):
            dq = producers.get(name)
            if dq is None or graph.node[dq].op_type != "DequantizeLinear":
                continue
            source = graph.node[dq].input[0]
            if source in inits:
                node.input[k] = _dequantized(graph, graph.node[dq], inits)
            elif source in producers and graph.node[producers[source]].op_type == "QuantizeLinear":
                node.input[k] = graph.node[producers[source]].input[0]
    _drop_unread(graph)
    return out


def _activation_dqs(
    graph: onnx.GraphProto, index: int, producers: dict[str, int], inits: dict[str, onnx.TensorProto]
) -> list[int]:
    """The DequantizeLinear nodes of activations (not of constants) that op `index` reads (none for a Q/DQ op)."""
    node = graph.node[index]
    if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
        return []
    found = []
    for name in node.input:
        dq = producers.get(name)
        if dq is not None and graph.node[dq].op_type == "DequantizeLinear" and graph.node[dq].input[0] not in inits:
            found.append(dq)
    return found


def _writer(graph: onnx.GraphProto, quantized: str, producers: dict[str, int]) -> int | None:
    """The op whose output a QuantizeLinear output `quantized` stores, past the activations an INT8 kernel
    absorbs (`FOLDED`); None for a graph input or a float op."""
    q = producers.get(quantized)
    if q is None or graph.node[q].op_type != "QuantizeLinear":
        return None
    at = producers.get(graph.node[q].input[0])
    while at is not None and graph.node[at].op_type in FOLDED:
        at = producers.get(graph.node[at].input[0])
    return at


def _region(
    graph: onnx.GraphProto, members: set[int], producers: dict[str, int], inits: dict[str, onnx.TensorProto],
    writers: set[int | None],
) -> Region:  # fmt: skip
    layers, weights = [], 0
    for i in sorted(members):
        node = graph.node[i]
        if node.op_type not in LAYERS:
            continue
        layers.append(node.name or f"{node.op_type}#{i}")
        for name in node.input[1:]:
            dq = producers.get(name)
            if dq is not None and graph.node[dq].input[0] in inits:
                weights += int(np.prod(inits[graph.node[dq].input[0]].dims))
    return Region(frozenset(members), tuple(layers), weights, bool(members & writers))


def _dequantized(graph: onnx.GraphProto, dq: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> str:
    """The name of a float constant holding what DequantizeLinear `dq` of a constant computes."""
    name = f"{dq.output[0]}/float"
    if name in inits:
        return name
    q = numpy_helper.to_array(inits[dq.input[0]]).astype(np.float64)
    scale = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float32)
    zero = numpy_helper.to_array(inits[dq.input[2]]).astype(np.float64) if len(dq.input) > 2 else np.zeros(1)
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
    if scale.ndim == 1 and scale.size > 1:  # per channel along `axis`
        shape = [1] * q.ndim
        shape[axis % q.ndim] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    value = ((q - zero).astype(np.float32) * scale).astype(np.float32)  # DequantizeLinear's own float math
    graph.initializer.append(numpy_helper.from_array(value, name))
    inits[name] = graph.initializer[-1]
    return name


def _drop_unread(graph: onnx.GraphProto) -> None:
    """Remove Q/DQ nodes nothing reads any more, then the constants nothing reads."""
    while True:
        read = {o.name for o in graph.output} | {name for node in graph.node for name in node.input}
        dead = [n for n in graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")
                and not any(o in read for o in n.output)]  # fmt: skip
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    read = {o.name for o in graph.output} | {name for node in graph.node for name in node.input}
    kept = [t for t in graph.initializer if t.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)
