"""Streaming |x| histograms: exact bins, exact re-binning as the range grows, invariance to batching and order,
the compiled and numpy counting loops agreeing bit for bit, non-finite data, plotting."""

from __future__ import annotations

import builtins
import math

import numpy as np
import pytest
from require_optional import missing

from trtopt.calib import (
    HistogramCollector,
    RangeCollector,
    TensorHistogram,
    histogram_from_values,
    kernels,
    plot_histogram,
)
from trtopt.calib.histogram import grid_size
from trtopt.calib.kernels import CHUNK
from trtopt.errors import BackendUnavailableError, CalibrationError


def reference_counts(values: np.ndarray, num_bins: int) -> tuple[np.ndarray, float, float]:
    """The documented binning, written plainly in exact integer steps: grid bin g = floor(|x| * 2**(F - E))
    with max|x| < 2**E and 2**F grid bins; runs of k = ceil((g(max) + 1) / B) grid bins form a bin."""
    a = np.abs(values.astype(np.float64).ravel())
    amax = float(a.max())
    fine = grid_size(num_bins)
    exponent = math.frexp(amax)[1]
    grid = np.floor(a * (fine / 2.0**exponent)).astype(np.int64)
    run = -(-(int(grid.max()) + 1) // num_bins)
    return np.bincount(grid // run, minlength=num_bins), amax, num_bins * run * 2.0**exponent / fine


def stream(batches: list[np.ndarray], num_bins: int = 2048) -> TensorHistogram:
    counter = HistogramCollector("t", num_bins)
    for batch in batches:
        counter.update(batch)
    return counter.result()


@pytest.mark.parametrize("num_bins", [2048, 128, 7])
def test_bins_match_the_plain_definition(num_bins: int) -> None:
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.standard_normal(200_000), rng.laplace(size=50_000) * 3, [0.0, -0.0]])
    values = values.astype(np.float32)
    hist = histogram_from_values(values, num_bins, name="x")
    expected, amax, top = reference_counts(values, num_bins)
    np.testing.assert_array_equal(hist.counts, expected)
    assert hist.amax == amax and hist.top == top and hist.count == values.size
    assert hist.zeros == np.count_nonzero(values == 0)
    assert amax < top <= 1.13 * amax  # the range is max|x| rounded up to whole grid runs


def test_max_lands_in_the_last_bin_from_both_signs() -> None:
    # 4 bins -> a 64-bin grid over [0, 4) (3 < 2**2): width 1/16, max|x| = 3 in grid bin 48, so runs of
    # ceil(49 / 4) = 13 grid bins make a bin: edges at multiples of 13/16 up to top = 3.25.
    values = np.array([-3.0, 3.0, 1.5, 0.0, -1e-30], dtype=np.float32)
    hist = histogram_from_values(values, 4)
    assert hist.counts.tolist() == [2, 1, 0, 2]
    assert hist.edges.tolist() == [0.0, 0.8125, 1.625, 2.4375, 3.25]
    assert hist.amax == 3.0 and hist.zeros == 1


def test_growing_range_re_bins_exactly() -> None:
    # Small values first, then ever larger ones: every merge must give the grid of all values at once.
    rng = np.random.default_rng(5)
    parts = [rng.standard_normal(3000).astype(np.float32) * scale for scale in (1e-6, 1e-3, 0.5, 3.0, 700.0)]
    grid, state, sums = np.zeros(grid_size(2048), np.int64), kernels.new_state(), np.zeros(1)
    for part in parts:
        kernels.count_abs(kernels.as_rows(part), grid, state, sums)
    direct, direct_state = np.zeros_like(grid), kernels.new_state()
    kernels.count_abs(kernels.as_rows(np.concatenate(parts[::-1])), direct, direct_state, np.zeros(1))
    np.testing.assert_array_equal(grid, direct)
    np.testing.assert_array_equal(state, direct_state)


def test_compiled_and_numpy_loops_agree_bit_for_bit() -> None:
    rng = np.random.default_rng(6)
    for trial in range(10):
        values = (rng.standard_normal((12, 5, 700)) * rng.uniform(1e-3, 1e3)).astype(np.float32)
        values[rng.random(values.shape) < 0.3] = 0.0
        compiled, compiled_state, compiled_sums = np.zeros(grid_size(256), np.int64), kernels.new_state(), np.zeros(5)
        plain, plain_state, plain_sums = np.zeros_like(compiled), kernels.new_state(), np.zeros(5)
        for part in np.array_split(values, 4):
            kernels.count_abs(kernels.as_rows(part), compiled, compiled_state, compiled_sums)
        for part in np.array_split(values[::-1], 3):
            kernels._count_abs_numpy(kernels.as_rows(part), plain, plain_state, plain_sums)
        np.testing.assert_array_equal(compiled, plain, err_msg=f"trial {trial}")
        np.testing.assert_array_equal(compiled_state, plain_state)
        exact = values.astype(np.float64).sum(axis=(0, 2))
        np.testing.assert_allclose(compiled_sums, exact, rtol=1e-12)
        np.testing.assert_allclose(plain_sums, exact, rtol=1e-5)  # float32 pairwise inside numpy


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


