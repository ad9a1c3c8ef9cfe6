"""Saturation thresholds T from histograms of |x|: vectorised over every candidate (numpy; MSE, a compiled loop).

Each method in `METHODS` maps a `TensorHistogram` and the `CalibConfig` to T; the INT8 scale is T / 127.
`threshold()` is the one entry point: it handles the cases every method shares (no data, all zeros).

The entropy method is TensorRT's KL search (Migacz, "8-bit Inference with TensorRT", GTC 2017, and
NVIDIA's histogram calibrator in TensorRT/tools/pytorch-quantization). For each candidate i = L .. B
(L = 128 levels, B = 2048 bins):

- P: the first i bins, with the mass of bins i .. B-1 (the clipped tail) added to bin i-1;
- Q: the first i bins *before* the tail is added, merged into L groups (bin j goes to group
  floor(j * L / i), as pytorch-quantization's linspace/digitize does), each group's mass spread evenly
  over the group's bins that are non-empty in P; bins empty in P stay empty;
- KL(P || Q) after normalising both; a P bin whose Q is 0 makes the divergence infinite;
- the smallest KL wins (ties: the largest i, as pytorch-quantization's "last argmin"), T = i * B-bin width
  (at most max|x|: trtopt's histogram range can end slightly above it, see `threshold()`).

Q is built from the un-clipped bins, as in the GTC pseudo-code, MXNet, pytorch-quantization and ONNX
Runtime: the clipped tail then shows up as a spike in P that Q does not have, which is what penalises
clipping too much. Before the search, bin 0 takes bin 1's count (`CalibConfig.discard_zero_bin`): TensorRT
discards the first bin (NVIDIA's MLPerf calibration notes), pytorch-quantization sets bins[0] = bins[1].

Consequences worth knowing: T is never below top * L / B (about amax / 16); and a candidate whose last kept
bin is empty while the tail is not has an infinite KL, so outliers more than 16x beyond the bulk cannot
be clipped into it - T then stops at an outlier (tests/test_calib_thresholds.py shows both).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

import numpy as np

from trtopt.calib.config import METHODS, QMAX, CalibConfig
from trtopt.calib.histogram import TensorHistogram
from trtopt.errors import CalibrationError

# The threshold of a tensor that was exactly zero on every calibration sample. Any positive scale
# represents it exactly; this one (scale 2**-14, the smallest normal float16) survives FP16 and FP32
# engines alike and never divides by zero.
ZERO_AMAX = QMAX * 2.0**-14
# The smallest threshold a backend whose scales are float32 (CPU, OpenVINO) gives a tensor that is not all zero:
# scale 2**-100. A product with any weight scale (at least 2**-14 / 127, `weight_scales`), the int32 bias's scale,
# stays a normal float32 (above 2**-126). ZERO_AMAX, float16's floor, is for engines that may hold scales in FP16
# (TensorRT); on FP32 backends it put every tensor whose range lay below ~0.008 on a coarser grid than its own, and
# a tensor below ~6e-5 entirely on zero (MobileNetV3 with random weights: logits ~1e-9, the plan's outputs all 0).
FP32_AMAX = QMAX * 2.0**-100
# KL values closer than this (in nats) count as equal: the vectorised search's rounding error is about
# 1e-12 (float64 prefix sums over 2048 bins), far below any difference that matters.
KL_TIE = 1e-9



def threshold(hist: TensorHistogram, config: CalibConfig | None = None) -> float:
    """The threshold T of `hist` under `config.method` (default: entropy)."""
    config = config if config is not None else CalibConfig()
    if hist.count == 0:
        raise CalibrationError(
            f"Tensor {hist.name!r} has no values to calibrate (an empty tensor on every batch).",
            fix="Leave it out of the calibrated tensors, or check the calibration batches.",
        )
    if hist.amax == 0.0:
        return ZERO_AMAX
    # A threshold beyond max|x| clips nothing more and only widens the INT8 step. The histogram's range
    # may end above max|x| (`HistogramCollector` rounds it up to whole grid runs); T stops at max|x|.
    return min(float(METHODS.get(config.method)(hist, config)), hist.amax)


def compute_thresholds(
    histograms: Mapping[str, TensorHistogram],
    config: CalibConfig | None = None,
    *,
    map_fn: Callable[..., Iterable[float]] = map,
) -> dict[str, float]:
    """`threshold()` for every histogram, by tensor name. `map_fn` may be a thread pool's `map`: the
    searches are large numpy operations that release the GIL."""
    names = list(histograms)
    found = map_fn(threshold, [histograms[name] for name in names], [config] * len(names))
    return dict(zip(names, found, strict=True))


# --- entropy --------------------------------------------------------------------------------------


def kl_divergences(counts: np.ndarray, num_levels: int = 128) -> np.ndarray:
    """KL(P_i || Q_i) for every candidate i = num_levels .. len(counts), all at once.

    With N values in all, C_i the mass of the first i bins, G/M a group's mass and its count of bins
    non-empty in P, and PG the group's P mass (G, plus the tail for the last group)::

        KL_i = (sum_j P_j log P_j  -  sum_g PG_g log(G_g / M_g)) / N  -  log N  +  log C_i

    Every term comes from prefix sums over the bins, indexed at each candidate's group boundaries
    ceil(g * i / L): O(candidates x levels) work, no loop over candidates.
    """
    h = np.asarray(counts, dtype=np.int64)
    num_bins = h.size
    if num_bins < num_levels:
        raise ValueError(f"need at least num_levels={num_levels} bins, got {num_bins}")
    mass = np.concatenate(([0], np.cumsum(h)))  # mass[k] = sum of bins < k
    nonempty = np.concatenate(([0], np.cumsum(h > 0)))
    hf = h.astype(np.float64)
    plogp = np.concatenate(([0.0], np.cumsum(_xlogx(hf))))
    total = float(mass[-1])

    i = np.arange(num_levels, num_bins + 1)
    tail = mass[-1] - mass[i]  # mass beyond bin i-1: clipped into it
    last = hf[i - 1] + tail  # P's last bin
    p_log_p = plogp[i - 1] + _xlogx(last)

    edges = (np.arange(num_levels + 1)[None, :] * i[:, None] + num_levels - 1) // num_levels
    group_mass = (mass[edges[:, 1:]] - mass[edges[:, :-1]]).astype(np.float64)
    group_bins = nonempty[edges[:, 1:]] - nonempty[edges[:, :-1]]
    group_bins[:, -1] += (h[i - 1] == 0) & (tail > 0)  # bin i-1 is non-empty in P thanks to the tail
    p_mass = group_mass.copy()
    p_mass[:, -1] += tail
    with np.errstate(divide="ignore", invalid="ignore"):
        log_q = np.log(group_mass) - np.log(group_bins)
        p_log_q = np.where(p_mass > 0, p_mass * log_q, 0.0).sum(axis=1)  # -inf where P > 0 = Q
        kl = (p_log_p - p_log_q) / total - np.log(total) + np.log(mass[i].astype(np.float64))
    kl[~np.isfinite(kl)] = np.inf
    return kl


def entropy_bins(counts: np.ndarray, num_levels: int = 128, *, discard_zero_bin: bool = True) -> int:
    """The number of bins i whose upper edge is TensorRT's entropy threshold (see `CalibConfig`)."""
    if discard_zero_bin and counts.size > 1:
        counts = np.concatenate((counts[1:2], counts[1:]))
    kl = kl_divergences(counts, num_levels)
    best = np.flatnonzero(kl <= kl.min() + KL_TIE)[-1]
    return int(best) + num_levels


