"""Placement: decide every Q/DQ site from the graph, the fusion groups and the config, without editing.

Rules (TensorRT explicit quantization, as summarised in DESIGN.md "Where Q/DQ go"):
- the inputs of Conv / ConvTranspose / Gemm / MatMul are quantised (activation per tensor, weight per
  output channel); outputs are not, so nothing lands inside a fused Conv+bias+activation group;
- the identity branch of a fused residual Add is quantised (the conv branch fuses into the epilogue);
- a Concat whose output is quantised gets its inputs quantised with the *same* threshold as its output,
  so TensorRT can write the producers straight into the output (concat elimination in INT8);
- graph outputs and every other op stay float; each consumer gets its own Q/DQ pair;
- where a backend's INT8 kernels need it (`QuantConfig.quantize_outputs`, set by the backend's
  `quant_config`), each quantised layer's output edges are quantised too.
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass, field

import onnx_graphsurgeon as gs

from trtopt.passes.query import input_channels, output_channels
from trtopt.quant import gates, pools
from trtopt.quant.config import QuantConfig
from trtopt.quant.rules import RULES, Mark

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class QuantSite:
    """One Q/DQ pair to insert: on input `index` of node `consumer`, reading `tensor`."""

    tensor: str
    consumer: str
    index: int
    kind: str  # "activation" | "weight"
    role: str  # "input" | "weight" | "residual" | "concat"
    axis: int = 0


@dataclass(frozen=True)
class QuantPlan:
    sites: tuple[QuantSite, ...]
    shared: tuple[tuple[str, ...], ...]  # tensors that must share one threshold (Concat groups)
    quantized_layers: tuple[str, ...]
    float_layers: dict[str, str] = field(default_factory=dict)  # node name -> why it stays float
    pair_bounded: bool = False  # dense layers' 8-bit weights with pairs that fit (QuantConfig.pair_bounded_weights)

    @property
    def activation_tensors(self) -> list[str]:
        """Tensors the calibrator must measure, in a stable order."""
        names = [s.tensor for s in self.sites if s.kind == "activation"]
        names += [t for group in self.shared for t in group]
        return list(dict.fromkeys(names))


def plan_quantization(graph: gs.Graph, config: QuantConfig | None = None) -> QuantPlan:
    config = config or QuantConfig()
    layers, float_layers = _eligible_layers(graph, config)
    sites: list[QuantSite] = []
    for node in layers:
        for mark in RULES.get(node.op)(node):
            sites.append(_site(node, mark))
    quantized = {n.name for n in layers}
    sites += _residual_sites(graph, quantized) if config.quantize_residual else []
    if config.quantize_outputs:
        runtime_float = {n.name for n in graph.nodes if n.op in config.float_ops}
        sites += _output_sites(graph, layers, sites, config.output_folds, set(float_layers) - runtime_float)
    pooled: list[tuple[str, ...]] = []
    if config.integer_pools:
        pool_sites, pooled = _pool_sites(graph, sites, config.output_folds)
        sites += pool_sites
    if config.integer_gates:
        gate_sites, gated = _gate_sites(graph, sites, quantized, set(config.exclude), config.integer_hard_swish)
        sites += gate_sites
        pooled += gated
    concat_sites, shared = _concat_sites(graph, sites, config)
    sites += concat_sites
    shared += pooled
    return QuantPlan(
        sites=tuple(sites),
        shared=tuple(shared),
        quantized_layers=tuple(n.name for n in layers),
        float_layers=float_layers,
        pair_bounded=config.pair_bounded_weights,
    )


def _site(node: gs.Node, mark: Mark) -> QuantSite:
    role = "weight" if mark.kind == "weight" else "input"
    return QuantSite(node.inputs[mark.index].name, node.name, mark.index, mark.kind, role, mark.axis)


def _eligible_layers(graph: gs.Graph, config: QuantConfig) -> tuple[list[gs.Node], dict[str, str]]:
    excluded = set(config.exclude)
    layers: list[gs.Node] = []
    float_layers: dict[str, str] = {}
    for node in graph.nodes:
        if node.op not in RULES:
            continue
        if node.name in excluded or node.op in excluded:
            float_layers[node.name] = "excluded by --exclude"
        elif node.op in config.float_ops:
            float_layers[node.name] = f"no INT8 {node.op} kernel on this backend"
        elif not RULES.get(node.op)(node):
            float_layers[node.name] = f"{node.op} form without an INT8 kernel"
        elif _is_tiny(node, config.channels) and not (
            config.integer_pools and pools.pooled_stem(node, config.output_folds)
        ):
            float_layers[node.name] = f"fewer than {config.channels} channels"
        elif config.float_leading_depthwise and _is_depthwise(node) and _reads_float_layer(node, layers):
            float_layers[node.name] = "depthwise conv fed by a float layer"
        else:
            layers.append(node)
    _warn_unmatched_excludes(graph, excluded)
    if config.keep_first_last and layers:
        for node in {layers[0].name: layers[0], layers[-1].name: layers[-1]}.values():
            float_layers[node.name] = "first/last layer kept in float"
            layers.remove(node)
    return layers, float_layers


def _warn_unmatched_excludes(graph: gs.Graph, excluded: set[str]) -> None:
    """An --exclude that names no node and no op type of the (optimised) graph is almost always a typo."""
    known = {n.name for n in graph.nodes} | {n.op for n in graph.nodes}
    for name in sorted(excluded - known):
        close = difflib.get_close_matches(name, sorted(known), n=3)
        log.warning(
            "--exclude %r matches no node name or op type of the optimised graph, so it keeps nothing in float%s",
            name, f" (close: {', '.join(close)})" if close else "; `trtopt inspect --layers` lists the names",
        )  # fmt: skip


def _is_tiny(node: gs.Node, min_channels: int) -> bool:
    sizes = [c for c in (input_channels(node), output_channels(node)) if c is not None]
    return any(c < min_channels for c in sizes)


def _is_depthwise(node: gs.Node) -> bool:
    group = int(node.attrs.get("group", 1))
    return node.op == "Conv" and group > 1 and group == input_channels(node) == output_channels(node)


def _reads_float_layer(node: gs.Node, quantized: list[gs.Node]) -> bool:
    """Whether `node`'s data input comes, through single-input ops (activations, padding, pooling), from the
    graph input or from a quantisable layer that stays float. The graph is topologically sorted, so every
    layer upstream has been decided."""
    names = {n.name for n in quantized}
    tensor: gs.Tensor | None = node.inputs[0]
    while tensor is not None and tensor.inputs:
        producer = tensor.inputs[0]
        if producer.op in RULES:
            return producer.name not in names
        tensor = _sole_source(producer)
    return tensor is not None  # None: a join (Add, Concat, ...): leave the decision to the other rules


def _sole_source(producer: gs.Node) -> gs.Tensor | None:
    """The one tensor every data input of `producer` derives from through single-input ops, or None.

    One data input: that input. Several: an activation written as a few elementwise nodes that all read
    the same tensor, as exporters write HardSwish (x * Clip(x + 3, 0, 6) / 6) and SiLU (x * Sigmoid(x)).
    Its inputs are x and a chain of single-input ops back to x, so the chains meet at x. A real join (a
    residual Add, a Concat) reads tensors whose chains meet at no tensor within a few ops."""
    chains = [_chain(t) for t in producer.inputs if isinstance(t, gs.Variable) and t.name]
    if not chains:
        return None
    common = [t for t in chains[0] if all(t.name in {c.name for c in chain} for chain in chains[1:])]
    return common[0] if common else None


def _chain(tensor: gs.Tensor, steps: int = 4) -> list[gs.Tensor]:
    """`tensor` and up to `steps` tensors before it along ops that read one data input and are no layer."""
    chain = [tensor]
    while len(chain) <= steps and tensor.inputs and tensor.inputs[0].op not in RULES:
        data = [t for t in tensor.inputs[0].inputs if isinstance(t, gs.Variable) and t.name]
        if len(data) != 1:
            break
        tensor = data[0]
        chain.append(tensor)
    return chain


def _residual_sites(graph: gs.Graph, quantized: set[str]) -> list[QuantSite]:
    """The identity branch of each fused residual Add whose conv is INT8.

    Measured and not kept (November 2026, avx2, default build, 64 held-out samples): leaving identity
    branches float (`QuantConfig.quantize_residual=False`). table-cls, whose worst tensor is its stem's
    residual sum, starts much nearer FP32 on its calibration pages (all INT8: 0.9212 -> 0.9843), but the
    search then keeps 3 layers float instead of 1 and held-out pages fall 0.98262 -> 0.98154; PP-OCRv4-rec
    is unchanged (0.98843). TensorRT would run those Adds outside the conv epilogue, for nothing."""
    from trtopt.passes import find_fusion_groups

    nodes = {n.name: n for n in graph.nodes}
    sites = []
    for group in find_fusion_groups(graph):
        if group.residual is None or group.nodes[0] not in quantized:
            continue
        add = next(nodes[name] for name in group.nodes if nodes[name].op == "Add")
        index = next(i for i, t in enumerate(add.inputs) if t.name == group.residual)
        sites.append(QuantSite(group.residual, add.name, index, "activation", "residual"))
    return sites


def _output_sites(
    graph: gs.Graph, layers: list[gs.Node], sites: list[QuantSite], folds: frozenset[str], float_layers: set[str]
) -> list[QuantSite]:
    """A pair on each consumer edge of what each INT8 layer's kernel writes, unless every consumer is a layer
    kept float: that layer was kept float to read its input unrounded, as it does in TensorRT's form, which
    has no output pairs. (On LORE's cell detector, docs/holdout.md, an INT8 conv's ReLU output spanning five
    decades fed a float 1x1 conv through such a pair; the pair rounded the background to zero and turned 180
    table cells into 69,912; without it, 364.) The INT8 layer then runs as a float kernel on quantised inputs.
    Dropping the pairs of every head too (layers with no INT8 layer downstream, e.g. a recogniser's last
    MatMul before its Softmax) was measured and not kept (bench_zoo's setting, avx2): PP-OCRv4-rec worst
    cosine 0.9866 -> 0.9868 with exact match 75.0% -> 68.8%, table-cls 0.9897 -> 0.9898, ddddocr-det box
    F1 93.4% -> 94.1%, ppocr-cls and ddddocr-ocr unchanged; float kernels for nothing. A layer float only
    because the backend's runtime has no INT8 kernel for its op (`QuantConfig.float_ops`) is not in
    `float_layers` here: its runtime rounded its input to INT8 before too, and the layer before it keeps its
    INT8 kernel."""
    taken = {(s.tensor, s.consumer, s.index) for s in sites}
    graph_outputs = {t.name for t in graph.outputs}
    top = {id(n) for n in graph.nodes}  # a node in an If/Loop body also reads outer tensors: it gets no pair
    added = []
    for layer in layers:
        out = _int8_kernel_output(layer, graph_outputs, folds)
        if out.outputs and all(consumer.name in float_layers for consumer in out.outputs):
            continue
        for consumer in (c for c in out.outputs if id(c) in top):
            for index, tensor in enumerate(consumer.inputs):
                if tensor is out and (out.name, consumer.name, index) not in taken:
                    added.append(QuantSite(out.name, consumer.name, index, "activation", "output"))
                    taken.add((out.name, consumer.name, index))
    return added


def _pool_sites(
    graph: gs.Graph, sites: list[QuantSite], folds: frozenset[str]
) -> tuple[list[QuantSite], list[tuple[str, ...]]]:
    """Pairs and shared thresholds that let pooling run on the integer grid (`trtopt.quant.pools`)."""
    edges = {(s.tensor, s.consumer, s.index) for s in sites if s.kind == "activation"}
    added, shared = pools.average_pool_edges(graph, edges, folds)
    added += pools.max_pool_edges(graph, edges | set(added), folds)
    edges |= set(added)
    new = [QuantSite(t, consumer, index, "activation", "pool") for t, consumer, index in added]
    return new, [*shared, *pools.shared_maxpools(graph, edges)]


def _gate_sites(
    graph: gs.Graph, sites: list[QuantSite], layers: set[str], excluded: set[str], hard: bool
) -> tuple[list[QuantSite], list[tuple[str, ...]]]:
    """Pairs that let element-wise gates (SiLU, squeeze-excite; `hard`: HardSwish too) run on the integer grid
    (`trtopt.quant.gates`)."""
    edges = {(s.tensor, s.consumer, s.index) for s in sites if s.kind == "activation"}
    added, shared = gates.gate_edges(graph, edges, layers, excluded, hard=hard)
    return [QuantSite(t, consumer, index, "activation", "gate") for t, consumer, index in added], list(shared)


def _int8_kernel_output(layer: gs.Node, graph_outputs: set[str], folds: frozenset[str]) -> gs.Tensor:
    """The tensor the backend's INT8 kernel of `layer` can write: the layer's output, or past a sole
    activation in `folds` that follows it. Any other op runs in float after the INT8 layer."""
    out = layer.outputs[0]
    while len(out.outputs) == 1 and out.outputs[0].op in folds and out.name not in graph_outputs:
        out = out.outputs[0].outputs[0]
    return out


def _concat_sites(
    graph: gs.Graph, existing: list[QuantSite], config: QuantConfig
) -> tuple[list[QuantSite], list[tuple[str, ...]]]:
    """Sites on the inputs of every Concat whose output is quantised, and the groups sharing a threshold.

    An input edge that already has a pair (with `quantize_outputs`, the output pair of an INT8 conv that
    feeds the Concat) keeps it: thresholds are per tensor, so that pair gets the group's threshold too. A second
    pair on the same edge would be inserted under the same names and close a cycle (issue #13, failure 2).
    """
    excluded = set(config.exclude)
    quantized_tensors = {s.tensor for s in existing if s.kind == "activation"}
    taken = {(s.consumer, s.index) for s in existing}
    sites, shared = [], []
    for node in graph.nodes:
        if node.op != "Concat" or node.outputs[0].name not in quantized_tensors:
            continue
        if node.name in excluded or "Concat" in excluded:
            continue
        inputs = [t for t in node.inputs if isinstance(t, gs.Variable)]
        if len(inputs) != len(node.inputs):
            continue  # constant inputs: leave this Concat float
        shared.append((node.outputs[0].name, *dict.fromkeys(t.name for t in inputs)))
        sites += [
            QuantSite(t.name, node.name, i, "activation", "concat")
            for i, t in enumerate(node.inputs)
            if (node.name, i) not in taken
        ]
    return sites, shared
