"""Calibrate a model on representative data and write its INT8 thresholds to a cache.

The model is optimised first (as `trtopt build` does), so the cache names exactly the tensors a build
quantises; `trtopt build --int8 --calib-cache FILE` then skips collection. Formats: trtopt's JSON
(default; with the model fingerprint), TensorRT's text cache (TRT-<version>-EntropyCalibration2, for
trtexec and TensorRT <= 10 tools) and ONNX Runtime's calibration table. Like a build, it equalises
activations first (unless --no-equalize) and trtopt's format records the gains, so a build from the cache
redoes the same rewrite; the other formats are for tools that run the model as given, and are calibrated so.

examples:
  trtopt calibrate model.onnx --calib calib_data/ -o cache.json
  trtopt calibrate model.onnx --calib calib_data/ --method percentile -o cache.json
  trtopt calibrate model.onnx --calib calib_data/ --format tensorrt -o calib.cache
  trtopt calibrate model.onnx --calib calib_data/ -o cache.json --plot-dir hist/ --plot-top 6
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtopt.cli.args import add_calibration_arguments, add_graph_arguments
from trtopt.cli.preprocess_args import add_preprocess_arguments

if TYPE_CHECKING:
    from trtopt.calib import Calibration


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="ONNX model")
    parser.add_argument("-o", "--output", type=Path, required=True, help="cache file to write")
    parser.add_argument(
        "--format",
        default="trtopt",
        help="trtopt (JSON, default), tensorrt, onnxruntime-json, onnxruntime-text",
    )
    add_calibration_arguments(parser, build=False)
    parser.add_argument("--backend", default="auto", help="the backend the cache's builds are for (default auto, as "
                        "trtopt build): its default graph passes, and its quantised tensors, which bound the "
                        "activation-equalisation gains")  # fmt: skip
    parser.add_argument("--no-equalize", action="store_true", help="calibrate the graph as given (default: "
                        "equalise activations as trtopt build does and record the gains in the cache; other "
                        "formats than trtopt's are always written for the graph as given)")  # fmt: skip
    add_graph_arguments(parser)
    p = parser.add_argument_group("plots")
    p.add_argument("--plot-dir", type=Path, help="draw histograms with their thresholds into this folder")
    p.add_argument("--plot", nargs="+", default=[], metavar="TENSOR", help="tensors to draw (with --plot-dir)")
    p.add_argument("--plot-top", type=int, default=4, help="with --plot-dir and no --plot: the N most clipped tensors")
    add_preprocess_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print a summary as JSON")


def run(args: argparse.Namespace) -> int:
    from trtopt.calib import CACHE_FORMATS, save_cache
    from trtopt.cli.console import err, out, print_json

    CACHE_FORMATS.get(args.format)  # fail on a bad name before the slow part
    calibration = calibrate_model(args)
    save_cache(args.output, calibration, format=args.format)
    plots = _plots(args, calibration) if args.plot_dir else []
    summary = _summary(args, calibration, plots)
    if args.json:
        print_json(summary)
    else:
        out.print(
            f"wrote {len(calibration.amax)} thresholds ({_methods(calibration)}, {calibration.num_samples} samples, "
            f"{summary['seconds']:.1f} s, {summary['samples_per_second']:.1f} samples/s) to {args.output}"
        )
        for path in plots:
            err.print(f"histogram: {path}")
    return 0


def calibrate_model(args: argparse.Namespace) -> Calibration:
    """Load and optimise the model as `trtopt build --int8` does (so the cache names exactly the tensors a
    build quantises, for every backend), then calibrate every tensor any backend may quantise."""
    from trtopt.backend import prequantized_keeps, quantizable_tensors
    from trtopt.calib.stage import calibrate_graph
    from trtopt.cli import args as groups
    from trtopt.cli.console import phase_progress
    from trtopt.cli.preprocess_args import preprocess_config
    from trtopt.data.samples import load_samples, preprocess_spec_for
    from trtopt.passes import optimize
    from trtopt.passes.config import load_graph

    graph_config, data = groups.graph_config(args), groups.data_config(args)
    calib = groups.calib_config(args, keep_histograms=True if args.plot_dir else None)  # None: as the method needs
    preprocess = preprocess_config(args)
    model = Path(args.model)
    graph = load_graph(model, graph_config, int8=True, batch=data.batch, data=data.sources, keeps=prequantized_keeps())
    graph = optimize(graph, _backend(args).passes(graph_config.passes)).graph  # the passes --backend's builds run
    spec = preprocess_spec_for(model, graph, preprocess, data)
    with phase_progress("calibration", disable=args.json) as on_progress:
        dataset = load_samples(graph, spec, data)
        as_onnx, record = _equalized(args, graph, dataset, data.batch)
        return calibrate_graph(graph, as_onnx, quantizable_tensors(graph), calib, dataset=dataset, data=data,
                               progress=on_progress, equalization=record)  # fmt: skip


def _equalized(args: argparse.Namespace, graph: Any, dataset: Any, batch: int) -> tuple[Any, Any]:
    """Equalise `graph` (in place) as a build for --backend does, unless --no-equalize or the cache is for
    other tools (which run the graph as given); returns (the graph as ONNX, the record the cache keeps)."""
    from trtopt.frontend import onnx_from_graph
    from trtopt.quant import QuantConfig
    from trtopt.quant.equalize_cache import equalize_recorded, not_equalized

    model = onnx_from_graph(graph)
    if args.no_equalize or args.format != "trtopt":
        return model, not_equalized(model) if args.format == "trtopt" else None
    quant = _backend(args).quant_config(QuantConfig())
    folds = quant.output_folds if quant.quantize_outputs else None
    record, _ = equalize_recorded(graph, model, dataset, batch, folds, quant.integer_gates)
    return onnx_from_graph(graph), record


def _backend(args: argparse.Namespace) -> Any:
    """The backend named by --backend (auto: the one `trtopt build` picks here); it need not run here."""
    from trtopt.backend import get_backend, select_backend

    return select_backend()[0] if args.backend == "auto" else get_backend(args.backend)


def _plots(args: argparse.Namespace, calibration: Calibration) -> list[str]:
    from trtopt.calib import CalibConfig, compute_thresholds, plot_histogram
    from trtopt.errors import TrtoptError

    histograms = calibration.histograms or {}
    names = args.plot or _most_clipped(calibration, args.plot_top)
    unknown = [n for n in names if n not in histograms]
    if unknown:
        raise TrtoptError(
            f"No histogram for {unknown}: not a calibrated tensor.",
            fix=f"Calibrated tensors include {', '.join(list(histograms)[:5])} …",
        )
    methods = ("entropy", "max", "percentile", "mse")
    by_method = {m: compute_thresholds({n: histograms[n] for n in names}, CalibConfig(method=m)) for m in methods}
    paths = []
    for name in names:
        lines = {"chosen": calibration.amax[name], **{m: by_method[m][name] for m in methods}}
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name).strip("_")
        paths.append(str(plot_histogram(histograms[name], args.plot_dir / f"{safe}.png", lines)))
    return paths


def _methods(calibration: Calibration) -> str:
    """"auto: mse 48, entropy 20, ..." where the method varies per tensor, else the method."""
    if calibration.method != "auto" or not calibration.choices:
        return str(calibration.method)
    return "auto: " + ", ".join(f"{m} {n}" for m, n in calibration.method_counts().items())


def _most_clipped(calibration: Calibration, n: int) -> list[str]:
    histograms = calibration.histograms or {}
    ratio = {t: calibration.amax[t] / h.amax for t, h in histograms.items() if h.amax > 0}
    return sorted(ratio, key=ratio.__getitem__)[:n]


def _summary(args: argparse.Namespace, calibration: Calibration, plots: list[str]) -> dict[str, Any]:
    timings = calibration.timings
    return {
        "cache": str(args.output),
        "format": args.format,
        "method": calibration.method,
        "methods": calibration.method_counts(),
        "samples": calibration.num_samples,
        "tensors": len(calibration.amax),
        "seconds": timings.total_s if timings else 0.0,
        "samples_per_second": timings.images_per_s if timings else 0.0,
        "thresholds": dict(calibration.amax),
        "plots": plots,
    }
