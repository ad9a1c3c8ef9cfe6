"""The sensitivity search's objective (trtopt.quant.objective) on random figures: what its docstring promises."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from trtopt.quant.objective import gain, refuted, shortfall, worst

AIM = 0.99
cosine = st.floats(min_value=-1.0, max_value=1.0, allow_nan=False)
outputs = st.lists(cosine, min_size=1, max_size=6)


@given(current=st.floats(min_value=-1.0, max_value=AIM), new=cosine)
def test_with_one_output_below_the_aim_the_gain_is_the_cosines_rise(current: float, new: float) -> None:
    assert gain(new, current, AIM) == gain([new], [current], AIM)
    assert np.isclose(gain(new, current, AIM), new - current, atol=1e-12)


@given(data=st.data(), current=outputs)
def test_the_gain_is_at_least_the_worst_outputs_rise_and_ignores_the_outputs_order(
    data: st.DataObject, current: list[float]
) -> None:  # fmt: skip
    new = data.draw(st.lists(cosine, min_size=len(current), max_size=len(current)))
    found = gain(new, current, AIM)
    assert found >= worst(new) - worst(current) - 1e-12
    assert found >= shortfall(current, AIM) - shortfall(new, AIM) - 1e-12
    order = data.draw(st.permutations(range(len(current))))
    assert np.isclose(gain([new[i] for i in order], [current[i] for i in order], AIM), found, atol=1e-12)


@given(before=st.lists(cosine, min_size=2, max_size=10), lift=st.floats(min_value=0.002, max_value=0.5))
def test_a_layer_that_lifts_every_confirmation_sample_alike_is_never_refuted(before: list[float], lift: float) -> None:
    old = np.array([before])
    assert not refuted(old + lift, old, AIM, least=0.001, noise=2.0)
    assert refuted(old, old, AIM, least=0.001, noise=2.0)
