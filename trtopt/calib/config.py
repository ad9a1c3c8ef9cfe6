"""Calibration options: one typed, frozen config. Passing `None` for a field means "the default"."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from trtopt.errors import CalibrationError
from trtopt.registry import Registry

if TYPE_CHECKING:
    from trtopt.calib.histogram import TensorHistogram

# TensorRT's entropy calibrator: 2048 histogram bins of |x|, 128 quantised levels (DESIGN.md).
DEFAULT_METHOD = "auto"  # per tensor, the candidate that least disturbs its readers (trtopt.calib.auto)
DEFAULT_NUM_BINS = 2048
DEFAULT_NUM_LEVELS = 128
DEFAULT_PERCENTILE = 99.99
QMAX = 127  # the largest symmetric INT8 level: a threshold T gives the scale T / QMAX


@dataclass(frozen=True)
class CalibConfig:
    """How thresholds are found.

    - `method`: a name in `trtopt.calib.METHODS` ("entropy", "max", "percentile", "mse").
    - `num_bins`: histogram bins over [0, max|x|] (TensorRT: 2048; see `HistogramCollector` for how the
      range is rounded up so that one pass over the data gives exact counts).
    - `num_levels`: quantised levels the entropy search merges into (TensorRT: 128, i.e. 2**(8-1)).
    - `discard_zero_bin`: before the entropy search, give bin 0 the count of bin 1. TensorRT discards the
      first bin, "which typically contains a huge number of noise activations" (NVIDIA's MLPerf
      calibration notes, inference_results_v0.5); pytorch-quantization does it as `bins[0] = bins[1]`.
      Without it the exact zeros of a ReLU output dominate the KL and drive T far too low (2.1 sigma
      instead of 4.5 sigma on a ReLU'd Gaussian).
    - `percentile`: the share of |x| kept inside T by the "percentile" method, in percent.
    - `keep_histograms`: keep the per-tensor histograms in the result (for plots and re-thresholding;
      num_bins x 8 bytes a tensor: 16 KiB). `None`: keep them when the method needs them anyway, i.e.
      not for "max", which then keeps max|x| alone. `True` forces them, `False` drops them.
    - `threads`: ONNX Runtime intra-op threads (`None`: ONNX Runtime decides).
    - `histogram_threads`: threads that count the tensors of a batch in parallel while ONNX Runtime is
      idle (`None`: up to 4, no more than the CPUs).

    The calibration stage of a build or of `trtopt calibrate` (`trtopt.calib.stage.calibrate_graph`) also
    reads:

    - `bounded_max` (on; --no-bounded-max turns it off): tensors with a hard activation bound (ReLU6,
      Sigmoid outputs) keep their observed maximum as threshold (`trtopt.calib.ranges`);
    - `cache` (--calib-cache): take the thresholds from this trtopt, TensorRT or ONNX Runtime cache
      instead of measuring them;
    - `save_cache` (--save-cache): also write the measured thresholds to this trtopt cache.

    Any field given as `None` takes its default, so optional CLI values can be passed straight through.
    """

    method: str = DEFAULT_METHOD
    num_bins: int = DEFAULT_NUM_BINS
    num_levels: int = DEFAULT_NUM_LEVELS
    discard_zero_bin: bool = True
    percentile: float = DEFAULT_PERCENTILE
    keep_histograms: bool | None = None
    threads: int | None = None
    histogram_threads: int | None = None
    bounded_max: bool = True
    cache: Path | None = None
    save_cache: Path | None = None

    def __post_init__(self) -> None:
        for field in fields(self):
            if getattr(self, field.name) is None and field.default is not None:
                object.__setattr__(self, field.name, field.default)
        for name in ("cache", "save_cache"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        self._validate()

    def _validate(self) -> None:
        METHODS.get(self.method)  # an unknown name raises UnknownNameError listing the valid ones
        if self.num_levels < 2:
            raise CalibrationError(
                f"CalibConfig.num_levels is {self.num_levels}; it must be at least 2.",
                fix="Use the default, 128 (the positive INT8 levels TensorRT quantises into).",
            )
        if self.num_bins < self.num_levels:
            raise CalibrationError(
                f"CalibConfig.num_bins ({self.num_bins}) is smaller than num_levels ({self.num_levels}): the "
                "entropy search needs at least one histogram bin per quantised level.",
                fix=f"Use num_bins >= {self.num_levels} (TensorRT uses 2048).",
            )
        if not (math.isfinite(self.percentile) and 0.0 < self.percentile <= 100.0):
            raise CalibrationError(
                f"CalibConfig.percentile is {self.percentile}; it must be in (0, 100].",
                fix="Give the share of values to keep inside T in percent, e.g. 99.99.",
            )
        for name in ("threads", "histogram_threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise CalibrationError(f"CalibConfig.{name} is {value}.", fix="Use a positive thread count, or None.")


ThresholdFn = Callable[["TensorHistogram", CalibConfig], float]
# The calibration methods, by name: each registers itself where it is defined (`trtopt.calib.thresholds`,
# which the `trtopt.calib` package imports before any of its modules, so the registry is full whenever a config is
# made). It is declared here, with the config that names a method, so that arrows run from the methods to it.
METHODS: Registry[ThresholdFn] = Registry("calibration method")
