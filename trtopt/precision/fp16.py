"""FP16 by graph conversion: write float16 into the ONNX itself, no builder flags.

TensorRT 11 removed ``BuilderFlag.FP16``; networks are strongly typed, so a tensor runs in the type the
ONNX gives it (NVIDIA, "Migrating from TensorRT 10.x to 11.x": "use ... AutoCast to convert the ONNX
model to mixed precision before building"). This module is trtopt's converter:

1. Every node gets a region, FP16 or FP32. FP32 are: ops in `keep_ops` (range or accumulation
   sensitive: Exp/Pow overflow past 65504, reductions and normalisations sum many terms), nodes named in
   `keep_nodes`, non-ONNX domains, ops typed by attribute or holding subgraphs (`_ALWAYS_FP32`; their
   subgraphs read float32 Casts of outer values), nodes with a constant input past float16's range.
2. Q/DQ pairs: ONNX allows float16 scales (and so float16 DequantizeLinear outputs) from opset 19 on,
   and ONNX Runtime runs them (tested: ORT 1.31 rejects them at opset 13). With opset >= 19 and every
   scale inside float16's normal range [2^-14, 65504], the scales become float16: DequantizeLinear then
   feeds the FP16 consumer directly - Q -> DQ -> Conv stays the exact pattern TensorRT fuses into an
   INT8 kernel, with an FP16 output. Otherwise the Q/DQ keep FP32 scales, and so does the compute they
   feed (the INT8 conv keeps an FP32 output); Casts go after it. Never a Cast between DQ and its
   consumer, which would hide the INT8 pattern from TensorRT. Q and the DQs it feeds share one region.
3. Float32 initializers and Constants become float16 when every consumer wants float16 (values beyond
   +-65504, which rule 1 keeps from FP16 consumers, would be clamped, with a warning); graph inputs/outputs stay
   float32 unless `keep_io_fp32=False`.
4. One Cast per (tensor, target type) wherever a tensor's type differs from what a consumer wants.
   `Resize`'s scales input is float32 by the ONNX spec and is never converted.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtopt.errors import ModelError
from trtopt.frontend import weightless

log = logging.getLogger(__name__)

FLOAT, FLOAT16 = TensorProto.FLOAT, TensorProto.FLOAT16
FP16_MAX = 65504.0
FP16_MIN_NORMAL = 2.0**-14
QDQ_FP16_MIN_OPSET = 19  # QuantizeLinear-19 / DequantizeLinear-19 accept float16 scales

DEFAULT_KEEP_OPS: tuple[str, ...] = (
    "Softmax", "LogSoftmax", "LayerNormalization", "GroupNormalization", "InstanceNormalization", "ReduceMean",
    "ReduceSum", "ReduceSumSquare", "ReduceL2", "ReduceLogSumExp", "Exp", "Log", "Pow",
)  # fmt: skip
_ALWAYS_FP32 = frozenset(
    {
        "If", "Loop", "Scan",  # subgraphs: not descended into
        "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial",
        "EyeLike", "NonMaxSuppression", "DynamicQuantizeLinear",
        "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger",  # float32-only scales
    }
)  # fmt: skip
_FP32_SLOTS = {"Resize": {2}, "Upsample": {1}}  # input slots the ONNX spec types tensor(float)
_IMPLICIT = -1  # the "slot" of an outer value that a subgraph reads by name
_QDQ = ("QuantizeLinear", "DequantizeLinear")


@dataclass
class _Graph:
    """Producer/consumer index over a model's main graph."""

    model: onnx.ModelProto
    float_tensors: set[str]
    producer: dict[str, int] = field(default_factory=dict)
    consumers: dict[str, list[tuple[int, int]]] = field(default_factory=lambda: defaultdict(list))
    consts: dict[str, np.ndarray] = field(default_factory=dict)  # initializers and Constant outputs

    def __post_init__(self) -> None:
        graph = self.model.graph
        for init in graph.initializer:
            self.consts[init.name] = numpy_helper.to_array(init)
        for i, node in enumerate(graph.node):
            for name in node.output:
                self.producer[name] = i
            for slot, name in enumerate(node.input):
                if name:
                    self.consumers[name].append((i, slot))
            for name in _outer_reads(node):  # a branch or loop body reads it by name: in its own type, float32
                self.consumers[name].append((i, _IMPLICIT))
            value = _constant_value(node)
            if value is not None:
                self.consts[node.output[0]] = value


