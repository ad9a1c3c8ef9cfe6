"""The calibration stage of `trtopt build` and `trtopt calibrate`: thresholds for a graph's tensors, from a
cache or measured on data, with the stage's own rules (bounded activations, saving the cache).

    calibration = calibrate_graph(graph, model, tensors, CalibConfig(), dataset=data, data=DataConfig(...))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from trtopt.calib.cache import channel_counts, check_cache_matches, load_cache, save_cache
from trtopt.calib.calibration import Calibration
from trtopt.calib.collect import CalibProgress, calibrate
from trtopt.calib.config import CalibConfig
from trtopt.calib.fingerprint import model_fingerprint
from trtopt.errors import TrtoptError

if TYPE_CHECKING:
    import onnx
    import onnx_graphsurgeon as gs

    from trtopt.calib.equalization import EqualizationRecord
    from trtopt.data import Dataset
    from trtopt.data.config import DataConfig

ProgressHook = Callable[[CalibProgress], None]  # calibration progress, with the total filled in


def calibrate_graph(
    graph: gs.Graph,
    model: onnx.ModelProto,
    tensors: Sequence[str],
    config: CalibConfig,
    *,
    dataset: Dataset | None,
    data: DataConfig,
    progress: ProgressHook | None = None,
    loaded: Calibration | None = None,
    equalization: EqualizationRecord | None = None,
) -> Calibration:
    """Thresholds for `tensors` of `graph` (`model` is the same graph as ONNX): read from `config.cache` (or
    `loaded`, that cache read already) and checked against the graph, or measured on `dataset` in batches of
    `data.batch`; then bounded tensors keep their maximum (`config.bounded_max`), the result records
    `equalization` (what rewrote `graph` before: `trtopt.calib.equalization`) and is saved (`config.save_cache`)."""
    if config.cache is not None:
        calibration = loaded if loaded is not None else load_cache(config.cache)
        check_cache_matches(calibration, tensors, fingerprint=model_fingerprint(model), channels=channel_counts(graph))
        return calibration
    if dataset is None:
        raise TrtoptError("Calibration needs data or a cache.", fix="Pass --calib DIR or --calib-cache FILE.")
    from trtopt.calib.auto import scoring_split

    dataset, scoring = scoring_split(dataset, data.batch) if config.method == "auto" else (dataset, None)
    bounded = _bounded(graph) if config.bounded_max else set()  # found once: auto skips them, the rule below sets them
    calibration = calibrate(
        model,
        lambda: (b.feeds for b in dataset.batches(data.batch, workers=data.workers)),
        tensors,
        config,
        progress=(lambda p: progress(p if p.total_samples else replace(p, total_samples=len(dataset))))
        if progress else None,  # fmt: skip
        data_description=f"{len(dataset)} samples from {' '.join(data.sources)}",
        score_batches=scoring,
        at_max=bounded if config.method == "auto" else set(),  # bounded_at_max gives them their maximum anyway
    )
    calibration = bounded_at_max(graph, calibration, bounded=bounded) if config.bounded_max else calibration
    # Samples as the data set counts them: the collector counts rows of the first input, which a padded fixed
    # batch inflates and a model fed whole feeds (silero-vad's [chunks, 576] audio) multiplies.
    calibration = replace(calibration, equalization=equalization, num_samples=len(dataset))
    if config.save_cache is not None:
        save_cache(config.save_cache, calibration)
    return calibration


def _bounded(graph: gs.Graph) -> set[str]:
    from trtopt.calib.ranges import bounded_tensors

    return bounded_tensors(graph)


def bounded_at_max(graph: gs.Graph, calibration: Calibration, *, bounded: set[str] | None = None) -> Calibration:
    """Tensors with a hard activation bound keep their observed maximum (see trtopt.calib.ranges). `bounded`:
    those tensors of `graph` where the caller has them already (None: found here)."""
    histograms = calibration.histograms or {}
    amax = dict(calibration.amax)
    bounded = (_bounded(graph) if bounded is None else bounded) & set(histograms)
    for name in bounded:
        amax[name] = max(amax[name], float(histograms[name].amax))
    choices = {**calibration.choices, **dict.fromkeys(bounded, "max")} if calibration.choices else None
    return replace(calibration, amax=amax, choices=choices)
