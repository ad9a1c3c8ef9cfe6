"""Compare a plan with the FP32 model it was built from, on the same inputs.

Per output: cosine similarity, the worst input's cosine (its file in --json, and in a warning below 0.95: a
mean can hide a plan that fails a few inputs), relative error, max/mean absolute error, the distribution shift
(the largest share of values on the other side of some level than FP32's: how far the plan moves their bulk),
top-1 agreement ([N, classes] outputs).
Per task (--task, chosen from the outputs by default and named in the summary):
  detect       YOLOv8 / YOLOv5 / YOLOX outputs decoded (score >= --score-threshold, NMS per class), boxes
               the model decodes itself (torchvision's exports: boxes [K,4], scores [K], labels [K], those
               with score >= --score-threshold), or a --decoder of yours; FP32's boxes matched by the plan's at
               IoU >= --match-iou, per class: recall of FP32's boxes, precision, F1 and the box counts
  segment      maps of class ids (a segmenter ending in its own ArgMax), or [N, classes, H, W] scores read
               through their argmax: per-class IoU, their mean without the background (FP32's most common
               class), and the share of pixels with FP32's label
  text-detect  score maps (DB): per-image cosine, and IoU of the maps binarised at --map-threshold (0.3)
  ctc          greedy CTC decoding (argmax, merge repeats, drop --blank): exact-match rate, mean normalised
               edit distance
  classify     top-1 agreement
  raw          the per-output numbers only
auto picks the first that fits: boxes, scores and labels of one length, or a rank-3 output over the input's
YOLO grid (strides 8/16/32[/64]), is a detector; an integer map at >= 1/4 of the input's size, or float scores
of 5+ classes at the input's size, a segmenter's labels; a rank-4 map of at most 4 channels in [0, 1], at >= 1/4
of the input's size, a text detector;
another rank-3 output, on an input at least twice as wide as high and with no more time steps than it has
columns, a CTC recognizer; [N, classes] a classifier. With --per-layer, the same
intermediate tensors are read from both (the plan's graph keeps the FP32 tensor names) and listed in
graph order with the error each layer adds, so you can see where quantisation error grows and which
layers to keep in float with `trtopt build --exclude NAME`.

Per-layer mode runs the plan's quantised ONNX through ONNX Runtime with the layers exposed, which
simulates INT8 (quantise-dequantise) rather than running the fused INT8 kernels; its numbers locate
the error, the per-output table measures it.

examples:
  trtopt compare model.onnx plan.engine --data images/
  trtopt compare model.onnx plan.engine --data images/ --per-layer --top 10
  trtopt compare det.onnx det.engine --data images/ --task detect --score-threshold 0.3
  trtopt compare det.onnx det.engine --data images/ --decoder my_decoder.py:decode
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from trtopt.cli.preprocess_args import add_preprocess_arguments

if TYPE_CHECKING:
    from trtopt.engine import Engine
    from trtopt.metrics import TaskConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="the FP32 ONNX model the plan was built from")
    parser.add_argument("plan", help="plan file")
    parser.add_argument("--data", nargs="+", required=True, metavar="PATH", help="images or .npy/.npz inputs")
    parser.add_argument("--count", type=int, default=None, help="use the first N inputs (default all)")
    parser.add_argument("--batch", type=int, default=8, help="batch size (default 8)")
    parser.add_argument("--per-layer", action="store_true", help="also compare every layer's output")
    parser.add_argument("--top", type=int, default=15, help="layers to list in --per-layer mode (default 15)")
    add_task_arguments(parser)
    add_preprocess_arguments(parser, base="plan")
    parser.add_argument("--json", action="store_true", help="machine-readable output on stdout")


def add_task_arguments(parser: argparse.ArgumentParser) -> None:
    t = parser.add_argument_group("task metrics (see the description above)")
    t.add_argument("--task", default="auto", choices=("auto", "classify", "detect", "segment", "text-detect", "ctc",
                                                      "raw"),  # fmt: skip
                   help="what the model does, for its fidelity metric (default auto: chosen from the outputs)")
    t.add_argument("--task-output", metavar="NAME", help="the output the task metric reads (default: chosen)")
    t.add_argument("--box-format", default="auto", choices=("auto", "yolov8", "yolov5", "yolox"),
                   help="detector layout: yolov8 [N, 4+C, A], yolov5 [N, A, 5+C] decoded, yolox [N, A, 5+C] "
                   "raw (grid decoding); default auto")
    t.add_argument("--decoder", metavar="FILE.py:FUNC",
                   help="your detection decoder: FUNC(outputs: {name: array}) returns one (boxes [K,4] x1y1x2y2, "
                   "scores [K], classes [K]) per image of the batch")
    t.add_argument("--score-threshold", type=float, default=0.25, help="detections kept from score S (default 0.25)")
    t.add_argument("--nms-iou", type=float, default=0.45, help="NMS IoU threshold per class (default 0.45)")
    t.add_argument("--match-iou", type=float, default=0.5, help="IoU at which a box matches FP32's (default 0.5)")
    t.add_argument("--map-threshold", type=float, default=0.3,
                   help="binarisation threshold of score maps (default 0.3, DB's)")
    t.add_argument("--blank", type=int, default=0, help="CTC blank class index (default 0)")
    t.add_argument("--ctc-layout", default="auto", choices=("auto", "ntc", "tnc"),
                   help="CTC output layout: [N, T, C] or [T, N, C] (default auto)")


def task_config_from_args(args: argparse.Namespace) -> TaskConfig:
    """The task flags, range-checked (a TrtoptError names the flag)."""
    from trtopt.errors import TrtoptError
    from trtopt.metrics import DecodeConfig, TaskConfig
    from trtopt.metrics.hook import load_decoder

    for flag in ("score_threshold", "nms_iou", "match_iou", "map_threshold"):
        value = getattr(args, flag)
        if not 0.0 <= value <= 1.0:
            name = "--" + flag.replace("_", "-")
            raise TrtoptError(f"{name} is {value!r}; expected a number from 0 to 1.", fix=f"Pass e.g. {name} 0.5.")
    if args.blank < 0:
        raise TrtoptError(f"--blank is {args.blank}; expected a class index >= 0.", fix="Pass e.g. --blank 0.")
    decoder, name = load_decoder(args.decoder) if args.decoder else (None, "")
    return TaskConfig(
        task=args.task, output=args.task_output, box_format=args.box_format,
        decode=DecodeConfig(score_threshold=args.score_threshold, nms_iou=args.nms_iou),
        match_iou=args.match_iou, map_threshold=args.map_threshold, blank=args.blank, ctc_layout=args.ctc_layout,
        decoder=decoder, decoder_name=name,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from trtopt.engine import Engine

    with Engine.load(args.plan) as engine:
        return _compare(args, engine)


def _compare(args: argparse.Namespace, engine: Engine) -> int:
    import numpy as np
    from rich.markup import escape

    from trtopt.cli.console import out, print_json
    from trtopt.cli.datasets import dataset_for_plan
    from trtopt.cli.preprocess_args import overrides_from_args
    from trtopt.data.inputs import unbatched_image
    from trtopt.execution import OrtSession
    from trtopt.frontend import load_model
    from trtopt.frontend.prequantized import is_prequantized
    from trtopt.metrics.compare import compare_outputs
    from trtopt.verify.selection import find_selection, short_list

    config = task_config_from_args(args)
    model = load_model(args.model).model
    quantised = is_prequantized(n.op_type for n in model.graph.node)  # another tool's Q/DQ: its math is the aim
    reference = OrtSession(model, opt_level="disable" if quantised else "all")
    dataset = dataset_for_plan(engine.plan, args.data, count=args.count, overrides=overrides_from_args(args))
    names = [t.name for t in engine.outputs if t.name in reference.output_names]
    sources: list[str] = []  # each sample's file (and entry), in the order they ran

    one = len(dataset.inputs) == 1 and unbatched_image(dataset.inputs[0].shape)  # [3, H, W]: one image per call

    def batches():  # type: ignore[no-untyped-def]
        for b in dataset.batches(args.batch):
            sources.extend(b.sources)
            triple = _rows(b, reference.run(b.feeds), engine.infer(b.feeds))  # one image: a batch of one, not of 3
            yield tuple({k: np.asarray(v)[None] for k, v in d.items()} for d in triple) if one else triple

    selection = find_selection(model)
    result = compare_outputs(batches(), names, config, selection.selected if selection else ())
    layers = _per_layer(args, engine, dataset) if args.per_layer else None
    outputs = [_named_worst(s.to_dict(), sources) for s in result.outputs]
    if args.json:
        judged = {"selected": list(selection.selected), "judged": list(selection.judged)} if selection else {}
        print_json(result.to_dict() | {"outputs": outputs, "layers": layers} | judged)
        return 0
    what = "the model's own quantised math (ONNX Runtime, optimisations off)" if quantised else "FP32 model"
    _print_fitted(out, outputs, result.samples, engine.backend, what)
    if selection is not None:
        out.print(f"note: {escape(short_list(selection.selected))} come after TopK / NMS / NonZero / a max-pool peak "
                  "mask: element by element their figures move with every swap of two entries or peak moved by a "
                  "pixel; `trtopt build` judges the tensors "
                  f"they select from instead ({escape(short_list(selection.judged))})")
    for warning in _warnings(outputs) + _random_warning(model):
        out.print(f"[bold red]WARNING[/] {escape(warning)}", markup=True)
    if result.task is not None:
        out.print(_task_table(result.task.to_dict()))
    if layers is not None:
        out.print(_layers_table(layers, args.top))
    return 0


def _named_worst(output: dict[str, Any], sources: list[str]) -> dict[str, Any]:
    """An output's figures with the file its worst sample came from (`worst_sample`; None: not measured)."""
    index = output["worst_sample_index"]
    return output | {"worst_sample": sources[index] if index is not None and index < len(sources) else None}