def convert_to_fp16(
    model: onnx.ModelProto,
    *,
    keep_io_fp32: bool = True,
    keep_ops: Iterable[str] = DEFAULT_KEEP_OPS,
    keep_nodes: Iterable[str] = (),
) -> onnx.ModelProto:
    """A copy of `model` computing in float16 outside the kept ops and the INT8 (Q/DQ) pattern's needs."""
    converted = onnx.ModelProto()
    converted.CopyFrom(model)
    index = _Graph(converted, _float32_tensors(converted))
    keep_nodes = set(keep_nodes)
    unknown = keep_nodes - {n.name for n in converted.graph.node}
    if unknown:
        raise ModelError(
            f"keep_nodes names node(s) {sorted(unknown)} that the model does not have.",
            fix="Use node names as `trtopt inspect` lists them.",
        )
    fp16 = _assign_regions(index, set(keep_ops), keep_nodes, _opset(converted))
    home = _tensor_types(index, fp16, keep_io_fp32)
    kept = sorted(
        {converted.graph.node[i].op_type for i, is16 in fp16.items() if not is16 and _touches_float(index, i)}
    )
    casts = _rewrite(index, fp16, home, keep_io_fp32)
    log.info(
        "fp16: %d node(s) in FP16, kept FP32: %s; %d Cast(s) inserted",
        sum(fp16.values()),
        kept or "none",
        casts,
    )
    del converted.graph.value_info[:]
    try:
        return weightless.infer_shapes(converted)
    except onnx.shape_inference.InferenceError as exc:  # custom ops: keep the model without value_info
        log.debug("shape inference after fp16 conversion failed: %s", exc)
        return converted


def _assign_regions(index: _Graph, keep_ops: set[str], keep_nodes: set[str], opset: int) -> dict[int, bool]:
    """node index -> True for FP16; see the module docstring for the rules."""
    nodes = index.model.graph.node
    fp16 = {
        i: not (
            node.op_type in keep_ops
            or node.name in keep_nodes
            or node.op_type in _ALWAYS_FP32
            or node.domain not in ("", "ai.onnx")
            or (node.op_type in _QDQ and not _scale_fits_fp16(index, node, opset))
            or _holds_beyond_fp16(index, node)
        )
        for i, node in enumerate(nodes)
    }
    changed = True
    while changed:  # propagate FP32 through Q/DQ pairs and their direct consumers until stable
        changed = False
        for i, node in enumerate(nodes):
            users = [c for name in node.output for c, _ in index.consumers.get(name, [])]
            if node.op_type == "DequantizeLinear":
                wanted = fp16[i] and all(fp16[c] for c in users)
            elif node.op_type == "QuantizeLinear":
                wanted = fp16[i] and all(fp16[c] for c in users if nodes[c].op_type == "DequantizeLinear")
                for c in users:
                    if not wanted and nodes[c].op_type == "DequantizeLinear" and fp16[c]:
                        fp16[c], changed = False, True
            else:
                fed_by = [index.producer.get(name) for name in node.input if name]
                wanted = fp16[i] and not any(
                    p is not None and nodes[p].op_type == "DequantizeLinear" and not fp16[p] for p in fed_by
                )
            if wanted != fp16[i]:
                fp16[i], changed = wanted, True
    return fp16


def _holds_beyond_fp16(index: _Graph, node: onnx.NodeProto) -> bool:
    """A float constant input past float16's range: an unfolded BatchNormalization's variance (PP-OCRv4-det has
    9.8e7) would otherwise be clamped to 65504, and the model would compute something else (cosine 0.04)."""
    values = [index.consts[n] for n in node.input if n in index.consts and index.consts[n].dtype == np.float32]
    return any(bool(np.any(np.isfinite(v) & (np.abs(v) > FP16_MAX))) for v in values)


def _scale_fits_fp16(index: _Graph, node: onnx.NodeProto, opset: int) -> bool:
    if opset < QDQ_FP16_MIN_OPSET or len(node.input) < 2:
        return False
    scale = index.consts.get(node.input[1])
    if scale is None:
        return False
    magnitude = np.abs(scale.astype(np.float64))
    return bool(np.all((magnitude >= FP16_MIN_NORMAL) & (magnitude <= FP16_MAX)))


def _wants(index: _Graph, fp16: dict[int, bool], node_index: int, slot: int) -> int:
    node = index.model.graph.node[node_index]
    if slot == _IMPLICIT or slot in _FP32_SLOTS.get(node.op_type, ()):
        return FLOAT
    return FLOAT16 if fp16[node_index] else FLOAT


