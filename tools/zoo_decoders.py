"""Box decoders for zoo detectors that trtopt.metrics cannot decode by itself (`TaskConfig.decoder` hooks).

PicoDet (PP-PicoDet, the GFL head of the `layout` models): per stride s of (8, 16, 32, 64) two outputs,
class scores [N, cells, classes] (already sigmoid) and box logits [N, cells, 4 x (reg_max + 1)]. A box side's
distance from its cell centre is the expectation of the softmax over its reg_max + 1 bins, times s; cell
centres are ((col + 0.5) s, (row + 0.5) s) on a ceil(H / s) x ceil(W / s) grid. Algorithm as described by
Generalized Focal Loss (Li et al., 2020, arXiv:2006.04388) and PaddleDetection's PicoDet post-processing
(PaddlePaddle/PaddleDetection, ppdet/modeling/heads/pico_head.py); written here from that description.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from trtopt.metrics.boxes import Detections, batched_nms
from trtopt.metrics.yolo import DecodeConfig

PICODET_STRIDES = (8, 16, 32, 64)


def picodet_decoder(input_hw: tuple[int, int], config: DecodeConfig | None = None):  # type: ignore[no-untyped-def]
    """A decoder for a PicoDet model with input height x width: outputs -> one (boxes, scores, classes) per image."""
    settings = config or DecodeConfig()

    def decode(outputs: dict[str, np.ndarray]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        scores, boxes = _pairs(outputs, input_hw)
        batch = len(next(iter(outputs.values())))
        return [_image([s[i] for s in scores], [b[i] for b in boxes], input_hw, settings) for i in range(batch)]

    return decode


def _pairs(outputs: dict[str, np.ndarray], input_hw: tuple[int, int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(score maps, box logits) ordered by stride, told apart by their cell counts (grid of each stride)."""
    by_cells: dict[int, dict[str, np.ndarray]] = {}
    arrays = [np.asarray(a) for a in outputs.values() if np.ndim(a) == 3]
    classes = min(a.shape[-1] for a in arrays)  # box logits have 4 x bins columns, more than the classes
    for a in arrays:
        by_cells.setdefault(a.shape[1], {})["scores" if a.shape[-1] == classes else "boxes"] = a
    cells = [_grid(input_hw, s)[0] * _grid(input_hw, s)[1] for s in PICODET_STRIDES]
    if sorted(by_cells) != sorted(cells) or any(len(v) != 2 for v in by_cells.values()):
        raise ValueError(f"not a PicoDet head over {input_hw}: outputs {[a.shape for a in arrays]}")
    return [by_cells[c]["scores"] for c in cells], [by_cells[c]["boxes"] for c in cells]


def _grid(input_hw: tuple[int, int], stride: int) -> tuple[int, int]:
    return math.ceil(input_hw[0] / stride), math.ceil(input_hw[1] / stride)


def _image(scores: Sequence[np.ndarray], logits: Sequence[np.ndarray], input_hw: tuple[int, int],
           config: DecodeConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    boxes, best, labels = [], [], []
    for stride, score, logit in zip(PICODET_STRIDES, scores, logits, strict=True):
        keep = score.max(axis=1) >= config.score_threshold
        if not keep.any():
            continue
        rows, cols = _grid(input_hw, stride)
        index = np.flatnonzero(keep)
        centre = np.stack([(index % cols + 0.5) * stride, (index // cols + 0.5) * stride], axis=1)
        bins = logit[keep].reshape(len(index), 4, -1).astype(np.float64)
        bins = np.exp(bins - bins.max(axis=2, keepdims=True))
        distance = (bins / bins.sum(axis=2, keepdims=True)) @ np.arange(bins.shape[2]) * stride  # l, t, r, b
        boxes.append(np.concatenate([centre - distance[:, :2], centre + distance[:, 2:]], axis=1))
        best.append(score[keep].max(axis=1))
        labels.append(score[keep].argmax(axis=1))
    if not boxes:
        empty = Detections.empty()
        return empty.boxes, empty.scores, empty.classes
    found = batched_nms(Detections.of(np.concatenate(boxes), np.concatenate(best), np.concatenate(labels)),
                        config.nms_iou)  # fmt: skip
    order = np.argsort(-found.scores)[: config.max_boxes]
    return found.boxes[order], found.scores[order], found.classes[order]
