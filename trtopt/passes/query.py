"""Read-only facts about a gs.Graph that passes, the quantizer and the reports ask: constants, producers,
consumers (`proto_links` for an ONNX graph proto), conv geometry, a layer's channels, a Clip's bounds."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import onnx
import onnx_graphsurgeon as gs

CONV_OPS = ("Conv", "ConvTranspose")
T = TypeVar("T")


def proto_links(graph: onnx.GraphProto) -> tuple[dict[str, onnx.NodeProto], dict[str, list[onnx.NodeProto]]]:
    """(tensor -> the node that makes it, tensor -> the nodes that read it) of an ONNX graph proto."""
    producers = {out: node for node in graph.node for out in node.output if out}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    return producers, consumers


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


def constant_tensor(tensor: gs.Tensor | None) -> gs.Constant | None:
    """The constant behind a tensor (an initializer, or a Constant node's value), else None."""
    if tensor is None or isinstance(tensor, gs.Constant):
        return tensor
    node = producer(tensor)
    value = node.attrs.get("value") if node is not None and node.op == "Constant" else None
    return value if isinstance(value, gs.Constant) else None


def constant_array(tensor: gs.Tensor | None) -> np.ndarray | None:
    """The value of a constant tensor (initializer or Constant node output), else None."""
    constant = constant_tensor(tensor)
    return None if constant is None else np.asarray(constant.values)


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


def output_channels(layer: gs.Node) -> int | None:
    """Output channels (features) of a Conv, ConvTranspose, Gemm or MatMul whose weight is constant
    (an initializer or a Constant node), else None.

    The weight layouts are ONNX's: Conv (Cout, Cin/group, k...); ConvTranspose (Cin, Cout/group, k...);
    Gemm B (K, N), or (N, K) with transB; MatMul B (..., K, N). A weight of the wrong rank for its op
    (a 1-D MatMul operand has no feature axis) gives None.
    """
    shape = _weight_shape(layer)
    if shape is None:
        return None
    if layer.op == "Conv":
        return shape[0]
    if layer.op == "ConvTranspose":
        return shape[1] * int(layer.attrs.get("group", 1))
    if layer.op == "Gemm":
        return shape[0] if layer.attrs.get("transB", 0) else shape[1]
    return shape[-1]


def input_channels(layer: gs.Node) -> int | None:
    """Input channels (features) a layer reads, from its constant weight as in `output_channels`."""
    shape = _weight_shape(layer)
    if shape is None:
        return None
    if layer.op == "Conv":
        return shape[1] * int(layer.attrs.get("group", 1))
    if layer.op == "ConvTranspose":
        return shape[0]
    if layer.op == "Gemm":
        return shape[1] if layer.attrs.get("transB", 0) else shape[0]
    return shape[-2]


def _weight_shape(layer: gs.Node) -> tuple[int, ...] | None:
    """The constant weight's shape when its rank suits the op (see `output_channels`), else None."""
    weight = constant_array(layer.inputs[1]) if len(layer.inputs) > 1 else None
    if weight is None:
        return None
    rank = weight.ndim
    if layer.op in CONV_OPS:
        fits = rank >= 3
    else:
        fits = rank == 2 if layer.op == "Gemm" else layer.op == "MatMul" and rank >= 2
    return tuple(int(d) for d in weight.shape) if fits else None


Bound = float | None
Bounds = tuple[Bound, Bound]


def clip_bounds(node: gs.Node) -> Bounds:
    """(min, max) of a Clip, each None when computed at run time. See `read_clip_bounds`."""
    return read_clip_bounds(node.attrs, node.inputs[1:3], constant_array, is_missing)


def read_clip_bounds(
    attrs: Mapping[str, Any],
    operands: Sequence[T],
    value: Callable[[T], np.ndarray | None],
    missing: Callable[[T], bool],
) -> Bounds:
    """A Clip's (min, max) from its attributes (before opset 11) or its constant operands (from 11).

    `value` gives an operand's constant value (None for a computed operand); `missing` tells an omitted
    operand. An absent bound is -inf / +inf; a computed one (or one that is not a single number) is None.
    Written once for both IRs: onnx-graphsurgeon nodes (`clip_bounds`) and NodeProtos (CPU lowering).
    """
    bounds: list[Bound] = [float(attrs.get("min", -np.inf)), float(attrs.get("max", np.inf))]
    for i, operand in enumerate(operands):
        if not missing(operand):
            array = value(operand)
            bounds[i] = float(array.reshape(-1)[0]) if array is not None and array.size == 1 else None
    return bounds[0], bounds[1]
