"""Vertical fusion: Conv + bias + activation (and Conv + residual Add + activation) as one group.

The graph stays standard ONNX, which TensorRT's parser re-fuses on its own; this pass only puts the
graph in the form the fusion matchers and TensorRT recognise, then records the groups:
- a per-channel constant Add after a Conv/ConvTranspose/Gemm becomes the layer's bias;
- a two-input Sum (Caffe2 exports write residuals that way) becomes Add;
- x*HardSigmoid(x; 1/6, 1/2), how exporters wrote HardSwish before opset 14, becomes HardSwish
  when the model's opset has it (one node instead of two).
The groups themselves are derived by `find_fusion_groups`, so the quantizer can recompute them; the
pass records them in its report (a graph already in this form comes out unchanged, with its groups).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from trtopt.passes.activations import match_activation
from trtopt.passes.base import Match, Rewrite, graph_pass
from trtopt.passes.fold_batchnorm import AffineFold, apply_affine_folds, find_affine_folds
from trtopt.passes.groups import find_fusion_groups
from trtopt.passes.query import graph_output_names, opset

HARD_SWISH_OPSET = 14


@dataclass(frozen=True, eq=False)
class SumToAdd(Match):
    """A two-input Sum, written as the Add the residual matcher (and TensorRT's parser) expect."""

    node: gs.Node
    kind = "sum_to_add"

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        return (self.node,)

    def describe(self) -> str:
        return f"Sum {self.node.name!r} written as Add"


@dataclass(frozen=True, eq=False)
class HardSwishMerge(Match):
    """x*HardSigmoid(x; 1/6, 1/2): one HardSwish node where the opset has it."""

    gate: gs.Node
    mul: gs.Node
    kind = "hard_swish"

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        return (self.gate, self.mul)

    def describe(self) -> str:
        return f"x*HardSigmoid(x) at {self.mul.name!r} -> HardSwish"


def find_cbr_forms(graph: gs.Graph) -> list[Match]:
    """The forms fuse_cbr rewrites, in the order it rewrites them: bias Adds, Sums, HardSwish gates."""
    found: list[Match] = list(find_affine_folds(graph, ("Add",), kind="fold_bias"))
    found += [SumToAdd(n) for n in graph.nodes if n.op == "Sum" and len(n.inputs) == 2 and n.outputs]
    if opset(graph) >= HARD_SWISH_OPSET:
        found += _hard_swish_gates(graph)
    return found


def _hard_swish_gates(graph: gs.Graph) -> list[HardSwishMerge]:
    outputs = graph_output_names(graph)
    found = []
    for gate in graph.nodes:
        if gate.op != "HardSigmoid" or not gate.inputs:
            continue
        act = match_activation(gate.inputs[0], outputs)
        if act is not None and act.name == "hard_swish" and len(act.nodes) == 2 and act.nodes[0] is gate:
            found.append(HardSwishMerge(gate, act.nodes[1]))
    return found


@graph_pass("fuse_cbr", find_cbr_forms)
def fuse_cbr(graph: gs.Graph) -> tuple[list[Match], list[Rewrite]]:
    """Canonicalise bias, residual and HardSwish forms, then record the fusion groups found."""
    matches = find_cbr_forms(graph)
    apply_affine_folds(graph, [m for m in matches if isinstance(m, AffineFold)])
    for match in matches:
        if isinstance(match, SumToAdd):
            match.node.op = "Add"
        elif isinstance(match, HardSwishMerge):
            _merge_hard_swish(graph, match)
    groups = [Rewrite(g.kind, g.nodes, f"{g.kind}: {' -> '.join(g.nodes)}") for g in find_fusion_groups(graph)]
    return matches, groups


def _merge_hard_swish(graph: gs.Graph, match: HardSwishMerge) -> None:
    x, out = match.gate.inputs[0], match.mul.outputs[0]
    for node in (match.gate, match.mul):
        node.outputs.clear()
        node.inputs.clear()
    graph.nodes.append(gs.Node("HardSwish", match.mul.name, {}, [x], [out]))
