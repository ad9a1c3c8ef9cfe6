"""The sensitivity search's first test (trtopt.search._ceiling): a search that cannot help stops at once."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trtopt.cli.summaries import sensitivity_row
from trtopt.plan.verification import REFERENCE_MIN_COSINE
from trtopt.search._ceiling import FLOOR
from trtopt.search.sensitivity import CANDIDATES, LATER, MIN_COSINE, find_sensitive_layers

MANY = CANDIDATES + 24  # more layers than the search tries alone: the test runs
RANKED = [f"l{i:02d}" for i in range(MANY)]


def _plan(costs: dict[str, float], rest: float, calls: list[tuple[str, ...]]):  # type: ignore[no-untyped-def]
    """Cosine 1 minus the INT8 layers' summed costs and `rest`, an error no layer kept float removes (as a
    decoder whose output length differs from FP32's)."""

    def measure(exclude: Sequence[str]) -> float:
        calls.append(tuple(exclude))
        return 1.0 - rest - sum(cost for layer, cost in costs.items() if layer not in exclude)

    return measure


def test_a_search_whose_candidates_cannot_lift_the_plan_stops_after_the_test() -> None:
    calls: list[tuple[str, ...]] = []
    costs = {layer: 0.0004 for layer in RANKED}  # each alone gains less than nothing worth; the rest is elsewhere
    found = find_sensitive_layers(_plan(costs, 0.08, calls), RANKED, rank=lambda: RANKED)
    assert found.layers == {} and found.after == found.before < FLOOR
    assert calls == [(), tuple(RANKED[:CANDIDATES]), tuple(RANKED[:LATER])] and found.trials == 3
    assert found.ceiling is not None and found.ceiling.hopeless and found.ceiling.layers == CANDIDATES
    assert found.ceiling.worst == max(1.0 - 0.08 - 0.0004 * (MANY - n) for n in (CANDIDATES, LATER))
    record = found.to_dict()
    assert record["ceiling"] == {"layers": CANDIDATES, "worst": found.ceiling.worst, "hopeless": True}
    title, text = sensitivity_row(record) or ("", "")
    assert "stopped there" in text and f"{found.ceiling.worst:.4f}" in text and str(MIN_COSINE) in text


def test_a_search_whose_candidates_lift_the_plan_past_the_floor_runs_as_before() -> None:
    """Far below the floor, but one candidate carries most of the error: the test passes, the search keeps it."""
    calls: list[tuple[str, ...]] = []
    costs = {layer: 0.0001 for layer in RANKED} | {"l05": 0.1}
    found = find_sensitive_layers(_plan(costs, 0.0, calls), RANKED, rank=lambda: RANKED)
    assert found.before < FLOOR and list(found.layers) == ["l05"] and found.after >= MIN_COSINE
    assert found.ceiling is not None and not found.ceiling.hopeless and found.ceiling.worst >= FLOOR
    assert tuple(RANKED[:LATER]) not in calls  # the first trial passed: no second
    assert "stopped there" not in sensitivity_row(found.to_dict())[1]  # type: ignore[index]


def test_candidates_whose_errors_cancel_are_tried_nested_before_the_search_stops() -> None:
    """Not monotone: the last candidates' errors cancel the rest's (kept float alone, they lower the cosine),
    so every candidate float falls below the floor while the first `LATER` float lift the plan past it: the
    search runs, and keeps what lifts it."""
    calls: list[tuple[str, ...]] = []
    late = set(RANKED[LATER:CANDIDATES])

    def measure(exclude: Sequence[str]) -> float:  # "l00" costs 0.06, the others 0.0001 each but the late ones
        calls.append(tuple(exclude))
        small = sum(layer not in exclude and layer not in late for layer in RANKED[1:])
        return 1.0 - 0.06 * ("l00" not in exclude) - 0.0001 * small - 0.05 * (late <= set(exclude))

    found = find_sensitive_layers(measure, RANKED, rank=lambda: RANKED)
    assert calls[1:3] == [tuple(RANKED[:CANDIDATES]), tuple(RANKED[:LATER])]
    assert found.ceiling is not None and not found.ceiling.hopeless and found.ceiling.layers == LATER
    assert found.trials > 3 and "l00" in found.layers


def test_no_test_when_every_layer_is_a_candidate() -> None:
    """All of them float is the FP32 model: the test could rule nothing out, and is not run."""
    calls: list[tuple[str, ...]] = []
    layers = RANKED[:8]
    found = find_sensitive_layers(_plan({layer: 0.0004 for layer in layers}, 0.08, calls), layers)
    assert found.ceiling is None and tuple(layers) not in calls and found.trials == 1 + len(layers)
    assert "ceiling" not in found.to_dict()


def test_per_output_figures_stop_on_the_worst_output() -> None:
    """Two outputs: the candidates mend one; the other stays far below: hopeless on the worst."""
    calls: list[tuple[str, ...]] = []
    one = _plan({layer: 0.002 for layer in RANKED}, 0.0, calls)
    found = find_sensitive_layers(lambda exclude: np.array([one(exclude), 0.9]), RANKED, rank=lambda: RANKED)
    assert found.ceiling is not None and found.ceiling.hopeless and found.ceiling.worst == 0.9
    assert found.layers == {} and found.trials == 3


def test_the_floor_is_the_verifications_flag() -> None:
    assert FLOOR == REFERENCE_MIN_COSINE < MIN_COSINE
