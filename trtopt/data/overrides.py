"""Preprocessing fields set one by one (the CLI's `--mean`, `--std`, `--resize`, ...), over a preset, a
model's sidecar `<model>.json` or a plan's stored spec.

Precedence: a field given here > the sidecar > the preset (an explicit `--preset` replaces the sidecar as
the base). Each value is validated when the overrides are made, and against the model when they are
applied, and every error names the command-line flag it came from, with what is accepted.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from trtopt.data.inputs import image_dims
from trtopt.data.preprocess import COLORS, INTERPOLATIONS, LAYOUTS, PreprocessSpec
from trtopt.data.resize import PAD_ALIGNS, RESIZE_MODES
from trtopt.errors import DataError

Dim = int | str | None


@dataclass(frozen=True)
class PreprocessOverrides:
    """Fields that replace the base spec's; None keeps the base's value."""

    resize: int | None = None
    crop: tuple[int, int] | None = None  # (height, width)
    interpolation: str | None = None
    color: str | None = None
    scale: float | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    layout: str | None = None
    resize_mode: str | None = None
    pad_value: float | None = None
    pad_align: str | None = None

    def __post_init__(self) -> None:
        if self.resize is not None and self.resize <= 0:
            _fail("--resize", self.resize, "a positive number of pixels (the shorter side before cropping)", "256")
        if self.crop is not None and (len(self.crop) != 2 or min(self.crop) <= 0):
            _fail("--crop", self.crop, "a positive size, N or HxW", "224")
        _check_name("--interpolation", self.interpolation, tuple(INTERPOLATIONS))
        _check_name("--color", self.color, COLORS)
        _check_name("--layout", self.layout, LAYOUTS)
        _check_name("--resize-mode", self.resize_mode, RESIZE_MODES)
        _check_name("--pad-align", self.pad_align, PAD_ALIGNS)
        if self.pad_value is not None and not (math.isfinite(self.pad_value) and 0 <= self.pad_value <= 255):
            _fail("--pad-value", self.pad_value, "a pixel value from 0 to 255 (before --scale/--mean/--std)", "114")
        if self.resize is not None and self.resize_mode not in (None, "shorter"):
            raise DataError(
                f"--resize {self.resize} sets the shorter side before a centre crop, which --resize-mode "
                f"{self.resize_mode} does not do (it resizes to the model's input size).",
                fix="Leave out --resize, or use --resize-mode shorter.",
            )
        if self.scale is not None and not (math.isfinite(self.scale) and self.scale > 0):
            _fail("--scale", self.scale, "a positive number (pixels 0..255 are divided by it; 255 gives 0..1)", "255")
        if self.mean is not None and not all(math.isfinite(v) for v in self.mean):
            _fail("--mean", list(self.mean), "finite numbers", "0.5")
        if self.std is not None and not all(math.isfinite(v) and v > 0 for v in self.std):
            _fail("--std", list(self.std), "positive numbers (pixels are divided by them)", "0.5")
        if self.resize is not None and self.crop is not None and self.resize < max(self.crop):
            raise DataError(
                f"--resize {self.resize} is smaller than --crop {_size(self.crop)}: the image's shorter side is "
                "resized first and the crop is cut from it.",
                fix=f"Pass --resize {max(self.crop)} or more (equal to the crop: no border is cut off).",
            )

    def changes(self) -> dict[str, Any]:
        """The fields that were given, as `PreprocessSpec` keyword arguments."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

    def __bool__(self) -> bool:
        return bool(self.changes())

    def apply(
        self, spec: PreprocessSpec, *, name: str = "input", input_shape: Sequence[Dim] | None = None
    ) -> PreprocessSpec:
        """`spec` with the given fields replaced; `input_shape` (4-D, or [3, H, W]), when known, is checked against
        the crop."""
        changes = self.changes()
        mode = changes.get("resize_mode", spec.resize_mode)
        check_padding_flags(self, mode)
        if mode != "shorter" and "resize" not in changes:
            changes["resize"] = None  # a preset's or sidecar's shorter side means nothing to the other modes
        color = changes.get("color", spec.color)
        channels = 1 if color == "L" else 3
        for field in ("mean", "std"):
            values = changes.get(field, getattr(spec, field))
            if field in changes or len(values) not in (1, channels):
                check_channel_values(field, values, channels, name)
        result = dataclasses.replace(spec, **changes)
        if input_shape is not None:
            check_crop_fits(self.crop, result, input_shape, name)
        if self.resize is not None and mode != "shorter":
            raise DataError(
                f"--resize {self.resize} sets the shorter side before a centre crop, but the resize mode is "
                f"{mode} (from the preset, sidecar or plan), which resizes to the model's input size.",
                fix="Leave out --resize, or pass --resize-mode shorter with it.",
            )
        if self.resize is not None and self.resize < max(result.crop_hw):
            raise DataError(
                f"--resize {self.resize} is smaller than the crop {_size(result.crop_hw)} (input {name!r}): the "
                "image's shorter side is resized first and the crop is cut from it.",
                fix=f"Pass --resize {max(result.crop_hw)} or more.",
            )
        return result


