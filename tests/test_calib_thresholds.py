"""Threshold methods: the vectorised KL search against a plain loop, and the expected T on known shapes."""

from __future__ import annotations

import numpy as np
import pytest

from trtopt.calib import (
    METHODS,
    ZERO_AMAX,
    CalibConfig,
    TensorHistogram,
    entropy_bins,
    histogram_from_values,
    kl_divergences,
    threshold,
)
from trtopt.calib.thresholds import KL_TIE, QMAX, weight_scales
from trtopt.errors import CalibrationError, UnknownNameError


def _entropy_reference(counts: np.ndarray, num_levels: int = 128) -> np.ndarray:
    """KL(P_i || Q_i) for i = num_levels .. len(counts), one candidate and one group at a time."""
    h = np.asarray(counts, dtype=np.float64)
    divergences = []
    for i in range(num_levels, h.size + 1):
        p = h[:i].copy()
        p[i - 1] += h[i:].sum()  # the clipped tail goes into the last kept bin
        group_of = (np.arange(i) * num_levels) // i  # bin j -> group floor(j * L / i)
        group_mass = np.bincount(group_of, weights=h[:i], minlength=num_levels)  # Q from the un-clipped bins
        group_nonempty = np.bincount(group_of, weights=p > 0, minlength=num_levels)
        with np.errstate(invalid="ignore", divide="ignore"):
            q = np.where(p > 0, group_mass[group_of] / group_nonempty[group_of], 0.0)  # empty bins stay empty
        if p.sum() == 0 or q.sum() == 0:
            divergences.append(np.inf)
            continue
        p, q = p / p.sum(), q / q.sum()
        keep = p > 0
        kl = np.inf if np.any(q[keep] == 0) else float(np.sum(p[keep] * np.log(p[keep] / q[keep])))
        divergences.append(kl)
    return np.array(divergences)


def _reference_bins(counts: np.ndarray, num_levels: int) -> int:
    kl = _entropy_reference(counts, num_levels)
    return int(np.flatnonzero(kl <= kl.min() + KL_TIE)[-1]) + num_levels


