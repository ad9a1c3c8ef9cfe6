"""Derived facts the quantizer and the reports read: fusion groups and concat groups.

Both are pure functions of a graph (no pass state), so they can be computed on any graph, before or
after optimisation, and give the same answer for the same graph.

- A *fusion group* is what TensorRT runs as one kernel: Conv/ConvTranspose + activation, Gemm +
  activation, or Conv + residual Add (+ activation), with the Add in the conv's epilogue (NVIDIA,
  "TensorRT Developer Guide": Layer fusion). The conv's own bias is part of the Conv node.
- A *concat group* is a Concat, its inputs, and whether its producers can write straight into
  slices of its output (then all inputs must share one INT8 scale, DESIGN.md "Where Q/DQ go").
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from trtopt.passes.activations import Activation, match_activation
from trtopt.passes.query import CONV_OPS, graph_output_names, producer, same_shape, sole_consumer

GROUP_HEADS = (*CONV_OPS, "Gemm")


@dataclass(frozen=True)
class FusionGroup:
    """Nodes run as one kernel. `nodes` are node names, conv first; `input` is the activation tensor
    entering the conv; `residual` the other operand of a fused Add; `output` the tensor leaving."""

    kind: str
    nodes: tuple[str, ...]
    input: str
    residual: str | None
    output: str


@dataclass(frozen=True)
class ConcatGroup:
    """A Concat's output, its inputs in order, and whether producers can write into its slices."""

    output: str
    inputs: tuple[str, ...]
    in_place: bool


def find_fusion_groups(graph: gs.Graph) -> list[FusionGroup]:
    """Every fusion group of the graph, in node order; each node belongs to at most one group."""
    outputs = graph_output_names(graph)
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    taken: set[int] = set()
    found: list[tuple[int, FusionGroup]] = []
    for node in graph.nodes:
        if node.op == "Add":
            residual = _residual_group(node, outputs, order)
            if residual is not None:
                conv, group = residual
                taken.add(id(conv))
                found.append((order[id(conv)], group))
    for node in graph.nodes:
        if node.op in GROUP_HEADS and id(node) not in taken and node.outputs:
            act = match_activation(node.outputs[0], outputs)
            if act is not None:
                found.append((order[id(node)], _group(node, None, act, None)))
    return [group for _, group in sorted(found, key=lambda item: item[0])]


def _residual_group(
    add: gs.Node, outputs: set[str], order: dict[int, int]
) -> tuple[gs.Node, FusionGroup] | None:
    """Conv + Add(+ activation). When both operands come from convs, the one computed last fuses:
    the other operand must already exist when the epilogue runs."""
    if len(add.inputs) != 2 or not all(isinstance(t, gs.Variable) for t in add.inputs):
        return None
    a, b = add.inputs
    if a is b or not (same_shape(a, b) and same_shape(a, add.outputs[0])):
        return None
    candidates = []
    for branch, other in ((a, b), (b, a)):
        conv = producer(branch)
        if conv is not None and conv.op in CONV_OPS and sole_consumer(branch, outputs) is add:
            candidates.append((order[id(conv)], conv, other))
    if not candidates:
        return None
    _, conv, other = max(candidates, key=lambda item: item[0])
    act = match_activation(add.outputs[0], outputs)
    return conv, _group(conv, add, act, other.name)


def _group(head: gs.Node, add: gs.Node | None, act: Activation | None, residual: str | None) -> FusionGroup:
    parts = [head.op.lower()] + (["add"] if add is not None else []) + ([act.name] if act else [])
    nodes = (head, *((add,) if add is not None else ()), *(act.nodes if act else ()))
    last = act.output if act else (add.outputs[0] if add is not None else head.outputs[0])
    return FusionGroup(
        kind="+".join(parts),
        nodes=tuple(str(n.name) for n in nodes),
        input=head.inputs[0].name,
        residual=residual,
        output=last.name,
    )


def find_concat_groups(graph: gs.Graph) -> list[ConcatGroup]:
    """Every Concat with its inputs; `in_place` when each input is a distinct intermediate tensor
    written by a node and read only by this Concat (no graph input, constant or graph output)."""
    outputs = graph_output_names(graph)
    groups = []
    for node in graph.nodes:
        if node.op != "Concat" or not node.outputs:
            continue
        inputs = tuple(t.name for t in node.inputs)
        in_place = len(set(inputs)) == len(inputs) and all(
            producer(t) is not None and sole_consumer(t, outputs) is node for t in node.inputs
        )
        groups.append(ConcatGroup(output=node.outputs[0].name, inputs=inputs, in_place=in_place))
    return groups
