"""Streaming collection on a tiny model: invariance to batch size and order, one pass over any iterable, results.

    input [N,3,8,8] -> Conv(3->8, 3x3, pad 1) -> conv1 -> Relu -> relu1 -> Conv(8->4, 1x1) -> output
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtopt.calib import (
    CalibConfig,
    CalibProgress,
    calibrate,
    check_cache_matches,
    collect_histograms,
    collect_ranges,
    histogram_from_values,
    load_cache,
    model_fingerprint,
    save_cache,
)
from trtopt.errors import CalibrationError
from trtopt.execution import run_model

TENSORS = ["input", "conv1", "relu1", "output"]


def tiny_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((4, 8, 1, 1)).astype(np.float32) * 0.5, "w2")
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["conv1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv1"], ["relu1"]),
        helper.make_node("Conv", ["relu1", "w2"], ["output"]),
    ]
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 4, 8, 8])],
        initializer=[w1, b1, w2],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return tiny_model()


@pytest.fixture(scope="module")
def samples() -> np.ndarray:
    rng = np.random.default_rng(1)
    data = rng.standard_normal((16, 3, 8, 8)).astype(np.float32)
    data[5] *= 4  # one sample with a wider range, so the order of batches could matter
    return data


def batched(samples: np.ndarray, size: int) -> list[dict[str, np.ndarray]]:
    return [{"input": samples[i : i + size]} for i in range(0, len(samples), size)]


def test_thresholds_do_not_depend_on_batch_size_or_order(model, samples) -> None:
    reference = calibrate(model, batched(samples, 16), TENSORS)
    for size in (1, 4, 8):
        for batches in (batched(samples, size), batched(samples, size)[::-1]):
            result = calibrate(model, batches, TENSORS)
            for name in TENSORS:
                assert result.amax[name] == pytest.approx(reference.amax[name], rel=1e-6), (size, name)
    # Same batches in another order: bit-identical histograms.
    forward = collect_histograms(model, batched(samples, 4), TENSORS)
    backward = collect_histograms(model, batched(samples, 4)[::-1], TENSORS)
    for name in TENSORS:
        np.testing.assert_array_equal(forward[name].counts, backward[name].counts)
        assert forward[name].amax == backward[name].amax


def test_streamed_histograms_equal_the_histogram_of_all_activations_at_once(model, samples) -> None:
    everything = run_model(model, {"input": samples}, expose=TENSORS)
    streamed = collect_histograms(model, batched(samples, 16), TENSORS)
    for name in TENSORS:
        expected = histogram_from_values(everything[name], 2048, name=name)
        np.testing.assert_array_equal(streamed[name].counts, expected.counts)
        assert streamed[name].zeros == expected.zeros
    assert streamed["relu1"].zeros > 0 and streamed.num_samples == 16 and streamed.num_batches == 1
    ranges = collect_ranges(model, batched(samples, 4), TENSORS)
    assert {name: r.amax for name, r in ranges.items()} == {name: h.amax for name, h in streamed.items()}
    assert ranges["relu1"].count == 16 * 8 * 8 * 8 and ranges.num_batches == 4


def test_result_carries_what_the_cache_and_the_report_need(model, samples, tmp_path) -> None:
    result = calibrate(model, lambda: iter(batched(samples, 4)), TENSORS, CalibConfig(method="percentile"),
                       data_description="random")
    assert set(result.amax) == set(TENSORS) and result.method == "percentile"
    assert result.num_samples == 16 and result.fingerprint == model_fingerprint(model)
    assert result.timings is not None and result.timings.images_per_s > 0
    assert result.histograms is not None and result.histograms["relu1"].num_bins == 2048
    assert result.scales["relu1"] == result.amax["relu1"] / 127
    path = save_cache(tmp_path / "tiny.calib.json", result)
    check_cache_matches(load_cache(path), TENSORS, fingerprint=model_fingerprint(model))
    lean = calibrate(model, batched(samples, 8), TENSORS, CalibConfig(keep_histograms=False))
    assert lean.histograms is None


def test_progress_is_reported_per_batch(model, samples) -> None:
    events: list[CalibProgress] = []
    collect_histograms(model, batched(samples, 4), ["relu1"], progress=events.append)
    assert [(e.phase, e.batches, e.samples) for e in events] == [
        ("histogram", 1, 4), ("histogram", 2, 8), ("histogram", 3, 12), ("histogram", 4, 16),
    ]
    assert events[0].total_samples is None


def test_max_reads_the_data_once_unless_histograms_are_asked_for(model, samples) -> None:
    events: list[CalibProgress] = []
    once = calibrate(model, (feeds for feeds in batched(samples, 4)), TENSORS, CalibConfig(method="max"),
                     progress=events.append)
    assert {e.phase for e in events} == {"range"} and once.histograms is None
    everything = run_model(model, {"input": samples}, expose=TENSORS)
    assert once.amax == {name: float(np.abs(everything[name]).max()) for name in TENSORS}
    twice = calibrate(model, batched(samples, 4), TENSORS, CalibConfig(method="max", keep_histograms=True))
    assert twice.amax == once.amax and twice.histograms is not None


def test_the_data_is_read_once_so_a_one_shot_generator_works(model, samples) -> None:
    generator = (feeds for feeds in batched(samples, 4))
    once = collect_histograms(model, generator, TENSORS)
    assert next(generator, None) is None  # consumed exactly once
    calls = []

    def source() -> list[dict[str, np.ndarray]]:
        calls.append(1)
        return batched(samples, 4)

    again = collect_histograms(model, source, TENSORS)
    assert len(calls) == 1
    for name in TENSORS:
        np.testing.assert_array_equal(once[name].counts, again[name].counts)


def test_nan_activations_name_the_tensor(model, samples) -> None:
    broken = samples.copy()
    broken[10, 0, 0, 0] = np.nan  # in the data itself: named as the data's, with the sample
    with pytest.raises(CalibrationError, match=r"Model input 'input' holds 1 NaN .* batch 2 \(sample 11 of"):
        collect_histograms(model, batched(broken, 8), TENSORS)
    huge = samples.copy()
    huge[2] = 3e38  # finite data whose conv overflows: the first tensor that turns non-finite is named
    with pytest.raises(CalibrationError, match=r"Tensor 'conv1' has \d+ NaN and [1-9]\d* infinite values"):
        collect_histograms(model, batched(huge, 8), TENSORS)


def test_bad_tensor_lists_are_user_errors(model, samples) -> None:
    with pytest.raises(CalibrationError, match="No tensors"):
        collect_histograms(model, batched(samples, 8), [])
    with pytest.raises(CalibrationError, match="string"):
        collect_histograms(model, batched(samples, 8), "relu1")
    with pytest.raises(CalibrationError, match="no batches"):
        collect_histograms(model, [], TENSORS)


def test_progress_reports_speed_and_the_stage_that_bounds_it(model, samples) -> None:
    events: list[CalibProgress] = []
    collect_histograms(model, batched(samples, 4), TENSORS, progress=events.append)
    last = events[-1]
    assert set(last.stage_seconds) == {"decode", "inference", "counting"}
    assert last.seconds > 0 and last.images_per_s == last.samples / last.seconds
    assert last.bound in last.stage_seconds
    assert CalibProgress("histogram", 0, 0, None).bound is None


def test_pipelined_calibration_over_image_files_is_the_same_for_any_worker_count(model, tmp_path) -> None:
    """Decoding runs ahead in a pool and counting overlaps the next inference: bit-identical histograms."""
    from PIL import Image

    from trtopt.data import InputInfo, PreprocessSpec, load_dataset

    rng = np.random.default_rng(3)
    for i in range(11):
        Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)).save(tmp_path / f"{i:02d}.png")
    data = load_dataset(tmp_path, [InputInfo("input", ("N", 3, 8, 8), np.float32)], PreprocessSpec(crop=8, scale=255.0))
    runs = [
        collect_histograms(model, lambda w=workers, b=size: (x.feeds for x in data.batches(b, workers=w)), TENSORS)
        for workers, size in ((1, 11), (2, 3), (4, 1))
    ]
    for run in runs[1:]:
        assert run.num_samples == 11
        for name in TENSORS:
            np.testing.assert_array_equal(run[name].counts, runs[0][name].counts)
