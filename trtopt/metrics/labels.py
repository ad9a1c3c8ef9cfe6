"""Agreement of label maps: segmentation outputs whose graph ends in its own ArgMax (integer class ids), or
score maps, [N, classes, H, W] per-pixel class scores (torchvision's FCN, DeepLabV3 and LR-ASPP exports), read
through their argmax over the class axis as the model's user does.

A segmenter exported with its ArgMax inside the graph (wired-table-rec's line segmenter writes an int64
[1, N, H, W] map of 0 background, 1 row line, 2 column line) has no scores left to compare: the cosine of
class ids weighs class 2 twice class 1 and is set by the background, and binarising at 0.3 merges the
classes. What a user reads from such a map is each class's region, so the figure is the standard one of
semantic segmentation: per class, IoU = |ref = c and test = c| / |ref = c or test = c| summed over all
pixels of all images, and the mean over the classes other than the background (the class FP32 gives most
pixels), beside the share of pixels whose label is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MOST_CLASSES = 256  # an id this large or larger is no class id of a label map (a count, an index, a size)
SCORE_CLASSES = 5  # fewest classes of a score map found unasked: more channels than an image's or a text map's


def is_label_map(out: np.ndarray, input_hw: tuple[int, int] | None) -> bool:
    """Integer values of rank 3 or more whose last two axes are at least a quarter of the input's height and
    width (or, without an image input, at least 8 each), with at most `MOST_CLASSES` non-negative ids."""
    if out.ndim < 3 or not (np.issubdtype(out.dtype, np.integer) or out.dtype == np.bool_) or not out.size:
        return False
    height, width = out.shape[-2:]
    least = (input_hw[0] / 4, input_hw[1] / 4) if input_hw is not None else (8, 8)
    if height < least[0] or width < least[1]:
        return False
    return int(out.min()) >= 0 and int(out.max()) < MOST_CLASSES


def is_score_map(out: np.ndarray, input_hw: tuple[int, int] | None, asked: bool) -> bool:
    """Float [N, C, H, W] per-pixel class scores. Unasked (auto), only a map of `SCORE_CLASSES` or more classes at
    the input's own height and width: an image-to-image model writes 1, 3 or 4 channels, a backbone's features
    come at a fraction of the input, a text detector's probability map has at most 4 channels. Asked for
    (`--task segment`), 2 or more classes at a quarter of the input's size or more."""
    if out.ndim != 4 or out.dtype.kind != "f" or input_hw is None or not out.size:
        return False
    classes, (height, width) = out.shape[1], out.shape[2:]
    if asked:
        return 2 <= classes < MOST_CLASSES and height * 4 >= input_hw[0] and width * 4 >= input_hw[1]
    return SCORE_CLASSES <= classes < MOST_CLASSES and (height, width) == tuple(input_hw)


def labels_from_scores(scores: np.ndarray) -> np.ndarray:
    """[N, C, H, W] class scores -> [N, H, W] class ids (the first of a tie, as numpy's and ONNX's ArgMax)."""
    return np.asarray(scores).argmax(axis=1)


def label_map_outputs(outputs: dict[str, np.ndarray], input_hw: tuple[int, int] | None) -> list[str]:
    """The names of `outputs` that are label maps (`is_label_map`)."""
    return [name for name, value in outputs.items() if is_label_map(np.asarray(value), input_hw)]


@dataclass
class LabelAgreement:
    """Per-class pixel counts summed over images (FP32 map = reference)."""

    images: int = 0
    pixels: int = 0
    same: int = 0
    intersection: dict[int, int] = field(default_factory=dict)
    union: dict[int, int] = field(default_factory=dict)
    reference_pixels: dict[int, int] = field(default_factory=dict)

    def update(self, reference: np.ndarray, test: np.ndarray) -> None:
        """One batch of maps, [..., H, W] (every axis before the last two counts images: [N, H, W],
        [N, 1, H, W] and wired-table-rec's [1, N, H, W] alike)."""
        self.images += int(np.prod(np.shape(reference)[:-2]))
        ref, tst = np.asarray(reference, np.int64).ravel(), np.asarray(test, np.int64).ravel()
        low = int(min(ref.min(initial=0), tst.min(initial=0)))  # ids from 0 (a later batch may hold a -1)
        ref, tst = ref - low, tst - low
        classes = int(max(ref.max(initial=0), tst.max(initial=0))) + 1
        # one pass: pixels per (FP32 label, plan label)
        confusion = np.bincount(ref * classes + tst, minlength=classes * classes).reshape(classes, classes)
        self.pixels += ref.size
        same, in_ref, in_test = np.diag(confusion), confusion.sum(axis=1), confusion.sum(axis=0)
        self.same += int(same.sum())
        for index in np.flatnonzero(in_ref + in_test).tolist():
            label = index + low
            self.intersection[label] = self.intersection.get(label, 0) + int(same[index])
            self.union[label] = self.union.get(label, 0) + int(in_ref[index] + in_test[index] - same[index])
            self.reference_pixels[label] = self.reference_pixels.get(label, 0) + int(in_ref[index])

    @property
    def background(self) -> int | None:
        """The class FP32 gives most pixels (the lower id of a tie)."""
        counts = self.reference_pixels
        return max(counts, key=lambda c: (counts[c], -c)) if counts else None

    def class_iou(self) -> dict[int, float]:
        return {c: self.intersection[c] / self.union[c] for c in sorted(self.union) if self.union[c]}

    @property
    def mean_iou(self) -> float | None:
        """Mean IoU over the classes other than the background; 1.0 when neither map has any (all background)."""
        if not self.images:
            return None
        found = [iou for c, iou in self.class_iou().items() if c != self.background]
        return float(np.mean(found)) if found else 1.0

    @property
    def agreement(self) -> float | None:
        return self.same / self.pixels if self.pixels else None

    def to_dict(self) -> dict[str, object]:
        return {
            "images": self.images,
            "pixel_agreement": self.agreement,
            "background": self.background,
            "mean_iou": self.mean_iou,
            "class_iou": {str(c): iou for c, iou in self.class_iou().items()},
            "reference_pixels": {str(c): n for c, n in sorted(self.reference_pixels.items())},
        }
