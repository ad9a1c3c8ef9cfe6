"""Streaming histograms of |x|, one per calibrated tensor: pure numpy (and one compiled loop), no model.

TensorRT's entropy calibration wants a histogram of |x| with 2048 bins over [0, max|x|] whose range
does not depend on the order of the batches (DESIGN.md, "The entropy (KL) threshold search"). A range
fixed by the first batch and grown later gives bin edges that depend on which batch came first (ONNX
Runtime, onnxruntime#9597; TensorRT itself, per NVIDIA's MLPerf v0.5 calibration notes); a first pass
for max|x| costs a second run of the model over the data.

trtopt reads the data once. `HistogramCollector` counts every value into a fine grid (16 bins per
histogram bin) whose range grows by powers of two with exact re-binning (`trtopt.calib.kernels`), so
the grid is bit-identical whatever the batch size and order. `result()` sums runs of consecutive grid
bins into the 2048 histogram bins: the counts are exact, and the range `top` is max|x| rounded up to
a whole run (at most about 12% above max|x|). Thresholds never exceed max|x| (`trtopt.calib.thresholds`).

`RangeCollector` keeps max|x| alone, for the "max" method. Both also keep each tensor's mean per channel
(axis 1), which bias correction needs (`trtopt.quant.bias`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from trtopt.calib import kernels
from trtopt.errors import CalibrationError

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class TensorRange:
    """Max-pass statistics of one tensor: max|x|, how many values were seen, and the mean of each channel
    along axis 1 (None for tensors of rank < 2)."""

    name: str
    amax: float
    count: int
    channel_mean: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class TensorHistogram:
    """Counts of |x| in `num_bins` equal bins over [0, top] for one tensor.

    `counts[j]` holds the values with ``j * w <= |x| < (j + 1) * w``, w = top / num_bins. `amax` is the
    exact max|x| (<= top; `top` defaults to it). `zeros` is how many values were exactly 0 (they are in
    bin 0 too); a ReLU output is often half zeros, which is worth seeing on a plot.
    """

    name: str
    counts: np.ndarray
    amax: float
    zeros: int = 0
    top: float | None = None
    channel_mean: np.ndarray | None = None  # mean of each channel (axis 1), as in `TensorRange`

    def __post_init__(self) -> None:
        counts = np.asarray(self.counts, dtype=np.int64)
        if counts.ndim != 1 or counts.size == 0:
            raise ValueError(f"histogram counts of {self.name!r} must be a non-empty 1-D array")
        if not (np.isfinite(self.amax) and self.amax >= 0.0):
            raise ValueError(f"histogram amax of {self.name!r} must be finite and >= 0, got {self.amax}")
        top = float(self.amax) if self.top is None else float(self.top)
        if not (np.isfinite(top) and top >= self.amax):
            raise ValueError(f"histogram top of {self.name!r} must be finite and >= amax {self.amax}, got {top}")
        counts.flags.writeable = False
        object.__setattr__(self, "counts", counts)
        object.__setattr__(self, "amax", float(self.amax))
        object.__setattr__(self, "top", top)

    @property
    def num_bins(self) -> int:
        return int(self.counts.size)

    @property
    def count(self) -> int:
        """Number of values histogrammed."""
        return int(self.counts.sum())

    @property
    def used_bins(self) -> int:
        """Bins up to the one holding max|x|: the candidates a threshold search should consider (the bins
        beyond it, up to `top`, are empty and would only offer "no clipping" again)."""
        if self.amax == 0.0:
            return self.num_bins
        return min(self.num_bins, int(self.amax / self.bin_width) + 1)

    @property
    def _top(self) -> float:
        return float(self.top if self.top is not None else self.amax)  # a float after __post_init__

    @property
    def bin_width(self) -> float:
        return self._top / self.num_bins

    @property
    def edges(self) -> np.ndarray:
        """The num_bins + 1 bin edges, from 0 to top."""
        return np.arange(self.num_bins + 1, dtype=np.float64) * self._top / self.num_bins

    def upper_edge(self, bins: int | np.ndarray) -> float | np.ndarray:
        """Upper edge of the first `bins` bins, ``bins * top / num_bins`` (exact at bins = num_bins)."""
        return np.asarray(bins, dtype=np.float64) * self._top / self.num_bins


class ChannelSums:
    """The sum of each channel (axis 1: NCHW activations, [batch, features] for Gemm) over all batches,
    in float64 so the mean does not drift with the number of batches. Tensors of rank < 2 have none, nor
    have tensors whose axis 1 changes size between batches: it is no channel axis but the batch's, as in
    sequence-first attention ([tokens, batch, ...]: torch's MultiheadAttention in a torchvision ViT), whose
    last, smaller batch used to stop calibration (bias correction reads conv and Gemm inputs' means only).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.sums: np.ndarray | None = None
        self.varies = False

    def buffer(self, values: np.ndarray, batch: int) -> np.ndarray | None:
        """The float64 sums to add this batch's channels to (None for rank < 2 and once axis 1 has varied)."""
        if values.ndim < 2 or self.varies:
            return None
        channels = values.shape[1]
        if self.sums is None:
            self.sums = np.zeros(channels, dtype=np.float64)
        elif self.sums.size != channels:
            log.debug("tensor %r: axis 1 has %d entries in calibration batch %d and %d before: no channel means",
                      self.name, channels, batch, self.sums.size)  # fmt: skip
            self.sums, self.varies = None, True
            return None
        return self.sums

    def add(self, values: np.ndarray, batch: int) -> None:
        """Add with numpy: each row's sum in float32 (pairwise, SIMD, GIL released), rows in float64."""
        sums = self.buffer(values, batch)
        if sums is not None:
            sums += kernels.as_rows(values).sum(axis=2).sum(axis=0, dtype=np.float64)

    def mean(self, count: int) -> np.ndarray | None:
        """Per-channel means, given the number of values added in all."""
        if self.sums is None or count == 0:
            return None
        return self.sums / (count / self.sums.size)


class RangeCollector:
    """max|x|, the value count and the channel means of one tensor, batch by batch: what the "max"
    method needs.

    Non-finite values stop calibration with a `CalibrationError` naming the tensor and the batch: a NaN
    or Inf activation means the model or its input is broken, and any threshold built on it is noise.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.amax = 0.0
        self.count = 0
        self.batches = 0
        self.channels = ChannelSums(name)

    def update(self, values: np.ndarray) -> None:
        _check_float(self.name, values)
        self.batches += 1
        if values.size == 0:
            return
        # Two SIMD reductions, no temporary; both propagate NaN, and Inf shows as an infinite amax.
        amax = max(float(values.max()), -float(values.min()))
        if not np.isfinite(amax):
            raise _nonfinite_error(self.name, values, self.batches)
        self.amax = max(self.amax, amax)
        self.count += int(values.size)
        self.channels.add(values, self.batches)

    def result(self) -> TensorRange:
        mean = self.channels.mean(self.count)
        return TensorRange(name=self.name, amax=self.amax, count=self.count, channel_mean=mean)


class HistogramCollector:
    """Streaming |x| statistics of one tensor in one pass: an exact fine grid (see `trtopt.calib.kernels`),
    max|x|, the exact zeros and the value count; `result()` turns them into a `TensorHistogram`.

    The grid has ``2**F = 16 * num_bins`` bins (rounded up to a power of two) over [0, 2**E), E the
    smallest exponent with max|x| < 2**E. `result()` sums runs of k consecutive grid bins into each of
    the `num_bins` bins, with k the smallest run that covers max|x|: the histogram's range `top` is max|x|
    rounded up to k grid bins, between max|x| and about 1.125 max|x| (1.06 on average), and every count
    is exact. Memory: ``2**F`` int64 counters (256 KiB at 2048 bins) whatever the number of batches.
    Non-finite values stop calibration with a `CalibrationError` naming the tensor and the batch.
    """

    def __init__(self, name: str, num_bins: int = 2048) -> None:
        if num_bins < 1:
            raise ValueError(f"num_bins must be positive, got {num_bins}")
        self.name = name
        self.num_bins = num_bins
        self.grid = np.zeros(grid_size(num_bins), dtype=np.int64)
        self.state = kernels.new_state()
        self.count = 0
        self.batches = 0
        self.channels = ChannelSums(name)

    def update(self, values: np.ndarray) -> None:
        _check_float(self.name, values)
        self.batches += 1
        sums = self.channels.buffer(values, self.batches)
        rows = kernels.as_rows(values)
        sums = sums if sums is not None else np.zeros(rows.shape[1])  # no channel means: summed and never read
        kernels.count_abs(rows, self.grid, self.state, sums)
        if self.state[kernels.NONFINITE]:
            raise _nonfinite_error(self.name, values, self.batches)
        self.count += int(values.size)

    def result(self) -> TensorHistogram:
        amax = float(self.state[kernels.AMAX])
        zeros = int(self.state[kernels.ZEROS])
        mean = self.channels.mean(self.count)
        if amax == 0.0:
            counts = np.zeros(self.num_bins, dtype=np.int64)
            counts[0] = self.count
            return TensorHistogram(name=self.name, counts=counts, amax=0.0, zeros=zeros, channel_mean=mean)
        fine_width = math.ldexp(1.0, int(self.state[kernels.EXPONENT])) / self.grid.size
        used = int(amax / fine_width) + 1  # grid bins up to the one holding max|x|
        run = -(-used // self.num_bins)
        padded = np.zeros(self.num_bins * run, dtype=np.int64)
        padded[: min(used, padded.size)] = self.grid[:used]
        counts = padded.reshape(self.num_bins, run).sum(axis=1)
        return TensorHistogram(
            name=self.name, counts=counts, amax=amax, zeros=zeros, top=self.num_bins * run * fine_width,
            channel_mean=mean,
        )


def grid_size(num_bins: int) -> int:
    """Bins of the fine grid for `num_bins` histogram bins: 16 per bin, rounded up to a power of two."""
    return 1 << (16 * num_bins - 1).bit_length()


def histogram_from_values(values: np.ndarray, num_bins: int = 2048, *, name: str = "") -> TensorHistogram:
    """The histogram of one in-memory array (tests, weights, small tensors)."""
    collector = HistogramCollector(name, num_bins)
    collector.update(np.asarray(values))
    return collector.result()


def _check_float(name: str, values: np.ndarray) -> None:
    if not np.issubdtype(values.dtype, np.floating):
        raise CalibrationError(
            f"Tensor {name!r} has dtype {values.dtype}; only floating-point tensors get INT8 thresholds.",
            fix="Leave integer and boolean tensors (shapes, indices, masks) out of the calibrated list.",
        )


def _nonfinite_error(name: str, values: np.ndarray, batch: int) -> CalibrationError:
    nan = int(np.count_nonzero(np.isnan(values)))
    inf = int(np.count_nonzero(np.isinf(values)))
    return CalibrationError(
        f"Tensor {name!r} has {nan} NaN and {inf} infinite values (of {values.size}) in calibration batch "
        f"{batch}. A non-finite activation means the model or its input is broken; thresholds computed "
        "from it would be meaningless.",
        fix="Check that the inputs are preprocessed as the model expects (dtype, scale, mean/std), and run "
        "the FP32 model on that batch to find the first tensor that turns non-finite.",
    )
