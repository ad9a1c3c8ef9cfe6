"""Streaming collection: run the FP32 model batch by batch, histogram the chosen tensors, pick thresholds.

This is the only calibration module that executes a model (ONNX Runtime, via `OrtSession` with the
calibrated tensors exposed as extra outputs); the math lives in `histogram.py` and `thresholds.py`.

Two passes over the data (see `histogram.py` for why): pass 1 finds max|x| per tensor, pass 2 counts
the histogram over [0, max|x|]. The batch source is therefore read twice and must give the same samples
both times: pass a re-iterable (a list, a dataset object whose `__iter__` starts over) or a function
returning a fresh iterator (``lambda: load_dataset(...)``). A one-shot generator is refused up front.
The "max" method needs pass 1 only (`collect_ranges`), and then takes any iterable.

Memory: one batch of activations at a time (each batch's outputs are released before the next batch
runs), plus `num_bins` counters per tensor; nothing grows with the number of samples.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from trtopt.calib.calibration import Calibration, CalibTimings
from trtopt.calib.config import CalibConfig
from trtopt.calib.fingerprint import ModelLike, model_fingerprint
from trtopt.calib.histogram import HistogramCollector, RangeCollector, TensorHistogram, TensorRange
from trtopt.calib.thresholds import ZERO_AMAX, compute_thresholds
from trtopt.errors import CalibrationError
from trtopt.frontend.loader import load_model

log = logging.getLogger(__name__)

# numpy releases the GIL for the arithmetic of the histogram kernel but not for the counting (np.add.at),
# so threads beyond a few add little: measured 1.5x with 2 threads on 2 cores.
DEFAULT_HISTOGRAM_THREADS = 4

Feeds = Mapping[str, np.ndarray]
BatchSource: TypeAlias = Callable[[], Iterable[Feeds]] | Iterable[Feeds]


@dataclass(frozen=True)
class CalibProgress:
    """Reported after every batch: the pass ("range" or "histogram"), batches and samples done so far,
    and the sample total where known (pass 2 knows it from pass 1)."""

    phase: str
    batches: int
    samples: int
    total_samples: int | None


ProgressFn = Callable[[CalibProgress], None]


class CollectedHistograms(Mapping[str, TensorHistogram]):
    """Histograms by tensor name (a read-only mapping), with what it took to collect them."""

    def __init__(
        self, histograms: dict[str, TensorHistogram], *, num_samples: int, num_batches: int,
        range_pass_s: float, histogram_pass_s: float,
    ) -> None:
        self._histograms = histograms
        self.num_samples = num_samples
        self.num_batches = num_batches
        self.range_pass_s = range_pass_s
        self.histogram_pass_s = histogram_pass_s

    def __getitem__(self, name: str) -> TensorHistogram:
        return self._histograms[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._histograms)

    def __len__(self) -> int:
        return len(self._histograms)

    @property
    def images_per_s(self) -> float:
        """Samples per second over both passes."""
        seconds = self.range_pass_s + self.histogram_pass_s
        return self.num_samples / seconds if seconds > 0 else float("inf")


def calibrate(
    model: ModelLike,
    batches: BatchSource,
    tensors: Sequence[str],
    config: CalibConfig | None = None,
    *,
    progress: ProgressFn | None = None,
    data_description: str | None = None,
) -> Calibration:
    """Thresholds T for `tensors` of `model` from the FP32 activations on `batches` (see module doc).

    The "max" method needs only the first pass, unless `config.keep_histograms` asks for histograms.
    """
    config = config if config is not None else CalibConfig()
    model = _load(model)
    keep = config.keep_histograms
    stream = _Stream(model, batches, tensors, config, progress, passes=1 if _max_only(config) else 2)
    ranges = stream.ranges()
    histograms = stream.histograms(ranges) if stream.passes == 2 else None
    start = time.perf_counter()
    if histograms is None:
        amax = {name: r.amax if r.amax > 0 else ZERO_AMAX for name, r in ranges.items()}
    else:
        amax = compute_thresholds(histograms, config)
    timings = CalibTimings(
        range_pass_s=ranges.seconds,
        histogram_pass_s=histograms.histogram_pass_s if histograms is not None else 0.0,
        threshold_s=time.perf_counter() - start,
        num_samples=ranges.num_samples,
    )
    log.info(
        "calibrated %d tensors (%s) on %d samples in %.2f s (%.1f samples/s)",
        len(amax), config.method, ranges.num_samples, timings.total_s, timings.images_per_s,
    )
    return Calibration(
        amax=amax,
        method=config.method,
        num_samples=ranges.num_samples,
        histograms=dict(histograms) if histograms is not None and keep is not False else None,
        channel_means={n: r.channel_mean for n, r in ranges.items() if r.channel_mean is not None},
        fingerprint=model_fingerprint(model),
        timings=timings,
        data_description=data_description,
    )


def collect_ranges(
    model: ModelLike,
    batches: BatchSource,
    tensors: Sequence[str],
    config: CalibConfig | None = None,
    *,
    progress: ProgressFn | None = None,
) -> CollectedRanges:
    """Pass 1 alone: max|x| and the value count of each of `tensors` (one pass; any iterable works)."""
    config = config if config is not None else CalibConfig()
    return _Stream(_load(model), batches, tensors, config, progress, passes=1).ranges()


def collect_histograms(
    model: ModelLike,
    batches: BatchSource,
    tensors: Sequence[str],
    config: CalibConfig | None = None,
    *,
    progress: ProgressFn | None = None,
) -> CollectedHistograms:
    """Histograms of |x| for each of `tensors`, streamed over `batches` in two passes."""
    config = config if config is not None else CalibConfig()
    stream = _Stream(_load(model), batches, tensors, config, progress, passes=2)
    return stream.histograms(stream.ranges())


class CollectedRanges(Mapping[str, TensorRange]):
    """Pass-1 results by tensor name, with the sample and batch counts and the pass's wall time."""

    def __init__(self, ranges: dict[str, TensorRange], *, num_samples: int, num_batches: int, seconds: float):
        self._ranges = ranges
        self.num_samples = num_samples
        self.num_batches = num_batches
        self.seconds = seconds

    def __getitem__(self, name: str) -> TensorRange:
        return self._ranges[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._ranges)

    def __len__(self) -> int:
        return len(self._ranges)


