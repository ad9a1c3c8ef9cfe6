"""Classification read-out: probabilities, top-k and class names (ImageNet's bundled with trtopt)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import numpy as np

IMAGENET_CLASSES = 1000


@dataclass(frozen=True)
class Prediction:
    index: int
    label: str
    probability: float


def imagenet_labels() -> list[str]:
    """The 1000 ImageNet-1k class names in index order (source: trtopt/data/IMAGENET_CLASSES_SOURCE.md)."""
    text = resources.files("trtopt.data").joinpath("imagenet_classes.txt").read_text(encoding="utf-8")
    return text.splitlines()


def default_labels(num_classes: int) -> list[str] | None:
    """ImageNet names for 1000-way classifiers, none otherwise."""
    return imagenet_labels() if num_classes == IMAGENET_CLASSES else None


def probabilities(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, unless the scores already are probabilities."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.min() >= 0 and np.allclose(scores.sum(axis=-1), 1.0, atol=1e-3):
        return scores
    shifted = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def top_k(scores: np.ndarray, k: int = 5, labels: list[str] | None = None) -> list[list[Prediction]]:
    """Top-k predictions per row of a [batch, classes] score array."""
    probs = probabilities(np.asarray(scores).reshape(len(scores), -1))
    k = min(k, probs.shape[1])
    order = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    return [
        [
            Prediction(int(i), labels[i] if labels and i < len(labels) else f"class {i}", float(row[i]))
            for i in idx
        ]
        for row, idx in zip(probs, order, strict=True)
    ]
