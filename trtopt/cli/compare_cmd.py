"""Compare a plan with the FP32 model it was built from, on the same inputs.

Per output: top-1 agreement, cosine similarity, max/mean absolute error. With --per-layer, the same
intermediate tensors are read from both (the plan's graph keeps the FP32 tensor names) and listed in
graph order with the error each layer adds, so you can see where quantisation error grows and which
layers to keep in float with `trtopt build --exclude NAME`.

Per-layer mode runs the plan's quantised ONNX through ONNX Runtime with the layers exposed, which
simulates INT8 (quantise-dequantise) rather than running the fused INT8 kernels; its numbers locate
the error, the per-output table measures it.

examples:
  trtopt compare model.onnx plan.engine --data images/
  trtopt compare model.onnx plan.engine --data images/ --per-layer --top 10
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from trtopt.cli.preprocess_args import add_preprocess_arguments

if TYPE_CHECKING:
    from trtopt.engine import Engine


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="the FP32 ONNX model the plan was built from")
    parser.add_argument("plan", help="plan file")
    parser.add_argument("--data", nargs="+", required=True, metavar="PATH", help="images or .npy/.npz inputs")
    parser.add_argument("--count", type=int, default=None, help="use the first N inputs (default all)")
    parser.add_argument("--batch", type=int, default=8, help="batch size (default 8)")
    parser.add_argument("--per-layer", action="store_true", help="also compare every layer's output")
    parser.add_argument("--top", type=int, default=15, help="layers to list in --per-layer mode (default 15)")
    add_preprocess_arguments(parser, base="plan")
    parser.add_argument("--json", action="store_true", help="machine-readable output on stdout")


def run(args: argparse.Namespace) -> int:
    from trtopt.engine import Engine

    with Engine.load(args.plan) as engine:
        return _compare(args, engine)


def _compare(args: argparse.Namespace, engine: Engine) -> int:
    from trtopt.cli.console import out, print_json
    from trtopt.cli.datasets import dataset_for_plan
    from trtopt.cli.preprocess_args import overrides_from_args
    from trtopt.compare import compare_batches
    from trtopt.execution import OrtSession
    from trtopt.frontend import load_model

    reference = OrtSession(load_model(args.model).model)
    dataset = dataset_for_plan(engine.plan, args.data, count=args.count, overrides=overrides_from_args(args))
    names = [t.name for t in engine.outputs if t.name in reference.output_names]
    classify = {t.name for t in engine.outputs if len(t.shape) == 2}
    pairs = (_rows(b, reference.run(b.feeds), engine.infer(b.feeds)) for b in dataset.batches(args.batch))
    outputs = [s.to_dict() for s in compare_batches(pairs, names, classify=classify)]
    layers = _per_layer(args, engine, dataset) if args.per_layer else None
    if args.json:
        print_json({"outputs": outputs, "layers": layers, "samples": len(dataset)})
        return 0
    out.print(_outputs_table(outputs, len(dataset), engine.backend))
    if layers is not None:
        out.print(_layers_table(layers, args.top))
    return 0


def _per_layer(args: argparse.Namespace, engine, dataset) -> list[dict]:  # type: ignore[no-untyped-def]
    import onnx

    from trtopt.compare import added_errors, compare_batches
    from trtopt.execution import OrtSession
    from trtopt.frontend import graph_from_onnx, onnx_from_graph
    from trtopt.passes import optimize

    optimizer = engine.plan.metadata.optimizer
    passes = optimizer.passes if optimizer is not None else None
    shapes = {t.name: tuple(t.shape) for t in engine.inputs if -1 not in t.shape}
    reference_graph = optimize(graph_from_onnx(args.model, shapes=shapes or None), passes).graph
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
    test = OrtSession(test_model, expose=names, opt_level="basic")
    pairs = (_rows(b, reference.run(b.feeds), test.run(b.feeds)) for b in dataset.batches(args.batch))
    stats = compare_batches(pairs, names)
    added = added_errors(reference_graph, {s.name: max(0.0, 1.0 - s.cosine) for s in stats})
    return [
        {"tensor": s.name, "node": producers[s.name][0], "op": producers[s.name][1], **s.to_dict(),
         "added": added[s.name]}
        for s in stats
    ]


def _rows(batch, reference: dict, test: dict) -> tuple[dict, dict]:  # type: ignore[no-untyped-def]
    """Drop the padding rows a fixed-batch model's last batch carries (see Dataset.batches)."""
    n = len(batch)
    return {k: v[:n] for k, v in reference.items()}, {k: v[:n] for k, v in test.items()}


def _outputs_table(outputs, samples: int, backend: str):  # type: ignore[no-untyped-def]
    from rich.table import Table

    table = Table(title=f"FP32 model vs {backend} plan on {samples} inputs", title_justify="left")
    for col in ("output", "top-1 agreement", "cosine", "max abs err", "mean abs err", "|ref| max"):
        table.add_column(col, justify="right" if col != "output" else "left")
    for o in outputs:
        agree = "-" if o["top1_agreement"] is None else f"{o['top1_agreement']:.1%}"
        table.add_row(
            o["name"],
            agree,
            f"{o['cosine']:.5f}",
            f"{o['max_abs_error']:.4g}",
            f"{o['mean_abs_error']:.4g}",
            f"{o['reference_abs_max']:.4g}",
        )
    return table


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
