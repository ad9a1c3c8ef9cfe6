"""`optimize`: run passes in order on a copy of a graph, then derive groups and the cost summary."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import onnx_graphsurgeon as gs

from trtopt.frontend.copying import copy_graph
from trtopt.frontend.edit import canonicalize
from trtopt.passes.base import PASSES, PassReport
from trtopt.passes.cost import GraphCost, estimate_cost
from trtopt.passes.groups import ConcatGroup, FusionGroup, find_concat_groups, find_fusion_groups

# The generic clean-up first: ONNX Runtime's basic level, then the no-op nodes and layout round trips it leaves
# (they hide every pattern below from its matcher). Squeezes next
# (tf2onnx's Conv1D: they hide a conv's bias and activation) and the shape-op chains left, then Pad and BN (they
# hide the conv's input and its conv-activation adjacency), and the affine ops left before a conv; horizontal
# fusion before concat elimination (it creates Split->Concat round trips); CBR last, so it records groups on the
# final graph. `rewrite_prelu` is not in the default list: it pays on ONNX Runtime's kernels (the CPU backend adds
# it, `Backend.passes`), while TensorRT runs PRelu as one layer.
DEFAULT_ORDER = (
    "simplify",
    "remove_noops",
    "sink_transposes",
    "hoist_transposes",
    "sink_squeeze",
    "collapse_reshapes",
    "fold_pad",
    "fold_batchnorm",
    "fold_input_affine",
    "merge_branches",
    "fuse_parallel_convs",
    "eliminate_concat",
    "fuse_cbr",
)


@dataclass(frozen=True)
class OptimizeResult:
    graph: gs.Graph
    reports: tuple[PassReport, ...]
    fusion_groups: tuple[FusionGroup, ...]
    concat_groups: tuple[ConcatGroup, ...]
    before: GraphCost
    after: GraphCost
    seconds: float

    @property
    def nodes_before(self) -> int:
        return self.before.nodes

    @property
    def nodes_after(self) -> int:
        return self.after.nodes

    @property
    def launches_saved(self) -> int:
        return self.before.kernel_launches - self.after.kernel_launches

    @property
    def bytes_saved(self) -> int:
        return self.before.intermediate_bytes - self.after.intermediate_bytes

    @property
    def changed(self) -> bool:
        return any(r.changed for r in self.reports)

    def to_dict(self, *, details: bool = True) -> dict[str, Any]:
        """The optimiser's report, one format everywhere: the plan header keeps the summary
        (`details=False`); `trtopt optimize --json` and `trtopt inspect --json` add every match, the
        cost before and after, and the groups."""
        summary: dict[str, Any] = {
            "passes": [r.name for r in self.reports],
            "changes": {r.name: r.counts() for r in self.reports},
            "nodes": [self.nodes_before, self.nodes_after],
            "launches_saved": self.launches_saved,
            "intermediate_bytes_saved": self.bytes_saved,
            "fusion_groups": len(self.fusion_groups),
        }
        if not details:
            return summary
        return {
            **summary,
            "recorded": {r.name: r.recorded_counts() for r in self.reports},
            "seconds": self.seconds,
            "reports": [r.to_dict() for r in self.reports],
            "before": asdict(self.before),
            "after": asdict(self.after),
            "groups": self.groups_dict(),
        }

    def groups_dict(self) -> dict[str, list[dict[str, Any]]]:
        return {
            "fusion": [asdict(g) for g in self.fusion_groups],
            "concat": [asdict(g) for g in self.concat_groups],
        }


def optimize(graph: gs.Graph, passes: Sequence[str] | None = None) -> OptimizeResult:
    """Run `passes` (None: `DEFAULT_ORDER`) on a copy of `graph`; the caller's graph is not changed.

    Unknown pass names raise `UnknownNameError` listing the valid ones, before anything runs.
    """
    start = time.perf_counter()
    names = DEFAULT_ORDER if passes is None else tuple(passes)
    functions = [PASSES.get(name) for name in names]
    work = canonicalize(copy_graph(graph))
    before = estimate_cost(work)
    reports = tuple(fn(work) for fn in functions)
    fusion_groups = find_fusion_groups(work)
    concat_groups = find_concat_groups(work)
    after = estimate_cost(work, fusion_groups, concat_groups)
    return OptimizeResult(
        graph=work,
        reports=reports,
        fusion_groups=tuple(fusion_groups),
        concat_groups=tuple(concat_groups),
        before=before,
        after=after,
        seconds=time.perf_counter() - start,
    )
