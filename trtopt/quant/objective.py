"""What the sensitivity search (trtopt.quant.sensitivity) weighs a trial by, over a plan's outputs.

A trial's figures are one cosine per output (`trials.output_figures`; one float for a plan of one output).
The aim is every output at `aim` or above. A layer kept float gains by the larger of two figures: how far
it lifts the worst output, and how far it cuts the summed shortfall of every output below the aim (the sum
over outputs of max(0, aim - cosine)). The second is what several outputs whose worst cosines tie need:
keeping one layer float lifts one of them, so the worst output hardly moves while the summed shortfall
falls (layout-cdla, 8 outputs, three class-score maps at 0.9853, 0.9859 and 0.9861 on its search
samples: the worst-output search stopped there with 5 layers, one on the summed shortfall reached 0.9921
with 8; avx2). With one output the shortfall falls by no more than the cosine rises, so the gain is the
cosine's rise, as the search weighed it before.

The confirmation samples' figures are per-sample cosines, one row per output (`trials.sample_cosines`;
one row, or a 1-D array, for one output). Their paired test weighs each sample the same two ways: the
worst output's per-sample rise, and the per-sample rise summed over the outputs whose mean falls short of
the aim before the layer (the worst output where none does), and a layer is refuted only when both,
mean plus `noise` standard errors, stay below the least gain.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Figures = float | Sequence[float] | np.ndarray  # one cosine per output (a float: one output)
Cosines = float | np.ndarray  # per-sample cosines, a row per output (1-D: one output; a float: one figure)


def figures(values: Figures) -> np.ndarray:
    return np.atleast_1d(np.asarray(values, np.float64))


def worst(values: Figures) -> float:
    """The lowest output cosine."""
    return float(np.min(figures(values)))


def shortfall(values: Figures, aim: float) -> float:
    """The summed shortfall of the outputs below `aim`."""
    return float(np.sum(np.maximum(0.0, aim - figures(values))))


def gain(new: Figures, current: Figures, aim: float) -> float:
    """What `new` gains on `current`: the larger of the worst output's rise and the summed shortfall's cut."""
    return max(worst(new) - worst(current), shortfall(current, aim) - shortfall(new, aim))


def rows(cosines: Cosines) -> np.ndarray:
    """Per-sample cosines as an (outputs, samples) array."""
    return np.atleast_2d(np.asarray(cosines, np.float64))


def worst_mean(cosines: Cosines) -> float:
    """The lowest output's mean per-sample cosine (the confirmation samples' figure)."""
    return float(np.min(rows(cosines).mean(axis=1)))


def refuted(again: Cosines, before: Cosines, aim: float, least: float, noise: float) -> bool:
    """Whether the confirmation samples refute a layer: per-sample cosines with it float (`again`) against
    without (`before`), paired sample by sample, gain less than `least`, mean plus `noise` standard errors,
    both on the worst output and summed over the outputs short of `aim` (a single figure: when it gains
    less than `least`)."""
    new, old = rows(again), rows(before)
    means = old.mean(axis=1)
    short = means < aim if np.any(means < aim) else means == means.min()
    paired = (new[np.argmin(new.mean(axis=1))] - old[np.argmin(means)], (new - old)[short].sum(axis=0))
    return all(_below(gains, least, noise) for gains in paired)


def _below(gains: np.ndarray, least: float, noise: float) -> bool:
    spread = noise * float(np.std(gains, ddof=1)) / np.sqrt(gains.size) if gains.size > 1 else 0.0
    return float(np.mean(gains)) + spread < least
