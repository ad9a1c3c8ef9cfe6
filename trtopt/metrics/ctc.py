"""Greedy CTC decoding and sequence agreement between two recognizers (pure numpy).

Greedy ("best path") decoding (Graves et al. 2006, "Connectionist Temporal Classification", §3.2): take the
most likely class at each time step, merge repeated classes, then drop the blank. PaddleOCR's
`CTCLabelDecode` (ppocr/postprocess/rec_postprocess.py) and ddddocr do exactly this, with the blank at index
0. Agreement of the decoded sequences: exact-match rate, and the mean normalised edit distance, Levenshtein
distance / length of the longer sequence (0 = same, 1 = nothing in common), as PaddleOCR's `RecMetric`
(ppocr/metrics/rec_metric.py, `norm_edit_dis`) computes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

CTC_LAYOUTS = ("ntc", "tnc")  # batch-major [N, T, C] (PaddleOCR) or time-major [T, N, C] (PyTorch's CTC)


def ctc_greedy(scores: np.ndarray, blank: int = 0) -> list[int]:
    """One sequence: scores [T, C] (probabilities or logits) or class indices [T] -> decoded class ids."""
    steps = np.asarray(scores)
    best = steps.argmax(axis=-1) if steps.ndim == 2 else steps.astype(np.int64)
    if best.size == 0:
        return []
    first = np.concatenate([[True], best[1:] != best[:-1]])  # the first step of each run of one class
    return [int(c) for c in best[first] if c != blank]


def decode_batch(output: np.ndarray, layout: str = "ntc", blank: int = 0) -> list[list[int]]:
    """A batch of CTC outputs ([N, T, C] or [T, N, C], see CTC_LAYOUTS) -> one decoded sequence per sample."""
    if layout not in CTC_LAYOUTS:
        raise ValueError(f"unknown CTC layout {layout!r}; expected one of {', '.join(CTC_LAYOUTS)}")
    batch_major = output if layout == "ntc" else np.swapaxes(output, 0, 1)
    return [ctc_greedy(sample, blank) for sample in batch_major]


def edit_distance(a: Sequence[int], b: Sequence[int]) -> int:
    """Levenshtein distance: the fewest insertions, deletions and substitutions turning `a` into `b`
    (Wagner-Fischer dynamic programme, one row at a time)."""
    previous = list(range(len(b) + 1))
    for i, item in enumerate(a, start=1):
        current = [i]
        for j, other in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (item != other)))
        previous = current
    return previous[-1]


def normalized_edit_distance(a: Sequence[int], b: Sequence[int]) -> float:
    """Edit distance / length of the longer sequence; 0.0 for two empty sequences."""
    longest = max(len(a), len(b))
    return edit_distance(a, b) / longest if longest else 0.0


@dataclass
class SequenceAgreement:
    """Decoded-sequence agreement summed over samples (FP32's sequence = reference)."""

    samples: int = 0
    exact: int = 0
    distance_sum: float = 0.0
    empty_reference: int = 0  # samples whose FP32 sequence is empty (the recognizer saw no text)

    def update(self, reference: Sequence[Sequence[int]], test: Sequence[Sequence[int]]) -> None:
        for ref, tst in zip(reference, test, strict=True):
            self.samples += 1
            self.exact += list(ref) == list(tst)
            self.distance_sum += normalized_edit_distance(ref, tst)
            self.empty_reference += not ref

    @property
    def exact_rate(self) -> float | None:
        return self.exact / self.samples if self.samples else None

    @property
    def mean_distance(self) -> float | None:
        return self.distance_sum / self.samples if self.samples else None

    def to_dict(self) -> dict[str, object]:
        return {
            "samples": self.samples,
            "exact_match": self.exact_rate,
            "mean_normalized_edit_distance": self.mean_distance,
            "empty_reference": self.empty_reference,
        }
