"""Move layout changes out of the graph: merge Transpose chains, and run whole regions of layout-agnostic ops in
the layout their input had, so the Transposes around them cancel.

Framework ports that keep TensorFlow's NHWC (and onnx-tf / tflite / keras2onnx conversions) wrap every
convolution in `Transpose(NHWC -> NCHW) ... Transpose(NCHW -> NHWC)` and run everything between two
convolutions (BatchNorm written out, activations, residual Adds) in NHWC. Each Transpose is a full copy, and in
an INT8 graph it also splits the Q/DQ pairs from the layers they belong to (issue #45: 110 Transposes in a
ResNet-50 port).

The rewrite works on regions, in the spirit of ONNX Runtime's transpose optimizer
(onnxruntime/core/optimizer/transpose_optimization), which pushes single Transposes through layout-agnostic
ops: a region is grown from a `Transpose(perm=p)` through the ops that compute the same thing in any layout
(unary and activation ops, elementwise ops whose other operands are constants or tensors transposed by the same
`p`, Concat / Softmax with the axis remapped, Reduce* with its axes remapped). The region then reads the
Transposes' inputs instead of their outputs (constant operands are transposed once, here); a
`Transpose(perm=p^-1)` that reads the region becomes the identity and goes; any other reader of a region tensor,
or a graph output, gets one `Transpose(p)` back. A region is rewritten only when it removes more Transposes than
it adds (or as many, when the ones it adds write graph outputs: the layout change moves to the boundary), so
every rewrite lowers the count or ends a Transpose's way to the outputs, and the pass ends. Inputs and outputs
keep their names and layouts: an NHWC model keeps its NHWC signature, with its Transposes at the boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from trtopt.frontend.edit import Namer, bypass, canonicalize
from trtopt.passes.base import Match, graph_pass
from trtopt.passes.query import constant_array, graph_output_names, is_missing, opset, producer

UNARY_OPS = frozenset({
    "Relu", "LeakyRelu", "PRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Elu", "Selu", "Celu", "Softplus",
    "Softsign", "Erf", "Exp", "Log", "Neg", "Abs", "Sqrt", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Sin",
    "Cos", "Not", "Identity", "Cast", "Clip", "Gelu", "Mish", "ThresholdedRelu", "IsNaN", "IsInf",
})  # fmt: skip
ELEMENTWISE_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Equal", "Greater", "Less", "GreaterOrEqual",
    "LessOrEqual", "And", "Or", "Xor", "Where", "Mod", "BitShift",
})  # fmt: skip
AXIS_OPS = frozenset({"Concat", "Softmax", "LogSoftmax"})
REDUCE_OPS = frozenset({
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
    "ReduceLogSumExp", "ReduceSumSquare",
})  # fmt: skip
# Inputs that are not data but scalars or axes: never re-laid out.
SCALAR_INPUTS = {"Clip": (1, 2)}
MAX_ROUNDS = 10_000


def perm_of(node: gs.Node) -> tuple[int, ...] | None:
    perm = node.attrs.get("perm") if node.op == "Transpose" else None
    if perm is None:
        rank = _rank(node.inputs[0]) if node.op == "Transpose" else None
        return None if rank is None else tuple(reversed(range(rank)))  # ONNX default: reverse the axes
    return tuple(int(a) for a in perm)


def inverse(perm: Sequence[int]) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for i, a in enumerate(perm):
        inv[a] = i
    return tuple(inv)


@dataclass(frozen=True, eq=False)
class TransposeMerge(Match):
    """`second` reads `first`'s output: one Transpose (or none when the perms cancel)."""

    first: gs.Node
    second: gs.Node
    kind = "merge_transposes"

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        return (self.first, self.second)

    def describe(self) -> str:
        return f"Transpose {self.first.name!r} -> Transpose {self.second.name!r}: merged"


