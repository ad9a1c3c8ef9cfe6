"""Constant folding for the loader: onnx-graphsurgeon's, around what it gets wrong (`Shape` with start / end,
`If` on a constant), repeated while shape inference learns more (`fold_to_fixpoint`)."""

from __future__ import annotations

from collections.abc import Callable

import onnx_graphsurgeon as gs

from trtopt.frontend.conditionals import flatten_constant_ifs
from trtopt.frontend.shape_slices import join_shape_slices, spell_shape_slices


def fold_to_fixpoint(graph: gs.Graph, infer: Callable[[gs.Graph], gs.Graph], rounds: int = 8) -> gs.Graph:
    """Fold constants, infer shapes again (`infer`) where that changed the graph, and repeat while `Shape` nodes
    are left.

    onnx-graphsurgeon folds `Shape(x)`, and a `Gather` or `Slice` of it, where the dimensions read are static in
    the inferred shapes; a folded shape makes the `Reshape`s it feeds static, whose outputs' shapes the next
    inference then knows, and so on down the graph. torchvision's Swin-T (opset 17, dynamic batch) computes every
    window partition, pad and attention mask from `Shape`s: one round left 2388 of its 2786 nodes and 242 Shapes,
    four rounds 810 and 24 (the batch's), each round 0.4-2 s. A graph without `Shape` nodes takes one round."""
    for _ in range(rounds):
        before = _folding_state(graph)
        _fold(graph)
        if _folding_state(graph) == before:
            break
        graph = infer(graph)
        if not any(node.op == "Shape" for node in graph.nodes):
            break
    return graph


def _fold(graph: gs.Graph, rounds: int = 3) -> None:
    """Constant folding, then the branch each decided `If` takes in its place (`trtopt.frontend.conditionals`: onnx-
    graphsurgeon's own flattening loses all but an `If`'s first output), and folding over what they brought in."""
    spell_shape_slices(graph)  # onnx-graphsurgeon folds Shape(start, end) as the whole shape
    for _ in range(rounds):
        graph.fold_constants(error_ok=True, flatten_subgraphs=False).cleanup()
        if not flatten_constant_ifs(graph):
            break
    join_shape_slices(graph)  # what did not fold (a dynamic batch): one node again, as the exporter wrote it


def _folding_state(graph: gs.Graph) -> tuple[int, frozenset[str]]:
    """What constant folding changes: the nodes left, and which tensors are constants."""
    return len(graph.nodes), frozenset(n for n, t in graph.tensors().items() if isinstance(t, gs.Constant))
