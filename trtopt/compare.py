"""FP32 model vs plan on the same inputs: how far did quantisation move the outputs, and where.

Per output: top-1 agreement (for [batch, classes] outputs), cosine similarity, max and mean absolute
error. Per layer: the plan's ONNX graph keeps the optimised FP32 graph's tensor names (Q/DQ sit on
edges), so the same intermediate tensors are exposed in both and compared; the layer where the error
jumps most is the first candidate for `--exclude`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np


@dataclass
class ErrorStats:
    """Streaming error statistics between a reference and a test tensor (sums, so batches combine)."""

    name: str
    count: int = 0
    dot: float = 0.0
    ref_sq: float = 0.0
    test_sq: float = 0.0
    abs_sum: float = 0.0
    max_abs: float = 0.0
    ref_abs_max: float = 0.0
    top1_same: int = 0
    rows: int = 0

    def update(self, ref: np.ndarray, test: np.ndarray, *, classify: bool = False) -> None:
        ref64, test64 = ref.astype(np.float64).ravel(), test.astype(np.float64).ravel()
        diff = np.abs(ref64 - test64)
        self.count += ref64.size
        self.dot += float(ref64 @ test64)
        self.ref_sq += float(ref64 @ ref64)
        self.test_sq += float(test64 @ test64)
        self.abs_sum += float(diff.sum())
        self.max_abs = max(self.max_abs, float(diff.max(initial=0.0)))
        self.ref_abs_max = max(self.ref_abs_max, float(np.abs(ref64).max(initial=0.0)))
        if classify and ref.ndim == 2:
            self.rows += ref.shape[0]
            self.top1_same += int((ref.argmax(axis=1) == test.argmax(axis=1)).sum())

    @property
    def cosine(self) -> float:
        denom = np.sqrt(self.ref_sq * self.test_sq)
        return float(self.dot / denom) if denom > 0 else float(self.ref_sq == self.test_sq)

    @property
    def mean_abs(self) -> float:
        return self.abs_sum / self.count if self.count else 0.0

    @property
    def top1_agreement(self) -> float | None:
        return self.top1_same / self.rows if self.rows else None

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "cosine": self.cosine,
            "max_abs_error": self.max_abs,
            "mean_abs_error": self.mean_abs,
            "reference_abs_max": self.ref_abs_max,
            "top1_agreement": self.top1_agreement,
            "samples": self.rows or None,
        }


def compare_batches(
    pairs: Iterable[tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]]],
    names: list[str],
    *,
    classify: set[str] | None = None,
) -> list[ErrorStats]:
    """Accumulate stats over (reference outputs, test outputs) pairs for the given tensor names."""
    stats = {n: ErrorStats(n) for n in names}
    for ref, test in pairs:
        for n in names:
            stats[n].update(np.asarray(ref[n]), np.asarray(test[n]), classify=n in (classify or set()))
    return [stats[n] for n in names]