@dataclass(frozen=True, eq=False)
class LayoutRegion(Match):
    """Ops that can run in the layout before `entries` (Transposes with `perm`): `exits` (Transposes with the
    inverse perm) cancel, `added` Transposes go back where other readers need the transposed layout."""

    perm: tuple[int, ...]
    members: tuple[gs.Node, ...]
    entries: tuple[gs.Node, ...]
    exits: tuple[gs.Node, ...]
    outside: tuple[gs.Tensor, ...]
    removed: int
    kind = "sink_transposes"

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        return (*self.entries, *self.members, *self.exits)

    def describe(self) -> str:
        ops = ", ".join(sorted({n.op for n in self.members}))
        return (f"{len(self.members)} ops ({ops}) run before Transpose {self.entries[0].name!r}: "
                f"{self.removed} Transposes removed, {len(self.outside)} added")


@dataclass
class _Growth:
    perm: tuple[int, ...]
    tensors: dict[int, gs.Tensor] = field(default_factory=dict)  # id -> tensor in the transposed layout
    members: list[gs.Node] = field(default_factory=list)
    entries: list[gs.Node] = field(default_factory=list)


def find_transpose_sinks(graph: gs.Graph) -> list[Match]:
    """Transpose pairs to merge; else the regions worth rewriting, disjoint, from the first Transpose on."""
    merges = _find_merges(graph)
    if merges:
        return list(merges)
    outputs = graph_output_names(graph)
    found: list[Match] = []
    used: set[int] = set()
    for node in graph.nodes:
        if node.op != "Transpose" or id(node) in used or perm_of(node) is None:
            continue
        region = _grow(graph, node, outputs)
        if region is not None and not used & {id(n) for n in region.nodes}:
            used |= {id(n) for n in region.nodes}
            found.append(region)
    return found


def _find_merges(graph: gs.Graph) -> list[TransposeMerge]:
    found, used = [], set()
    for node in graph.nodes:
        first = producer(node.inputs[0]) if node.op == "Transpose" and node.inputs else None
        if first is None or first.op != "Transpose" or id(first) in used or id(node) in used:
            continue
        if perm_of(first) is not None and perm_of(node) is not None:
            used |= {id(first), id(node)}
            found.append(TransposeMerge(first, node))
    return found


def _grow(graph: gs.Graph, seed: gs.Node, outputs: set[str]) -> LayoutRegion | None:
    perm = perm_of(seed)
    assert perm is not None
    growth = _Growth(perm)
    _add_entry(growth, seed)
    pending = list(seed.outputs[0].outputs)
    while pending:
        node = pending.pop()
        if any(n is node for n in growth.members) or not _admissible(node, growth, graph):
            continue
        growth.members.append(node)
        for source in node.inputs:
            entry = producer(source)
            if entry is not None and entry.op == "Transpose" and perm_of(entry) == perm:
                _add_entry(growth, entry)
                pending.extend(entry.outputs[0].outputs)
        if not _terminates(node):
            growth.tensors[id(node.outputs[0])] = node.outputs[0]
            pending.extend(node.outputs[0].outputs)
    return _judge(growth, outputs)


def _add_entry(growth: _Growth, entry: gs.Node) -> None:
    if not any(e is entry for e in growth.entries):
        growth.entries.append(entry)
        growth.tensors[id(entry.outputs[0])] = entry.outputs[0]


def _judge(growth: _Growth, outputs: set[str]) -> LayoutRegion | None:
    """The region as a match when it removes more Transposes than it must add back, else None."""
    inv = inverse(growth.perm)
    member_ids = {id(n) for n in growth.members}
    exits: list[gs.Node] = []
    outside: list[gs.Tensor] = []
    for tensor in growth.tensors.values():
        entry_output = any(tensor is e.outputs[0] for e in growth.entries)
        readers = [n for n in tensor.outputs if id(n) not in member_ids]
        if entry_output:
            continue  # an entry's other readers keep reading the entry, which stays for them
        # An exit is bypassed; it cannot be where both its input and its output are graph outputs (`bypass`).
        cancelling = [n for n in readers if n.op == "Transpose" and perm_of(n) == inv
                      and not (tensor.name in outputs and n.outputs[0].name in outputs)]
        exits.extend(cancelling)
        if len(cancelling) < len(readers) or tensor.name in outputs:
            outside.append(tensor)
    absorbed = [e for e in growth.entries if all(id(n) in member_ids for n in e.outputs[0].outputs)]
    absorbed = [e for e in absorbed if e.outputs[0].name not in outputs]
    removed = len(absorbed) + len(exits)
    # A tie still pays when it only moves the layout change onto graph outputs that nothing else reads: the
    # Transpose then sits at the boundary, and the ops before it join the layout of the layers around them.
    to_boundary = all(t.name in outputs and not t.outputs for t in outside)
    if not growth.members or removed < len(outside) or removed == len(outside) and not to_boundary:
        return None
    return LayoutRegion(growth.perm, tuple(growth.members), tuple(growth.entries), tuple(exits), tuple(outside),
                        removed)


