"""What every pass shares: the match it rewrites from, the registry, and the report it returns.

A pass is one matcher and one rewrite. Its matcher, `find(graph) -> list[Match]`, only reads the
graph; the pass rewrites exactly what the matcher found, and `trtopt inspect` reports from the same
matcher, so the two cannot disagree. The same idea as OnnxSlim, whose fusions are each one matcher
class used both to match and to rewrite (onnxslim/core/pattern/fusion/, e.g. padconv.py, convbn.py),
and as tinygrad's PatternMatcher (tinygrad/ops.py), where a rewrite is a pattern and the function
applied to what it matched.

`graph_pass` registers a pass with its matcher, counts nodes, and leaves the graph canonical
afterwards (cleaned, topologically sorted, every node with a unique non-empty name), so each pass
can run alone or in any order.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import onnx_graphsurgeon as gs

from trtopt.frontend.edit import canonicalize
from trtopt.registry import Registry


class Match:
    """What a matcher found at one place: the rewrite it calls for (`kind`), the nodes involved and a
    readable line. Subclasses are small frozen dataclasses holding what their rewrite needs;
    `describe` reads only those fields and node names, so it stays true after the rewrite."""

    kind: str

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def record(self) -> Rewrite:
        """The match as plain data (node names, not nodes), for reports and JSON."""
        return Rewrite(self.kind, tuple(str(n.name) for n in self.nodes), self.describe())


@dataclass(frozen=True)
class Rewrite:
    """One match as plain data: its kind (e.g. "fold_bn"), the node names involved, a readable line."""

    kind: str
    nodes: tuple[str, ...]
    detail: str


@dataclass(frozen=True)
class PassReport:
    """What one pass run did. `rewrites`: the matches it rewrote (empty: the graph came out unchanged).
    `recorded`: what it found and records without rewriting (fusion groups, in-place Concats)."""

    name: str
    rewrites: tuple[Rewrite, ...]
    nodes_before: int
    nodes_after: int
    seconds: float
    recorded: tuple[Rewrite, ...] = field(default=())

    @property
    def changed(self) -> bool:
        return bool(self.rewrites)

    @property
    def notes(self) -> tuple[str, ...]:
        return tuple(r.detail for r in self.recorded)

    def counts(self) -> dict[str, int]:
        """Rewrites per kind, e.g. {"fold_bn": 53, "fold_mul": 2}."""
        return dict(Counter(r.kind for r in self.rewrites))

    def recorded_counts(self) -> dict[str, int]:
        """Records per kind, e.g. {"conv+relu6": 33, "conv+add": 9}."""
        return dict(Counter(r.kind for r in self.recorded))

    def summary(self) -> str:
        changes = ", ".join(f"{n} {kind}" for kind, n in self.counts().items())
        records = ", ".join(f"{n} {kind}" for kind, n in self.recorded_counts().items())
        if not changes:
            return f"unchanged; records {records}" if records else "no match (unchanged)"
        return f"{changes}; records {records}" if records else changes

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "changed": self.changed,
            "counts": self.counts(),
            "recorded_counts": self.recorded_counts(),
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "seconds": self.seconds,
            "rewrites": [_record_dict(r) for r in self.rewrites],
            "recorded": [_record_dict(r) for r in self.recorded],
        }


def _record_dict(record: Rewrite) -> dict[str, object]:
    return {"kind": record.kind, "nodes": list(record.nodes), "detail": record.detail}


Finder = Callable[[gs.Graph], Sequence[Match]]
# A pass body rewrites the graph from its matcher and returns the matches it rewrote, or
# (rewritten, recorded) when it also records what it found without rewriting.
PassBody = Callable[[gs.Graph], "Sequence[Match] | tuple[Sequence[Match], Sequence[Rewrite]]"]


@dataclass(frozen=True)
class GraphPass:
    """A registered pass: `find` is its matcher, calling the pass runs it and returns a `PassReport`."""

    name: str
    find: Finder
    body: PassBody

    def __call__(self, graph: gs.Graph) -> PassReport:
        start = time.perf_counter()
        canonicalize(graph)
        before = len(graph.nodes)
        result = self.body(graph)
        rewritten, recorded = result if isinstance(result, tuple) else (result, ())
        canonicalize(graph)
        return PassReport(
            name=self.name,
            rewrites=tuple(m.record() for m in rewritten),
            nodes_before=before,
            nodes_after=len(graph.nodes),
            seconds=time.perf_counter() - start,
            recorded=tuple(recorded),
        )


PASSES: Registry[GraphPass] = Registry("pass")


def graph_pass(name: str, find: Finder) -> Callable[[PassBody], GraphPass]:
    """Register `body` as pass `name`, whose matcher is `find`."""

    def wrap(body: PassBody) -> GraphPass:
        return PASSES.add(name, GraphPass(name, find, body))

    return wrap
