"""Streaming histograms of |x|, one per calibrated tensor: pure numpy, no model in sight.

Scheme: two passes, as TensorRT's histogram calibration needs a fixed range (DESIGN.md, "The entropy
(KL) threshold search"). Pass 1 (`RangeCollector`) streams every batch once and keeps only max|x|, the
value count and the mean of each channel (axis 1; bias correction needs it, `trtopt.quant.bias`).
Pass 2 (`HistogramCollector`) streams the same batches again and counts |x| into `num_bins` equal bins
over [0, amax], where amax is pass 1's global maximum.

Why the result does not depend on batch size or order: amax is a maximum (order-free, exact), the bin
of a value depends only on that value and amax, and the counts are integer sums. Batching changes
neither, so two runs over the same samples give bit-identical histograms - unlike a range fixed by the
first batch and grown later (ONNX Runtime, onnxruntime#9597; TensorRT itself, per NVIDIA's MLPerf v0.5
calibration notes), where bin edges depend on which batch came first. Memory is `num_bins` int64
counters per tensor (times LANES while collecting) plus per-thread scratch buffers of CHUNK values,
whatever the number of images. The price is reading the data twice.

Bin of a value x: ``min(trunc(|x| * s), num_bins - 1)`` with ``s = float32(num_bins / amax)``; a value
equal to amax lands in the last bin. The kernel works on CHUNK values at a time (cache-resident):
``trunc(x * s)`` with the sign kept (one multiply-and-cast, no |x| pass), a range check (values outside
[-amax, amax] mean the data changed between passes), then `np.add.at` into LANES interleaved signed
sub-histograms. `fold_signed_counts` folds the halves at the end: multiplication is sign-symmetric in
IEEE arithmetic and truncation rounds toward zero, so trunc(-x * s) = -trunc(x * s) and the fold is exact.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from trtopt.errors import CalibrationError

# Values per kernel step: large enough that the per-chunk Python overhead is negligible, small enough
# that the int64 scratch buffer (512 KiB) stays in a core's L2 cache.
CHUNK = 1 << 16
# Consecutive values go to LANES interleaved sub-histograms (summed at the end): runs of equal values
# (the zeros of a ReLU output) then do not serialise on one counter. Measured 1.4x faster than one lane.
LANES = 4
# np.add.at got a fast path in NumPy 1.25 (about 25% faster than bincount here); before, it is very slow.
_FAST_ADD_AT = np.lib.NumpyVersion(np.__version__) >= "1.25.0"
_local = threading.local()


@dataclass(frozen=True, eq=False)
class TensorRange:
    """Pass-1 statistics of one tensor: the histogram range, how many values were seen, and the mean of
    each channel along axis 1 (None for tensors of rank < 2)."""

    name: str
    amax: float
    count: int
    channel_mean: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class TensorHistogram:
    """Counts of |x| in `num_bins` equal bins over [0, amax] for one tensor.

    `counts[j]` holds the values with ``j * w <= |x| < (j + 1) * w``, w = amax / num_bins (the last bin
    also holds |x| = amax). `zeros` is how many values were exactly 0 (they are in bin 0 too); a ReLU
    output is often half zeros, which is worth seeing on a plot.
    """

    name: str
    counts: np.ndarray
    amax: float
    zeros: int = 0

    def __post_init__(self) -> None:
        counts = np.asarray(self.counts, dtype=np.int64)
        if counts.ndim != 1 or counts.size == 0:
            raise ValueError(f"histogram counts of {self.name!r} must be a non-empty 1-D array")
        if not (np.isfinite(self.amax) and self.amax >= 0.0):
            raise ValueError(f"histogram amax of {self.name!r} must be finite and >= 0, got {self.amax}")
        counts.flags.writeable = False
        object.__setattr__(self, "counts", counts)
        object.__setattr__(self, "amax", float(self.amax))

    @property
    def num_bins(self) -> int:
        return int(self.counts.size)

    @property
    def count(self) -> int:
        """Number of values histogrammed."""
        return int(self.counts.sum())

    @property
    def bin_width(self) -> float:
        return self.amax / self.num_bins

    @property
    def edges(self) -> np.ndarray:
        """The num_bins + 1 bin edges, from 0 to amax."""
        return np.arange(self.num_bins + 1, dtype=np.float64) * self.amax / self.num_bins

    def upper_edge(self, bins: int | np.ndarray) -> float | np.ndarray:
        """Upper edge of the first `bins` bins, ``bins * amax / num_bins`` (exact at bins = num_bins)."""
        return np.asarray(bins, dtype=np.float64) * self.amax / self.num_bins


class RangeCollector:
    """Pass 1 for one tensor: max|x|, the value count and the per-channel sums, batch by batch.

    Channels are axis 1 (NCHW activations, [batch, features] for Gemm). Each row's sum over its
    contiguous trailing axes runs in float32 with NumPy's pairwise summation; the rows are then added
    in float64, so the mean does not drift with the number of batches.

    Non-finite values stop calibration with a `CalibrationError` naming the tensor and the batch: a NaN
    or Inf activation means the model or its input is broken, and any threshold built on it is noise.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.amax = 0.0
        self.count = 0
        self.batches = 0
        self._channel_sum: np.ndarray | None = None

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
        if values.ndim >= 2:
            self._add_channel_sums(values)

    def _add_channel_sums(self, values: np.ndarray) -> None:
        rows = np.ascontiguousarray(values).reshape(values.shape[0], values.shape[1], -1)
        sums = rows.sum(axis=2).sum(axis=0, dtype=np.float64)
        if self._channel_sum is None:
            self._channel_sum = sums
        elif self._channel_sum.shape == sums.shape:
            self._channel_sum += sums
        else:
            raise CalibrationError(
                f"Tensor {self.name!r} has {sums.size} channels (axis 1) in calibration batch {self.batches} "
                f"and {self._channel_sum.size} in the batches before.",
                fix="Calibrate with inputs of one shape (only the batch dimension may vary).",
            )

    def result(self) -> TensorRange:
        mean = None
        if self._channel_sum is not None:
            mean = self._channel_sum / (self.count / self._channel_sum.size)
        return TensorRange(name=self.name, amax=self.amax, count=self.count, channel_mean=mean)


