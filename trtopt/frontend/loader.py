"""Read an ONNX model (path or bytes) into onnx-graphsurgeon's IR, rejecting bad input with a clear message.

Checks, in order: the file exists and parses as ONNX; external weights stay inside the model's folder
(a path such as ``../../etc/passwd`` in a tensor's ``location`` is refused, because loading it would
read arbitrary files); the model declares a default-domain opset; every op is known; onnx.checker passes.
A model outside opsets 11-22 is then converted (`trtopt.frontend.opset`). Then shape inference and
constant folding run, so passes see concrete shapes and constant weights.
"""

from __future__ import annotations

import difflib
import functools
import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnx_graphsurgeon as gs
from google.protobuf.message import DecodeError
from onnx_graphsurgeon.logger import G_LOGGER

from trtopt.errors import ModelError
from trtopt.frontend import weightless
from trtopt.frontend.edit import canonicalize
from trtopt.frontend.experimental_ops import DROPPED, DROPPED_HINT, without_experimental_ops
from trtopt.frontend.folding import fold_to_fixpoint
from trtopt.frontend.io_types import check_tensor_io, zero_sizes_as_unknown
from trtopt.frontend.opset import MIN_OPSET, check_opset_known, model_at_opset
from trtopt.frontend.shapes import Shape, apply_shapes
from trtopt.frontend.writer import PROTOBUF_LIMIT

log = logging.getLogger(__name__)

MAX_IR_VERSION = 10
DEFAULT_DOMAINS = ("", "ai.onnx")
# Contrib ops that ONNX Runtime runs and trtopt itself emits for the CPU backend.
KNOWN_EXTRA_DOMAINS = ("com.microsoft",)
ML_DOMAIN = "ai.onnx.ml"  # ONNX's classical-ML ops (Scaler, ZipMap, tree ensembles): ONNX Runtime runs them

G_LOGGER.severity = G_LOGGER.ERROR


@dataclass(frozen=True)
class LoadedModel:
    """A validated model and where it came from (`None` for bytes). `opset` is the model's opset now,
    `source_opset` the one its file declares (they differ when it was converted)."""

    model: onnx.ModelProto
    path: Path | None
    opset: int
    source_opset: int


def load_model(source: str | os.PathLike[str] | bytes, *, min_opset: int = MIN_OPSET) -> LoadedModel:
    """Parse and validate an ONNX model, loading external data safely. Raises `ModelError`.

    A model whose opset is below `min_opset` (an INT8 build asks for `MIN_QDQ_OPSET`) or outside the
    supported range is converted (see `trtopt.frontend.opset`).
    """
    if isinstance(source, (bytes, bytearray)):
        model = _parse(bytes(source), "<bytes>")
        path = None
        _check_no_external_data(model)
    else:
        path = Path(source)
        _check_file(path)
        model = _parse(path.read_bytes(), str(path))
        _load_external_data(model, path)
    where = str(path) if path else "<bytes>"
    _check_has_graph(model, where)
    opset = _default_opset(model, where)
    check_opset_known(opset, where)
    model = without_experimental_ops(model, opset)  # ImageScaler and the like (trtopt.frontend.experimental_ops)
    _check_ops(model, where)
    check_tensor_io(model, where)
    _check_valid(model, where)
    zero_sizes_as_unknown(model, where)
    converted = model_at_opset(model, opset, where, min_opset=min_opset)
    return LoadedModel(model=converted, path=path, opset=_default_opset(converted, where), source_opset=opset)


def graph_from_onnx(
    source: str | os.PathLike[str] | bytes | onnx.ModelProto,
    *,
    shapes: dict[str, Shape] | None = None,
    fold_constants: bool = True,
) -> gs.Graph:
    """Load a model into a gs.Graph with inferred shapes and folded constants, in the passes' canonical
    form (dead nodes removed, topologically sorted, every node named).

    Each round trip between onnx-graphsurgeon and protobuf copies every weight (seconds on VGG-19's 550 MB),
    so shapes are inferred on the protobuf before the first import where no input shape is set (and the
    model fits one protobuf), and again after constant folding only when folding changed the graph. The
    graph is the same either way. The caller's `source` is never changed."""
    model = source if isinstance(source, onnx.ModelProto) else load_model(source).model
    if shapes or weightless.serialized_size(model) >= PROTOBUF_LIMIT:  # on disk, inference moves the proto's weights
        graph = gs.import_onnx(model)
        apply_shapes(graph, shapes or {})
        graph = _infer_given_shapes(graph) if shapes else _infer_shapes(graph)
    else:
        graph = _inferred(model)
    if fold_constants:
        graph = fold_to_fixpoint(graph, _infer_shapes)
    return canonicalize(graph)


