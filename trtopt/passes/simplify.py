"""The generic clean-up, by ONNX Runtime's basic graph level: constant and shape-subgraph folding, redundant
node elimination, its transpose optimizer, MatMul + Add into Gemm (Conv + BN / Mul / Add folds are left to
`fold_batchnorm`).

Measured before writing it (issue #45, a ResNet-50 port with 845 nodes, 110 Transposes, 309 Casts): ONNX
Runtime's basic level left 318 nodes and 4 Transposes, onnxslim 0.1.98 439 nodes and 102 Transposes, trtopt's own
passes 785. ONNX Runtime is already a dependency, its basic level is what `quant_pre_process` runs, and its
transforms are exact and execution-provider independent (ONNX Runtime's graph-optimizations documentation:
"basic" rewrites are semantics-preserving and run before partitioning), so trtopt calls it rather than writing
it again. trtopt owns the rest: what ONNX Runtime leaves is handled by `remove_noops`, `sink_transposes` and the
folds after it; its result is checked against the model file like every pass; and `find_simplifications`
reports what it removed, by op, for `trtopt inspect`.

It runs only where its result is plain ONNX trtopt can read back: float32 compute (on a float16 graph the CPU
provider would write the Casts it inserts for its own kernels into the saved model), no custom domains, no
subgraphs, and no quantisation already in the graph (the basic level moves and merges Q/DQ pairs). Elsewhere
the pass leaves the graph alone and records why (`skip_reason`).
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from trtopt.frontend import weightless
from trtopt.frontend.weightless import serialized_size
from trtopt.passes.base import Match, Rewrite, graph_pass

QUANTIZED_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
                           "ConvInteger"})
MAX_BYTES = 1 << 30  # beyond this the graph is not serialised in memory for ONNX Runtime
LARGE_WEIGHT = 1 << 16  # elements: a Gemm / MatMul weight this large stays out of ONNX Runtime's round trip
# Left to `fold_batchnorm`, which folds in float64 and reports each fold (ONNX Runtime's rule names). Its Pad
# fusion has no name `disabled_optimizers` knows: a zero Pad before a Conv is folded here, before `fold_pad`.
LEFT_TO_TRTOPT = ("ConvBNFusion", "ConvAddFusion", "ConvMulFusion")
# Op types the basic level may write more of than the graph had. More of any other op type means ONNX Runtime
# expanded a function op it has no kernel for (HardSwish into HardSigmoid and Mul at opset 14+): trtopt's own
# passes match the op itself, and the expansion would come back on every run, so such a result is not taken.
NEW_OPS_ALLOWED = frozenset({"Gemm", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten"})


@dataclass(frozen=True, eq=False)
class Simplification:
    """What the basic level changes for one op type: `removed` of its nodes go, `added` appear (a Gemm from
    a MatMul and an Add, say)."""

    op: str
    removed: tuple[gs.Node, ...]
    added: int


@dataclass(frozen=True, eq=False)
class OpSimplified(Match):
    change: Simplification
    kind = "ort_basic"

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        return self.change.removed

    def describe(self) -> str:
        change = self.change
        parts = [f"{len(change.removed)} removed"] if change.removed else []
        parts += [f"{change.added} added"] if change.added else []
        return f"{change.op}: {', '.join(parts)} (ONNX Runtime basic level)"


def skip_reason(graph: gs.Graph) -> str | None:
    """Why the basic level is not run on this graph, or None."""
    if any(isinstance(v, gs.Graph) for node in graph.nodes for v in node.attrs.values()):
        return "the graph has subgraphs (If / Loop / Scan)"
    if any((node.domain or "") not in ("", "ai.onnx") for node in graph.nodes):
        return "the graph has ops of a custom domain"
    if any(node.op in QUANTIZED_OPS or node.op.startswith("QLinear") for node in graph.nodes):
        return "the graph is quantised already (its Q/DQ placement is kept as given)"
    for tensor in graph.tensors().values():
        dtype = getattr(tensor, "dtype", None)
        if dtype is not None and dtype in (np.float16, np.float64):
            return "the graph computes in float16 or float64"
    return None


def simplified_graph(graph: gs.Graph) -> gs.Graph | None:
    """The graph after ONNX Runtime's basic level, or None when it does not apply (`skip_reason`) or changes
    nothing trtopt takes (`NEW_OPS_ALLOWED`).

    Conv weights and biases, most of a CNN's bytes, and large Gemm / MatMul weights do not travel: no basic-level
    rewrite reads their values once the Conv fusions are left to trtopt, so they go to ONNX Runtime as graph
    inputs of their shape and come back as the same constants. Serialising ResNet-50's 100 MB for ONNX Runtime and
    reading them back took most of the pass's time.
    """
    if skip_reason(graph) is not None:
        return None
    with _weights_held_back(graph) as held:
        model = gs.export_onnx(graph, do_type_check=False)
    if serialized_size(model) > MAX_BYTES:
        return None
    simplified = _basic_level(model)
    if simplified is None or not _acceptable(graph, simplified):
        return None
    result = gs.import_onnx(_with_shapes(simplified))
    _restore_names(graph, result)
    tensors = result.tensors()
    for name, constant in held.items():
        tensor = tensors.get(name)
        if isinstance(tensor, gs.Variable):
            tensor.to_constant(constant.values)
    result.inputs = [t for t in result.inputs if t.name not in held]
    return result


def _with_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with the shapes ONNX Runtime's optimised model leaves out (it writes few value_info), inferred again
    where ONNX can: without them a residual Add whose operands are not known to match is no fusion group, and its
    identity branch gets no Q/DQ (tf2onnx's MobileNetV2 without its optimizers: 9 of its 10 residual Adds, rewritten
    by ONNX Runtime's transpose optimizer, lost their shapes and ran in float in the CPU plan)."""
    try:
        return weightless.infer_shapes(model, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        return model


def _restore_names(graph: gs.Graph, result: gs.Graph) -> None:
    """A node ONNX Runtime fused from one it removed keeps that node's name ("matmul_1", not
    "matmul_1/MatMulAddFusion"), so layer names in reports and plan records stay the model's own."""
    before = {str(n.name) for n in graph.nodes}
    taken = {str(n.name) for n in result.nodes}
    for node in result.nodes:
        base = str(node.name).rsplit("/", 1)[0]
        if "/" in str(node.name) and node.name not in before and base in before and base not in taken:
            taken.add(base)
            node.name = base


@contextmanager
def _weights_held_back(graph: gs.Graph) -> Iterator[dict[str, gs.Constant]]:
    """Conv weights and biases, and the large weights of Gemm / MatMul (a classifier head: VGG-19's 400 MB), as
    graph inputs for the duration (restored after), by name."""
    slots = [(node, i) for node in graph.nodes if node.op in ("Conv", "ConvTranspose") for i in (1, 2)
             if i < len(node.inputs) and isinstance(node.inputs[i], gs.Constant)]
    slots += [(node, 1) for node in graph.nodes if node.op in ("Gemm", "MatMul") and len(node.inputs) > 1
              and isinstance(node.inputs[1], gs.Constant) and _size(node.inputs[1]) >= LARGE_WEIGHT]
    readers: Counter[str] = Counter(node.inputs[i].name for node, i in slots)
    held = {node.inputs[i].name: node.inputs[i] for node, i in slots
            if readers[node.inputs[i].name] == len(node.inputs[i].outputs)}
    stand_ins = {name: gs.Variable(name, dtype=c.dtype, shape=list(c.shape)) for name, c in held.items()}
    original_inputs = list(graph.inputs)
    try:
        for node, i in slots:
            if node.inputs[i].name in held:
                node.inputs[i] = stand_ins[node.inputs[i].name]
        graph.inputs = [*original_inputs, *stand_ins.values()]
        yield held
    finally:
        for node, i in slots:
            if node.inputs[i].name in held:
                node.inputs[i] = held[node.inputs[i].name]
        graph.inputs = original_inputs


def _size(constant: gs.Constant) -> int:
    return int(np.prod(constant.shape)) if constant.shape is not None else 0


def _basic_level(model: onnx.ModelProto) -> onnx.ModelProto | None:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 3
    with tempfile.TemporaryDirectory(prefix="trtopt-simplify-") as folder:
        path = Path(folder) / "basic.onnx"
        options.optimized_model_filepath = os.fspath(path)
        try:
            ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"],
                                 disabled_optimizers=list(LEFT_TO_TRTOPT))
        except Exception:  # noqa: BLE001 - a model ONNX Runtime cannot load is left to trtopt's own passes
            return None
        simplified = onnx.load(os.fspath(path))
    used = {node.domain or "" for node in simplified.graph.node} | {""}
    kept = [o for o in simplified.opset_import if (o.domain or "") in used or o.domain == "ai.onnx"]
    del simplified.opset_import[:]
    simplified.opset_import.extend(kept)
    return simplified


