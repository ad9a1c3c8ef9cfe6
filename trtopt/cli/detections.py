"""`trtopt run` on a YOLO detector's plan: each image's detections, not the raw head's value range.

A YOLOv8 / YOLO11 export's one output is [N, 4 + classes, anchors], a YOLOv5's or YOLOX's [N, anchors, 5 + classes],
over the input's stride grid; `trtopt.metrics.task` recognises them by that grid (as the build's verification and
`trtopt compare` do) and `trtopt.metrics.yolo.decode` turns them into boxes: score threshold 0.25, per-class NMS at
IoU 0.45, Ultralytics' and YOLOv5's defaults. Boxes are in the model input's pixels (after the plan's letterbox or
resize), which the text says: mapping them back onto each photo is the application's (it knows its own resize).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

SHOWN = 5  # the best detections a line shows; --json has them all


def detection_rows(
    output: np.ndarray, feeds: Mapping[str, np.ndarray], labels: Sequence[str] | None
) -> list[dict[str, Any]] | None:
    """One row per image of a batch whose shown `output` is a YOLO head over the input's grid, else None."""
    from trtopt.metrics.compare import image_hw
    from trtopt.metrics.task import yolo_format
    from trtopt.metrics.yolo import decode

    hw = image_hw(feeds)
    found = yolo_format(np.asarray(output), hw) if hw is not None else None
    if found is None or hw is None:
        return None
    rows = []
    for found_boxes in decode(np.asarray(output, np.float32), found, hw):
        order = np.argsort(-found_boxes.scores, kind="stable")
        boxes = [{"label": _label(int(found_boxes.classes[i]), labels), "class": int(found_boxes.classes[i]),
                  "score": float(found_boxes.scores[i]), "box": [round(float(v), 1) for v in found_boxes.boxes[i]]}
                 for i in order]  # fmt: skip
        rows.append({"detections": boxes, "text": _text(boxes, found, hw)})
    return rows


def _label(index: int, labels: Sequence[str] | None) -> str:
    return labels[index] if labels is not None and 0 <= index < len(labels) else f"class {index}"


def _text(boxes: list[dict[str, Any]], box_format: str, hw: tuple[int, int]) -> str:
    where = f"({box_format} head; boxes x1, y1, x2, y2 in the {hw[1]}x{hw[0]} model input)"
    if not boxes:
        return f"no detection scoring 0.25 or more {where}"
    shown = ", ".join(f"{b['label']} {b['score']:.2f} [{', '.join(f'{v:g}' for v in b['box'])}]"
                      for b in boxes[:SHOWN])  # fmt: skip
    more = f" and {len(boxes) - SHOWN} more" if len(boxes) > SHOWN else ""
    return f"{len(boxes)} detection{'s' if len(boxes) != 1 else ''}: {shown}{more} {where}"
