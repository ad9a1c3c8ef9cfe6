"""Outputs picked by data-dependent selection, judged by what they are picked from.

An end-to-end detector ends in its own post-processing: `TopK` over the scores, then a gather of the boxes at
the indices it chose (RT-DETR, YOLOv10), or `NonMaxSuppression` and a gather (SSD exports, YOLO with NMS),
or `NonZero` of a thresholded map. Such outputs are not continuous in the model's values: a score that INT8
moves by 0.1% can swap two entries of a TopK, and the boxes gathered after it then differ by whole boxes;
NMS can keep one box more or fewer. Compared element by element they say a plan is broken when its scores
and boxes are as close to FP32 as any other output (a YOLOX detector with a TopK head, avx2: kernels vs
reference cosine 0.9998 on the raw head, 0.81 on the gathered boxes, so the build was refused; with NMS,
FP32 and INT8 kept 30 and 32 boxes and the comparison stopped with a traceback).

So a build judges those outputs by the tensors they are selected from (`find_selection`): walking back
from each such output through the ops after the selection (`SELECTING_OPS` and all they feed), every tensor
those ops read that no selection computed, float and not a constant (a bool or integer one, such as a
thresholded mask, by the float tensors it is computed from). For the detectors above: the decoded scores and
boxes before TopK or NMS. The verification (`trtopt.verify`) and the sensitivity search compare those in
place of the selected outputs; the outputs themselves still have to be produced with their declared shapes.
`ArgMax` is not a selecting op here: a label map that ends in one has its own figures (`trtopt.metrics.labels`).
A peak mask `Equal(x, MaxPool(x))` (CenterNet's NMS by max-pooling, `peak_mask`) is one: nothing else that compares
is, since a comparison inside the network (a mask, a hand-written activation) is followed by layers to verify.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import onnx

from trtopt.frontend import weightless
from trtopt.passes.query import proto_links

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs

    from trtopt.plan import Plan

log = logging.getLogger(__name__)

SELECTING_OPS = {"TopK", "NonMaxSuppression", "NonZero"}
_FLOAT = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}
_WEIGHTED = {"Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum"}  # the network's layers
_LAYOUT_OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity"}  # the same values, reshaped
_DEPTH = 8  # how far back through bool / integer tensors (a mask, a Cast) the float ones are looked for


@dataclass(frozen=True)
class Selection:
    """The graph outputs computed through a selecting op, and the tensors judged in their place."""

    selected: tuple[str, ...]
    judged: tuple[str, ...]
    kinds: tuple[int, ...]  # the judged tensors' element types (onnx.TensorProto), as shape inference found them

    def compared(self, outputs: Mapping[str, Any]) -> dict[str, Any]:
        """`outputs` without the selected ones (the judged tensors, where present, stay)."""
        return {k: v for k, v in outputs.items() if k not in self.selected}

    def describe(self) -> str:
        return (f"after TopK / NMS / NonZero / a max-pool peak mask ({short_list(self.selected)}) judged by the "
                f"tensors they select from ({short_list(self.judged)})")  # fmt: skip


def find_selection(model: onnx.ModelProto) -> Selection | None:
    """The `Selection` of `model`'s outputs (None: no output is computed through a selecting op, or no
    float tensor to judge in their place was found)."""
    graph = model.graph
    producers, consumers = proto_links(graph)
    after = _downstream(graph, producers, consumers)
    selected = tuple(o.name for o in graph.output if o.name in after)
    if not selected:
        return None
    types = _elem_types(model)
    constants = {t.name for t in graph.initializer} | {n.output[0] for n in graph.node if n.op_type == "Constant"}
    skip = constants | {i.name for i in graph.input}
    judged: list[str] = []
    for node in _tail(selected, producers, after):
        for name in node.input:
            if name and name not in after and name not in skip:
                judged += [t for t in _float_sources(name, producers, types, skip) if t not in judged]
    if not judged:
        return None
    found = Selection(selected, tuple(judged), tuple(types.get(t, onnx.TensorProto.FLOAT) for t in judged))
    log.info("outputs %s", found.describe())
    return found


def judged_model(model: onnx.ModelProto, selection: Selection) -> onnx.ModelProto:
    """A copy of `model` that also outputs the judged tensors (the selected outputs stay)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    have = {o.name for o in copy.graph.output}
    for name, kind in zip(selection.judged, selection.kinds, strict=True):
        if name not in have:
            copy.graph.output.append(onnx.helper.make_tensor_value_info(name, kind, None))
    return copy


def judging(plan: Plan, selection: Selection | None, section: str = "onnx") -> Plan:
    """`plan` with its ONNX also computing `selection`'s judged tensors where `section` (the plan section
    that is run: the reference's, or the backend's `runner_section`) is that ONNX, else `plan` itself (a
    TensorRT engine computes its graph outputs only)."""
    if selection is None or section != "onnx":
        return plan
    from dataclasses import replace

    onnx_bytes = judged_model(onnx.load_from_string(plan.sections["onnx"]), selection).SerializeToString()
    return replace(plan, sections={**plan.sections, "onnx": onnx_bytes})


