"""`--method auto`'s whole-model check (trtopt.calib.auto_whole): the model's outputs with every tensor rounded to
auto's choices against max everywhere, and max kept where it moves them clearly less."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtopt.calib import CalibConfig, calibrate
from trtopt.calib.auto import TensorChoice, fake_quantize
from trtopt.calib.auto_whole import MATERIAL, WHOLE_MODEL, fake_quantized, output_error, whole_model_choice
from trtopt.execution import OrtSession

SHAPE = [4, 8, 6, 6]


def _chain(last: str = "Exp") -> onnx.ModelProto:
    """x ─ Relu ─ r ─ Mul 3 ─ m ─ `last` ─ y, and a Shape of x (int64) as a second output. Exp makes the few large
    values of m carry the output, as a detector's score logits do; Sigmoid saturates, so they barely count."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "three"], ["m"]),
             helper.make_node(last, ["m"], ["y"]), helper.make_node("Shape", ["x"], ["s"])]  # fmt: skip
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE),
         helper.make_tensor_value_info("s", TensorProto.INT64, [4])],
        [numpy_helper.from_array(np.float32(3.0), "three")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _sparse_peaks(seed: int) -> np.ndarray:
    """Mostly small values, one in a hundred near 2: the peaks a percentile or entropy threshold clips."""
    rng = np.random.default_rng(seed)
    values = rng.uniform(-0.3, 0.3, SHAPE).astype(np.float32)
    peaks = rng.random(SHAPE) < 0.01
    values[peaks] = rng.uniform(1.5, 2.0, int(peaks.sum())).astype(np.float32)
    return values


def test_fake_quantized_rounds_what_readers_read_and_leaves_outputs_and_other_types() -> None:
    x = _sparse_peaks(0)
    model = fake_quantized(_chain(), {"r": 1.0, "y": 5.0, "s": 2.0})
    onnx.checker.check_model(model)
    got = OrtSession(model, opt_level="disable").run({"x": x})
    expected = np.exp(3 * fake_quantize(np.maximum(x, 0), 1.0))  # Mul reads r on the grid of T = 1, clipped there
    np.testing.assert_allclose(got["y"], expected, rtol=1e-6)  # y: a graph output, as computed
    np.testing.assert_array_equal(got["s"], SHAPE)  # an int64 tensor: not rounded (not a float tensor)
    assert [n.op_type for n in model.graph.node].count("QuantizeLinear") == 2  # r, and y (for readers: none)


def test_output_error_is_the_mean_relative_squared_error_over_outputs() -> None:
    model, x = _chain(), _sparse_peaks(1)
    fp32 = OrtSession(model, opt_level="disable").run({"x": x})
    reference = [[fp32["y"], fp32["s"]]]
    assert output_error(model, reference, [({"x": x}, 4)], None) == 0.0
    doubled = [[fp32["y"] * 2, fp32["s"]]]  # y off by half the reference, s exact: the mean of 1/4 and 0
    assert output_error(model, doubled, [({"x": x}, 4)], None) == pytest.approx(0.125)
    assert output_error(model, doubled, [({"x": x}, 0)], None) == 0.0  # no real rows: nothing to count


def test_max_wins_where_clipping_the_peaks_moves_the_outputs_and_loses_where_it_does_not() -> None:
    model, batches = _chain(), [({"x": _sparse_peaks(s)}, 4) for s in (2, 3)]
    top = float(max(np.abs(b["x"]).max() for b, _ in batches))
    wins, clipped, at_max = whole_model_choice(model, {"r": 0.5, "m": 1.5}, {"r": top, "m": 3 * top}, batches)
    assert wins and at_max <= 0.8 * clipped
    # max's grid so coarse (thresholds of 500: steps of 4) that it rounds everything but the peaks to zero
    wins, own, at_max = whole_model_choice(model, {"r": 0.15, "m": 0.45}, {"r": 500.0, "m": 1500.0}, batches)
    assert not wins and own >= MATERIAL and at_max > own
    # choices that barely move the outputs: nothing to guard, max not even run
    wins, own, at_max = whole_model_choice(model, {"r": top, "m": 3 * top}, {"r": 500.0, "m": 1500.0}, batches)
    assert not wins and own < MATERIAL and np.isnan(at_max)


def test_auto_calibration_keeps_max_everywhere_where_the_check_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import trtopt.calib.auto as auto

    def clipping(model: Any, options: Any, batches: Any, **kw: Any) -> dict[str, TensorChoice]:  # every tensor clipped
        return {n: TensorChoice("percentile", found["max"] / 4, {}, "tensor") for n, found in options.items()}

    model = _chain()
    batches = [{"x": _sparse_peaks(s)} for s in range(4)]
    scoring = [({"x": _sparse_peaks(9)}, 4)]
    monkeypatch.setattr(auto, "choose_thresholds", clipping)
    found = calibrate(model, batches, ["r", "m"], CalibConfig(method="auto"), score_batches=scoring)
    assert found.choices == {"r": WHOLE_MODEL, "m": WHOLE_MODEL}
    assert found.amax["m"] == pytest.approx(float(found.histograms["m"].amax))  # type: ignore[index]
    assert found.method_counts() == {WHOLE_MODEL: 2}

    def at_max(model: Any, options: Any, batches: Any, **kw: Any) -> dict[str, TensorChoice]:
        return {n: TensorChoice("max", found["max"], {}, "tensor") for n, found in options.items()}

    monkeypatch.setattr(auto, "choose_thresholds", at_max)  # nothing to compare: max already, as auto chose it
    kept = calibrate(model, batches, ["r", "m"], CalibConfig(method="auto"), score_batches=scoring)
    assert kept.choices == {"r": "max", "m": "max"} and kept.amax == found.amax


def test_a_check_that_cannot_run_leaves_autos_choices(monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    import logging

    import trtopt.calib.auto as auto
    import trtopt.calib.auto_whole as whole

    def clipping(model: Any, options: Any, batches: Any, **kw: Any) -> dict[str, TensorChoice]:
        return {n: TensorChoice("percentile", found["max"] / 4, {}, "tensor") for n, found in options.items()}

    def refused(*args: Any, **kw: Any) -> None:
        raise RuntimeError("ONNX Runtime refused the rounded model\nsecond line")

    monkeypatch.setattr(auto, "choose_thresholds", clipping)
    monkeypatch.setattr(whole, "whole_model_choice", refused)
    with caplog.at_level(logging.WARNING):
        found = calibrate(_chain(), [{"x": _sparse_peaks(s)} for s in range(4)], ["r", "m"],
                          CalibConfig(method="auto"), score_batches=[({"x": _sparse_peaks(9)}, 4)])  # fmt: skip
    assert found.choices == {"r": "percentile", "m": "percentile"}
    assert any("whole-model check did not run (ONNX Runtime refused the rounded model)" in r.getMessage()
               for r in caplog.records)  # fmt: skip
