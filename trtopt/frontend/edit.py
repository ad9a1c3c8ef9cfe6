"""Graph edits every pass needs: canonical form, unique names, bypassing an identity-like node."""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Sequence

import numpy as np
import onnx_graphsurgeon as gs


def canonicalize(graph: gs.Graph) -> gs.Graph:
    """Cleaned (dead nodes removed), topologically sorted, every node uniquely named.

    Unnamed nodes get ``<op>_<n>`` in graph order, so names are deterministic for a given graph.
    Linear time; onnx-graphsurgeon's own cleanup/toposort (used for graphs with subgraphs, whose
    implicit inputs they understand) grow faster than linearly on graphs of thousands of nodes.
    """
    if any(isinstance(v, gs.Graph) for node in graph.nodes for v in node.attrs.values()):
        graph.cleanup(remove_unused_graph_inputs=False).toposort()
    else:
        _remove_dead_nodes(graph)
        _sort_topologically(graph)
    name_nodes(graph)
    return graph


def _remove_dead_nodes(graph: gs.Graph) -> None:
    """Keep the nodes some graph output depends on; detach the others from their tensors."""
    live: set[int] = set()
    stack = [t for t in graph.outputs]
    while stack:
        tensor = stack.pop()
        for node in tensor.inputs if isinstance(tensor, gs.Variable) else ():
            if id(node) not in live:
                live.add(id(node))
                stack.extend(node.inputs)
    for node in graph.nodes:
        if id(node) not in live:
            node.inputs.clear()
            node.outputs.clear()
    graph.nodes = [n for n in graph.nodes if id(n) in live]


def _sort_topologically(graph: gs.Graph) -> None:
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    producers = [{position[id(p)] for t in n.inputs for p in t.inputs if id(p) in position} for n in graph.nodes]
    order = stable_topological_order(producers)
    if len(order) != len(graph.nodes):
        raise ValueError("graph has a cycle; cannot sort it topologically")
    graph.nodes = [graph.nodes[i] for i in order]


def stable_topological_order(producers: Sequence[Collection[int]]) -> list[int]:
    """Kahn's algorithm over nodes 0..n-1, `producers[i]` the nodes node i reads from; of the nodes ready
    at each step the lowest index comes first, so a sorted order comes back unchanged. Linear time (up
    to the heap). Nodes on a cycle are left out: a shorter result means the graph has one. Shared by
    onnx-graphsurgeon graphs (`canonicalize`) and NodeProto lists (the CPU lowering)."""
    waiting = [len(p) for p in producers]
    users: list[list[int]] = [[] for _ in producers]
    for index, sources in enumerate(producers):
        for source in sources:
            users[source].append(index)
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for user in users[index]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, user)
    return order


def name_nodes(graph: gs.Graph) -> None:
    taken = {str(n.name) for n in graph.nodes if n.name}
    seen: set[str] = set()
    for index, node in enumerate(graph.nodes):
        name = str(node.name) if node.name else ""
        if name and name not in seen:
            seen.add(name)
            continue
        base = name or f"{node.op}_{index}"
        candidate, n = base, 1
        while candidate in taken or candidate in seen:
            n += 1
            candidate = f"{base}_{n}"
        node.name = candidate
        taken.add(candidate)
        seen.add(candidate)


class Namer:
    """Hands out tensor and node names not yet used in the graph (one instance per pass run)."""

    def __init__(self, graph: gs.Graph) -> None:
        self._taken = set(graph.tensors().keys()) | {str(n.name) for n in graph.nodes}

    def take(self, base: str) -> str:
        name, n = base, 1
        while name in self._taken:
            n += 1
            name = f"{base}_{n}"
        self._taken.add(name)
        return name


def new_constant(namer: Namer, base: str, values: np.ndarray) -> gs.Constant:
    """A fresh constant: passes never edit a weight array in place (another node may share it)."""
    return gs.Constant(namer.take(base), np.ascontiguousarray(values))


def replace_uses(old: gs.Tensor, new: gs.Tensor, nodes: Iterable[gs.Node] | None = None) -> None:
    """Make every reader of `old` (or only `nodes`) read `new` instead."""
    for node in list(old.outputs) if nodes is None else list(nodes):
        for i, tensor in enumerate(node.inputs):
            if tensor is old:
                node.inputs[i] = new


def can_bypass(graph: gs.Graph, node: gs.Node, source: gs.Tensor) -> bool:
    """Whether `bypass` can remove `node` without renaming a graph input or output."""
    outputs = {t.name for t in graph.outputs}
    if node.outputs[0].name not in outputs:
        return True
    interface = source.name in outputs or any(t is source for t in graph.inputs)
    return not interface and isinstance(source, gs.Variable) and bool(source.inputs)


def bypass(graph: gs.Graph, node: gs.Node, source: gs.Tensor) -> bool:
    """Remove `node`, whose single output equals `source`, keeping graph inputs/outputs intact.

    If the output is a graph output, the producer of `source` is made to write it directly (its name
    stays), which is possible only when `source` is a plain intermediate. Returns False (and changes
    nothing) when the node cannot be removed without renaming a graph input or output.
    """
    if not can_bypass(graph, node, source):
        return False
    out = node.outputs[0]
    if out.name not in {t.name for t in graph.outputs}:
        replace_uses(out, source)
        node.outputs.clear()
        return True
    writer = source.inputs[0]
    replace_uses(source, out, [n for n in source.outputs if n is not node])
    node.outputs.clear()
    node.inputs.clear()
    index = next(i for i, t in enumerate(writer.outputs) if t is source)
    writer.outputs[index] = out
    return True
