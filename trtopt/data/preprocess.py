"""Image preprocessing as data: a frozen `PreprocessSpec`, named presets, and one deterministic pipeline.

The pipeline (torchvision's evaluation transform, done with Pillow, by default):

    RGB (or L) -> resize shorter side to `resize` -> centre crop `crop` -> [BGR] -> / scale
    -> (x - mean) / std -> NCHW/NHWC sample -> dtype

`resize_mode` replaces the first two steps for models that are not classifiers (`trtopt.data.resize`):
"stretch" resizes straight to the crop size, "letterbox" fits the image inside it, aspect ratio kept, and
pads the rest with `pad_value` (a 0..255 pixel value, so padding goes through the same normalisation), the
image centred or at the top-left (`pad_align`).

`resize=None` means ``round(max(crop) / 0.875)`` (224 -> 256, the ImageNet evaluation convention). If the
resized image would still be smaller than the crop in one dimension (a very wide image with a tall crop),
it is scaled up just enough to cover the crop instead of being padded. Arithmetic runs in float64 and is
cast once at the end, so results are exact to the output dtype's rounding.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
from PIL import Image

from trtopt.data.images import DraftSize, read_image, read_image_bytes, rgb_from_image
from trtopt.data.limits import check_image_size, check_resized_size
from trtopt.data.resize import PAD_ALIGNS, RESIZE_MODES, letterbox_offset, target_size
from trtopt.data.resize import resized_size as resized_size
from trtopt.errors import DataError
from trtopt.registry import Registry

ImageLike = Image.Image | str | os.PathLike | bytes | np.ndarray

INTERPOLATIONS = {
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "nearest": Image.Resampling.NEAREST,
}
COLORS = ("RGB", "BGR", "L")
LAYOUTS = ("NCHW", "NHWC")
DTYPES = ("float32", "float16", "uint8")
CROP_FRACTION = 0.875  # 224 / 256: the centre-crop fraction of the ImageNet evaluation recipe


@dataclass(frozen=True)
class PreprocessSpec:
    """How to turn an image into one model input sample. Every field is validated on construction.

    `mean` and `std` are in the order of the output channels (BGR for `color="BGR"`); one value applies
    to every channel. For `dtype="uint8"` the pixels are fed raw, so scale, mean and std must be neutral.
    """

    crop: int | tuple[int, int] = 224  # (height, width); an int means a square, stored as (n, n)
    resize: int | None = None  # shorter side before cropping; None: round(max(crop) / 0.875)
    interpolation: str = "bilinear"
    color: str = "RGB"  # "RGB", "BGR" or "L" (one grey channel)
    scale: float = 1.0  # pixels (0..255) are divided by this first
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    layout: str = "NCHW"
    dtype: str = "float32"
    resize_mode: str = "shorter"  # "shorter" (then centre crop), "stretch" or "letterbox" (trtopt.data.resize)
    pad_value: float = 114.0  # letterbox padding, a 0..255 pixel value (YOLO exports pad with 114)
    pad_align: str = "center"  # letterbox: "center" (Ultralytics) or "top-left" (YOLOX, PaddleOCR)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "crop", _check_crop(self.crop))
        if self.resize is not None:
            set_(self, "resize", _check_positive_int("resize", self.resize))
        _check_choice("interpolation", self.interpolation, tuple(INTERPOLATIONS))
        _check_choice("color", self.color, COLORS)
        _check_choice("layout", self.layout, LAYOUTS)
        _check_choice("dtype", self.dtype, DTYPES)
        _check_resize_mode(self)
        set_(self, "scale", _check_positive_float("scale", self.scale))
        set_(self, "mean", _check_channels("mean", self.mean, self.channels))
        set_(self, "std", _check_channels("std", self.std, self.channels))
        if any(s == 0.0 for s in self.std):
            _fail("std", self.std, "non-zero values (pixels are divided by std)")
        if self.dtype == "uint8" and (self.scale != 1.0 or any(self.mean) or any(s != 1.0 for s in self.std)):
            raise DataError(
                f"Preprocessing spec has dtype 'uint8' but normalises pixels (scale {self.scale}, mean "
                f"{list(self.mean)}, std {list(self.std)}); uint8 inputs take raw 0..255 pixels.",
                fix="Use preset 'raw' (scale 1, mean 0, std 1) or a float dtype.",
            )

    @property
    def crop_hw(self) -> tuple[int, int]:
        crop = self.crop
        return (crop, crop) if isinstance(crop, int) else crop

    @property
    def resize_short(self) -> int:
        """The shorter side before cropping, with `resize=None` resolved."""
        return self.resize if self.resize is not None else round(max(self.crop_hw) / CROP_FRACTION)

    @property
    def channels(self) -> int:
        return 1 if self.color == "L" else 3

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        """Shape of one preprocessed sample (no batch dimension)."""
        h, w = self.crop_hw
        return (self.channels, h, w) if self.layout == "NCHW" else (h, w, self.channels)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (lists, not tuples); `from_dict(spec.to_dict()) == spec`. Fields of a resize mode
        the spec does not use are left out (so plans of the default mode read as before)."""
        out = asdict(self)
        out["crop"] = list(self.crop_hw)
        out["mean"], out["std"] = list(self.mean), list(self.std)
        if self.resize_mode != "letterbox":
            del out["pad_value"], out["pad_align"]
        if self.resize_mode == "shorter":
            del out["resize_mode"]
        return out

    @classmethod
    def from_dict(cls, data: object, *, where: str = "preprocessing spec") -> PreprocessSpec:
        """Build from `to_dict()` output (e.g. read from a plan file), naming `where` in any error."""
        if not isinstance(data, Mapping):
            raise DataError(
                f"{where}: expected a JSON object of preprocessing fields, received {type(data).__name__}.",
                fix="Store the output of PreprocessSpec.to_dict().",
            )
        valid = [f.name for f in fields(cls)]
        unknown = sorted(str(k) for k in data if k not in valid)
        if unknown:
            raise DataError(
                f"{where}: unknown preprocessing field(s) {unknown}.",
                fix=f"Valid fields: {', '.join(valid)}.",
            )
        kwargs: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        try:
            return cls(**kwargs)
        except DataError as exc:
            raise DataError(f"{where}: {exc.what}", fix=exc.fix) from None


