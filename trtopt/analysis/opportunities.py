"""Fusion opportunities: small pure matchers over a gs.Graph, each returning frozen match records.

The matchers only *find*; they never change the graph. They follow the fusions TensorRT performs
(NVIDIA, "TensorRT Developer Guide: Layer fusion"; GTC 2017 "8-bit Inference with TensorRT"):

- vertical: Conv + BatchNorm (folded into the weights), Conv (+BN) + activation (CBR),
  Conv (+BN) + residual Add (the add runs in the conv's epilogue);
- horizontal: sibling convolutions that read one tensor with identical kernel, stride, pads,
  dilation and group become one wide conv whose output is split;
- concat elimination: producers write straight into slices of the Concat's output.

Matches hold references to gs nodes (identity equality: two matches are the same only if they are
the same object), so a pass can rewrite exactly the nodes that were matched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import onnx_graphsurgeon as gs

CONV_OPS = ("Conv", "ConvTranspose")
# Single-input activations TensorRT fuses into a conv epilogue, by ONNX op -> name shown to users.
ACTIVATION_OPS = {
    "Relu": "relu",
    "LeakyRelu": "leaky_relu",
    "Sigmoid": "sigmoid",
    "Tanh": "tanh",
    "Elu": "elu",
    "HardSigmoid": "hard_sigmoid",
    "HardSwish": "hard_swish",
    "Clip": "clip",
}
# `x * gate(x)` pairs: PyTorch exports SiLU as x*Sigmoid(x) and, before opset 14, HardSwish as
# x*HardSigmoid(x).
GATED_ACTIVATIONS = {"Sigmoid": "silu", "HardSigmoid": "hard_swish"}


def node_label(node: gs.Node) -> str:
    """A readable name for a node, even an unnamed one."""
    if node.name:
        return str(node.name)
    first = node.outputs[0].name if node.outputs else "?"
    return f"{node.op}->{first}"


@dataclass(frozen=True, eq=False)
class Match:
    """Base of all matches: a kind, the nodes involved, and a one-line description."""

    kind: ClassVar[str] = "match"

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        raise NotImplementedError

    def describe(self) -> str:
        return " -> ".join(node_label(n) for n in self.nodes)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "nodes": [node_label(n) for n in self.nodes], "detail": self.describe()}


@dataclass(frozen=True, eq=False)
class ConvBatchNorm(Match):
    """A conv whose only consumer is an inference BatchNorm with constant statistics."""

    kind: ClassVar[str] = "conv_bn"
    conv: gs.Node
    bn: gs.Node

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        return (self.conv, self.bn)

    def describe(self) -> str:
        return f"fold {node_label(self.bn)} into {node_label(self.conv)}"


@dataclass(frozen=True, eq=False)
class ConvActivation(Match):
    """Conv, an optional BatchNorm, then an activation (one node, or two for x*gate(x))."""

    kind: ClassVar[str] = "conv_act"
    conv: gs.Node
    bn: gs.Node | None
    activation: str
    act_nodes: tuple[gs.Node, ...]

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        return (self.conv, *((self.bn,) if self.bn else ()), *self.act_nodes)

    def describe(self) -> str:
        bn = " + BN" if self.bn else ""
        return f"{node_label(self.conv)}{bn} + {self.activation}"


@dataclass(frozen=True, eq=False)
class ConvResidualAdd(Match):
    """A conv branch (optionally through a BN) added to another tensor of the same shape."""

    kind: ClassVar[str] = "conv_add"
    conv: gs.Node
    bn: gs.Node | None
    add: gs.Node
    residual: str
    relu: gs.Node | None

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        extra = (self.relu,) if self.relu else ()
        return (self.conv, *((self.bn,) if self.bn else ()), self.add, *extra)

    def describe(self) -> str:
        relu = " + relu" if self.relu else ""
        return f"{node_label(self.conv)} + residual {self.residual!r} in {node_label(self.add)}{relu}"


@dataclass(frozen=True, eq=False)
class SiblingConvs(Match):
    """Two or more convs reading one tensor with the same kernel, stride, pads, dilation and group."""

    kind: ClassVar[str] = "sibling_convs"
    input: str
    convs: tuple[gs.Node, ...]
    signature: tuple[tuple[int, ...], ...]  # kernel, strides, pads, dilations, (group,)

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        return self.convs

    def describe(self) -> str:
        kernel = "x".join(str(k) for k in self.signature[0])
        names = ", ".join(map(node_label, self.convs))
        return f"{len(self.convs)} {kernel} convs read {self.input!r}: {names}"


@dataclass(frozen=True, eq=False)
class ConcatJoin(Match):
    """A Concat and what lets it be eliminated (or why not)."""

    kind: ClassVar[str] = "concat"
    concat: gs.Node
    axis: int
    in_place: bool  # every input is a fresh tensor used only here: producers can write into slices
    nested: tuple[gs.Node, ...]  # Concats on the same axis feeding this one (flatten)
    split: gs.Node | None  # a Split whose outputs feed this Concat in order (identity)

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        return (self.concat, *self.nested, *((self.split,) if self.split else ()))

    def describe(self) -> str:
        notes = ["in-place" if self.in_place else "needs a copy"]
        if self.nested:
            notes.append(f"{len(self.nested)} nested concat(s)")
        if self.split:
            notes.append(f"identity with {node_label(self.split)}")
        inputs = len(self.concat.inputs)
        return f"{node_label(self.concat)} axis {self.axis}, {inputs} inputs: {', '.join(notes)}"


# -- helpers --------------------------------------------------------------------------------------


def _outputs(graph: gs.Graph) -> set[str]:
    return {t.name for t in graph.outputs}


def _sole_consumer(tensor: gs.Tensor, graph_outputs: set[str]) -> gs.Node | None:
    """The one node reading `tensor`, or None if several do or it is a graph output."""
    if tensor.name in graph_outputs or len(tensor.outputs) != 1:
        return None
    return tensor.outputs[0]


def _producer(tensor: gs.Tensor) -> gs.Node | None:
    return tensor.inputs[0] if isinstance(tensor, gs.Variable) and tensor.inputs else None


def _constant_value(tensor: gs.Tensor) -> np.ndarray | None:
    """The value of an initializer or of a Constant node's output; None for anything computed."""
    if isinstance(tensor, gs.Constant):
        return np.asarray(tensor.values)
    producer = _producer(tensor)
    value = producer.attrs.get("value") if producer is not None and producer.op == "Constant" else None
    return np.asarray(value.values) if isinstance(value, gs.Constant) else None