def _infer_given_shapes(graph: gs.Graph) -> gs.Graph:
    """Shapes inferred from the input sizes `--shapes` set, in ONNX's strict mode, which refuses to merge them
    with contradicting sizes the model declares for its computed tensors. Only then are the declared shapes
    dropped (`_forget_shapes`) and inferred again: where they agree they stay as they are. Dropping them for
    every model also dropped the symbolic batch of outputs that agree (layout-cdla's were then declared batch
    1, and each verification on 16 samples warned six times). Where they do contradict, dropping them gives
    shape inference the whole graph: PP-OCR's orientation classifier, whose opset 11 -> 13 conversion writes
    such value_info, folds 5 more shape nodes and quantises more residual Adds' inputs (fusion groups 24 ->
    31; held-out worst cosine 0.9963 -> 0.9946 in BENCHMARKS *zoo*'s setting, avx2; its own verification
    samples 0.99893 -> 0.99921)."""
    model = gs.export_onnx(graph, do_type_check=False)
    if weightless.serialized_size(model) >= PROTOBUF_LIMIT:
        return _inferred(model)
    try:
        return weightless.inferred_graph(model, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        declared = _forget_shapes(graph)
        graph = _infer_shapes(graph)
        _keep_output_ranks(graph, declared)
        return graph


def _forget_shapes(graph: gs.Graph) -> dict[str, object]:
    """Clear the declared shapes of every computed tensor (graph outputs and value_info) before new input
    sizes are inferred through the graph, and return them. Declared sizes hold for the inputs the exporter
    traced with: LORE's lore_process.onnx declares [batch, 54, 4] outputs for any number of cells, and onnx's
    version converter spreads the 54 into the value_info of the layers before. Kept, they contradict the
    sizes inferred from the new inputs, and ONNX Runtime refuses the graph ("Can't merge shape info")."""
    inputs = {t.name for t in graph.inputs}
    declared = {}
    for name, tensor in graph.tensors().items():
        if isinstance(tensor, gs.Variable) and name not in inputs:
            declared[name], tensor.shape = tensor.shape, None
    return declared


def _keep_output_ranks(graph: gs.Graph, declared: dict[str, object]) -> None:
    """Graph outputs whose shape inference cannot say keep their declared rank, sizes unknown (the declared
    sizes may be the stale ones `_forget_shapes` cleared)."""
    for tensor in graph.outputs:
        shape = declared.get(tensor.name)
        if tensor.shape is None and isinstance(shape, (list, tuple)):
            tensor.shape = [d if isinstance(d, str) else None for d in shape]


def onnx_from_graph(graph: gs.Graph) -> onnx.ModelProto:
    """Export a gs.Graph back to an ONNX ModelProto that ONNX Runtime and TensorRT accept."""
    return with_supported_ir(gs.export_onnx(graph))


def with_supported_ir(model: onnx.ModelProto) -> onnx.ModelProto:
    """Cap the IR version at one every supported runtime reads (new onnx releases write newer ones).

    IR 10 carries every opset up to 22 (onnx/onnx docs/Versioning.md), so nothing is lost.
    """
    if model.ir_version > MAX_IR_VERSION:
        model.ir_version = MAX_IR_VERSION
    return model


def _check_file(path: Path) -> None:
    if not path.exists():
        raise ModelError(f"Model file {str(path)!r} does not exist.", fix="Check the path and try again.")
    if path.is_dir():
        raise ModelError(
            f"{str(path)!r} is a folder, not an ONNX model file.", fix="Pass the .onnx file itself."
        )
    if path.stat().st_size == 0:
        raise ModelError(
            f"Model file {str(path)!r} is empty (0 bytes).", fix="Re-export or re-copy the model."
        )


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise ModelError(
            f"{where} is not a readable ONNX model: the protobuf does not parse ({exc}). The file may be "
            f"truncated (an interrupted download or copy) or not ONNX at all.",
            fix="Re-export or re-download the model, and check its size against the original.",
        ) from None
    return model


def _check_has_graph(model: onnx.ModelProto, where: str) -> None:
    if model.ir_version <= 0 or not model.opset_import or not model.graph.output:
        raise ModelError(
            f"{where} is not an ONNX model: it has no IR version, opset or graph outputs "
            f"(ir_version={model.ir_version}, opsets={len(model.opset_import)}, "
            f"outputs={len(model.graph.output)}). "
            f"It may be another kind of file, or a model truncated by an interrupted copy.",
            fix="Pass a model exported with torch.onnx.export, tf2onnx or another ONNX exporter.",
        )


def _check_valid(model: onnx.ModelProto, where: str) -> None:
    """onnx.checker, after the opset and op checks so that those get their own, clearer messages."""
    try:
        if weightless.serialized_size(model) < PROTOBUF_LIMIT:
            weightless.check_model(model)
    except (onnx.checker.ValidationError, UnicodeDecodeError) as exc:  # a name that is not UTF-8 (fuzzed bytes)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(
            f"{where} is not a valid ONNX model: {first}",
            fix="The file may be truncated or hand-edited; re-export it and run onnx.checker.check_model.",
        ) from None


