"""Move a Transpose up to the graph input it comes from, through the elementwise ops between them.

Keras models exported with tf2onnx scale their NHWC input before the first convolution (`input * (1/127.5)`,
`- 1`), then transpose it to NCHW: `input -> Mul -> Add -> Transpose -> Conv` (EfficientNetB0, issue #45). The
Transpose sits inside the graph, and the affine ops cannot fold into the conv they feed, as `fold_input_affine`
would fold them, because the Transpose is between. Run in the untransposed layout instead, on the Transpose's
output, the same ops compute the same thing (constants transposed once, here), and the Transpose reads the graph
input: the layout change at the boundary, and the affine ops next to the conv.

A chain is moved only when it reaches a graph input through ops nothing else reads, and never where the
Transpose writes a graph output (`sink_transposes` moves those the other way, to the outputs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trtopt.frontend.edit import Namer
from trtopt.passes.base import Match, graph_pass
from trtopt.passes.query import constant_array, graph_output_names, is_missing, producer, sole_consumer
from trtopt.passes.sink_transposes import ELEMENTWISE_OPS, SCALAR_INPUTS, UNARY_OPS, perm_of


@dataclass(frozen=True, eq=False)
class TransposeHoist(Match):
    """`transpose` moved above `chain` (from the graph input down), which then runs in its output's layout."""

    transpose: gs.Node
    chain: tuple[gs.Node, ...]
    kind = "hoist_transpose"

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        return (*self.chain, self.transpose)

    def describe(self) -> str:
        ops = " ".join(n.op for n in self.chain)
        return f"Transpose {self.transpose.name!r} moved above {ops} to the graph input"


def find_transpose_hoists(graph: gs.Graph) -> list[TransposeHoist]:
    outputs = graph_output_names(graph)
    inputs = {id(t) for t in graph.inputs}
    found = []
    for node in graph.nodes:
        perm = perm_of(node) if node.op == "Transpose" else None
        if perm is None or node.outputs[0].name in outputs:
            continue
        chain: list[gs.Node] = []
        tensor = node.inputs[0]
        while (above := producer(tensor)) is not None and sole_consumer(tensor, outputs) is not None:
            data = _data_input(above, len(perm))
            if data is None:
                break
            chain.insert(0, above)
            tensor = data
        if chain and id(tensor) in inputs:
            found.append(TransposeHoist(node, tuple(chain)))
    return found


def _data_input(node: gs.Node, rank: int) -> gs.Tensor | None:
    """The one computed input of a layout-agnostic op whose other inputs are constants of rank <= `rank`."""
    if node.op not in UNARY_OPS and node.op not in ELEMENTWISE_OPS or len(node.outputs) != 1:
        return None
    data = None
    for index, tensor in enumerate(node.inputs):
        if is_missing(tensor) or index in SCALAR_INPUTS.get(node.op, ()):
            continue
        value = constant_array(tensor)
        if value is None:
            if data is not None:
                return None  # two computed inputs
            data = tensor
        elif value.ndim > rank:
            return None
    shape = getattr(data, "shape", None)
    return data if data is not None and shape is not None and len(shape) == rank else None


@graph_pass("hoist_transposes", find_transpose_hoists)
def hoist_transposes(graph: gs.Graph) -> list[TransposeHoist]:
    namer = Namer(graph)
    matches = find_transpose_hoists(graph)
    for match in matches:
        _hoist(match, namer)
    return matches


def _hoist(match: TransposeHoist, namer: Namer) -> None:
    transpose, chain = match.transpose, match.chain
    perm = perm_of(transpose)
    assert perm is not None
    source, result = _data_input(chain[0], len(perm)), transpose.outputs[0]
    assert source is not None and source.shape is not None
    moved = gs.Variable(namer.take(f"{source.name}_transposed"), dtype=source.dtype,
                        shape=[source.shape[a] for a in perm])  # fmt: skip
    transpose.inputs[0], transpose.outputs[0] = source, moved
    current = moved
    for node in chain:
        for index, tensor in enumerate(node.inputs):
            if is_missing(tensor) or index in SCALAR_INPUTS.get(node.op, ()):
                continue
            value = constant_array(tensor)
            if value is None:
                node.inputs[index] = current  # the one computed input (`_data_input`)
            elif value.size > 1:
                full = value.reshape((1,) * (len(perm) - value.ndim) + value.shape)
                node.inputs[index] = gs.Constant(namer.take(f"{tensor.name}_relaid"),
                                                 np.ascontiguousarray(np.transpose(full, perm)))  # fmt: skip
        if node is chain[-1]:
            node.outputs[0] = result
        elif node.outputs[0].shape is not None:
            node.outputs[0].shape = [node.outputs[0].shape[a] for a in perm]
        current = node.outputs[0]
