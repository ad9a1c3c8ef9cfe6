"""Ops newer than opset 22 written out as the ONNX function that defines them, so that the model converts down.

trtopt works on opsets 11 to 22 (TensorRT's parser's range, `trtopt.frontend.opset`), and onnx's version converter
cannot take an op below the opset that introduced it: a model at opset 23 or later with `Attention`,
`RMSNormalization`, `RotaryEmbedding` (23), `Swish` (24) or `CausalConvWithState` (27) was refused ("no opset-22
form"; 188 of ONNX's conformance cases, docs/holdout.md round 6). The ONNX specification defines each of these
as a function of older ops (`OpSchema.has_function`, or `has_context_dependent_function` where the body depends on
the node's attributes and input types). That body is what `_expanded` conformance cases spell out, and what an
exporter writes for the same layer at an older opset; `onnx.inliner` puts it in the node's place, and the
converter then takes the model down like any other. The build's graph check compares the result with the model
file in ONNX Runtime, which runs the op itself.

Only the main graph's nodes are expanded; a new op inside a `Loop` or `If` body is still refused by the converter.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import onnx
import onnx.inliner
from onnx import defs, helper

log = logging.getLogger(__name__)

_DOMAIN = "trtopt.expanded"  # the local functions' domain while they are inlined


def expanded_new_ops(model: onnx.ModelProto, opset: int, target: int) -> onnx.ModelProto:
    """`model` (at default-domain `opset`) with every main-graph op that has no form at opset `target` replaced by
    its ONNX function body; `model` itself when there is none. Ops without a function body are left to the
    converter, which says which."""
    news = [(i, node) for i, node in enumerate(model.graph.node) if _is_newer(node, target)]
    if not news:
        return model
    typed = onnx.shape_inference.infer_shapes(_skeleton(model))  # context-dependent bodies need the input types
    types = {v.name: v.type for v in [*typed.graph.input, *typed.graph.value_info, *typed.graph.output]}
    types |= {t.name: helper.make_tensor_type_proto(t.data_type, list(t.dims)) for t in typed.graph.initializer}
    calling = onnx.ModelProto()  # the model whose new ops call local functions, until they are inlined
    calling.CopyFrom(model)
    functions = []
    for i, node in news:
        function = _function_of(node, opset, types)
        if function is None:
            continue
        function.domain, function.name = _DOMAIN, f"{node.op_type}_{i}"
        functions.append(function)
        calling.graph.node[i].domain, calling.graph.node[i].op_type = _DOMAIN, function.name
    if not functions:
        return model
    calling.functions.extend(functions)
    calling.opset_import.append(helper.make_opsetid(_DOMAIN, 1))
    inlined = onnx.inliner.inline_local_functions(calling, convert_version=True)
    kept = [o for o in inlined.opset_import if o.domain != _DOMAIN]  # the local domain, now unused
    del inlined.opset_import[:]
    inlined.opset_import.extend(kept)
    counts = Counter(f.name.rsplit("_", 1)[0] for f in functions)
    log.info("expanded %s into their ONNX function bodies (no opset-%d form)",
             ", ".join(f"{n} {op}" for op, n in counts.items()), target)  # fmt: skip
    return inlined


def _skeleton(model: onnx.ModelProto, small: int = 1024) -> onnx.ModelProto:
    """`model` with its large weights as typed graph inputs: what type inference needs, without copying hundreds
    of MB through onnx's C++ and back (ViT-B/32: 5 s of an opset-23 load). Small ones (shapes) keep their values."""
    skeleton = onnx.ModelProto(ir_version=model.ir_version, opset_import=model.opset_import, functions=model.functions)
    graph = model.graph
    listed = {v.name for v in graph.input}  # weights may be listed as inputs too
    large = [t for t in graph.initializer if t.ByteSize() > small and t.name not in listed]
    skeleton.graph.CopyFrom(onnx.GraphProto(
        name=graph.name, node=graph.node, output=graph.output, value_info=graph.value_info,
        input=[*graph.input, *(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in large)],
        initializer=[t for t in graph.initializer if t.ByteSize() <= small or t.name in listed],
    ))  # fmt: skip
    return skeleton


def _is_newer(node: onnx.NodeProto, target: int) -> bool:
    if node.domain not in ("", "ai.onnx"):
        return False
    try:
        defs.get_schema(node.op_type, target)
    except defs.SchemaError:
        return True
    return False


def _function_of(node: onnx.NodeProto, opset: int, types: dict[str, onnx.TypeProto]) -> onnx.FunctionProto | None:
    """The FunctionProto defining `node` at `opset`, or None where the op has none (or its inputs' types are
    unknown, which a context-dependent body needs)."""
    try:
        schema: Any = defs.get_schema(node.op_type, opset)  # onnx's type stubs lack the function accessors
    except defs.SchemaError:
        return None
    function = onnx.FunctionProto()
    if schema.has_function:
        function.CopyFrom(schema.function_body)
    elif schema.has_context_dependent_function and all(not n or n in types for n in node.input):
        inputs = [(types[n] if n else onnx.TypeProto()).SerializeToString() for n in node.input]
        function.ParseFromString(schema.get_context_dependent_function(node.SerializeToString(), inputs))
    else:
        return None
    return function