def _external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    helper = onnx.external_data_helper
    return [t for t in helper._get_all_tensors(model) if helper.uses_external_data(t)]


def _check_no_external_data(model: onnx.ModelProto) -> None:
    """Bytes have no folder, so weights kept in side files cannot be found (or safely resolved)."""
    external = _external_tensors(model)
    if external:
        raise ModelError(
            f"The model given as bytes keeps {len(external)} tensor(s) (e.g. {external[0].name!r}) in "
            f"external data files, which cannot be found without the model's folder.",
            fix="Load the model from its .onnx path instead, with the weight files next to it.",
        )


def _load_external_data(model: onnx.ModelProto, path: Path) -> None:
    base = path.parent.resolve()
    external = _external_tensors(model)
    for tensor in external:
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        bad = not location or "\x00" in location or os.path.isabs(location)  # a NUL byte: no file has that name
        target = base if bad else (base / location).resolve()
        if bad or not target.is_relative_to(base):
            raise ModelError(
                f"Tensor {tensor.name!r} in {str(path)!r} points to external data at {location!r}, which is not "
                f"a file name inside the model's folder {str(base)!r}. trtopt refuses to read it (a crafted model "
                f"could read any file this way).",
                fix="Keep the weight files next to the .onnx file and refer to them by relative name.",
            )
        if not target.is_file():
            raise ModelError(
                f"Tensor {tensor.name!r} in {str(path)!r} keeps its weights in {location!r}, "
                "which is missing.",
                fix=f"Copy {location!r} into {str(base)!r} next to the model.",
            )
        _check_external_range(tensor, target, path)
    if external:
        try:
            onnx.external_data_helper.load_external_data_for_model(model, str(base))
        except (ValueError, OSError, MemoryError, OverflowError) as exc:
            raise ModelError(
                f"{str(path)!r}: its external weight data cannot be loaded ({type(exc).__name__}: {exc}).",
                fix="Re-export the model with its weight files, or save it without external data.",
            ) from None


def _check_external_range(tensor: onnx.TensorProto, target: Path, path: Path) -> None:
    """offset/length must be non-negative integers inside the weight file (a crafted model gives others)."""
    entries = {e.key: e.value for e in tensor.external_data}
    size = target.stat().st_size
    try:
        offset = int(entries.get("offset") or 0)
        length = int(entries["length"]) if entries.get("length") else size - offset
    except ValueError:
        offset = length = -1
    if offset < 0 or length < 0 or offset + length > size:
        raise ModelError(
            f"Tensor {tensor.name!r} in {str(path)!r} reads bytes {entries.get('offset', '0')}+"
            f"{entries.get('length', '(rest)')} of {target.name!r}, which has {size:,} bytes.",
            fix="The model or its weight file is truncated or hand-edited; re-export the model.",
        )


