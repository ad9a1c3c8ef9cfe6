"""Data movement on uint8: a CPU plan's Transposes and Reshapes move quantised bytes, not floats.

A per-tensor DequantizeLinear or QuantizeLinear commutes with any op that only moves, drops or regroups elements
(`MOVEMENT`: Transpose, Reshape, Squeeze, Unsqueeze, Flatten, Identity, Slice, Gather):
`Transpose(DQ(q)) == DQ(Transpose(q))` element for element. So moving a DQ below such ops, or a Q above them,
is exact, and the ops then move one byte per element instead of four; where a moved DQ meets a Q of the same
scale and zero point, the pair is the identity and goes.

ONNX Runtime's own quantizer gets this by giving those ops' outputs their inputs' scale (its QDQ "drop" rules
for Transpose, Reshape and friends, onnxruntime/core/optimizer/qdq_transformer/selectors_actions): on a
torchvision ViT (tiny, 12 layers, batch 8, avx2, 1 thread) trtopt's plan spent 47 ms of 449 in float
Transposes of attention heads (q, k and v split from one quantised projection, each reshaped and transposed
twice) where its plan spent 11 of 376. CNNs have few such ops (a ShuffleNet's channel shuffle).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import numpy_helper

# Ops whose output holds only (some of) their first input's values, each unchanged, and which ONNX Runtime's CPU
# provider runs on uint8; and Pad, whose new values are zeros (or copies), which on uint8 pads with the zero point
# (BlazeFace's channel Pad on each widening block's skip branch; ONNX Runtime's QDQ rules leave it float).
MOVEMENT = frozenset({"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice", "Gather", "Pad"})


def move_quantisation(model: onnx.ModelProto) -> int:
    """Sink DequantizeLinear nodes below data movement, lift QuantizeLinear nodes above it, and drop the DQ -> Q
    pairs that meet with equal parameters; in place. Returns how many nodes moved or went."""
    changes = dequantize_after_movement(model) + quantize_before_movement(model)
    return changes + drop_identity_pairs(model)


def _constant_per_tensor(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> bool:
    """A Q or DQ whose scale and zero point are initializers, one value each."""
    scale = inits.get(node.input[1]) if len(node.input) > 1 else None
    return (scale is not None and math.prod(scale.dims) == 1
            and all(name in inits for name in node.input[1:]))  # fmt: skip


def _readers(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, index))
    return readers


def dequantize_after_movement(model: onnx.ModelProto) -> int:
    """Each per-tensor DQ whose output only movement ops (as their data input) and Shape read gives way: they read
    its quantised input, and a copy of it follows each movement op. Repeated until no DQ moves; returns how many
    movement ops now run on a quantised tensor."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    taken = {name for node in graph.node for name in (*node.input, *node.output, node.name)}
    moved = 0
    while True:
        readers = _readers(graph)
        follow: dict[int, onnx.NodeProto] = {}
        gone: set[int] = set()
        for node in graph.node:
            users = readers.get(node.output[0], []) if node.op_type == "DequantizeLinear" else []
            if not users or node.output[0] in outputs or not _constant_per_tensor(node, inits):
                continue
            if not all(r.op_type == "Shape" or (_moves(r, inits) and i == 0) for r, i in users):
                continue
            gone.add(id(node))
            for reader, _ in users:
                reader.input[0] = node.input[0]  # Shape reads the same shape from the quantised tensor
                if reader.op_type == "Pad":
                    _pad_with_zero_point(graph, reader, node, taken, inits)
                if reader.op_type != "Shape":
                    follow[id(reader)] = _dequantizer_after(graph, reader, node, taken, inits)
        if not gone:
            return moved
        moved += len(follow)
        nodes = []
        for node in graph.node:
            if id(node) not in gone:
                nodes.append(node)
                nodes += [follow[id(node)]] if id(node) in follow else []
        del graph.node[:]
        graph.node.extend(nodes)


