"""What the sensitivity search (trtopt.search.sensitivity) weighs a trial by, over a plan's outputs.

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

A plan with per-position class scores (a recogniser's or tagger's [N, T, C]) has two figures per output: its
aim figure, the lower of its cosine and its top-class agreement, and its steady figure, the cosine alone. Such
figures come as two rows (`split`: aim row first), per-sample ones as two stacked row sets. The aim row says
whether the plan falls short, which output is worst and when the search stops; a layer's gain is measured on
the steady row. The agreement moves in steps of one position: on a recogniser of thousands of classes one
flipped time step is 0.0016 of 16 lines' positions, more than the search's least gain, so layers chosen on
it won by single flips that did not carry over to other lines (held out, PP-OCRv6-rec's worst cosine
0.9871 -> 0.9821 and PP-OCRv4-rec's float16 copy 0.9927 -> 0.9840 when the gain was read from the aim row;
docs/holdout.md round 8, avx2).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Figures = float | Sequence[float] | np.ndarray  # one cosine per output (a float: one output; two rows: `split`)
Cosines = float | np.ndarray  # per-sample cosines, a row per output (1-D: one output; a float: one figure; 3-D: split)


def split(aim: np.ndarray, steady: np.ndarray) -> np.ndarray:
    """Figures (or per-sample cosines) with an aim and a steady form, as the module doc says: `aim` alone
    where the two are the same."""
    return aim if np.array_equal(aim, steady) else np.stack([aim, steady])


def _form(values: Figures | Cosines, index: int, stacked: int) -> np.ndarray:
    """Row `index` (0 aim, 1 steady) of `values` where `split` stacked two forms (`stacked` dimensions), else the
    one form, as a vector (figures) or an (outputs, samples) array (per-sample cosines)."""
    found = np.asarray(values, np.float64)
    if found.ndim == stacked:
        return found[index]
    return np.atleast_1d(found) if stacked == 2 else np.atleast_2d(found)


def figures(values: Figures) -> np.ndarray:
    """The aim figure of each output."""
    return _form(values, 0, 2)


def steady(values: Figures) -> np.ndarray:
    """The steady figure of each output (its aim figure where it has no other)."""
    return _form(values, 1, 2)


def worst(values: Figures) -> float:
    """The lowest output figure (the aim row)."""
    return float(np.min(figures(values)))


def shortfall(values: Figures, aim: float) -> float:
    """The summed shortfall of the outputs below `aim` (the aim row)."""
    return float(np.sum(np.maximum(0.0, aim - figures(values))))


def gain(new: Figures, current: Figures, aim: float) -> float:
    """What `new` gains on `current`: the larger of the worst output's rise and the summed shortfall's cut,
    both of the steady figures."""
    new, current = steady(new), steady(current)
    return max(worst(new) - worst(current), shortfall(current, aim) - shortfall(new, aim))


def rows(cosines: Cosines) -> np.ndarray:
    """Per-sample cosines as an (outputs, samples) array (the aim form)."""
    return _form(cosines, 0, 3)


def steady_rows(cosines: Cosines) -> np.ndarray:
    """Per-sample cosines as an (outputs, samples) array (the steady form)."""
    return _form(cosines, 1, 3)


def worst_mean(cosines: Cosines) -> float:
    """The lowest output's mean per-sample cosine (the confirmation samples' figure, aim form)."""
    return float(np.min(rows(cosines).mean(axis=1)))


def refuted(again: Cosines, before: Cosines, aim: float, least: float, noise: float) -> bool:
    """Whether the confirmation samples refute a layer: per-sample cosines with it float (`again`) against
    without (`before`), paired sample by sample, gain less than `least`, mean plus `noise` standard errors,
    both on the worst output and summed over the outputs short of `aim` (a single figure: when it gains
    less than `least`); which outputs those are, the aim form says, and their gains the steady form."""
    means = rows(before).mean(axis=1)  # the aim form says which outputs fall short; the steady form, by how much
    short = means < aim if np.any(means < aim) else means == means.min()
    new, old = steady_rows(again), steady_rows(before)
    paired = (new[np.argmin(rows(again).mean(axis=1))] - old[np.argmin(means)], (new - old)[short].sum(axis=0))
    return all(_below(gains, least, noise) for gains in paired)


def _below(gains: np.ndarray, least: float, noise: float) -> bool:
    spread = noise * float(np.std(gains, ddof=1)) / np.sqrt(gains.size) if gains.size > 1 else 0.0
    return float(np.mean(gains)) + spread < least


def lift_words(current: Figures, new: Figures, aim: float) -> str:
    """How `new` lifts `current`, for a layer's reason: the worst output score, the worst cosine where that is
    not the same figure, and the summed shortfall where the plan has several outputs."""
    said = f"the worst output score {worst(current):.4f} -> {worst(new):.4f}"
    if any(not np.array_equal(steady(f), figures(f)) for f in (current, new)):
        said += f"; its worst cosine {worst(steady(current)):.4f} -> {worst(steady(new)):.4f}"
    if figures(new).size < 2:
        return said
    cut = f"{shortfall(current, aim):.4f} -> {shortfall(new, aim):.4f}"
    return f"{said}, the outputs' summed shortfall below {aim} {cut}"
