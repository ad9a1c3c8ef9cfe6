"""Classification read-out: probabilities, top-k and class names (ImageNet's bundled with trtopt)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from trtopt.errors import DataError

log = logging.getLogger(__name__)

IMAGENET_CLASSES = 1000
MAX_LABELS_BYTES = 16 * 2**20  # a labels file is a few KiB; 16 MiB is far more than any class list


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


def read_labels(path: str | os.PathLike[str]) -> list[str]:
    """Class names from a text file, one per line (UTF-8). Raises `DataError` for a missing, binary, empty or
    oversized file, naming it."""
    source = Path(path)
    fix = "Give a UTF-8 text file with one class name per line, in class-index order."
    if not source.is_file():
        raise DataError(f"Labels file {str(source)!r} does not exist or is not a file.", fix=fix)
    if source.stat().st_size > MAX_LABELS_BYTES:
        raise DataError(
            f"Labels file {str(source)!r} has {source.stat().st_size:,} bytes; a class list is at most "
            f"{MAX_LABELS_BYTES:,}.", fix=fix,
        )  # fmt: skip
    try:
        text = source.read_bytes().decode("utf-8")
    except (UnicodeDecodeError, OSError) as exc:
        raise DataError(f"Labels file {str(source)!r} is not readable UTF-8 text ({exc}).", fix=fix) from None
    if "\x00" in text:
        raise DataError(f"Labels file {str(source)!r} contains NUL bytes: it is a binary file.", fix=fix)
    labels = text.splitlines()
    while labels and not labels[-1].strip():
        labels.pop()
    if not labels:
        raise DataError(f"Labels file {str(source)!r} is empty.", fix=fix)
    return labels


def check_labels(labels: list[str], num_classes: int | None, where: str = "the labels") -> None:
    """Fewer names than the model has classes would print `class 123` for some predictions: refuse. More
    names than classes is suspicious but harmless: warn."""
    if num_classes is None:
        return
    if len(labels) < num_classes:
        raise DataError(
            f"{where} name {len(labels)} classes, but the model has {num_classes} outputs per sample.",
            fix=f"Give one name per class, {num_classes} lines in class-index order.",
        )
    if len(labels) > num_classes:
        log.warning("%s name %d classes, but the model has %d; the extra names are never shown", where,
                    len(labels), num_classes)  # fmt: skip


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
