"""Array helpers every comparison of two runs' outputs uses (pure numpy): stacking outputs whose length depends
on the data, per-row cosines, and whether values are a probability distribution. They sit at the bottom of the
fidelity figures, below `trtopt.metrics`' task metrics, `trtopt.metrics.agreement` and `trtopt.metrics.compare`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_SUM_TOLERANCE = 1e-3  # how far a probability vector's sum may be from 1 (float32 Softmax rounding)


def zero_padded(arrays: Sequence[np.ndarray], *, from_axis: int = 0) -> list[np.ndarray]:
    """`arrays` zero-padded at the end of each axis from `from_axis` on to their largest size there, so that
    outputs whose length depends on the data (a decoder's Loop that stops at its end token, NonZero, NMS)
    can be stacked and compared: what one run produced and the other did not counts against zero, as a
    disagreement. Arrays of one shape, or of different ranks, come back as they are."""
    arrays = [np.asarray(a) for a in arrays]
    if len({a.shape for a in arrays}) <= 1 or len({a.ndim for a in arrays}) != 1:
        return arrays
    top = np.max([a.shape for a in arrays], axis=0)
    return [np.pad(a, [(0, 0) if axis < from_axis else (0, int(top[axis]) - size) for axis, size in enumerate(a.shape)])
            for a in arrays]  # fmt: skip


def joined_batches(batches: Sequence[tuple[np.ndarray, int | None]]) -> np.ndarray:
    """One output's values from several batches, each (value, its real rows: None for all), as one array: the
    rows kept, concatenated along the batch axis, zero-padded where their length depends on the data
    (`zero_padded`). A 0-d output (a count, a loss) has no rows to trim: it stays 0-d from one batch and becomes
    one value per batch from several."""
    values = [np.asarray(v)[:rows] if np.ndim(v) else np.asarray(v) for v, rows in batches]
    if len(values) == 1 and not values[0].ndim:
        return values[0]
    return np.concatenate(zero_padded([np.atleast_1d(v) for v in values], from_axis=1))


def row_cosines(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """The cosine of each row of `got` with the same row of `ref` (two all-zero rows agree)."""
    norms = np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1)
    both_zero = norms == 0
    return np.where(both_zero, np.all(got == ref, axis=1), np.sum(got * ref, axis=1) / np.where(both_zero, 1, norms))


def is_distribution(value: np.ndarray, axis: int) -> bool:
    """Probabilities (or log-probabilities) along `axis` at every position; all-zero positions (padding) pass.
    Also `trtopt.metrics.task`'s test of a per-step distribution, for outputs of models without an image input."""
    v = value.astype(np.float64)
    if v.min() >= -_SUM_TOLERANCE and v.max() <= 1 + _SUM_TOLERANCE:
        sums = v.sum(axis=axis)
        return bool(np.all((np.abs(sums - 1) <= _SUM_TOLERANCE) | (sums == 0)))
    if v.max() <= _SUM_TOLERANCE:
        top = v.max(axis=axis, keepdims=True)
        logsum = np.log(np.exp(v - top).sum(axis=axis)) + np.squeeze(top, axis)
        return bool(np.all(np.abs(logsum) <= _SUM_TOLERANCE))
    return False
