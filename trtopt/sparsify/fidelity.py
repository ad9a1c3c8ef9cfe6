"""What 2:4 pruning costs in output fidelity, measured on data, and the greedy choice of layers within a budget.

The loss of a pruned model is 1 - cosine similarity of its outputs with the dense model's on the same inputs
(`trtopt.metrics.compare.ErrorStats`: one cosine over every element of an output across all samples), the worst over
the model's outputs. It is the budget unit of `--max-loss`: 0 is the dense model, 0.001 keeps the outputs
99.9 % aligned. Top-1 agreement (for [batch, classes] outputs) is reported beside it but too coarse on a few
dozen calibration images to spend a budget on.

Greedy choice (`choose_within_budget`): each eligible layer is pruned alone and its loss measured (its
sensitivity); layers are then taken from the least sensitive up. Losses of several layers do not simply add,
so prefixes of that order are measured as wholes, and the longest prefix whose measured loss stays within the
budget is kept, found by bisection (about log2(n) extra measurements; the result is always a measured one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from trtopt.execution import OrtSession
from trtopt.metrics.compare import ErrorStats, compare_batches

Feeds = dict[str, np.ndarray]
Step = Callable[[str], None]  # called after each measurement with what was measured


@dataclass(frozen=True)
class Fidelity:
    """Per-output comparison with the dense model (`ErrorStats.to_dict()` each)."""

    outputs: tuple[dict[str, Any], ...]

    @property
    def loss(self) -> float:
        """1 - cosine, the worst over the outputs (the budget unit)."""
        return max((1.0 - float(o["cosine"]) for o in self.outputs), default=0.0)

    @property
    def top1(self) -> float | None:
        """Top-1 agreement with the dense model, the worst over classifier outputs; None without one."""
        shares = [o["top1_agreement"] for o in self.outputs if o["top1_agreement"] is not None]
        return min(shares) if shares else None

    def to_dict(self) -> dict[str, Any]:
        return {"loss": self.loss, "top1_agreement": self.top1, "outputs": list(self.outputs)}


DENSE = Fidelity(())


class FidelityProbe:
    """The dense model's outputs on fixed batches, computed once; `measure_weights` and `measure` compare a
    variant (the dense model with some weights replaced, or any model) against them.

    `batches` are (feeds, rows): a fixed-batch model's last batch may be padded, and only its first `rows` rows
    are compared (None: all of them, a whole feed). The initializers named in `variable` become inputs of one
    ONNX Runtime session, fed the dense or the pruned values on each run: ResNet-50's session takes about a
    second to create and a batch of 8 images two seconds to run on one core, so one session for all candidates
    saves a third of the time. The math is the same; ONNX Runtime cannot pre-pack or fuse those weights, so
    rounding may differ from a session over constant weights by about 1e-7 of the outputs' magnitude (the dense
    reference runs the same way).
    """

    def __init__(
        self,
        dense: onnx.ModelProto,
        batches: Sequence[tuple[Feeds, int | None]],
        *,
        threads: int | None = None,
        variable: Sequence[str] = (),
    ) -> None:
        self.dense = dense
        self.batches = list(batches)
        self.threads = threads
        stored = {t.name: t for t in dense.graph.initializer}
        self.fixed = {name: numpy_helper.to_array(stored[name]) for name in dict.fromkeys(variable) if name in stored}
        self.session = OrtSession(with_weights_as_inputs(dense, list(self.fixed)), threads=threads)
        self.names = [name for name in self.session.output_names]
        self.reference = [_rows(self.session.run({**feeds, **self.fixed}), rows) for feeds, rows in self.batches]
        first = self.reference[0] if self.reference else {}
        self.classify = {name for name, value in first.items() if np.asarray(value).ndim == 2}

    def measure_weights(self, weights: Mapping[str, np.ndarray]) -> Fidelity:
        """The dense model with `weights` ({initializer name: values}) replaced."""
        if not set(weights) <= set(self.fixed):
            from trtopt.sparsify.prune import with_weights

            return self.measure(with_weights(self.dense, weights))
        return self._compare(self.session, {**self.fixed, **weights})

    def measure(self, model: onnx.ModelProto) -> Fidelity:
        """Any model with the dense model's inputs and outputs, in a session of its own."""
        return self._compare(OrtSession(model, threads=self.threads), {})

    def _compare(self, session: OrtSession, extra: Mapping[str, np.ndarray]) -> Fidelity:
        batches = zip(self.reference, self.batches, strict=True)
        pairs = ((ref, _rows(session.run({**feeds, **extra}), rows)) for ref, (feeds, rows) in batches)
        stats: list[ErrorStats] = compare_batches(pairs, self.names, classify=self.classify)
        return Fidelity(tuple(s.to_dict() for s in stats))


