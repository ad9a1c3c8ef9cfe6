"""How an image becomes the model's height x width: three resize modes, as geometry on sizes.

- ``shorter`` (torchvision's evaluation transform, classifiers): the shorter side to `resize`, then a
  centre crop of the input size.
- ``stretch`` (``cv2.resize(img, (W, H))``: PaddleOCR's text detector, PP-PicoDet / PP-YOLOE exports,
  many segmentation models): straight to the input size, the aspect ratio not kept.
- ``letterbox`` (YOLO exports): scaled to fit inside the input size with the aspect ratio kept, the rest
  padded with a constant pixel value. The ratio is ``min(H / h, W / w)``, upscaling allowed, the new size
  ``round(w * r) x round(h * r)`` (Ultralytics `LetterBox`, ultralytics/data/augment.py, whose
  exported-model inference pads with 114 and centres the image); YOLOX's `preproc`
  (yolox/data/data_augment.py) and PaddleOCR's recogniser (`resize_norm_img`) put the image at the top-left
  instead, which `pad_align="top-left"` selects.

Centring splits odd padding as Ultralytics does: ``top = round(dh - 0.1)`` for ``dh = (H - h') / 2``, so the
extra row goes to the bottom (and the extra column to the right).
"""

from __future__ import annotations

RESIZE_MODES = ("shorter", "stretch", "letterbox")
PAD_ALIGNS = ("center", "top-left")


def resized_size(width: int, height: int, short: int, crop_hw: tuple[int, int]) -> tuple[int, int]:
    """(width, height) after scaling the shorter side to `short` (torchvision's rule: the longer side is
    truncated, ``int(short * long / short_side)``), enlarged if needed so the crop fits."""
    crop_h, crop_w = crop_hw
    if width <= height:
        new_w, new_h = short, int(short * height / width)
    else:
        new_w, new_h = int(short * width / height), short
    if new_w < crop_w or new_h < crop_h:
        factor = max(crop_w / width, crop_h / height)
        new_w, new_h = max(crop_w, round(width * factor)), max(crop_h, round(height * factor))
    return new_w, new_h


def letterbox_size(width: int, height: int, box_hw: tuple[int, int]) -> tuple[int, int]:
    """(width, height) of the image scaled to fit inside `box_hw` (height, width) with its aspect ratio."""
    box_h, box_w = box_hw
    ratio = min(box_h / height, box_w / width)
    return max(1, min(box_w, round(width * ratio))), max(1, min(box_h, round(height * ratio)))


def letterbox_offset(size: tuple[int, int], box_hw: tuple[int, int], align: str) -> tuple[int, int]:
    """(left, top) where the scaled image of `size` (width, height) sits inside `box_hw`."""
    if align == "top-left":
        return 0, 0
    dw, dh = (box_hw[1] - size[0]) / 2, (box_hw[0] - size[1]) / 2
    return int(round(dw - 0.1)), int(round(dh - 0.1))


def target_size(width: int, height: int, mode: str, short: int, crop_hw: tuple[int, int]) -> tuple[int, int]:
    """(width, height) that an image of `width` x `height` is resized to before it is cropped or padded."""
    if mode == "stretch":
        return crop_hw[1], crop_hw[0]
    if mode == "letterbox":
        return letterbox_size(width, height, crop_hw)
    return resized_size(width, height, short, crop_hw)
