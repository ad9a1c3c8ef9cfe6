"""The sensitivity search's objective (trtopt.search._objective) on random figures: what its docstring promises."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from trtopt.search._objective import gain, refuted, shortfall, split, worst

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


@given(data=st.data(), aim_rows=st.lists(cosine, min_size=1, max_size=6))
def test_split_figures_aim_by_their_first_row_and_gain_by_their_second(
    data: st.DataObject, aim_rows: list[float]
) -> None:  # fmt: skip
    """Two rows (trtopt.search._objective.split): the aim row decides the worst output and the shortfall, the
    steady row every gain; whatever the aim rows do, the gain is that of the steady rows alone."""
    size = len(aim_rows)
    same_size = st.lists(cosine, min_size=size, max_size=size)
    current = np.array([aim_rows, data.draw(same_size)])
    new = np.array([data.draw(same_size), data.draw(same_size)])
    assert worst(current) == min(aim_rows) and shortfall(current, AIM) == shortfall(aim_rows, AIM)
    assert gain(new, current, AIM) == gain(new[1], current[1], AIM)
    assert split(current[0], current[0].copy()).shape == (size,)  # one form where the two are the same
    assert split(*current).shape == ((size,) if np.array_equal(*current) else (2, size))


def test_a_split_confirmation_refutes_on_the_steady_rows() -> None:
    """Per-sample cosines in both forms (outputs, samples, stacked): a layer whose confirmation samples flip
    a position back (the aim form jumps) but whose cosines do not move is refuted; one whose cosines rise on
    every sample is not, though no position flips."""
    aim_before, steady_before = np.full((1, 8), 0.96), np.full((1, 8), 0.995)
    flipped = np.stack([aim_before + np.eye(1, 8) * 0.03, steady_before])
    lifted = np.stack([aim_before, steady_before + 0.002])
    before = np.stack([aim_before, steady_before])
    assert refuted(flipped, before, AIM, least=0.001, noise=2.0)
    assert not refuted(lifted, before, AIM, least=0.001, noise=2.0)
