"""Concats of unlike ranges stay float: one shared INT8 scale cannot hold inputs whose ranges differ too much.

Placement gives a quantised Concat's inputs and output one threshold, the largest of the group
(`trtopt.quant.placement`, `trtopt.quant.qdq.shared_thresholds`), so that TensorRT can write the producers
straight into the output ("concatenation elimination", GTC 2017; TensorRT's explicit-quantization guide,
docs.nvidia.com/deeplearning/tensorrt/latest/inference-library/quantized-types-explicit-quantization.html,
on where Q/DQ go). That costs nothing when the inputs have like ranges. Giving each input its own scale
does not help by itself: the output of a quantised Concat still has one scale. ONNX Runtime's integer
Concat (com.microsoft QLinearConcat, onnxruntime docs/ContribOperators.md) takes a scale per input and one
for the output, i.e. it dequantises, joins and requantises onto the output's grid.

When the ranges are unlike, the smaller input is quantised on the larger one's grid:
with a range ratio k it keeps 127 / k of the 127 positive levels. A YOLO head that joins box coordinates
(0..640) and class scores (0..1) is the extreme case, k = 640: every score rounds to 0.

`UNLIKE_RATIO` = 16 is a judgement, not a cliff. Up to 16 the smaller input keeps at least 8 levels (3 bits):
a rounding step of at most 1/8 of its range, an RMS error of at most 1 / (8 sqrt 12) = 3.6 % of it (its
own scale would give 1 / (127 sqrt 12) = 0.23 %), and the Concat stays copy-free in TensorRT. Each doubling
beyond costs one more bit. The Concats that break models are far past it: pixel boxes next to
probabilities differ by 640x.

Such a Concat stays float, and so does its output: its inputs keep the thresholds of their own Q/DQ pairs
(the INT8 outputs of the layers that produce them, on the CPU backend), the Concat runs on dequantised
values, and the layers reading its output take it in float (their weights stay INT8). ONNX Runtime runs
that exactly (a float Concat between DequantizeLinear and QuantizeLinear nodes of different scales is
plain float math) and TensorRT accepts it (a strongly typed network runs what is float in the ONNX in
float; it only loses the copy-free Concat there). Graph outputs are never quantised, so a YOLO head's
final Concat of boxes and scores stays float by the same placement rule; this module covers the Concats
that placement would otherwise quantise.

Except where the Concat's output only flows into ops that move values (`trtopt.quant.gates.MOVEMENT_OPS`) whose
outputs are quantised again: ShuffleNet's channel shuffle (Concat -> Reshape -> Transpose -> Reshape -> Split ->
INT8 convs) rounds the joined tensor onto one grid two ops later whether the Concat is float or not, so keeping
it float keeps nothing finer and costs a float stretch (paddle ShuffleNetV2-swish, avx2: 12 of 16 Concats).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

import onnx_graphsurgeon as gs

from trtopt.quant.gates import MOVEMENT_OPS
from trtopt.quant.placement import QuantPlan

log = logging.getLogger(__name__)

UNLIKE_RATIO = 16.0


def unlike_ratio(ranges: list[float]) -> float:
    """Largest over smallest range (inf when one input is all zero and another is not)."""
    low, high = min(ranges), max(ranges)
    if high <= 0:
        return 1.0
    return high / low if low > 0 else float("inf")


def float_unlike_concats(graph: gs.Graph, plan: QuantPlan, ranges: Mapping[str, float]) -> QuantPlan:
    """`plan` without the shared groups of Concats whose inputs' `ranges` (tensor -> max|x| or threshold)
    differ by more than `UNLIKE_RATIO`: no Q/DQ on those Concats' inputs or output, and the reason in
    `float_layers`."""
    producers = {n.outputs[0].name: n for n in graph.nodes if n.op == "Concat" and n.outputs}
    kept, dropped_outputs, reasons = [], set(), {}
    quantized = {s.tensor for s in plan.sites if s.kind == "activation"}
    for group in plan.shared:
        concat = producers.get(group[0])
        inputs = [t for t in group[1:] if t in ranges]
        ratio = unlike_ratio([ranges[t] for t in inputs]) if len(inputs) > 1 else 1.0
        if concat is None or ratio <= UNLIKE_RATIO or _quantised_again(concat, quantized):
            kept.append(group)
            continue
        dropped_outputs.add(group[0])
        low, high = min(ranges[t] for t in inputs), max(ranges[t] for t in inputs)
        reasons[concat.name] = (
            f"Concat of unlike ranges ({low:.3g} to {high:.3g}, over {UNLIKE_RATIO:.0f}x: one INT8 scale "
            "cannot hold both)"
        )
        log.info("%s stays float: its inputs' ranges go from %.3g to %.3g", concat.name, low, high)
    if not reasons:
        return plan
    sites = tuple(
        s
        for s in plan.sites
        if not (s.role == "concat" and s.consumer in reasons)
        and not (s.kind == "activation" and s.tensor in dropped_outputs)
    )
    return replace(plan, sites=sites, shared=tuple(kept), float_layers={**plan.float_layers, **reasons})


def _quantised_again(concat: gs.Node, quantized: set[str]) -> bool:
    """Whether every reader of `concat`'s output is a movement op (not another Concat) whose outputs are all
    quantised (see the module)."""
    readers = concat.outputs[0].outputs
    moved = [r for r in readers if r.op in MOVEMENT_OPS and r.op != "Concat"]
    return bool(readers) and len(moved) == len(readers) and all(t.name in quantized for r in moved for t in r.outputs)
