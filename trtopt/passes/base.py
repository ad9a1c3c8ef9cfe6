"""What every pass shares: the registry, the report it returns, and the wrapper that makes it canonical.

A pass body matches, checks and rewrites, and returns the rewrites it made; `graph_pass` registers it,
counts nodes, and leaves the graph canonical afterwards (cleaned, topologically sorted, every node
with a unique non-empty name), so each pass can run alone or in any order.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import onnx_graphsurgeon as gs

from trtopt.passes.edit import canonicalize
from trtopt.registry import Registry

PassFn = Callable[[gs.Graph], "PassReport"]
PASSES: Registry[PassFn] = Registry("pass")


@dataclass(frozen=True)
class Rewrite:
    """One change a pass made: its kind (e.g. "fold_bn"), the node names involved, a readable line."""

    kind: str
    nodes: tuple[str, ...]
    detail: str


@dataclass(frozen=True)
class PassReport:
    """What one pass run changed. An empty `rewrites` means the graph came out unchanged."""

    name: str
    rewrites: tuple[Rewrite, ...]
    nodes_before: int
    nodes_after: int
    seconds: float
    notes: tuple[str, ...] = field(default=())

    @property
    def changed(self) -> bool:
        return bool(self.rewrites)

    def counts(self) -> dict[str, int]:
        """Rewrites per kind, e.g. {"fold_bn": 53, "fold_mul": 2}."""
        return dict(Counter(r.kind for r in self.rewrites))

    def summary(self) -> str:
        if not self.rewrites:
            return "no match (unchanged)"
        return ", ".join(f"{n} {kind}" for kind, n in self.counts().items())

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "changed": self.changed,
            "counts": self.counts(),
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "seconds": self.seconds,
            "rewrites": [{"kind": r.kind, "nodes": list(r.nodes), "detail": r.detail} for r in self.rewrites],
            "notes": list(self.notes),
        }


PassBody = Callable[[gs.Graph], "list[Rewrite] | tuple[list[Rewrite], list[str]]"]


def graph_pass(name: str) -> Callable[[PassBody], PassFn]:
    """Register `body` as pass `name`; the registered function returns a `PassReport`.

    The body may return its rewrites, or (rewrites, notes) where notes are informational lines
    (e.g. the fusion groups found) that do not count as changes.
    """

    def wrap(body: PassBody) -> PassFn:
        def run(graph: gs.Graph) -> PassReport:
            start = time.perf_counter()
            canonicalize(graph)
            before = len(graph.nodes)
            result = body(graph)
            rewrites, notes = result if isinstance(result, tuple) else (result, [])
            canonicalize(graph)
            return PassReport(
                name=name,
                rewrites=tuple(rewrites),
                nodes_before=before,
                nodes_after=len(graph.nodes),
                seconds=time.perf_counter() - start,
                notes=tuple(notes),
            )

        run.__name__ = body.__name__
        run.__qualname__ = body.__qualname__
        run.__doc__ = body.__doc__
        return PASSES.add(name, run)

    return wrap
