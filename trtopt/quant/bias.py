"""Bias correction: cancel the mean output shift that INT8 weights cause, one output channel at a time.

Rounding a layer's weights to INT8 changes W into W + dW. For an input x the output moves by dW x,
and that error is not zero on average: E[dW x] = dW E[x], which is far from zero where the input has a
large mean (every ReLU / ReLU6 output) and the weights of one channel are large and nearly cancel (the
edge detectors of a depthwise conv after BatchNorm folding). Nagel et al., "Data-Free Quantization
Through Weight Equalization and Bias Correction" (ICCV 2019, arXiv:1906.04721), section 4.2, subtract
that expected shift from the bias; their empirical variant takes E[x] from calibration data, as here.
OpenVINO's post-training quantisation applies the same idea by default ("fast bias correction").

E[x] is the FP32 mean of each input channel over the calibration set (`Calibration.channel_means`,
collected in the same calibration pass as the histograms, at almost no cost). The shift of output channel o is
sum_{c,k} dW[o, c, k] * E[x_c]: the zero padding at the borders is ignored. On EfficientNet-Lite0 that
is as good as the exact mean over every output position (mean logit cosine to FP32 0.99826 vs 0.99825 on
214 photos), and it needs C numbers per tensor instead of a C x H x W map.

Measured on EfficientNet-Lite0, 154 calibration photos, CPU plan, entropy thresholds: the logits' mean
squared error against FP32 falls from 0.0168 to 0.0055; 1 - cosine from 0.0048 to 0.0015 on 60 held-out
photos. Most of the gain is one layer (the first depthwise conv), whose weight error was 60 % mean shift.

Tried and dropped (November 2026, avx2, CPU plan): the empirical form of the same section, which also
cancels the shift upstream activation rounding causes. On top of this correction, each Conv/Gemm bias lowered by
E[y_int8] - E[y_fp32] of its pre-activation on the calibration samples, layer by layer in topological order
(everything upstream quantised and already corrected) in the Q/DQ form run with ONNX Runtime's optimisations
off; the means then matched to 1e-7 on calibration (table-cls). On unseen samples it did not pay: all-INT8 PP-OCRv4-rec
0.98889 -> 0.97697 all-element cosine on 128 unseen lines (per line -0.0142 +- 0.0034, worse also on its own
32 calibration lines as the plan runs; measured in the CPU backend's lowered form instead: 0.9694),
ppocr-cls all-INT8 0.99887 -> 0.99805 (64 held-out), table-cls all-INT8 0.9570 -> 0.9634 (+0.0064 +- 0.0052)
but its default plan 0.9826 -> 0.9819 on 64 held-out pages, though its logit shift fell
from +0.010 to +0.002. (Whole-graph passes correcting every layer at once diverge: each layer also cancels
its inputs' shift, which the upstream layers cancel too.)

Also tried and dropped (November 2026, avx2): GPTQ weight rounding (Frantar et al., arXiv:2210.17323) in
place of round-to-nearest, each quantised conv's rows rounded in turn against the Hessian of its FP32 inputs
on the calibration samples (the row's largest weight pinned so the per-channel scale stays), then this
correction. Weights alone (every activation float, 64 held-out samples) it cuts the weight error by two thirds
on PP-OCRv4-rec (cosine 0.99797 -> 0.99935) and a little on table-cls (0.99815 -> 0.99862), but in the
default plan, applied after the search, it gains nothing: PP-OCRv4-rec 0.98843 -> 0.98591 as run on the
kernels (0.98804 -> 0.98800 in the Q/DQ form), table-cls 0.98262 -> 0.98264; activations carry the loss.

Conv (any group) and Gemm (transA = 0) are corrected; MatMul has no bias input and ConvTranspose spreads
a weight over several output positions, so both are left as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from trtopt.calib.thresholds import QMAX
from trtopt.quant.placement import QuantPlan
from trtopt.quant.qdq import SEVEN_BIT, Pairs, quantize_weight, weight_pairs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BiasReport:
    """What `correct_biases` did: the layers whose bias moved, and the others with the reason."""

    corrected: tuple[str, ...]
    skipped: dict[str, str] = field(default_factory=dict)


def weight_error(weight: np.ndarray, axis: int, levels: int = QMAX, pairs: Pairs | None = None) -> np.ndarray:
    """dW = dequantised INT8 weight - weight, with the quantisation `insert_qdq` applies (per channel, on the grid of
    `levels`: 127, or 63 for a 7-bit layer; pair-bounded with `pairs`)."""
    q, scale = quantize_weight(weight, axis, levels=levels, pairs=pairs)
    shape = [1] * weight.ndim
    shape[axis % weight.ndim] = -1
    return q.astype(np.float64) * scale.reshape(shape).astype(np.float64) - weight.astype(np.float64)


def conv_output_shift(error: np.ndarray, input_mean: np.ndarray, group: int = 1) -> np.ndarray:
    """E[dW * x] per output channel of a Conv: `error` is [M, C/group, *kernel], `input_mean` is [C]."""
    out_channels, group_in = error.shape[0], error.shape[1]
    per_tap = error.reshape(out_channels, group_in, -1).sum(axis=2)  # [M, C/group]
    means = np.asarray(input_mean, dtype=np.float64).reshape(group, group_in)
    group_of_output = np.arange(out_channels) // (out_channels // group)
    return (per_tap * means[group_of_output]).sum(axis=1)


def gemm_output_shift(error: np.ndarray, input_mean: np.ndarray, *, trans_b: bool) -> np.ndarray:
    """E[x dB] per output feature of a Gemm (transA = 0): `error` is B's error, [K, N] or [N, K] if `trans_b`."""
    mean = np.asarray(input_mean, dtype=np.float64)
    return error @ mean if trans_b else mean @ error


