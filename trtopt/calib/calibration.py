"""The result of calibration: a threshold T per tensor, and where it came from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from trtopt.calib.equalization import EqualizationRecord
from trtopt.calib.histogram import TensorHistogram
from trtopt.calib.thresholds import QMAX


@dataclass(frozen=True)
class CalibTimings:
    """Wall time of each stage, in seconds, and the end-to-end throughput."""

    collect_s: float  # the pass over the data: session set-up, inference, counting
    threshold_s: float
    num_samples: int

    @property
    def total_s(self) -> float:
        return self.collect_s + self.threshold_s

    @property
    def images_per_s(self) -> float:
        """Samples calibrated per second, the threshold search included."""
        return self.num_samples / self.total_s if self.total_s > 0 else float("inf")


@dataclass(frozen=True, eq=False)
class Calibration:
    """Saturation thresholds T (amax) per tensor; the INT8 scale of a tensor is T / 127.

    Computed by `calibrate()` or read by `load_cache()`. Fields a source does not record are `None`:
    a TensorRT cache has no fingerprint, sample count, histograms or channel means.
    `channel_means` holds each tensor's FP32 mean per channel (axis 1), for bias correction
    (`trtopt.quant.bias`). `choices` says, per tensor, which method gave its threshold where that varies
    (`method == "auto"`); caches written before `auto` existed have none.
    """

    amax: Mapping[str, float]
    method: str
    num_samples: int | None = None
    histograms: Mapping[str, TensorHistogram] | None = None
    channel_means: Mapping[str, np.ndarray] | None = None
    fingerprint: str | None = None
    timings: CalibTimings | None = None
    data_description: str | None = None
    source: str | None = field(default=None, compare=False)
    choices: Mapping[str, str] | None = None  # tensor -> the method whose threshold it has (`--method auto`)
    # what activation equalisation did before calibrating (trtopt.calib.equalization); None: not recorded
    equalization: EqualizationRecord | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "amax", {str(k): float(v) for k, v in self.amax.items()})
        if self.channel_means is not None:
            means = {str(k): np.asarray(v, dtype=np.float64) for k, v in self.channel_means.items()}
            for values in means.values():
                values.flags.writeable = False
            object.__setattr__(self, "channel_means", means)
        if self.choices is not None:
            object.__setattr__(self, "choices", {str(k): str(v) for k, v in self.choices.items()})

    def method_counts(self) -> dict[str, int]:
        """How many tensors took their threshold from each method (all from `method` without `choices`)."""
        if not self.choices:
            return {self.method: len(self.amax)}
        counts: dict[str, int] = {}
        for method in self.choices.values():
            counts[method] = counts.get(method, 0) + 1
        return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))

    @property
    def ranges(self) -> dict[str, float]:
        """max|x| per tensor where the histograms are kept, else the threshold T."""
        histograms = self.histograms or {}
        return {name: float(histograms[name].amax) if name in histograms else t for name, t in self.amax.items()}

    @property
    def scales(self) -> dict[str, float]:
        """INT8 scale T / 127 per tensor (symmetric, zero point 0)."""
        return {name: t / QMAX for name, t in self.amax.items()}

    @property
    def tensors(self) -> list[str]:
        return list(self.amax)