def _admissible(node: gs.Node, growth: _Growth, graph: gs.Graph) -> bool:
    """Whether `node` computes the same in the untransposed layout, given which inputs are in the region."""
    rank = len(growth.perm)
    if len(node.outputs) != 1 or not any(id(t) in growth.tensors for t in node.inputs):
        return False
    if node.op in REDUCE_OPS:
        return _reduce_axes(node, growth.perm) is not None
    axis_op = node.op in AXIS_OPS and (node.op == "Concat" or opset(graph) >= 13)  # Softmax: one axis from 13
    if not axis_op and node.op not in UNARY_OPS and node.op not in ELEMENTWISE_OPS:
        return False
    for index, tensor in enumerate(node.inputs):
        if id(tensor) in growth.tensors or is_missing(tensor) or index in SCALAR_INPUTS.get(node.op, ()):
            continue
        entry = producer(tensor)
        if entry is not None and entry.op == "Transpose" and perm_of(entry) == growth.perm:
            continue
        value = constant_array(tensor)
        if value is None or value.ndim > rank or node.op in AXIS_OPS and value.ndim != rank:
            return False
    out_rank = _rank(node.outputs[0])
    return out_rank is None or out_rank == rank


def _terminates(node: gs.Node) -> bool:
    """A Reduce that drops axes ends the region: its output is already in the layout its readers expect."""
    return node.op in REDUCE_OPS and not int(node.attrs.get("keepdims", 1))


def _reduce_axes(node: gs.Node, perm: tuple[int, ...]) -> list[int] | None:
    """The Reduce's axes in the untransposed layout, or None when the rewrite would change its output layout."""
    rank = len(perm)
    if int(node.attrs.get("noop_with_empty_axes", 0)):
        return None
    if "axes" in node.attrs:
        axes = list(node.attrs["axes"])
    elif len(node.inputs) > 1 and not is_missing(node.inputs[1]):
        raw = constant_array(node.inputs[1])
        if raw is None:
            return None
        axes = [int(a) for a in raw.reshape(-1)]
    else:
        axes = list(range(rank))
    axes = [a % rank for a in axes]
    mapped = sorted(perm[a] for a in axes)
    if not int(node.attrs.get("keepdims", 1)):
        kept = [perm[i] for i in range(rank) if i not in axes]
        if kept != sorted(kept):
            return None  # the kept axes would come out in another order
    return mapped


def _rank(tensor: gs.Tensor) -> int | None:
    shape = getattr(tensor, "shape", None)
    return None if shape is None else len(shape)


@graph_pass("sink_transposes", find_transpose_sinks)
def sink_transposes(graph: gs.Graph) -> list[Match]:
    """Sweeps over the Transposes, each merged with the one before it or grown into a region and rewritten on
    the spot (a rewrite changes only its region's neighbourhood), until a sweep changes nothing. Every rewrite
    lowers the count of Transposes or moves one onto a graph output, so the sweeps end; a sweep is linear in the
    graph (each region is grown once), where finding all regions again after each rewrite grew quadratically."""
    done: list[Match] = []
    outputs = graph_output_names(graph)
    namer = Namer(graph)
    for _ in range(MAX_ROUNDS):
        changed = False
        for node in [n for n in graph.nodes if n.op == "Transpose"]:
            if not node.outputs or not node.inputs or perm_of(node) is None:
                continue  # removed by an earlier rewrite of this sweep
            first = producer(node.inputs[0])
            if first is not None and first.op == "Transpose" and perm_of(first) is not None:
                merge = TransposeMerge(first, node)
                _merge(graph, merge)
                done.append(merge)
                changed = True
            elif (region := _grow(graph, node, outputs)) is not None:
                _rewrite_region(graph, region, namer)
                done.append(region)
                changed = True
        canonicalize(graph)
        if not changed:
            break
    return done


