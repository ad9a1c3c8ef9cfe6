"""Graph inputs and outputs must be tensors: trtopt feeds arrays in and reads arrays out (calibration,
verification, `trtopt run`, TensorRT bindings). ONNX also has sequence, map and optional values, which
classical-ML converters write: skl2onnx's classifiers end in a `ZipMap` (ai.onnx.ml) that returns the class
probabilities as a sequence of {label: probability} maps. Such a model is refused at load with what to do,
not deep in a build with ONNX Runtime's "Invalid tensor data type 0".

An input size declared as 0 fits no data, so it is read as a dynamic size (`zero_sizes_as_unknown`).
"""

from __future__ import annotations

import logging

import onnx

from trtopt.errors import ModelError

log = logging.getLogger(__name__)

_KINDS = {"sequence_type": "a sequence", "sequence of maps": "a sequence of maps", "map_type": "a map",
          "optional_type": "an optional value", "sparse_tensor_type": "a sparse tensor"}  # fmt: skip


def check_tensor_io(model: onnx.ModelProto, where: str) -> None:
    """Raise `ModelError` for the first graph input or output that is not a dense tensor."""
    weights = {t.name for t in model.graph.initializer}
    values = [("input", v) for v in model.graph.input if v.name not in weights]
    for role, value in [*values, *(("output", v) for v in model.graph.output)]:
        kind = value.type.WhichOneof("value")
        if kind in (None, "tensor_type"):
            continue
        if kind == "sequence_type" and value.type.sequence_type.elem_type.WhichOneof("value") == "map_type":
            kind = "sequence of maps"
        producer = next((n for n in model.graph.node if value.name in n.output), None)
        made = f", written by {producer.op_type} node {producer.name!r}" if producer is not None else ""
        zipmap = producer is not None and producer.op_type == "ZipMap"
        fix = (
            "Convert the classifier without ZipMap (skl2onnx: options={id(model): {'zipmap': False}} or "
            "{type(model): {'zipmap': False}}) so that the probabilities come out as one [N, classes] tensor."
            if zipmap
            else f"Export the model so that its {role}s are tensors, or cut this {role} off the graph "
            "(onnx.utils.extract_model)."
        )
        raise ModelError(
            f"{where}: graph {role} {value.name!r} is {_KINDS.get(kind, kind)}{made}, not a tensor; trtopt builds "
            "models whose inputs and outputs are tensors.",
            fix=fix,
        )


def zero_sizes_as_unknown(model: onnx.ModelProto, where: str) -> None:
    """An input dimension declared as 0 becomes unknown, in place, with a warning. No data fits a size of 0, and
    ONNX Runtime refuses any other, so such a model runs nowhere as declared; exporters that write 0 (or -1,
    which ONNX Runtime already reads as unknown) mean a dynamic size."""
    weights = {t.name for t in model.graph.initializer}
    for tensor in model.graph.input:
        if tensor.name in weights or not tensor.type.HasField("tensor_type"):
            continue
        dims = tensor.type.tensor_type.shape.dim
        zeros = [i for i, d in enumerate(dims) if d.HasField("dim_value") and d.dim_value == 0]
        for i in zeros:
            dims[i].Clear()
        if zeros:
            log.warning(
                "%s: input %r declares size 0 in dimension(s) %s; no data has that size, so trtopt reads it as a "
                "dynamic size (set it with --shapes where it is not the batch)", where, tensor.name, zeros,
            )  # fmt: skip
