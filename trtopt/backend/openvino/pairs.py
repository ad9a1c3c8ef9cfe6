"""8-bit weights whose pairs of products fit OpenVINO's int16 sums on CPUs without VNNI ("lowered-pairs" form).

Without VNNI, OpenVINO's CPU plugin (oneDNN's AVX2 int8 kernels) multiplies uint8 activations by int8 weights
with `vpmaddubsw`, which adds the products of two neighbouring reduction elements (input channels of one kernel
tap; the K dimension of a fully connected layer) into a saturating int16. A pair saturates only when both weights
are large and of one sign: 255 * (|q0| + |q1|) > 32767, i.e. |q0| + |q1| > 128 (one weight alone, at most 127,
always fits; two of opposite signs partly cancel). So instead of halving every weight's resolution (7-bit
weights, "lowered-w7", NNCF's `OverflowFix` does the same for the first layer), each output channel keeps its
8-bit grid unless a same-sign pair of neighbouring weights sums above 128 on it, and then takes the smallest
coarser scale that brings every such pair to 128 or less.

Measured on the EfficientNet-Lite0 demo (avx2 EPYC, OpenVINO 2026.4.1, every layer INT8, 16 held-out photos):
33 of 49 dense layers needed a coarser scale; the INT8 reference's relative error to FP32 was 0.101 against
0.163 with 7-bit weights (0.063 with plain 8-bit weights, whose kernels were then 0.42 from it: saturated),
and OpenVINO's kernels were as close to their reference as with 7-bit weights (0.041 against 0.040).
The pairing (neighbouring input channels) is oneDNN's blocked int8 weight layout; the build's verification
checks the kernels against the reference either way, and falls back to 7-bit weights where they differ.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from trtopt.quant.pairs import PAIR_LIMIT
from trtopt.quant.pairs import pair_sums as row_pair_sums

_WIDENINGS = 40  # at most this many 1% steps of a channel's scale to absorb rounding up past the limit


def pair_sums(q: np.ndarray, axis: int) -> np.ndarray:
    """The largest |q0| + |q1| over same-sign neighbouring pairs along `axis` (reduction), per index of axis 0
    (after moving the output axis there); a lone weight counts as its magnitude."""
    rows = np.moveaxis(q, axis, -1)  # every (output, tap) a row of its reduction elements (`trtopt.quant.pairs`)
    return np.asarray(row_pair_sums(rows.reshape(-1, rows.shape[-1])).reshape(q.shape[0], -1).max(axis=1))


def _reduction_axes(model: onnx.ModelProto) -> dict[str, int]:
    """Weight tensor (a DequantizeLinear's output) -> its reduction axis, for Conv (input channels), Gemm and
    MatMul (K). Depthwise convs (one input channel per group) have no pairs and are left out."""
    axes: dict[str, int] = {}
    for node in model.graph.node:
        if len(node.input) < 2:
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Conv":
            axes[node.input[1]] = 1
        elif node.op_type == "Gemm":
            axes[node.input[1]] = 1 if attrs.get("transB", 0) else 0
        elif node.op_type == "MatMul":
            axes[node.input[1]] = -2
    return axes


def bound_weight_pairs(model: onnx.ModelProto, limit: int = PAIR_LIMIT) -> int:
    """Requantise, in place, the int8 weights of Conv / Gemm / MatMul whose same-sign neighbouring pairs sum above
    `limit`: per output channel (the DequantizeLinear's axis; all of it for a per-tensor scale) the smallest
    scale at which every pair fits, rounding from the 8-bit values. Returns how many weights changed."""
    inits = {t.name: t for t in model.graph.initializer}
    axes = _reduction_axes(model)
    changed = 0
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear" or node.output[0] not in axes or node.input[0] not in inits:
            continue
        q = numpy_helper.to_array(inits[node.input[0]])
        if q.dtype != np.int8 or q.ndim < 2 or q.shape[axes[node.output[0]]] < 2:
            continue
        scale = numpy_helper.to_array(inits[node.input[1]])
        result = _bounded(q, scale, _axis(node, q.ndim), axes[node.output[0]] % q.ndim, limit)
        if result is None:
            continue
        inits[node.input[0]].CopyFrom(numpy_helper.from_array(result[0], node.input[0]))
        inits[node.input[1]].CopyFrom(numpy_helper.from_array(result[1], node.input[1]))
        changed += 1
    return changed


def _axis(node: onnx.NodeProto, ndim: int) -> int:
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    return int(axis) % ndim


def _bounded(q: np.ndarray, scale: np.ndarray, out_axis: int, red_axis: int,
             limit: int) -> tuple[np.ndarray, np.ndarray] | None:  # fmt: skip
    """(int8 weights, scale) with every pair within `limit`, or None when they already are."""
    per_channel = scale.ndim == 1 and scale.size > 1
    if per_channel and red_axis == out_axis:
        return None  # not a weight layout this backend writes
    channels = np.moveaxis(q, out_axis, 0) if per_channel else q.reshape(1, *q.shape)
    red = red_axis + 1 if red_axis < out_axis or not per_channel else red_axis  # its place in `channels`
    sums = pair_sums(channels, red)
    if sums.max() <= limit:
        return None
    values = channels.astype(np.float64) * scale.reshape(-1, *([1] * (channels.ndim - 1))).astype(np.float64)
    factor = np.maximum(sums / limit, 1.0)
    for _ in range(_WIDENINGS):
        widened = scale.reshape(-1).astype(np.float64) * factor
        new = np.clip(np.rint(values / widened.reshape(-1, *([1] * (channels.ndim - 1)))), -127, 127)
        over = pair_sums(new.astype(np.int8), red) > limit
        if not over.any():
            break
        factor = np.where(over, factor * 1.01, factor)
    out: Any = new.astype(np.int8)
    out = np.moveaxis(out, 0, out_axis) if per_channel else out.reshape(q.shape)
    return out, widened.astype(np.float32).reshape(scale.shape)
