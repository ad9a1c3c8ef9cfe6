"""`trtopt.auto_backend.time_plans` pairs its rounds: each plan's time is the first plan's median times the median
of its per-round ratio to the first, on a made-up clock (no real timing)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from trtopt import auto_backend as auto


def test_each_plan_is_timed_against_the_first_round_by_round(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    costs = {"a": [10, 12, 11, 30, 10], "b": [5, 12, 11, 15, 9]}  # ms per call, round by round

    class Runner:
        def __init__(self, name: str) -> None:
            self.left = list(costs[name])

        def infer(self, feeds: Any) -> None:
            now[0] += self.left.pop(0) / 1e3

        def close(self) -> None:
            pass

    monkeypatch.setattr(auto, "create_runner", lambda plan, options: Runner(plan))
    monkeypatch.setattr(auto, "made_up_feeds", lambda plan, batch: {})
    monkeypatch.setattr(auto, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(auto, "WARMUP", 0)
    monkeypatch.setattr(auto, "BUDGET_S", 0.0)  # MIN_ROUNDS rounds
    times = auto.time_plans({"a": "a", "b": "b"}, 1)  # type: ignore[dict-item]
    # a's median is 11 ms; b's ratios to a are 0.5, 1, 1, 0.5, 0.9: median 0.9 (b's own median, 11 ms, would tie)
    assert times == pytest.approx({"a": 11.0, "b": 9.9})