def _tensor_types(index: _Graph, fp16: dict[int, bool], keep_io_fp32: bool) -> dict[str, int]:
    """The element type each float32 tensor will have where it is produced."""
    graph = index.model.graph
    inputs = {t.name for t in graph.input}
    pinned = inputs | {t.name for t in graph.output}
    home: dict[str, int] = {}
    for name in index.float_tensors:
        if name in inputs:
            home[name] = FLOAT if keep_io_fp32 else FLOAT16
        elif name in index.consts and (name not in index.producer or _is_constant(index, name)):
            wants = {_wants(index, fp16, c, s) for c, s in index.consumers.get(name, [])}
            home[name] = FLOAT16 if wants == {FLOAT16} and name not in pinned else FLOAT
        elif name in index.producer:
            home[name] = FLOAT16 if fp16[index.producer[name]] else FLOAT
    return home


def _rewrite(index: _Graph, fp16: dict[int, bool], home: dict[str, int], keep_io_fp32: bool) -> int:
    """Apply the types: convert constants, retag attributes, insert Casts. Returns the Cast count."""
    graph = index.model.graph
    old_nodes = list(graph.node)
    new_nodes: list[onnx.NodeProto] = []
    cast_of: dict[tuple[str, int], str] = {}
    unique = _namer(graph)
    renamed = _rename_io_outputs(graph, home, keep_io_fp32, unique)
    original_of = {v: k for k, v in renamed.items()}
    io_type = FLOAT if keep_io_fp32 else FLOAT16
    for i, node in enumerate(old_nodes):
        for slot, name in enumerate(node.input):
            if name not in home:
                continue
            want, have = _wants(index, fp16, i, slot), home[name]
            if name in renamed and want != have and want == io_type:
                continue  # the graph output's own Cast (emitted right after its producer) has this type
            if want != have:
                key = (name, want)
                if key not in cast_of:
                    cast_of[key] = unique(f"{name}_{_suffix(want)}")
                    new_nodes.append(_cast(renamed.get(name, name), cast_of[key], want))
                node.input[slot] = cast_of[key]
            elif name in renamed:
                node.input[slot] = renamed[name]
        for name in _outer_reads(node):  # subgraphs keep float32 (`_ALWAYS_FP32`): they read a float32 copy
            if name in home and home[name] != FLOAT:
                key = (name, FLOAT)
                if key not in cast_of:
                    cast_of[key] = unique(f"{name}_{_suffix(FLOAT)}")
                    new_nodes.append(_cast(renamed.get(name, name), cast_of[key], FLOAT))
                _rename_outer_reads(node, name, cast_of[key])
            elif name in renamed:
                _rename_outer_reads(node, name, renamed[name])
        _retag(node, home, fp16[i])
        for j, name in enumerate(node.output):
            if name in renamed:
                node.output[j] = renamed[name]
        new_nodes.append(node)
        for name in node.output:
            if name in original_of:
                new_nodes.append(_cast(name, original_of[name], io_type))
    for init in graph.initializer:
        if home.get(init.name) == FLOAT16:
            init.CopyFrom(numpy_helper.from_array(_to_fp16(index.consts[init.name], init.name), init.name))
    for value in list(graph.input) + list(graph.output):
        if value.name in home and value.type.tensor_type.elem_type == FLOAT:
            value.type.tensor_type.elem_type = FLOAT if keep_io_fp32 else FLOAT16
    del graph.node[:]
    graph.node.extend(new_nodes)
    return len(cast_of) + len(renamed)


def _rename_io_outputs(
    graph: onnx.GraphProto, home: dict[str, int], keep_io_fp32: bool, unique: Callable[[str], str]
) -> dict[str, str]:
    """Graph outputs whose producer's type is not the I/O type: the producer writes `<name>_fp16` (or
    `_fp32`) instead, and a Cast after it produces the output under its original name."""
    io_type = FLOAT if keep_io_fp32 else FLOAT16
    inputs = {t.name for t in graph.input}
    return {
        v.name: unique(f"{v.name}_{_suffix(home[v.name])}")
        for v in graph.output
        if v.name in home and home[v.name] != io_type and v.name not in inputs
    }


