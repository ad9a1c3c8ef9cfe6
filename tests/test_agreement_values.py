"""The agreement figures (trtopt.metrics.agreement) on outputs no calibration would produce: NaN and infinities that the
model itself computes (Sqrt of a negative input, 0/0), values near float's limits (onnx's own test inputs hold
uninitialised doubles up to 1e198), 0-d outputs. An output agrees with itself whatever its values; a NaN or an
infinity on one side only, or of the other sign, is the worst agreement."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from trtopt.metrics.agreement import agreement

VALUES = st.floats(allow_nan=True, allow_infinity=True, width=64)
ARRAYS = hnp.arrays(np.float64, hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=5), elements=VALUES)


@settings(max_examples=300, deadline=None)
@given(ARRAYS)
def test_an_output_agrees_with_itself(value: np.ndarray) -> None:
    found = agreement({"y": value.copy()}, {"y": value})
    assert found.rel_error == 0.0
    assert found.cosine >= 1 - 1e-12


@settings(max_examples=300, deadline=None)
@given(ARRAYS.filter(lambda v: v.size > 1 and np.isfinite(v).all()), st.data())
def test_a_non_finite_value_on_one_side_is_the_worst_agreement(value: np.ndarray, data: st.DataObject) -> None:
    spot = data.draw(st.integers(0, value.size - 1))
    bad = data.draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    broken = value.copy().reshape(-1)
    broken[spot] = bad
    found = agreement({"y": broken.reshape(value.shape)}, {"y": value})
    assert found.rel_error == math.inf and found.cosine == -1.0


def test_huge_values_give_finite_figures() -> None:
    want = np.array([[2.4e198, 1.0e-310, 3.0e150]])
    got = want * (1 + 1e-7)
    found = agreement({"y": got}, {"y": want})
    assert found.cosine > 0.999999 and found.rel_error < 1e-6


def test_opposite_infinities_disagree() -> None:
    found = agreement({"y": np.array([[1.0, -np.inf]])}, {"y": np.array([[1.0, np.inf]])})
    assert found.cosine == -1.0 and found.rel_error == math.inf


def test_empty_outputs_agree() -> None:
    """A zero-size output (Split with a zero-size part, ConstantOfShape of shape [0]) in both runs."""
    found = agreement({"y": np.zeros((0, 3)), "z": np.ones((2, 2))}, {"y": np.zeros((0, 3)), "z": np.ones((2, 2))})
    assert found.cosine >= 1 - 1e-12 and found.rel_error == 0.0
