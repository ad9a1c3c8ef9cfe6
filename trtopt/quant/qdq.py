"""Insert QuantizeLinear/DequantizeLinear pairs for a `QuantPlan` in TensorRT's symmetric form.

Activations: Q(scale=T/127, zero point int8 0) -> DQ, one pair per consumer edge. Weights: stored as
INT8 constants with per-output-channel scale max|w|/127, followed by a DequantizeLinear (TensorRT
and ONNX Runtime both accept pre-quantised weights with a DQ-only chain). Bias stays float: TensorRT
fuses it into the INT8 convolution itself.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from trtopt.calib.thresholds import QMAX, ZERO_AMAX, weight_scales
from trtopt.errors import CalibrationError
from trtopt.frontend.edit import canonicalize
from trtopt.quant.pairs import DENSE, pair_bounded
from trtopt.quant.placement import QuantPlan, QuantSite

Pairs = tuple[str, Mapping[str, Any]]  # a layer's op and attributes: how its kernels pair its weights

# A tensor (or weight channel) that was all zeros still needs a positive scale: the calibrator's
# choice, whose scale is float16's smallest normal number, so FP16 graphs keep it too. The default floor of
# activation thresholds (`QuantConfig.min_amax`: FP32 backends lower it).
MIN_AMAX = ZERO_AMAX
SEVEN_BIT = 63  # the 7-bit weight grid's largest level (trtopt.search.seven_bit and trtopt.backend.cpu.isa say why)


@dataclass(frozen=True)
class QdqReport:
    activation_pairs: int
    weight_dequantizers: int
    quantized_layers: tuple[str, ...]
    float_layers: dict[str, str]
    thresholds: dict[str, float]


def shared_thresholds(amax: Mapping[str, float], shared: tuple[tuple[str, ...], ...]) -> dict[str, float]:
    """Give every tensor of a shared group (merged where groups overlap) the group's largest threshold."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for group in shared:
        for name in group[1:]:
            parent[find(name)] = find(group[0])
    result = dict(amax)
    roots: dict[str, float] = {}
    for name in parent:
        if name in amax:
            roots[find(name)] = max(roots.get(find(name), 0.0), float(amax[name]))
    for name in parent:
        if find(name) in roots:
            result[name] = roots[find(name)]
    return result


def insert_qdq(
    graph: gs.Graph,
    plan: QuantPlan,
    amax: Mapping[str, float],
    seven_bit: Collection[str] = (),
    min_amax: float = MIN_AMAX,
) -> QdqReport:
    """Edit `graph` in place; `amax` maps each activation tensor to its calibrated threshold T, raised to at least
    `min_amax` (`QuantConfig.min_amax`); the weights of the layers in `seven_bit` go on the 7-bit grid
    (`QuantConfig.seven_bit_layers`)."""
    missing = [t for t in plan.activation_tensors if t not in amax]
    if missing:
        raise CalibrationError(
            f"No calibrated threshold for {len(missing)} tensor(s) the plan quantises: {missing[:8]}"
            f"{' ...' if len(missing) > 8 else ''}.",
            fix="Recalibrate this model (the cache was made for another graph or other options).",
        )
    _require_one_site_per_edge(plan)
    nodes = {n.name: n for n in graph.nodes}
    raised = _bias_floors(plan, nodes, {t: max(value, min_amax) for t, value in amax.items()})
    thresholds = shared_thresholds(raised, plan.shared)
    weights: dict[tuple[str, int, int, bool], gs.Variable] = {}
    n_act = n_weight = 0
    for site in plan.sites:
        consumer = nodes[site.consumer]
        if site.kind == "weight":
            levels = SEVEN_BIT if site.consumer in seven_bit else QMAX
            pairs = weight_pairs(plan, consumer.op, consumer.attrs, levels)
            key = (site.tensor, site.axis, levels, pairs is not None)
            if key not in weights:
                weights[key] = _dequantized_weight(graph, consumer.inputs[site.index], site.axis, levels, pairs)
                n_weight += 1
            consumer.inputs[site.index] = weights[key]
        else:
            consumer.inputs[site.index] = _qdq_pair(
                graph, consumer.inputs[site.index], site, thresholds[site.tensor]
            )
            n_act += 1
    canonicalize(graph)
    return QdqReport(
        activation_pairs=n_act,
        weight_dequantizers=n_weight,
        quantized_layers=plan.quantized_layers,
        float_layers=dict(plan.float_layers),
        thresholds={t: thresholds[t] for t in plan.activation_tensors},
    )


# The largest int32 an integer kernel's bias may take: half the range, the other half for the products its
# accumulator adds (a bias at -2**31 + 177 wrapped to a large positive output in ONNX Runtime's QLinearConv).
INT32_BIAS = 2**30


