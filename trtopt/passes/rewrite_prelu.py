"""Write PRelu with a constant slope as the ops ONNX Runtime runs fast: LeakyRelu, or Max / Min of x and x * slope.

TFLite, Caffe and Keras face and landmark models use PRelu with one slope per channel (a TFLite face-landmark
model: 23 PRelu taking 22.5 of its 41 ms in float, issue #45). ONNX Runtime's PRelu kernel broadcasts the slope
element by element; on one CPU thread a [1, 64, 56, 56] PRelu with per-channel slopes took 1238 us where
`Max(x, Mul(x, slope))` took 185 us and a Relu 93 us (avx2, median of 200 interleaved calls; the outputs bit-equal).
Every form below computes the same product `x * slope` PRelu does, so the outputs are bit-identical:
- one slope for every element: `LeakyRelu(x, alpha=slope)`;
- all slopes in [0, 1]: `Max(x, x * slope)` (x >= x * s for x >= 0, x * s >= x for x < 0);
- all slopes >= 1: `Min(x, x * slope)`;
- otherwise (negative or mixed slopes): `Relu(x) + Min(x, 0) * slope`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trtopt.frontend.edit import Namer
from trtopt.passes.base import Match, graph_pass
from trtopt.passes.query import constant_array


@dataclass(frozen=True, eq=False)
class PreluRewrite(Match):
    """A PRelu whose slope is constant, and the form it becomes (`leaky`, `max`, `min` or `split`)."""

    node: gs.Node
    slope: np.ndarray
    form: str
    kind = "rewrite_prelu"

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        return (self.node,)

    def describe(self) -> str:
        return f"PRelu {self.node.name!r} -> {self.form} form"


def prelu_form(slope: np.ndarray) -> str:
    if slope.size and np.all(slope == slope.reshape(-1)[0]):
        return "leaky"
    if np.all((slope >= 0) & (slope <= 1)):
        return "max"
    return "min" if np.all(slope >= 1) else "split"


def find_prelu_rewrites(graph: gs.Graph) -> list[PreluRewrite]:
    found = []
    for node in graph.nodes:
        if node.op != "PRelu" or len(node.inputs) != 2 or len(node.outputs) != 1:
            continue
        slope = constant_array(node.inputs[1])
        if slope is not None and slope.dtype.kind == "f" and slope.size and np.all(np.isfinite(slope)):
            found.append(PreluRewrite(node, slope, prelu_form(slope)))
    return found


@graph_pass("rewrite_prelu", find_prelu_rewrites)
def rewrite_prelu(graph: gs.Graph) -> list[PreluRewrite]:
    namer = Namer(graph)
    matches = find_prelu_rewrites(graph)
    for match in matches:
        _rewrite(graph, match, namer)
    return matches


def _rewrite(graph: gs.Graph, match: PreluRewrite, namer: Namer) -> None:
    node, x, y = match.node, match.node.inputs[0], match.node.outputs[0]
    name = str(node.name)
    node.outputs.clear()
    node.inputs.clear()
    if match.form == "leaky":
        alpha = float(match.slope.reshape(-1)[0])
        graph.nodes.append(gs.Node("LeakyRelu", name=namer.take(name), attrs={"alpha": alpha}, inputs=[x],
                                   outputs=[y]))
        return
    slope = gs.Constant(namer.take(f"{name}_slope"), np.ascontiguousarray(match.slope))
    if match.form in ("max", "min"):
        scaled = _temp(namer, name, "scaled", y)
        graph.nodes.append(gs.Node("Mul", name=namer.take(f"{name}_mul"), inputs=[x, slope], outputs=[scaled]))
        op = "Max" if match.form == "max" else "Min"
        graph.nodes.append(gs.Node(op, name=namer.take(name), inputs=[x, scaled], outputs=[y]))
        return
    positive, negative, scaled = (_temp(namer, name, part, y) for part in ("positive", "negative", "scaled"))
    zero = gs.Constant(namer.take(f"{name}_zero"), np.zeros((), match.slope.dtype))
    graph.nodes += [
        gs.Node("Relu", name=namer.take(f"{name}_relu"), inputs=[x], outputs=[positive]),
        gs.Node("Min", name=namer.take(f"{name}_min"), inputs=[x, zero], outputs=[negative]),
        gs.Node("Mul", name=namer.take(f"{name}_mul"), inputs=[negative, slope], outputs=[scaled]),
        gs.Node("Add", name=namer.take(name), inputs=[positive, scaled], outputs=[y]),
    ]


def _temp(namer: Namer, name: str, part: str, like: gs.Tensor) -> gs.Variable:
    return gs.Variable(namer.take(f"{name}_{part}"), dtype=like.dtype, shape=like.shape)
