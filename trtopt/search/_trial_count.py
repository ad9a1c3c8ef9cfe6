"""Bookkeeping of the sensitivity search's trials (trtopt.search.sensitivity): each trial run once, and
counted for the build's progress bar (`trtopt.calib.collect.count_reporter` makes the reports)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")  # what a trial measures: a cosine, or per-sample cosines


def memo(measure: Callable[[Sequence[str]], T]) -> Callable[[Sequence[str]], T]:
    """`measure` that runs each trial once (the alone stage may confirm a layer the greedy stage confirms; a
    second round may try a plan the greedy stage tried)."""
    known: dict[tuple[str, ...], T] = {}

    def memo(exclude: Sequence[str]) -> T:
        if tuple(exclude) not in known:
            known[tuple(exclude)] = measure(exclude)
        return known[tuple(exclude)]

    return memo


class TrialCount:
    """Trials counted across the measures it wraps, each reported to `on_trial(done, most)`."""

    def __init__(self, on_trial: Callable[[int, int], None] | None, done: int, most: int) -> None:
        self.on_trial, self.done, self.most = on_trial, done, most
        if on_trial is not None:
            on_trial(done, most)

    def wrap(self, measure: Callable[[Sequence[str]], T]) -> Callable[[Sequence[str]], T]:
        def counted(exclude: Sequence[str]) -> T:
            result = measure(exclude)
            self.done += 1
            if self.on_trial is not None:
                self.on_trial(min(self.done, self.most), self.most)
            return result

        return counted

    def finish(self) -> None:
        if self.on_trial is not None:  # stopped early: the bar ends full at the trials run, not at the bound
            self.on_trial(self.done, self.done)  # (a log read "39 done" after 4 of at most 39; round 13's hunt)
