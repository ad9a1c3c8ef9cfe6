"""Run the graph passes on an ONNX model and write the optimised model.

  trtopt optimize model.onnx -o model.opt.onnx
  trtopt optimize model.onnx -o out.onnx --passes fold_batchnorm,fuse_cbr --json
  trtopt optimize model.onnx -o model.cpu.onnx --backend cpu   # the graph `trtopt build --backend cpu` quantises

Default passes, in order: simplify (ONNX Runtime's basic level), remove_noops, sink_transposes, hoist_transposes,
sink_squeeze, collapse_reshapes, fold_pad, fold_batchnorm, fold_input_affine, merge_branches (summed parallel
convs and identity BatchNorms, RepVGG's training-time blocks, as one conv), fuse_parallel_convs, eliminate_concat,
fuse_cbr; `--backend NAME` runs that backend's (cpu: rewrite_prelu, rewrite_hard_swish and
channel_shuffle too, and not fuse_parallel_convs). The output stays standard ONNX (TensorRT re-fuses what the
report lists); the report's summary and the fusion and concat groups are recorded in the model's metadata.
Before writing, ONNX Runtime loads the optimised model and runs it beside the original on a random feed (where
--shapes leaves no size open); if it does not load or its outputs differ, nothing is written. `trtopt inspect`
shows the same report without writing anything.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trtopt.passes import OptimizeResult

from trtopt.cli.args import add_graph_arguments, graph_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="input ONNX model")
    parser.add_argument("-o", "--output", required=True, help="where to write the optimised ONNX model")
    add_graph_arguments(parser)
    parser.add_argument(
        "--no-check",
        dest="check",
        action="store_false",
        help="write without checking that ONNX Runtime loads the optimised model and that it computes what the "
        "model does on a random feed (a second or two, more on large models)",
    )
    parser.add_argument(
        "--backend",
        help="run the passes `trtopt build --backend NAME` runs (cpu: the default passes with rewrite_prelu, "
        "rewrite_hard_swish and channel_shuffle, without fuse_parallel_convs); default: the default passes",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of tables")


def run(args: argparse.Namespace) -> int:
    from trtopt.frontend import graph_from_onnx, onnx_from_graph, save_onnx
    from trtopt.passes import optimize, record_metadata
    from trtopt.passes.check import check_optimized, reference

    config = graph_config(args)  # unknown pass names fail here, before any work
    passes = config.passes
    if args.backend is not None:
        from trtopt.backend import BACKENDS

        passes = BACKENDS.get(args.backend).passes(config.passes)  # an unknown name lists the known ones
    graph = graph_from_onnx(args.model, shapes=dict(config.shapes) if config.shapes else None)
    ref = reference(graph) if args.check else None
    result = optimize(graph, passes)
    model = onnx_from_graph(result.graph)
    record_metadata(model, result)
    check = check_optimized(model, ref) if ref is not None else None  # raises before anything is written
    save_onnx(model, args.output)
    if args.json:
        from trtopt.cli.console import print_json

        print_json(report_dict(result, args.model, args.output) | {"check": check.to_dict() if check else None})
    else:
        _print_tables(result, args.output)
        if check is not None:
            from trtopt.cli.console import out

            out.print(f"checked: {check.note}", soft_wrap=True)
    return 0


def report_dict(result: OptimizeResult, source: str, output: str) -> dict[str, Any]:
    return {"model": source, "output": output, **result.to_dict()}


def _print_tables(result: OptimizeResult, output: str) -> None:
    from rich.table import Table

    from trtopt.cli.console import out

    passes = Table(title="Passes", title_justify="left")
    for column in ("pass", "changes", "nodes", "time"):
        passes.add_column(column, justify="right" if column in ("nodes", "time") else "left")
    for report in result.reports:
        nodes = f"{report.nodes_before} -> {report.nodes_after}"
        passes.add_row(report.name, report.summary(), nodes, f"{report.seconds * 1e3:.1f} ms")
    out.print(passes)

    summary = Table(title="Graph (TensorRT cost model)", title_justify="left")
    for column in ("", "before", "after", "saved"):
        summary.add_column(column, justify="left" if not column else "right")
    b, a = result.before, result.after
    rows = [
        ("nodes", b.nodes, a.nodes),
        ("fused layers", b.fused_layers, a.fused_layers),
        ("est. kernel launches", b.kernel_launches, a.kernel_launches),
    ]
    for label, x, y in rows:
        summary.add_row(label, str(x), str(y), str(x - y))
    summary.add_row(
        "intermediate tensors",
        _mib(b.intermediate_bytes),
        _mib(a.intermediate_bytes),
        _mib(b.intermediate_bytes - a.intermediate_bytes),
    )
    out.print(summary)
    in_place = sum(g.in_place for g in result.concat_groups)
    concats = f"{in_place}/{len(result.concat_groups)} concats in place"
    out.print(
        f"{len(result.fusion_groups)} fusion groups, {concats}; "
        f"optimised in {result.seconds * 1e3:.0f} ms; wrote {output}"
    )


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"
