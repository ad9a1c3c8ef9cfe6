"""Model analysis: what a model contains (I/O, ops, parameters, MACs) and what the optimiser does to it."""

from trtopt.analysis.fusions import FusionReport, NotFused, find_unfused, fusion_report
from trtopt.analysis.summary import LayerCost, ModelSummary, TensorSummary, summarize

__all__ = [
    "FusionReport",
    "LayerCost",
    "ModelSummary",
    "NotFused",
    "TensorSummary",
    "find_unfused",
    "fusion_report",
    "summarize",
]
