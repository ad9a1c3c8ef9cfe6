"""Horizontal fusion: sibling Convs reading one tensor with one geometry become one wide Conv + Split.

The canonical case is the set of 1x1 convs that open the branches of an Inception module (Szegedy et
al. 2015): TensorRT runs them as one wider layer (GTC 2017, "8-bit Inference with TensorRT"). Weights
and biases concatenate along the output channels, which is exact.

Siblings are grouped by what follows them too, so no conv loses its own fused epilogue: convs whose
(identical) activation alone reads their output fuse with that activation hoisted above the Split;
convs with no fusable follower fuse as plain convs; convs feeding an Add stay apart (they fuse with
the residual instead). Grouped/depthwise convs, computed weights and auto_pad never fuse.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trtopt.frontend.edit import Namer, new_constant
from trtopt.passes.activations import Activation, clone_activation, match_activation
from trtopt.passes.base import Match, graph_pass
from trtopt.passes.query import constant_array, conv_geometry, graph_output_names, is_missing, opset

SPLIT_INPUT_OPSET = 13  # Split takes its sizes as an input from opset 13, as an attribute before


@dataclass(frozen=True, eq=False)
class Sibling:
    conv: gs.Node
    weight: np.ndarray
    bias: np.ndarray
    activation: Activation | None

    @property
    def output(self) -> gs.Tensor:
        return self.activation.output if self.activation else self.conv.outputs[0]


@dataclass(frozen=True, eq=False)
class ParallelConvs(Match):
    """Two or more sibling convs that become one wide conv (+ their shared activation) and a Split."""

    siblings: tuple[Sibling, ...]
    input: str  # the tensor the siblings read
    kernel: str  # e.g. "1x1"
    kind = "fuse_parallel"

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        return tuple(s.conv for s in self.siblings)

    def describe(self) -> str:
        act = self.siblings[0].activation
        channels = sum(s.weight.shape[0] for s in self.siblings)
        epilogue = f" + {act.name}" if act else ""
        return (
            f"{len(self.siblings)} {self.kernel} convs{epilogue} on {self.input!r} -> "
            f"one conv of {channels} channels + Split"
        )


def find_parallel_convs(graph: gs.Graph) -> list[ParallelConvs]:
    """Each set of >= 2 compatible sibling convs: one input, geometry, weight dtype and shape, activation."""
    outputs = graph_output_names(graph)
    families: dict[tuple[object, ...], list[Sibling]] = {}
    for node in graph.nodes:
        found = _sibling(node, outputs)
        if found is not None:
            key = (id(node.inputs[0]), conv_geometry(node), found.weight.dtype.str, found.weight.shape[1:])
            signature = found.activation.signature if found.activation else None
            families.setdefault((*key, signature), []).append(found)
    return [_family(siblings) for siblings in families.values() if len(siblings) >= 2]


def _family(siblings: list[Sibling]) -> ParallelConvs:
    first = siblings[0].conv
    kernel = "x".join(map(str, conv_geometry(first).kernel))  # type: ignore[union-attr]
    return ParallelConvs(tuple(siblings), first.inputs[0].name, kernel)


@graph_pass("fuse_parallel_convs", find_parallel_convs)
def fuse_parallel_convs(graph: gs.Graph) -> list[ParallelConvs]:
    """Fuse each set of >= 2 compatible sibling convs into one conv followed by a Split."""
    matches = find_parallel_convs(graph)
    namer = Namer(graph)
    for match in matches:
        _fuse(graph, list(match.siblings), namer)
    return matches


def _sibling(node: gs.Node, outputs: set[str]) -> Sibling | None:
    """A Conv that may join a horizontal fusion, with its parameters and fusable activation."""
    if node.op != "Conv" or len(node.inputs) < 2 or not node.outputs:
        return None
    geometry = conv_geometry(node)
    weight = constant_array(node.inputs[1])
    if (
        geometry is None
        or geometry.group != 1
        or weight is None
        or not np.issubdtype(weight.dtype, np.floating)
    ):
        return None
    has_bias = len(node.inputs) > 2 and not is_missing(node.inputs[2])
    bias = constant_array(node.inputs[2]) if has_bias else np.zeros(weight.shape[0], weight.dtype)
    if bias is None or bias.shape != (weight.shape[0],):
        return None
    out = node.outputs[0]
    if any(reader.op in ("Add", "Sum") for reader in out.outputs):
        return None  # keeps its Conv + residual Add fusion
    return Sibling(node, weight, bias, match_activation(out, outputs))


def _fuse(graph: gs.Graph, siblings: list[Sibling], namer: Namer) -> None:
    first = siblings[0].conv
    x = first.inputs[0]
    sizes = [s.weight.shape[0] for s in siblings]
    weight = new_constant(namer, f"{first.name}/wide_weight", np.concatenate([s.weight for s in siblings]))
    bias = new_constant(namer, f"{first.name}/wide_bias", np.concatenate([s.bias for s in siblings]))
    wide = gs.Variable(
        namer.take(f"{first.name}/wide"), dtype=first.outputs[0].dtype, shape=_wide_shape(siblings)
    )
    conv = gs.Node("Conv", namer.take(f"{first.name}/wide"), dict(first.attrs), [x, weight, bias], [wide])
    new_nodes = [conv]
    act = siblings[0].activation
    if act is not None:
        act_nodes, wide = clone_activation(act, wide, namer)
        new_nodes += act_nodes
    pieces = [s.output for s in siblings]
    for s in siblings:
        for node in (s.conv, *(s.activation.nodes if s.activation else ())):
            node.outputs.clear()
            node.inputs.clear()
    new_nodes.append(_split(graph, wide, pieces, sizes, namer, f"{first.name}/split"))
    graph.nodes.extend(new_nodes)


def _wide_shape(siblings: list[Sibling]) -> list[object] | None:
    shape = siblings[0].conv.outputs[0].shape
    if shape is None or len(shape) < 2:
        return None
    return [shape[0], sum(s.weight.shape[0] for s in siblings), *shape[2:]]


def _split(
    graph: gs.Graph, x: gs.Tensor, pieces: list[gs.Tensor], sizes: list[int], namer: Namer, base: str
) -> gs.Node:
    """Split along channels, sizes as an input (opset >= 13) or an attribute (11, 12)."""
    name = namer.take(base)
    if opset(graph) >= SPLIT_INPUT_OPSET:
        split = gs.Constant(namer.take(f"{base}/sizes"), np.array(sizes, np.int64))
        return gs.Node("Split", name, {"axis": 1}, [x, split], list(pieces))
    return gs.Node("Split", name, {"axis": 1, "split": list(sizes)}, [x], list(pieces))
