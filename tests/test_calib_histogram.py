"""Streaming |x| histograms: exact bins, invariance to batching and order, non-finite data, plotting."""

from __future__ import annotations

import builtins

import numpy as np
import pytest

from trtopt.calib import (
    HistogramCollector,
    RangeCollector,
    TensorHistogram,
    histogram_from_values,
    plot_histogram,
)
from trtopt.calib.histogram import CHUNK, fold_signed_counts
from trtopt.errors import BackendUnavailableError, CalibrationError


def reference_counts(values: np.ndarray, num_bins: int) -> tuple[np.ndarray, float]:
    """The documented binning, written plainly: bin = min(floor(|x| * float32(B / amax)), B - 1)."""
    a = np.abs(values.astype(np.float32).ravel())
    amax = float(a.max())
    scale = np.float32(num_bins / amax)
    index = np.minimum(np.floor(a * scale).astype(np.int64), num_bins - 1)
    return np.bincount(index, minlength=num_bins), amax


def stream(batches: list[np.ndarray], num_bins: int = 2048) -> TensorHistogram:
    ranges = RangeCollector("t")
    for batch in batches:
        ranges.update(batch)
    counter = HistogramCollector("t", ranges.result().amax, num_bins)
    for batch in batches:
        counter.update(batch)
    return counter.result()


@pytest.mark.parametrize("num_bins", [2048, 128, 7])
def test_bins_match_the_plain_definition(num_bins: int) -> None:
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.standard_normal(200_000), rng.laplace(size=50_000) * 3, [0.0, -0.0]])
    values = values.astype(np.float32)
    hist = histogram_from_values(values, num_bins, name="x")
    expected, amax = reference_counts(values, num_bins)
    np.testing.assert_array_equal(hist.counts, expected)
    assert hist.amax == amax and hist.count == values.size
    assert hist.zeros == np.count_nonzero(values == 0)


def test_values_equal_to_amax_land_in_the_last_bin_from_both_signs() -> None:
    values = np.array([-3.0, 3.0, 1.5, 0.0, -1e-30], dtype=np.float32)
    hist = histogram_from_values(values, 4)
    assert hist.counts.tolist() == [2, 0, 1, 2]
    assert hist.edges.tolist() == [0.0, 0.75, 1.5, 2.25, 3.0]


def test_fold_of_signed_indices() -> None:
    # nb = 2: signed index k + 2 for k = trunc(x * s) in [-2, 2]
    signed = np.array([1, 10, 100, 1000, 10000])  # k = -2, -1, 0, 1, 2
    assert fold_signed_counts(signed).tolist() == [100, 10 + 1000 + 10000 + 1]


def test_result_does_not_depend_on_batch_size_or_order() -> None:
    rng = np.random.default_rng(1)
    samples = (rng.standard_normal((64, 3, 17, 19)) * rng.uniform(0.1, 5, (64, 1, 1, 1))).astype(np.float32)
    whole = stream([samples])
    for size in (1, 3, 8, 64):
        batches = [samples[i : i + size] for i in range(0, len(samples), size)]
        for order in (batches, batches[::-1], [batches[i] for i in rng.permutation(len(batches))]):
            hist = stream(order)
            np.testing.assert_array_equal(hist.counts, whole.counts)
            assert hist.amax == whole.amax and hist.zeros == whole.zeros


def test_tensors_larger_than_one_chunk_and_other_float_types() -> None:
    rng = np.random.default_rng(2)
    values = rng.standard_normal(3 * CHUNK + 5).astype(np.float32)
    np.testing.assert_array_equal(histogram_from_values(values).counts, reference_counts(values, 2048)[0])
    half = histogram_from_values(values.astype(np.float16), 256)
    assert half.count == values.size and half.counts.sum() == values.size
    double = histogram_from_values(values.astype(np.float64), 256)
    assert double.count == values.size