def _is_constant(tensor: gs.Tensor) -> bool:
    return _constant_value(tensor) is not None


def _clip_name(node: gs.Node) -> str | None:
    """relu6 / relu / clip for a Clip with constant bounds (attributes before opset 11, inputs after)."""
    bounds: list[float | None] = [node.attrs.get("min"), node.attrs.get("max")]
    for i, tensor in enumerate(node.inputs[1:3]):
        if isinstance(tensor, gs.Variable) and tensor.is_empty():
            continue
        value = _constant_value(tensor)
        if value is None:
            return None
        bounds[i] = float(value.reshape(-1)[0])
    if bounds[0] == 0.0 and bounds[1] == 6.0:
        return "relu6"
    if bounds[0] == 0.0 and bounds[1] is None:
        return "relu"
    return "clip"


def activation_after(tensor: gs.Tensor, graph_outputs: set[str]) -> tuple[str, tuple[gs.Node, ...]] | None:
    """The activation applied to `tensor` (and nothing else reading it), with its node(s)."""
    if tensor.name in graph_outputs:
        return None
    readers = list(tensor.outputs)
    if len(readers) == 1 and readers[0].op in ACTIVATION_OPS and readers[0].inputs[0] is tensor:
        node = readers[0]
        name = _clip_name(node) if node.op == "Clip" else ACTIVATION_OPS[node.op]
        return (name, (node,)) if name else None
    if len(readers) == 2:
        gates = [n for n in readers if n.op in GATED_ACTIVATIONS]
        muls = [n for n in readers if n.op == "Mul"]
        if len(gates) == 1 and len(muls) == 1:
            gate, mul = gates[0], muls[0]
            gated = gate.outputs[0]
            if gate.op == "HardSigmoid" and not _is_hard_swish_gate(gate):
                return None
            operands = {id(t) for t in mul.inputs}
            if _sole_consumer(gated, graph_outputs) is mul and operands == {id(tensor), id(gated)}:
                return GATED_ACTIVATIONS[gate.op], (gate, mul)
    return None


