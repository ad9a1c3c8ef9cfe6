"""What a build writes into its plan besides the sections: tensor specs, the quantisation record, the backend's
profiles, 2:4 sparsity, and the plan's metadata."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx
import onnx_graphsurgeon as gs

from trtopt.backend import BuildTarget, Profile
from trtopt.frontend.float_types import float_precision
from trtopt.plan import OptimizerRecord, PlanMetadata, QuantRecord, TensorSpec
from trtopt.plan.verification import Verification
from trtopt.quantize import Quantized

if TYPE_CHECKING:
    from trtopt.data import PreprocessSpec
    from trtopt.passes import OptimizeResult


log = logging.getLogger(__name__)


def io_specs(graph: gs.Graph) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    return _specs(graph.inputs), _specs(graph.outputs)


def _specs(tensors: list[gs.Tensor]) -> tuple[TensorSpec, ...]:
    return tuple(
        TensorSpec(
            t.name,
            tuple(d if isinstance(d, int) and d > 0 else -1 for d in (t.shape or [])),
            str(onnx.helper.tensor_dtype_to_np_dtype(onnx.helper.np_dtype_to_tensor_dtype(t.dtype))),
        )
        for t in tensors
    )


def quant_record(quantized: Quantized) -> QuantRecord | None:
    calibration, bias, qdq, sensitivity = quantized[:4]
    if calibration is None or qdq is None:
        return None
    methods = {t: calibration.choices.get(t, "") for t in qdq.thresholds} if calibration.choices else {}
    for tensor in sensitivity.thresholds if sensitivity is not None else ():  # the search moved it (quant.widen)
        methods[tensor] = f"{methods.get(tensor) or calibration.method}, widened"
    return QuantRecord(
        method=calibration.method,
        samples=calibration.num_samples,
        method_counts=calibration.method_counts(),
        threshold_methods=methods,
        sensitivity=sensitivity.to_dict() if sensitivity is not None else None,
        thresholds=qdq.thresholds,
        int8_layers=tuple(qdq.quantized_layers),
        float_layers=qdq.float_layers,
        bias_corrected_layers=tuple(bias.corrected) if bias is not None else (),
    )


def plan_records(graph: gs.Graph, target: BuildTarget, backend: str, profiles: Mapping[str, Profile] | None,
             quantized: Quantized) -> dict[str, Any]:  # fmt: skip
    """The plan's optional records: the run-time shape profiles the backend fixed (`trtopt export --triton`
    reads the batch limit), and with --sparsity which layers' weights are 2:4 (trtopt.analysis.sparsity)."""
    records: dict[str, Any] = {}
    if profiles:
        records["profiles"] = {n: {"min": list(p.min), "opt": list(p.opt), "max": list(p.max)}
                               for n, p in profiles.items()}  # fmt: skip
    if target.sparsity:
        from trtopt.analysis.sparsity import sparsity_record

        layers = quantized.qdq.quantized_layers if quantized.qdq else ()
        records["sparsity"] = sparsity_record(graph, layers, target.fp16, backend)
    if quantized.seven_bit is not None:  # the dense layers given 7-bit weights (read back by `trtopt inspect`)
        records["extra"] = {"seven_bit_weights": quantized.seven_bit.to_dict()}
    if quantized.not_measured:  # searches a cache-only build could not run (the summary says how to run them)
        records.setdefault("extra", {})["not_measured"] = list(quantized.not_measured)
    return records


def plan_metadata(
    path: Path,
    target: BuildTarget,
    spec: PreprocessSpec | None,
    labels: list[str] | None,
    optimized: OptimizeResult,
    quantized: Quantized,
    verification: Verification | None,
    records: dict[str, Any],
) -> PlanMetadata:
    return PlanMetadata(
        **records,
        source_model=path.name,
        precision=("int8" if target.int8 else float_precision(optimized.graph)) + ("+fp16" if target.fp16 else ""),
        preprocess=spec.to_dict() if spec is not None else None,
        labels=tuple(labels) if labels is not None else None,
        optimizer=OptimizerRecord.from_result(optimized),
        quant=quant_record(quantized),
        verification=verification,
    )
