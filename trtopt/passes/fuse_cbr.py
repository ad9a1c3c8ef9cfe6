"""Vertical fusion: Conv + bias + activation (and Conv + residual Add + activation) as one group.

The graph stays standard ONNX, which TensorRT's parser re-fuses on its own; this pass only puts the
graph in the form the fusion matchers and TensorRT recognise, then records the groups:
- a per-channel constant Add after a Conv/ConvTranspose/Gemm becomes the layer's bias;
- a two-input Sum (Caffe2 exports write residuals that way) becomes Add;
- x*HardSigmoid(x; 1/6, 1/2), how exporters wrote HardSwish before opset 14, becomes HardSwish
  when the model's opset has it (one node instead of two).
The groups themselves are derived by `find_fusion_groups`, so the quantizer can recompute them.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from trtopt.passes.activations import match_activation
from trtopt.passes.base import Rewrite, graph_pass
from trtopt.passes.edit import Namer
from trtopt.passes.fold_batchnorm import LINEAR_OPS, fold_followers
from trtopt.passes.groups import find_fusion_groups
from trtopt.passes.query import graph_output_names, opset

HARD_SWISH_OPSET = 14


@graph_pass("fuse_cbr")
def fuse_cbr(graph: gs.Graph) -> tuple[list[Rewrite], list[str]]:
    """Canonicalise bias, residual and HardSwish forms, then report the fusion groups found."""
    outputs = graph_output_names(graph)
    namer = Namer(graph)
    rewrites: list[Rewrite] = []
    for node in list(graph.nodes):
        if node.op in LINEAR_OPS and node.outputs:
            for rewrite in fold_followers(node, outputs, namer, ("Add",)):
                rewrites.append(Rewrite("fold_bias", rewrite.nodes, rewrite.detail))
        elif node.op == "Sum" and len(node.inputs) == 2:
            node.op = "Add"
            rewrites.append(Rewrite("sum_to_add", (node.name,), f"Sum {node.name!r} written as Add"))
    if opset(graph) >= HARD_SWISH_OPSET:
        rewrites += _merge_hard_swish(graph, outputs)
    groups = [f"{g.kind}: {' -> '.join(g.nodes)}" for g in find_fusion_groups(graph)]
    return rewrites, groups


def _merge_hard_swish(graph: gs.Graph, outputs: set[str]) -> list[Rewrite]:
    rewrites = []
    for gate in list(graph.nodes):
        if gate.op != "HardSigmoid" or not gate.inputs:
            continue
        act = match_activation(gate.inputs[0], outputs)
        if act is None or act.name != "hard_swish" or len(act.nodes) != 2 or act.nodes[0] is not gate:
            continue
        mul = act.nodes[1]
        x, out = gate.inputs[0], mul.outputs[0]
        for node in act.nodes:
            node.outputs.clear()
            node.inputs.clear()
        graph.nodes.append(gs.Node("HardSwish", mul.name, {}, [x], [out]))
        rewrites.append(
            Rewrite("hard_swish", (gate.name, mul.name), f"x*HardSigmoid(x) at {mul.name!r} -> HardSwish")
        )
    return rewrites