def _is_hard_swish_gate(node: gs.Node) -> bool:
    alpha, beta = node.attrs.get("alpha", 0.2), node.attrs.get("beta", 0.5)
    return bool(np.isclose(alpha, 1 / 6) and np.isclose(beta, 0.5))


def _after_bn(conv: gs.Node, graph_outputs: set[str]) -> tuple[gs.Node | None, gs.Tensor]:
    """(bn, tensor): the BatchNorm that alone reads the conv's output, if any, and the tensor after it."""
    out = conv.outputs[0]
    reader = _sole_consumer(out, graph_outputs)
    if reader is not None and reader.op == "BatchNormalization" and all(map(_is_constant, reader.inputs[1:])):
        return reader, reader.outputs[0]
    return None, out


def _conv_signature(conv: gs.Node) -> tuple[tuple[int, ...], ...] | None:
    weight = conv.inputs[1] if len(conv.inputs) > 1 else None
    explicit_pads = conv.attrs.get("auto_pad", "NOTSET") in ("NOTSET", b"NOTSET")
    if weight is None or not _is_constant(weight) or not explicit_pads:
        return None
    kernel = tuple(conv.attrs.get("kernel_shape") or _constant_value(weight).shape[2:])  # type: ignore[union-attr]
    rank = len(kernel)
    return (
        kernel,
        tuple(conv.attrs.get("strides") or (1,) * rank),
        tuple(conv.attrs.get("pads") or (0,) * 2 * rank),
        tuple(conv.attrs.get("dilations") or (1,) * rank),
        (int(conv.attrs.get("group", 1)),),
    )


# -- matchers -------------------------------------------------------------------------------------


def match_conv_bn(graph: gs.Graph) -> list[ConvBatchNorm]:
    """Conv/ConvTranspose whose output feeds only a BatchNorm with constant parameters."""
    outputs = _outputs(graph)
    found = []
    for node in graph.nodes:
        if node.op in CONV_OPS and _is_constant(node.inputs[1]):
            bn, _ = _after_bn(node, outputs)
            if bn is not None:
                found.append(ConvBatchNorm(conv=node, bn=bn))
    return found


def match_conv_activation(graph: gs.Graph) -> list[ConvActivation]:
    """Conv (+ BN) followed by an activation that only it feeds."""
    outputs = _outputs(graph)
    found = []
    for node in graph.nodes:
        if node.op not in CONV_OPS:
            continue
        bn, tensor = _after_bn(node, outputs)
        act = activation_after(tensor, outputs)
        if act is not None:
            found.append(ConvActivation(conv=node, bn=bn, activation=act[0], act_nodes=act[1]))
    return found


