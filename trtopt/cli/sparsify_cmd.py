"""Prune Conv / Gemm / MatMul weights to 2:4 structured sparsity by magnitude and write the pruned ONNX.

In every group of four weights along the input channels (the reduction axis), the two of smallest magnitude
become zero: the pattern NVIDIA's sparse Tensor Cores (Ampere and later) run about twice as fast, and that
`trtopt build --sparsity` lets TensorRT use. `trtopt inspect` lists the eligible layers.

Per layer it reports the share of the weights' L1 and L2 norm removed; with --calib, the pruned model's
outputs against the dense model's on that data (cosine, top-1 agreement). --max-loss L prunes only the least
sensitive layers: each eligible layer is pruned alone and measured, then layers are taken from the least
sensitive up while the whole stays within L, in units of 1 - cosine of the outputs (worst output).

Pruning alone costs accuracy. It is recovered only by fine-tuning the pruned model, mask fixed, in the
training framework (NVIDIA's ASP workflow); this command makes the pattern and measures its cost, it does
not train. A model's preprocessing sidecar (<model>.json) is copied beside the output.

examples:
  trtopt sparsify model.onnx -o sparse.onnx
  trtopt sparsify model.onnx -o sparse.onnx --calib calib_data/ --max-loss 0.002
  trtopt sparsify model.onnx -o sparse.onnx --layers conv3 conv4 --calib calib_data/ --json
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from trtopt.cli.preprocess_args import add_preprocess_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="ONNX model (float weights)")
    parser.add_argument("-o", "--output", required=True, help="where to write the pruned ONNX model")
    parser.add_argument("--layers", nargs="+", metavar="NAME", help="prune only these layers (default: all eligible)")
    parser.add_argument(
        "--max-loss",
        type=float,
        metavar="L",
        help="prune the least sensitive layers while 1 - cosine of the outputs against the dense model stays "
        "<= L on the --calib data (e.g. 0.002); needs --calib",
    )
    parser.add_argument("--calib", nargs="+", metavar="PATH", help="images / .npy / .npz to measure fidelity on")
    parser.add_argument("--calib-count", type=int, default=None, metavar="N", help="use the first N samples")
    parser.add_argument("--batch", type=int, default=8, help="batch size for the measurements (default 8)")
    parser.add_argument("--shapes", nargs="+", metavar="NAME:DxDxD", help="concrete input shapes for dynamic models")
    parser.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads (default: its own)")
    add_preprocess_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    from trtopt.cli.console import print_json
    from trtopt.frontend import load_model, parse_shapes, save_onnx
    from trtopt.frontend.writer import write_atomic

    _check_numbers(args)
    loaded = load_model(args.model)
    shapes = parse_shapes(args.shapes)
    sidecar = _sidecar(Path(args.model), Path(args.output))
    batches = _batches(args, loaded.model, shapes) if args.calib else None
    result = _sparsify(args, loaded.model, batches, shapes)
    save_onnx(result.model, args.output)
    if sidecar is not None:
        write_atomic(Path(args.output).with_suffix(".json"), sidecar)
    if args.json:
        print_json({"model": str(args.model), "output": str(args.output), **result.to_dict()})
    else:
        from trtopt.cli.sparsity_tables import print_sparsify_result

        print_sparsify_result(result, args.output, samples=sum(n or 1 for _, n in batches or []))
    return 0


def _check_numbers(args: argparse.Namespace) -> None:
    from trtopt.config_checks import check_int, check_threads
    from trtopt.errors import TrtoptError

    check_int(args.batch, "--batch", 1, 4096, optional=False, example="8")
    check_int(args.calib_count, "--calib-count", 1, 2**31 - 1, example="64")
    check_threads(args.threads)
    if args.max_loss is not None and not 0.0 <= args.max_loss <= 2.0:
        raise TrtoptError(
            f"--max-loss is {args.max_loss}; it is 1 - cosine of the outputs, from 0 (no change) to 2.",
            fix="Pass e.g. --max-loss 0.002.",
        )
    if args.max_loss is not None and not args.calib:
        raise TrtoptError("--max-loss needs data to measure the loss on.", fix="Add --calib DIR (images or .npy).")


def _sidecar(model: Path, output: Path) -> bytes | None:
    """The model's preprocessing sidecar, to copy beside the output; refused up front if a different one is
    already there (it would be replaced)."""
    from trtopt.errors import TrtoptError

    source = model.with_suffix(".json")
    if not source.is_file():
        return None
    data = source.read_bytes()
    target = output.with_suffix(".json")
    if target.is_file() and not target.samefile(source) and target.read_bytes() != data:
        raise TrtoptError(
            f"{str(target)!r} exists and differs from the model's preprocessing sidecar {str(source)!r}, which "
            "sparsify copies beside its output; nothing was written.",
            fix="Choose another -o, or remove or rename that file.",
        )
    return data


def _batches(args: argparse.Namespace, model: Any, shapes: Any) -> list[tuple[dict, int | None]]:
    """The --calib samples, preprocessed as `trtopt build` would for this model, held in memory."""
    from trtopt.cli.preprocess_args import preprocess_config
    from trtopt.data import DataConfig, input_infos_from_graph, load_dataset
    from trtopt.data.samples import preprocess_spec_for
    from trtopt.frontend import graph_from_onnx

    graph = graph_from_onnx(model, shapes=shapes, fold_constants=False)
    spec = preprocess_spec_for(Path(args.model), graph, preprocess_config(args), DataConfig(tuple(args.calib)))
    source = args.calib if len(args.calib) > 1 else args.calib[0]
    dataset = load_dataset(source, input_infos_from_graph(graph), spec, count=args.calib_count)
    return [(b.feeds, None if b.whole else len(b)) for b in dataset.batches(args.batch)]  # None: one whole feed


def _sparsify(args: argparse.Namespace, model: Any, batches: Any, shapes: Any) -> Any:
    from trtopt.cli.console import progress
    from trtopt.sparsify import sparsify

    if args.max_loss is None:
        return sparsify(model, layers=args.layers, batches=batches, threads=args.threads, shapes=shapes)
    with progress(disable=args.json) as bar:
        task = bar.add_task("measuring 2:4 pruning", total=None, rate="")

        def step(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, rate=what)

        result = sparsify(
            model, layers=args.layers, budget=args.max_loss, batches=batches, threads=args.threads, shapes=shapes,
            step=step,
        )  # fmt: skip
        bar.update(task, total=bar.tasks[0].completed)  # the bisection may stop short of its bound
    return result


