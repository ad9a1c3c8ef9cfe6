"""Graph passes: Pad and BatchNorm folding, vertical (CBR) and horizontal conv fusion, concat elimination.

    result = optimize(graph)                      # DEFAULT_ORDER; or passes=["fold_batchnorm"]
    model = onnx_from_graph(result.graph); record_metadata(model, result)
    PASSES.get("fold_pad").find(graph)            # what the pass would rewrite, without rewriting

Each pass is registered by name in `PASSES` with its matcher (`find_*(graph) -> list[Match]`), takes a
gs.Graph, rewrites exactly what its matcher finds, leaves the graph cleaned, sorted and uniquely
named, and returns a `PassReport`. Fusion and concat groups are derived from any graph by
`find_fusion_groups` / `find_concat_groups` and travel with the model as metadata.

`config.py` is the graph stage's entry (`GraphConfig`, `load_graph`: the front end, its checks and the shapes
array data fixes), and `check.py` checks the optimised graph against the model file in ONNX Runtime.
"""

from trtopt.passes import (  # noqa: F401 (register)
    channel_shuffle,
    collapse_reshapes,
    eliminate_concat,
    fold_batchnorm,
    fold_input_affine,
    fold_pad,
    fuse_cbr,
    fuse_parallel_convs,
    hoist_transposes,
    merge_branches,
    remove_noops,
    rewrite_hard_swish,
    rewrite_prelu,
    simplify,
    sink_squeeze,
    sink_transposes,
)
from trtopt.passes.base import PASSES, GraphPass, Match, PassReport, Rewrite
from trtopt.passes.cost import GraphCost, estimate_cost
from trtopt.passes.groups import ConcatGroup, FusionGroup, find_concat_groups, find_fusion_groups
from trtopt.passes.metadata import METADATA_KEY, record_metadata
from trtopt.passes.pipeline import DEFAULT_ORDER, OptimizeResult, optimize

__all__ = [
    "DEFAULT_ORDER",
    "METADATA_KEY",
    "PASSES",
    "ConcatGroup",
    "FusionGroup",
    "GraphCost",
    "GraphPass",
    "Match",
    "OptimizeResult",
    "PassReport",
    "Rewrite",
    "estimate_cost",
    "find_concat_groups",
    "find_fusion_groups",
    "optimize",
    "record_metadata",
]
