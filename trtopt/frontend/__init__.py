"""ONNX front end: read a model into onnx-graphsurgeon's IR, validate it, write it back atomically."""

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
