"""Derive a `PreprocessSpec` from a model input: size and layout from its shape, dtype from its type.

Layout is read from where the channel dimension (3 or 1) sits in a 4-D shape: ``[N, 3, H, W]`` is NCHW,
``[N, H, W, 3]`` NHWC. Shapes where both positions could be channels (``[N, 3, 3, 3]``, ``[N, 1, 8, 1]``)
are ambiguous and need an explicit layout. The batch dimension may be dynamic; H and W may not. An image
input without a batch axis, ``[3, H, W]`` (torchvision's detection exports), is read as ``[1, 3, H, W]``: NCHW,
each image fed on its own (`trtopt.data.inputs.unbatched_image`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx

from trtopt.data.inputs import image_dims
from trtopt.data.overrides import PreprocessOverrides, check_channel_values
from trtopt.data.preprocess import DTYPES, LAYOUTS, PRESETS, PreprocessSpec
from trtopt.errors import DataError, ShapeError, format_shape

log = logging.getLogger(__name__)

Dim = int | str | None
DEFAULT_PRESET = "imagenet"
DEFAULT_UINT8_PRESET = "raw"


def spec_for_input(
    input_shape: Sequence[Dim],
    dtype: npt.DTypeLike,
    preset: str | PreprocessSpec | None = None,
    *,
    name: str = "input",
    layout: str | None = None,
    resize: int | None = None,
    interpolation: str | None = None,
    color: str | None = None,
    scale: float | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    overrides: PreprocessOverrides | None = None,
) -> PreprocessSpec:
    """The spec that feeds images to model input `name` of `input_shape` and `dtype`.

    `preset` is a name in `PRESETS` or a spec; None means 'imagenet' (torchvision) for float inputs and
    'raw' for uint8 inputs. Keyword overrides left as None keep the preset's value, as do the fields
    `overrides` (the CLI's flags) leaves None; `layout=None` is detected from the shape. Raises
    `ShapeError` for shapes that images cannot fill and `DataError` for dtypes and settings that do not fit.
    """
    if overrides:  # the fields that shape the derivation below; `overrides.apply` sets the rest at the end
        layout, color = layout or overrides.layout, color or overrides.color
        mean = mean if mean is not None else overrides.mean
        std = std if std is not None else overrides.std
    given_dims = list(input_shape)
    dims = image_dims(given_dims)
    layout = detect_layout(given_dims, layout, name=name)
    height, width = _spatial_size(dims, layout, name, unbatched=len(given_dims) == 3)
    channels = dims[1] if layout == "NCHW" else dims[3]
    dtype_name = _image_dtype(dtype, name)
    base = _base_spec(preset, dtype_name)
    if channels == 1 and color in ("RGB", "BGR") and overrides and overrides.color:
        raise DataError(
            f"--color {color} asks for 3 channels, but input {name!r} has 1 (grey).",
            fix="Pass --color L, or leave --color out (1-channel inputs are read as grey).",
        )
    color = _color_for(channels, color if color is not None else base.color, name)
    for field, values in (("mean", mean), ("std", std)):
        if values is not None:
            check_channel_values(field, tuple(values), 1 if color == "L" else 3, name)
    if color == "L" and mean is None:
        mean = _one_channel(base.mean, "mean", name)
    if color == "L" and std is None:
        std = _one_channel(base.std, "std", name)
    given = {
        "resize": resize,
        "interpolation": interpolation,
        "scale": scale,
        "mean": tuple(mean) if mean is not None else None,
        "std": tuple(std) if std is not None else None,
    }
    changes: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    changes.setdefault("resize", _non_square_resize(base, height, width))
    spec = dataclasses.replace(base, crop=(height, width), layout=layout, dtype=dtype_name, color=color, **changes)
    return overrides.apply(spec, name=name, input_shape=given_dims) if overrides else spec


def _non_square_resize(base: PreprocessSpec, height: int, width: int) -> int | None:
    """The shorter side a non-square input's images are resized to where nothing sets it (None: the spec's own).
    ImageNet's shorter side at crop / 0.875 is a square classifier's rule: on a 384 x 320 fingerprint input it
    zoomed a 384 x 320 image 1.37x and cut a quarter of its width off (round 13's hunt). At the input's shorter
    side, an image of the input's size is left as it is, and another is scaled until it covers the input
    (`trtopt.data.resize.resized_size`), then centre-cropped."""
    if height == width or base.resize is not None or base.resize_mode != "shorter":
        return base.resize
    return min(height, width)


def detect_layout(shape: Sequence[Dim], layout: str | None = None, *, name: str = "input") -> str:
    """'NCHW' or 'NHWC' for a 4-D image input, 'NCHW' for one image without a batch axis (``[3, H, W]``);
    `layout` (if given) is checked instead of guessed."""
    dims = image_dims(shape)
    if len(dims) != 4:
        raise ShapeError(
            f"Input {name!r} has shape {format_shape(list(shape))}; images can only feed a 4-D input, [N, C, H, W] or "
            "[N, H, W, C], or one image without a batch axis, [3, H, W].",
            fix="Provide the data as .npy/.npz arrays of the input's shape instead of images.",
        )
    first, last = dims[1] in (1, 3), dims[3] in (1, 3)
    if layout is not None:
        if layout not in LAYOUTS:
            raise DataError(f"Unknown layout {layout!r} for input {name!r}.", fix="Use NCHW or NHWC.")
        if not (first if layout == "NCHW" else last):
            raise ShapeError(
                f"Layout {layout} puts the channels of input {name!r} (shape {format_shape(list(shape))}) at a "
                f"dimension of size {dims[1] if layout == 'NCHW' else dims[3]}; images have 3 (RGB/BGR) or 1 (grey).",
                fix="Check --layout, or pass the model's real input size with --shapes.",
            )
        return layout
    if first and last:
        raise ShapeError(
            f"Cannot tell the layout of input {name!r} (shape {format_shape(list(shape))}): dimensions 1 and 3 could "
            "both be the channel dimension.",
            fix="Pass --layout NCHW or --layout NHWC.",
        )
    if not (first or last):
        raise ShapeError(
            f"Input {name!r} (shape {format_shape(list(shape))}) has no channel dimension of size 3 or 1 at position 1 "
            "(NCHW) or 3 (NHWC), so it does not look like an image input.",
            fix="Fix dynamic dimensions with --shapes (e.g. --shapes "
            f"{name}:1x3x224x224), or feed .npy/.npz arrays instead of images.",
        )
    return "NCHW" if first else "NHWC"


def _spatial_size(dims: list[Dim], layout: str, name: str, *, unbatched: bool = False) -> tuple[int, int]:
    height, width = (dims[2], dims[3]) if layout == "NCHW" else (dims[1], dims[2])
    if not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in (height, width)):
        channels = 3 if (dims[1] if layout == "NCHW" else dims[3]) == 3 else 1
        example = f"1x{channels}x224x224" if layout == "NCHW" else f"1x224x224x{channels}"
        example = example[2:] if unbatched else example
        shown = format_shape(dims[1:] if unbatched else dims)
        raise ShapeError(
            f"Input {name!r} has a dynamic height or width (shape {shown}); images need a fixed size "
            "to be resized and cropped to.",
            fix=f"Set it with --shapes {name}:{example} (your model's real size).",
        )
    return int(height), int(width)  # type: ignore[arg-type]


def _image_dtype(dtype: npt.DTypeLike, name: str) -> str:
    try:
        dtype_name = np.dtype(dtype).name
    except TypeError:  # onnx-graphsurgeon keeps ONNX's enum for types numpy lacks: 16 is bfloat16
        enum = dtype if isinstance(dtype, int) else None
        dtype_name = onnx.helper.tensor_dtype_to_string(enum).split(".")[-1].lower() if enum else str(dtype)
    if dtype_name not in DTYPES:
        numpy_has_it = not isinstance(dtype, int)
        raise DataError(
            f"Input {name!r} has dtype {dtype_name}; images can be preprocessed to {', '.join(DTYPES)} only.",
            fix="Provide the data as .npy/.npz arrays with the input's dtype instead of images." if numpy_has_it else
            f"numpy has no {dtype_name} type, so no data can be fed to this input: re-export the model with a float32 "
            f"input and a Cast to {dtype_name} as its first node (trtopt calibrates such models on a float32 copy).",
        )  # fmt: skip
    return dtype_name


def _base_spec(preset: str | PreprocessSpec | None, dtype_name: str) -> PreprocessSpec:
    if isinstance(preset, PreprocessSpec):
        return preset
    if preset is None:
        preset = DEFAULT_UINT8_PRESET if dtype_name == "uint8" else DEFAULT_PRESET
        log.info("No preprocessing preset given; using %r (choose one of: %s)", preset, ", ".join(PRESETS))
    return PRESETS.get(preset)


def _color_for(channels: Dim, color: str, name: str) -> str:
    if channels == 1:
        if color not in ("L", "RGB"):  # RGB is every preset's default; a 1-channel input means grey
            raise DataError(
                f"Input {name!r} has 1 channel but the preprocessing asks for color {color!r}.",
                fix="Use color 'L' (grey) for single-channel inputs.",
            )
        return "L"
    if color == "L":
        raise DataError(
            f"Input {name!r} has 3 channels but the preprocessing asks for grey ('L').",
            fix="Use color 'RGB' or 'BGR'.",
        )
    return color


def _one_channel(values: tuple[float, ...], field: str, name: str) -> tuple[float, ...]:
    if len(set(values)) == 1:
        return values[:1]
    raise DataError(
        f"Input {name!r} has 1 (grey) channel, but the preset's {field} has a different value per RGB "
        f"channel ({list(values)}).",
        fix="Pass one mean and one std value for grey inputs (e.g. --mean 0.5 --std 0.5).",
    )
