"""ONNX front end: read a model into onnx-graphsurgeon's IR, validate it, write it back atomically.

It owns the IR and what is true of the input model before any pass: the canonical form every pass leaves
(`edit.py`: dead nodes out, topological order, unique names), opsets and shapes, and the checks made at load
(`float_types.py`: float16 / float64 compute; `prequantized.py`: a model another tool quantised;
`model_errors.py`: what ONNX and ONNX Runtime raise for a model they cannot take). It imports nothing of trtopt
but `errors`: every stage stands on it (docs/architecture.md).
"""

from trtopt.frontend.copying import copy_graph
from trtopt.frontend.loader import LoadedModel, graph_from_onnx, load_model, onnx_from_graph
from trtopt.frontend.opset import MAX_OPSET, MIN_OPSET, MIN_QDQ_OPSET, model_at_opset
from trtopt.frontend.shapes import apply_shapes, parse_shapes, require_static_shapes
from trtopt.frontend.writer import save_onnx, write_atomic

__all__ = [
    "MAX_OPSET",
    "MIN_OPSET",
    "MIN_QDQ_OPSET",
    "LoadedModel",
    "apply_shapes",
    "copy_graph",
    "graph_from_onnx",
    "load_model",
    "model_at_opset",
    "onnx_from_graph",
    "parse_shapes",
    "require_static_shapes",
    "save_onnx",
    "write_atomic",
]
