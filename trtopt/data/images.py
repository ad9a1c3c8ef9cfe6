"""Read image files into 8-bit RGB robustly: every common format and pixel mode, EXIF orientation honoured.

Decisions, so that calibration sees what a person looking at the file sees:

* **Orientation.** The EXIF Orientation tag is applied (`PIL.ImageOps.exif_transpose`); phone photos are
  stored sideways and say so only there.
* **Alpha** (RGBA, LA, PA, P with a transparent colour, premultiplied RGBa/La) is composited onto
  **white**, the way browsers and viewers show it. Dropping the alpha channel instead would expose whatever
  colour happens to be stored under fully transparent pixels (often black or leftover garbage).
* **16-bit** greyscale (I;16, I;16B, I;16L, I;16N, and 32-bit "I" whose values fit in 0..65535, which is
  how Pillow stores 16-bit PNG/TIFF) is **rescaled**, ``round(v * 255 / 65535)`` (0 -> 0, 32768 -> 128,
  65535 -> 255), never clipped. An "I" image with values outside 0..65535 is min-max stretched to 0..255.
* **Float "F"** images: values in [0, 1] are multiplied by 255; values in [0, 255] are rounded as they
  are; anything else is min-max stretched. NaN and infinities become 0.
* Grey (L), 1-bit and CMYK use Pillow's own conversions; GIF/WebP/TIFF with several frames give the first.

Truncated files are errors: `PIL.ImageFile.LOAD_TRUNCATED_IMAGES` is left False and every image is fully
decoded (`img.load()`) inside `read_image`, so a cut-off JPEG raises here instead of yielding grey rows.
"""

from __future__ import annotations

import io
import logging
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from trtopt.data.limits import check_image_size
from trtopt.errors import DataError, UnreadableFileError

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS: tuple[str, ...] = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif")


# What Pillow raises for unreadable, corrupt or hostile files (UnidentifiedImageError is an OSError).
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, MemoryError, Image.DecompressionBombError)
_SIXTEEN_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N")
_ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa", "La")
_WHITE = (255, 255, 255, 255)


# (upright width, upright height) -> the smallest (width, height) the caller needs, upright too.
DraftSize = Callable[[int, int], tuple[int, int]]
_TRANSPOSED = (5, 6, 7, 8)  # EXIF orientations that swap width and height


def read_image(path: str | os.PathLike[str], *, draft: DraftSize | None = None) -> Image.Image:
    """Decode an image file fully into an 8-bit RGB `PIL.Image`, upright per its EXIF orientation.

    `draft` lets a JPEG decode at a reduced size: given the upright full size, it returns the smallest
    size the caller needs, and libjpeg's DCT-domain scaling (1/2, 1/4 or 1/8; Pillow's `Image.draft`)
    decodes at the smallest scale that keeps at least that much (3x faster on 2880x1920 photos for a
    260 px model). Other formats ignore it. See `trtopt.data.preprocess.preprocess_file`.

    Raises `UnreadableFileError` (a `DataError`) naming the file and the reason when it is missing, a
    directory, not an image, corrupt or truncated.
    """
    path = Path(path)
    return _decode(path, repr(str(path)), draft)


def read_image_bytes(data: bytes, where: str = "the image", *, draft: DraftSize | None = None) -> Image.Image:
    """`read_image` for an image held in memory (an upload), with the same checks, limits and drafting."""
    return _decode(io.BytesIO(data), where, draft)


def _decode(source: Path | io.BytesIO, where: str, draft: DraftSize | None = None) -> Image.Image:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(source) as img:
                check_image_size(img.width, img.height, f"image {where}")  # before decoding a single pixel
                if draft is not None and img.format == "JPEG":
                    _draft(img, draft)
                img.load()  # decode now: truncation and corrupt scans only show up here
                upright = ImageOps.exif_transpose(img)
    except UnreadableFileError:
        raise
    except (*_DECODE_ERRORS, Image.DecompressionBombWarning) as exc:
        raise UnreadableFileError(
            f"Cannot read image {where}: {_reason(exc)}.",
            fix="Replace or delete the file; trtopt reads JPEG, PNG, BMP, WebP, TIFF and GIF images.",
        ) from None
    try:
        return rgb_from_image(upright)
    except DataError as exc:
        raise UnreadableFileError(f"Cannot read image {where}: {exc.what}", fix=exc.fix) from None
    except MemoryError:
        raise UnreadableFileError(f"Cannot read image {where}: out of memory converting it.") from None


