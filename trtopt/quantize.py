"""The quantisation chain of a build (`trtopt.build` calls `quantize_graph`): equalise, place Q/DQ by the
backend's rules, calibrate, search for the layers INT8 costs too much on (`trtopt.search`), keep unlike concat
inputs float, correct biases, insert Q/DQ. It composes the calib, quant and search stages, which do not know each
other's order; it is told the configs of those stages, not the whole build's."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

import onnx
import onnx_graphsurgeon as gs

from trtopt.backend import (
    quantizable_tensors,
)
from trtopt.calib.config import CalibConfig
from trtopt.calib.stage import ProgressHook
from trtopt.data.config import DataConfig
from trtopt.errors import TrtoptError
from trtopt.frontend import onnx_from_graph
from trtopt.quant import QdqReport, QuantConfig, insert_qdq, plan_quantization
from trtopt.quant.bias import BiasReport, correct_biases_for_build
from trtopt.quant.concat_ranges import float_unlike_concats
from trtopt.quant.thin import Wider, wider_model
from trtopt.search import Sensitivity, SevenBit, float_sensitive_layers, seven_bit_for_build

if TYPE_CHECKING:
    from trtopt.calib import Calibration
    from trtopt.calib.equalization import EqualizationRecord
    from trtopt.data import Dataset


log = logging.getLogger(__name__)


class Quantized(NamedTuple):
    """What the quantisation stage made (all None for an FP32 build)."""

    calibration: Calibration | None = None
    bias: BiasReport | None = None
    qdq: QdqReport | None = None
    sensitivity: Sensitivity | None = None  # the layers kept float because INT8 cost too much (auto-exclude)
    equalization: str | None = None  # what activation equalisation did, for the summary
    seven_bit: SevenBit | None = None  # the dense layers given 7-bit weights (trtopt.search.seven_bit)
    not_measured: tuple[str, ...] = ()  # the searches asked for that had no data to measure on (a cache-only build)
    wider: Wider | None = None  # the Q/DQ model with the thin layers in INT8 too, for the speed check to time


def quantize_graph(
    graph: gs.Graph,
    fp32: onnx.ModelProto,
    quant: QuantConfig,
    data: Dataset | None,
    calib: CalibConfig,
    data_config: DataConfig,
    times: Callable[[str], AbstractContextManager[None]],
    progress: ProgressHook | None,
    measured: Callable[[onnx.ModelProto], onnx.ModelProto],
) -> Quantized:
    """Place Q/DQ by `quant` (the backend's form), calibrate, search, choose 7-bit weights where the backend asks,
    correct biases, insert Q/DQ into `graph` (in place).

    Calibration covers every tensor any backend may quantise (`quantizable_tensors`), not only this plan's:
    one cache then serves every build of the graph, and the thresholds do not depend on the backend or on
    --exclude. (Measuring fewer tensors is not neutral: ONNX Runtime fuses differently around the tensors
    it exposes, so the FP32 activations, and with them thresholds and channel means, change by rounding.)"""
    from trtopt.calib.stage import calibrate_graph

    # trtopt.quant.equalize_cache
    cache, record, note, fp32 = _equalize(graph, fp32, quant, data, calib, data_config.batch)
    qplan = plan_quantization(graph, quant)
    tensors = quantizable_tensors(graph)
    if not tensors:  # a tree ensemble, an elementwise graph: say so, not "No tensors to calibrate" from below
        ops = ", ".join(sorted({n.op for n in graph.nodes})) or "none"
        raise TrtoptError(
            f"Nothing in this model can run in INT8: it has no layer trtopt quantises (Conv, ConvTranspose, MatMul, "
            f"Gemm with activations to quantise); its ops: {ops}.",
            fix="Build it without --int8 (the float plan is what an INT8 build would give).",
        )
    with times("calibrate"):
        calibration = calibrate_graph(graph, fp32, tensors, calib, dataset=data, data=data_config,
                                      progress=progress, loaded=cache, equalization=record)  # fmt: skip
    with times("quantize"):
        sensitivity = None
        if quant.auto_exclude and data is not None:  # trtopt.search.sensitivity
            qplan, sensitivity = float_sensitive_layers(graph, quant, qplan, calibration, data, data_config.batch,
                                                        progress, lower=measured)  # fmt: skip
        amax = sensitivity.amax(calibration.amax) if sensitivity else calibration.amax
        calibrated = replace(calibration, amax=amax)  # 7-bit weights where the backend asks (trtopt.search.seven_bit)
        quant, seven = seven_bit_for_build(graph, quant, qplan, calibrated, data, data_config.batch, measured)
        qplan = float_unlike_concats(graph, qplan, calibration.ranges)  # trtopt.quant.concat_ranges
        seven_bit = quant.seven_bit_layers
        wider = wider_model(graph, quant, qplan, amax, calibration, seven_bit) if data is not None else None
        bias = correct_biases_for_build(graph, qplan, calibration, seven_bit) if quant.bias_correction else None
        qdq = insert_qdq(graph, qplan, amax, seven_bit, quant.min_amax)
    return Quantized(calibration, bias, qdq, sensitivity, note, seven, _not_measured(quant, data), wider)


def _not_measured(quant: QuantConfig, data: Dataset | None) -> tuple[str, ...]:
    """The searches `quant` asks for that measure fidelity on calibration data, where a build has none (its
    thresholds come from a cache alone): the plan then keeps every layer INT8 and, where the backend's encoding
    wants 7-bit weights, keeps 8-bit ones (exact, slower kernels on AVX2), and the summary says so."""
    if data is not None:
        return ()
    asked = {"sensitivity analysis": quant.auto_exclude, "7-bit weight search": quant.seven_bit_search}
    return tuple(name for name, on in asked.items() if on)


def _equalize(
    graph: gs.Graph, fp32: onnx.ModelProto, quant: QuantConfig, data: Dataset | None, calib: CalibConfig, batch: int
) -> tuple[Calibration | None, EqualizationRecord | None, str | None, onnx.ModelProto]:
    """Activation equalisation before calibration (exact; `trtopt.quant.equalize`), in place: measured on the
    data and recorded for a cache, or redone from the cache's record. Returns (the cache read, or None; the
    record; the summary's note; `graph` as ONNX, rewritten or `fp32`)."""
    from trtopt.calib.cache import load_cache
    from trtopt.quant.equalize_cache import equalize_recorded, not_equalized, replay

    folds = quant.output_folds if quant.quantize_outputs else None
    if calib.cache is not None:
        cache = load_cache(calib.cache)
        note = replay(graph, fp32, cache, equalize=quant.equalize, folds=folds)
        rewritten = cache.equalization is not None and cache.equalization.applied and quant.equalize
        return cache, None, note, onnx_from_graph(graph) if rewritten else fp32
    if not quant.equalize or data is None:
        return None, not_equalized(fp32), None, fp32
    record, report = equalize_recorded(graph, fp32, data, batch, folds, quant.integer_gates)
    note = f"{len(report.gains)} tensors rescaled" if report.gains else None
    return None, record, note, onnx_from_graph(graph)
