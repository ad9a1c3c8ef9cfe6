"""The 2:4 sparsity tables `trtopt inspect` and `trtopt sparsify` print."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.table import Table

from trtopt.cli.console import out
from trtopt.errors import format_dims

if TYPE_CHECKING:
    from trtopt.analysis.sparsity import LayerSparsity, SparsityReport
    from trtopt.sparsify import Fidelity, SparsifyResult

TOP = 10


def print_sparsity_report(report: SparsityReport, *, all_layers: bool = False) -> None:
    """Per Conv/Gemm/MatMul: eligible for 2:4 (and why not), already 2:4, and the MAC shares."""
    if not report.layers:
        out.print("2:4 sparsity: the model has no Conv, Gemm or MatMul layer.")
        return
    eligible = [layer for layer in report.layers if layer.eligible]
    shown = list(report.layers) if all_layers else sorted(report.layers, key=lambda x: -(x.macs or 0))[:TOP]
    title = "2:4 structured sparsity" + ("" if all_layers else f" (top {len(shown)} layers by MACs; --layers: all)")
    table = Table(title=title, title_justify="left")
    table.add_column("layer", overflow="fold")
    for column in ("op", "weight", "eligible (2:4 axis)", "2:4 now", "MACs %"):
        table.add_column(column, justify="right" if column == "MACs %" else "left")
    for layer in shown:
        shape = format_dims(layer.shape or None)
        now = "-" if layer.zero_groups is None else ("yes" if layer.is_24 else f"no ({layer.zero_groups:.0%})")
        share = f"{100 * report.share(layer.macs):.1f}" if layer.macs else ""
        verdict = f"yes (axis {layer.axis})" if layer.eligible else f"no: {layer.reason}"
        table.add_row(layer.name, layer.op, shape, verdict, now, share)
    out.print(table)
    already = [layer for layer in report.layers if layer.is_24]
    out.print(
        f"2:4 sparsity: {len(eligible)} of {len(report.layers)} layers eligible "
        f"({_mac_share(report, report.eligible_macs, eligible, ' could run sparse')}); {len(already)} already 2:4 "
        f"({_mac_share(report, report.sparse_macs, already)}). Prune with `trtopt sparsify`, build with `--sparsity`."
    )


def _mac_share(report: SparsityReport, macs: int, layers: Sequence[LayerSparsity], then: str = "") -> str:
    """`layers`' share of the model's MACs, saying what is unknown of it: a layer's MACs need concrete shapes
    (a ViT with a dynamic batch read "73 of 101 layers eligible (0.0% of MACs could run sparse)", round 12)."""
    unknown = sum(layer.macs is None for layer in layers)
    if layers and unknown == len(layers):
        return "their MACs unknown: pass --shapes"
    if unknown:
        return f"{report.share(macs):.1%} of the known MACs{then}; {unknown} layers' MACs unknown: pass --shapes"
    return f"{report.share(macs):.1%} of MACs{then}"


def print_sparsify_result(result: SparsifyResult, output: str, *, samples: int) -> None:
    from trtopt.sparsify import FINE_TUNING_NOTE

    table = Table(title=f"pruned to 2:4: {len(result.report.pruned)} layers", title_justify="left")
    table.add_column("layer", overflow="fold")
    for column in ("op", "weight", "L1 removed", "L2 removed", "alone: 1 - cos", "MACs %"):
        table.add_column(column, justify="left" if column in ("op", "weight") else "right")
    single = result.sensitivity or {}
    for layer in result.report.pruned:
        alone = f"{single[layer.name].loss:.2e}" if layer.name in single else ""
        share = f"{100 * layer.macs / result.total_macs:.1f}" if layer.macs and result.total_macs else ""
        table.add_row(layer.name, layer.op, format_dims(layer.shape), f"{layer.l1_removed:.1%}",
                      f"{layer.l2_removed:.1%}", alone, share)  # fmt: skip
    out.print(table)
    if result.choice is not None:
        left = [name for name in result.choice.order if name not in result.choice.chosen]
        out.print(
            f"budget: {len(result.choice.chosen)} of {len(result.choice.order)} eligible layers fit; left dense "
            f"(most sensitive): {', '.join(left[-5:][::-1]) or 'none'}{' ...' if len(left) > 5 else ''}"
        )
    out.print(f"pruned layers carry {result.pruned_mac_share:.1%} of the model's MACs")
    if result.fidelity is not None:
        out.print(f"fidelity against the dense model on {samples} samples: {fidelity_text(result.fidelity)}")
    out.print(f"wrote {output}")
    out.print(f"note: {FINE_TUNING_NOTE}", soft_wrap=True)


def fidelity_text(fidelity: Fidelity) -> str:
    if not fidelity.outputs:
        return "unchanged (nothing pruned)"
    parts = []
    for o in fidelity.outputs:
        top1 = f", top-1 agreement {o['top1_agreement']:.1%}" if o["top1_agreement"] is not None else ""
        parts.append(f"{o['name']}: cosine {o['cosine']:.5f}{top1}")
    return "; ".join(parts)
