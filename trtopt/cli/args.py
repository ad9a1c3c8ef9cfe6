"""Argument groups declared once and shared by the commands, each turned into its stage's config.

`build`, `calibrate` and `optimize` take the graph flags; `build` and `calibrate` the calibration flags;
`build` the quantisation, backend and verification flags (each backend declares its own, see
`trtopt.backend.base.Backend.add_arguments`). A flag left out is None, and None means the config's
default, so every default is written once, in its config. Shaped after Polygraphy's `tools/args` (an
argument group class per concern that parses into the loader's settings), without its class hierarchy.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trtopt.backend import BackendOptions
    from trtopt.calib import CalibConfig
    from trtopt.data.config import DataConfig
    from trtopt.passes.config import GraphConfig
    from trtopt.quant import QuantConfig
    from trtopt.verify import VerifyConfig


def add_graph_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("graph")
    g.add_argument(
        "--shapes",
        nargs="+",
        action="extend",
        metavar="NAME:DxDxD",
        help="concrete input shapes for dynamic dimensions, e.g. input:1x3x224x224 (repeatable); a first dimension "
        "N keeps the model's batch (input:Nx3x224x224: a dynamic batch stays dynamic); where --calib is one "
        ".npz/.npy file, sizes left open here come from its arrays",
    )
    g.add_argument(
        "--passes", default=None, help="comma-separated optimiser passes to run, in this order (default: all; '': none)"
    )


def graph_config(args: argparse.Namespace) -> GraphConfig:
    from trtopt.passes.config import GraphConfig

    return GraphConfig.from_text(args.shapes, args.passes)


def add_calibration_arguments(parser: argparse.ArgumentParser, *, build: bool) -> None:
    """The data and threshold flags; `build` adds the cache flags and makes --calib optional."""
    from trtopt.calib.config import DEFAULT_METHOD, DEFAULT_PERCENTILE
    from trtopt.calib.thresholds import METHODS
    from trtopt.data.config import DEFAULT_BATCH

    g = parser.add_argument_group("calibration")
    g.add_argument("--calib", nargs="+", required=not build, metavar="PATH",
                   help="calibration images / .npy / .npz (folders or files)")  # fmt: skip
    if build:
        g.add_argument("--calib-cache", type=Path,
                       help="reuse thresholds from a trtopt, TensorRT or ONNX Runtime cache")  # fmt: skip
        g.add_argument("--save-cache", type=Path, help="also write the thresholds to this trtopt cache (JSON)")
    g.add_argument("--calib-count", type=int, help="use the first N calibration samples (default: all)")
    g.add_argument("--calib-batch", type=int, help=f"calibration batch size (default {DEFAULT_BATCH})")
    g.add_argument("--workers", type=int, metavar="N", help="threads that decode and preprocess calibration images "
                   "ahead of inference (default: up to 4, at most the CPUs)")  # fmt: skip
    methods = ", ".join(METHODS.names())  # the registry: a method registered anywhere is listed here
    g.add_argument(
        "--method",  # checked by CalibConfig against the same registry: an unknown name lists the valid ones
        metavar="METHOD",
        help=f"activation threshold method: {methods} (default {DEFAULT_METHOD}: per tensor, the candidate among "
        "entropy, mse, percentile and max that least changes the layers reading it, scored on a few held-back "
        "calibration samples). One method for every tensor: entropy (TensorRT's KL search), max, percentile "
        f"(keeps {DEFAULT_PERCENTILE:g}%% of |x|), mse",
    )
    g.add_argument("--no-bounded-max", action="store_true",
                   help="saturate ReLU6/Sigmoid outputs too (default: they keep their observed maximum)")  # fmt: skip


def data_config(args: argparse.Namespace) -> DataConfig:
    from trtopt.data.config import DataConfig

    return DataConfig(**_given(sources=args.calib, count=args.calib_count, batch=args.calib_batch,
                               workers=args.workers, verify_sources=getattr(args, "verify_data", None)))  # fmt: skip


def calib_config(args: argparse.Namespace, *, keep_histograms: bool | None = None) -> CalibConfig:
    from trtopt.calib import CalibConfig

    return CalibConfig(
        method=args.method,
        bounded_max=not args.no_bounded_max,
        cache=getattr(args, "calib_cache", None),
        save_cache=getattr(args, "save_cache", None),
        keep_histograms=keep_histograms,
    )


def add_quant_arguments(parser: argparse.ArgumentParser) -> None:
    from trtopt.quant.config import DEFAULT_MIN_CHANNELS

    q = parser.add_argument_group("quantisation")
    q.add_argument("--exclude", nargs="+", default=[], metavar="NAME", help="node names or op types to keep float")
    q.add_argument("--keep-first-last", action="store_true", help="keep the first and last layers in float")
    q.add_argument("--min-channels", type=int, help="layers with fewer input or output channels stay float "
                   f"(default {DEFAULT_MIN_CHANNELS}; 1 on the openvino backend). Left unset, CPU builds also time "
                   "the plan with those thin layers in INT8 and keep it where as faithful and faster")  # fmt: skip
    q.add_argument(
        "--no-auto-exclude",
        action="store_true",
        help="keep every layer INT8 (default: when an output's cosine with FP32 stays below 0.99 on calibration "
        "samples, keep the fewest most sensitive layers float, found by measuring each)",
    )
    q.add_argument(
        "--no-equalize",
        action="store_true",
        help="leave channel ranges as they are (default: rescale the channels of each tensor that feeds a "
        "depthwise conv (directly, or through a ReLU, a HardSwish/SiLU gate and a scalar affine map after it) "
        "to even ranges before calibration, an exact float rewrite; a trtopt calibration cache records it and a "
        "build from the cache redoes it, so a cache with it is refused here: recalibrate with --no-equalize)",
    )
    q.add_argument(
        "--no-bias-correction",
        action="store_true",
        help="leave the biases as they are (default: subtract the mean output shift INT8 weights cause)",
    )


def quant_config(args: argparse.Namespace) -> QuantConfig:
    from trtopt.quant import QuantConfig

    given = _given(min_channels=args.min_channels)
    return QuantConfig(exclude=tuple(args.exclude), keep_first_last=args.keep_first_last,
                       bias_correction=not args.no_bias_correction, auto_exclude=not args.no_auto_exclude,
                       equalize=not args.no_equalize, **given)  # fmt: skip


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    """--backend, --fp16 and --labels, then one group per registered backend with its own flags."""
    from trtopt.backend import BACKENDS

    b = parser.add_argument_group("build")
    b.add_argument("--backend", default="auto", help=f"auto (the first available of {', '.join(_by_rank())}), "
                   f"or one of: {', '.join(BACKENDS)}")  # fmt: skip
    b.add_argument("--fp16", action="store_true", help="convert the non-INT8 regions to FP16 (for GPUs)")
    b.add_argument(
        "--sparsity",
        action="store_true",
        help="list the layers whose weights are 2:4 (see `trtopt sparsify`) in the summary and the plan; TensorRT "
        "plans also set the SPARSE_WEIGHTS flag, so those layers may run on sparse Tensor Cores",
    )
    b.add_argument("--labels", type=Path, help="class names, one per line (default: ImageNet for 1000 classes)")
    for name in BACKENDS:
        backend = BACKENDS.get(name)
        backend.add_arguments(parser.add_argument_group(f"{name} backend ({backend.title})"))


def backend_options(args: argparse.Namespace) -> tuple[BackendOptions, ...]:
    from trtopt.backend import BACKENDS

    return tuple(BACKENDS.get(name).options_from_args(args) for name in BACKENDS)


def add_verify_arguments(parser: argparse.ArgumentParser) -> None:
    from trtopt.data.samples import SHARED_CHECKS
    from trtopt.verify import VerifyConfig

    v = parser.add_argument_group("verification (always on)")
    v.add_argument(
        "--verify-samples",
        type=int,
        metavar="N",
        help=f"check the plan on N samples through FP32, the INT8 reference and the kernels (default "
        f"{VerifyConfig.samples}: held back from calibration when it has 8*N or more, else up to "
        f"{SHARED_CHECKS}*N shared with it; random inputs without --calib)",
    )
    v.add_argument(
        "--verify-data",
        nargs="+",
        metavar="PATH",
        help="check the plan on these images / .npy / .npz instead (the first N samples; nothing is held back "
        "from --calib). Also for FP32 builds, whose random inputs a model with integer size or index inputs "
        "may refuse",
    )
    v.add_argument(
        "--write-failed",
        action="store_true",
        help="write the plan even when it fails verification, its failure recorded (the build then exits with "
        "status 3, and Engine.load warns): to look at it with `trtopt compare --per-layer` or your own metric",
    )


def verify_config(args: argparse.Namespace) -> VerifyConfig:
    from trtopt.verify import VerifyConfig

    return VerifyConfig(**_given(samples=args.verify_samples), write_failed=args.write_failed)


def _by_rank() -> list[str]:
    from trtopt.backend import BACKENDS

    return [b.name for b in sorted((BACKENDS.get(n) for n in BACKENDS), key=lambda b: b.auto_rank)]


def _given(**values: Any) -> dict[str, Any]:
    """The values the user gave (None: left out, so the config's default applies)."""
    return {name: value for name, value in values.items() if value is not None}
