"""What `trtopt optimize` would do to a model, pass by pass, and what it leaves unfused.

`fusion_report` runs the optimiser on a copy of the graph: every pass reports the matches of its own
matcher (`trtopt.passes`: `find_*(graph) -> list[Match]`), so `inspect` and `optimize` show the same
rewrites and the same fusion groups by construction. Next to them, a short list of what trtopt finds
but does not fuse (`find_unfused`), so nothing is shown as an opportunity that no pass takes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import onnx_graphsurgeon as gs

from trtopt.passes import OptimizeResult, find_fusion_groups, optimize
from trtopt.passes.activations import SINGLE_ACTIVATIONS
from trtopt.passes.groups import GROUP_HEADS
from trtopt.passes.query import conv_geometry, graph_output_names, sole_consumer

# Elementwise activations a layer can be followed by that trtopt's activation matcher does not take
# (`trtopt.passes.activations`), so their layer and they stay two kernels in its cost model.
UNFUSED_ACTIVATIONS = ("Elu", "Selu", "Celu", "Softplus", "Softsign", "ThresholdedRelu", "Gelu", "Mish", "PRelu")


@dataclass(frozen=True)
class NotFused:
    """Something that looks fusable but that no trtopt pass fuses, and why."""

    kind: str
    nodes: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class FusionReport:
    result: OptimizeResult
    not_fused: tuple[NotFused, ...]

    def to_dict(self) -> dict[str, Any]:
        return {**self.result.to_dict(), "not_fused": [asdict(n) for n in self.not_fused]}


def fusion_report(graph: gs.Graph) -> FusionReport:
    """The optimiser's report for `graph` (left unchanged) and what stays unfused after it."""
    result = optimize(graph)
    return FusionReport(result, tuple(find_unfused(result.graph)))


def find_unfused(graph: gs.Graph) -> list[NotFused]:
    """Layers followed by an activation trtopt does not fuse, and sibling grouped convs."""
    return _unfused_activations(graph) + _sibling_grouped_convs(graph)


def _unfused_activations(graph: gs.Graph) -> list[NotFused]:
    """A fusion group's output, or a lone layer's, read only by an activation trtopt does not fuse."""
    by_name = {n.name: n for n in graph.nodes}
    ends = {g.output: by_name[g.nodes[0]] for g in find_fusion_groups(graph)}
    grouped = {id(head) for head in ends.values()}
    heads = [n for n in graph.nodes if n.op in GROUP_HEADS and n.outputs and id(n) not in grouped]
    ends.update({n.outputs[0].name: n for n in heads})
    outputs, tensors = graph_output_names(graph), graph.tensors()
    known = ", ".join(sorted({*SINGLE_ACTIVATIONS.values(), "relu6", "silu"}))
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    found = []
    for name, head in sorted(ends.items(), key=lambda item: order[id(item[1])]):
        reader = sole_consumer(tensors[name], outputs)
        if reader is not None and reader.op in UNFUSED_ACTIVATIONS:
            reason = f"{reader.op} runs as a kernel of its own: trtopt's fusion groups take {known}"
            found.append(NotFused(f"{head.op.lower()}+{reader.op.lower()}", (head.name, reader.name), reason))
    return found


def _sibling_grouped_convs(graph: gs.Graph) -> list[NotFused]:
    families: dict[tuple[int, object], list[gs.Node]] = {}
    for node in graph.nodes:
        geometry = conv_geometry(node) if node.op == "Conv" else None
        if geometry is not None and geometry.group > 1:
            families.setdefault((id(node.inputs[0]), geometry), []).append(node)
    reason = (
        "fuse_parallel_convs fuses only group=1 convs: in one wide grouped conv the siblings' channels "
        "would interleave, so no contiguous Split could give them back"
    )
    return [
        NotFused("sibling_grouped_convs", tuple(n.name for n in convs), reason)
        for convs in families.values()
        if len(convs) >= 2
    ]
