"""OpenVINO build: the Q/DQ graph in the form OpenVINO's CPU plugin turns into INT8 kernels, and what it made of it.

The plan stores ONNX (section "onnx"), not OpenVINO IR: OpenVINO reads ONNX Q/DQ pairs as FakeQuantize
(`QuantizeLinear` -> `DequantizeLinear` becomes one FakeQuantize, a weight's constant int8 -> `DequantizeLinear`
its dequantisation subgraph), and its low-precision transformations (LPT) then move each dequantisation behind
the layer so the layer reads int8/uint8 (OpenVINO's "Quantization Scheme" guide, openvino
docs/articles_en/documentation/openvino-extensibility/openvino-plugin-library/advanced-guides/
low-precision-transformations). The same section is what `trtopt.verify` runs as the float reference, so one
graph is verified, stored and run. Compiling it takes a fraction of a second (the demo model: about 0.3 s), so no
compiled-model blob is stored: a blob is tied to the OpenVINO version and CPU kind that compiled it.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import onnx

from trtopt.backend.openvino.options import SECTION_CONFIG, OpenvinoOptions

if TYPE_CHECKING:
    from trtopt.plan import Plan

log = logging.getLogger(__name__)

# The forms `--ov-form` names: "qdq" is the Q/DQ graph as trtopt's quantisation wrote it for this backend
# (symmetric int8 activations); "lowered" is the CPU backend's lowering of it (uint8 activations, twice the
# resolution on non-negative tensors, int32 biases: trtopt.backend.cpu.lowering) in the u8s8 encoding;
# "lowered-pairs" is that with 8-bit weights rescaled where a pair of products could overflow int16
# (`pairs.bound_weight_pairs`) and "lowered-w7" with 7-bit weights (`seven_bit_weights`): both exact on CPUs whose
# u8s8 kernels saturate, the first at finer weight grids.
FORMS = ("lowered", "lowered-pairs", "lowered-w7", "qdq")
# Runtime-model layer types that carry weights: where INT8 pays (runtimePrecision i8/u8) or not (f32).
WEIGHTED_LAYERS = frozenset({"Convolution", "FullyConnected", "MatMul", "Deconvolution", "GroupConvolution"})
INT8_PRECISIONS = frozenset({"i8", "u8"})


def candidate_forms(choice: str = "auto", isa: str | None = None) -> list[str]:
    """The forms a build tries, in order (each verified): for "auto", the lowered form with 8-bit weights where
    this CPU's u8s8 dot products are exact (VNNI, AMX); where they saturate (AVX2, AVX-512 without VNNI:
    `trtopt.backend.cpu.isa`) pair-bounded 8-bit weights, then 7-bit weights should OpenVINO's kernels pair
    products otherwise than `pairs` assumes; all three in that order on a CPU of unknown kind."""
    from trtopt.backend.cpu.isa import EXACT_U8S8, SATURATING_U8S8, cpu_isa

    if choice != "auto":
        return [choice]
    isa = isa or cpu_isa()
    if isa in EXACT_U8S8:
        return ["lowered"]
    return list(FORMS[1:3]) if isa in SATURATING_U8S8 else list(FORMS[:3])


def form_of(options: OpenvinoOptions) -> str:
    return candidate_forms(options.form)[0]


def written(model: onnx.ModelProto, options: OpenvinoOptions) -> onnx.ModelProto:
    """The Q/DQ graph the plan stores for OpenVINO, in the form `options` names (its first candidate), its
    strided 1x1 convs on quantised inputs subsampled (`strides.subsample_strided_pointwise`), its INT8 fully
    connected layers written as 1x1 convs (`dense.fc_as_pointwise_conv`), no requantisation after a max pool of
    a quantised tensor (`requant.drop_pool_requantisation`)."""
    from trtopt.backend.openvino.dense import fc_as_pointwise_conv
    from trtopt.backend.openvino.pairs import bound_weight_pairs
    from trtopt.backend.openvino.requant import drop_pool_requantisation
    from trtopt.backend.openvino.strides import subsample_strided_pointwise

    form = form_of(options)
    if form == "qdq":
        written = onnx.ModelProto()
        written.CopyFrom(model)
    else:
        from trtopt.backend.cpu.lowering import lower_for_cpu

        written = lower_for_cpu(model, encoding="u8s8")
        if form == "lowered-w7":
            seven_bit_weights(written)
        elif form == "lowered-pairs":
            bound_weight_pairs(written)
    subsample_strided_pointwise(written)  # strided 1x1 convs stay INT8 (trtopt.backend.openvino.strides)
    fc_as_pointwise_conv(written)  # OpenVINO's 1x1 conv kernels beat its INT8 FullyConnected (.dense)
    drop_pool_requantisation(written)  # a max pool keeps its input's grid (.requant)
    return written


def seven_bit_weights(model: onnx.ModelProto) -> int:
    """Requantise every int8 weight of a Conv / Gemm / MatMul to 7 bits (values in [-64, 63], twice the scale),
    in place; returns how many. Why: OpenVINO's CPU plugin multiplies uint8 activations by int8 weights with
    `vpmaddubsw` on CPUs without VNNI, which adds pairs of products into a saturating int16 (255 * 127 * 2 >
    32767), so 8-bit weights meeting large activations are clipped: the demo plan's kernels were 0.23-0.35
    from its Q/DQ reference on an avx2 EPYC, 0.04 with 7-bit weights (255 * 64 * 2 = 32640 fits). NNCF's
    `OverflowFix` halves the weight range for the same reason (nncf/quantization/advanced_parameters.py), by
    default for the first layer only. Requantising the 8-bit values rounds twice: at most 0.75 of a 7-bit step
    from the weight instead of 0.5 (an odd 8-bit value sits on a 7-bit half step)."""
    import numpy as np
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    weights = {n.input[1] for n in model.graph.node if n.op_type in ("Conv", "Gemm", "MatMul") and len(n.input) > 1
               and not any(a.name == "group" and a.i > 1 for a in n.attribute)}
    changed = 0
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear" or node.output[0] not in weights or node.input[0] not in inits:
            continue
        q, scale = inits[node.input[0]], inits[node.input[1]]
        if q.data_type != onnx.TensorProto.INT8:
            continue
        values = numpy_helper.to_array(q).astype(np.int32)
        q.CopyFrom(numpy_helper.from_array(np.clip(np.rint(values / 2), -64, 63).astype(np.int8), q.name))
        scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * np.float32(2), scale.name))
        changed += 1
    return changed


def build(model: onnx.ModelProto, options: OpenvinoOptions) -> tuple[dict[str, bytes], dict[str, str]]:
    import json

    import openvino as ov

    config = {"streams": options.streams or 1, "form": form_of(options)}
    sections = {"onnx": written(model, options).SerializeToString(), SECTION_CONFIG: json.dumps(config).encode()}
    return sections, {"openvino": ov.__version__, "onnx": onnx.__version__}


@dataclass(frozen=True)
class PrecisionReport:
    """The layer precisions of OpenVINO's compiled model (its runtime model): the OpenVINO backend's report."""

    key: ClassVar[str] = "openvino_layers"
    int8_layers: int  # weighted layers run on int8 / uint8 inputs
    float_layers: int  # weighted layers run in f32
    form: str
    dequantized: tuple[str, ...] = ()  # INT8 in the plan (weights through DequantizeLinear), f32 in OpenVINO
    kernels: dict[str, int] = field(default_factory=dict)  # primitive type -> count, for --json

    def to_dict(self) -> dict[str, Any]:
        return {"int8_layers": self.int8_layers, "float_layers": self.float_layers, "form": self.form,
                "dequantized_layers": list(self.dequantized), "kernels": self.kernels}  # fmt: skip

    def rows(self) -> list[tuple[str, str]]:
        text = f"{self.int8_layers} INT8 layers, {self.float_layers} float layers ({self.form} Q/DQ form)"
        if self.dequantized:
            named = ", ".join(self.dequantized[:4]) + (f" and {len(self.dequantized) - 4} more"
                                                       if len(self.dequantized) > 4 else "")  # fmt: skip
            text += (f"; {len(self.dequantized)} INT8 layer(s) of the plan run in float on dequantised weights "
                     f"({named}): their rounding error without the speed-up")
        return [("OpenVINO layers", text)]


def precision_report(plan: Plan) -> PrecisionReport:
    """Compile the plan (one thread) and read each weighted layer's runtime precision from the runtime model."""
    from trtopt.backend.openvino.runner import compiled_model

    compiled = compiled_model(plan, threads=1)
    int8_in_plan = dequantized_weight_layers(onnx.load_from_string(plan.sections["onnx"]))
    int8, floats, kernels, dequantized = 0, 0, Counter[str](), []
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if info["layerType"].astype(str) not in WEIGHTED_LAYERS:
            continue
        kernels[info["primitiveType"].astype(str)] += 1
        if info["runtimePrecision"].astype(str) in INT8_PRECISIONS:
            int8 += 1
            continue
        floats += 1
        names = info["originalLayersNames"].astype(str).split(",")
        dequantized += [n for n in names if n in int8_in_plan]
    return PrecisionReport(int8, floats, _form(plan), tuple(dequantized), dict(kernels))


def dequantized_weight_layers(model: onnx.ModelProto) -> set[str]:
    """Conv / ConvTranspose / Gemm / MatMul nodes whose weight input comes from a DequantizeLinear."""
    made_by = {out: node.op_type for node in model.graph.node for out in node.output}
    weighted = {"Conv", "ConvTranspose", "Gemm", "MatMul"}
    return {node.name for node in model.graph.node if node.op_type in weighted and len(node.input) > 1
            and made_by.get(node.input[1]) == "DequantizeLinear"}  # fmt: skip


def _form(plan: Plan) -> str:
    import json

    raw = plan.sections.get(SECTION_CONFIG)
    return str(json.loads(raw).get("form", "?")) if raw else "?"
