"""The image preprocessing flags, declared once for every command that turns images into inputs.

`build` and `calibrate` start from `--preset` (or the model's sidecar `<model>.json`) and the flags
replace single fields of it; the result is stored in the plan. `run` and `compare` start from the plan's
stored spec. Values are checked by `trtopt.data.PreprocessOverrides`, whose errors name the flag.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trtopt.data import PreprocessOverrides
    from trtopt.data.config import PreprocessConfig

# Kept literal (not imported from trtopt.data) so that `--help` works without numpy and Pillow.
PRESET_NAMES = "imagenet, tf, inception, efficientnet-lite, caffe, unit, raw"


def add_preprocess_arguments(parser: argparse.ArgumentParser, *, base: str = "preset") -> None:
    """Add the preprocessing group; `base` is "preset" (build, calibrate: with --preset) or "plan" (run, compare)."""
    if base == "preset":
        title = "image preprocessing (stored in the plan; each flag replaces one field of the preset or sidecar)"
        default = "the preset's or sidecar's"
    else:
        title = "image preprocessing (default: what the plan stores; each flag replaces one field of it)"
        default = "the plan's"
    g = parser.add_argument_group(
        title,
        "pipeline: grey/RGB -> resize (--resize-mode shorter: shorter side to --resize, then centre crop --crop; "
        "stretch: to the input size; letterbox: fit inside it, pad with --pad-value) -> [BGR] -> / --scale -> "
        "(x - --mean) / --std -> --layout",
    )
    if base == "preset":
        g.add_argument(
            "--preset",
            default=None,
            help=f"the base recipe: {PRESET_NAMES}. Default: the model's sidecar <model>.json if present, else "
            "what the exporter wrote into the model file (an Ultralytics YOLO export: letterbox, / 255), else "
            "imagenet (raw for uint8 inputs). An explicit --preset replaces the sidecar",
        )
    _add_geometry(g, default)
    _add_values(g, default)


def _add_geometry(g: argparse._ArgumentGroup, default: str) -> None:
    """Which pixels: --resize, --crop, --interpolation."""
    g.add_argument(
        "--resize",
        type=int,
        metavar="N",
        help=f"resize the image's shorter side to N pixels before the centre crop (--resize-mode shorter; default: "
        f"{default}; presets "
        "use crop / 0.875 for a square input, e.g. 256 for 224, and the input's shorter side for another, which "
        "feeds an image of the input's size as it is). Pass the crop size to keep the whole image (a 28x28 model: "
        "--resize 28)",
    )
    g.add_argument(
        "--resize-mode",
        type=str.lower,
        choices=("shorter", "stretch", "letterbox"),
        help="how the image reaches the input's size: shorter (the shorter side to --resize, then a centre crop: "
        "classifiers), stretch (straight to the input size, aspect ratio not kept: PaddleOCR's detector, "
        "PP-PicoDet, many segmenters), letterbox (fit inside, aspect ratio kept, the rest padded: YOLO exports). "
        f"Default: {default} (presets: shorter)",
    )
    g.add_argument(
        "--pad-value",
        type=float,
        metavar="V",
        help=f"letterbox padding as a 0..255 pixel value, normalised like the image (default: {default}; 114 "
        "otherwise, the YOLO convention; 127.5 is zero after (x / 255 - 0.5) / 0.5)",
    )
    g.add_argument(
        "--pad-align",
        type=str.lower,
        choices=("center", "top-left"),
        help="where the letterboxed image sits: center (Ultralytics YOLOv5/v8/11 exports) or top-left (YOLOX, "
        f"PaddleOCR's recogniser; the padding goes to the right and bottom). Default: {default}; center otherwise",
    )
    g.add_argument(
        "--crop",
        metavar="N|HxW",
        help="the model input's height and width, which it must equal: the centre-crop size (--resize-mode "
        "shorter) or the size to stretch or letterbox to (default: the input's size); say it to make the recipe "
        "explicit",
    )
    g.add_argument(
        "--interpolation",
        type=str.lower,
        choices=("bilinear", "bicubic", "nearest"),
        help=f"resampling filter of the resize (default: {default}; presets use bilinear)",
    )


def _add_values(g: argparse._ArgumentGroup, default: str) -> None:
    """What the pixels become: --color, --scale, --mean, --std, --layout."""
    g.add_argument(
        "--color",
        type=str.upper,
        choices=("RGB", "BGR", "L"),
        help=f"channel order: RGB, BGR (Caffe models) or L (one grey channel; chosen for 1-channel inputs). "
        f"Default: {default}",
    )
    g.add_argument(
        "--scale",
        type=float,
        metavar="S",
        help=f"divide the 0..255 pixels by S first: 255 gives 0..1, 1 keeps 0..255 (default: {default}; "
        "imagenet uses 255)",
    )
    g.add_argument(
        "--mean",
        type=float,
        nargs="+",
        metavar="M",
        help=f"subtract after scaling: one value for every channel or one per channel, in --color order "
        f"(default: {default}; imagenet: 0.485 0.456 0.406)",
    )
    g.add_argument(
        "--std",
        type=float,
        nargs="+",
        metavar="S",
        help=f"divide by after subtracting the mean; positive, one value or one per channel (default: {default}; "
        "imagenet: 0.229 0.224 0.225)",
    )
    g.add_argument(
        "--layout",
        type=str.upper,
        choices=("NCHW", "NHWC"),
        help="where the channels go in the input tensor (default: detected from the input's shape; needed when "
        "both could be channels, e.g. 1x3x3x3)",
    )


def overrides_from_args(args: argparse.Namespace) -> PreprocessOverrides:
    """The flags given, validated (a `DataError` names the flag and what it accepts)."""
    from trtopt.data import PreprocessOverrides
    from trtopt.data.overrides import parse_size

    return PreprocessOverrides(
        resize=args.resize,
        crop=parse_size(args.crop, "--crop") if args.crop is not None else None,
        interpolation=args.interpolation,
        color=args.color,
        scale=args.scale,
        mean=tuple(args.mean) if args.mean is not None else None,
        std=tuple(args.std) if args.std is not None else None,
        layout=args.layout,
        resize_mode=args.resize_mode,
        pad_value=args.pad_value,
        pad_align=args.pad_align,
    )


def preprocess_config(args: argparse.Namespace) -> PreprocessConfig:
    """--preset and the single-field flags, for the commands that build or calibrate from images."""
    from trtopt.data.config import PreprocessConfig

    return PreprocessConfig(preset=args.preset, overrides=overrides_from_args(args))
