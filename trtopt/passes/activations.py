"""Activations TensorRT runs in a convolution's epilogue, matched on the tensor they read.

Single nodes: Relu, Clip with constant bounds (ReLU6 when 0..6), LeakyRelu, Sigmoid, HardSigmoid,
HardSwish, Tanh. Two-node gates as exporters write them: x*Sigmoid(x) (SiLU/Swish; ONNX has no Swish
op before opset 24) and x*HardSigmoid(x; 1/6, 1/2) (HardSwish before opset 14). TensorRT fuses these
into the conv kernel (NVIDIA, "TensorRT Developer Guide", Layer fusion: convolution + activation).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trtopt.frontend.edit import Namer
from trtopt.passes.query import clip_bounds, constant_array, is_missing, sole_consumer

SINGLE_ACTIVATIONS = {
    "Relu": "relu",
    "LeakyRelu": "leaky_relu",
    "Sigmoid": "sigmoid",
    "HardSigmoid": "hard_sigmoid",
    "HardSwish": "hard_swish",
    "Tanh": "tanh",
    "Clip": "clip",
}
GATES = {"Sigmoid": "silu", "HardSigmoid": "hard_swish"}


@dataclass(frozen=True, eq=False)
class Activation:
    """A matched activation: its name, its node(s) in order, the tensor it writes, and a signature
    (ops, attributes, constant operands) that is equal exactly when two activations compute the same."""

    name: str
    nodes: tuple[gs.Node, ...]
    output: gs.Tensor
    signature: tuple[object, ...]


def match_activation(tensor: gs.Tensor, graph_outputs: set[str]) -> Activation | None:
    """The activation that alone reads `tensor`, or None (also when `tensor` must stay materialised)."""
    if tensor.name in graph_outputs:
        return None
    single = sole_consumer(tensor, graph_outputs)
    if single is not None and single.op in SINGLE_ACTIVATIONS and single.inputs[0] is tensor:
        name = _clip_name(single) if single.op == "Clip" else SINGLE_ACTIVATIONS[single.op]
        return Activation(name, (single,), single.outputs[0], _signature((single,))) if name else None
    return _match_gate(tensor, graph_outputs)


def _match_gate(tensor: gs.Tensor, graph_outputs: set[str]) -> Activation | None:
    readers = list(tensor.outputs)
    if len(readers) != 2:
        return None
    gates = [n for n in readers if n.op in GATES and n.inputs[0] is tensor]
    muls = [n for n in readers if n.op == "Mul"]
    if len(gates) != 1 or len(muls) != 1:
        return None
    gate, mul = gates[0], muls[0]
    if gate.op == "HardSigmoid" and not _is_hard_swish_gate(gate):
        return None
    gated = gate.outputs[0]
    operands = {id(t) for t in mul.inputs}
    reader = sole_consumer(gated, graph_outputs)
    if reader is None or id(reader) != id(mul) or operands != {id(tensor), id(gated)}:
        return None
    return Activation(GATES[gate.op], (gate, mul), mul.outputs[0], _signature((gate, mul)))


def _is_hard_swish_gate(node: gs.Node) -> bool:
    alpha, beta = float(node.attrs.get("alpha", 0.2)), float(node.attrs.get("beta", 0.5))
    return bool(np.isclose(alpha, 1 / 6) and np.isclose(beta, 0.5))


def _clip_name(node: gs.Node) -> str | None:
    """relu6 for Clip(0, 6), clip for other constant bounds, None when a bound is computed."""
    bounds = clip_bounds(node)
    if None in bounds:
        return None
    return "relu6" if bounds == (0.0, 6.0) else "clip"


def _signature(nodes: tuple[gs.Node, ...]) -> tuple[object, ...]:
    parts: list[object] = []
    for node in nodes:
        attrs = tuple(sorted((k, repr(v)) for k, v in node.attrs.items()))
        operands = tuple(
            None if is_missing(t) else _constant_key(t) for t in node.inputs[1:] if node.op != "Mul"
        )
        parts.append((node.op, attrs, operands))
    return tuple(parts)


def _constant_key(tensor: gs.Tensor) -> object:
    value = constant_array(tensor)
    return ("var", tensor.name) if value is None else (str(value.dtype), value.shape, value.tobytes())


def clone_activation(act: Activation, x: gs.Tensor, namer: Namer) -> tuple[list[gs.Node], gs.Variable]:
    """The same activation applied to `x` (new nodes, new output tensor), for hoisting above a Split."""
    first = act.nodes[0]
    out = gs.Variable(namer.take(f"{x.name}/{act.name}"), dtype=x.dtype, shape=x.shape)
    if len(act.nodes) == 1:
        node = gs.Node(
            first.op, namer.take(f"{first.name}/wide"), dict(first.attrs), [x, *first.inputs[1:]], [out]
        )
        return [node], out
    gated = gs.Variable(namer.take(f"{x.name}/gate"), dtype=x.dtype, shape=x.shape)
    gate = gs.Node(first.op, namer.take(f"{first.name}/wide"), dict(first.attrs), [x], [gated])
    mul = gs.Node("Mul", namer.take(f"{act.nodes[1].name}/wide"), {}, [x, gated], [out])
    return [gate, mul], out
