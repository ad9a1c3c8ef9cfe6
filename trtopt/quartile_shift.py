"""How far a plan moves the bulk of an output's values: the quartile shift, a figure no outlier can hide.

Cosine and relative error are norms, and a norm is carried by an output's largest values. LORE's table-cell
detector (docs/holdout.md, lore-detect) has a heat map of logits whose background reaches -4.4e4: its INT8
plan moved the median logit from about -29 to -1.7, so 65% of positions crossed the package's detection
threshold instead of 0.29%, while the output's cosine stayed at 0.957 and the build warned of nothing.

The **quartile shift** of an output is the largest move of FP32's three quartiles (25th, 50th and 75th
percentiles over all its elements on the compared samples), in units of FP32's interquartile range:

    shift = max over q in (0.25, 0.5, 0.75) of |Q_plan(q) - Q_fp32(q)| / (Q_fp32(0.75) - Q_fp32(0.25))

It reads only the middle half of each distribution, so up to a quarter of the elements at either end can be
anything without moving it, and the unit is the spread of those same middle values. An output whose
quartiles coincide (more than half its values equal: a ReLU map, a saturated probability map) is measured
in its 5-95% spread instead, then its full range; the unit is never below `FLOOR` times FP32's root mean
square (a constant is measured in that), and an all-zero output has no figure (None).
It is a comparison of distributions, not of elements: a plan that swapped values between positions keeps
it at 0 (cosine catches that), which is why it complements cosine rather than replacing it.

Chosen over two other outlier-proof figures by measuring them (the module's tests rebuild the synthetic case;
numbers from the zoo and lore-detect are in docs/holdout.md, "Quartile shift"):

- **cosine after clipping both runs to FP32's [0.5th, 99.5th] percentiles**: blind whenever more than 0.5%
  of the values are outliers (the clip bounds then lie among them), and cosine of two all-negative vectors
  stays high under a shift anyway (its norm is dominated by the common offset);
- **the share of elements within k times FP32's median absolute deviation**: catches the shift, but also
  fires on healthy plans, because an outlier's own quantisation error (a few percent of -4e4) is far beyond
  the bulk's spread; any fixed k is then a per-model guess.

Large outputs are measured on a fixed pseudo-random subset of `SAMPLE` elements (the same positions in both
runs; numpy's generator is the same on every CPU): the quartiles of a million values are within 0.05
percentile points of the whole's, and it bounds the memory and time a 150-million-element feature map costs.
"""

from __future__ import annotations

import math

import numpy as np

QUARTILES = (0.25, 0.5, 0.75)
SAMPLE = 1 << 20  # at most this many elements of an output enter the quantiles
BATCH_SAMPLE = SAMPLE // 16  # ... and of each batch, where `trtopt compare` streams batches (trtopt.compare.ErrorStats)
# The build warns when an output's quartiles move by more than this share of FP32's interquartile range.
# Measured (docs/holdout.md, "Quartile shift"): default plans of the zoo at most ..., lore-detect's heat map ...
MAX_SHIFT = 0.5
# The unit is never below this share of FP32's root mean square: values that small beside the output's own
# magnitude matter to no reader. A softmax over 6,625 characters (PP-OCRv4-rec) has quartiles near 1e-9 whose
# INT8 plan doubles them (0.95 interquartile ranges) while its top probabilities are unchanged.
FLOOR = 1e-3


def sampled(got: np.ndarray, want: np.ndarray, limit: int = SAMPLE) -> tuple[np.ndarray, np.ndarray]:
    """Both arrays flattened, or the same `limit` pseudo-random positions of each when they are larger."""
    got, want = np.asarray(got).ravel(), np.asarray(want).ravel()
    if want.size <= limit:
        return got, want
    index = np.sort(np.random.default_rng(want.size).integers(0, want.size, limit))
    return got[index], want[index]


def quartile_shift(got: np.ndarray, want: np.ndarray) -> float | None:
    """The quartile shift of `got` from `want` (see the module; arrays of one shape). None: `want` is
    all zero (or empty, or not finite). A non-finite `got` (NaN, inf) gives inf, the worst figure."""
    got, want = sampled(got, want)
    got, want = got.astype(np.float64), want.astype(np.float64)
    if want.size == 0 or not np.all(np.isfinite(want)):
        return None
    spread = max(_spread(want), FLOOR * float(np.sqrt(np.mean(np.square(want)))))
    if spread == 0:
        return None
    if not np.all(np.isfinite(got)):
        return math.inf
    moved = np.abs(np.quantile(got, QUARTILES) - np.quantile(want, QUARTILES))
    shift = float(np.max(moved)) / spread
    return shift if math.isfinite(shift) else math.inf


def _spread(want: np.ndarray) -> float:
    """FP32's interquartile range; else its 5-95% spread; else its range; 0 for a constant."""
    for low, high in ((0.25, 0.75), (0.05, 0.95), (0.0, 1.0)):
        bottom, top = np.quantile(want, (low, high))
        if top > bottom:
            return float(top - bottom)
    return 0.0


def shift_warning(output: str, shift: float | None, cosine: float) -> str | None:
    """The warning for an output whose bulk moved too far from FP32's (None: it did not)."""
    if shift is None or shift <= MAX_SHIFT:
        return None
    return (
        f"the INT8 plan moves the bulk of output {output!r}: its quartiles shift by {shift:.2f} times FP32's "
        f"interquartile range (above {MAX_SHIFT}), though its cosine is {cosine:.4f} (cosine is carried by the "
        "output's largest values). Whatever reads this output with a threshold (a detector's heat map, a score "
        "map) will see most positions on the other side of it. Keep the layers `trtopt compare --per-layer` "
        "names float (--exclude), try another --method, or calibrate on samples like the model's real inputs."
    )
