"""Remove nodes that compute nothing: Identity, inference Dropout, no-op Casts, exact Cast round trips.

Framework ports and old converters write them by the hundred (a TensorFlow-weights ResNet-50 run through
PyTorch: 309 `Cast(float -> float)` among 845 nodes, issue #45). Each costs a copy at run time, and in an
INT8 graph each sits between a DequantizeLinear and the layer that should read it, so fusions stop there.
Removed when exact:
- Identity, and Dropout in inference (no `training_mode` input that could be true, its mask unused);
- a Cast to the type its input already has, and a Reshape / Flatten / Squeeze / Unsqueeze to the (static) shape
  its input already has;
- a Cast chain A -> B -> C whose first step loses nothing (B holds every A value: float -> double, int8 ->
  int32, float16 -> float): it is one Cast A -> C, and none at all when C is A;
- a Pad of zeros, and a Slice from the start to the end of every axis it names (static sizes);
- an Add or Sub of zeros, a Mul or Div by ones, whose constant broadcasts into the other input's shape without
  growing it (x + 0 is x, up to the sign of a zero): the zero biases and unit layer scales of freshly
  initialised exports (torchvision ConvNeXt's and ViT's Linear biases start at zero, a model exported before
  training or with weights loaded later), and Keras' Rescaling(1.0). onnxslim removes the same ones.
Lossy round trips (float -> float16 -> float rounds; float -> int -> float truncates) stay.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from trtopt.frontend.edit import bypass, can_bypass
from trtopt.passes.base import Match, graph_pass
from trtopt.passes.query import constant_array, is_missing, producer

F = onnx.TensorProto
# Types each type converts into without loss (every value of the key is a value of each type in the set).
EXACT_WIDENING: dict[int, frozenset[int]] = {
    F.FLOAT16: frozenset({F.FLOAT, F.DOUBLE}),
    F.BFLOAT16: frozenset({F.FLOAT, F.DOUBLE}),
    F.FLOAT: frozenset({F.DOUBLE}),
    F.INT8: frozenset({F.INT16, F.INT32, F.INT64, F.FLOAT, F.DOUBLE}),
    F.UINT8: frozenset({F.INT16, F.INT32, F.INT64, F.UINT16, F.UINT32, F.UINT64, F.FLOAT, F.DOUBLE}),
    F.INT16: frozenset({F.INT32, F.INT64, F.FLOAT, F.DOUBLE}),
    F.INT32: frozenset({F.INT64, F.DOUBLE}),
    F.BOOL: frozenset({F.INT8, F.UINT8, F.INT16, F.INT32, F.INT64, F.FLOAT, F.DOUBLE}),
}


@dataclass(frozen=True, eq=False)
class NoOp(Match):
    """A node whose output equals `source` (kind: identity, dropout, cast, reshape), or a Cast whose input Cast
    (`first`) widens exactly, so the two are one Cast (kind: cast_chain)."""

    node: gs.Node
    source: gs.Tensor
    kind: str
    first: gs.Node | None = None
    slot: int = 0  # the input the output equals (an Add of zeros may hold its data second)

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        return (self.node,) if self.first is None else (self.first, self.node)

    def describe(self) -> str:
        if self.kind == "cast_chain":
            return f"Cast {self.first.name!r} -> Cast {self.node.name!r}: one step" if self.first else ""
        return f"{self.node.op} {self.node.name!r} removed (computes nothing)"


def find_noops(graph: gs.Graph) -> list[NoOp]:
    found: list[NoOp] = []
    for node in graph.nodes:
        if len(node.outputs) < 1 or not node.inputs:
            continue
        match = _noop(node) or _cast_chain(node)
        if match is not None and (match.kind == "cast_chain" or can_bypass(graph, node, match.source)):
            found.append(match)
    return found


def _noop(node: gs.Node) -> NoOp | None:
    source = node.inputs[0]
    if node.op == "Identity":
        return NoOp(node, source, "identity")
    if node.op == "Dropout" and _inference_dropout(node):
        return NoOp(node, source, "dropout")
    if node.op == "Cast" and _dtype(source) is not None and _dtype(source) == node.attrs.get("to"):
        return NoOp(node, source, "cast")
    if node.op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze") and _static(source) and (
        _static(node.outputs[0]) and list(source.shape) == list(node.outputs[0].shape)
    ):
        return NoOp(node, source, "reshape")
    if node.op == "Reshape" and _keeps_shape(node):
        return NoOp(node, source, "reshape")  # Keras' squeeze-excite: [N, C, 1, 1] -> [-1, C, 1, 1]
    if node.op == "Pad" and _zero_pads(node):
        return NoOp(node, source, "pad")
    if node.op == "Slice" and _whole_slice(node):
        return NoOp(node, source, "slice")
    return _neutral(node)


def _zero_pads(pad: gs.Node) -> bool:
    """A Pad (opset 11+) whose constant pads are all zero: Swin's pad to a multiple of the window, once the
    shapes are folded, for a size that is one already."""
    pads = constant_array(pad.inputs[1]) if len(pad.inputs) > 1 else None
    return pads is not None and pads.size > 0 and not np.any(pads)


def _whole_slice(node: gs.Node) -> bool:
    """A Slice (opset 10+) that keeps every element: on each axis it names, step 1 from the start to the end of
    a static dimension (Swin's crop back from the padded size, when nothing was padded)."""
    shape = getattr(node.inputs[0], "shape", None)
    given = [t for t in node.inputs[1:5] if not is_missing(t)]
    values = [constant_array(t) for t in node.inputs[1:5]]
    if shape is None or len(given) < 2 or any(v is None for v, t in zip(values, node.inputs[1:5], strict=False)
                                              if not is_missing(t)):
        return False  # no shape, or starts, ends, axes or steps computed in the graph
    starts, ends = (np.asarray(v).reshape(-1) for v in values[:2])
    axes = values[2].reshape(-1) if len(values) > 2 and values[2] is not None else np.arange(len(starts))
    steps = values[3].reshape(-1) if len(values) > 3 and values[3] is not None else np.ones_like(starts)
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=False):
        size = shape[int(axis)] if -len(shape) <= int(axis) < len(shape) else None
        if not isinstance(size, int) or int(step) != 1 or not (int(start) == 0 or int(start) <= -size):
            return False
        if int(end) < size:
            return False
    return True


