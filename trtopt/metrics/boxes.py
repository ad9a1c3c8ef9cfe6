"""Detections, IoU, non-maximum suppression and box matching between two detectors' outputs (pure numpy).

Matching follows the PASCAL VOC / COCO evaluation rule (Everingham et al. 2010, "The PASCAL Visual Object
Classes Challenge", §4.2; pycocotools `COCOeval.evaluateImg`): within each class, the test boxes are taken in
order of decreasing score, and each one is matched to the not yet matched reference box of the same class
with which it has the highest IoU, provided that IoU is at least the threshold (0.5 by default, VOC's). Here
the "ground truth" is the FP32 model's own detections, so recall says how many FP32 boxes the quantised model
still finds, precision how many of its boxes FP32 also has.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Detections:
    """One image's boxes: `boxes` [K, 4] as x1, y1, x2, y2; `scores` [K]; `classes` [K] integer ids."""

    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray

    @staticmethod
    def empty() -> Detections:
        return Detections(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64))

    @staticmethod
    def of(boxes: object, scores: object, classes: object) -> Detections:
        """Detections from array-likes, checked for matching lengths (what a user decoder returns)."""
        b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
        s = np.asarray(scores, dtype=np.float64).reshape(-1)
        c = np.asarray(classes).reshape(-1).astype(np.int64)
        if not len(b) == len(s) == len(c):
            raise ValueError(f"boxes, scores and classes differ in length: {len(b)}, {len(s)}, {len(c)}")
        return Detections(b, s, c)

    def __len__(self) -> int:
        return len(self.scores)


def xyxy_from_cxcywh(boxes: np.ndarray) -> np.ndarray:
    """Centre x, centre y, width, height -> corners x1, y1, x2, y2 (the YOLO families' box encoding)."""
    cx, cy, w, h = boxes[..., 0], boxes[..., 1], boxes[..., 2], boxes[..., 3]
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1)


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box in `a` [K, 4] with every box in `b` [M, 4] (x1, y1, x2, y2): a [K, M] matrix.
    Degenerate boxes (zero or negative area) have IoU 0 with everything."""
    a = np.asarray(a, np.float64).reshape(-1, 4)
    b = np.asarray(b, np.float64).reshape(-1, 4)
    area_a = np.clip(a[:, 2] - a[:, 0], 0, None) * np.clip(a[:, 3] - a[:, 1], 0, None)
    area_b = np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)
    width = np.clip(np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0]), 0, None)
    height = np.clip(np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1]), 0, None)
    inter = width * height
    union = area_a[:, None] + area_b[None, :] - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float) -> np.ndarray:
    """Greedy non-maximum suppression: indices of the kept boxes, highest score first. A box is dropped when
    its IoU with an already kept box exceeds `iou_threshold` (torchvision.ops.nms's rule)."""
    order = np.argsort(-np.asarray(scores), kind="stable")
    keep: list[int] = []
    while order.size:
        best, rest = int(order[0]), order[1:]
        keep.append(best)
        order = rest[box_iou(boxes[best : best + 1], boxes[rest])[0] <= iou_threshold]
    return np.asarray(keep, dtype=np.int64)


def batched_nms(dets: Detections, iou_threshold: float) -> Detections:
    """NMS within each class (boxes of different classes never suppress each other), best first."""
    kept = [
        np.flatnonzero(dets.classes == c)[nms(dets.boxes[dets.classes == c], dets.scores[dets.classes == c],
                                              iou_threshold)]
        for c in np.unique(dets.classes)
    ]  # fmt: skip
    index = np.concatenate(kept) if kept else np.zeros(0, np.int64)
    index = index[np.argsort(-dets.scores[index], kind="stable")]
    return Detections(dets.boxes[index], dets.scores[index], dets.classes[index])


def match_count(reference: Detections, test: Detections, iou_threshold: float = 0.5) -> int:
    """How many test boxes match a reference box (same class, IoU >= threshold, greedy by test score)."""
    matched = 0
    for c in np.intersect1d(np.unique(reference.classes), np.unique(test.classes)):
        ref_boxes = reference.boxes[reference.classes == c]
        mine = test.classes == c
        order = np.argsort(-test.scores[mine], kind="stable")
        iou = box_iou(test.boxes[mine][order], ref_boxes)
        taken = np.zeros(len(ref_boxes), dtype=bool)
        for row in iou:
            candidates = np.where(taken, -1.0, row)
            best = int(np.argmax(candidates))
            if candidates[best] >= iou_threshold:
                taken[best] = True
                matched += 1
    return matched


@dataclass
class BoxAgreement:
    """Box matching summed over images: FP32's boxes are the reference, the plan's are tested."""

    iou_threshold: float = 0.5
    reference_boxes: int = 0
    test_boxes: int = 0
    matched: int = 0
    images: int = 0

    def update(self, reference: Detections, test: Detections) -> None:
        self.images += 1
        self.reference_boxes += len(reference)
        self.test_boxes += len(test)
        self.matched += match_count(reference, test, self.iou_threshold)

    @property
    def recall(self) -> float | None:
        """Share of FP32's boxes the plan also finds; None when FP32 found none."""
        return self.matched / self.reference_boxes if self.reference_boxes else None

    @property
    def precision(self) -> float | None:
        """Share of the plan's boxes that FP32 also has; None when the plan found none."""
        return self.matched / self.test_boxes if self.test_boxes else None

    @property
    def f1(self) -> float | None:
        """Harmonic mean of recall and precision: 2·matched / (reference + test boxes); 1.0 when neither side
        found a box (they agree), None only before any image."""
        total = self.reference_boxes + self.test_boxes
        if not self.images:
            return None
        return 2 * self.matched / total if total else 1.0

    def to_dict(self) -> dict[str, object]:
        return {
            "iou_threshold": self.iou_threshold,
            "images": self.images,
            "reference_boxes": self.reference_boxes,
            "test_boxes": self.test_boxes,
            "matched": self.matched,
            "recall": self.recall,
            "precision": self.precision,
            "f1": self.f1,
        }