def _merge(graph: gs.Graph, match: TransposeMerge) -> None:
    first, second = match.first, match.second
    p, q = perm_of(first), perm_of(second)
    assert p is not None and q is not None
    composed = [p[i] for i in q]
    second.inputs[0] = first.inputs[0]
    second.attrs["perm"] = composed
    if composed == sorted(composed):
        bypass(graph, second, second.inputs[0])


def _rewrite_region(graph: gs.Graph, region: LayoutRegion, namer: Namer) -> None:
    perm, inv = region.perm, inverse(region.perm)
    sources = {id(e.outputs[0]): e.inputs[0] for e in region.entries}
    skip = {id(n) for n in (*region.members, *region.exits)}
    outside_readers = [(t, [n for n in t.outputs if id(n) not in skip]) for t in region.outside]
    for node in region.members:
        for index, tensor in enumerate(node.inputs):
            if id(tensor) in sources:
                node.inputs[index] = sources[id(tensor)]
            elif not is_missing(tensor) and index not in SCALAR_INPUTS.get(node.op, ()):
                value = constant_array(tensor)
                if value is not None and value.size > 1:
                    laid = np.transpose(value.reshape((1,) * (len(perm) - value.ndim) + value.shape), inv)
                    node.inputs[index] = gs.Constant(namer.take(f"{tensor.name}_relaid"), np.ascontiguousarray(laid))
        _remap_axes(node, perm, namer)
        if not _terminates(node):
            out = node.outputs[0]
            if out.shape is not None:
                out.shape = [out.shape[inv[j]] for j in range(len(perm))]
    for exit_node in region.exits:
        bypass(graph, exit_node, exit_node.inputs[0])
    for tensor, readers in outside_readers:
        _restore_layout(graph, tensor, perm, namer, readers)


def _remap_axes(node: gs.Node, perm: tuple[int, ...], namer: Namer) -> None:
    rank = len(perm)
    if node.op in AXIS_OPS:
        node.attrs["axis"] = perm[int(node.attrs.get("axis", 1 if node.op == "Concat" else -1)) % rank]
    elif node.op in REDUCE_OPS:
        axes = _reduce_axes(node, perm)
        assert axes is not None
        if "axes" in node.attrs:
            node.attrs["axes"] = axes
        elif len(node.inputs) > 1 and not is_missing(node.inputs[1]):
            node.inputs[1] = gs.Constant(namer.take(f"{node.name}_axes"), np.array(axes, np.int64))
        # no axes: every axis is reduced, in any layout


def _restore_layout(graph: gs.Graph, tensor: gs.Tensor, perm: tuple[int, ...], namer: Namer,
                    readers: list[gs.Node]) -> None:
    """Give the readers outside the region (and a graph output) the transposed layout back, by one Transpose."""
    shape = None if tensor.shape is None else [tensor.shape[p] for p in perm]
    restored = gs.Variable(namer.take(f"{tensor.name}_transposed"), dtype=tensor.dtype, shape=shape)
    for reader in readers:
        for index, t in enumerate(reader.inputs):
            if t is tensor:
                reader.inputs[index] = restored
    if tensor.name in graph_output_names(graph):
        original = tensor.name
        tensor.name = namer.take(f"{original}_untransposed")
        restored.name = original
        graph.outputs = [restored if t is tensor else t for t in graph.outputs]
    graph.nodes.append(gs.Node("Transpose", name=namer.take("Transpose_restore"), attrs={"perm": list(perm)},
                               inputs=[tensor], outputs=[restored]))
