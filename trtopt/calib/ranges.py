"""What the graph says about a tensor's range, before any data is seen.

A tensor produced by a bounded activation (ReLU6 as Clip(0, 6), Sigmoid, HardSigmoid), directly or
through ops that cannot widen its range (Pad with zeros, pooling, reshapes), has a hard upper bound.
Saturating such a tensor below its observed maximum clips the mass that piles up at the bound — the
most informative values of a ReLU6 network — so its threshold is the observed maximum instead.
Measured on EfficientNet-Lite0 (ReLU6 everywhere), entropy calibration on 154 photos: without this
rule the logits' error (1 - cosine against FP32) is about four times larger, 0.019 instead of 0.005
(notebooks/02_calibration.ipynb).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from trtopt.passes.query import clip_bounds

BOUNDED_OPS = {"Sigmoid", "HardSigmoid", "Tanh", "Softmax"}
# Ops whose output values are taken from, or averaged over, their data input's values, so a bound on
# the input (an upper bound here, non-negativity in the CPU lowering) holds for the output too.
VALUE_PRESERVING_OPS = {
    "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Reshape", "Flatten", "Transpose",
    "Squeeze", "Unsqueeze", "Identity", "Resize", "Upsample", "Split", "Slice", "Concat", "DepthToSpace",
    "SpaceToDepth", "Gather", "Tile", "Expand", "ReduceMax", "ReduceMean", "QuantizeLinear", "DequantizeLinear",
}  # fmt: skip


def bounded_tensors(graph: gs.Graph) -> set[str]:
    """Names of tensors whose values are bounded by an activation's fixed range."""
    bounded: set[str] = set()
    for node in graph.nodes:  # passes leave the graph topologically sorted
        if node.op in BOUNDED_OPS or (node.op == "Clip" and _has_upper_bound(node)):
            bounded.update(t.name for t in node.outputs)
        elif (node.op in VALUE_PRESERVING_OPS or node.op == "Pad") and _pads_with_zero(node):
            data = node.inputs if node.op == "Concat" else node.inputs[:1]
            if data and all(t.name in bounded for t in data):
                bounded.update(t.name for t in node.outputs)
    return bounded


def _has_upper_bound(clip: gs.Node) -> bool:
    high = clip_bounds(clip)[1]
    return high is not None and bool(np.isfinite(high))


def _pads_with_zero(node: gs.Node) -> bool:
    if node.op != "Pad":
        return True
    if node.attrs.get("mode", "constant") != "constant":
        return True  # reflect / edge padding repeats values already in range
    value = node.inputs[2] if len(node.inputs) > 2 else None
    if value is None or (isinstance(value, gs.Variable) and not value.name):
        return True
    return isinstance(value, gs.Constant) and float(np.asarray(value.values).reshape(-1)[0]) == 0.0
