"""How closely one run's outputs follow another's: the figures a plan's self-check (trtopt.verify) records."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Outputs = dict[str, np.ndarray]


@dataclass(frozen=True)
class Agreement:
    """How closely outputs follow target outputs over the verification samples (worst output counts)."""

    cosine: float  # per-sample cosine similarity, mean over samples; the lowest output's
    rel_error: float  # ||outputs - target|| / ||target||, the largest output's
    top1: float | None  # share of samples with the same argmax, over outputs shaped [N, C] (C > 1); else None

    def describe(self) -> str:
        top1 = f", top-1 {self.top1:.1%}" if self.top1 is not None else ""
        return f"cosine {self.cosine:.5f}, relative error {self.rel_error:.4f}{top1}"


def agreement(outputs: Outputs, target: Outputs) -> Agreement:
    """Compare two runs output by output; the worst output decides each figure."""
    from trtopt.compare import row_cosines, zero_padded

    cosines, errors, top1 = [], [], []
    for name, want in target.items():
        got, ref = zero_padded([outputs[name], want])  # a data-dependent length: the missing part compares with 0
        got, ref = got.astype(np.float64).reshape(len(want), -1), ref.astype(np.float64).reshape(len(want), -1)
        cosines.append(float(np.mean(row_cosines(got, ref))))
        scale = float(np.linalg.norm(ref))
        errors.append(float(np.linalg.norm(got - ref)) / scale if scale > 0 else float(np.linalg.norm(got)))
        if want.ndim == 2 and want.shape[1] > 1:
            top1.append(float(np.mean(outputs[name].argmax(1) == want.argmax(1))))
    return Agreement(
        cosine=_or_worst(min(cosines, default=1.0), -1.0),
        rel_error=_or_worst(max(errors, default=0.0), math.inf),
        top1=min(top1) if top1 else None,
    )


def _or_worst(value: float, worst: float) -> float:
    """NaN or inf (a non-finite output) counts as the worst possible agreement."""
    return value if math.isfinite(value) else worst