def _fail(name: str, value: object, expected: str) -> NoReturn:
    raise DataError(
        f"Preprocessing spec field {name!r} is {value!r}; expected {expected}.",
        fix=f"Set {name} to {expected}.",
    )


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        _fail(name, value, "one of " + ", ".join(repr(c) for c in choices))


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        _fail(name, value, "a positive integer")
    return int(value)


def _check_positive_float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        _fail(name, value, "a positive number")
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        _fail(name, value, "a positive number")
    return number


def _check_resize_mode(spec: PreprocessSpec) -> None:
    """Check the resize mode and its padding; the padding fields of other modes are reset to defaults."""
    _check_choice("resize_mode", spec.resize_mode, RESIZE_MODES)
    _check_choice("pad_align", spec.pad_align, PAD_ALIGNS)
    pad = spec.pad_value
    if isinstance(pad, bool) or not isinstance(pad, (int, float, np.number)) or not 0 <= float(pad) <= 255:
        _fail("pad_value", pad, "a pixel value from 0 to 255")
    if spec.dtype == "uint8" and pad != int(pad):
        _fail("pad_value", spec.pad_value, "a whole pixel value (0..255) for uint8 inputs")
    if spec.resize_mode != "shorter" and spec.resize is not None:
        _fail("resize", spec.resize, f"None: it sets the shorter side, which resize_mode {spec.resize_mode!r} "
              "does not use")
    if spec.resize_mode != "letterbox":
        pad, align = PreprocessSpec.pad_value, PreprocessSpec.pad_align
    else:
        align = spec.pad_align
    object.__setattr__(spec, "pad_value", float(pad))
    object.__setattr__(spec, "pad_align", align)


def _check_crop(value: object) -> tuple[int, int]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        side = _check_positive_int("crop", value)
        return (side, side)
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return (_check_positive_int("crop", value[0]), _check_positive_int("crop", value[1]))
    _fail("crop", value, "a positive integer or a (height, width) pair")


def _check_channels(name: str, value: object, channels: int) -> tuple[float, ...]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = (value,)
    if not isinstance(value, (tuple, list)) or len(value) not in (1, channels):
        _fail(name, value, f"1 or {channels} numbers (one per output channel)")
    if not all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool) for v in value):
        _fail(name, value, f"1 or {channels} numbers (one per output channel)")
    numbers = tuple(float(v) for v in value)
    if not all(math.isfinite(v) for v in numbers):
        _fail(name, value, "finite numbers")
    return numbers


PRESETS: Registry[PreprocessSpec] = Registry("preprocessing preset")