def correct_biases(
    graph: gs.Graph, plan: QuantPlan, channel_means: Mapping[str, np.ndarray], seven_bit: Collection[str] = ()
) -> BiasReport:
    """Subtract the expected output shift from the bias of every quantised Conv / Gemm, in place (for the layers in
    `seven_bit`, the shift their 7-bit weights cause: `insert_qdq`'s `seven_bit`).

    Call before `insert_qdq` (the weights must still be constants). A layer without a bias gets one.
    """
    nodes = {n.name: n for n in graph.nodes}
    axes = {s.consumer: s.axis for s in plan.sites if s.kind == "weight"}
    corrected, skipped = [], {}
    for name in plan.quantized_layers:
        node = nodes[name]
        levels = SEVEN_BIT if name in seven_bit else QMAX
        shift, why = _expected_shift(node, axes.get(name), channel_means, levels,
                                     weight_pairs(plan, node.op, node.attrs, levels))  # fmt: skip
        if shift is None:
            skipped[name] = why
            continue
        _set_bias(node, _bias_values(node, shift.size) - shift)
        corrected.append(name)
    return BiasReport(tuple(corrected), skipped)


def _expected_shift(
    node: gs.Node, axis: int | None, channel_means: Mapping[str, np.ndarray], levels: int = QMAX,
    pairs: Pairs | None = None,
) -> tuple[np.ndarray | None, str]:
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    if node.op not in ("Conv", "Gemm"):
        return None, f"{node.op} has no bias input to correct"
    if axis is None or not isinstance(weight, gs.Constant):
        return None, "weights are not an INT8 constant"
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    if bias is not None and not isinstance(bias, gs.Constant) and bias.name:
        return None, "the bias is computed at run time"
    mean = channel_means.get(node.inputs[0].name)
    values = np.asarray(weight.values, dtype=np.float32)
    expected = values.shape[1] * int(node.attrs.get("group", 1)) if node.op == "Conv" else _gemm_k(node, values)
    if mean is None or mean.size != expected:
        return None, "no channel mean for its input" if mean is None else f"input mean has {mean.size} channels"
    error = weight_error(values, axis, levels, pairs)
    if node.op == "Conv":
        return conv_output_shift(error, mean, int(node.attrs.get("group", 1))), ""
    if float(node.attrs.get("beta", 1.0)) == 0.0 and len(node.inputs) > 2:
        return None, "Gemm with beta = 0 ignores its bias"
    shift = float(node.attrs.get("alpha", 1.0)) * gemm_output_shift(error, mean, trans_b=_trans_b(node))
    return shift / float(node.attrs.get("beta", 1.0)) if len(node.inputs) > 2 else shift, ""


def _gemm_k(node: gs.Node, weight: np.ndarray) -> int:
    return int(weight.shape[1] if _trans_b(node) else weight.shape[0])


def _trans_b(node: gs.Node) -> bool:
    return bool(node.attrs.get("transB", 0))


def _bias_values(node: gs.Node, channels: int) -> np.ndarray:
    """The bias as a [channels] (Conv) or broadcastable (Gemm C) float64 array; zeros if there is none."""
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    if not isinstance(bias, gs.Constant):
        return np.zeros(channels)  # absent, or an empty optional input
    values = np.asarray(bias.values, dtype=np.float64)
    return np.broadcast_to(values, np.broadcast_shapes(values.shape, (channels,))).copy()


def _set_bias(node: gs.Node, values: np.ndarray) -> None:
    """A new constant (the old one may be shared with a layer that is not corrected the same way)."""
    if node.op == "Gemm" and len(node.inputs) <= 2:
        node.attrs["beta"] = 1.0
    constant = gs.Constant(f"{node.name}/bias_corrected", values.astype(np.float32))
    if len(node.inputs) > 2:
        node.inputs[2] = constant
    else:
        node.inputs.append(constant)


def correct_biases_for_build(graph: gs.Graph, plan: QuantPlan, calibration: Any, seven_bit: Collection[str] = ()
                             ) -> BiasReport | None:  # fmt: skip
    """`correct_biases` for `trtopt.build`: it needs the FP32 channel means that trtopt's calibrator and cache record
    (of a `trtopt.calib.Calibration`); caches of other tools have none, so those builds go without it."""
    if not calibration.channel_means:
        log.warning(
            "no bias correction: the calibration (%s) has no channel means; calibrate from data, or with "
            "a trtopt cache written by this version, to get it", calibration.source or calibration.method
        )
        return None
    report = correct_biases(graph, plan, calibration.channel_means, seven_bit)
    log.info("bias correction: %d layers corrected, %d left as they are", len(report.corrected), len(report.skipped))
    return report