def _bias_floors(plan: QuantPlan, nodes: Mapping[str, gs.Node], amax: Mapping[str, float]) -> dict[str, float]:
    """`amax`, with each activation read by a Conv/Gemm with a constant bias raised to the threshold at which that
    bias fits int32 at scale s_x * s_w (s_w: the weights' 8-bit per-channel scales, the finest any encoding uses;
    s_x: T / 255, the finest input grid a CPU plan writes). Integer kernels take the bias as int32 at that scale:
    ONNX Runtime quantises a float bias itself and clips it, so a tiny input (FP32 backends keep one's own grid,
    `QuantConfig.min_amax`) beside a bias of 0.1 gave outputs 10x too small. ONNX Runtime's quantizer meets the
    same limit by widening the weights' scale instead (`QDQQuantizer._adjust_weight_scale_for_int32_bias` in
    onnxruntime.quantization, after TensorFlow Lite's quantization_utils); here the weights keep their grid, and
    the input's, by construction tiny beside the bias, gives way."""
    raised = dict(amax)
    for site in plan.sites:
        node = nodes[site.consumer]
        if site.kind != "activation" or site.index != 0 or node.op not in ("Conv", "Gemm") or len(node.inputs) < 3:
            continue
        weight, bias = node.inputs[1], node.inputs[2]
        if not (isinstance(weight, gs.Constant) and isinstance(bias, gs.Constant)) or site.tensor not in raised:
            continue
        axis = 0 if node.op == "Conv" or node.attrs.get("transB", 0) else 1
        scales = weight_scales(np.asarray(weight.values, dtype=np.float32), axis).astype(np.float64)
        values = np.abs(np.asarray(bias.values, dtype=np.float64)).reshape(-1)
        if values.size == scales.size:
            needed = float(np.max(values / scales)) * 255 / INT32_BIAS
            raised[site.tensor] = max(raised[site.tensor], needed)
    return raised


def _require_one_site_per_edge(plan: QuantPlan) -> None:
    """Two pairs on one input edge would get the same names (`<tensor>/<consumer>.<index>/...`) and close a
    cycle in the ONNX (issue #13, failure 2): a placement bug, not a user error, so it fails here."""
    seen: set[tuple[str, int]] = set()
    for site in plan.sites:
        if (site.consumer, site.index) in seen:
            raise ValueError(f"quantisation plan has two sites on input {site.index} of {site.consumer!r}")
        seen.add((site.consumer, site.index))


def _qdq_pair(graph: gs.Graph, tensor: gs.Tensor, site: QuantSite, threshold: float) -> gs.Variable:
    base = f"{site.tensor}/{site.consumer}.{site.index}"
    scale = gs.Constant(f"{base}/scale", np.array(threshold / QMAX, dtype=np.float32))
    zero = gs.Constant(f"{base}/zero_point", np.array(0, dtype=np.int8))
    quantized = gs.Variable(f"{base}/quantized", dtype=np.int8, shape=tensor.shape)
    restored = gs.Variable(f"{base}/dequantized", dtype=np.float32, shape=tensor.shape)
    graph.nodes.append(
        gs.Node("QuantizeLinear", f"{base}/Q", inputs=[tensor, scale, zero], outputs=[quantized])
    )
    graph.nodes.append(
        gs.Node("DequantizeLinear", f"{base}/DQ", inputs=[quantized, scale, zero], outputs=[restored])
    )
    return restored


def quantize_weight(
    values: np.ndarray, axis: int, *, name: str = "", levels: int = QMAX, pairs: Pairs | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-channel INT8: returns (int8 values within +-`levels`, float32 scale per channel along `axis`:
    max|w| / `levels`); with `pairs` (the layer's op and attributes) 8-bit weights whose neighbouring pairs fit
    saturating kernels (`trtopt.quant.pairs`)."""
    axis = axis % values.ndim
    scale = weight_scales(values, axis, name=name)
    if pairs is not None and levels == QMAX:
        return pair_bounded(values, axis, scale, *pairs)
    if levels != QMAX:
        scale = (scale.astype(np.float64) * QMAX / levels).astype(np.float32)
    shape = [1] * values.ndim
    shape[axis] = -1
    q = np.clip(np.rint(values / scale.reshape(shape)), -levels, levels).astype(np.int8)
    return q, scale


def weight_pairs(plan: QuantPlan, op: str, attrs: Mapping[str, Any], levels: int) -> Pairs | None:
    """The layer's (op, attributes) where its 8-bit weights are to be pair-bounded (`QuantPlan.pair_bounded`), else
    None."""
    return (op, attrs) if plan.pair_bounded and levels == QMAX and op in DENSE else None


def _dequantized_weight(graph: gs.Graph, weight: gs.Constant, axis: int, levels: int = QMAX,
                        pairs: Pairs | None = None) -> gs.Variable:  # fmt: skip
    values = np.asarray(weight.values, dtype=np.float32)
    axis = axis % values.ndim
    q, scale = quantize_weight(values, axis, name=weight.name, levels=levels, pairs=pairs)
    base = f"{weight.name}/int7" if levels != QMAX else f"{weight.name}/int8p" if pairs else f"{weight.name}/int8"
    inputs = [
        gs.Constant(base, q),
        gs.Constant(f"{base}/scale", scale),
        gs.Constant(f"{base}/zero_point", np.zeros_like(scale, dtype=np.int8)),
    ]
    restored = gs.Variable(f"{weight.name}/dequantized", dtype=np.float32, shape=list(values.shape))
    graph.nodes.append(
        gs.Node("DequantizeLinear", f"{base}/DQ", attrs={"axis": axis}, inputs=inputs, outputs=[restored])
    )
    return restored