def _per_layer(args: argparse.Namespace, engine, dataset) -> list[dict]:  # type: ignore[no-untyped-def]
    import onnx

    from trtopt.backend.cpu.builder import DISABLED_OPTIMIZERS
    from trtopt.execution import OrtSession
    from trtopt.frontend import graph_from_onnx, load_model, onnx_from_graph
    from trtopt.frontend.float_types import lifted_to_float32, low_float_uses
    from trtopt.metrics.compare import added_errors, compare_batches
    from trtopt.passes import optimize

    optimizer = engine.plan.metadata.optimizer
    passes = optimizer.passes if optimizer is not None else None
    shapes = {t.name: tuple(t.shape) for t in engine.inputs if -1 not in t.shape}
    model = load_model(args.model).model
    int8 = (engine.plan.metadata.precision or "").startswith("int8")  # an INT8 plan computes a float16 model's
    model = lifted_to_float32(model) if int8 and low_float_uses(model) else model  # float32 copy
    reference_graph = optimize(graph_from_onnx(model, shapes=shapes or None), passes).graph
    test_model = onnx.load_model_from_string(engine.plan.sections["onnx"])
    test_tensors = {o for n in test_model.graph.node for o in n.output}
    layer_ops = {"Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "Concat", "Relu", "Clip", "Mul", "Sigmoid"}
    names = [
        n.outputs[0].name
        for n in reference_graph.nodes
        if n.op in layer_ops and n.outputs[0].name in test_tensors and n.outputs[0].dtype == "float32"
    ]
    producers = {n.outputs[0].name: (n.name, n.op) for n in reference_graph.nodes}
    reference = OrtSession(onnx_from_graph(reference_graph), expose=names)
    # Basic level: exposing every layer's output limits ONNX Runtime's fusions anyway. Its Q/DQ moves are off, as
    # in every CPU plan session (trtopt.backend.cpu.builder.DISABLED_OPTIMIZERS): the pairs stay where trtopt put them.
    test = OrtSession(test_model, expose=names, opt_level="basic", disabled_optimizers=DISABLED_OPTIMIZERS)
    pairs = (_rows(b, reference.run(b.feeds), test.run(b.feeds))[1:] for b in dataset.batches(args.batch))
    stats = compare_batches(pairs, names)
    added = added_errors(reference_graph, {s.name: max(0.0, 1.0 - s.cosine) for s in stats})
    return [
        {"tensor": s.name, "node": producers[s.name][0], "op": producers[s.name][1], **s.to_dict(),
         "added": added[s.name]}
        for s in stats
    ]


def _rows(batch, reference: dict, test: dict) -> tuple[dict, dict, dict]:  # type: ignore[no-untyped-def]
    """(inputs, FP32 outputs, plan outputs) without the padding rows a fixed-batch model's last batch carries
    (see Dataset.batches): arrays whose first axis is the padded batch keep their first len(batch) rows."""
    import numpy as np

    n = getattr(batch, "rows", len(batch))  # None: a whole feed without a batch dimension, nothing to drop
    padded = len(next(iter(batch.feeds.values())))
    if n is None or padded == n:
        return batch.feeds, reference, test

    def trim(arrays: dict) -> dict:  # type: ignore[type-arg]
        return {k: v[:n] if np.ndim(v) and len(v) == padded else v for k, v in arrays.items()}

    return trim(batch.feeds), trim(reference), trim(test)


def _print_fitted(  # type: ignore[no-untyped-def]
    console, outputs: list[dict[str, Any]], samples: int, backend: str, reference: str = "FP32 model"
) -> None:
    """The per-output table; where its output names would be cut to fit the terminal ("model/…" for every
    output of a TensorFlow export in 80 columns), they are numbered in the table and listed whole below it."""
    table = _outputs_table(outputs, samples, backend, reference=reference)
    unbounded = console.options.update(max_width=10**4)  # the width it wants (a measure is capped at the console's)
    if console.measure(table, options=unbounded).maximum <= console.width or max(len(o["name"]) for o in outputs) < 8:
        console.print(table)
        return
    console.print(_outputs_table(outputs, samples, backend, [f"#{i}" for i in range(1, len(outputs) + 1)], reference))
    for i, o in enumerate(outputs, 1):
        console.print(f"#{i}: {o['name']}", markup=False, highlight=False, soft_wrap=True)


def _outputs_table(outputs, samples: int, backend: str, labels: list[str] | None = None,  # type: ignore[no-untyped-def]
                   reference: str = "FP32 model"):
    from rich.table import Table

    table = Table(title=f"{reference} vs {backend} plan on {samples} inputs, per output", title_justify="left")
    columns = ["output", "cosine", "worst input", "rel. error", "max abs err", "mean abs err", "|ref| max",
               "distribution shift", "top-1 agreement"]
    positions = any(o["argmax_agreement"] is not None for o in outputs)
    for col in columns + ["argmax agreement (positions)"] * positions:
        table.add_column(col, justify="right" if col != "output" else "left")
    for o in outputs:
        agree = "-" if o["top1_agreement"] is None else f"{o['top1_agreement']:.1%}"
        argmax = "-" if o["argmax_agreement"] is None else f"{o['argmax_agreement']:.2%} ({o['argmax_positions']})"
        table.add_row(
            labels[outputs.index(o)] if labels else o["name"],
            f"{o['cosine']:.5f}",
            "-" if o["worst_sample_cosine"] is None else f"{o['worst_sample_cosine']:.4f}",
            f"{o['rel_error']:.4g}",
            f"{o['max_abs_error']:.4g}",
            f"{o['mean_abs_error']:.4g}",
            f"{o['reference_abs_max']:.4g}",
            "-" if o["distribution_shift"] is None else f"{o['distribution_shift']:.3f}",
            agree,
            *[argmax] * positions,
        )
    return table


def _warnings(outputs: list[dict]) -> list[str]:  # type: ignore[type-arg]
    """The build's warnings for each output whose top classes change too often
    (trtopt.metrics.agreement.argmax_warning), whose bulk of values moved
    (trtopt.metrics.distribution_shift.shift_warning), or whose worst input is far from FP32 while the output as a
    whole is not (trtopt.metrics.agreement.SAMPLE_MIN_COSINE)."""
    from trtopt.metrics.agreement import SAMPLE_MIN_COSINE, argmax_warning
    from trtopt.metrics.distribution_shift import shift_warning

    found = []
    for o in outputs:
        flips = argmax_warning(o["argmax_agreement"], o["argmax_positions"], o["cosine"])
        found += [f"output {o['name']!r}: {flips}"] if flips else []
        shift = shift_warning(o["name"], o["distribution_shift"], o["cosine"])
        found += [shift] if shift else []
        worst = o["worst_sample_cosine"]
        if worst is not None and worst < SAMPLE_MIN_COSINE <= o["cosine"]:
            where = o.get("worst_sample") or f"#{o['worst_sample_index'] + 1}"
            found.append(f"output {o['name']!r}: input {where} keeps a cosine of only {worst:.4f} with "
                         f"FP32 (below {SAMPLE_MIN_COSINE}) though the output's is {o['cosine']:.4f}: INT8 error "
                         "gathers on some inputs; calibrate on more samples like it (--calib), or keep the layers "
                         "--per-layer names float (trtopt build --exclude)")
    return found


def _random_warning(model) -> list[str]:  # type: ignore[no-untyped-def]
    from trtopt.passes.check import random_ops

    drawn = random_ops(n.op_type for n in model.graph.node)
    return [f"the model draws random numbers ({', '.join(drawn)}): two runs of it differ whatever the plan does, "
            "so these figures mix quantisation error with that noise"] if drawn else []  # fmt: skip


def _task_table(task: dict):  # type: ignore[no-untyped-def, type-arg]
    """The task's metrics, and below them why the task was chosen: a line of its own (a table caption wrapped it
    to the table's width, a few words a line)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    kind = task["task"] + (f" ({task['variant']})" if task["variant"] else "")
    table = Table(title=f"task: {kind}", title_justify="left")
    table.add_column("metric", justify="left")
    table.add_column("value", justify="right")
    for label, value in _task_rows(task["task"], task["metrics"]):
        table.add_row(label, value)
    return Group(table, Text(task["reason"]))


def _task_rows(task: str, m: dict) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.1%}"

    if task == "detect":
        return [
            ("images", str(m["images"])),
            (f"boxes: FP32 / plan (score >= {m['score_threshold']:g}, NMS IoU {m['nms_iou']:g})",
             f"{m['reference_boxes']} / {m['test_boxes']}"),
            (f"matched (same class, IoU >= {m['iou_threshold']:g})", str(m["matched"])),
            ("recall of FP32's boxes", pct(m["recall"])),
            ("precision", pct(m["precision"])),
            ("F1", pct(m["f1"])),
        ]  # fmt: skip
    if task == "segment":
        ious = ", ".join(f"{c} {iou:.1%}" for c, iou in m["class_iou"].items())
        return [
            ("images", str(m["images"])),
            ("pixels with FP32's label", pct(m["pixel_agreement"])),
            (f"IoU per class (background: {m['background']})", ious or "-"),
            ("mean IoU, background left out", pct(m["mean_iou"])),
        ]
    if task == "text-detect":
        return [
            # any dense probability map (a saliency map too), not only text: say what the threshold selects
            (f"images (with FP32 pixels > {m['threshold']:g})", f"{m['images']} ({m['images_with_text']})"),
            (f"binarised-map IoU (> {m['threshold']:g})", pct(m["binary_iou"])),
            ("pixels above threshold: FP32 / plan", f"{m['reference_pixels']} / {m['test_pixels']}"),
            ("score-map cosine, all pixels", _num(m["cosine"])),
            ("worst cosine of an image with such pixels", _num(m["min_text_image_cosine"])),
        ]
    if task == "ctc":
        return [
            ("samples", str(m["samples"])),
            ("exact sequence match", pct(m["exact_match"])),
            ("mean normalised edit distance", _num(m["mean_normalized_edit_distance"])),
            (f"FP32 sequences empty (blank {m['blank']})", str(m["empty_reference"])),
        ]
    if task == "classify":
        return [("samples", str(m["samples"])), ("top-1 agreement", pct(m["top1_agreement"]))]
    return [("per-output numbers only", "-")]


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.5f}"


def _layers_table(layers, top: int):  # type: ignore[no-untyped-def]
    from rich.table import Table

    worst = sorted(layers, key=lambda r: r["added"], reverse=True)[:top]
    table = Table(
        title=f"layers adding the most error (of {len(layers)}; 1 - cosine over the worst input's: see --json)",
        title_justify="left",
    )
    for col in ("node", "op", "cosine", "added error", "max abs err"):
        table.add_column(col, justify="left" if col in ("node", "op") else "right")
    for r in worst:
        table.add_row(
            r["node"], r["op"], f"{r['cosine']:.5f}", f"{r['added']:.2e}", f"{r['max_abs_error']:.4g}"
        )
    return table
