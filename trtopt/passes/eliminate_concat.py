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

import numpy as np
import onnx_graphsurgeon as gs

from trtopt.passes.base import Rewrite, graph_pass
from trtopt.passes.edit import Namer, bypass
from trtopt.passes.groups import find_concat_groups
from trtopt.passes.query import constant_array, graph_output_names, producer, sole_consumer

MAX_ROUNDS = 8  # each round can only remove nodes; a fixed point comes after one or two


@graph_pass("eliminate_concat")
def eliminate_concat(graph: gs.Graph) -> tuple[list[Rewrite], list[str]]:
    """Remove Split->Concat round trips, flatten nested Concats, drop single-input Concats."""
    rewrites: list[Rewrite] = []
    for _ in range(MAX_ROUNDS):
        outputs = graph_output_names(graph)
        namer = Namer(graph)
        found: list[Rewrite] = []
        for node in list(graph.nodes):
            if node.op == "Concat" and node.outputs:
                found += _flatten(node, outputs) + _split_runs(graph, node, outputs, namer)
                if len(node.inputs) == 1 and bypass(graph, node, node.inputs[0]):
                    found.append(
                        Rewrite("drop_single_concat", (node.name,), f"single-input Concat {node.name!r}")
                    )
        graph.cleanup(remove_unused_graph_inputs=False)
        rewrites += found
        if not found:
            break
    notes = [
        f"in place: {g.output} <- {', '.join(g.inputs)}" for g in find_concat_groups(graph) if g.in_place
    ]
    return rewrites, notes


def _axis(node: gs.Node, default: int) -> int | None:
    """The node's axis made non-negative, or None when negative with an unknown rank."""
    axis = int(node.attrs.get("axis", default))
    if axis >= 0:
        return axis
    shape = node.outputs[0].shape
    return axis + len(shape) if shape is not None else None


def _flatten(concat: gs.Node, outputs: set[str]) -> list[Rewrite]:
    axis = _axis(concat, 0)
    rewrites = []
    index = 0
    while index < len(concat.inputs):
        inner = _inner_concat(concat, concat.inputs[index], axis, outputs)
        if inner is None:
            index += 1
            continue
        pieces = list(inner.inputs)
        concat.inputs.pop(index)
        for offset, piece in enumerate(pieces):
            concat.inputs.insert(index + offset, piece)
        inner.outputs.clear()
        detail = f"{inner.name!r} flattened into {concat.name!r}"
        rewrites.append(Rewrite("flatten_concat", (inner.name, concat.name), detail))
    return rewrites


def _inner_concat(concat: gs.Node, tensor: gs.Tensor, axis: int | None, outputs: set[str]) -> gs.Node | None:
    """The Concat on the same axis that writes `tensor` for `concat` alone, else None."""
    inner = producer(tensor)
    if inner is None or inner.op != "Concat" or axis is None or _axis(inner, 0) != axis:
        return None
    return inner if sole_consumer(tensor, outputs) is concat else None


def _split_runs(graph: gs.Graph, concat: gs.Node, outputs: set[str], namer: Namer) -> list[Rewrite]:
    """Replace runs of consecutive Split outputs (in order, read only here) with one piece."""
    rewrites = []
    index = 0
    while index < len(concat.inputs):
        run = _run_at(concat, index, outputs)
        if run is None:
            index += 1
            continue
        split, first, count = run
        whole = count == len(split.outputs)
        piece = split.inputs[0] if whole else _merge_outputs(graph, split, first, count, namer)
        if piece is None:
            index += 1
            continue
        for _ in range(count):
            concat.inputs.pop(index)
        concat.inputs.insert(index, piece)
        kind = "split_concat_identity" if whole else "merge_split_pieces"
        detail = f"{count} outputs of Split {split.name!r} feed {concat.name!r} in order"
        rewrites.append(Rewrite(kind, (split.name, concat.name), detail))
        index += 1
    return rewrites


def _run_at(concat: gs.Node, index: int, outputs: set[str]) -> tuple[gs.Node, int, int] | None:
    """(split, first output index, length) of a run of >= 2 Split outputs starting at input `index`."""
    split = producer(concat.inputs[index])
    if split is None or split.op != "Split" or _axis(split, 0) is None or _axis(split, 0) != _axis(concat, 0):
        return None
    first = next(i for i, t in enumerate(split.outputs) if t is concat.inputs[index])
    count = 0
    while (
        index + count < len(concat.inputs)
        and first + count < len(split.outputs)
        and concat.inputs[index + count] is split.outputs[first + count]
        and sole_consumer(split.outputs[first + count], outputs) is concat
    ):
        count += 1
    return (split, first, count) if count >= 2 else None


def _merge_outputs(graph: gs.Graph, split: gs.Node, first: int, count: int, namer: Namer) -> gs.Tensor | None:
    """Rewrite `split` so outputs first..first+count-1 are one output; return that tensor."""
    sizes = _split_sizes(split)
    if sizes is None:
        return None
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
