"""Activation equalisation: even out the channel ranges of a tensor that feeds a depthwise conv.

Activations are quantised per tensor (TensorRT's rule, DESIGN.md), so one scale serves every channel.
Where the channels of a tensor span very different ranges, the widest sets the scale and the narrow ones
keep a few INT8 levels: on document pages (white background, thin strokes) the output of a pointwise
conv + HardSwish in MobileNetV3 / LCNet has channels 100x apart, and the depthwise conv that reads it
amplifies each channel's rounding noise on its own, with nothing to average it out.

Cross-layer equalisation (Nagel et al., "Data-Free Quantization Through Weight Equalization and Bias
Correction", ICCV 2019, arXiv:1906.04721, section 4.1) rescales channel c of a layer's output by 1/s_c
and the next layer's input channel c by s_c, which is exact when the activation between them is
positively homogeneous (f(x/s) = f(x)/s for s > 0: ReLU, identity). Here the scales are chosen from the
FP32 activation ranges on calibration data instead of the weight ranges, so that every channel of the
quantised tensor spans the same range. When the reader is a depthwise conv, s_c only multiplies that
conv's output channel c, which its per-channel weight scale absorbs: the weights lose nothing. The
producer's output channel c is likewise per-channel weight-quantised.

Gated activations f(x) = x * g(x) (HardSwish written as x * Clip(x + 3, 0, 6) / 6, SiLU as
x * Sigmoid(x)) are not homogeneous, but they become exact again by feeding the gate the rescaled
tensor multiplied back by s_c: (x/s) * g(s * (x/s)) = f(x) / s. That costs one per-channel Mul on the
gate branch, in float. SiLU, which a CPU plan runs on integer kernels (`QuantConfig.integer_gates`), the float
Mul would cut out of them, so such builds leave it alone (`find_sites(integer_gates=True)`: on EfficientNet-B0
1.38x / 1.72x FP32's speed at b1 / b8 without, 0.98x / 1.12x with, `trtopt.backend.cpu.backend.CpuBackend.
quant_config`). HardSwish stays where its channels' ranges spread by `GATED_SPREAD` or more: the CPU lowering
runs its rescaled gate, HardSigmoid(x' * s), as one integer depthwise 1x1 conv (`trtopt.backend.cpu.hard_gates`;
what leaving it out cost, `trtopt.quant.gates`).

After the activation, a scalar affine map a * y + b (PP-LCNetV3's "learnable affine block", which PP-OCRv4
places after every HardSwish, exported as a Mul and an Add of one-element constants) keeps the rewrite exact
when its offset becomes per channel: a * (y / s) + b / s = (a * y + b) / s. The scalar Mul/Div pass as they
are and each Add/Sub offset b is replaced by the [1, C, 1, ...] constant b * g_c (channel c scaled up by g_c).
Before, PP-OCRv4's detector had 1 site of 14 depthwise convs and its recogniser 1 of 14; now 11 and 14. On the
zoo (tools/bench_zoo.py, avx2, 16 pages / 32 lines, 16 held-out): the detector's worst output cosine 0.9891 ->
0.9903 with one layer kept float instead of two (all-INT8 on the search samples 0.900 -> 0.935), the
recogniser's 0.9722 -> 0.9847 (exact strings 62.5% -> 75%) with none instead of two.

Where the reader does not absorb s_c (a 1x1 conv or a weight MatMul: s_c lands on its input rows, inside each
per-output-channel weight scale), the rescaling is SmoothQuant's (Xiao et al. 2023, arXiv:2211.10438:
s_c = max|x_c|^a / max|w_c|^(1-a)) and trades weight precision for activation precision. Simulated on PP-OCRv4-rec
(exact float rewrite, all-INT8 plan, avx2, paired per-line cosine on 128 lines the build never saw): its 9 weight
MatMuls +0.0005 +- 0.0004 at a = 0.5 (all 9 kept float: +0.0005), its 21 1x1 convs -0.014 / -0.006 / -0.003 /
-0.0025 at a = 0.25 / 0.5 / 0.75 / 1. Neither is done.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from trtopt.frontend.copying import copy_graph
from trtopt.passes.query import constant_array

log = logging.getLogger(__name__)

HOMOGENEOUS = frozenset({"Relu", "Identity"})  # f(x / s) = f(x) / s for every s > 0
LINEAR_AFTER_GATE = frozenset({"Div", "Mul"})  # by a scalar constant: keeps f(x) / s
OFFSET_AFTER_GATE = frozenset({"Add", "Sub"})  # of a scalar constant b: exact with b / s per channel (rescaled)
GATE_OPS = frozenset({"Add", "Sub", "Clip", "Sigmoid", "HardSigmoid", "Div", "Mul", "Relu", "Tanh"})
# Builds rescale through gated activations too (HardSwish written as nodes, SiLU). The float rewrite is exact, and
# the Q/DQ reference gains most there: on the zoo (avx2, 32 calibration, 16 held-out samples) layout-cdla's
# worst output cosine went 0.937 -> 0.989 (box F1 83.8% -> 92.9%) and table-cls's 0.948 -> 0.986, the others unchanged.
# It was off at first because ppocr-cls's build was then refused on AVX2: kernels 0.0204 from the reference against a
# tolerance of 0.0103, on its first 8 text lines. Traced tensor by tensor, that was neither a kernel error nor the
# rewrite's: the u8u8 kernels equal the reference bit for bit except where the reference's float32 conv lands on a
# rounding tie (every first divergence within 3e-5 of half a step, e.g. 32.5 or -44.500004 steps; one or two elements
# on 39 of 96 ppocr-cls text lines without gated equalisation, 43 with), and in this MobileNetV3 one such flip grows
# block after block until that sample differs from the reference as much as the reference from FP32. On 8 lines one
# such line near the decision boundary decided the verdict (2.2% of random 8-line windows failed, 0.1% without gated
# rescaling); a set too small to hold samples back now shares up to 4x as many with verification
# (trtopt.verify.SHARED_CHECKS), and the build verifies (kernels 0.028 from the reference on 32 lines, tolerance 0.100).
GATED_IN_BUILDS = True
# An integer-gate (CPU) plan rescales a HardSwish site only where its widest channel's range is at least this many
# times the median one's (the median channel then keeps at most a third of the grid's levels): its rescaled gate is
# a depthwise conv where the unscaled one is a QLinearAdd (`trtopt.backend.cpu.hard_gates`). A judgement from
# measurements (avx2, all-INT8 plans, 2026-11-29): the corpus's MobileNetV3s on photos spread 1.6-2.8 and gained
# nothing from the rescaling (paddle: reference cosine 0.99933 -> 0.99940) for 7% / 16% of speed at b1 / b8; the
# zoo's document models spread 2.2-32, and layout-cdla's 22 sites at 3 or more hold all it gained (worst output
# 0.6901 -> 0.9712 on calibration samples; its 15 sites at 4 or more: 0.9653).
GATED_SPREAD = 3.0
MAX_GAIN = 128.0  # a channel is scaled up at most 128x: beyond that it was below one INT8 level anyway


@dataclass(frozen=True)
class EqualizeSite:
    """conv -> activation -> depthwise conv: `tensor` (the activation's output) gets even channel ranges."""

    producer: gs.Node
    activation: tuple[gs.Node, ...]  # in order; empty: the producer feeds the depthwise conv directly
    gate_head: gs.Node | None  # the first node of a gate branch (x * g(x)), which must see the original x
    consumer: gs.Node
    tensor: str
    offsets: tuple[gs.Node, ...] = ()  # Add/Sub of a scalar after the activation: their constant is rescaled


@dataclass(frozen=True)
class EqualizeReport:
    """What `equalize_activations` did: per rescaled tensor, the ratio of its widest channel range to the
    median one, before and after, and the gains it applied (site tensor -> g_c, in the order applied; what a
    calibration cache records so a build from it redoes the same rewrite: `trtopt.quant.equalize_cache`)."""

    spread: dict[str, tuple[float, float]] = field(default_factory=dict)
    gains: dict[str, np.ndarray] = field(default_factory=dict)


def find_sites(
    graph: gs.Graph, *, gates: bool = True, integer_gates: bool = False
) -> list[EqualizeSite]:
    """Every Conv whose output reaches a depthwise Conv through at most one activation, nothing else reading
    the tensors in between (so no other reader sees the rescaled channels). `integer_gates`: leave out SiLU
    (x * Sigmoid(x)), which such a plan runs on integer kernels (`QuantConfig.integer_gates`): the gate's
    per-channel Mul would run in float between them (`trtopt.quant.gates`). HardSwish sites stay: the CPU plan runs
    their rescaled gate on an integer kernel too (`trtopt.backend.cpu.hard_gates`)."""
    outputs = {t.name for t in graph.outputs}
    sites = []
    for node in graph.nodes:
        if node.op != "Conv" or _weights(node) is None:
            continue
        site = _site_from(node, outputs)
        if site is not None and site.gate_head is not None and not gates:
            continue
        if site is not None and integer_gates and _is_silu(site):
            continue
        if site is not None:
            sites.append(site)
    return sites


def _is_silu(site: EqualizeSite) -> bool:
    head = site.gate_head
    return (head is not None and head.op == "Sigmoid" and len(head.outputs[0].outputs) == 1
            and head.outputs[0].outputs[0].op == "Mul")  # fmt: skip


def _site_from(producer: gs.Node, outputs: set[str]) -> EqualizeSite | None:
    x = producer.outputs[0]
    if x.name in outputs:
        return None
    readers = list(x.outputs)
    if len(readers) == 1 and _is_depthwise(readers[0], x):
        return EqualizeSite(producer, (), None, readers[0], x.name)
    if len(readers) == 1 and readers[0].op in LINEAR_AFTER_GATE | OFFSET_AFTER_GATE:
        return _ending(producer, (), None, outputs)
    if len(readers) == 1 and readers[0].op in HOMOGENEOUS:
        return _ending(producer, (readers[0],), None, outputs)
    if len(readers) == 1 and readers[0].op == "HardSwish":  # one node x * HardSigmoid(x): its own gate
        return _ending(producer, (readers[0],), readers[0], outputs)
    if len(readers) == 2:
        return _gated(producer, readers, outputs)
    return None


def _gated(producer: gs.Node, readers: list[gs.Node], outputs: set[str]) -> EqualizeSite | None:
    """x * g(x): one reader is a Mul of x by the gate, the other starts the gate's chain of single-input ops."""
    x = producer.outputs[0]
    for mul, head in (readers, readers[::-1]):
        if mul.op != "Mul" or head.op not in GATE_OPS or _data_inputs(head) != [x]:
            continue
        chain, tensor = [head], head.outputs[0]
        while len(tensor.outputs) == 1 and tensor.name not in outputs and tensor.outputs[0] is not mul:
            nxt = tensor.outputs[0]
            if nxt.op not in GATE_OPS or _data_inputs(nxt) != [tensor] or len(chain) > 4:
                return None
            chain.append(nxt)
            tensor = nxt.outputs[0]
        if (
            len(tensor.outputs) == 1
            and tensor.outputs[0] is mul
            and {t.name for t in mul.inputs} == {x.name, tensor.name}
        ):
            return _ending(producer, (*chain, mul), head, outputs)
    return None


def _ending(
    producer: gs.Node, nodes: tuple[gs.Node, ...], head: gs.Node | None, outputs: set[str]
) -> EqualizeSite | None:
    """Follow scalar Mul/Div/Add/Sub after the activation, then require a depthwise conv as the one reader."""
    chain = list(nodes)
    offsets: list[gs.Node] = []
    tensor = chain[-1].outputs[0] if chain else producer.outputs[0]
    while tensor.name not in outputs and len(tensor.outputs) == 1:
        reader = tensor.outputs[0]
        if _is_depthwise(reader, tensor):
            return EqualizeSite(producer, tuple(chain), head, reader, tensor.name, tuple(offsets))
        if reader.op not in LINEAR_AFTER_GATE | OFFSET_AFTER_GATE or not _scalar_operand(reader, tensor):
            return None
        if reader.op in OFFSET_AFTER_GATE:
            offsets.append(reader)
        chain.append(reader)
        tensor = reader.outputs[0]
    return None


def channel_ranges(
    graph: gs.Graph, names: Mapping[str, int], batches: Sequence[Mapping[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """max |x| per channel (axis 1) of each tensor in `names` (name -> rank), FP32, over `batches`.

    The reduction runs inside the model (Abs -> ReduceMax over every axis but 1, on a copy of the graph), so
    only C numbers per tensor leave ONNX Runtime, not the full activations."""
    from trtopt.execution import OrtSession

    probe = copy_graph(graph)
    tensors = probe.tensors()
    outputs = {}
    for name, rank in names.items():
        x = tensors[name]
        axes = [0, *range(2, rank)]
        absolute = gs.Variable(f"{x.name}_eq_abs", dtype=np.float32)
        peak = gs.Variable(f"{x.name}_eq_max", dtype=np.float32)
        probe.nodes.append(gs.Node("Abs", inputs=[x], outputs=[absolute]))
        if probe.opset >= 18:
            axes_input = gs.Constant(f"{x.name}_eq_axes", np.array(axes, np.int64))
            probe.nodes.append(
                gs.Node("ReduceMax", attrs={"keepdims": 0}, inputs=[absolute, axes_input], outputs=[peak])
            )
        else:
            probe.nodes.append(
                gs.Node("ReduceMax", attrs={"keepdims": 0, "axes": axes}, inputs=[absolute], outputs=[peak])
            )
        probe.outputs.append(peak)
        outputs[name] = peak.name
    session = OrtSession(probe, spin=False)
    ranges: dict[str, np.ndarray] = {}
    for feeds in batches:
        values = session.run(feeds, list(outputs.values()))
        for tensor, out in outputs.items():
            peak_now = np.asarray(values[out], dtype=np.float64)
            ranges[tensor] = np.maximum(ranges[tensor], peak_now) if tensor in ranges else peak_now
    return ranges


def equalizing_scales(*ranges: np.ndarray, max_gain: float = MAX_GAIN) -> np.ndarray:
    """The gain g_c >= 1 that brings each channel's range up to the widest one, at most `max_gain`.

    With several tensors (the conv output and the activation output, when the backend quantises both), a
    channel is scaled up only as far as it stays within the widest channel of each: no tensor's range
    grows. A channel that is zero on every sample (dead) keeps g_c = 1."""
    gain = np.full(ranges[0].shape, np.inf)
    for r in ranges:
        widest = float(r.max(initial=0.0))
        gain = np.minimum(gain, np.where(r > 0, widest / np.maximum(r, 1e-30), np.inf))
    return np.clip(np.where(np.isfinite(gain), gain, 1.0), 1.0, max_gain)


def rescale_site(graph: gs.Graph, site: EqualizeSite, gain: np.ndarray) -> None:
    """Multiply channel c between producer and consumer by `gain[c]`, leaving the consumer's output as it was."""
    w, b = _weights(site.producer)  # type: ignore[misc]
    shape = (-1,) + (1,) * (w.values.ndim - 1)
    w.values = (w.values * gain.reshape(shape)).astype(w.values.dtype)
    if b is not None:
        b.values = (b.values * gain).astype(b.values.dtype)
    cw, _ = _weights(site.consumer)  # type: ignore[misc]
    cw.values = (cw.values / gain.reshape(shape)).astype(cw.values.dtype)
    for node in site.offsets:
        _rescale_offset(node, gain.reshape((1, -1) + (1,) * (w.values.ndim - 2)))
    if site.gate_head is not None:
        _feed_gate(graph, site, gain)
    _rename_scaled(site)


def _rescale_offset(node: gs.Node, gain: np.ndarray) -> None:
    """y + b, b + y, y - b or b - y with a scalar b: b becomes b * gain per channel (a new constant)."""
    index = next(i for i, t in enumerate(node.inputs) if constant_array(t) is not None)
    value = constant_array(node.inputs[index])
    assert value is not None
    scaled = (float(value.reshape(())) * gain).astype(value.dtype)
    node.inputs[index] = gs.Constant(f"{node.name}_equalized_offset", scaled)


def _rename_scaled(site: EqualizeSite) -> None:
    """Rename the tensors that now hold rescaled channels (x and what the activation computes from it, not the
    gate): under their old names, a comparison with the original model (`trtopt compare --per-layer`) would
    match them to tensors they differ from by a per-channel factor."""
    scaled = [site.producer.outputs[0]]
    for node in site.activation:
        if any(t is s for t in node.inputs for s in scaled):
            scaled.append(node.outputs[0])
    for tensor in scaled:
        tensor.name = f"{tensor.name}.equalized"


def _feed_gate(graph: gs.Graph, site: EqualizeSite, gain: np.ndarray) -> None:
    """The gate reads x * (1 / gain) per channel, that is the original x."""
    x = site.producer.outputs[0]
    rank = site.producer.inputs[1].values.ndim  # a Conv's output has its weight's rank
    inverse = gs.Constant(
        f"{x.name}_equalize_inv", (1.0 / gain).astype(np.float32).reshape((1, -1) + (1,) * (rank - 2))
    )
    original = gs.Variable(f"{x.name}_equalize_gate", dtype=x.dtype, shape=x.shape)
    graph.nodes.append(gs.Node("Mul", f"{x.name}_equalize_mul", inputs=[x, inverse], outputs=[original]))
    head = site.gate_head
    assert head is not None
    if head.op == "HardSwish":  # HardSwish(x) = x * HardSigmoid(x; 1/6, 1/2): split it to feed its gate
        gate = gs.Variable(f"{x.name}_equalize_hsig", dtype=x.dtype, shape=x.shape)
        graph.nodes.append(
            gs.Node("HardSigmoid", attrs={"alpha": 1.0 / 6.0, "beta": 0.5}, inputs=[original], outputs=[gate])
        )
        head.op, head.attrs = "Mul", {}
        head.inputs.clear()
        head.inputs.extend([x, gate])
        return
    head.inputs[[i for i, t in enumerate(head.inputs) if t is x][0]] = original


def equalize_activations(
    graph: gs.Graph,
    batches: Sequence[Mapping[str, np.ndarray]],
    folds: frozenset[str] | None = None,
    max_gain: float = MAX_GAIN,
    *,
    gates: bool = True,
    integer_gates: bool = False,
) -> EqualizeReport:
    """Find the sites, measure their channel ranges on `batches`, rescale them (in place), keep `graph` canonical.

    `folds`: given when the backend also quantises each layer's output past these activations
    (`QuantConfig.output_folds`); a site's conv output is then a quantised tensor too, unless its activation
    is one of them, and its range bounds the gains as well. `gates=False` leaves the gated activations
    (HardSwish, SiLU) alone, as builds do for now (`GATED_IN_BUILDS`); `integer_gates` leaves SiLU alone
    (`find_sites`)."""
    sites = find_sites(graph, gates=gates, integer_gates=integer_gates)
    if not sites:
        return EqualizeReport()
    quantized = {id(s): _quantized_tensors(s, folds) for s in sites}
    ranks = {t: s.producer.inputs[1].values.ndim for s in sites for t in quantized[id(s)]}
    ranges = channel_ranges(graph, ranks, batches)
    spread, gains = {}, {}
    for site in sites:
        measured = [ranges[t] for t in quantized[id(site)]]
        gain = equalizing_scales(*measured, max_gain=max_gain)
        if np.all(gain == 1.0) or integer_gates and _integer_gate(site) and _spread(measured[0]) < GATED_SPREAD:
            continue
        rescale_site(graph, site, gain)
        spread[site.tensor], gains[site.tensor] = (_spread(measured[0]), _spread(measured[0] * gain)), gain
    graph.cleanup().toposort()
    log.info("activation equalisation: %d tensors feeding depthwise convs rescaled", len(spread))
    return EqualizeReport(spread, gains)


def _integer_gate(site: EqualizeSite) -> bool:
    """A HardSwish site (one node, or x * HardSigmoid(x)): its rescaled gate costs an integer plan a depthwise conv."""
    head = site.gate_head
    return head is not None and (head.op == "HardSwish" or head.op == "HardSigmoid")


def _quantized_tensors(site: EqualizeSite, folds: frozenset[str] | None) -> list[str]:
    produced = site.producer.outputs[0].name
    if folds is None or produced == site.tensor or (len(site.activation) == 1 and site.activation[0].op in folds):
        return [site.tensor]
    return [site.tensor, produced]


def _spread(ranges: np.ndarray) -> float:
    live = ranges[ranges > 0]
    return float(live.max() / np.median(live)) if live.size else 1.0


def _weights(node: gs.Node) -> tuple[gs.Constant, gs.Constant | None] | None:
    """The Conv's weight and bias as initializers, or None when either is computed."""
    w = node.inputs[1] if len(node.inputs) > 1 else None
    b = node.inputs[2] if len(node.inputs) > 2 else None
    if not isinstance(w, gs.Constant) or (b is not None and b.name and not isinstance(b, gs.Constant)):
        return None
    if len(w.outputs) > 1 or (isinstance(b, gs.Constant) and len(b.outputs) > 1):
        return None  # shared weights: rescaling one conv would change the other
    return w, b if isinstance(b, gs.Constant) else None


def _is_depthwise(node: gs.Node, tensor: gs.Tensor) -> bool:
    if node.op != "Conv" or node.inputs[0] is not tensor or _weights(node) is None:
        return False
    w = node.inputs[1].values
    group = int(node.attrs.get("group", 1))
    return group > 1 and w.shape[1] == 1 and w.shape[0] == group


def _data_inputs(node: gs.Node) -> list[gs.Tensor]:
    return [t for t in node.inputs if isinstance(t, gs.Variable) and t.name]


def _scalar_operand(node: gs.Node, tensor: gs.Tensor) -> bool:
    """`node` is tensor / c, tensor * c, tensor + c or tensor - c (either order but for Div: tensor must be the
    dividend) with a scalar constant c."""
    others = [t for t in node.inputs if t is not tensor]
    if len(others) != 1 or (node.op == "Div" and node.inputs[0] is not tensor):
        return False
    value = constant_array(others[0])
    return value is not None and value.size == 1