@METHODS.register("entropy")
def entropy_threshold(hist: TensorHistogram, config: CalibConfig) -> float:
    """TensorRT's entropy calibration (IInt8EntropyCalibrator2's threshold search)."""
    counts = hist.counts[: max(hist.used_bins, config.num_levels)]
    bins = entropy_bins(counts, config.num_levels, discard_zero_bin=config.discard_zero_bin)
    return float(hist.upper_edge(bins))


# --- the other methods ----------------------------------------------------------------------------


@METHODS.register("max")
def max_threshold(hist: TensorHistogram, config: CalibConfig) -> float:
    """Non-saturating: T = max|x| (TensorRT's MinMaxCalibrator, symmetric)."""
    return hist.amax


@METHODS.register("percentile")
def percentile_threshold(hist: TensorHistogram, config: CalibConfig) -> float:
    """The smallest bin upper edge with at least `config.percentile` % of |x| at or below it.

    pytorch-quantization and ONNX Runtime return the *lower* edge of that bin, which can leave less than
    the asked share inside T; the upper edge keeps the promise. 100 % gives amax.
    """
    target = int(np.ceil(config.percentile / 100.0 * hist.count))
    index = int(np.searchsorted(np.cumsum(hist.counts), max(target, 1)))
    return float(hist.upper_edge(min(index + 1, hist.num_bins)))


