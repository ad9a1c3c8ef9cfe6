"""Preprocessing an exporter writes into the model file, read where no --preset, flag or sidecar says it.

Ultralytics' ONNX exports (YOLOv5u/v8/11 detectors, segmenters, pose and OBB models, classifiers) record who made
them and for what in the model's `metadata_props`: `author` "Ultralytics", `task` ("detect", "segment", "pose",
"obb", "classify") and `imgsz` ("[640, 640]"). How their predictor feeds an image follows from the task, read in
ultralytics 8.4 (`ultralytics/engine/predictor.py`, `BasePredictor.preprocess` and `pre_transform`;
`ultralytics/data/augment.py`, `LetterBox` and `classify_transforms`):

- detection, segmentation, pose, OBB: BGR decoded, flipped to RGB, letterboxed to `imgsz` (scaled to fit,
  centred, padded with 114), divided by 255, no mean or std, NCHW;
- classification: the shorter side resized to `imgsz`, centre-cropped, divided by 255 (`DEFAULT_MEAN` 0,
  `DEFAULT_STD` 1).

ImageNet's mean and std, trtopt's default guess for an RGB input, would feed such a model values in [-2.1, 2.6]
where it was trained on [0, 1]: calibration ranges, verification and `trtopt run`'s detections would all be
measured on inputs the model never sees.
"""

from __future__ import annotations

import ast
import logging
from functools import lru_cache
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ULTRALYTICS = "Ultralytics"
LETTERBOXED = ("detect", "segment", "pose", "obb")


def embedded_recipe(model_path: Path, input_shape: tuple[Any, ...]) -> tuple[dict[str, Any], str] | None:
    """The preprocessing fields (`trtopt.data.PreprocessSpec.from_dict`) the model file's exporter metadata
    implies, and where they come from in words; None where it says nothing trtopt reads. `input_shape`: the
    image input's shape, NCHW (its static height and width win over the metadata's `imgsz`)."""
    props = metadata_props(model_path)
    if props.get("author") != ULTRALYTICS:
        return None
    task = props.get("task", "detect")
    size = _image_size(props.get("imgsz"), input_shape)
    if size is None or task not in (*LETTERBOXED, "classify"):
        log.info("%s: Ultralytics metadata with task %r and imgsz %r: not read", model_path.name, task,
                 props.get("imgsz"))  # fmt: skip
        return None
    fields: dict[str, Any] = {"crop": list(size), "color": "RGB", "scale": 255.0, "mean": [0.0], "std": [1.0],
                              "layout": "NCHW", "interpolation": "bilinear"}  # fmt: skip
    if task == "classify":
        fields |= {"resize": min(size), "resize_mode": "shorter"}
        how = "shorter side resized, centre crop"
    else:
        fields |= {"resize_mode": "letterbox", "pad_value": 114.0, "pad_align": "center"}
        how = "letterboxed, padded with 114"
    return fields, f"the model file's Ultralytics metadata (task {task}: {how}, / 255)"


def embedded_labels(model_path: Path) -> list[str] | None:
    """The class names an Ultralytics export writes as `names` ("{0: 'person', 1: 'bicycle', ...}"), in index
    order; None where there are none or they do not number 0, 1, 2, ..."""
    props = metadata_props(model_path)
    if props.get("author") != ULTRALYTICS or not props.get("names"):
        return None
    try:
        names = ast.literal_eval(props["names"])
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):  # what literal_eval raises
        return None
    if not isinstance(names, dict) or set(names) != set(range(len(names))):  # keys 0..n-1, whatever their kinds
        return None
    return [str(names[i]) for i in range(len(names))]


def metadata_props(model_path: Path) -> dict[str, str]:
    """The model file's `metadata_props` as a dict ({} where it cannot be read: the loader reports that)."""
    try:
        stat = model_path.stat()
    except OSError:
        return {}
    return dict(_read_props(str(model_path), stat.st_mtime_ns, stat.st_size))


@lru_cache(maxsize=8)
def _read_props(path: str, mtime_ns: int, size: int) -> tuple[tuple[str, str], ...]:
    """Read once per file version: a build asks for the recipe, the labels and where the recipe came from."""
    import onnx

    try:
        model = onnx.load(path, load_external_data=False)
    except Exception:  # noqa: BLE001 - a file the loader refused never gets here; anything else: no metadata
        return ()
    return tuple((p.key, p.value) for p in model.metadata_props)


def _image_size(imgsz: str | None, input_shape: tuple[Any, ...]) -> tuple[int, int] | None:
    """(height, width): the input's static spatial dims, else the metadata's `imgsz` ("[640, 640]" or "640")."""
    dims = input_shape[-2:] if len(input_shape) == 4 else ()
    if len(dims) == 2 and all(isinstance(d, int) and d > 0 for d in dims):
        return int(dims[0]), int(dims[1])
    try:
        value = ast.literal_eval(imgsz) if imgsz else None
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):  # what literal_eval raises
        return None
    if isinstance(value, int):
        value = [value, value]
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) and v > 0 for v in value):
        return int(value[0]), int(value[1])
    return None
