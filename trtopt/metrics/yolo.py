"""Decoding of YOLO-style detector outputs into `Detections` (pure numpy): the three layouts exported models use.

- **YOLOv8 / YOLO11** (Ultralytics): one output [N, 4 + C, A]: per anchor point, the box as centre x,
  centre y, width, height in input pixels, then C class scores (already sigmoid), no objectness. A box's score
  is its best class score (Ultralytics docs, "Export" / ONNX output format "(1, 84, 8400)";
  ultralytics/utils/ops.py `non_max_suppression`).
- **YOLOv5** (Ultralytics): one output [N, A, 5 + C]: box as cx, cy, w, h in input pixels, objectness, then C
  class probabilities; a box's score is objectness x class probability (ultralytics/yolov5 utils/general.py
  `non_max_suppression`: `x[:, 5:] *= x[:, 4:5]`). Here A = 3 anchors per grid cell.
- **YOLOX** (Ge et al. 2021, "YOLOX: Exceeding YOLO Series in 2021", arXiv:2107.08430; Megvii-BaseDetection/
  YOLOX): the same [N, A, 5 + C] layout and score; exported with `decode_in_inference=False` the boxes are
  still raw, relative to each grid cell: cx = (x + grid_x) * stride, cy = (y + grid_y) * stride,
  w = exp(w) * stride, h = exp(h) * stride, over strides 8, 16, 32 in that order, cells in row-major order
  (yolox/utils/demo_utils.py `demo_postprocess`). Format "yolox" means this raw output; a YOLOX exported
  with decoding in the graph is read as "yolov5" (same layout and score).

All decoders then keep boxes scoring at least `score_threshold` and run NMS per class.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trtopt.metrics.boxes import Detections, batched_nms, xyxy_from_cxcywh

BOX_FORMATS = ("yolov8", "yolov5", "yolox")
YOLO_STRIDES = ((8, 16, 32), (8, 16, 32, 64))  # P3-P5 (every family's default) and P3-P6 (the "6" models)
ANCHORS_PER_CELL = (1, 3)  # anchor-free (YOLOv8, YOLOX) and anchor-based (YOLOv5: 3 anchors per cell)


@dataclass(frozen=True)
class DecodeConfig:
    """Post-processing settings. Defaults are YOLOv5's detect.py (conf 0.25, NMS IoU 0.45)."""

    score_threshold: float = 0.25
    nms_iou: float = 0.45
    max_boxes: int = 300  # per image after NMS (Ultralytics' max_det)


def grid_cells(height: int, width: int, strides: Sequence[int]) -> int:
    """Anchor points of a YOLO head over an input of height x width: one per cell of each stride's grid."""
    return sum((height // s) * (width // s) for s in strides)


def yolo_grid_match(anchors: int, height: int, width: int) -> tuple[tuple[int, ...], int] | None:
    """(strides, anchors per cell) whose grid gives exactly `anchors` points for this input, else None."""
    for strides in YOLO_STRIDES:
        for per_cell in ANCHORS_PER_CELL:
            if anchors == per_cell * grid_cells(height, width, strides):
                return strides, per_cell
    return None


def decode(
    output: np.ndarray, box_format: str, input_hw: tuple[int, int], config: DecodeConfig | None = None
) -> list[Detections]:
    """One output of a batch ([N, ...]) -> one `Detections` per image, in `box_format` (see BOX_FORMATS)."""
    config = config or DecodeConfig()
    if box_format == "yolov8":
        return [_select(row[:4].T, row[4:].T, None, config) for row in output]
    if box_format == "yolov5":
        return [_select(row[:, :4], row[:, 5:], row[:, 4], config) for row in output]
    if box_format == "yolox":
        return [_select(*_yolox_boxes(row, input_hw), config) for row in output]
    raise ValueError(f"unknown box format {box_format!r}; expected one of {', '.join(BOX_FORMATS)}")


def classes_first(shape: Sequence[int], input_hw: tuple[int, int]) -> bool:
    """[N, 4 + classes, anchors] over the input's grid: a YOLOv8 / YOLO11 head."""
    return len(shape) == 3 and yolo_grid_match(shape[2], *input_hw) is not None and shape[1] >= 5


def anchors_first(shape: Sequence[int], input_hw: tuple[int, int]) -> bool:
    """[N, anchors, 5 + classes] over the input's grid: a YOLOv5 or YOLOX head."""
    return len(shape) == 3 and yolo_grid_match(shape[1], *input_hw) is not None and shape[2] >= 6


def head_classes(shape: Sequence[int], input_hw: tuple[int, int]) -> int | None:
    """The class count of a YOLO head of this shape over the input's grid, else None."""
    if classes_first(shape, input_hw):
        return int(shape[1]) - 4
    return int(shape[2]) - 5 if anchors_first(shape, input_hw) else None


def is_raw_yolox(row: np.ndarray, input_hw: tuple[int, int]) -> bool:
    """Whether a [A, 5 + C] output looks like YOLOX before grid decoding: its anchor count matches an
    anchor-free stride grid of the input, and some width or height is negative (a log-space size; decoded
    sizes never are). Decide it on the FP32 output and decode both sides alike."""
    match = yolo_grid_match(row.shape[0], *input_hw)
    return match is not None and match[1] == 1 and bool((row[:, 2:4] < 0).any())


def _yolox_boxes(row: np.ndarray, input_hw: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    match = yolo_grid_match(row.shape[0], *input_hw)
    if match is None or match[1] != 1:
        raise ValueError(
            f"a raw YOLOX output has one anchor per cell of the stride 8/16/32(/64) grids of the {input_hw[0]}x"
            f"{input_hw[1]} input; this one has {row.shape[0]} anchors (decoded already? use yolov5)"
        )
    grid, stride = _grid(input_hw, match[0])
    raw = row[:, :4].astype(np.float64)
    boxes = np.concatenate([(raw[:, :2] + grid) * stride, np.exp(np.minimum(raw[:, 2:4], 50)) * stride], 1)
    return boxes, row[:, 5:], row[:, 4]


def _grid(input_hw: tuple[int, int], strides: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per anchor point: its cell's (x, y) and its stride, in YOLOX's order (stride by stride, row-major)."""
    cells, steps = [], []
    for s in strides:
        ys, xs = np.meshgrid(np.arange(input_hw[0] // s), np.arange(input_hw[1] // s), indexing="ij")
        cells.append(np.stack([xs.ravel(), ys.ravel()], axis=1))
        steps.append(np.full((xs.size, 1), s))
    return np.concatenate(cells).astype(np.float64), np.concatenate(steps).astype(np.float64)


def _select(
    cxcywh: np.ndarray, class_scores: np.ndarray, objectness: np.ndarray | None, config: DecodeConfig
) -> Detections:
    scores = class_scores.astype(np.float64)
    if objectness is not None:
        scores = scores * objectness.astype(np.float64)[:, None]
    if scores.shape[1] == 0:
        return Detections.empty()
    classes = scores.argmax(axis=1)
    best = scores[np.arange(len(scores)), classes]
    keep = best >= config.score_threshold
    boxes = xyxy_from_cxcywh(np.asarray(cxcywh, np.float64)[keep])
    kept = batched_nms(Detections(boxes, best[keep], classes[keep]), config.nms_iou)
    n = config.max_boxes
    return Detections(kept.boxes[:n], kept.scores[:n], kept.classes[:n])