class _Stream:
    """One ONNX Runtime session over the model with the tensors exposed, and the passes over the data."""

    def __init__(
        self, model: onnx.ModelProto | gs.Graph, batches: BatchSource, tensors: Sequence[str],
        config: CalibConfig, progress: ProgressFn | None, *, passes: int,
    ) -> None:
        from trtopt.execution import OrtSession

        self.names = _unique_names(tensors)
        if passes > 1:
            _check_reiterable(batches)
        self.batches, self.config, self.progress, self.passes = batches, config, progress, passes
        self.session = OrtSession(model, expose=self.names, threads=config.threads)
        self.first_input = self.session.input_names[0] if self.session.input_names else None
        self.workers = config.histogram_threads or min(DEFAULT_HISTOGRAM_THREADS, os.cpu_count() or 1)

    def ranges(self) -> CollectedRanges:
        start = time.perf_counter()
        collectors = {name: RangeCollector(name) for name in self.names}
        num_batches, num_samples = self._run("range", lambda name, x: collectors[name].update(x), None)
        if num_batches == 0:
            raise CalibrationError(
                "The calibration data gave no batches.", fix="Point calibration at a non-empty set of inputs."
            )
        results = {name: c.result() for name, c in collectors.items()}
        return CollectedRanges(results, num_samples=num_samples, num_batches=num_batches,
                               seconds=time.perf_counter() - start)

    def histograms(self, ranges: CollectedRanges) -> CollectedHistograms:
        start = time.perf_counter()
        bins = self.config.num_bins
        counters = {name: HistogramCollector(name, ranges[name].amax, bins) for name in self.names}
        seen = self._run("histogram", lambda name, x: counters[name].update(x), ranges.num_samples)
        if seen != (ranges.num_batches, ranges.num_samples):
            raise CalibrationError(
                f"The calibration data gave {ranges.num_batches} batches ({ranges.num_samples} samples) on "
                f"the first pass and {seen[0]} ({seen[1]}) on the second.",
                fix="Calibration reads the data twice: the batch source must give the same samples twice.",
            )
        return CollectedHistograms(
            {name: counters[name].result() for name in self.names},
            num_samples=ranges.num_samples, num_batches=ranges.num_batches,
            range_pass_s=ranges.seconds, histogram_pass_s=time.perf_counter() - start,
        )

    def _run(
        self, phase: str, update: Callable[[str, np.ndarray], None], total: int | None
    ) -> tuple[int, int]:
        batch_count = sample_count = 0
        with ThreadPoolExecutor(self.workers, thread_name_prefix="trtopt-calib") as pool:
            for feeds in _open(self.batches):
                outputs = self.session.run(feeds, outputs=self.names)
                self._update_all(pool, update, outputs)
                del outputs  # release this batch's activations before the next batch runs
                batch_count += 1
                sample_count += _batch_size(feeds, self.first_input)
                if self.progress is not None:
                    self.progress(CalibProgress(phase, batch_count, sample_count, total))
        return batch_count, sample_count


    def _update_all(
        self, pool: ThreadPoolExecutor, update: Callable[[str, np.ndarray], None], outputs: dict[str, np.ndarray]
    ) -> None:
        """Feed each tensor to its collector, largest first, spread over the pool's threads; an error is
        raised for the first failing tensor in the caller's order (the one nearest the model input)."""
        by_size = sorted(self.names, key=lambda name: -outputs[name].size)
        futures = {name: pool.submit(update, name, outputs[name]) for name in by_size}
        for name in self.names:
            futures[name].result()


def _max_only(config: CalibConfig) -> bool:
    return config.method == "max" and not config.keep_histograms


def _check_reiterable(batches: BatchSource) -> None:
    if not callable(batches) and iter(batches) is batches:
        raise CalibrationError(
            f"The calibration batches are a one-shot iterator ({type(batches).__name__}), but calibration "
            "reads them twice (first the range of every tensor, then its histogram).",
            fix="Pass a list, a re-iterable dataset, or a function returning a fresh iterator, e.g. "
            "`lambda: load_dataset(...)`.",
        )


def _open(batches: BatchSource) -> Iterator[Feeds]:
    return iter(batches()) if callable(batches) else iter(batches)


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
