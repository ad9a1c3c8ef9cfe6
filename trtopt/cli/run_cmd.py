"""Run a plan on images (or .npy/.npz tensors) and print the top-5 classes per image (for a first output
that is not [N, classes] scores, its shape and range per image instead, one entry per image along the
output's batch axis: a time-major [T, N, C] output is read along its second).

Each image is preprocessed exactly as the plan says (resize, crop, mean/std, layout stored at build
time), batched, and run; the closing line gives the throughput. ImageNet classifiers get ImageNet class
names. A plan whose input is one image without a batch axis, [3, H, W] (torchvision's detection exports),
runs one call per image.

examples:
  trtopt run plan.engine images/
  trtopt run plan.engine cat.jpg dog.jpg --top 3
  trtopt run plan.engine images/ --batch 16 --json > predictions.json
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from trtopt.cli.preprocess_args import add_preprocess_arguments

if TYPE_CHECKING:
    from trtopt.engine import Engine


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", help="plan file written by `trtopt build`")
    parser.add_argument("inputs", nargs="+", help="image files or folders, or .npy/.npz tensor files")
    parser.add_argument("--batch", type=int, default=8, help="images per inference call (default 8)")
    parser.add_argument("--top", type=int, default=5, help="how many classes to show per image (default 5)")
    parser.add_argument("--count", type=int, default=None, help="use only the first N inputs")
    parser.add_argument("--threads", type=int, default=None, help="CPU intra-op threads (default: all cores)")
    add_preprocess_arguments(parser, base="plan")
    parser.add_argument("--json", action="store_true", help="machine-readable output on stdout")


def run(args: argparse.Namespace) -> int:
    from trtopt.engine import Engine
    from trtopt.errors import TrtoptError

    if args.batch < 1 or args.top < 1:
        raise TrtoptError("--batch and --top must be at least 1.")
    with Engine.load(args.plan, threads=args.threads) as engine:
        return _run(args, engine)


def _run(args: argparse.Namespace, engine: Engine) -> int:
    from trtopt.cli.console import err, markup_safe, out, print_json
    from trtopt.cli.datasets import dataset_for_plan
    from trtopt.cli.preprocess_args import overrides_from_args
    from trtopt.data.arrays import has_batch_axis

    dataset = dataset_for_plan(engine.plan, args.inputs, count=args.count, overrides=overrides_from_args(args))
    output: str | None = None  # which output is shown: chosen on the first batch (`_shown_output`)
    declared: Sequence[int] = ()
    feeds = not has_batch_axis(dataset.inputs)
    results = []
    started = time.perf_counter()
    compute = 0.0
    for batch in dataset.batches(args.batch):
        t0 = time.perf_counter()
        results_of_batch = engine.infer(batch.feeds)
        compute += time.perf_counter() - t0
        if output is None:
            output = _shown_output(results_of_batch, [t.name for t in engine.outputs], quiet=args.json)
            declared = next(t.shape for t in engine.outputs if t.name == output)
        scores = results_of_batch[output]
        n = 0 if feeds else _rows(batch.feeds)  # whole feeds may hold 0-d inputs (silero-vad's sample rate)
        axis = sample_axis(declared, np.shape(scores), n) if np.ndim(scores) and not feeds else 0
        whole = feeds or np.ndim(scores) == 0 or (n == 1 and np.shape(scores)[axis] != 1)
        if whole:  # whole feeds (no shared batch axis, silero-vad), one value for all, or one sample's output
            # without a batch axis (attacut's [seq_len] logits for its [1, seq_len] ids): all of it is the sample's
            scores, axis = np.asarray(scores)[None], 0
        scores = np.moveaxis(scores, axis, 0)  # one entry per sample; a time-major [T, N, C] output has them second
        rows = _result_rows(output, scores, batch.feeds, engine.labels, args.top, whole=whole, moved=bool(axis))
        for source, row in zip(batch.sources, rows, strict=False):  # padding rows
            results.append({"input": source, **row})
            if not args.json:
                shown = row.get("text") or ", ".join(f"{p['label']} ({p['probability']:.1%})" for p in row["top"])
                out.print(f"[bold]{markup_safe(source)}[/]: {markup_safe(shown)}", markup=True, soft_wrap=True)
    elapsed = time.perf_counter() - started
    n = len(results)
    summary = {
        "images": n,
        "skipped": [{"path": s.path, "reason": s.reason} for s in dataset.skipped],
        "backend": engine.backend,
        "seconds": elapsed,
        "images_per_second": n / compute if compute else 0.0,
        "end_to_end_images_per_second": n / elapsed if elapsed else 0.0,
    }
    if args.json:
        print_json({"predictions": results, "summary": summary})
    else:
        rate = "img/s" if dataset.unit == "images" else "samples/s"
        for s in dataset.skipped:
            err.print(f"[yellow]skipped[/] {markup_safe(s.path)}: {markup_safe(s.reason)}", markup=True)
        err.print(
            f"{n} {dataset.unit} on {engine.backend} in {elapsed:.2f} s: {summary['images_per_second']:.1f} {rate} "
            f"inference, {summary['end_to_end_images_per_second']:.1f} {rate} with preprocessing "
            f"({'one per call' if feeds else _batch_note(dataset.fixed_batch, args.batch)})."
        )
    return 0


def _result_rows(name: str, scores: np.ndarray, feeds: Mapping[str, np.ndarray], labels: Sequence[str] | None,
                 top: int, *, whole: bool, moved: bool) -> list[dict[str, Any]]:  # fmt: skip
    """One row per sample of the shown output `scores` (samples on its first axis): a YOLO head's detections after
    NMS (`trtopt.cli.detections`), the top classes of [N, classes] scores, or else the output's shape and range
    (a CTC [N, T, C], a score map). `whole`: the batch is one sample; `moved`: the samples were not on axis 0."""
    from trtopt.cli.detections import detection_rows
    from trtopt.data.classes import top_k

    detected = None if whole or moved else detection_rows(scores, feeds, labels)
    if detected is not None:
        return detected
    if whole or not _class_scores(scores):
        return [_described(name, row) for row in scores]
    return [{"top": [p.__dict__ for p in preds]} for preds in top_k(scores, top, list(labels) if labels else None)]


def _batch_note(fixed: int | None, asked: int) -> str:
    """The samples one call held: the plan's own batch where its model fixes one (a batch-1 export runs one image
    per call whatever --batch says), else --batch."""
    return f"batch {asked}" if fixed is None or fixed == asked else f"batch {fixed}, fixed by the plan"


def sample_axis(declared: Sequence[int], shape: Sequence[int], rows: int) -> int:
    """The axis of an output with one entry per sample of a batch of `rows`: the first, unless the plan
    declares the first fixed and another dynamic axis has the batch's size (a CTC recogniser's time-major
    [T, N, C] logits, PyTorch's layout: `trtopt.metrics.ctc`), or, with nothing dynamic, the first does not
    have the batch's size and exactly one other axis does ([T, 1, C] of a model fixed at batch 1)."""
    if shape and shape[0] == rows and (not declared or declared[0] == -1):
        return 0
    dynamic = [i for i, size in enumerate(declared) if size == -1 and i < len(shape) and shape[i] == rows]
    if len(dynamic) == 1:
        return dynamic[0]
    sized = [i for i, size in enumerate(shape) if size == rows]
    return sized[0] if shape and shape[0] != rows and len(sized) == 1 else 0


