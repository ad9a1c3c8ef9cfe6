"""Streaming collection: run the FP32 model batch by batch, histogram the chosen tensors, pick thresholds.

This is the only calibration module that executes a model (ONNX Runtime, via `OrtSession` with the
calibrated tensors exposed as extra outputs); the math lives in `histogram.py`, `kernels.py` and
`thresholds.py`.

One pass over the data: each batch's activations go into per-tensor fine grids that re-bin exactly as
the range grows (`trtopt.calib.kernels`), so the batch source is read once (a one-shot generator is
fine) and the result does not depend on batch size or order.

A pipeline, not a sequence (issue #18): while ONNX Runtime runs batch k, the tensors of batch k-1 are
counted in parallel threads (the compiled counting loop releases the GIL, as ONNX Runtime does), and a
`trtopt.data.Dataset` decodes the next batches in its own worker pool. Each tensor's collector still
sees the batches one at a time and in order (batch k's counting starts only after batch k-1's has
finished), so the histograms are bit-identical to the sequential ones. The loop records how long it
waits on each stage (`CalibProgress.stage_seconds`): the stage it waits on most bounds the speed.

Memory: two batches of activations at a time (the batch being counted and the batch ONNX Runtime is
producing), written into two sets of arrays allocated once per batch shape and reused
(`trtopt.execution.ort_session.ReusedOutputs`: fresh output arrays cost page faults, a tenth of the
inference time), plus a fixed grid per tensor (256 KiB at 2048 bins) and the data source's read-ahead
(a `Dataset`: two batches of samples); nothing grows with the number of samples.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Generic, Protocol, TypeAlias, TypeVar

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from trtopt.calib.calibration import Calibration, CalibTimings
from trtopt.calib.config import CalibConfig
from trtopt.calib.fingerprint import ModelLike, model_fingerprint
from trtopt.calib.histogram import HistogramCollector, RangeCollector, TensorHistogram, TensorRange
from trtopt.calib.thresholds import ZERO_AMAX, candidate_thresholds, compute_thresholds, threshold
from trtopt.errors import CalibrationError
from trtopt.frontend.loader import load_model

log = logging.getLogger(__name__)

# Threads that count a batch's tensors; the compiled loop releases the GIL, so they run in parallel.
DEFAULT_HISTOGRAM_THREADS = 4

Feeds = Mapping[str, np.ndarray]
BatchSource: TypeAlias = Callable[[], Iterable[Feeds]] | Iterable[Feeds]
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


# What the collection loop can wait on: the data source (decoding), ONNX Runtime, the counting threads.
STAGES = ("decode", "inference", "counting")


@dataclass(frozen=True)
class CalibProgress:
    """Reported after every batch: the pass ("histogram", or "range" for the max method alone), batches
    and samples done so far, the sample total where known, the seconds since the pass began, and the
    seconds the loop has waited on each of `STAGES` (see `bound`)."""

    phase: str
    batches: int
    samples: int
    total_samples: int | None
    seconds: float = 0.0
    stage_seconds: Mapping[str, float] = field(default_factory=dict)

    @property
    def images_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def bound(self) -> str | None:
        """The stage that bounds the speed: the one the loop has spent the most time waiting on."""
        waited = {stage: s for stage, s in self.stage_seconds.items() if s > 0}
        return max(waited, key=waited.__getitem__) if waited else None


ProgressFn = Callable[[CalibProgress], None]
AUTO_PHASE = "auto scoring"  # the phase of `--method auto`'s reports: tensors scored, of those to score
# A build stage after calibration (`trtopt.build.StageTimes`) reports as a phase named this prefix and what it does,
# 0 of 1 when it starts and 1 of 1 when it is done: a segmentation model's sensitivity ranking, verification and
# speed check ran 8 minutes with no line after calibration's (FCN-ResNet50 at 320x320, two backends under auto).
BUILD_STAGE = "build stage: "


def count_reporter(progress: ProgressFn | None, phase: str) -> Callable[[int, int], None] | None:
    """(done, total) counts of something other than images (tensors scored, the search's trials) as
    progress reports of `phase`, with the seconds since the reporter was made (a 1024 x 1024 model spends
    minutes in each: the log lines say how long it has run)."""
    if progress is None:
        return None
    start = time.perf_counter()
    return lambda done, total: progress(CalibProgress(phase, done, done, total, time.perf_counter() - start))


class Collected(Mapping[str, T], Generic[T]):
    """Per-tensor results by name (a read-only mapping), with the samples, batches and seconds of the pass."""

    def __init__(self, results: dict[str, T], *, num_samples: int, num_batches: int, seconds: float) -> None:
        self._results = results
        self.num_samples = num_samples
        self.num_batches = num_batches
        self.seconds = seconds

    def __getitem__(self, name: str) -> T:
        return self._results[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._results)

    def __len__(self) -> int:
        return len(self._results)

    @property
    def images_per_s(self) -> float:
        return self.num_samples / self.seconds if self.seconds > 0 else float("inf")


CollectedHistograms = Collected[TensorHistogram]
CollectedRanges = Collected[TensorRange]


def calibrate(
    model: ModelLike,
    batches: BatchSource,
    tensors: Sequence[str],
    config: CalibConfig | None = None,
    *,
    progress: ProgressFn | None = None,
    data_description: str | None = None,
    score_batches: Iterable[tuple[Feeds, int]] | None = None,
    at_max: Collection[str] = (),
) -> Calibration:
    """Thresholds T for `tensors` of `model` from the FP32 activations on `batches` (see module doc).

    The "max" method keeps max|x| alone (no histograms), unless `config.keep_histograms` asks for them.
    The "auto" method scores its candidates on `score_batches` ((feeds, rows) pairs, samples that were not
    histogrammed: see `trtopt.calib.auto`); without them it falls back to "mse" and says so. Tensors of
    `at_max` keep max|x| under "auto", unscored: the stage's bounded activations, whose threshold
    `trtopt.calib.stage.bounded_at_max` sets to their maximum whatever auto would choose.
    """
    config = config if config is not None else CalibConfig()
    model = _load(model)
    choices: dict[str, str] | None = None
    if _max_only(config):
        ranges = collect_ranges(model, batches, tensors, config, progress=progress)
        amax = {name: r.amax if r.amax > 0 else ZERO_AMAX for name, r in ranges.items()}
        collected: Collected = ranges
        histograms = None
        threshold_s = 0.0
    else:
        histograms = collect_histograms(model, batches, tensors, config, progress=progress)
        start = time.perf_counter()
        with ThreadPoolExecutor(_workers(config), thread_name_prefix="trtopt-calib") as pool:
            if config.method == "auto":
                amax, choices = _auto_thresholds(model, histograms, config, score_batches, pool.map, at_max,
                                                 progress=progress)  # fmt: skip
            else:
                amax = compute_thresholds(histograms, config, map_fn=pool.map)
        threshold_s = time.perf_counter() - start
        collected = histograms
    timings = CalibTimings(collect_s=collected.seconds, threshold_s=threshold_s, num_samples=collected.num_samples)
    log.info(
        "calibrated %d tensors (%s) on %d samples in %.2f s (%.1f samples/s)",
        len(amax), config.method, collected.num_samples, timings.total_s, timings.images_per_s,
    )
    return Calibration(
        amax=amax,
        method=config.method,
        num_samples=collected.num_samples,
        histograms=dict(histograms) if histograms is not None and config.keep_histograms is not False else None,
        channel_means={n: r.channel_mean for n, r in collected.items() if r.channel_mean is not None},
        fingerprint=model_fingerprint(model),
        timings=timings,
        data_description=data_description,
        choices=choices,
    )


def _auto_thresholds(
    model: onnx.ModelProto | gs.Graph,
    histograms: Mapping[str, TensorHistogram],
    config: CalibConfig,
    score_batches: Iterable[tuple[Feeds, int]] | None,
    map_fn: Callable[..., Iterable[dict[str, float]]],
    at_max: Collection[str] = (),
    *,
    progress: ProgressFn | None = None,
) -> tuple[dict[str, float], dict[str, str]]:
    """`auto`: every candidate threshold of every tensor (max alone for `at_max`), then the one
    `choose_thresholds` scores best; `progress` hears an `AUTO_PHASE` report per tensor scored."""
    from trtopt.calib.auto import choose_thresholds
    from trtopt.calib.auto_whole import WHOLE_MODEL, max_wins
    from trtopt.frontend.loader import onnx_from_graph

    names = list(histograms)
    searched = [n for n in names if n not in at_max]
    found = dict(zip(searched, map_fn(candidate_thresholds, [histograms[n] for n in searched],
                                      [config] * len(searched)), strict=True))  # fmt: skip
    as_max = replace(config, method="max")
    options = {n: found[n] if n in found else {"max": threshold(histograms[n], as_max)} for n in names}
    if score_batches is None:
        log.warning("auto calibration has no samples to score its candidates on; it keeps the mse thresholds")
        kept = {n: "mse" if "mse" in options[n] else "max" for n in names}
        return {n: options[n][m] for n, m in kept.items()}, kept
    proto = onnx_from_graph(model) if isinstance(model, gs.Graph) else model
    score_batches = list(score_batches)
    chosen = choose_thresholds(proto, options, score_batches, threads=config.threads,
                               on_tensor=count_reporter(progress, AUTO_PHASE))  # fmt: skip
    amax, methods = {n: c.amax for n, c in chosen.items()}, {n: c.method for n, c in chosen.items()}
    maxima = {n: options[n].get("max", threshold(histograms[n], as_max)) for n in names}
    if maxima != amax and max_wins(proto, amax, maxima, score_batches, config.threads):
        log.info("auto: max thresholds for every tensor (the whole model's outputs moved clearly less than with "
                 "each tensor's own best: trtopt.calib.auto_whole)")  # fmt: skip
        return maxima, dict.fromkeys(names, WHOLE_MODEL)
    return amax, methods


def collect_ranges(
    model: ModelLike,
    batches: BatchSource,
    tensors: Sequence[str],
    config: CalibConfig | None = None,
    *,
    progress: ProgressFn | None = None,
) -> CollectedRanges:
    """max|x| and the value count of each of `tensors`, in one pass over `batches`."""
    config = config if config is not None else CalibConfig()
    collectors = {name: RangeCollector(name) for name in _unique_names(tensors)}
    return _collect(_load(model), batches, collectors, config, progress, "range")


def collect_histograms(
    model: ModelLike,
    batches: BatchSource,
    tensors: Sequence[str],
    config: CalibConfig | None = None,
    *,
    progress: ProgressFn | None = None,
) -> CollectedHistograms:
    """Histograms of |x| (`config.num_bins` bins) for each of `tensors`, in one pass over `batches`."""
    config = config if config is not None else CalibConfig()
    collectors = {name: HistogramCollector(name, config.num_bins) for name in _unique_names(tensors)}
    return _collect(_load(model), batches, collectors, config, progress, "histogram")


class _Collector(Protocol[T_co]):
    def update(self, values: np.ndarray) -> None: ...

    def result(self) -> T_co: ...


def _collect(
    model: onnx.ModelProto | gs.Graph,
    batches: BatchSource,
    collectors: Mapping[str, _Collector[T]],
    config: CalibConfig,
    progress: ProgressFn | None,
    phase: str,
) -> Collected[T]:
    """Run `model` on every batch with the collectors' tensors exposed, and count each tensor into its
    collector while the next batch runs (see the module doc)."""
    from trtopt.data.arrays import has_batch_axis
    from trtopt.data.inputs import InputInfo
    from trtopt.execution import OrtSession
    from trtopt.execution.ort_session import ReusedOutputs

    start = time.perf_counter()
    names = list(collectors)
    session = OrtSession(model, expose=names, threads=config.threads, spin=False)
    runner = ReusedOutputs(session, names, depth=2)  # batch k is counted while batch k + 1 runs
    first_input = session.input_names[0] if session.input_names else None
    declared = [InputInfo(i.name, i.shape, "float32") for i in session.session.get_inputs()]
    first_input = first_input if has_batch_axis(declared) else None  # whole feeds ([3, H, W]): one sample each
    clock = _StageClock()
    batch_count = sample_count = 0
    with ThreadPoolExecutor(_workers(config), thread_name_prefix="trtopt-calib") as pool:
        counting: dict[str, Future[None]] = {}  # the previous batch's, running while the next batch infers
        source = _open(batches)
        while True:
            with clock.waiting("decode"):
                feeds = next(source, None)
            if feeds is None:
                break
            _check_feeds(feeds, batch_count + 1, sample_count)
            with clock.waiting("inference"):
                outputs = runner.run(feeds)
            with clock.waiting("counting"):
                _finish(counting, names)  # one batch at a time per collector: bit-identical counts
            counting = _count(pool, collectors, outputs)
            batch_count += 1
            sample_count += _batch_size(feeds, first_input)
            if progress is not None:
                seconds = time.perf_counter() - start
                progress(CalibProgress(phase, batch_count, sample_count, None, seconds, dict(clock.seconds)))
        with clock.waiting("counting"):
            _finish(counting, names)
    log.debug("calibration waited on %s", ", ".join(f"{k} {v:.2f} s" for k, v in clock.seconds.items()))
    if batch_count == 0:
        raise CalibrationError(
            "The calibration data gave no batches.", fix="Point calibration at a non-empty set of inputs."
        )
    results = {name: collector.result() for name, collector in collectors.items()}
    return Collected(results, num_samples=sample_count, num_batches=batch_count, seconds=time.perf_counter() - start)


class _StageClock:
    """Seconds the collection loop has spent waiting on each of `STAGES`."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(STAGES, 0.0)

    @contextmanager
    def waiting(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] += time.perf_counter() - start


def _count(
    pool: ThreadPoolExecutor, collectors: Mapping[str, _Collector[T]], outputs: Feeds
) -> dict[str, Future[None]]:
    """Start counting each tensor of one batch, largest first (the longest jobs start first)."""
    order = sorted(collectors, key=lambda name: outputs[name].size, reverse=True)
    return {name: pool.submit(collectors[name].update, outputs[name]) for name in order}


def _finish(counting: Mapping[str, Future[None]], names: Sequence[str]) -> None:
    """Wait for a batch's counting; an error is raised for the first failing tensor in the caller's order
    (the one nearest the model input)."""
    for name in names:
        if name in counting:
            counting[name].result()


def _workers(config: CalibConfig) -> int:
    return config.histogram_threads or min(DEFAULT_HISTOGRAM_THREADS, os.cpu_count() or 1)


def _max_only(config: CalibConfig) -> bool:
    return config.method == "max" and not config.keep_histograms


def _open(batches: BatchSource) -> Iterator[Feeds]:
    return iter(batches()) if callable(batches) else iter(batches)


def _check_feeds(feeds: Feeds, batch: int, before: int) -> None:
    """A NaN or infinity in the data itself, named as such: the first tensor to hold it was reported instead, an
    internal one (MTCNN's NHWC input transposed, `adjusted_input3`; round 13's hunt)."""
    for name, value in feeds.items():
        value = np.asarray(value)
        finite = np.isfinite(value) if value.dtype.kind == "f" else None
        if finite is not None and not finite.all():
            rows = np.flatnonzero(~finite.reshape(len(value), -1).all(axis=1)) if value.ndim else [0]
            raise CalibrationError(
                f"Model input {name!r} holds {int(np.count_nonzero(np.isnan(value)))} NaN and "
                f"{int(np.count_nonzero(np.isinf(value)))} infinite values in calibration batch {batch} (sample "
                f"{', '.join(str(before + i + 1) for i in rows[:5])}{' ...' if len(rows) > 5 else ''} of the data).",
                fix="The data is broken, not the model: remove or repair those samples (np.isfinite finds them).",
            )


def _batch_size(feeds: Feeds, first_input: str | None) -> int:
    value = feeds.get(first_input) if first_input is not None else None
    return int(value.shape[0]) if value is not None and np.ndim(value) > 0 else 1


def _unique_names(tensors: Sequence[str]) -> list[str]:
    if isinstance(tensors, str):
        raise CalibrationError(f"`tensors` is the string {tensors!r}.", fix="Pass a list of tensor names.")
    names = list(dict.fromkeys(tensors))
    if not names:
        raise CalibrationError(
            "No tensors to calibrate.", fix="Name the activation tensors that get INT8 thresholds."
        )
    return names


def _load(model: ModelLike) -> onnx.ModelProto | gs.Graph:
    return model if isinstance(model, (onnx.ModelProto, gs.Graph)) else load_model(model).model