def _random_histogram(rng: np.random.Generator, kind: int, num_bins: int) -> np.ndarray:
    if kind == 0:  # dense noise
        return rng.integers(0, 100, num_bins)
    if kind == 1:  # sparse: most bins empty
        return (rng.random(num_bins) < 0.15) * rng.integers(1, 1000, num_bins)
    if kind == 2:  # half-normal with a ReLU-like zero spike and an empty-bin tail
        x = np.abs(rng.standard_normal(int(rng.integers(500, 20_000)))) * rng.uniform(0.1, 1)
        counts = np.bincount(np.minimum((x * num_bins / max(x.max(), 1e-9)).astype(int), num_bins - 1),
                             minlength=num_bins)
        counts[0] += int(rng.integers(0, 5000))
        return counts
    if kind == 3:  # a few spikes
        counts = np.zeros(num_bins, dtype=np.int64)
        counts[rng.integers(0, num_bins, int(rng.integers(1, 5)))] = rng.integers(1, 100, 1)
        return counts
    # heavy tail: a bulk near zero and rare far outliers
    counts = np.zeros(num_bins, dtype=np.int64)
    counts[: num_bins // 16] = rng.integers(100, 1000, num_bins // 16)
    counts[-1] = 1
    counts[rng.integers(num_bins // 2, num_bins, 3)] += 1
    return counts


def test_vectorised_kl_matches_the_loop_on_many_random_histograms() -> None:
    rng = np.random.default_rng(0)
    for case in range(240):
        num_bins = int(rng.integers(8, 260))
        num_levels = int(rng.integers(2, min(num_bins, 48) + 1))
        counts = _random_histogram(rng, case % 5, num_bins)
        fast, slow = kl_divergences(counts, num_levels), _entropy_reference(counts, num_levels)
        np.testing.assert_array_equal(np.isfinite(fast), np.isfinite(slow), err_msg=f"case {case}")
        finite = np.isfinite(slow)
        np.testing.assert_allclose(fast[finite], slow[finite], rtol=0, atol=1e-10, err_msg=f"case {case}")
        chosen = entropy_bins(counts, num_levels, discard_zero_bin=False)
        assert chosen == _reference_bins(counts, num_levels), f"case {case}"


def test_full_size_search_matches_the_loop() -> None:
    rng = np.random.default_rng(1)
    for kind in range(5):
        counts = _random_histogram(rng, kind, 2048)
        slow = _entropy_reference(counts, 128)
        fast = kl_divergences(counts, 128)
        finite = np.isfinite(slow)
        np.testing.assert_allclose(fast[finite], slow[finite], atol=1e-10)
        assert entropy_bins(counts, 128, discard_zero_bin=False) == _reference_bins(counts, 128)


def _t(values: np.ndarray, method: str = "entropy", **options: object) -> tuple[float, TensorHistogram]:
    hist = histogram_from_values(np.asarray(values, dtype=np.float32))
    return threshold(hist, CalibConfig(method=method, **options)), hist  # type: ignore[arg-type]


def test_uniform_keeps_nearly_the_whole_range() -> None:
    t, hist = _t(np.random.default_rng(2).uniform(-1, 1, 500_000))
    assert t >= 0.97 * hist.amax


def test_gaussian_lands_in_the_upper_tail_but_below_max() -> None:
    t, hist = _t(np.random.default_rng(3).standard_normal(100_000))
    # The reference search gives ~3.5 sigma at 1e4 samples, ~4.1-4.5 at 1e5, ~4.6 at 1e6: the empirical
    # tail grows with the sample count and the KL keeps sparse tail bins almost for free.
    assert 3.0 < t < 4.7 and t < hist.amax


def test_rare_big_outliers_are_clipped_far_below_max() -> None:
    rng = np.random.default_rng(4)
    values = np.concatenate([rng.standard_normal(1_000_000), [30.0, -25.0, 40.0]])
    t, hist = _t(values)
    assert 3.0 < t < 0.15 * hist.amax  # inside the Gaussian bulk, not at an outlier


def test_outliers_beyond_16x_the_bulk_cannot_be_clipped_into_it() -> None:
    # TensorRT's search never goes below 128 of 2048 bins (amax / 16). Past the bulk's last value every
    # kept-bin candidate has an empty last bin that the clipped tail would fill: Q is 0 there, the KL
    # infinite. So T can only stop at an outlier.
    rng = np.random.default_rng(4)
    values = np.concatenate([rng.standard_normal(1_000_000), [100.0, -80.0, 120.0]])
    t, hist = _t(values)
    assert t == pytest.approx(80.0, abs=hist.bin_width)


def test_relu_zero_spike_is_discarded_like_tensorrt() -> None:
    values = np.maximum(np.random.default_rng(5).standard_normal(400_000), 0)
    kept, _ = _t(values, discard_zero_bin=False)
    discarded, _ = _t(values)
    assert kept < 2.5 < 4.0 < discarded  # the zero spike alone drags T down to ~2 sigma


def test_all_zero_tensor_gets_a_small_positive_threshold_under_every_method() -> None:
    hist = histogram_from_values(np.zeros(100, dtype=np.float32))
    for method in METHODS:
        assert threshold(hist, CalibConfig(method=method)) == ZERO_AMAX > 0
    assert ZERO_AMAX / QMAX == 2.0**-14


def test_single_value_and_few_non_empty_bins_keep_the_max() -> None:
    for values in (np.full(1000, -2.5), np.array([0.5] * 10 + [1.0] * 20), np.array([3.0, 0.0, 0.0])):
        for method in ("entropy", "max", "percentile"):
            t, hist = _t(values, method)
            assert t == pytest.approx(hist.amax, rel=1e-12), (values[:3], method)


def test_empty_histogram_is_an_error() -> None:
    with pytest.raises(CalibrationError, match="no values"):
        threshold(TensorHistogram("empty", np.zeros(4, dtype=np.int64), amax=0.0))


def test_percentile_keeps_at_least_the_asked_share() -> None:
    hist = TensorHistogram("t", np.ones(1000, dtype=np.int64), amax=1000.0)
    assert threshold(hist, CalibConfig(method="percentile", percentile=99.0)) == 990.0
    assert threshold(hist, CalibConfig(method="percentile", percentile=99.05)) == 991.0
    assert threshold(hist, CalibConfig(method="percentile", percentile=100)) == 1000.0
    values = np.random.default_rng(6).standard_normal(1_000_000).astype(np.float32)
    t, hist = _t(values, "percentile")
    exact = np.quantile(np.abs(values), 0.9999)  # 3.83 for this sample (3.89 for the distribution)
    assert exact <= t <= exact + hist.bin_width


def test_mse_matches_a_plain_loop_and_sits_near_4_sigma_for_a_gaussian() -> None:
    rng = np.random.default_rng(7)
    hist = histogram_from_values(rng.standard_normal(200_000).astype(np.float32), 256)
    centres = (np.arange(256) + 0.5) * hist.bin_width
    best, best_error = None, np.inf
    for i in range(16, 256):
        t = centres[i]
        q = np.clip(np.rint(centres * QMAX / t), -QMAX, QMAX) * t / QMAX
        error = float(np.sum(hist.counts * (centres - q) ** 2))
        if error < best_error:
            best, best_error = t, error
    assert threshold(hist, CalibConfig(method="mse", num_bins=256, num_levels=16)) == best
    t, _ = _t(rng.standard_normal(1_000_000), "mse")
    assert 3.5 < t < 4.3


def test_max_is_amax() -> None:
    t, hist = _t([0.1, -7.0, 3.0], "max")
    assert t == hist.amax == 7.0


def test_unknown_method_lists_the_valid_ones() -> None:
    with pytest.raises(UnknownNameError) as info:
        CalibConfig(method="kl")
    assert set(info.value.valid) == {"entropy", "max", "percentile", "mse", "auto"}


def test_config_none_means_default_and_bad_values_say_how_to_fix() -> None:
    assert CalibConfig(method=None, num_bins=None) == CalibConfig()  # type: ignore[arg-type]
    with pytest.raises(CalibrationError, match="num_bins"):
        CalibConfig(num_bins=64)
    with pytest.raises(CalibrationError, match="percentile"):
        CalibConfig(percentile=0)


def test_weight_scales_per_output_channel() -> None:
    w = np.zeros((3, 2, 2, 2), dtype=np.float32)
    w[0, 1, 0, 0], w[1, 0, 1, 1], w[2, 0, 0, 0] = -2.54, 1.27, ZERO_AMAX / 2
    # the third channel's max is below ZERO_AMAX: it gets ZERO_AMAX's scale, float16's smallest normal
    np.testing.assert_allclose(weight_scales(w, 0), [0.02, 0.01, 2.0**-14], rtol=1e-6)
    assert weight_scales(w, 0).dtype == np.float32
    deconv = np.moveaxis(w, 0, 1)  # ConvTranspose: output channels on axis 1
    np.testing.assert_array_equal(weight_scales(deconv, 1), weight_scales(w, 0))
    np.testing.assert_array_equal(weight_scales(deconv, -3), weight_scales(w, 0))
    with pytest.raises(CalibrationError, match="non-finite"):
        weight_scales(np.array([[np.nan, 1.0]]), 0, name="fc.weight")


def test_a_histogram_whose_range_ends_above_max_searches_only_up_to_max() -> None:
    # One pass over the data rounds the range up (HistogramCollector): the empty bins beyond max|x| must
    # neither be offered as extra "no clipping" candidates nor give a T above max|x|.
    rng = np.random.default_rng(11)
    counts = np.bincount(np.minimum((np.abs(rng.standard_normal(200_000)) * 400).astype(int), 1899), minlength=2048)
    wide = TensorHistogram("t", counts, amax=1900 / 400 - 1e-9, top=2048 / 400)
    tight = TensorHistogram("t", counts[:1900], amax=1900 / 400 - 1e-9, top=1900 / 400)
    assert wide.used_bins == 1900 and wide.bin_width == tight.bin_width
    for method in METHODS:
        assert threshold(wide, CalibConfig(method=method)) == pytest.approx(
            threshold(tight, CalibConfig(method=method)), rel=1e-12), method
        assert threshold(wide, CalibConfig(method=method)) <= wide.amax
