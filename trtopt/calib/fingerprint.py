"""A model fingerprint that says whether a calibration cache belongs to a graph."""

from __future__ import annotations

import hashlib
import os
from typing import TypeAlias

import onnx
import onnx_graphsurgeon as gs

from trtopt.frontend.loader import load_model, onnx_from_graph

ModelLike: TypeAlias = "onnx.ModelProto | gs.Graph | str | os.PathLike[str]"


def model_fingerprint(model: ModelLike) -> str:
    """sha256 (hex) over the graph's structure and tensor names, not its weight values.

    Hashed: each node's op type, domain and input/output tensor names (sorted, so a different but
    equivalent topological order keeps the fingerprint), the graph inputs' and outputs' names and element
    types (not their shapes: fixing a dynamic batch size does not change which tensors exist), and the
    initializers' names, types and shapes. Two models with the same fingerprint
    have thresholds for the same tensors; retrained weights in an unchanged graph keep it (like
    TensorRT's own cache, which stores no model identity at all).
    """
    proto = _as_proto(model)
    graph = proto.graph
    digest = hashlib.sha256(b"trtopt-fingerprint-1\n")
    lines = sorted(
        f"node {n.domain}:{n.op_type} in={','.join(n.input)} out={','.join(n.output)}" for n in graph.node
    )
    lines += [f"input {_value_key(v)}" for v in graph.input]
    lines += [f"output {_value_key(v)}" for v in graph.output]
    lines += sorted(f"init {t.name} {t.data_type} {list(t.dims)}" for t in graph.initializer)
    for line in lines:
        digest.update(line.encode() + b"\n")
    return digest.hexdigest()


def _as_proto(model: ModelLike) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, gs.Graph):
        return onnx_from_graph(model)
    return load_model(model).model


def _value_key(value: onnx.ValueInfoProto) -> str:
    return f"{value.name} {value.type.tensor_type.elem_type}"
