"""Write a channel shuffle (Reshape, Transpose, Reshape that permutes the elements of one axis) as one Gather.

ShuffleNet's channel shuffle splits the channel axis into groups, swaps the two factors and merges them back:
`Reshape [N, C, H, W] -> [N, g, C/g, H, W]`, `Transpose perm=[0, 2, 1, 3, 4]`, `Reshape -> [N, C, H, W]` (PyTorch,
Paddle and TensorFlow exports all write it so; TensorFlow's on the last axis). The three nodes move whole H x W
planes: the result is channel `i` of the output read from channel `idx[i]` of the input, with
`idx = arange(C).reshape(g, C/g).T.reshape(-1)`, which is `Gather(x, idx, axis=1)`: one node instead of three,
no Transpose inside the graph, and the same values (a copy, no arithmetic). In ONNX Runtime (1 thread, uint8, as
the INT8 plan runs it between a QLinearConcat and a Split) the Gather took 0.58-0.74x the time of the three nodes
on ShuffleNetV2's shapes, batch 1 and 8 (AMD EPYC with AVX-512 VNNI, median of 200 interleaved calls).

The matcher is general: the first Reshape splits one axis of static size into static factors, leaving every other
dimension as it was (by the inferred shapes; one symbolic dimension, the batch, is fine); the Transpose permutes
only those factors; the second Reshape merges them back to the input's shape. A window partition (Swin) moves
more than one axis and is not matched. TensorRT runs the three nodes as one shuffle layer, so the pass is the CPU
backend's (`CpuBackend.passes`), not in the default order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trtopt.frontend.edit import Namer
from trtopt.passes.base import Match, graph_pass
from trtopt.passes.query import graph_output_names, sole_consumer


@dataclass(frozen=True, eq=False)
class ChannelShuffle(Match):
    """Reshape -> Transpose -> Reshape that permutes axis `axis` of the input by `indices`."""

    chain: tuple[gs.Node, gs.Node, gs.Node]
    axis: int
    indices: np.ndarray
    kind = "channel_shuffle"

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        return self.chain

    def describe(self) -> str:
        return f"Reshape Transpose Reshape ({self.chain[1].name!r}) -> Gather on axis {self.axis}"


def find_channel_shuffles(graph: gs.Graph) -> list[ChannelShuffle]:
    outputs = graph_output_names(graph)
    found = []
    for split in graph.nodes:
        if split.op != "Reshape" or not split.outputs:
            continue
        swap = sole_consumer(split.outputs[0], outputs)
        if swap is None or swap.op != "Transpose":
            continue
        merge = sole_consumer(swap.outputs[0], outputs)
        if merge is None or merge.op != "Reshape" or merge.inputs[0] is not swap.outputs[0]:
            continue
        match = _permutation(split, swap, merge)
        if match is not None:
            found.append(match)
    return found


def _permutation(split: gs.Node, swap: gs.Node, merge: gs.Node) -> ChannelShuffle | None:
    source, parts, result = split.inputs[0].shape, split.outputs[0].shape, merge.outputs[0].shape
    if source is None or parts is None or result is None or sum(not isinstance(d, int) for d in source) > 1:
        return None
    # With at most one dimension unknown, every shape op keeps the element count, so an unknown dimension (which
    # shape inference names anew after a Reshape to -1) is the same wherever the static ones agree.
    source, parts, result = ([d if isinstance(d, int) else None for d in s] for s in (source, parts, result))
    if result != source:
        return None
    block = _split_axis(source, parts)
    if block is None:
        return None
    axis, factors = block
    perm = [int(p) for p in swap.attrs.get("perm", range(len(parts) - 1, -1, -1))]
    inside = range(axis, axis + len(factors))
    if sorted(perm) != list(range(len(parts))) or any(perm[i] != i for i in range(len(parts)) if i not in inside):
        return None
    order = [perm[i] - axis for i in inside]
    indices = np.arange(int(np.prod(factors)), dtype=np.int64).reshape(factors).transpose(order).reshape(-1)
    if np.array_equal(indices, np.arange(indices.size)):
        return None  # moves only axes of size 1: the three nodes are one Reshape (collapse_reshapes)
    return ChannelShuffle((split, swap, merge), axis, indices)


def _split_axis(source: Sequence[int | None], parts: Sequence[int | None]) -> tuple[int, tuple[int, ...]] | None:
    """(axis, factors) when `parts` is `source` with one static axis split into two or more static factors."""
    extra = len(parts) - len(source) + 1
    if extra < 2:
        return None
    axis = 0
    while axis < len(source) and source[axis] == parts[axis]:
        axis += 1
    if axis == len(source) or list(source[axis + 1:]) != list(parts[axis + extra:]):
        return None
    factors = tuple(f for f in parts[axis:axis + extra] if f is not None and f > 0)
    size = source[axis]
    if size is None or len(factors) != extra:
        return None
    return (axis, factors) if int(np.prod(factors)) == size else None


@graph_pass("channel_shuffle", find_channel_shuffles)
def channel_shuffle(graph: gs.Graph) -> list[ChannelShuffle]:
    namer = Namer(graph)
    matches = find_channel_shuffles(graph)
    for match in matches:
        split, _, merge = match.chain
        indices = gs.Constant(namer.take(f"{merge.name}_indices"), match.indices)
        output = merge.outputs[0]
        merge.outputs.clear()
        graph.nodes.append(gs.Node("Gather", name=namer.take(str(merge.name)), attrs={"axis": match.axis},
                                   inputs=[split.inputs[0], indices], outputs=[output]))
    return matches