def with_weights_as_inputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy of `model` whose initializers `names` are graph inputs instead (same name, dtype and shape)."""
    if not names:
        return model
    result = onnx.ModelProto()
    result.CopyFrom(model)
    wanted = set(names)
    moved = [t for t in result.graph.initializer if t.name in wanted]
    kept = [t for t in result.graph.initializer if t.name not in wanted]
    del result.graph.initializer[:]
    result.graph.initializer.extend(kept)
    result.graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in moved)
    return result


def sensitivities(
    pruned: Mapping[str, Mapping[str, np.ndarray]], probe: FidelityProbe, step: Step | None = None
) -> dict[str, Fidelity]:
    """{layer: fidelity of the model with only that layer pruned}; `pruned` maps a layer to its pruned
    weights ({weight name: values}, `trtopt.sparsify.prune.pruned_weights`)."""
    result = {}
    for layer, weights in pruned.items():
        result[layer] = probe.measure_weights(weights)
        if step:
            step(layer)
    return result


@dataclass(frozen=True)
class BudgetChoice:
    order: tuple[str, ...]  # every candidate, least sensitive first
    chosen: tuple[str, ...]  # the longest prefix of `order` measured within the budget
    fidelity: Fidelity  # of `chosen` pruned together
    measured: dict[int, float]  # prefix length -> measured loss (the bisection's trace)

    def to_dict(self) -> dict[str, Any]:
        return {
            "order": list(self.order),
            "chosen": list(self.chosen),
            "fidelity": self.fidelity.to_dict(),
            "measured_prefixes": {str(k): v for k, v in sorted(self.measured.items())},
        }


def choose_within_budget(
    pruned: Mapping[str, Mapping[str, np.ndarray]],
    single: Mapping[str, Fidelity],
    probe: FidelityProbe,
    budget: float,
    step: Step | None = None,
) -> BudgetChoice:
    """The longest least-sensitive-first prefix of the layers whose pruning together costs at most `budget`."""
    order = tuple(sorted(pruned, key=lambda layer: (single[layer].loss, layer)))
    fidelities: dict[int, Fidelity] = {0: DENSE}
    if order:
        fidelities[1] = single[order[0]]

    def measure(k: int) -> float:
        if k not in fidelities:
            weights = {name: values for layer in order[:k] for name, values in pruned[layer].items()}
            fidelities[k] = probe.measure_weights(weights)
            if step:
                step(f"first {k} layers")
        return fidelities[k].loss

    low, high = 0, len(order)
    if measure(high) <= budget:
        low = high
    while high - low > 1:  # invariant: prefix `low` is within the budget, prefix `high` is not
        middle = (low + high) // 2
        if measure(middle) <= budget:
            low = middle
        else:
            high = middle
    return BudgetChoice(order, order[:low], fidelities[low], {k: f.loss for k, f in fidelities.items()})


def budget_measurements(candidates: int) -> int:
    """An upper bound on the measurements `choose_within_budget` makes (for a progress bar's total)."""
    return 1 + max(0, int(np.ceil(np.log2(max(candidates, 1)))))


def _rows(outputs: Mapping[str, np.ndarray], rows: int | None) -> dict[str, np.ndarray]:
    """The first `rows` rows of each output (None: all, as for a whole feed such as one [3, H, W] image)."""
    return dict(outputs) if rows is None else {name: value[:rows] for name, value in outputs.items()}
