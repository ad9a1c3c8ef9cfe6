"""Thin layers in INT8 where they pay on the backend's kernels: the Q/DQ model a build offers for timing.

The CPU backends keep layers with fewer than 16 channels float, and a depthwise conv whose input a float layer
writes (`QuantConfig.min_channels`, `float_leading_depthwise`). Whether that pays is a question of speed, per
model, and of fidelity (issue #45; avx2 EPYC, ONNX Runtime 1.32.0, 1 thread, interleaved, quiet machine):

- the real-export corpus's MobileNetV2s with their stem and first depthwise conv in INT8 ran 4-7% faster at
  batch 8 (Keras MobileNetV2: 56.5 ms against 60.7, ONNX Runtime's own quantizer's plan 56.7), as fast at batch 1;
- the MobileNetV3s' thin squeeze-excite and 16-channel entry layers ran slower in INT8 (torch: the speed check
  then wrote the float plan, 1.00x FP32's speed where it had 1.28x / 1.16x; paddle 1.08x / 0.93x against 1.16x /
  1.16x), and so did the hand-landmark model's (0.96x against 1.13x);
- the demo's (EfficientNet-Lite0, pretrained) stem in INT8 cost 3 points of top-1 agreement with FP32 on 160
  held-out photos (96.9% -> 93.8%; relative error 0.0618 -> 0.0835 on the search samples).

A step that took the thin layers wherever they measured as faithful (`trtopt.search.thin`, withdrawn in git
2393b42) won the first and lost the second. So the build places Q/DQ as before, and where the backend asks
(`QuantConfig.widen_thin`: the CPU backends, where the user set neither setting) it also writes the same Q/DQ
model with those thin layers in INT8 (`wider_model`: the same thresholds, the same layers kept float by the
sensitivity search or --exclude). The backend's speed check (`trtopt.backend.cpu.choice`) builds, verifies and
times it beside the plan, and keeps it only where it runs faster and is as faithful.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import onnx
import onnx_graphsurgeon as gs

from trtopt.frontend import copy_graph, onnx_from_graph
from trtopt.quant.bias import correct_biases_for_build
from trtopt.quant.concat_ranges import float_unlike_concats
from trtopt.quant.config import QuantConfig
from trtopt.quant.placement import QuantPlan, plan_quantization
from trtopt.quant.qdq import insert_qdq


@dataclass(frozen=True)
class Wider:
    """The plan's Q/DQ model with its thin layers in INT8 too: the model, those layers, the activation thresholds
    of its Q/DQ pairs (the plan's and the pairs the thin layers add), and the layers whose biases were corrected."""

    model: onnx.ModelProto
    layers: tuple[str, ...]
    thresholds: Mapping[str, float] = field(default_factory=dict)
    bias_corrected: tuple[str, ...] = ()


def wider_model(
    graph: gs.Graph, quant: QuantConfig, plan: QuantPlan, amax: Mapping[str, float], calibration: Any,
    seven_bit: Collection[str],
) -> Wider | None:  # fmt: skip
    """The Q/DQ model of `graph` (not yet quantised) with `plan`'s layers and the thin layers `quant` keeps float
    in INT8 (see the module); None where `quant` does not ask for it or there is no such layer."""
    if not quant.widen_thin:
        return None
    wide = replace(quant, min_channels=1, float_leading_depthwise=False, widen_thin=False)
    thin = set(plan_quantization(graph, wide).quantized_layers) - set(plan_quantization(graph, quant).quantized_layers)
    if not thin:
        return None
    kept = {name: why for name, why in plan.float_layers.items() if name not in thin}  # the search's, --exclude's
    wider = plan_quantization(graph, replace(wide, exclude=(*quant.exclude, *kept)))
    wider = replace(wider, float_layers={**wider.float_layers, **kept})
    wider = float_unlike_concats(graph, wider, calibration.ranges)
    layers = tuple(name for name in wider.quantized_layers if name in thin)
    if not layers:
        return None
    copy = copy_graph(graph)  # weights shared: bias correction and insert_qdq write new constants
    bias = correct_biases_for_build(copy, wider, calibration, seven_bit) if quant.bias_correction else None
    report = insert_qdq(copy, wider, amax, seven_bit, quant.min_amax)
    return Wider(onnx_from_graph(copy), layers, dict(report.thresholds), tuple(bias.corrected) if bias else ())
