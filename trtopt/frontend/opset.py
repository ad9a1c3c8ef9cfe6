"""The one place a model's default-domain opset is brought into the range trtopt works on.

trtopt's passes and quantiser are written for opsets 11 to 22: 11 is the oldest with today's
Q/DQ-friendly semantics (Clip and Pad take their bounds as inputs), 22 the newest that TensorRT 10/11's
parser documents. Models outside that range are converted with onnx's own version converter
(`onnx.version_converter.convert_version`), the same adapters TensorRT's and ONNX Runtime's users rely on:

- older models (opset 1-10, e.g. the Caffe2 exports shipped inside the onnx package) go up to
  `UPGRADE_OPSET` = 13, the first opset with per-axis QuantizeLinear/DequantizeLinear, so the converted
  model serves FP32 and per-channel INT8 builds alike and is converted once. Where an op's meaning changed
  on the way and the converter alone does not keep it (broadcasting at 7, Resize at 11, Hardmax at 13),
  `trtopt.frontend.legacy_opsets` does;
- newer models that this onnx release knows (opset 23 and up) go down to 22. An op introduced after 22 that
  ONNX defines as a function (Attention, RMSNormalization, RotaryEmbedding...) is first replaced by its body
  (`trtopt.frontend.function_ops`); the converter refuses (and trtopt reports it) where an op has no older form;
- an INT8 build asks for at least `MIN_QDQ_OPSET`, so opset 11-12 models are converted to 13 there too.

Each conversion is logged as one warning line; a conversion the converter cannot do is a `ModelError`.
"""

from __future__ import annotations

import logging

import onnx

from trtopt.errors import ModelError
from trtopt.frontend import weightless
from trtopt.frontend.function_ops import expanded_new_ops
from trtopt.frontend.legacy_opsets import at_opset_7, at_opset_11, single_axis_hardmax, stepwise
from trtopt.frontend.weightless import serialized_size
from trtopt.frontend.writer import PROTOBUF_LIMIT

log = logging.getLogger(__name__)

MIN_OPSET = 11
MAX_OPSET = 22
MIN_QDQ_OPSET = 13  # per-axis QuantizeLinear / DequantizeLinear (per-channel INT8 weights)
UPGRADE_OPSET = MIN_QDQ_OPSET
_EXPORT_FIX = "torch.onnx.export(..., opset_version=17)"


def target_opset(opset: int, min_opset: int = MIN_OPSET) -> int | None:
    """The opset a model of `opset` is converted to, or None when it is used as it is."""
    if opset < min_opset:
        return max(UPGRADE_OPSET, min_opset)
    if opset > MAX_OPSET:
        return MAX_OPSET
    return None


def model_at_opset(model: onnx.ModelProto, opset: int, where: str, *, min_opset: int = MIN_OPSET) -> onnx.ModelProto:
    """`model` (of default-domain `opset`) itself when trtopt can use it, else converted (see the module doc)."""
    target = target_opset(opset, min_opset)
    if target is None:
        return model
    check_opset_known(opset, where)
    if serialized_size(model) >= PROTOBUF_LIMIT:
        raise ModelError(
            f"{where} uses ONNX opset {opset} and would need converting to opset {target}, but onnx's version "
            "converter cannot take a model over protobuf's 2 GiB limit.",
            fix=f"Re-export with an opset from {MIN_OPSET} to {MAX_OPSET} ({_EXPORT_FIX}).",
        )
    converted = _convert(model, opset, target, where)
    why = (f"an INT8 build needs opset {min_opset} or newer: per-channel QuantizeLinear / DequantizeLinear"
           if MIN_OPSET <= opset < min_opset else f"trtopt works on opsets {MIN_OPSET} to {MAX_OPSET}")  # fmt: skip
    log.warning("%s uses ONNX opset %d; converted it to opset %d with onnx's version converter (%s)",
                where, opset, target, why)  # fmt: skip
    return converted


def check_opset_known(opset: int, where: str) -> None:
    """An opset newer than the installed onnx knows can be neither checked nor converted."""
    newest = onnx.defs.onnx_opset_version()
    if opset > newest:
        raise ModelError(
            f"{where} uses ONNX opset {opset}; trtopt supports opsets {MIN_OPSET} to {MAX_OPSET}, and the installed "
            f"onnx {onnx.__version__} knows opsets only up to {newest}, so it cannot convert the model either.",
            fix=f"Re-export with an opset from {MIN_OPSET} to {MAX_OPSET} ({_EXPORT_FIX}).",
        )


def _convert(model: onnx.ModelProto, opset: int, target: int, where: str) -> onnx.ModelProto:
    source = _without_initializer_inputs(model) if model.ir_version < 4 else model
    try:
        if opset > target:  # Attention, RMSNormalization...: their function bodies (trtopt.frontend.function_ops)
            source = expanded_new_ops(source, opset, target)
        converted = _upgraded(source, opset, target) if opset < target else stepwise(source, opset, target)
        converted.ir_version = _ir_version_for(converted, target)
        weightless.check_model(converted)
    except (RuntimeError, ValueError, onnx.checker.ValidationError, onnx.shape_inference.InferenceError,
            onnx.defs.SchemaError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(
            f"{where} uses ONNX opset {opset}; trtopt works on opsets {MIN_OPSET} to {MAX_OPSET}, and onnx's "
            f"version converter could not convert it to opset {target}: {reason}",
            fix=f"Re-export the model with an opset from {UPGRADE_OPSET} to {MAX_OPSET} ({_EXPORT_FIX}).",
        ) from None
    return converted


def _upgraded(model: onnx.ModelProto, opset: int, target: int) -> onnx.ModelProto:
    """onnx's conversion up to `target`, keeping the meaning where an op's semantics changed and the converter
    alone does not (trtopt.frontend.legacy_opsets): broadcasting at opset 7, resizes at 11, Hardmax at 13."""
    if opset < 7 <= target:
        model, opset = at_opset_7(model, opset), 7
    if opset <= 10 < target and any(n.op_type in ("Resize", "Upsample") for n in model.graph.node):
        model, opset = at_opset_11(model, opset), 11  # without a resize, one conversion less (weights copied)
    if opset <= 12 < target:
        model = single_axis_hardmax(model)
    return stepwise(model, opset, target) if opset != target else model


def _without_initializer_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """IR 3 had to list every initializer as a graph input too; those are weights, not inputs (from IR 4
    on they may be left out, and TensorRT's parser treats them as weights either way)."""
    clone = onnx.ModelProto()
    clone.CopyFrom(model)
    weights = {t.name for t in clone.graph.initializer}
    inputs = [i for i in clone.graph.input if i.name not in weights]
    del clone.graph.input[:]
    clone.graph.input.extend(inputs)
    clone.ir_version = 4
    return clone


def _ir_version_for(model: onnx.ModelProto, opset: int) -> int:
    """Up-conversion needs at least the IR version that introduced `opset`; down-conversion keeps the
    model's (capped later, on export, by `with_supported_ir`)."""
    needed = onnx.helper.find_min_ir_version_for([onnx.helper.make_opsetid("", opset)])
    return max(model.ir_version, needed)