@pytest.mark.parametrize("collector_type", [RangeCollector, HistogramCollector])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_stop_calibration_with_the_tensor_name(bad: float, collector_type: type) -> None:
    values = np.ones(100, dtype=np.float32)
    values[[3, 7]] = bad
    collector = collector_type("conv3_out")
    collector.update(np.ones(4, dtype=np.float32))
    with pytest.raises(CalibrationError, match=r"'conv3_out'.*batch 2") as info:
        collector.update(values)
    assert ("2 NaN" if np.isnan(bad) else "2 infinite") in info.value.what
    assert "broken" in info.value.what and info.value.fix


def test_integer_tensors_are_refused() -> None:
    for collector in (RangeCollector("shape"), HistogramCollector("shape")):
        with pytest.raises(CalibrationError, match="int64"):
            collector.update(np.arange(4))


def test_histogram_is_read_only_and_validated() -> None:
    hist = TensorHistogram("t", np.array([1, 2, 3]), amax=3.0)
    with pytest.raises(ValueError):
        hist.counts[0] = 5
    assert hist.upper_edge(2) == 2.0 and hist.bin_width == 1.0
    with pytest.raises(ValueError):
        TensorHistogram("t", np.array([1]), amax=float("nan"))
    with pytest.raises(ValueError, match="top"):
        TensorHistogram("t", np.array([1]), amax=2.0, top=1.0)
    wide = TensorHistogram("t", np.array([1, 2, 3]), amax=2.5, top=3.0)
    assert wide.bin_width == 1.0 and wide.edges.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_memory_does_not_grow_with_the_number_of_batches() -> None:
    counter = HistogramCollector("t", num_bins=2048)
    size = counter.grid.nbytes
    rng = np.random.default_rng(3)
    for scale in range(1, 21):
        counter.update((rng.standard_normal(10_000) * scale).astype(np.float32))
    assert counter.grid.nbytes == size == 32768 * 8  # counters only: no per-batch storage


def test_plot_writes_a_png(tmp_path) -> None:
    pytest.importorskip("matplotlib", reason=missing("matplotlib", "plot_histogram draws with it"))
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


@pytest.mark.parametrize("collector_type", [RangeCollector, HistogramCollector])
def test_collectors_keep_the_mean_of_each_channel_over_all_batches(collector_type: type) -> None:
    rng = np.random.default_rng(3)
    offsets = np.array([0.0, 5.0, -2.0], dtype=np.float32).reshape(1, 3, 1, 1)
    batches = [(rng.standard_normal((n, 3, 7, 5)) + offsets).astype(np.float32) for n in (4, 1, 3)]
    collector = collector_type("t")
    for batch in batches:
        collector.update(batch)
    expected = np.concatenate(batches).astype(np.float64).mean(axis=(0, 2, 3))
    np.testing.assert_allclose(collector.result().channel_mean, expected, rtol=1e-6, atol=1e-7)
    features = collector_type("fc_in")
    features.update(np.array([[1.0, 2.0], [3.0, 6.0]], dtype=np.float32))
    assert features.result().channel_mean.tolist() == [2.0, 4.0]
    flat = collector_type("flat")
    flat.update(np.ones(6, dtype=np.float32))
    assert flat.result().channel_mean is None  # no channel axis


@pytest.mark.parametrize("collector_type", [RangeCollector, HistogramCollector])
def test_an_axis_1_that_changes_between_batches_has_no_channel_means(collector_type: type) -> None:
    """Sequence-first attention ([tokens, batch, features]: torchvision's ViT) has the batch on axis 1, and the last
    calibration batch is smaller: the tensor's range and count still hold, its means per "channel" do not."""
    collector = collector_type("t")
    collector.update(np.full((5, 8, 4), 0.5, dtype=np.float32))
    collector.update(np.full((5, 2, 4), -3.0, dtype=np.float32))
    collector.update(np.full((5, 8, 4), 1.0, dtype=np.float32))  # back to 8: still no channel axis
    result = collector.result()
    assert result.channel_mean is None and result.amax == 3.0 and result.count == 5 * 18 * 4
