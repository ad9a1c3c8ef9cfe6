"""Optimise, calibrate, quantise and build a model into one plan file.

Stages: load (shape inference, constant folding) -> optimise (BN folding, CBR groups, horizontal
fusion, concat elimination) -> calibrate (entropy thresholds from your images, or a cache) -> quantise
(Q/DQ in TensorRT's explicit-quantization form) -> build for the backend -> write the plan atomically.

examples:
  trtopt build model.onnx --int8 --calib calib_data/ -o plan.engine
  trtopt build model.onnx --int8 --calib-cache cache.json -o plan.engine
  trtopt build model.onnx --int8 --calib imgs/ --exclude Gemm --keep-first-last -o plan.engine
  trtopt build model.onnx -o fp32.engine                      # no quantisation
  trtopt build model.onnx --int8 --calib imgs/ --backend tensorrt --batch 32 --fp16 -o gpu.engine
  trtopt build mnist.onnx --int8 --calib digits/ --resize 28 --scale 255 --mean 0 --std 1 -o mnist.engine
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from trtopt.cli.args import (
    add_backend_arguments,
    add_calibration_arguments,
    add_graph_arguments,
    add_quant_arguments,
    add_verify_arguments,
)
from trtopt.cli.preprocess_args import add_preprocess_arguments

if TYPE_CHECKING:
    from trtopt.build import BuildConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="ONNX model")
    parser.add_argument("-o", "--output", required=True, help="plan file to write (e.g. plan.engine)")
    parser.add_argument("--int8", action="store_true",
                        help="quantise to INT8 (needs --calib or --calib-cache); a float16 model is calibrated on a "
                        "float32 copy, and its plan keeps the model's float16 inputs and outputs")  # fmt: skip
    add_calibration_arguments(parser, build=True)
    add_quant_arguments(parser)
    add_graph_arguments(parser)
    add_backend_arguments(parser)
    add_verify_arguments(parser)
    add_preprocess_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the build summary as JSON")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from trtopt.build import build_plan
    from trtopt.cli.console import phase_progress, print_json
    from trtopt.cli.summaries import build_summary, print_build_summary
    from trtopt.data.samples import preprocess_source
    from trtopt.errors import TrtoptError
    from trtopt.plan import write_plan

    if (args.calib or args.calib_cache) and not args.int8:
        raise TrtoptError("--calib / --calib-cache given without --int8.", fix="Add --int8 to quantise.")
    config = build_config(args)
    with phase_progress("calibration", disable=args.json) as on_progress:
        result = build_plan(args.model, config, progress=on_progress)
    path = write_plan(result.plan, args.output)
    summary = build_summary(result, path)
    if summary["preprocess"]:
        summary["preprocess_source"] = preprocess_source(Path(args.model), config.preprocess)
    if args.json:
        print_json(summary)
    else:
        print_build_summary(summary, result.backend_reason, result.report, result.speed)
    failed = config.verify.write_failed and result.verification is not None and not result.verification.ok
    return 3 if failed else 0  # --write-failed wrote a plan that failed: a script must not take it for a good one


def build_config(args: argparse.Namespace) -> BuildConfig:
    """The `BuildConfig` the flags describe, stage by stage (each stage's config validates its own flags)."""
    from trtopt.build import BuildConfig
    from trtopt.cli import args as groups
    from trtopt.cli.preprocess_args import preprocess_config
    from trtopt.data.classes import read_labels

    return BuildConfig(
        backend=args.backend,
        int8=args.int8,
        fp16=args.fp16,
        sparsity=args.sparsity,
        graph=groups.graph_config(args),
        preprocess=preprocess_config(args),
        data=groups.data_config(args),
        calib=groups.calib_config(args),
        quant=groups.quant_config(args),
        backend_options=groups.backend_options(args),
        verify=groups.verify_config(args),
        labels=tuple(read_labels(args.labels)) if args.labels else None,
    )
