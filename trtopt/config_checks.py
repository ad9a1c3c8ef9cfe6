"""Range checks for the numbers a user passes (the stage configs, backend options, `Engine`), done once, up front.

`--threads -1`, `--batch 0`, `--workspace -1` or `--opt-level 99` used to be accepted and then ignored or
passed on to a backend that misbehaved; each is now a `TrtoptError` naming the option and its range.
"""

from __future__ import annotations

from typing import Any

from trtopt.errors import TrtoptError

MAX_THREADS = 1024
MAX_BATCH = 2**20


def check_int(value: Any, option: str, low: int, high: int, *, optional: bool = True, example: str = "") -> None:
    """`value` is None (when `optional`) or an int in [low, high]; else a `TrtoptError` naming `option`."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        expected = f"a whole number from {low} to {high:,}" + (" (or leave it out for the default)" if optional else "")
        raise TrtoptError(
            f"{option} is {value!r}; expected {expected}.",
            fix=f"Pass e.g. {option} {example or low}.",
        )


def check_threads(threads: Any) -> None:
    check_int(threads, "--threads", 1, MAX_THREADS, example="4")
