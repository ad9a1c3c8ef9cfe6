"""Read-only facts about a gs.Graph that every pass asks: constants, producers, consumers, conv geometry."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

CONV_OPS = ("Conv", "ConvTranspose")


def graph_output_names(graph: gs.Graph) -> set[str]:
    return {t.name for t in graph.outputs}


def producer(tensor: gs.Tensor) -> gs.Node | None:
    return tensor.inputs[0] if isinstance(tensor, gs.Variable) and tensor.inputs else None


def sole_consumer(tensor: gs.Tensor, graph_outputs: set[str]) -> gs.Node | None:
    """The one node reading `tensor` (once), or None if it has other readers or is a graph output.

    A tensor with other readers or one that is a graph output must stay materialised, so nothing
    may be fused across it.
    """
    if tensor.name in graph_outputs or len(tensor.outputs) != 1:
        return None
    node = tensor.outputs[0]
    return node if sum(t is tensor for t in node.inputs) == 1 else None


def constant_array(tensor: gs.Tensor | None) -> np.ndarray | None:
    """The value of a constant tensor (initializer or Constant node output), else None."""
    if tensor is None:
        return None
    if isinstance(tensor, gs.Constant):
        return np.asarray(tensor.values)
    node = producer(tensor)
    if node is not None and node.op == "Constant" and isinstance(node.attrs.get("value"), gs.Constant):
        return np.asarray(node.attrs["value"].values)
    return None


def is_missing(tensor: gs.Tensor) -> bool:
    """An omitted optional input (empty name)."""
    return isinstance(tensor, gs.Variable) and not tensor.name


def opset(graph: gs.Graph) -> int:
    return int(graph.opset) if graph.opset else 13


def same_shape(a: gs.Tensor, b: gs.Tensor) -> bool:
    """True only when both shapes are known and equal (no broadcasting): each dimension the same
    integer, or the same named symbolic dimension (ONNX shape inference gives equal sizes one name,
    as with a dynamic `batch`)."""
    sa, sb = a.shape, b.shape
    if sa is None or sb is None or len(sa) != len(sb):
        return False
    return all(
        (isinstance(x, int) and x >= 0 or isinstance(x, str) and bool(x)) and x == y
        for x, y in zip(sa, sb, strict=True)
    )


@dataclass(frozen=True)
class ConvGeometry:
    """Everything that must match for two convs on one tensor to be computed as one wide conv."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[int, ...]
    dilations: tuple[int, ...]
    group: int


def conv_geometry(conv: gs.Node) -> ConvGeometry | None:
    """The geometry of a Conv with a constant weight and explicit padding, else None."""
    weight = constant_array(conv.inputs[1]) if len(conv.inputs) > 1 else None
    auto_pad = conv.attrs.get("auto_pad", "NOTSET")
    if weight is None or weight.ndim < 3 or auto_pad not in ("NOTSET", b"NOTSET"):
        return None
    kernel = tuple(int(k) for k in (conv.attrs.get("kernel_shape") or weight.shape[2:]))
    rank = len(kernel)
    return ConvGeometry(
        kernel=kernel,
        strides=tuple(int(s) for s in (conv.attrs.get("strides") or (1,) * rank)),
        pads=tuple(int(p) for p in (conv.attrs.get("pads") or (0,) * 2 * rank)),
        dilations=tuple(int(d) for d in (conv.attrs.get("dilations") or (1,) * rank)),
        group=int(conv.attrs.get("group", 1)),
    )
