"""A static cost estimate for the reports: kernel launches and bytes of intermediate tensors.

The model is TensorRT's execution, not ONNX Runtime's: one launch per fusion group (NVIDIA, "TensorRT
Developer Guide", Layer fusion), none for shape-only ops, a Concat computed in place or a Split into
contiguous slices (every dimension before the axis is 1: the pieces are views), one for every other
node. An intermediate tensor costs its bytes once, written by one kernel and read by the next;
tensors inside a fusion group, and Concat inputs written straight into the output, never reach memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from trtopt.passes.groups import ConcatGroup, FusionGroup, find_concat_groups, find_fusion_groups

# Ops that only relabel memory (no kernel) in TensorRT, or are dropped at inference.
FREE_OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout", "Constant", "Shape"}


@dataclass(frozen=True)
class GraphCost:
    nodes: int
    fused_layers: int  # fusion groups (each one kernel made of >= 2 nodes)
    fused_nodes: int  # nodes inside those groups
    kernel_launches: int
    intermediate_bytes: int
    unknown_tensors: int  # intermediates whose size is unknown (dynamic shape), left out of the bytes


def estimate_cost(
    graph: gs.Graph,
    fusion_groups: list[FusionGroup] | None = None,
    concat_groups: list[ConcatGroup] | None = None,
) -> GraphCost:
    fusion_groups = find_fusion_groups(graph) if fusion_groups is None else fusion_groups
    concat_groups = find_concat_groups(graph) if concat_groups is None else concat_groups
    in_place = [g for g in concat_groups if g.in_place]
    outputs = {t.name for t in graph.outputs}
    hidden = _inside_groups(graph, fusion_groups) | {name for g in in_place for name in g.inputs}
    working = [n for n in graph.nodes if n.op not in FREE_OPS and not _is_view_split(n)]
    fused_nodes = sum(len(g.nodes) for g in fusion_groups)
    launches = len(working) - (fused_nodes - len(fusion_groups)) - len(in_place)
    total, unknown = 0, 0
    for node in working:
        for tensor in node.outputs:
            if tensor.name in outputs or tensor.name in hidden or not tensor.outputs:
                continue
            size = _bytes(tensor)
            total += size or 0
            unknown += size is None
    return GraphCost(len(graph.nodes), len(fusion_groups), fused_nodes, launches, total, unknown)


def _is_view_split(node: gs.Node) -> bool:
    shape = node.inputs[0].shape if node.op == "Split" and node.inputs else None
    if shape is None:
        return False
    axis = int(node.attrs.get("axis", 0))
    axis = axis + len(shape) if axis < 0 else axis
    return all(isinstance(d, int) and d == 1 for d in shape[:axis])


def _inside_groups(graph: gs.Graph, groups: list[FusionGroup]) -> set[str]:
    by_name = {n.name: n for n in graph.nodes}
    inside: set[str] = set()
    for group in groups:
        for name in group.nodes:
            inside.update(t.name for t in by_name[name].outputs if t.name != group.output)
    return inside


def _bytes(tensor: gs.Tensor) -> int | None:
    """Bytes of one sample: a symbolic leading (batch) dimension counts as 1, any other unknown dim
    makes the size unknown."""
    shape, dtype = tensor.shape, tensor.dtype
    if shape is not None and len(shape) > 0 and isinstance(shape[0], str):
        shape = [1, *shape[1:]]
    if shape is None or dtype is None or not all(isinstance(d, int) and d >= 0 for d in shape):
        return None
    if isinstance(dtype, int):  # onnx-graphsurgeon keeps ONNX's enum for types numpy lacks (bfloat16)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)  # ml_dtypes' types, which have sizes
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
