"""Fidelity figures between an FP32 model's outputs and a quantised plan's (pure numpy): what the build's
self-check records (`agreement`: cosine, relative error, argmax and label-map agreement; `distribution_shift`),
what `trtopt compare` reports per output and per layer (`compare`), the array helpers they share (`arrays`), and
the task-aware metrics:

- `boxes`: detections, IoU, NMS, and box matching (recall of FP32's boxes, precision, F1);
- `yolo`: decoding YOLOv8 / YOLOv5 / YOLOX outputs into detections;
- `maps`: dense score maps (DB text detection, segmentation): cosine and binarised-map IoU;
- `labels`: maps of class ids (a segmenter ending in its own ArgMax): IoU per class, mean IoU;
- `ctc`: greedy CTC decoding and sequence agreement (exact match, normalised edit distance);
- `task`: which task a model's outputs serve (`choose_task`) and its metric (`TaskEvaluator`);
- `hook`: a user's detection decoder loaded from `file.py:function`.
"""

from trtopt.metrics.boxes import BoxAgreement, Detections, box_iou, match_count, nms
from trtopt.metrics.ctc import SequenceAgreement, ctc_greedy, decode_batch, edit_distance, normalized_edit_distance
from trtopt.metrics.labels import LabelAgreement
from trtopt.metrics.maps import DB_THRESHOLD, MapAgreement, binary_iou
from trtopt.metrics.task import TASKS, TaskChoice, TaskConfig, TaskEvaluator, choose_task
from trtopt.metrics.yolo import BOX_FORMATS, DecodeConfig, decode

__all__ = [
    "BOX_FORMATS",
    "DB_THRESHOLD",
    "TASKS",
    "BoxAgreement",
    "DecodeConfig",
    "Detections",
    "LabelAgreement",
    "MapAgreement",
    "SequenceAgreement",
    "TaskChoice",
    "TaskConfig",
    "TaskEvaluator",
    "binary_iou",
    "box_iou",
    "choose_task",
    "ctc_greedy",
    "decode",
    "decode_batch",
    "edit_distance",
    "match_count",
    "nms",
    "normalized_edit_distance",
]