def match_conv_add(graph: gs.Graph) -> list[ConvResidualAdd]:
    """Add(conv branch, residual) with no broadcasting; the first eligible operand is the conv branch."""
    outputs = _outputs(graph)
    found = []
    for add in graph.nodes:
        if add.op != "Add" or len(add.inputs) != 2:
            continue
        for i, branch in enumerate(add.inputs):
            other = add.inputs[1 - i]
            conv = _branch_conv(branch, outputs)
            if conv is None or _is_constant(other) or not _same_shape(branch, other, add.outputs[0]):
                continue
            bn, _ = _after_bn(conv, outputs)
            relu = _sole_consumer(add.outputs[0], outputs)
            relu = relu if relu is not None and relu.op == "Relu" else None
            found.append(ConvResidualAdd(conv=conv, bn=bn, add=add, residual=other.name, relu=relu))
            break
    return found


def _branch_conv(tensor: gs.Tensor, graph_outputs: set[str]) -> gs.Node | None:
    """The conv producing `tensor` (directly or through a BN), if `tensor` only feeds one node."""
    producer = _producer(tensor)
    if producer is None or _sole_consumer(tensor, graph_outputs) is None:
        return None
    if producer.op == "BatchNormalization":
        conv = _producer(producer.inputs[0])
        if conv is not None and conv.op in CONV_OPS and _after_bn(conv, graph_outputs)[0] is producer:
            return conv
        return None
    return producer if producer.op in CONV_OPS else None


def _same_shape(*tensors: gs.Tensor) -> bool:
    shapes = [tuple(t.shape) if t.shape is not None else None for t in tensors]
    return None in shapes or len(set(shapes)) == 1


def match_sibling_convs(graph: gs.Graph) -> list[SiblingConvs]:
    """Groups of >= 2 convs with constant weights that read the same tensor with the same geometry."""
    groups: dict[tuple[int, tuple[tuple[int, ...], ...]], list[gs.Node]] = {}
    inputs: dict[int, str] = {}
    for node in graph.nodes:
        if node.op != "Conv":
            continue
        signature = _conv_signature(node)
        if signature is not None:
            source = node.inputs[0]
            inputs[id(source)] = source.name
            groups.setdefault((id(source), signature), []).append(node)
    return [
        SiblingConvs(input=inputs[source], convs=tuple(convs), signature=signature)
        for (source, signature), convs in groups.items()
        if len(convs) >= 2
    ]


def match_concats(graph: gs.Graph) -> list[ConcatJoin]:
    """Every Concat, with whether its producers can write in place, nested concats and a feeding Split."""
    outputs = _outputs(graph)
    found = []
    for node in graph.nodes:
        if node.op != "Concat":
            continue
        axis = int(node.attrs.get("axis", 1))
        producers = [_producer(t) for t in node.inputs]
        in_place = (
            all(p is not None and p.op != "Split" for p in producers)
            and all(_sole_consumer(t, outputs) is node for t in node.inputs)
            and len({id(p) for p in producers}) == len(producers)
        )
        nested = tuple(p for p in producers if p is not None and p.op == "Concat" and _nests(p, axis, node))
        split = _identity_split(node, producers, axis)
        found.append(ConcatJoin(concat=node, axis=axis, in_place=in_place, nested=nested, split=split))
    return found


def _nests(inner: gs.Node, axis: int, outer: gs.Node) -> bool:
    return int(inner.attrs.get("axis", 1)) == axis and _sole_consumer(inner.outputs[0], set()) is outer


def _identity_split(concat: gs.Node, producers: Sequence[gs.Node | None], axis: int) -> gs.Node | None:
    first = producers[0] if producers else None
    if first is None or first.op != "Split" or int(first.attrs.get("axis", 0)) != axis:
        return None
    same = [t is o for t, o in zip(concat.inputs, first.outputs, strict=False)]
    return first if len(concat.inputs) == len(first.outputs) and all(same) else None


MATCHERS: tuple[Callable[[gs.Graph], Sequence[Match]], ...] = (
    match_conv_bn,
    match_conv_activation,
    match_conv_add,
    match_sibling_convs,
    match_concats,
)


def find_opportunities(graph: gs.Graph) -> list[Match]:
    """Run every matcher, in the order the optimiser applies the fusions."""
    return [match for matcher in MATCHERS for match in matcher(graph)]
