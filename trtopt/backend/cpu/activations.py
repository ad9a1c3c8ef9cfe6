"""Activations that read their input twice, written as ONNX Runtime's fused kernels in the CPU plan.

ONNX Runtime fuses GELU spelt x * 0.5 * (1 + erf(x / sqrt 2)) (Div, Erf, Add, Mul, Mul) into one `Gelu`
kernel, and SiLU spelt x * sigmoid(x) into `QuickGelu` with alpha 1 (its GeluFusion and QuickGeluFusion
graph transformers, both in the com.microsoft domain). Both patterns read x twice. In an INT8 plan x comes
from a DequantizeLinear, and ONNX Runtime first gives every consumer of a DequantizeLinear its own copy
(`EnsureUniqueDQForNodeUnit`, onnxruntime/core/optimizer/qdq_transformer/ensure_unique_dq_for_node_unit.cc,
so that each consumer can become one QDQ node unit). After that x is two tensors and neither fusion matches:
on ONNX Runtime 1.32, Q -> DQ -> GELU keeps two DequantizeLinear and all five float ops, while the same GELU
without Q/DQ becomes one Gelu; likewise SiLU and QuickGelu. The plan then pays five (two) element-wise passes
and a second DequantizeLinear where the FP32 model pays one.

So the CPU lowering writes the fused ops itself. The values are ONNX Runtime's own fused kernels, which its
FP32 session of the same model runs too; both are float ops between a DequantizeLinear and a QuantizeLinear,
so the plan's Q/DQ reference runs them as well and the verification compares like with like. Measured side by
side (BENCHMARKS *CPU plans: GELU and SiLU*, `tools/bench_cpu_activations.py`, at 834753b; avx2, batch 1, 1 thread,
the same plans built with and without): 0.93-0.98 of the time on ddddocr's YOLOX detector and recogniser (63 and 11
SiLUs) and PP-OCRv6's small detector and recogniser (13 GELUs each); the two plans' outputs there were identical.

Not always bit for bit: QuickGelu computes exactly what Sigmoid and Mul do, but the fused Gelu differs from the
five separate ops by one unit in the last place on some values (9 of 144 on a test tensor, 1.2e-7). Before a
QuantizeLinear that can move a value that lies on a rounding boundary by one step. The sensitivity search sees
such differences too, and on PP-OCRv6's recogniser its third layer, whose gain is at the margin, flipped:
3 layers kept float instead of 2, held-out cosine 0.9821 instead of 0.9871, edit distance 0.026 instead of
0.031, exact match 81.2% either way (docs/holdout.md). None of the zoo's models has a GELU.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

MS_DOMAIN = "com.microsoft"
Only = Callable[[str], "onnx.NodeProto | None"]  # a tensor's one consumer (None: several, none, or a graph output)
Match = tuple[list[onnx.NodeProto], onnx.NodeProto]  # the nodes replaced (the last one's output kept), the fused node
_SQRT2_TOLERANCE = 1e-4  # relative: the exported constant is sqrt(2) or 1/sqrt(2) in float32 (or 1.4142)


def fuse_activations(model: onnx.ModelProto) -> dict[str, int]:
    """Rewrite erf-GELU and SiLU as com.microsoft Gelu / QuickGelu in `model` (in place); how many of each.
    Only chains whose intermediate tensors have one consumer and are no graph output are rewritten."""
    graph = model.graph
    if _has_float16(graph):  # ONNX Runtime's CPU Gelu / QuickGelu kernels are float32 only
        return {}
    consts = _scalars(graph)
    nodes = list(graph.node)  # one set of node objects for the maps below and the identities kept
    producers = {out: node for node in nodes for out in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}

    def only(tensor: str) -> onnx.NodeProto | None:  # an `Only`
        """The one consumer of `tensor`, if it has exactly one and is no graph output."""
        found = consumers.get(tensor, [])
        return found[0] if len(found) == 1 and tensor not in outputs else None

    replace: dict[int, onnx.NodeProto] = {}
    removed: set[int] = set()
    for node in nodes:
        found: Match | None = None
        if node.op_type == "Erf":
            found = _gelu(node, producers, only, consts)
        elif node.op_type == "Sigmoid":
            found = _silu(node, only)
        if found is None or any(id(n) in removed for n in found[0]):
            continue
        chain, fused = found
        removed.update(id(n) for n in chain)
        replace[id(chain[-1])] = fused
    if not replace:
        return {}
    kept = [replace.get(id(n), n) for n in nodes if id(n) not in removed or id(n) in replace]
    del graph.node[:]
    graph.node.extend(kept)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    counts: dict[str, int] = {}
    for fused in replace.values():
        counts[fused.op_type] = counts.get(fused.op_type, 0) + 1
    return counts


def _gelu(
    erf: onnx.NodeProto, producers: dict[str, onnx.NodeProto], only: Only, consts: dict[str, float]
) -> Match | None:
    """(the nodes, last one last; the Gelu) for Div(x, sqrt 2) or Mul(x, 1/sqrt 2) -> Erf -> Add 1, then 0.5 * x
    * that in any of the three ways two Muls can group it; None where `erf` is not in such a chain."""
    scale = producers.get(erf.input[0])
    if scale is None or scale.op_type not in ("Div", "Mul") or only(erf.input[0]) is None:
        return None
    x, factor = scale.input[0], consts.get(scale.input[1])
    if scale.op_type == "Mul" and factor is None:  # Mul(1/sqrt 2, x)
        x, factor = scale.input[1], consts.get(scale.input[0])
    root2 = factor if scale.op_type == "Div" else (1 / factor if factor else None)
    if root2 is None or abs(root2 / math.sqrt(2) - 1) > _SQRT2_TOLERANCE:
        return None
    add = only(erf.output[0])
    if add is None or add.op_type != "Add" or consts.get(_other(add, erf.output[0]) or "") != 1.0:
        return None
    first = only(add.output[0])
    if first is None or first.op_type != "Mul":
        return None
    with_first = _other(first, add.output[0])
    chain = [scale, erf, add]
    if with_first is None:
        return None
    if with_first == x or consts.get(with_first) == 0.5:  # (x * a) * 0.5 or (a * 0.5) * x
        last = only(first.output[0])
        want: str | float = 0.5 if with_first == x else x
        if last is None or last.op_type != "Mul" or not _reads(last, first.output[0], want, consts):
            return None
        chain += [first, last]
    else:  # (x * 0.5) * a
        half = producers.get(with_first)
        if half is None or half.op_type != "Mul" or only(with_first) is not first or not _reads(half, x, 0.5, consts):
            return None
        chain += [half, first]
    return chain, helper.make_node("Gelu", [x], [chain[-1].output[0]], name=f"{erf.name}/gelu", domain=MS_DOMAIN)


def _silu(sigmoid: onnx.NodeProto, only: Only) -> Match | None:
    """(Sigmoid and Mul; the QuickGelu) for x * sigmoid(x); None otherwise."""
    mul = only(sigmoid.output[0])
    x = sigmoid.input[0]
    if mul is None or mul.op_type != "Mul" or sorted(mul.input) != sorted([x, sigmoid.output[0]]):
        return None
    fused = helper.make_node("QuickGelu", [x], [mul.output[0]], name=f"{sigmoid.name}/silu", domain=MS_DOMAIN,
                             alpha=1.0)  # fmt: skip
    return [sigmoid, mul], fused


def _other(node: onnx.NodeProto, tensor: str) -> str | None:
    """The input of a two-input `node` that is not `tensor` (None: not such a node)."""
    if len(node.input) != 2 or tensor not in node.input:
        return None
    return node.input[1] if node.input[0] == tensor else node.input[0]


def _reads(node: onnx.NodeProto, tensor: str, other: str | float, consts: dict[str, float]) -> bool:
    """Whether two-input `node` reads `tensor` and `other` (a tensor name, or a constant's value)."""
    rest = _other(node, tensor)
    if rest is None:
        return False
    return rest == other if isinstance(other, str) else consts.get(rest) == other


def _has_float16(graph: onnx.GraphProto) -> bool:
    half = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    typed = [*graph.input, *graph.output, *graph.value_info]
    return any(t.data_type in half for t in graph.initializer) or any(
        v.type.tensor_type.elem_type in half for v in typed
    )


def _scalars(graph: onnx.GraphProto) -> dict[str, float]:
    """Float constants of one element (initializers and Constant nodes), by tensor name."""
    tensors: Sequence[tuple[str, onnx.TensorProto]] = [(t.name, t) for t in graph.initializer] + [
        (n.output[0], n.attribute[0].t) for n in graph.node
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"
    ]  # fmt: skip
    found = {}
    for name, tensor in tensors:
        if tensor.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16):
            value = numpy_helper.to_array(tensor)
            if value.size == 1:
                found[name] = float(np.asarray(value, np.float64).reshape(()))
    return found
