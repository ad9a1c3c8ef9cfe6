"""Layers whose INT8 tensor would round most of its non-zero values to zero stay float.

One INT8 scale per activation tensor (T / 127, T the calibrated threshold) holds values from T / 254 up to
T: about two and a half decades. Most activations fit: a ReLU output's small values are few and near-zero
pre-activations that matter little. Some do not. LORE's table-cell detector (docs/holdout.md, lore-detect)
has a heat-map head whose last 3x3 conv writes a ReLU output whose non-zero values run from about 5 to
4.4e5 (median 600); the 1x1 conv after it sums 64 of them into logits, where the background's -37 is the
small difference of large terms. On the grid of any threshold near the tail's size, most background
positions round to zero in all 64 channels, the logit falls back to the conv's bias (-1.69, just above the
package's threshold logit -1.73) and 65% of the positions became "cells" (278,492 against FP32's 678),
while the output's cosine (0.96) stayed moderate: the extreme values set it. One scale cannot serve such a
tensor: a threshold low enough to keep the background (about 1e3) clips a quarter of the non-zero values,
and the large values are what the output's error and cosine (and auto's scoring) are made of.

The rule, from the calibration histogram alone: when more than `UNDERFLOW_SHARE` of a tensor's non-zero
calibration values lie below half a step (|x| < T / 254, where the INT8 grid rounds them to exactly zero),
the layers that would read or write it in INT8 stay float: its consumers, and for an output pair (a backend
whose INT8 kernels write INT8, `QuantConfig.quantize_outputs`) the layer whose kernel writes it. One half is
not fitted to a model: past it the INT8 tensor is mostly zeros where FP32 has values (its median non-zero
magnitude rounds to 0). Exact zeros (a ReLU's) do not count: the grid holds them exactly.

Residual and Concat pairs are left alone (they have no single layer to keep float); a calibration without
histograms (`--method max`, a TensorRT cache, a trtopt JSON cache: it keeps thresholds only) skips the rule,
so a build from a cache can keep such a layer INT8. The margin is thin on the one model that motivated it:
on LORE's 8 calibration pages the heat-map tensor is at 61%, the next (the conv input before it) at 42%,
and that next tensor costs cells too (docs/holdout.md), below this bar.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from trtopt.calib.thresholds import QMAX

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs

    from trtopt.calib.histogram import TensorHistogram
    from trtopt.quant.config import QuantConfig
    from trtopt.quant.placement import QuantPlan

log = logging.getLogger(__name__)

UNDERFLOW_SHARE = 0.5


def underflow_share(histogram: TensorHistogram, amax: float) -> float:
    """The share of the non-zero values of `histogram` that the INT8 grid of threshold `amax` rounds to 0
    (|x| < amax / 254), the bin holding that edge counted in proportion (values spread evenly within it)."""
    nonzero = histogram.count - histogram.zeros
    if nonzero <= 0 or amax <= 0.0:
        return 0.0
    counts = histogram.counts.astype(np.float64)
    counts[0] -= histogram.zeros
    edge = amax / (2 * QMAX) / histogram.bin_width  # in bins
    full = min(int(edge), histogram.num_bins)
    below = counts[:full].sum()
    if full < histogram.num_bins:
        below += counts[full] * (edge - full)
    return float(min(max(below / nonzero, 0.0), 1.0))


def underflowing_layers(
    graph: gs.Graph,
    plan: QuantPlan,
    amax: Mapping[str, float],
    histograms: Mapping[str, TensorHistogram],
    folds: frozenset[str] = frozenset(),
) -> dict[str, str]:
    """Layer name -> why it stays float, for every quantised layer that reads (or, for an output pair,
    writes) a tensor whose INT8 grid rounds more than `UNDERFLOW_SHARE` of its non-zero values to zero."""
    quantized = set(plan.quantized_layers)
    producers = _kernel_writers(graph, quantized, folds)
    shares: dict[str, float] = {}
    found: dict[str, str] = {}
    for site in plan.sites:
        if site.kind != "activation" or site.tensor not in histograms or site.tensor not in amax:
            continue
        if site.tensor not in shares:
            shares[site.tensor] = underflow_share(histograms[site.tensor], amax[site.tensor])
        share = shares[site.tensor]
        if share <= UNDERFLOW_SHARE:
            continue
        layer = site.consumer if site.role == "input" else producers.get(site.tensor) if site.role == "output" else None
        if layer is None or layer not in quantized:
            continue
        found.setdefault(layer, (
            f"INT8 would round {share:.0%} of the non-zero values of {site.tensor} to zero (threshold "
            f"{amax[site.tensor]:.3g}): too wide a range for one scale"
        ))  # fmt: skip
        log.info("%s stays float: %s", layer, found[layer])
    return found


def float_underflowing(
    graph: gs.Graph, quant: QuantConfig, plan: QuantPlan, amax: Mapping[str, float],
    histograms: Mapping[str, TensorHistogram] | None,
) -> tuple[QuantConfig, QuantPlan, dict[str, str]]:  # fmt: skip
    """`quant` and `plan` with the layers of `underflowing_layers` excluded (the config too, so that later
    placements, such as the sensitivity search's, keep them float), the reason in `float_layers`, and those
    reasons (layer -> why) for a later placement to record again."""
    from trtopt.quant.placement import plan_quantization

    found = underflowing_layers(graph, plan, amax, histograms, quant.output_folds) if histograms else {}
    if not found:
        return quant, plan, found
    quant = replace(quant, exclude=(*quant.exclude, *found))
    plan = plan_quantization(graph, quant)
    return quant, replace(plan, float_layers={**plan.float_layers, **found}), found


def _kernel_writers(graph: gs.Graph, quantized: set[str], folds: frozenset[str]) -> dict[str, str]:
    """Tensor -> the quantised layer whose INT8 kernel writes it (placement's output-pair walk)."""
    from trtopt.quant.placement import _int8_kernel_output

    outputs = {t.name for t in graph.outputs}
    return {_int8_kernel_output(n, outputs, folds).name: n.name for n in graph.nodes if n.name in quantized}