@METHODS.register("mse")
def mse_threshold(hist: TensorHistogram, config: CalibConfig) -> float:
    """T minimising the squared error of INT8 fake-quantisation over the histogram, clipping included.

    As pytorch-quantization's `_compute_amax_mse`: every bin stands at its centre c; candidate T = the
    centre of bin i for i = num_levels .. B-1; error = sum counts * (c - q(c))^2 with the fake-quantised
    q(c) = clip(rint(c * 127 / T), -127, 127) * T / 127.
    The errors of every candidate come from one compiled loop (`trtopt.calib.auto_kernels.mse_errors`: `auto`
    runs this search for every tensor, and numpy's passes over candidates x bins were a tenth of its cost).
    """
    from trtopt.calib.auto_kernels import mse_errors

    centres = (np.arange(hist.num_bins) + 0.5) * hist.bin_width
    weights = hist.counts.astype(np.float64)
    used = weights > 0
    candidates = (np.arange(config.num_levels, hist.used_bins) + 0.5) * hist.bin_width
    if candidates.size == 0:
        return hist.amax
    errors = mse_errors(centres[used], weights[used], candidates)
    return float(candidates[int(np.argmin(errors))])


# --- auto ----------------------------------------------------------------------------------------

# The methods `auto` chooses between, in the order that wins a tie (equal scores: the first one).
AUTO_CANDIDATES = ("entropy", "mse", "percentile", "max")


def candidate_thresholds(hist: TensorHistogram, config: CalibConfig) -> dict[str, float]:
    """The threshold of every `AUTO_CANDIDATES` method on `hist` (what `--method auto` scores)."""
    return {method: threshold(hist, replace(config, method=method)) for method in AUTO_CANDIDATES}


@METHODS.register("auto")
def auto_threshold(hist: TensorHistogram, config: CalibConfig) -> float:
    """`auto` seen from a histogram alone: the MSE threshold.

    `--method auto` proper scores every candidate by the error it causes in the layers that read the tensor,
    on held-back samples (`trtopt.calib.auto`); that needs the model and data. Without them (a histogram
    re-thresholded by itself) the tensor's own squared error is all there is to go by, which is `mse`.
    """
    return mse_threshold(hist, config)


# --- weights ----------------------------------------------------------------------------------------


def weight_scales(weights: np.ndarray, axis: int = 0, *, name: str = "") -> np.ndarray:
    """Per-channel INT8 scales max|w| / 127 along `axis` (the output channels: 0 for Conv, 1 for
    ConvTranspose), as float32, TensorRT's explicit quantisation of weights.

    A channel whose max|w| is below `ZERO_AMAX` (all zeros, or nearly) gets ZERO_AMAX's scale, 2**-14,
    float16's smallest normal number, so the scale is positive and survives FP16 graphs too.
    """
    w = np.asarray(weights)
    if w.ndim == 0:
        raise ValueError("weight_scales needs an array with at least one axis")
    if not np.all(np.isfinite(w)):
        raise CalibrationError(
            f"Weight {name or '<unnamed>'!r} has non-finite values: the model file is broken.",
            fix="Re-export the model and check it with onnx.checker and an FP32 run.",
        )
    axis = axis % w.ndim
    reduce = tuple(a for a in range(w.ndim) if a != axis)
    amax = np.abs(w).max(axis=reduce) if reduce else np.abs(w)
    return (np.maximum(amax, ZERO_AMAX) / QMAX).astype(np.float32)


def _xlogx(x: np.ndarray) -> np.ndarray:
    """x log x with 0 log 0 = 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x > 0, x * np.log(x), 0.0)
