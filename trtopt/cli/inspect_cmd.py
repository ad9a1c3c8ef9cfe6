"""Show a model's inputs and outputs, op histogram, parameters, estimated MACs, what `trtopt optimize`
would do to it pass by pass (the same matchers, on a copy: nothing is written), with what stays unfused, and
which Conv/Gemm/MatMul weights can run 2:4 sparse on TensorRT (and which already are).

examples:
  trtopt inspect model.onnx
  trtopt inspect model.onnx --shapes input:1x3x224x224 --layers --matches
  trtopt inspect model.onnx --json > summary.json
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from trtopt.errors import format_dims

if TYPE_CHECKING:
    from collections.abc import Sequence

    from trtopt.analysis import ModelSummary
    from trtopt.passes import PassReport

TOP_LAYERS = 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="the .onnx file")
    parser.add_argument(
        "--shapes",
        action="append",
        metavar="NAME:DxDxD",
        help="concrete sizes for dynamic input dimensions, e.g. input:1x3x224x224 (repeat or comma-separate)",
    )
    parser.add_argument("--json", action="store_true", help="print the full summary as JSON on stdout")
    parser.add_argument(
        "--layers",
        action="store_true",
        help=f"list every layer in graph order (default: the top {TOP_LAYERS} by MACs)",
    )
    parser.add_argument(
        "--matches", action="store_true", help="list every match of every pass (default: counts per kind)"
    )


def run(args: argparse.Namespace) -> int:
    from trtopt.analysis import fusion_report, summarize
    from trtopt.analysis.sparsity import analyze_sparsity
    from trtopt.cli.console import print_json
    from trtopt.frontend import graph_from_onnx, load_model, parse_shapes

    shapes = parse_shapes(args.shapes)
    loaded = load_model(args.model)
    graph = graph_from_onnx(loaded.model, shapes=shapes, fold_constants=False)
    # The optimiser sees the model as `trtopt optimize` loads it (constants folded).
    fusions = fusion_report(graph_from_onnx(loaded.model, shapes=shapes))
    summary = summarize(graph, source=str(args.model), opset=loaded.opset, fusions=fusions)
    sparsity = analyze_sparsity(graph, {n.name: c.macs for n, c in zip(graph.nodes, summary.layers, strict=True)})
    if args.json:
        print_json({**summary.to_dict(), "sparsity": sparsity.to_dict()})
    else:
        from trtopt.cli.sparsity_tables import print_sparsity_report

        print_summary(summary, all_layers=args.layers, every_match=args.matches)
        print_sparsity_report(sparsity, all_layers=args.layers)
    return 0


def print_summary(summary: ModelSummary, *, all_layers: bool = False, every_match: bool = False) -> None:
    from rich.table import Table

    from trtopt.cli.console import err, markup_safe, out

    out.print(f"[bold]{markup_safe(summary.source)}[/]  opset {summary.opset}", markup=True)
    io = Table(title="Inputs and outputs", title_justify="left")
    for column in ("", "name", "shape", "dtype"):
        io.add_column(column)
    for kind, tensors in (("input", summary.inputs), ("output", summary.outputs)):
        for t in tensors:
            io.add_row(kind, t.name, format_dims(t.shape), t.dtype)
    out.print(io)

    ops = Table(title="Ops", title_justify="left")
    ops.add_column("op")
    ops.add_column("count", justify="right")
    for op, count in summary.op_histogram.items():
        ops.add_row(op, str(count))
    out.print(ops)

    unknown = f" + {len(summary.unknown_cost)} layers unknown" if summary.unknown_cost else ""
    out.print(
        f"nodes {len(summary.layers)}   parameters {_human(summary.params)}   "
        f"MACs {_human(summary.macs)}{unknown}   elementwise ops {_human(summary.elementwise)}"
    )
    _print_layers(summary, all_layers)
    _print_fusions(summary, every_match)
    if summary.unknown_cost:
        from trtopt.frontend.shapes import example_shape

        example = ",".join(f"{t.name}:{example_shape(t.shape)}" for t in summary.inputs)
        err.print(
            f"[yellow]note:[/] the cost of {len(summary.unknown_cost)} layer(s) is unknown because some "
            f"shapes are dynamic; pass concrete sizes, e.g. --shapes {markup_safe(example)} (with your real "
            "sizes in place of the dynamic ones).",
            markup=True,
            soft_wrap=True,
            highlight=False,
        )


def _print_layers(summary: ModelSummary, all_layers: bool) -> None:
    from rich.table import Table

    from trtopt.cli.console import out

    layers = list(summary.layers) if all_layers else summary.top_layers(TOP_LAYERS)
    title = "Layers" if all_layers else f"Top {len(layers)} layers by MACs"
    table = Table(title=title, title_justify="left")
    for name in ("layer", "op", "output"):
        table.add_column(name)
    table.add_column("MACs", justify="right")
    table.add_column("%", justify="right")
    for layer in layers:
        share = f"{100 * layer.macs / summary.macs:.1f}" if summary.macs and layer.macs else ""
        macs = "?" if layer.macs is None else _human(layer.macs)
        table.add_row(layer.name, layer.op, format_dims(layer.output_shape), macs, share)
    out.print(table)


def _print_fusions(summary: ModelSummary, every_match: bool) -> None:
    from rich.table import Table

    from trtopt.cli.console import out

    if summary.fusions is None:
        return
    result = summary.fusions.result
    table = Table(title="What `trtopt optimize` does, pass by pass", title_justify="left")
    for column in ("pass", "rewrites", "records (graph unchanged)"):
        table.add_column(column)
    for report in result.reports:
        rewrites = ", ".join(f"{n} {kind}" for kind, n in report.counts().items())
        records = ", ".join(f"{n} {kind}" for kind, n in report.recorded_counts().items())
        table.add_row(report.name, rewrites or "no match", records)
    out.print(table)
    if every_match:
        _print_matches(result.reports)
    b, a = result.before, result.after
    out.print(f"nodes {b.nodes} -> {a.nodes}, est. kernel launches {b.kernel_launches} -> {a.kernel_launches}")
    if summary.fusions.not_fused:
        unfused = Table(title="Not fused by trtopt", title_justify="left")
        for column in ("kind", "nodes", "why"):
            unfused.add_column(column)
        for item in summary.fusions.not_fused:
            unfused.add_row(item.kind, ", ".join(item.nodes), item.reason)
        out.print(unfused)


def _print_matches(reports: Sequence[PassReport]) -> None:
    from rich.table import Table

    from trtopt.cli.console import out

    table = Table(title="Every match", title_justify="left")
    for column in ("pass", "kind", "where"):
        table.add_column(column)
    for report in reports:
        for record in (*report.rewrites, *report.recorded):
            table.add_row(report.name, record.kind, record.detail)
    out.print(table)


def _human(n: int) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)
