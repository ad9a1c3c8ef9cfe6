"""INT8 builds start from float32 models; a model that computes in float16, bfloat16 or float64 is refused
before any work, with what to do.

trtopt's Q/DQ pairs are opset-13 QuantizeLinear / DequantizeLinear, which take float32 (float16 and bfloat16
scales arrived in opset 19), and its calibration, bias correction and CPU lowering all read float32 tensors. An
INT8 build of an FP16 export (a `model.half()` before `torch.onnx.export`, or onnxconverter-common's
conversion) used to run calibration and then stop at "The built plan is not valid: Type Error: Type
'tensor(float16)' of input parameter ... of operator (QuantizeLinear) ... is invalid", blaming trtopt's
passes. Found on ONNX's fp16 conformance models (tools/onnx_conformance.py, docs/holdout.md round 6) and
checked on a plain FP16 conv net. FP32 builds of such models are not affected.
"""

from __future__ import annotations

from collections import Counter

import onnx
from onnx import TensorProto

from trtopt.errors import ModelError

OTHER_FLOATS = {TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16", TensorProto.DOUBLE: "float64"}


def refuse_other_floats(model: onnx.ModelProto, where: str) -> None:
    """Raise `ModelError` when `model`'s inputs or weights use a float type other than float32. Casts inside
    a float32 model are not counted: exporters cast shape arithmetic to float64 (a resize's scales), which
    trtopt never quantises."""
    inputs = [f"input {v.name!r} is {OTHER_FLOATS[v.type.tensor_type.elem_type]}" for v in model.graph.input
              if v.type.tensor_type.elem_type in OTHER_FLOATS]  # fmt: skip
    weights = Counter(OTHER_FLOATS[t.data_type] for t in model.graph.initializer if t.data_type in OTHER_FLOATS)
    found = [*inputs, *(f"{n} {kind} weights" for kind, n in weights.items())]
    if found:
        raise ModelError(
            f"{where} computes in another float type than float32 ({'; '.join(found[:4])}), and trtopt's INT8 "
            "quantisation works on float32 graphs (its opset-13 Q/DQ pairs take float32). Nothing was written.",
            fix="Build from the float32 model (torch: export without .half()); add --fp16 to the INT8 build to run "
            "the layers kept float in FP16 on TensorRT. A build without --int8 takes this model as it is.",
        )