def judged_graph(graph: gs.Graph, layers: Sequence[str]) -> tuple[gs.Graph, list[str]]:
    """(the graph the sensitivity search measures, the layers of `layers` in it): `graph` itself, or where
    some outputs are selected, a copy whose outputs are the others and the judged tensors, the selection's
    ops cut away (the verification judges the plan the same way)."""
    import numpy as np

    from trtopt.frontend import onnx_from_graph

    if not any(node.op in SELECTING_OPS | {"Equal"} for node in graph.nodes):  # no export for the common case
        return graph, list(layers)
    selection = find_selection(onnx_from_graph(graph))
    if selection is None:
        return graph, list(layers)
    copy = graph.copy()
    tensors = copy.tensors()
    judged = [tensors[name] for name in selection.judged]
    for tensor in judged:
        tensor.dtype = tensor.dtype if tensor.dtype is not None else np.float32
    copy.outputs = [t for t in copy.outputs if t.name not in selection.selected] + judged
    copy.cleanup()
    kept = {node.name for node in copy.nodes}
    return copy, [layer for layer in layers if layer in kept]


def _downstream(
    graph: onnx.GraphProto, producers: Mapping[str, onnx.NodeProto], consumers: Mapping[str, list[onnx.NodeProto]]
) -> set[str]:  # fmt: skip
    """Every tensor computed from the output of a selecting op that selects by the network's values: its data
    input computed by a weighted layer (`_WEIGHTED`), not a mask of token ids that selects before the network
    has run, whose outputs are the network's own and are judged as they are."""
    selecting = [node for node in graph.node if node.op_type in SELECTING_OPS or peak_mask(node, producers)]
    stack = [out for node in selecting if _computed(node.input[:2], producers) for out in node.output if out]
    seen: set[str] = set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        stack += [out for node in consumers.get(name, []) for out in node.output if out]
    return seen


def peak_mask(node: onnx.NodeProto, producers: Mapping[str, onnx.NodeProto]) -> bool:
    """Whether `node` is `Equal(x, MaxPool(x))`: the local maxima of a heat map (CenterNet's NMS by max-pooling; the
    quality head of afis's LEADER, round 13's hunt). It selects by the values as NMS does: a rounding difference
    moves a peak by a pixel, and the masked map then differs by whole peaks."""
    if node.op_type != "Equal" or len(node.input) != 2:
        return False
    for value, pooled in (node.input, list(reversed(node.input))):  # through reshapes on either side (tf2onnx's)
        pool = producers.get(_unshaped(pooled, producers, set()))
        if pool is not None and pool.op_type == "MaxPool" and _unshaped(pool.input[0], producers, set()) == \
                _unshaped(value, producers, set()):
            return True
    return False


def _computed(names: Sequence[str], producers: Mapping[str, onnx.NodeProto]) -> bool:
    """Whether a weighted layer computes any of the tensors `names` (as far back as the graph goes)."""
    stack, seen = [n for n in names if n], set()
    while stack:
        node = producers.get(stack.pop())
        if node is None or id(node) in seen:
            continue
        if node.op_type in _WEIGHTED:
            return True
        seen.add(id(node))
        stack += [i for i in node.input if i]
    return False


def _tail(
    selected: tuple[str, ...], producers: Mapping[str, onnx.NodeProto], after: set[str]
) -> list[onnx.NodeProto]:  # fmt: skip
    """The nodes that compute the selected outputs from the selection on: the selecting ops they go back to
    and every node between."""
    nodes: dict[int, onnx.NodeProto] = {}
    stack = list(selected)
    while stack:
        node = producers.get(stack.pop())
        if node is None or id(node) in nodes:
            continue
        nodes[id(node)] = node
        stack += [i for i in node.input if i in after]  # back to the selection (and a selection before it)
    return list(nodes.values())


def _float_sources(
    name: str, producers: Mapping[str, onnx.NodeProto], types: Mapping[str, int], skip: set[str]
) -> list[str]:  # fmt: skip
    """`name` if it is a float tensor; else the float tensors it is computed from (a mask: what it thresholds),
    `_DEPTH` ops back at most; none for a tensor of unknown type or one computed from a shape."""
    found: list[str] = []
    stack = [(name, 0)]
    while stack:
        tensor, depth = stack.pop()
        kind = types.get(tensor)
        if kind in _FLOAT:
            found.append(_unshaped(tensor, producers, skip))
            continue
        node = producers.get(tensor)
        if kind is None or node is None or depth >= _DEPTH or node.op_type in ("Shape", "Size"):
            continue
        stack += [(i, depth + 1) for i in node.input if i and i not in skip]
    return found


def _unshaped(name: str, producers: Mapping[str, onnx.NodeProto], skip: set[str]) -> str:
    """The tensor `name` is a reshaping of (`_LAYOUT_OPS`, back as far as they go): the same values, so that the
    scores one node reads as [N, 1, A] and another as [N, A] are one tensor judged."""
    node = producers.get(name)
    while node is not None and node.op_type in _LAYOUT_OPS and node.input[0] not in skip:
        name = node.input[0]
        node = producers.get(name)
    return name


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """Each tensor's element type, as ONNX's shape inference finds it (what it cannot infer is absent)."""
    try:
        inferred = weightless.infer_shapes(model)
    except Exception as exc:  # noqa: BLE001 - a model shape inference cannot follow: types declared only
        log.debug("shape inference: %s", exc)
        inferred = model
    graph = inferred.graph
    return {v.name: v.type.tensor_type.elem_type for v in (*graph.value_info, *graph.input, *graph.output)
            if v.type.tensor_type.elem_type}  # fmt: skip


def short_list(names: Sequence[str], shown: int = 4) -> str:
    """The first `shown` names, comma-separated, and how many more there are: an SSD export selects from 90 tensors."""
    names = tuple(names)
    return ", ".join(names[:shown]) + (f" (+{len(names) - shown} more)" if len(names) > shown else "")
