"""Agreement of dense score maps (text detection, segmentation): cosine per image and binarised-map IoU.

A DB text detector (Liao et al. 2020, "Real-time Scene Text Detection with Differentiable Binarization",
AAAI) outputs a probability map [N, 1, H, W]; its post-processing binarises it at a fixed threshold before
finding text regions, 0.3 in PaddleOCR's `DBPostProcess` (ppocr/postprocess/db_postprocess.py, `thresh=0.3`)
and in RapidOCR's config (`Det.thresh: 0.3`). So two maps agree on what matters when their binarised
versions overlap: IoU = |ref > t and test > t| / |ref > t or test > t|, summed over all pixels of all images
(images with much text weigh more, as they do for the detector).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

DB_THRESHOLD = 0.3


def binary_iou(reference: np.ndarray, test: np.ndarray, threshold: float = DB_THRESHOLD) -> tuple[int, int]:
    """(intersection, union) pixel counts of the two maps binarised at `threshold` (value > threshold)."""
    ref, tst = np.asarray(reference) > threshold, np.asarray(test) > threshold
    return int(np.count_nonzero(ref & tst)), int(np.count_nonzero(ref | tst))


def cosine_rows(reference: np.ndarray, test: np.ndarray) -> np.ndarray:
    """Cosine similarity per row (image) of two [N, ...] arrays; 1.0 where both rows are zero."""
    ref = np.asarray(reference, np.float64).reshape(len(reference), int(np.prod(np.shape(reference)[1:])))
    tst = np.asarray(test, np.float64).reshape(len(test), int(np.prod(np.shape(test)[1:])))
    dot = (ref * tst).sum(axis=1)
    norms = np.linalg.norm(ref, axis=1) * np.linalg.norm(tst, axis=1)
    same = np.all(ref == tst, axis=1)
    return np.where(norms > 0, dot / np.where(norms > 0, norms, 1.0), np.where(same, 1.0, 0.0))


@dataclass
class MapAgreement:
    """Score-map agreement summed over images (FP32 map = reference).

    The cosine is pooled over every pixel of every image, so images with text dominate it, as they do the
    detector's result. Per-image cosines are kept only for images where the FP32 map has a pixel above the
    threshold: on an image without text the map is ~1e-6 everywhere, and its cosine measures noise.
    """

    threshold: float = DB_THRESHOLD
    images: int = 0
    intersection: int = 0
    union: int = 0
    reference_pixels: int = 0  # pixels above the threshold in the FP32 maps
    test_pixels: int = 0
    dot: float = 0.0
    ref_sq: float = 0.0
    test_sq: float = 0.0
    text_cosines: list[float] = field(default_factory=list)  # per image with FP32 text pixels

    def update(self, reference: np.ndarray, test: np.ndarray) -> None:
        """`reference`, `test`: one batch of maps, [N, ...]."""
        ref, tst = np.asarray(reference, np.float64), np.asarray(test, np.float64)
        inter, union = binary_iou(ref, tst, self.threshold)
        self.images += len(ref)
        self.intersection += inter
        self.union += union
        self.reference_pixels += int(np.count_nonzero(ref > self.threshold))
        self.test_pixels += int(np.count_nonzero(tst > self.threshold))
        self.dot += float(np.vdot(ref, tst))
        self.ref_sq += float(np.vdot(ref, ref))
        self.test_sq += float(np.vdot(tst, tst))
        has_text = (ref > self.threshold).reshape(len(ref), -1).any(axis=1)
        self.text_cosines.extend(float(c) for c in cosine_rows(ref[has_text], tst[has_text]))

    @property
    def iou(self) -> float | None:
        """Binarised-map IoU over all images; 1.0 when neither side has a pixel above the threshold."""
        if not self.images:
            return None
        return self.intersection / self.union if self.union else 1.0

    @property
    def cosine(self) -> float | None:
        """Cosine of all maps taken as one vector."""
        if not self.images:
            return None
        norms = np.sqrt(self.ref_sq * self.test_sq)
        return self.dot / norms if norms > 0 else float(self.ref_sq == self.test_sq)

    @property
    def min_text_cosine(self) -> float | None:
        return min(self.text_cosines) if self.text_cosines else None

    def to_dict(self) -> dict[str, object]:
        return {
            "threshold": self.threshold,
            "images": self.images,
            "images_with_text": len(self.text_cosines),
            "binary_iou": self.iou,
            "reference_pixels": self.reference_pixels,
            "test_pixels": self.test_pixels,
            "cosine": self.cosine,
            "min_text_image_cosine": self.min_text_cosine,
        }