def _moves(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> bool:
    """A `MOVEMENT` op; a constant-mode Pad only where it pads with zeros (no value, or a constant 0)."""
    if node.op_type != "Pad":
        return node.op_type in MOVEMENT
    if _pad_mode(node) != "constant" or len(node.input) < 3 or not node.input[2]:
        return True
    value = inits.get(node.input[2])
    return value is not None and not numpy_helper.to_array(value).any()


def _pad_with_zero_point(graph: onnx.GraphProto, pad: onnx.NodeProto, qdq: onnx.NodeProto, taken: set[str],
                         inits: dict[str, onnx.TensorProto]) -> None:  # fmt: skip
    """A constant-mode Pad now on the quantised tensor pads with the zero point of `qdq` (a Q or DQ), which stands
    for the 0.0 it padded with."""
    if _pad_mode(pad) != "constant":
        return
    zero = inits.get(qdq.input[2]) if len(qdq.input) > 2 and qdq.input[2] else None
    value = numpy_helper.to_array(zero).reshape(()) if zero is not None else np.zeros((), np.uint8)
    name = _unique(f"{pad.name or 'pad'}_zero_point", taken)
    tensor = numpy_helper.from_array(value, name)
    graph.initializer.append(tensor)
    inits[name] = tensor
    while len(pad.input) < 3:
        pad.input.append("")
    pad.input[2] = name


def _pad_mode(pad: onnx.NodeProto) -> str:
    return next((a.s.decode() for a in pad.attribute if a.name == "mode"), "constant")


def _dequantizer_after(graph: onnx.GraphProto, mover: onnx.NodeProto, dq: onnx.NodeProto, taken: set[str],
                       inits: dict[str, onnx.TensorProto]) -> onnx.NodeProto:  # fmt: skip
    """A copy of `dq` that dequantises `mover`'s output, now quantised under a new name; `mover`'s old output
    name becomes the copy's."""
    name, node_name = _unique(f"{mover.output[0]}_quantised", taken), _unique(f"{mover.name}_dequantize", taken)
    _declare(graph, name, dq, inits)
    copy = onnx.NodeProto()
    copy.CopyFrom(dq)
    copy.name = node_name
    copy.input[0], copy.output[0] = name, mover.output[0]
    mover.output[0] = name
    return copy


def _declare(graph: onnx.GraphProto, name: str, node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> None:
    """A value_info for a new quantised tensor, of the type of `node`'s (Q or DQ) zero point: code that reads the
    graph's declared types (exposing tensors as outputs: `trtopt.execution.ort_session.with_exposed_tensors`)
    must not take it for float. Without a zero point the type is not declared (a DQ's input may be int32)."""
    zero = inits.get(node.input[2]) if len(node.input) > 2 else None
    if zero is not None:
        graph.value_info.append(onnx.helper.make_tensor_value_info(name, zero.data_type, None))


def _unique(name: str, taken: set[str]) -> str:
    """`name`, or with a number after it, that no tensor or node of the graph has (then taken)."""
    unique, n = name, 1
    while unique in taken:
        unique, n = f"{name}_{n}", n + 1
    taken.add(unique)
    return unique


def quantize_before_movement(model: onnx.ModelProto) -> int:
    """Move each per-tensor QuantizeLinear above the movement ops that feed it alone, as far as they go: the ops
    then read the quantised tensor. Returns how many moves."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    count = {name: len(users) for name, users in _readers(graph).items()}
    position = {out: i for i, node in enumerate(graph.node) for out in node.output}
    taken = {name for node in graph.node for name in (*node.input, *node.output)}
    stale: set[str] = set()
    moves = 0
    for index in range(len(graph.node)):
        while True:  # a lifted Q may meet another movement op above it
            q = graph.node[index]
            above = position.get(q.input[0]) if q.op_type == "QuantizeLinear" else None
            if above is None or not _constant_per_tensor(q, inits):
                break
            mover = graph.node[above]
            if not _moves(mover, inits) or len(mover.output) != 1 or mover.output[0] in outputs:
                break
            if count.get(mover.output[0]) != 1:
                break
            stale.add(q.input[0])
            position.update(_swap(graph, above, index, taken, inits))
            index = above
            moves += 1
    for info in [v for v in graph.value_info if v.name in stale]:
        graph.value_info.remove(info)
    return moves


def _swap(graph: onnx.GraphProto, above: int, below: int, taken: set[str],
          inits: dict[str, onnx.TensorProto]) -> dict[str, int]:  # fmt: skip
    """Nodes `above` (the mover: x -> y) and `below` (the Q: y -> z) become the Q at `above` (x -> z') and the
    mover at `below` (z' -> z): each position's inputs are still written before it. Returns the new positions."""
    mover, q = onnx.NodeProto(), onnx.NodeProto()
    mover.CopyFrom(graph.node[above])
    q.CopyFrom(graph.node[below])
    z = q.output[0]
    lifted = _unique(f"{z}_before_{mover.name or mover.op_type}", taken)
    _declare(graph, lifted, q, inits)
    q.input[0], q.output[0] = mover.input[0], lifted
    mover.input[0], mover.output[0] = lifted, z
    if mover.op_type == "Pad":
        _pad_with_zero_point(graph, mover, q, taken, inits)
    graph.node[above].CopyFrom(q)
    graph.node[below].CopyFrom(mover)
    return {lifted: above, z: below}


def drop_identity_pairs(model: onnx.ModelProto) -> int:
    """A Q that reads a DQ of the same scale, zero point and type gives back the DQ's input: its readers read
    that instead. DQs no one reads any longer go too. Returns how many Q nodes went."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    made_by = {node.output[0]: node for node in graph.node if node.op_type == "DequantizeLinear"}
    renamed: dict[str, str] = {}
    for q in graph.node:
        dq = made_by.get(q.input[0]) if q.op_type == "QuantizeLinear" else None
        if dq is None or q.output[0] in outputs or not _same_grid(dq, q, inits):
            continue
        renamed[q.output[0]] = dq.input[0]
    if not renamed:
        return 0
    kept = [n for n in graph.node if not (n.op_type == "QuantizeLinear" and n.output[0] in renamed)]
    for node in kept:
        for i, name in enumerate(node.input):
            while name in renamed:
                name = renamed[name]
            node.input[i] = name
    read = {name for node in kept for name in node.input} | outputs
    kept = [n for n in kept if n.op_type != "DequantizeLinear" or n.output[0] in read]
    del graph.node[:]
    graph.node.extend(kept)
    return len(renamed)


def _same_grid(dq: onnx.NodeProto, q: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> bool:
    if not (_constant_per_tensor(dq, inits) and _constant_per_tensor(q, inits)) or len(dq.input) != len(q.input):
        return False
    values = [(inits[a], inits[b]) for a, b in zip(dq.input[1:], q.input[1:], strict=True)]
    return all(x.data_type == y.data_type and numpy_helper.to_array(x).ravel().tolist()
               == numpy_helper.to_array(y).ravel().tolist() for x, y in values)  # fmt: skip