class HistogramCollector:
    """Pass 2 for one tensor: counts of |x| over the fixed range [0, amax] found by pass 1."""

    def __init__(self, name: str, amax: float, num_bins: int = 2048) -> None:
        if num_bins < 1:
            raise ValueError(f"num_bins must be positive, got {num_bins}")
        self.name = name
        self.amax = float(amax)
        self.num_bins = num_bins
        # s = num_bins / amax, rounded once to float32 so float32 activations are binned in float32.
        self.scale = np.float32(num_bins / self.amax) if self.amax > 0 else np.float32(0.0)
        self._signed = np.zeros(LANES * (2 * num_bins + 1), dtype=np.int64)
        self._zeros = 0

    def update(self, values: np.ndarray) -> None:
        _check_float(self.name, values)
        flat = values.reshape(-1)
        for start in range(0, flat.size, CHUNK):
            self._count_chunk(flat[start : start + CHUNK])

    def _count_chunk(self, chunk: np.ndarray) -> None:
        nb = self.num_bins
        index, is_zero = _scratch(chunk.size)
        with np.errstate(invalid="ignore"):  # NaN -> int gives INT_MIN on x86, caught just below
            np.multiply(chunk, self.scale, out=index, casting="unsafe")  # trunc(x * s), sign kept
        if index.min() < -nb or index.max() > nb:
            raise self._outside_range_error()
        index += _lane_offsets(nb)[: chunk.size]
        _count_into(self._signed, index)
        np.equal(chunk, 0, out=is_zero)  # twice as fast as count_nonzero on floats; -0.0 counts too
        self._zeros += int(np.count_nonzero(is_zero))

    def result(self) -> TensorHistogram:
        signed = self._signed.reshape(LANES, -1).sum(axis=0)
        counts = fold_signed_counts(signed)
        return TensorHistogram(name=self.name, counts=counts, amax=self.amax, zeros=self._zeros)

    def _outside_range_error(self) -> CalibrationError:
        return CalibrationError(
            f"Tensor {self.name!r} has values outside [-{self.amax:g}, {self.amax:g}], the range the first "
            "calibration pass found (or NaN): the batches changed between the two passes.",
            fix="Make the batch source deterministic: the same samples, in any order, on every pass "
            "(no random augmentation; a fixed seed for synthetic data).",
        )


def fold_signed_counts(signed: np.ndarray) -> np.ndarray:
    """Counts of trunc(x * s) + nb, for nb = (len - 1) / 2, folded into counts of |x| bins 0..nb-1."""
    nb = (signed.size - 1) // 2
    counts = signed[nb : 2 * nb].copy()  # k = 0 .. nb-1 from x >= 0
    counts[1:] += signed[nb - 1 : 0 : -1]  # k = 1 .. nb-1 from x < 0 (k = 0 holds both signs already)
    counts[-1] += signed[2 * nb] + signed[0]  # |x| * s == nb, i.e. |x| == amax: the last bin
    return counts


def histogram_from_values(values: np.ndarray, num_bins: int = 2048, *, name: str = "") -> TensorHistogram:
    """Both passes over one in-memory array (tests, weights, small tensors)."""
    ranges = RangeCollector(name)
    ranges.update(values)
    collector = HistogramCollector(name, ranges.result().amax, num_bins)
    collector.update(values)
    return collector.result()


def _scratch(size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-thread scratch buffers shared by all collectors, so memory does not grow with tensors."""
    if not hasattr(_local, "index"):
        _local.index = np.empty(CHUNK, dtype=np.intp)
        _local.is_zero = np.empty(CHUNK, dtype=bool)
    return _local.index[:size], _local.is_zero[:size]


@lru_cache(maxsize=8)
def _lane_offsets(num_bins: int) -> np.ndarray:
    """Offset of each chunk position: num_bins (so trunc(x * s) >= 0) plus its lane's start."""
    offsets = (num_bins + (np.arange(CHUNK) % LANES) * (2 * num_bins + 1)).astype(np.intp)
    offsets.flags.writeable = False
    return offsets


def _count_into(counts: np.ndarray, index: np.ndarray) -> None:
    if _FAST_ADD_AT:
        np.add.at(counts, index, 1)
    else:
        counts += np.bincount(index, minlength=counts.size)


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
