"""The graph side of tools/bench_exports.py: node / Transpose / Cast counts, and the three cleaners it compares
(trtopt optimize, ONNX Runtime's basic level, onnxslim), each from an ONNX file to an ONNX model.

Not a benchmark itself.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnx


@dataclass(frozen=True)
class Counts:
    nodes: int
    transposes: int
    casts: int
    noop_casts: int  # Casts to the element type they read
    inner_transposes: int  # Transposes that neither read a graph input nor write a graph output


def graph_counts(model: onnx.ModelProto) -> Counts:
    """Counts over the main graph (after ONNX shape inference, for the Casts' input types)."""
    with contextlib.suppress(Exception):  # an export that ONNX's inference rejects is still counted, untyped
        model = onnx.shape_inference.infer_shapes(model)
    graph = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.value_info, *graph.output]}
    types |= {t.name: t.data_type for t in graph.initializer}
    ops = Counter(n.op_type for n in graph.node)
    noop = sum(1 for n in graph.node if n.op_type == "Cast" and types.get(n.input[0]) == _cast_to(n))
    boundary = {v.name for v in graph.input} | {v.name for v in graph.output}
    inner = sum(1 for n in graph.node if n.op_type == "Transpose" and n.input[0] not in boundary
                and not set(n.output) & boundary)
    return Counts(len(graph.node), ops["Transpose"], ops["Cast"], noop, inner)


def _cast_to(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "to"), -1)


def trtopt_optimized(path: Path, workdir: Path) -> onnx.ModelProto:
    """`trtopt optimize`'s path with its default passes (trtopt/cli/optimize_cmd.py, without its numeric check)."""
    from trtopt.frontend import graph_from_onnx, onnx_from_graph
    from trtopt.passes import optimize

    return onnx_from_graph(optimize(graph_from_onnx(str(path))).graph)


def trtopt_cpu_optimized(path: Path, workdir: Path) -> onnx.ModelProto:
    """`trtopt optimize --backend cpu`'s path: the CPU backend's passes, the graph its INT8 builds quantise (with
    the rewrites that pay on ONNX Runtime's kernels: PRelu as Max / Min, which adds nodes; the channel shuffle as
    one Gather, which removes them)."""
    from trtopt.backend.cpu.backend import CpuBackend
    from trtopt.frontend import graph_from_onnx, onnx_from_graph
    from trtopt.passes import optimize

    return onnx_from_graph(optimize(graph_from_onnx(str(path)), CpuBackend().passes(None)).graph)


def ort_basic(path: Path, workdir: Path) -> onnx.ModelProto:
    """The model ONNX Runtime's basic level (constant folding, redundant node elimination, the fusions that are
    exact on every provider) writes out, as `quant_pre_process` runs it."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    out = workdir / f"{path.stem}.ort_basic.onnx"
    options.optimized_model_filepath = str(out)
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return onnx.load(str(out))


def slimmed(path: Path, workdir: Path) -> onnx.ModelProto:
    """onnxslim's default pipeline (constant folding, dead-node removal, its fusion patterns)."""
    import onnxslim

    return onnxslim.slim(str(path))


CLEANERS: dict[str, Callable[[Path, Path], onnx.ModelProto]] = {
    "trtopt optimize": trtopt_optimized, "--backend cpu": trtopt_cpu_optimized, "ORT basic": ort_basic,
    "onnxslim": slimmed,
}
