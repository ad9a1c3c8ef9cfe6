"""Collapse chains of Reshape / Flatten / Squeeze / Unsqueeze into one Reshape.

Converters write shape changes one at a time (tf2onnx: Squeeze then Reshape before a classifier; onnx2torch
round trips: Flatten, Unsqueeze, Reshape), and each is a node the fusions and the Q/DQ placement have to look
through. A chain whose intermediate results nothing else reads is one Reshape to the last node's shape, which
the matcher reads from the inferred shapes: all static, or static but for one dimension, written as -1 (Reshape
infers it from the element count, which every shape op keeps, so it is the chain's own result): the batch, or
the batch times the heads in a sequence-first attention ([197, N * 3, 64], torchvision's ViT). A single Reshape
whose shape the graph computes (Paddle's flatten: Shape, Slice, Concat; the ViT's head split: Shape, Gather, Mul,
Unsqueeze, Concat) gets the same constant shape, and its shape subgraph goes.

A Transpose that moves only axes of size 1 keeps every value where it was in memory: it is a Reshape, and joins
such chains (alone, it becomes one). tf2onnx's Keras classifiers end in one: the logits conv's [N, 1000, 1, 1]
turned NHWC before a Reshape to [N, 1000] (Keras MobileNetV3Small: the only Transpose left inside the graph).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trtopt.frontend.edit import Namer
from trtopt.passes.base import Match, graph_pass
from trtopt.passes.query import constant_array, graph_output_names, producer, sole_consumer

SHAPE_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


@dataclass(frozen=True, eq=False)
class ReshapeChain(Match):
    chain: tuple[gs.Node, ...]
    shape: tuple[int, ...]
    kind = "collapse_reshapes"

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        return self.chain

    def describe(self) -> str:
        ops = " ".join(n.op for n in self.chain)
        return f"{ops} ({self.chain[0].name!r} ...) -> one Reshape to {list(self.shape)}"


def find_reshape_chains(graph: gs.Graph) -> list[ReshapeChain]:
    outputs = graph_output_names(graph)
    found = []
    for last in graph.nodes:
        if not _shape_op(last) or _continues(last, outputs):
            continue  # chains are found from their last node
        chain = [last]
        while (before := producer(chain[0].inputs[0])) is not None and _shape_op(before) and (
            sole_consumer(before.outputs[0], outputs) is chain[0]
        ):
            chain.insert(0, before)
        shape = _target(chain) if len(chain) > 1 or _computed_shape(last) or last.op == "Transpose" else None
        if shape is not None:
            found.append(ReshapeChain(tuple(chain), shape))
    return found


def _shape_op(node: gs.Node) -> bool:
    """A shape op, or a Transpose that moves only axes of size 1 (see the module)."""
    if node.op in SHAPE_OPS:
        return True
    shape = getattr(node.inputs[0], "shape", None) if node.op == "Transpose" and node.inputs else None
    if not shape:
        return False
    perm = [int(p) for p in node.attrs.get("perm", range(len(shape) - 1, -1, -1))]
    moved = [p for p in perm if shape[p] != 1]  # a symbolic dimension counts as larger than 1
    return sorted(perm) == list(range(len(shape))) and moved == sorted(moved)


def _computed_shape(node: gs.Node) -> bool:
    """A Reshape whose shape the graph computes (Paddle's flatten: Shape -> Slice -> Concat -> Reshape): with the
    output's shape inferred, a constant does the same, and the shape subgraph goes."""
    return node.op == "Reshape" and len(node.inputs) > 1 and constant_array(node.inputs[1]) is None


def _continues(node: gs.Node, outputs: set[str]) -> bool:
    after = sole_consumer(node.outputs[0], outputs)
    return after is not None and _shape_op(after)


def _target(chain: list[gs.Node]) -> tuple[int, ...] | None:
    source, result = chain[0].inputs[0].shape, chain[-1].outputs[0].shape
    if source is None or result is None:
        return None
    if all(isinstance(d, int) and d >= 0 for d in result):
        return tuple(int(d) for d in result)
    unknown = [i for i, d in enumerate(result) if not (isinstance(d, int) and d > 0)]
    if len(unknown) == 1 and all(isinstance(d, int) for i, d in enumerate(result) if i != unknown[0]):
        return tuple(-1 if i == unknown[0] else int(d) for i, d in enumerate(result))
    return None


@graph_pass("collapse_reshapes", find_reshape_chains)
def collapse_reshapes(graph: gs.Graph) -> list[ReshapeChain]:
    namer = Namer(graph)
    matches = find_reshape_chains(graph)
    for match in matches:
        first, last = match.chain[0], match.chain[-1]
        shape = gs.Constant(namer.take(f"{last.name}_shape"), np.array(match.shape, np.int64))
        output = last.outputs[0]
        last.outputs.clear()
        graph.nodes.append(gs.Node("Reshape", name=namer.take(str(last.name)), inputs=[first.inputs[0], shape],
                                   outputs=[output]))
    return matches
