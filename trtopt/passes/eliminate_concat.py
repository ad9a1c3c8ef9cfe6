"""Concat elimination: Split->Concat round trips, nested Concats, single-input Concats.

- Consecutive outputs of one Split, read only by one Concat in the same order on the same axis, are
  one piece: all of the Split's outputs collapse to the Split's input; a run of some of them becomes
  one wider Split output (what horizontal fusion leaves when fused branches go straight into a Concat).
- A Concat read only by a Concat on the same axis is flattened into it.
- A single-input Concat is an identity and is removed.
Which Concats remain computable in place (producers writing into slices of the output, the TensorRT
"concatenation elimination" of GTC 2017) is reported and derived by `find_concat_groups`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trtopt.frontend.edit import Namer, bypass, can_bypass, canonicalize
from trtopt.passes.base import Match, Rewrite, graph_pass
from trtopt.passes.groups import find_concat_groups
from trtopt.passes.query import constant_array, graph_output_names, producer, sole_consumer


@dataclass(frozen=True, eq=False)
class FlattenConcat(Match):
    """A Concat read only by a Concat on the same axis: its inputs go straight into the outer one."""

    inner: gs.Node
    outer: gs.Node
    kind = "flatten_concat"

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        return (self.inner, self.outer)

    def describe(self) -> str:
        return f"{self.inner.name!r} flattened into {self.outer.name!r}"


@dataclass(frozen=True, eq=False)
class SplitRun(Match):
    """Consecutive outputs of one Split (`pieces`, >= 2) read only by one Concat, in order, on the same
    axis: one piece (the Split's input when they are all of its outputs)."""

    split: gs.Node
    concat: gs.Node
    pieces: tuple[gs.Tensor, ...]
    whole: bool  # all of the Split's outputs, in order: the round trip is the identity
    kind: str

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        return (self.split, self.concat)

    def describe(self) -> str:
        return f"{len(self.pieces)} outputs of Split {self.split.name!r} feed {self.concat.name!r} in order"


@dataclass(frozen=True, eq=False)
class SingleInputConcat(Match):
    """A Concat of one tensor: an identity."""

    concat: gs.Node
    kind = "drop_single_concat"

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        return (self.concat,)

    def describe(self) -> str:
        return f"single-input Concat {self.concat.name!r}"


def find_concat_eliminations(graph: gs.Graph) -> list[Match]:
    """Every nested Concat, Split run and single-input Concat, Concat by Concat in graph order."""
    outputs = graph_output_names(graph)
    found: list[Match] = []
    for node in graph.nodes:
        if node.op != "Concat" or not node.outputs:
            continue
        axis = _axis(node, 0)
        found += [FlattenConcat(inner, node) for t in node.inputs if (inner := _inner_concat(node, t, axis, outputs))]
        found += _split_runs(node, outputs)
        if len(node.inputs) == 1 and can_bypass(graph, node, node.inputs[0]):
            found.append(SingleInputConcat(node))
    return found


@graph_pass("eliminate_concat", find_concat_eliminations)
def eliminate_concat(graph: gs.Graph) -> tuple[list[Match], list[Rewrite]]:
    """Remove Split->Concat round trips, flatten nested Concats, drop single-input Concats.

    One rewrite changes what the others see (a flattened Concat can make Split outputs consecutive), so
    each round rewrites the matches that share no node and looks again, until nothing matches.
    """
    applied: list[Match] = []
    while matches := _disjoint(find_concat_eliminations(graph)):
        namer = Namer(graph)
        for match in matches:
            _apply(graph, match, namer)
        applied += matches
        canonicalize(graph)
    recorded = [
        Rewrite("concat_in_place", (g.output,), f"in place: {g.output} <- {', '.join(g.inputs)}")
        for g in find_concat_groups(graph)
        if g.in_place
    ]
    return applied, recorded


def _disjoint(matches: list[Match]) -> list[Match]:
    taken: set[int] = set()
    kept = []
    for match in matches:
        ids = {id(n) for n in match.nodes}
        if not ids & taken:
            kept.append(match)
            taken |= ids
    return kept


def _apply(graph: gs.Graph, match: Match, namer: Namer) -> None:
    if isinstance(match, FlattenConcat):
        index = _index(match.outer.inputs, match.inner.outputs[0])
        _replace_inputs(match.outer, index, 1, list(match.inner.inputs))
        match.inner.outputs.clear()
    elif isinstance(match, SplitRun):
        index = _index(match.concat.inputs, match.pieces[0])
        first = _index(match.split.outputs, match.pieces[0])
        count = len(match.pieces)
        piece = match.split.inputs[0] if match.whole else _merge_outputs(graph, match.split, first, count, namer)
        _replace_inputs(match.concat, index, count, [piece])
    elif isinstance(match, SingleInputConcat):
        bypass(graph, match.concat, match.concat.inputs[0])


def _replace_inputs(node: gs.Node, index: int, count: int, new: list[gs.Tensor]) -> None:
    """inputs[index : index + count] = new (onnx-graphsurgeon's input lists take no slice assignment)."""
    for _ in range(count):
        node.inputs.pop(index)
    for offset, tensor in enumerate(new):
        node.inputs.insert(index + offset, tensor)


def _index(tensors: list[gs.Tensor], tensor: gs.Tensor) -> int:
    return next(i for i, t in enumerate(tensors) if t is tensor)


def _axis(node: gs.Node, default: int) -> int | None:
    """The node's axis made non-negative, or None when negative with an unknown rank."""
    axis = int(node.attrs.get("axis", default))
    if axis >= 0:
        return axis
    shape = node.outputs[0].shape
    return axis + len(shape) if shape is not None else None


def _inner_concat(concat: gs.Node, tensor: gs.Tensor, axis: int | None, outputs: set[str]) -> gs.Node | None:
    """The Concat on the same axis that writes `tensor` for `concat` alone, else None."""
    inner = producer(tensor)
    if inner is None or inner.op != "Concat" or axis is None or _axis(inner, 0) != axis:
        return None
    return inner if sole_consumer(tensor, outputs) is concat else None


def _split_runs(concat: gs.Node, outputs: set[str]) -> list[SplitRun]:
    """Runs of >= 2 consecutive Split outputs among the Concat's inputs, in order, read only here."""
    runs = []
    index = 0
    while index < len(concat.inputs):
        run = _run_at(concat, index, outputs)
        if run is None:
            index += 1
            continue
        runs.append(run)
        index += len(run.pieces)
    return runs


def _run_at(concat: gs.Node, index: int, outputs: set[str]) -> SplitRun | None:
    split = producer(concat.inputs[index])
    if split is None or split.op != "Split" or _axis(split, 0) is None or _axis(split, 0) != _axis(concat, 0):
        return None
    first = _index(split.outputs, concat.inputs[index])
    count = 0
    while (
        index + count < len(concat.inputs)
        and first + count < len(split.outputs)
        and concat.inputs[index + count] is split.outputs[first + count]
        and sole_consumer(split.outputs[first + count], outputs) is concat
    ):
        count += 1
    whole = count == len(split.outputs)
    if count < 2 or (not whole and _split_sizes(split) is None):
        return None
    kind = "split_concat_identity" if whole else "merge_split_pieces"
    return SplitRun(split, concat, tuple(split.outputs[first : first + count]), whole, kind)


def _merge_outputs(graph: gs.Graph, split: gs.Node, first: int, count: int, namer: Namer) -> gs.Tensor:
    """Rewrite `split` so outputs first..first+count-1 are one output; return that tensor."""
    sizes = _split_sizes(split)
    assert sizes is not None  # checked by the matcher
    merged_size = sum(sizes[first : first + count])
    pieces = split.outputs[first : first + count]
    shape = pieces[0].shape
    axis = _axis(split, 0)
    merged_shape = None
    if shape is not None and axis is not None:
        merged_shape = [*shape[:axis], merged_size, *shape[axis + 1 :]]
    merged = gs.Variable(namer.take(f"{pieces[0].name}/merged"), dtype=pieces[0].dtype, shape=merged_shape)
    new_sizes = sizes[:first] + [merged_size] + sizes[first + count :]
    for _ in range(count):
        split.outputs.pop(first)
    split.outputs.insert(first, merged)
    if "split" in split.attrs:
        split.attrs["split"] = new_sizes
    else:
        sizes_tensor = gs.Constant(namer.take(f"{split.name}/sizes"), np.array(new_sizes, np.int64))
        split.attrs.pop("num_outputs", None)
        if len(split.inputs) > 1:
            split.inputs[1] = sizes_tensor
        else:
            split.inputs.append(sizes_tensor)
    return merged


def _split_sizes(split: gs.Node) -> list[int] | None:
    """The Split's sizes from its attribute, its input, or (equal split) its input shape."""
    if "split" in split.attrs:
        return [int(s) for s in split.attrs["split"]]
    if len(split.inputs) > 1 and split.inputs[1].name:
        value = constant_array(split.inputs[1])
        return None if value is None else [int(s) for s in value.reshape(-1)]
    shape, axis, n = split.inputs[0].shape, _axis(split, 0), len(split.outputs)
    if shape is None or axis is None or not isinstance(shape[axis], int) or shape[axis] % n:
        return None
    return [shape[axis] // n] * n