def _acceptable(graph: gs.Graph, simplified: onnx.ModelProto) -> bool:
    if any(node.domain not in ("", "ai.onnx") for node in simplified.graph.node):
        return False
    before = Counter(node.op for node in graph.nodes)
    after = Counter(node.op_type for node in simplified.graph.node)
    return not any(after[op] > before[op] for op in after if op not in NEW_OPS_ALLOWED)


def find_simplifications(graph: gs.Graph) -> list[OpSimplified]:
    simplified = simplified_graph(graph)
    return [] if simplified is None else _changes(graph, simplified)


def _changes(graph: gs.Graph, simplified: gs.Graph) -> list[OpSimplified]:
    kept = {(str(node.name), node.op) for node in simplified.nodes}  # a fused node may keep a removed one's name
    before = Counter(node.op for node in graph.nodes)
    after = Counter(node.op for node in simplified.nodes)
    found = []
    for op in sorted(set(before) | set(after)):
        removed = tuple(n for n in graph.nodes if n.op == op and (str(n.name), op) not in kept)
        added = max(0, after[op] - (before[op] - len(removed)))
        if removed or added:
            found.append(OpSimplified(Simplification(op, removed, added)))
    return found


@graph_pass("simplify", find_simplifications)
def simplify(graph: gs.Graph) -> list[OpSimplified] | tuple[list[OpSimplified], list[Rewrite]]:
    reason = skip_reason(graph)
    if reason is not None:
        return [], [Rewrite("skipped", (), f"ONNX Runtime's basic level not run: {reason}")]
    result = simplified_graph(graph)
    changes = [] if result is None else _changes(graph, result)
    if result is None or not changes:
        return []
    graph.nodes = result.nodes
    graph.inputs = result.inputs
    graph.outputs = result.outputs
    return changes