def test_all_zero_tensor_has_amax_zero_and_everything_in_bin_zero() -> None:
    hist = histogram_from_values(np.zeros((4, 5), dtype=np.float32), 16)
    assert hist.amax == 0.0 and hist.counts[0] == 20 and hist.counts[1:].sum() == 0 and hist.zeros == 20


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_stop_calibration_with_the_tensor_name(bad: float) -> None:
    values = np.ones(100, dtype=np.float32)
    values[[3, 7]] = bad
    collector = RangeCollector("conv3_out")
    collector.update(np.ones(4, dtype=np.float32))
    with pytest.raises(CalibrationError, match=r"'conv3_out'.*batch 2") as info:
        collector.update(values)
    assert ("2 NaN" if np.isnan(bad) else "2 infinite") in info.value.what
    assert "broken" in info.value.what and info.value.fix


def test_second_pass_values_outside_the_first_pass_range_are_refused() -> None:
    counter = HistogramCollector("t", amax=1.0, num_bins=8)
    counter.update(np.array([0.5, -1.0, 1.0], dtype=np.float32))
    for bad in (np.array([2.5], dtype=np.float32), np.array([-5.0], dtype=np.float32)):
        with pytest.raises(CalibrationError, match="changed between the two passes"):
            counter.update(bad)


def test_integer_tensors_are_refused() -> None:
    with pytest.raises(CalibrationError, match="int64"):
        RangeCollector("shape").update(np.arange(4))


def test_histogram_is_read_only_and_validated() -> None:
    hist = TensorHistogram("t", np.array([1, 2, 3]), amax=3.0)
    with pytest.raises(ValueError):
        hist.counts[0] = 5
    assert hist.upper_edge(2) == 2.0 and hist.bin_width == 1.0
    with pytest.raises(ValueError):
        TensorHistogram("t", np.array([1]), amax=float("nan"))


def test_memory_does_not_grow_with_the_number_of_batches() -> None:
    counter = HistogramCollector("t", amax=4.0, num_bins=2048)
    state = counter._signed.nbytes
    rng = np.random.default_rng(3)
    for _ in range(20):
        counter.update(np.clip(rng.standard_normal(10_000), -4, 4).astype(np.float32))
    assert counter._signed.nbytes == state  # counters only: no per-batch storage


def test_plot_writes_a_png(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    values = np.random.default_rng(4).standard_normal(10_000).astype(np.float32)
    hist = histogram_from_values(values, name="x")
    path = plot_histogram(hist, tmp_path / "x.png", {"entropy": 3.0, "max": hist.amax})
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_how_to_install(tmp_path, monkeypatch) -> None:
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):  # type: ignore[no-untyped-def]
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    hist = TensorHistogram("t", np.array([1, 2]), amax=1.0)
    with pytest.raises(BackendUnavailableError, match="matplotlib") as info:
        plot_histogram(hist, tmp_path / "x.png")
    assert info.value.fix == "pip install trtopt[plot]"


def test_range_pass_keeps_the_mean_of_each_channel_over_all_batches() -> None:
    rng = np.random.default_rng(3)
    offsets = np.array([0.0, 5.0, -2.0], dtype=np.float32).reshape(1, 3, 1, 1)
    batches = [(rng.standard_normal((n, 3, 7, 5)) + offsets).astype(np.float32) for n in (4, 1, 3)]
    collector = RangeCollector("t")
    for batch in batches:
        collector.update(batch)
    expected = np.concatenate(batches).astype(np.float64).mean(axis=(0, 2, 3))
    np.testing.assert_allclose(collector.result().channel_mean, expected, rtol=1e-6, atol=1e-7)
    features = RangeCollector("fc_in")
    features.update(np.array([[1.0, 2.0], [3.0, 6.0]], dtype=np.float32))
    assert features.result().channel_mean.tolist() == [2.0, 4.0]
    flat = RangeCollector("flat")
    flat.update(np.ones(6, dtype=np.float32))
    assert flat.result().channel_mean is None  # no channel axis


def test_channel_count_that_changes_between_batches_is_refused() -> None:
    collector = RangeCollector("t")
    collector.update(np.zeros((1, 3, 2, 2), dtype=np.float32))
    with pytest.raises(CalibrationError, match=r"'t' has 4 channels .* batch 2 and 3"):
        collector.update(np.zeros((1, 4, 2, 2), dtype=np.float32))
