"""Graph passes: BatchNorm folding, vertical (CBR) and horizontal conv fusion, concat elimination.

    result = optimize(graph)                      # DEFAULT_ORDER; or passes=["fold_batchnorm"]
    model = onnx_from_graph(result.graph); record_metadata(model, result)

Each pass is registered by name in `PASSES`, takes a gs.Graph, edits it in place, leaves it cleaned,
sorted and uniquely named, and returns a `PassReport`. Fusion and concat groups are derived from any
graph by `find_fusion_groups` / `find_concat_groups` and travel with the model as metadata.
"""

from trtopt.passes import (  # noqa: F401 (register)
    eliminate_concat,
    fold_batchnorm,
    fold_pad,
    fuse_cbr,
    fuse_parallel_convs,
)
from trtopt.passes.base import PASSES, PassReport, Rewrite
from trtopt.passes.cost import GraphCost, estimate_cost
from trtopt.passes.groups import ConcatGroup, FusionGroup, find_concat_groups, find_fusion_groups
from trtopt.passes.metadata import METADATA_KEY, OptimizerMetadata, read_metadata, record_metadata
from trtopt.passes.pipeline import DEFAULT_ORDER, OptimizeResult, optimize

__all__ = [
    "DEFAULT_ORDER",
    "METADATA_KEY",
    "PASSES",
    "ConcatGroup",
    "FusionGroup",
    "GraphCost",
    "OptimizeResult",
    "OptimizerMetadata",
    "PassReport",
    "Rewrite",
    "estimate_cost",
    "find_concat_groups",
    "find_fusion_groups",
    "optimize",
    "read_metadata",
    "record_metadata",
]
