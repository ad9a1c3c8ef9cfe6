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
from pathlib import Path

from trtopt.cli.datasets import add_workers_argument
from trtopt.cli.preprocess_args import add_preprocess_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="ONNX model")
    parser.add_argument("-o", "--output", required=True, help="plan file to write (e.g. plan.engine)")
    parser.add_argument("--int8", action="store_true", help="quantise to INT8 (needs --calib or --calib-cache)")
    g = parser.add_argument_group("calibration")
    g.add_argument("--calib", nargs="+", metavar="PATH", help="calibration images / .npy / .npz (folders or files)")
    g.add_argument("--calib-cache", type=Path, help="reuse thresholds from a trtopt, TensorRT or ONNX Runtime cache")
    g.add_argument("--save-cache", type=Path, help="also write the thresholds to this trtopt cache (JSON)")
    g.add_argument("--calib-count", type=int, default=None, help="use the first N calibration samples (default all)")
    g.add_argument("--calib-batch", type=int, default=8, help="calibration batch size (default 8)")
    add_workers_argument(g)
    g.add_argument(
        "--method",
        default="auto",
        help="activation threshold method: auto (default: per tensor, the candidate among entropy, mse, "
        "percentile and max that least changes the layers reading it, scored on a few held-back calibration "
        "samples), or one method for every tensor: entropy (TensorRT's KL search), max, percentile (99.99%%), mse",
    )
    q = parser.add_argument_group("quantisation")
    q.add_argument("--exclude", nargs="+", default=[], metavar="NAME", help="node names or op types to keep float")
    q.add_argument("--keep-first-last", action="store_true", help="keep the first and last layers in float")
    q.add_argument(
        "--min-channels",
        type=int,
        default=16,
        help="layers with fewer input or output channels stay float (default 16)",
    )
    q.add_argument(
        "--no-auto-exclude",
        action="store_true",
        help="keep every layer INT8 (default: when an output's cosine with FP32 stays below 0.99 on calibration "
        "samples, keep the fewest most sensitive layers float, found by measuring each)",
    )
    q.add_argument(
        "--no-bias-correction",
        action="store_true",
        help="leave the biases as they are (default: subtract the mean output shift INT8 weights cause)",
    )
    b = parser.add_argument_group("build")
    b.add_argument("--backend", default="auto", help="auto (TensorRT if a GPU answers, else cpu), cpu, tensorrt")
    b.add_argument("--shapes", nargs="+", metavar="NAME:DxDxD", help="concrete input shapes, e.g. input:1x3x224x224")
    b.add_argument(
        "--batch", type=int, default=None, help="largest batch for dynamic-batch plans (TensorRT profile; default 1)"
    )
    b.add_argument("--passes", default=None, help="comma-separated optimiser passes (default: all, in order)")
    b.add_argument("--fp16", action="store_true", help="convert the non-INT8 regions to FP16 (for GPUs)")
    b.add_argument("--labels", type=Path, help="class names, one per line (default: ImageNet for 1000 classes)")
    b.add_argument("--workspace", type=int, default=None, help="TensorRT workspace limit in MiB")
    b.add_argument("--timing-cache", type=Path, help="TensorRT timing cache file to reuse and update")
    b.add_argument("--opt-level", type=int, default=None, help="TensorRT builder optimisation level 0-5")
    b.add_argument("--sparsity", action="store_true", help="let TensorRT use 2:4 sparse weights")
    b.add_argument(
        "--cpu-gemm",
        choices=("auto", "on", "off"),
        default="auto",
        help="CPU plans: run INT8 convs with long reductions (C_in*kh*kw >= 160) on ONNX Runtime's GEMM kernel, "
        "which uses AMX; auto (default): on where this CPU has AMX. Same results either way, only speed differs",
    )
    b.add_argument(
        "--cpu-encoding",
        choices=("auto", "u8s8", "u8u8"),
        default="auto",
        help="CPU plans: how INT8 weights are stored for ONNX Runtime. u8s8 (int8 weights) is fastest but exact "
        "only on CPUs with VNNI or AMX: on AVX2-only CPUs its kernels saturate 16-bit sums. u8u8 (the same "
        "values as uint8) is exact on every x86 CPU. auto (default): u8s8 where it is exact, else u8u8; the build "
        "verifies the choice either way",
    )
    v = parser.add_argument_group("verification (always on)")
    v.add_argument(
        "--verify-samples",
        type=int,
        default=8,
        metavar="N",
        help="check the plan on N samples through FP32, the INT8 reference and the kernels (default 8: held "
        "back from calibration when it has 8*N or more, else shared with it; random inputs without --calib)",
    )
    add_preprocess_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the build summary as JSON")


def run(args: argparse.Namespace) -> int:
    from trtopt.build import BuildConfig, build_plan
    from trtopt.cli.console import phase_progress, print_json
    from trtopt.cli.datasets import check_workers
    from trtopt.cli.preprocess_args import overrides_from_args
    from trtopt.cli.summaries import build_summary, print_build_summary
    from trtopt.errors import TrtoptError
    from trtopt.frontend import parse_shapes
    from trtopt.plan import write_plan
    from trtopt.quant import QuantConfig

    check_workers(args.workers)
    if (args.calib or args.calib_cache) and not args.int8:
        raise TrtoptError("--calib / --calib-cache given without --int8.", fix="Add --int8 to quantise.")
    from trtopt.classify import read_labels

    labels = read_labels(args.labels) if args.labels else None
    config = BuildConfig(
        backend=args.backend,
        int8=args.int8,
        calib=args.calib,
        calib_cache=args.calib_cache,
        save_cache=args.save_cache,
        calib_count=args.calib_count,
        calib_batch=args.calib_batch,
        calib_method=args.method,
        workers=args.workers,
        bias_correction=not args.no_bias_correction,
        auto_exclude=not args.no_auto_exclude,
        preset=args.preset,
        preprocess=overrides_from_args(args),
        shapes=parse_shapes(args.shapes),
        batch=args.batch,
        passes=tuple(p.strip() for p in args.passes.split(",") if p.strip()) if args.passes else None,
        quant=QuantConfig(
            exclude=tuple(args.exclude), keep_first_last=args.keep_first_last, min_channels=args.min_channels
        ),
        fp16=args.fp16,
        labels=labels,
        workspace_mib=args.workspace,
        timing_cache=args.timing_cache,
        optimization_level=args.opt_level,
        sparsity=args.sparsity,
        cpu_gemm=args.cpu_gemm,
        cpu_encoding=args.cpu_encoding,
        verify_samples=args.verify_samples,
    )
    with phase_progress("calibration", disable=args.json) as on_progress:
        result = build_plan(args.model, config, progress=on_progress)
    path = write_plan(result.plan, args.output)
    summary = build_summary(result, path)
    if args.json:
        print_json(summary)
    else:
        print_build_summary(summary, result.backend_reason)
    return 0
