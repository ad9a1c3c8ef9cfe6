"""Model analysis: what a model contains (I/O, ops, parameters, MACs) and where it can be fused."""

from trtopt.analysis.opportunities import (
    ConcatJoin,
    ConvActivation,
    ConvBatchNorm,
    ConvResidualAdd,
    Match,
    SiblingConvs,
    find_opportunities,
)
from trtopt.analysis.summary import LayerCost, ModelSummary, TensorSummary, summarize

__all__ = [
    "ConcatJoin",
    "ConvActivation",
    "ConvBatchNorm",
    "ConvResidualAdd",
    "LayerCost",
    "Match",
    "ModelSummary",
    "SiblingConvs",
    "TensorSummary",
    "find_opportunities",
    "summarize",
]