def _draft(img: Image.Image, draft: DraftSize) -> None:
    swapped = img.getexif().get(0x0112) in _TRANSPOSED  # 0x0112: Orientation
    width, height = (img.height, img.width) if swapped else img.size
    need_w, need_h = draft(width, height)
    img.draft(None, (need_h, need_w) if swapped else (need_w, need_h))  # None: keep the pixel mode


def check_image_header(path: str | os.PathLike[str]) -> None:
    """Cheap validation without decoding pixels: Pillow identifies the file and `verify()` accepts it.

    Catches empty, non-image, unreadable and many corrupt files; a truncated JPEG passes and is only
    caught by `read_image`. Raises `UnreadableFileError` with the reason.
    """
    path = Path(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                check_image_size(img.width, img.height, f"image {str(path)!r}")
                img.verify()
    except UnreadableFileError:
        raise
    except (*_DECODE_ERRORS, Image.DecompressionBombWarning) as exc:
        raise UnreadableFileError(
            f"Cannot read image {str(path)!r}: {_reason(exc)}.",
            fix="Replace or delete the file; trtopt reads JPEG, PNG, BMP, WebP, TIFF and GIF images.",
        ) from exc


def rgb_from_image(img: Image.Image) -> Image.Image:
    """Convert any Pillow mode to 8-bit RGB following the decisions in the module docstring."""
    mode = img.mode
    if mode == "RGB":
        return img
    if mode == "P" and "transparency" in img.info:
        return _composite_on_white(img.convert("RGBA"))
    if mode in _ALPHA_MODES:
        return _composite_on_white(img.convert("RGBA"))
    if mode in _SIXTEEN_BIT_MODES or mode.startswith("I"):
        return _rgb_from_grey(_eight_bit_from_integer(np.asarray(img)))
    if mode == "F":
        return _rgb_from_grey(_eight_bit_from_float(np.asarray(img)))
    try:
        return img.convert("RGB")
    except ValueError as exc:
        raise UnreadableFileError(
            f"Cannot convert an image with pixel mode {mode!r} to RGB: {exc}.",
            fix="Save it as 8-bit RGB or greyscale (e.g. PNG or JPEG) and try again.",
        ) from exc


def _composite_on_white(rgba: Image.Image) -> Image.Image:
    background = Image.new("RGBA", rgba.size, _WHITE)
    return Image.alpha_composite(background, rgba).convert("RGB")


def _eight_bit_from_integer(values: np.ndarray) -> np.ndarray:
    values = values.astype(np.int64)
    if values.size == 0 or (values.min() >= 0 and values.max() <= 65535):
        return np.rint(values * (255.0 / 65535.0)).astype(np.uint8)
    log.debug("Integer image outside 0..65535 (min %d, max %d); stretching", values.min(), values.max())
    return _stretch(values.astype(np.float64))


def _eight_bit_from_float(values: np.ndarray) -> np.ndarray:
    values = np.where(np.isfinite(values), values, 0.0).astype(np.float64)
    if values.size == 0:
        return values.astype(np.uint8)
    low, high = float(values.min()), float(values.max())
    if low >= 0.0 and high <= 1.0:
        return np.rint(values * 255.0).astype(np.uint8)
    if low >= 0.0 and high <= 255.0:
        return np.rint(values).astype(np.uint8)
    return _stretch(values)


def _stretch(values: np.ndarray) -> np.ndarray:
    low, high = float(values.min()), float(values.max())
    if high == low:
        return np.zeros(values.shape, np.uint8)
    return np.rint((values - low) * (255.0 / (high - low))).astype(np.uint8)


def _rgb_from_grey(grey: np.ndarray) -> Image.Image:
    return Image.fromarray(np.ascontiguousarray(grey, dtype=np.uint8)).convert("RGB")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, IsADirectoryError):
        return "it is a directory, not a file"
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, PermissionError):
        return "permission denied"
    if isinstance(exc, MemoryError):
        return "out of memory decoding it"
    if isinstance(exc, Image.UnidentifiedImageError):
        return "not an image Pillow can identify (empty, corrupt, or another file type)"
    text = str(exc).strip() or type(exc).__name__
    return text.rstrip(".")