def _retag(node: onnx.NodeProto, home: dict[str, int], is_fp16: bool) -> None:
    """Attributes that carry a float type: Cast.to, ConstantOfShape/Constant values, DQ output_dtype."""
    if node.op_type == "Constant" and home.get(node.output[0]) == FLOAT16:
        value = _to_fp16(_constant_value(node), node.output[0])  # type: ignore[arg-type]
        del node.attribute[:]
        node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(value)))
        return
    if not is_fp16:
        return
    for attr in node.attribute:
        if (node.op_type, attr.name) in (
            ("Cast", "to"),
            ("DequantizeLinear", "output_dtype"),
        ) and attr.i == FLOAT:
            attr.i = FLOAT16
        elif node.op_type == "ConstantOfShape" and attr.name == "value" and attr.t.data_type == FLOAT:
            attr.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attr.t).astype(np.float16)))


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    return [g for a in node.attribute for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs)]


def _outer_reads(node: onnx.NodeProto) -> list[str]:
    """The names `node`'s subgraphs (and theirs) read from outside themselves, once each, in order."""
    reads: dict[str, None] = {}
    for graph in _subgraphs(node):
        inner = {v.name for v in [*graph.input, *graph.initializer]} | {o for n in graph.node for o in n.output}
        for sub in graph.node:
            names = [*sub.input, *_outer_reads(sub)]
            reads.update((name, None) for name in names if name and name not in inner)
    return list(reads)


def _rename_outer_reads(node: onnx.NodeProto, old: str, new: str) -> None:
    for graph in _subgraphs(node):
        for sub in graph.node:
            sub.input[:] = [new if name == old else name for name in sub.input]
            _rename_outer_reads(sub, old, new)


def _to_fp16(values: np.ndarray, name: str) -> np.ndarray:
    """Round to float16; finite values beyond +-65504 would become inf, so they are clamped (warned)."""
    values = np.asarray(values, dtype=np.float32)
    over = np.isfinite(values) & (np.abs(values) > FP16_MAX)
    if over.any():
        log.warning(
            "fp16: %d value(s) of %r exceed the float16 range (max |x| = %g); clamped to +-65504",
            int(over.sum()), name, float(np.abs(values[over]).max()),
        )  # fmt: skip
        values = np.where(over, np.sign(values) * FP16_MAX, values)
    tiny = (values != 0) & (np.abs(values) < 2.0**-24)
    if tiny.any():
        log.debug("fp16: %d value(s) of %r underflow to 0 in float16", int(tiny.sum()), name)
    return values.astype(np.float16)


def _float32_tensors(model: onnx.ModelProto) -> set[str]:
    try:
        typed = weightless.infer_shapes(model)
    except onnx.shape_inference.InferenceError as exc:
        raise ModelError(
            f"Cannot infer tensor types for the FP16 conversion: {exc}",
            fix="Check the model with onnx.checker.check_model, or build without --fp16.",
        ) from None
    graph = typed.graph
    names = {
        v.name
        for v in list(graph.input) + list(graph.output) + list(graph.value_info)
        if v.type.tensor_type.elem_type == FLOAT
    }
    names |= {t.name for t in graph.initializer if t.data_type == FLOAT}
    for node in graph.node:
        value = _constant_value(node)
        if value is not None and value.dtype == np.float32:
            names.add(node.output[0])
    return names


def _constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    """The value of a Constant node given as a tensor, float or floats; None for anything else."""
    if node.op_type != "Constant" or len(node.attribute) != 1:
        return None
    attr = node.attribute[0]
    if attr.name == "value":
        return numpy_helper.to_array(attr.t)
    if attr.name in ("value_float", "value_floats"):
        return np.asarray(helper.get_attribute_value(attr), dtype=np.float32)
    return None


def _is_constant(index: _Graph, name: str) -> bool:
    return index.model.graph.node[index.producer[name]].op_type == "Constant"


def _touches_float(index: _Graph, i: int) -> bool:
    node = index.model.graph.node[i]
    return any(n in index.float_tensors for n in list(node.input) + list(node.output))


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _cast(source: str, target: str, to: int) -> onnx.NodeProto:
    return helper.make_node("Cast", [source], [target], name=f"{target}_cast", to=to)


def _suffix(elem_type: int) -> str:
    return "fp16" if elem_type == FLOAT16 else "fp32"


def _namer(graph: onnx.GraphProto) -> Callable[[str], str]:
    """Fresh tensor names: `base`, else `base_1`, `base_2`..., never one the graph already uses."""
    taken = {n for node in graph.node for n in list(node.input) + list(node.output)}
    taken |= (
        {t.name for t in graph.initializer} | {t.name for t in graph.input} | {t.name for t in graph.output}
    )

    def unique(base: str) -> str:
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        return name

    return unique
