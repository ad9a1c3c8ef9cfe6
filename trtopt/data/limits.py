"""Bounds on the work one image may cause (issue #15): decoded pixels, aspect ratio, pixels after resizing.

A 168-byte PNG of 30000x1 pixels decodes cheaply, but resizing its shorter side to 256 makes it
7,680,000x256 pixels (5.9 GB as RGB). Such files are refused as unreadable (`UnreadableFileError`), so a
data set skips them with the reason, like any other bad file, and a service answers 400.
"""

from __future__ import annotations

from trtopt.errors import UnreadableFileError

# Pillow's own decompression-bomb threshold (PIL.Image.MAX_IMAGE_PIXELS): about 89.5 megapixels.
MAX_IMAGE_PIXELS = 89_478_485
# Longest side / shortest side. Panoramas reach 10:1; a 100:1 "image" is a strip or an attack.
MAX_ASPECT_RATIO = 100
# Pixels after the resize step of preprocessing (before the crop): 32 megapixels (e.g. 8192x4096).
MAX_RESIZED_PIXELS = 2**25

_FIX = "Replace or delete the file (it is skipped like any unreadable file), or crop or resize it first."


def check_image_size(width: int, height: int, where: str = "image") -> None:
    """Refuse decoded sizes past `MAX_IMAGE_PIXELS` or `MAX_ASPECT_RATIO` before any pixel is decoded."""
    if width <= 0 or height <= 0:
        raise UnreadableFileError(f"Cannot read {where}: it has no pixels ({width}x{height}).", fix=_FIX)
    if width * height > MAX_IMAGE_PIXELS:
        raise UnreadableFileError(
            f"Cannot read {where}: {width}x{height} is {width * height:,} pixels, more than the limit of "
            f"{MAX_IMAGE_PIXELS:,} (a decompression bomb, or a far larger image than a model needs).",
            fix=_FIX,
        )
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        raise UnreadableFileError(
            f"Cannot read {where}: {width}x{height} pixels has an aspect ratio over {MAX_ASPECT_RATIO}:1, which "
            "resizing to the model's input would blow up to millions of pixels.",
            fix=_FIX,
        )


def check_resized_size(size: tuple[int, int], resized: tuple[int, int]) -> None:
    """Refuse a resize plan whose result exceeds `MAX_RESIZED_PIXELS` (the resize would allocate it)."""
    new_w, new_h = resized
    if new_w * new_h > MAX_RESIZED_PIXELS:
        raise UnreadableFileError(
            f"An image of {size[0]}x{size[1]} pixels would be resized to {new_w}x{new_h} "
            f"({new_w * new_h:,} pixels, limit {MAX_RESIZED_PIXELS:,}) before cropping.",
            fix=_FIX,
        )