def _default_opset(model: onnx.ModelProto, where: str) -> int:
    versions = [o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS]
    if not versions and {n.domain for n in model.graph.node} == {ML_DOMAIN}:  # onnxruntime's logreg_iris.onnx
        ops = ", ".join(dict.fromkeys(n.op_type for n in model.graph.node))
        raise ModelError(f"{where} holds only classical-ML ops ({ML_DOMAIN}: {ops}), and no layer "
                         "trtopt could quantise or fuse (Conv, Gemm, MatMul).",
                         fix="Run it with ONNX Runtime as it is; trtopt builds neural networks.")
    if not versions:
        raise ModelError(f"{where} declares no default-domain opset.", fix="Re-export with an opset, e.g. 17.")
    return versions[0]


def _check_ops(model: onnx.ModelProto, where: str) -> None:
    """Every node, in the main graph and in every If / Loop / Scan subgraph (a branch that calibration never
    takes must not fail only later, at `trtopt run`), is a standard op, a local function or an ONNX Runtime
    contrib op."""
    local_functions = {(f.domain, f.name) for f in model.functions}
    contrib = _contrib_op_names()
    for index, (node, graph_name) in enumerate(all_nodes(model.graph)):
        if (node.domain, node.op_type) in local_functions:
            continue
        if node.domain in KNOWN_EXTRA_DOMAINS and (contrib is None or node.op_type in contrib):
            continue
        if node.domain in DEFAULT_DOMAINS and onnx.defs.has(node.op_type, ""):
            continue
        if node.domain == ML_DOMAIN and onnx.defs.has(node.op_type, ML_DOMAIN):
            continue
        domain = node.domain or "ai.onnx"
        close = difflib.get_close_matches(node.op_type, _standard_op_names(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close and node.domain in DEFAULT_DOMAINS else ""
        hint = DROPPED_HINT if node.op_type in DROPPED and node.domain in DEFAULT_DOMAINS else hint
        inside = f" inside subgraph {graph_name!r}" if graph_name != model.graph.name else ""
        raise ModelError(
            f"{where}: node {node.name or f'#{index}'!r}{inside} uses op {node.op_type!r} from domain {domain!r}, "
            f"which is not a standard ONNX op trtopt knows{hint}.",
            fix="Export the model without custom ops (or with their ONNX-standard decomposition); custom "
            "TensorRT plugins are not supported.",
        )


def all_nodes(graph: onnx.GraphProto) -> Iterator[tuple[onnx.NodeProto, str]]:
    """(node, name of the graph holding it) for the graph and all nested subgraphs, without recursion."""
    stack = [graph]
    while stack:
        current = stack.pop()
        for node in current.node:
            yield node, current.name
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    stack.append(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    stack.extend(attr.graphs)


@functools.cache
def _contrib_op_names() -> frozenset[str] | None:
    """ONNX Runtime's com.microsoft ops, or None where ONNX Runtime cannot say (then they are not checked)."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as state

        return frozenset(s.name for s in state.get_all_operator_schema() if s.domain in KNOWN_EXTRA_DOMAINS)
    except (ImportError, AttributeError, RuntimeError):
        return None


@functools.cache
def _standard_op_names() -> tuple[str, ...]:
    return tuple(sorted({schema.name for schema in onnx.defs.get_all_schemas() if schema.domain == ""}))


def _infer_shapes(graph: gs.Graph) -> gs.Graph:
    return _inferred(gs.export_onnx(graph, do_type_check=False))


def _inferred(model: onnx.ModelProto) -> gs.Graph:
    try:
        if weightless.serialized_size(model) < PROTOBUF_LIMIT:
            return weightless.inferred_graph(model, data_prop=True)
        return gs.import_onnx(_infer_shapes_on_disk(model))
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        raise ModelError(
            f"ONNX shape inference failed: {str(exc).strip().splitlines()[0]}",
            fix="The model's shapes or types are inconsistent; check the --shapes you passed and the export.",
        ) from None


def _infer_shapes_on_disk(model: onnx.ModelProto) -> onnx.ModelProto:
    """Shape inference for models over protobuf's 2 GiB limit works on files, not messages."""
    with tempfile.TemporaryDirectory(prefix="trtopt-shapes-") as tmp:
        src, dst = Path(tmp, "in.onnx"), Path(tmp, "out.onnx")
        onnx.save_model(model, src, save_as_external_data=True, location="in.data")
        onnx.shape_inference.infer_shapes_path(str(src), str(dst), data_prop=True)
        inferred = onnx.load_model(dst, load_external_data=False)
        onnx.external_data_helper.load_external_data_for_model(inferred, tmp)
    return inferred
