"""A max pool on a quantised tensor keeps its input's grid: no second quantisation after it on OpenVINO.

trtopt's placement quantises a max pool's input (ONNX Runtime runs MaxPool on uint8) and, separately, each
quantised layer's input, so a ResNet stem reads Relu -> Q/DQ (grid a) -> MaxPool -> Q/DQ (grid b) -> Conv. A max
pool of a dequantised tensor is already on grid a (the dequantisation is increasing, so it commutes with the
max), and OpenVINO's low-precision transformations (LPT) move the first dequantisation through the pool, which
then runs u8; the second pair becomes a FakeQuantize node of its own, u8 -> u8, requantising the pool's whole
output to grid b at every call. NNCF places no quantiser after a max pool (MaxPool is among its
quantisation-agnostic operations, nncf/openvino/graph/metatypes/groups.py), and OpenVINO runs the pool's output
straight into the convs. Measured on an avx2 EPYC (OpenVINO 2026.4.1, 1 thread, ResNet-18 of the corpus): that
FakeQuantize took 0.07 ms of 22 at batch 1, 0.8 ms of 206 at batch 8.

`drop_pool_requantisation` removes the pair: the pool's readers read its output on grid a. The values change
only by grid b's rounding (and clipping), which is no longer applied: the plan's reference is this graph, so the
build verifies OpenVINO's kernels against it as before.
"""

from __future__ import annotations

import onnx


def _readers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers


def _requantisation(pool: onnx.NodeProto, readers: dict[str, list[onnx.NodeProto]],
                    outputs: set[str]) -> list[onnx.NodeProto] | None:  # fmt: skip
    """The QuantizeLinear and DequantizeLinear nodes that requantise a MaxPool's output, when they are all that
    reads it (each Q read by DequantizeLinear nodes only, none of it a graph output); else None."""
    if pool.output[0] in outputs or len(pool.output) != 1:  # a second output (Indices) is not on a grid
        return None
    found = []
    for q in readers.get(pool.output[0], []):
        dqs = readers.get(q.output[0], [])
        if q.op_type != "QuantizeLinear" or q.output[0] in outputs or not dqs:
            return None
        if any(dq.op_type != "DequantizeLinear" or dq.output[0] in outputs for dq in dqs):
            return None
        found += [q, *dqs]
    return found or None


def drop_pool_requantisation(model: onnx.ModelProto) -> int:
    """Remove, in place, the Q/DQ pairs on the output of each MaxPool that reads a DequantizeLinear's output
    (`_requantisation`); their readers read the pool's output. Returns how many pools."""
    graph = model.graph
    made_by = {out: node.op_type for node in graph.node for out in node.output}
    readers = _readers(graph)
    outputs = {o.name for o in graph.output}
    dropped: set[int] = set()
    renamed: dict[str, str] = {}
    pools = 0
    for pool in graph.node:
        if pool.op_type != "MaxPool" or made_by.get(pool.input[0]) != "DequantizeLinear":
            continue
        pair = _requantisation(pool, readers, outputs)
        if pair is None:
            continue
        dropped.update(id(node) for node in pair)
        renamed.update({node.output[0]: pool.output[0] for node in pair if node.op_type == "DequantizeLinear"})
        pools += 1
    if not pools:
        return 0
    kept = [node for node in graph.node if id(node) not in dropped]
    for node in kept:
        for i, name in enumerate(node.input):
            node.input[i] = renamed.get(name, name)
    del graph.node[:]
    graph.node.extend(kept)
    return pools