def check_padding_flags(overrides: PreprocessOverrides, mode: str) -> None:
    """--pad-value and --pad-align only mean something to a letterbox resize."""
    flags = (("--pad-value", overrides.pad_value), ("--pad-align", overrides.pad_align))
    given = [flag for flag, value in flags if value is not None]
    if given and mode != "letterbox":
        raise DataError(
            f"{' and '.join(given)} set(s) the padding of a letterbox resize, but the resize mode is {mode}, "
            "which pads nothing.",
            fix="Add --resize-mode letterbox (keep the aspect ratio, pad the rest), or leave the padding flags out.",
        )


def refuse_for_multi_input(names: Sequence[str]) -> NoReturn:
    """Image preprocessing flags given for a model that images cannot feed (several inputs)."""
    raise DataError(
        f"Preprocessing flags (--preset, --resize, --mean, ...) turn images into one input, but the model has "
        f"{len(names)} inputs ({', '.join(names)}), which take .npy/.npz data as it is.",
        fix="Leave the preprocessing flags out and preprocess the arrays before saving them: np.savez(file, "
        + ", ".join(f"{n}=..." for n in names) + ").",
    )


def check_channel_values(field: str, values: Sequence[float], channels: int, name: str) -> None:
    """`mean` / `std` hold one value for every channel or one per channel."""
    if len(values) in (1, channels):
        return
    if channels == 1:
        kind, accepted, example = "1 (grey) channel", "1 value", "0.5"
    else:
        kind, example = f"{channels} channels", "0.5 0.5 0.5"
        accepted = f"1 value (for every channel) or {channels} (one per channel, in the order of --color)"
    raise DataError(
        f"--{field} has {len(values)} values ({list(values)}), but input {name!r} has {kind}; --{field} takes "
        f"{accepted}.",
        fix=f"Pass e.g. --{field} {example}.",
    )


def check_crop_fits(crop: tuple[int, int] | None, spec: PreprocessSpec, input_shape: Sequence[Dim], name: str) -> None:
    """The crop is the model input's height and width: a --crop that differs cannot feed it."""
    dims = image_dims(input_shape)
    height, width = (dims[2], dims[3]) if spec.layout == "NCHW" else (dims[1], dims[2])
    if crop is None or not (isinstance(height, int) and isinstance(width, int)) or crop == (height, width):
        return
    raise DataError(
        f"--crop {_size(crop)} does not fit input {name!r}, which takes {height}x{width} images (layout "
        f"{spec.layout}): the crop is the size of the image the model sees.",
        fix=f"Pass --crop {_size((height, width))} (or leave it out), and choose how much border to cut off "
        "with --resize.",
    )


def parse_size(text: str, flag: str) -> tuple[int, int]:
    """'28' -> (28, 28); '224x192' -> (224, 192) (height x width)."""
    parts = text.lower().split("x")
    if len(parts) in (1, 2) and all(p.strip().isdigit() for p in parts):
        numbers = [int(p) for p in parts]
        if min(numbers) > 0:
            return (numbers[0], numbers[-1])
    _fail(flag, text, "a positive size in pixels, N (a square) or HxW (height x width)", "224 or 224x192")


def _check_name(flag: str, value: str | None, valid: tuple[str, ...]) -> None:
    if value is not None and value not in valid:
        _fail(flag, value, "one of " + ", ".join(valid), valid[0])


def _fail(flag: str, value: object, expected: str, example: str) -> NoReturn:
    raise DataError(f"{flag} {value!r} is not accepted: it takes {expected}.", fix=f"Pass e.g. {flag} {example}.")


def _size(hw: tuple[int, int]) -> str:
    return str(hw[0]) if hw[0] == hw[1] else f"{hw[0]}x{hw[1]}"
