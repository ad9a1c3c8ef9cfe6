"""2:4 structured sparsity made: prune weights by magnitude, measure what it costs, choose layers within a budget.

    result = sparsify(model)                                  # every eligible layer
    result = sparsify(model, budget=0.002, batches=batches)   # least sensitive layers, 1 - cosine <= 0.002

Pruning alone loses accuracy; NVIDIA's workflow (ASP, NVIDIA/apex apex/contrib/sparsity) recovers it by
fine-tuning the pruned model, with its mask fixed, in the training framework. trtopt cannot train: it makes
the pattern, measures the cost and builds with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import onnx

from trtopt.errors import TrtoptError
from trtopt.sparsify.fidelity import (
    BudgetChoice,
    Feeds,
    Fidelity,
    FidelityProbe,
    Step,
    budget_measurements,
    choose_within_budget,
    sensitivities,
)
from trtopt.sparsify.prune import (
    PrunedLayer,
    PruneReport,
    layer_label,
    prunable_layers,
    prune_report,
    pruned_weights,
    select_layers,
    with_weights,
)

Progress = Callable[[int, int, str], None]  # (measurements done, planned at most, what was measured)

FINE_TUNING_NOTE = (
    "Pruning by magnitude alone costs accuracy; it is recovered only by fine-tuning the pruned model (mask "
    "fixed) in the training framework, as NVIDIA's ASP workflow does (NVIDIA/apex, apex/contrib/sparsity). "
    "trtopt does not train: export the fine-tuned model to ONNX and build that."
)

__all__ = [
    "FINE_TUNING_NOTE",
    "BudgetChoice",
    "Fidelity",
    "FidelityProbe",
    "PruneReport",
    "PrunedLayer",
    "SparsifyResult",
    "budget_measurements",
    "choose_within_budget",
    "layer_label",
    "prunable_layers",
    "sensitivities",
    "sparsify",
    "with_weights",
]


@dataclass(frozen=True)
class SparsifyResult:
    model: onnx.ModelProto  # the pruned model (the input's nodes and names, new weight values)
    report: PruneReport
    candidates: tuple[str, ...]  # the layers that could be pruned (after --layers)
    sensitivity: dict[str, Fidelity] | None  # each candidate pruned alone (with a budget)
    choice: BudgetChoice | None
    fidelity: Fidelity | None  # the pruned model against the dense one (with data)
    total_macs: int

    @property
    def pruned_macs(self) -> int:
        return sum(layer.macs or 0 for layer in self.report.pruned)

    @property
    def pruned_mac_share(self) -> float:
        return self.pruned_macs / self.total_macs if self.total_macs else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.report.to_dict(),
            "candidates": list(self.candidates),
            "total_macs": self.total_macs,
            "pruned_macs": self.pruned_macs,
            "pruned_mac_share": self.pruned_mac_share,
            "sensitivity": {k: v.to_dict() for k, v in self.sensitivity.items()} if self.sensitivity else None,
            "budget": self.choice.to_dict() if self.choice else None,
            "fidelity": self.fidelity.to_dict() if self.fidelity else None,
            "note": FINE_TUNING_NOTE,
        }


def sparsify(
    model: onnx.ModelProto,
    *,
    layers: Iterable[str] | None = None,
    budget: float | None = None,
    batches: Sequence[tuple[Feeds, int | None]] | None = None,
    threads: int | None = None,
    shapes: dict[str, tuple[int, ...]] | None = None,
    step: Progress | None = None,
) -> SparsifyResult:
    """Prune `layers` (default: every eligible one) of `model` to 2:4; with `budget` (1 - cosine, see
    `trtopt.sparsify.fidelity`) only the least sensitive ones that fit. `batches` ((feeds, rows) pairs) measure
    fidelity against the dense model; a budget needs them. `step(done, total, what)` follows the measurements
    (`total` is an upper bound). `model` itself is not modified."""
    from trtopt.analysis import summarize
    from trtopt.frontend import graph_from_onnx

    if budget is not None and not batches:
        raise TrtoptError("--max-loss needs data to measure the loss on.", fix="Add --calib DIR (images or .npy).")
    graph = graph_from_onnx(model, shapes=shapes, fold_constants=False)
    summary = summarize(graph)
    macs = {layer_label(n): cost.macs for n, cost in zip(graph.nodes, summary.layers, strict=True)}
    ops = {layer_label(n): n.op for n in graph.nodes}
    sites, reasons = prunable_layers(graph)
    candidates = select_layers(sites, reasons, layers)
    variable = [sites[layer].name for layer in candidates]
    probe = FidelityProbe(model, batches, threads=threads, variable=variable) if batches else None
    single = choice = None
    if budget is not None and probe is not None:
        each = {layer: pruned_weights(sites, [layer]) for layer in candidates}
        tick = _counter(step, len(candidates) + budget_measurements(len(candidates)))
        single = sensitivities(each, probe, tick)
        choice = choose_within_budget(each, single, probe, budget, tick)
        chosen: Sequence[str] = choice.chosen
    else:
        chosen = candidates
    weights = pruned_weights(sites, chosen)
    pruned = with_weights(model, weights)
    fidelity = choice.fidelity if choice is not None else probe.measure_weights(weights) if probe else None
    report = prune_report(sites, chosen, reasons, ops, macs)
    return SparsifyResult(pruned, report, tuple(candidates), single, choice, fidelity, summary.macs)


def _counter(progress: Progress | None, total: int) -> Step | None:
    """A per-measurement `Step` that reports (done, total, what) to `progress`."""
    if progress is None:
        return None
    done = 0

    def tick(what: str) -> None:
        nonlocal done
        done += 1
        progress(done, total, what)

    return tick