def _shown_output(outputs: Mapping[str, np.ndarray], names: Sequence[str], *, quiet: bool) -> str:
    """The output `run` shows: the first, unless it would be read as [N, classes] scores without holding
    probabilities while a later one holds them (MTCNN's ONet: [N, 4] box offsets first, [N, 2] face probabilities
    last; a classical classifier's int64 label first is shown as it is); said on stderr if so."""
    from trtopt.cli.console import err
    from trtopt.metrics.task import probabilities

    first = np.asarray(outputs[names[0]])
    misread = first.dtype.kind == "f" and _class_scores(first) and not probabilities(first)
    found = next((n for n in names if probabilities(outputs[n])), names[0]) if misread else names[0]
    if found != names[0] and not quiet:  # the console reads no markup: names print as they are
        err.print(f"showing output {found!r}, the first of the {len(names)} outputs that holds class "
                  f"probabilities ({names[0]!r} comes first: `trtopt.Engine` gives them all)", soft_wrap=True)
    return found


def _rows(feeds: Mapping[str, np.ndarray]) -> int:
    return int(np.shape(next(iter(feeds.values())))[0])


def _class_scores(scores: np.ndarray) -> bool:
    """Whether an output is one score vector per sample: [N, classes], or with unit axes ([N, classes, 1, 1]
    of a classifier ending in a 1x1 conv and global pooling). One value per sample ([N, 1], a detector of one
    thing's probability) is no vector to rank."""
    shape = np.shape(scores)
    return len(shape) >= 2 and sum(size != 1 for size in shape[1:]) == 1


def _described(name: str, row: np.ndarray) -> dict[str, Any]:
    """One sample's output that is no [classes] score vector: its shape and range, not top-k "classes"
    (a CTC recogniser's [T, C] flattened would name class T*C indices)."""
    row = np.asarray(row).astype(np.float64)  # an int64 class id too (skl2onnx's `label`): min's inf initial
    stats = {"output": name, "shape": list(row.shape), "min": float(row.min(initial=np.inf)),
             "max": float(row.max(initial=-np.inf)), "mean": float(row.mean()) if row.size else 0.0}  # fmt: skip
    if row.size == 1:
        return {"described": stats, "text": f"output {name!r}: {stats['max']:.4g}"}
    shape = "x".join(map(str, row.shape))
    if row.size == 0:  # a detector's boxes where none passed its score threshold: no range (JSON has no inf)
        return {"described": stats | {"min": None, "max": None}, "text": f"output {name!r} [{shape}]: empty"}
    text = f"output {name!r} [{shape}]: min {stats['min']:.4g}, max {stats['max']:.4g}, mean {stats['mean']:.4g}"
    return {"described": stats, "text": text + " (not [N, classes] scores: no top-k; use trtopt.Engine for the values)"}
