"""INT8 builds of models that compute in float16 or bfloat16 work on a float32 copy; float64 models are refused.

trtopt's Q/DQ pairs are opset-13 QuantizeLinear / DequantizeLinear, which take float32 (float16 and bfloat16
scales arrived in opset 19), and its calibration, equalisation, bias correction and CPU lowering all read
float32 tensors. An FP16 export (a `model.half()` before `torch.onnx.export`, or onnxconverter-common's
conversion) used to run calibration and then stop at "The built plan is not valid: Type Error: Type
'tensor(float16)' of input parameter ... of operator (QuantizeLinear) ... is invalid", blaming trtopt's passes
(found on ONNX's fp16 conformance models, docs/holdout.md round 6).

`lifted_to_float32` writes the copy: every float16/bfloat16 weight, constant, Cast target and value type
becomes float32 (exact: float32 holds every float16 and bfloat16 value), in subgraphs too. The graph's inputs
and outputs keep their types behind a Cast each, so the plan takes and gives what the model does. The copy
then computes the model's function without the float16 rounding between layers; `trtopt.passes.check` measures
that difference against the file at every build. Layers left float run in float32 (on TensorRT, `--fp16`
writes FP16 back in). float64 is refused: narrowing it loses precision the model asked for, and such models
(classical-ML converters) have no layer worth INT8.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from trtopt.errors import ModelError

LOW_FLOATS: dict[int, str] = {TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16"}
_TYPE_ATTRIBUTES = ("to", "dtype")  # Cast's target; EyeLike, Random*, SequenceEmpty's output type


def low_float_uses(model: onnx.ModelProto) -> list[str]:
    """What in `model` is float16 or bfloat16: inputs, outputs, weights, Casts to them (empty: none)."""
    graph = model.graph
    inputs = [f"input {v.name!r} is {LOW_FLOATS[_elem(v)]}" for v in graph.input if _elem(v) in LOW_FLOATS]
    outputs = [f"output {v.name!r} is {LOW_FLOATS[_elem(v)]}" for v in graph.output if _elem(v) in LOW_FLOATS]
    counts = Counter(f"{LOW_FLOATS[t.data_type]} weights" for t in graph.initializer if t.data_type in LOW_FLOATS)
    for node in _nodes(graph):
        for attribute in node.attribute:
            if _names_low_type(attribute):
                counts[f"{node.op_type}s to {LOW_FLOATS[attribute.i]}"] += 1
            elif attribute.type == AttributeProto.TENSOR and attribute.t.data_type in LOW_FLOATS:
                counts[f"{LOW_FLOATS[attribute.t.data_type]} constants"] += 1
    return [*inputs, *outputs, *(f"{n} {what}" for what, n in counts.items())]


def refuse_float64(model: onnx.ModelProto, where: str) -> None:
    """Raise `ModelError` where `model`'s inputs or weights are float64. Casts inside a float32 model are not
    counted: exporters cast shape arithmetic to float64 (a resize's scales), which trtopt never quantises."""
    inputs = [f"input {v.name!r} is float64" for v in model.graph.input if _elem(v) == TensorProto.DOUBLE]
    weights = sum(t.data_type == TensorProto.DOUBLE for t in model.graph.initializer)
    found = [*inputs, *([f"{weights} float64 weights"] if weights else [])]
    if found:
        raise ModelError(
            f"{where} computes in float64 ({'; '.join(found[:4])}), and trtopt's INT8 quantisation works on "
            "float32 graphs (float16 and bfloat16 models are calibrated on a float32 copy; narrowing float64 "
            "would change the model). Nothing was written.",
            fix="Build from a float32 export of the model, or build without --int8 to take it as it is.",
        )


def lifted_to_float32(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` computing in float32 wherever it computed in float16/bfloat16; its graph inputs and
    outputs keep their types, each behind a Cast."""
    lifted = onnx.ModelProto()
    lifted.CopyFrom(model)
    graph = lifted.graph
    interface = {v.name: _elem(v) for v in [*graph.input, *graph.output] if _elem(v) in LOW_FLOATS}
    _lift_body(graph, interface=False)
    names = _unique_names(graph)
    weights = {t.name for t in graph.initializer}
    casts_in = []
    for value in graph.input:
        if value.name in weights and value.name in interface:  # IR 3 lists weights as inputs too: lifted above
            value.type.tensor_type.elem_type = TensorProto.FLOAT
        elif value.name in interface:
            inner = next(names(f"{value.name}_float32"))
            _rename(graph, value.name, inner, outputs=False)
            casts_in.append(helper.make_node("Cast", [value.name], [inner], to=TensorProto.FLOAT,
                                             name=next(names(f"{value.name}_to_float32"))))  # fmt: skip
    inputs = {v.name for v in graph.input}
    for value in graph.output:
        if value.name in interface and value.name not in inputs:
            inner = next(names(f"{value.name}_float32"))
            _rename(graph, value.name, inner, outputs=True)
            kind = interface[value.name]
            name = next(names(f"{value.name}_to_{LOW_FLOATS[kind]}"))
            graph.node.append(helper.make_node("Cast", [inner], [value.name], to=kind, name=name))
    nodes = [*casts_in, *graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    return lifted


def _lift_body(graph: onnx.GraphProto, *, interface: bool) -> None:
    """Retype `graph` in place: weights, value types, constants, type attributes; a subgraph's own inputs and
    outputs too (`interface`), the main graph's are left to Casts."""
    for tensor in graph.initializer:
        if tensor.data_type in LOW_FLOATS:
            tensor.CopyFrom(_float32(tensor))
    values = [*graph.value_info, *((*graph.input, *graph.output) if interface else ())]
    for value in values:
        if _elem(value) in LOW_FLOATS:
            value.type.tensor_type.elem_type = TensorProto.FLOAT
    for node in graph.node:
        for attribute in node.attribute:
            if _names_low_type(attribute):
                attribute.i = TensorProto.FLOAT
            elif attribute.type == AttributeProto.TENSOR and attribute.t.data_type in LOW_FLOATS:
                attribute.t.CopyFrom(_float32(attribute.t))
            elif attribute.type == AttributeProto.GRAPH:
                _lift_body(attribute.g, interface=True)
            for sub in attribute.graphs:
                _lift_body(sub, interface=True)


def _names_low_type(attribute: onnx.AttributeProto) -> bool:
    return attribute.name in _TYPE_ATTRIBUTES and attribute.type == AttributeProto.INT and attribute.i in LOW_FLOATS


def _float32(tensor: TensorProto) -> TensorProto:
    return numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name)


def _rename(graph: onnx.GraphProto, old: str, new: str, *, outputs: bool) -> None:
    """Uses of `old` read `new`, in subgraphs too (they may read outer values by name); with `outputs`, the node
    or weight that makes `old` makes `new`."""
    for node in _nodes(graph):
        node.input[:] = [new if name == old else name for name in node.input]
        if outputs:
            node.output[:] = [new if name == old else name for name in node.output]
    if outputs:
        for tensor in graph.initializer:
            tensor.name = new if tensor.name == old else tensor.name
        for value in graph.value_info:
            value.name = new if value.name == old else value.name


def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of `graph` and of its subgraphs (`trtopt.frontend.loader.all_nodes`)."""
    from trtopt.frontend.loader import all_nodes  # not at import: the loader imports the passes, which import this

    return (node for node, _ in all_nodes(graph))


def _unique_names(graph: onnx.GraphProto):  # type: ignore[no-untyped-def]
    taken = {name for node in _nodes(graph) for name in (*node.input, *node.output, node.name)}
    taken |= {v.name for v in [*graph.input, *graph.output, *graph.initializer]}

    def names(stem: str) -> Iterator[str]:
        for candidate in itertools.chain([stem], (f"{stem}_{i}" for i in itertools.count(1))):
            if candidate not in taken:
                taken.add(candidate)
                yield candidate

    return names


def _elem(value: onnx.ValueInfoProto) -> int:
    return value.type.tensor_type.elem_type if value.type.HasField("tensor_type") else 0


def float_precision(graph: Any) -> str:
    """A float build's precision label: "fp64" where the model computes in float64 (atspm-detector's LightGBM
    trees were labelled fp32; round 13's hunt), judged by its inputs as `refuse_float64` does; else "fp32"."""
    doubles = [t for t in graph.inputs if t.dtype is not None and np.dtype(t.dtype) == np.float64]
    return "fp64" if doubles else "fp32"