_IMAGENET_MEAN, _IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# torchvision / timm ImageNet models: https://pytorch.org/vision/stable/models.html
PRESETS.add("imagenet", PreprocessSpec(scale=255.0, mean=_IMAGENET_MEAN, std=_IMAGENET_STD))
# TF-slim Inception / MobileNet preprocessing to [-1, 1]: (x / 255 - 0.5) / 0.5 == (x - 127.5) / 127.5
# (tensorflow/models research/slim/preprocessing/inception_preprocessing.py).
_TF = PreprocessSpec(scale=255.0, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
PRESETS.add("tf", _TF)
PRESETS.add("inception", _TF)
# EfficientNet-Lite: MEAN_RGB = [127.0] * 3, STDDEV_RGB = [128.0] * 3 on 0..255 pixels
# (tensorflow/tpu models/official/efficientnet/lite/efficientnet_lite_builder.py).
PRESETS.add("efficientnet-lite", PreprocessSpec(mean=(127.0, 127.0, 127.0), std=(128.0, 128.0, 128.0)))
# Caffe / Keras "caffe" mode (VGG, ResNet-50 v1 Caffe weights): BGR, per-channel mean subtraction in BGR
# order, no scaling (keras/applications/imagenet_utils.py, _preprocess_numpy_input).
PRESETS.add("caffe", PreprocessSpec(color="BGR", mean=(103.939, 116.779, 123.68)))
PRESETS.add("unit", PreprocessSpec(scale=255.0))  # [0, 1]
PRESETS.add("raw", PreprocessSpec())  # 0..255 as float


def preprocess_image(img: Image.Image, spec: PreprocessSpec) -> np.ndarray:
    """One image -> one sample of `spec.sample_shape` (CHW or HWC) and `spec.dtype`.

    Any Pillow mode is accepted (see `trtopt.data.images`); EXIF orientation is *not* applied here,
    `read_image` does that when it reads a file.
    """
    return _sample_from(img, spec, None)


def preprocess_file(path: str | os.PathLike[str], spec: PreprocessSpec) -> np.ndarray:
    """`preprocess_image(read_image(path), spec)`, decoding a JPEG only as large as the resize needs.

    The resize target is computed from the full upright size, as without drafting; the JPEG is decoded
    at the smallest DCT scale (1/2, 1/4, 1/8) that keeps at least that target (`read_image(draft=...)`),
    then resized exactly to it. On a 2880x1920 photo and a 260 px model this decodes at 720x480, 3x
    faster. The DCT-domain scaling averages pixels slightly differently from Pillow's antialiased resize:
    on 2880x1920 photos the demo model's samples differ by 0.4 level on average (0..255, at most 7). That
    moves some entropy thresholds (25 of 60 by up to 12%: the KL argmin is discontinuous, and swapping one
    photo of 128 moves 2 by up to 6.5%) but not the plan's agreement with FP32 beyond noise (156 vs 155 of
    160 held-out photos; BENCHMARKS.md at 834753b, draft-decoding; issue #18). Images already within 2x of the
    target decode exactly as before.
    """
    return _preprocess_drafted(lambda draft: read_image(path, draft=draft), spec)


def preprocess_encoded(data: bytes, spec: PreprocessSpec, where: str = "the image") -> np.ndarray:
    """`preprocess_file` for an image file held in memory (an upload): the same decoding, drafting and
    limits, so a served plan answers exactly as `trtopt run` on the same file."""
    return _preprocess_drafted(lambda draft: read_image_bytes(data, where, draft=draft), spec)


def _preprocess_drafted(read: Callable[[DraftSize], Image.Image], spec: PreprocessSpec) -> np.ndarray:
    target: list[tuple[int, int]] = []

    def draft(width: int, height: int) -> tuple[int, int]:
        target.append(target_size(width, height, spec.resize_mode, spec.resize_short, spec.crop_hw))
        return target[-1]

    img = read(draft)
    return _sample_from(img, spec, target[-1] if target else None)


def _sample_from(img: Image.Image, spec: PreprocessSpec, size: tuple[int, int] | None) -> np.ndarray:
    img = rgb_from_image(img)
    if spec.color == "L":
        img = img.convert("L")
    img = _resize_and_crop(img, spec, size)
    pixels = np.asarray(img)
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if spec.resize_mode == "letterbox":
        pixels = _pad(pixels, spec)
    if spec.color == "BGR":
        pixels = pixels[:, :, ::-1]
    if spec.dtype == "uint8":
        sample = pixels
    else:
        mean = np.asarray(spec.mean, np.float64)
        std = np.asarray(spec.std, np.float64)
        sample = (pixels.astype(np.float64) / spec.scale - mean) / std
    if spec.layout == "NCHW":
        sample = sample.transpose(2, 0, 1)
    return np.ascontiguousarray(sample, dtype=np.dtype(spec.dtype))


def preprocess_images(images: Sequence[ImageLike], spec: PreprocessSpec) -> np.ndarray:
    """Images (PIL images, file paths, or HWC / HW uint8 arrays) -> one batch `[N, *spec.sample_shape]`;
    files are read with `preprocess_file` (JPEGs decoded only as large as the resize needs)."""
    if isinstance(images, (str, bytes, os.PathLike)) or not isinstance(images, Sequence):
        raise DataError(
            f"Expected a list of images, received {type(images).__name__}.",
            fix="Pass a list of PIL images, file paths or HWC uint8 arrays, e.g. ['cat.jpg'].",
        )
    samples = [_preprocess_any(item, i, spec) for i, item in enumerate(images)]
    if not samples:
        return np.zeros((0, *spec.sample_shape), np.dtype(spec.dtype))
    return np.stack(samples)


def _resize_and_crop(img: Image.Image, spec: PreprocessSpec, size: tuple[int, int] | None) -> Image.Image:
    """`size`: the resize target when the caller computed it from the undrafted image (`preprocess_file`).
    A letterboxed image comes back unpadded (`_pad` pads it)."""
    crop_h, crop_w = spec.crop_hw
    size = size or target_size(img.width, img.height, spec.resize_mode, spec.resize_short, spec.crop_hw)
    check_image_size(img.width, img.height)
    check_resized_size(img.size, size)  # bounds the work per image (trtopt.data.limits)
    if size != img.size:
        img = img.resize(size, INTERPOLATIONS[spec.interpolation])
    if spec.resize_mode != "shorter":
        return img
    # torchvision's CenterCrop offsets: int(round((size - crop) / 2)).
    top = int(round((img.height - crop_h) / 2.0))
    left = int(round((img.width - crop_w) / 2.0))
    return img.crop((left, top, left + crop_w, top + crop_h))


def _pad(pixels: np.ndarray, spec: PreprocessSpec) -> np.ndarray:
    """The letterbox canvas: `pixels` (HWC) placed in a crop-sized frame of `spec.pad_value`."""
    crop_h, crop_w = spec.crop_hw
    height, width = pixels.shape[:2]
    left, top = letterbox_offset((width, height), spec.crop_hw, spec.pad_align)
    dtype = np.uint8 if spec.pad_value == int(spec.pad_value) else np.float64
    canvas = np.full((crop_h, crop_w, pixels.shape[2]), spec.pad_value, dtype)
    canvas[top : top + height, left : left + width] = pixels
    return canvas


def _preprocess_any(item: ImageLike, index: int, spec: PreprocessSpec) -> np.ndarray:
    if isinstance(item, (str, os.PathLike)):
        return preprocess_file(item, spec)  # a file decodes only as large as needed
    if isinstance(item, (bytes, bytearray, memoryview)):
        return preprocess_encoded(bytes(item), spec, f"{index} (encoded bytes)")
    return preprocess_image(_image_from(item, index), spec)


def _image_from(item: ImageLike, index: int) -> Image.Image:
    if isinstance(item, Image.Image):
        return item
    if isinstance(item, (str, os.PathLike, Path)):
        return read_image(item)
    if isinstance(item, np.ndarray):
        ok_shape = item.ndim == 2 or (item.ndim == 3 and item.shape[2] in (1, 3))
        if item.dtype != np.uint8 or not ok_shape:
            raise DataError(
                f"Image {index} is an array of shape {list(item.shape)} and dtype {item.dtype}; expected "
                "an HWC (or HW) uint8 array with 1 or 3 channels.",
                fix="Convert it with np.asarray(pil_image.convert('RGB')) or pass the PIL image or path.",
            )
        grey = item.ndim == 3 and item.shape[2] == 1
        return Image.fromarray(np.ascontiguousarray(item[:, :, 0] if grey else item))
    raise DataError(
        f"Image {index} is a {type(item).__name__}; expected a PIL image, a file path, an image file's bytes "
        "or a uint8 array.",
        fix="Pass PIL.Image objects, str/Path file names, bytes read from image files or HWC uint8 numpy arrays.",
    )