# op: (the constant that leaves the other input as it is, the input slots that constant may take)
NEUTRAL = {"Add": (0.0, (0, 1)), "Sub": (0.0, (1,)), "Mul": (1.0, (0, 1)), "Div": (1.0, (1,))}


def _neutral(node: gs.Node) -> NoOp | None:
    """An Add / Sub of zeros or a Mul / Div by ones that neither grows its data input's shape nor changes its
    type (see the module)."""
    if node.op not in NEUTRAL or len(node.inputs) != 2:
        return None
    value, slots = NEUTRAL[node.op]
    for slot in slots:
        constant, data = constant_array(node.inputs[slot]), node.inputs[1 - slot]
        if constant is None or not constant.size or isinstance(data, gs.Constant) or not np.all(constant == value):
            continue
        if _dtype(data) == _dtype(node.outputs[0]) and _broadcasts_into(constant.shape, getattr(data, "shape", None)):
            return NoOp(node, data, "neutral", slot=1 - slot)
    return None


def _broadcasts_into(shape: tuple[int, ...], into: object) -> bool:
    """Whether an array of `shape` broadcast against a tensor of (known rank) shape `into` leaves `into` as it is."""
    if not isinstance(into, (list, tuple)) or len(shape) > len(into):
        return False
    return all(c == 1 or (isinstance(d, int) and c == d) for c, d in zip(reversed(shape), reversed(into), strict=False))


def _keeps_shape(reshape: gs.Node) -> bool:
    """A Reshape to a constant shape that names its input's own: the same dimensions after the first (0 copies
    one), and the first -1, 0 or the input's own."""
    target = constant_array(reshape.inputs[1]) if len(reshape.inputs) > 1 else None
    shape = getattr(reshape.inputs[0], "shape", None)
    if target is None or shape is None or target.ndim != 1 or len(target) != len(shape) or not len(shape):
        return False
    if int(reshape.attrs.get("allowzero", 0)):
        return False
    rest = all(isinstance(d, int) and int(t) in (d, 0) for d, t in zip(shape[1:], target[1:], strict=True))
    return rest and (int(target[0]) in (-1, 0) or int(target[0]) == shape[0])


def _static(tensor: gs.Tensor) -> bool:
    shape = getattr(tensor, "shape", None)
    return shape is not None and all(isinstance(d, int) and d >= 0 for d in shape)


def _cast_chain(node: gs.Node) -> NoOp | None:
    first = producer(node.inputs[0]) if node.op == "Cast" else None
    if first is None or first.op != "Cast" or "to" not in node.attrs:
        return None
    origin, middle = _dtype(first.inputs[0]), first.attrs.get("to")
    if origin is None or middle not in EXACT_WIDENING.get(origin, ()):
        return None
    return NoOp(node, first.inputs[0], "cast_chain", first)


def _inference_dropout(node: gs.Node) -> bool:
    if len(node.outputs) > 1 and node.outputs[1].outputs:
        return False  # the mask is read
    if len(node.inputs) < 3 or is_missing(node.inputs[2]):
        return True
    mode = constant_array(node.inputs[2])
    return mode is not None and not bool(mode.reshape(-1)[0])


def _dtype(tensor: gs.Tensor) -> int | None:
    """The ONNX element type of a tensor, when known."""
    dtype = getattr(tensor, "dtype", None)
    if dtype is None:
        return None
    try:
        return int(onnx.helper.np_dtype_to_tensor_dtype(dtype))
    except (TypeError, KeyError, ValueError):
        return int(dtype) if isinstance(dtype, int) else None


@graph_pass("remove_noops", find_noops)
def remove_noops(graph: gs.Graph) -> list[NoOp]:
    done: list[NoOp] = []
    for match in find_noops(graph):
        # Read the source now: an earlier rewrite in this run may have removed the node that made it.
        if match.kind != "cast_chain":
            if bypass(graph, match.node, match.node.inputs[match.slot]):
                done.append(match)
            continue
        source = match.first.inputs[0] if match.first is not None else match.source
        match.node.inputs[0] = source  # the first Cast dies when nothing else reads it
        if match.node.attrs.get("to") != _dtype(source) or bypass(graph, match.node, source):
            done.append(match)
    return done
