"""Activation equalisation and calibration caches: record the rewrite with the thresholds measured after it,
and redo it exactly in a build that reads those thresholds from the cache.

A build from data equalises (`trtopt.quant.equalize`), then calibrates the rewritten graph; `trtopt calibrate`
does the same, and the cache keeps the gains (`trtopt.calib.equalization`). A build from the cache applies
those gains, not new ones, so its graph and thresholds are the ones a build from the same data gets:

    record, report = equalize_recorded(graph, model, dataset, batch, folds)   # before calibrating
    note = replay(graph, model, cache, equalize=True, folds=folds)            # before reading the thresholds

`--no-equalize` with a cache whose thresholds belong to a rewritten graph is refused: the thresholds of the
rescaled tensors are not those of the graph as given, and the cache has no others. A cache calibrated on the
graph as given (`--no-equalize`, an older trtopt, TensorRT or ONNX Runtime) builds without equalisation,
and the build summary says so and how to get it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from trtopt.calib.equalization import EqualizationRecord
from trtopt.calib.fingerprint import model_fingerprint
from trtopt.errors import CalibrationError
from trtopt.quant.equalize import GATED_IN_BUILDS, EqualizeReport, equalize_activations, find_sites, rescale_site

if TYPE_CHECKING:
    import onnx
    import onnx_graphsurgeon as gs

    from trtopt.calib import Calibration
    from trtopt.data import Dataset

RECALIBRATE = "recalibrate with this trtopt (`trtopt calibrate MODEL --calib DIR -o cache.json`, trtopt's format)"


def _folds(folds: frozenset[str] | None) -> tuple[str, ...] | None:
    return tuple(sorted(folds)) if folds is not None else None


def equalize_recorded(
    graph: gs.Graph, model: onnx.ModelProto, dataset: Dataset, batch: int, folds: frozenset[str] | None,
    integer_gates: bool = False,
) -> tuple[EqualizationRecord, EqualizeReport]:
    """Equalise `graph` (in place; `model` is it as ONNX, before) on up to 64 samples of `dataset`, as builds
    do, and the record a cache keeps of it. `folds`, `integer_gates`: `equalize_activations`'s."""
    from trtopt.data.dataset import sample_batches

    given = model_fingerprint(model)
    batches = [feeds for feeds, _ in sample_batches(dataset, batch, 64)]
    report = equalize_activations(graph, batches, folds, gates=GATED_IN_BUILDS, integer_gates=integer_gates)
    return EqualizationRecord(True, report.gains, given, _folds(folds)), report


def not_equalized(model: onnx.ModelProto) -> EqualizationRecord:
    """The record of a calibration on the graph as given (--no-equalize)."""
    return EqualizationRecord(False, {}, model_fingerprint(model))


def replay(
    graph: gs.Graph, model: onnx.ModelProto, cache: Calibration, *, equalize: bool, folds: frozenset[str] | None
) -> str | None:
    """Redo the rewrite `cache` records on `graph` (in place; `model` is it as ONNX), as `equalize_activations`
    did it: wherever the graph has sites, then keeping it canonical. Returns the build summary's note on
    equalisation (None: nothing to say); a cache that does not fit raises CalibrationError."""
    record, where = cache.equalization, cache.source or "the calibration cache"
    can = bool(find_sites(graph, gates=GATED_IN_BUILDS)) if equalize else False
    if record is None or not record.applied:
        if not can:
            return None
        why = ("was calibrated with --no-equalize" if record is not None else
               "has no equalisation record (written by an older trtopt, or by another tool)")  # fmt: skip
        return (f"not applied: {where} {why}, so its thresholds are for the graph as given; to get it, {RECALIBRATE}, "
                "or build with --calib DIR")  # fmt: skip
    if not equalize and record.gains:
        raise CalibrationError(
            f"--no-equalize, but {where} holds the thresholds of the graph after activation equalisation "
            f"({len(record.gains)} tensors rescaled and renamed): it has none for the graph as given.",
            fix="Drop --no-equalize to build from this cache (the rewrite is exact), or recalibrate with "
            "`trtopt calibrate ... --no-equalize` for a cache of the graph as given.",
        )
    if record.graph_fingerprint is not None and record.graph_fingerprint != model_fingerprint(model):
        raise CalibrationError(
            f"{where} does not fit this model: it was calibrated after equalising another graph "
            f"(fingerprint {record.graph_fingerprint[:12]}…, this model's is {model_fingerprint(model)[:12]}…).",
            fix="Pass the cache made for this exact model and the same graph flags (--shapes, --passes), or "
            "recalibrate this model.",
        )
    if not can and not record.gains:  # --no-equalize, or a graph without sites: nothing was rewritten
        return None
    apply_gains(graph, record.gains, where)  # sites the record does not name: all gains were 1
    if not record.gains:
        return None
    note = f"{len(record.gains)} tensors rescaled, with the gains recorded in the cache"
    if record.output_folds != _folds(folds):
        note += (
            "; the gains were chosen for another backend's quantised tensors (still exact, but not the plan a "
            "build from data makes here: recalibrate with `trtopt calibrate --backend NAME`, NAME this build's backend)"
        )
    return note


def apply_gains(graph: gs.Graph, gains: Mapping[str, np.ndarray], where: str = "the calibration cache") -> None:
    """Rescale each site of `graph` whose tensor `gains` names by its recorded gains (in the graph's site order,
    as `equalize_activations` did), then keep the graph canonical. Every named site must exist, with as many
    channels as gains."""
    sites = {s.tensor: s for s in find_sites(graph, gates=GATED_IN_BUILDS)}
    missing = [name for name in gains if name not in sites]
    wrong = [
        f"{name!r} has {np.asarray(gain).size} gains, the tensor {sites[name].producer.inputs[1].values.shape[0]} "
        "channels"
        for name, gain in gains.items()
        if name in sites and np.asarray(gain).size != sites[name].producer.inputs[1].values.shape[0]
    ]
    if missing or wrong:
        problems = ([f"no tensor feeding a depthwise conv is named {', '.join(map(repr, missing[:4]))}"] if missing
                    else []) + wrong[:4]  # fmt: skip
        raise CalibrationError(
            f"The equalisation recorded in {where} does not fit this model: {'; '.join(problems)}.",
            fix="Pass the cache made for this exact model and the same graph flags (--shapes, --passes), or "
            "recalibrate this model.",
        )
    for name, site in sites.items():
        if name in gains:
            rescale_site(graph, site, np.asarray(gains[name], dtype=np.float64))
    graph.cleanup().toposort()
