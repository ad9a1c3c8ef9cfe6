"""Where every random decision of the graph generator comes from (`trtopt.zoo.random_graphs`): a seeded NumPy
generator for scripts, or hypothesis' draws in the property tests, which can then shrink a failing graph."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

T = TypeVar("T")


class Choices(Protocol):
    """Where every random decision of the generator comes from."""

    def integer(self, low: int, high: int) -> int: ...  # inclusive bounds

    def choice(self, options: Sequence[T]) -> T: ...
