"""Write HardSigmoid and HardSwish spelt in Clip arithmetic as the ops, so that CPU plans run them on the integer grid.

Older exporters write HardSwish as x * Clip(x + 3, 0, 6) / 6 (Add, Clip, Mul, Div: PyTorch before opset 14,
paddle2onnx's older releases) and the squeeze-excite gate as Clip(y + 3, 0, 6) / 6, often with the + 3 folded into
the conv before it (the zoo's table-cls, PyTorch 1.8: 29 such chains; ppocr-cls 18). The CPU backend runs
HardSigmoid and HardSwish between INT8 layers as ONNX Runtime's integer Add and Mul (`trtopt.quant.gates`,
`trtopt.backend.cpu.hard_gates`); the Clip chains would stay four float ops behind a DequantizeLinear. With h > 0
and constant scalars c and h:

- Clip(y + c, 0, h) / h = clip(y / h + c / h, 0, 1) = HardSigmoid(y; alpha = 1 / h, beta = c / h) (c = 0 without
  the Add; a Mul by 1 / h for the Div);
- z * Clip(y + c, 0, h) / h = z * HardSigmoid(y; 1 / h, c / h): the Mul before the Div, as HardSwish is spelt
  (z = y); `fuse_cbr` then writes x * HardSigmoid(x; 1/6, 1/2) as one HardSwish where the opset has it.

The same function, not bit for bit: float32 rounds y / h + c / h where the chain rounds (y + c) / h (an ulp or so).
Not in the default list (TensorRT fuses either spelling into its conv epilogue); the CPU backend adds it
(`CpuBackend.passes`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trtopt.frontend.edit import Namer
from trtopt.passes.base import Match, graph_pass
from trtopt.passes.query import clip_bounds, constant_array, sole_consumer


@dataclass(frozen=True, eq=False)
class HardSigmoidChain(Match):
    """[Add(y, c)] -> Clip(0, h) -> [Mul(z, .)] -> Div(h) (or Mul(1 / h)): `gate` is the Mul by z, if any."""

    add: gs.Node | None
    clip: gs.Node
    gate: gs.Node | None
    scale: gs.Node
    source: gs.Tensor  # y
    gated: gs.Tensor | None  # z
    alpha: float
    beta: float
    kind = "rewrite_hard_swish"

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        return tuple(n for n in (self.add, self.clip, self.gate, self.scale) if n is not None)

    def describe(self) -> str:
        form = "x * HardSigmoid" if self.gate is not None else "HardSigmoid"
        return f"Clip chain at {self.clip.name!r} -> {form}(alpha {self.alpha:.4g}, beta {self.beta:.4g})"


def find_hard_sigmoid_chains(graph: gs.Graph) -> list[HardSigmoidChain]:
    outputs = {t.name for t in graph.outputs}
    found = []
    for clip in graph.nodes:
        match = _chain_at(clip, outputs) if clip.op == "Clip" and clip.inputs else None
        if match is not None:
            found.append(match)
    return found


def _chain_at(clip: gs.Node, outputs: set[str]) -> HardSigmoidChain | None:
    low, high = clip_bounds(clip)
    if low != 0 or high is None or not high > 0:
        return None
    add, source, offset = _offset(clip.inputs[0], outputs)
    after = sole_consumer(clip.outputs[0], outputs)
    gated = _other(after, clip.outputs[0]) if after is not None and after.op == "Mul" else None
    gate = after if gated is not None else None
    last = sole_consumer(gate.outputs[0], outputs) if gate is not None else after
    if last is None or not _divides_by(last, (gate or clip).outputs[0], high):
        return None
    return HardSigmoidChain(add, clip, gate, last, source, gated, 1.0 / high, offset / high)


def _offset(tensor: gs.Tensor, outputs: set[str]) -> tuple[gs.Node | None, gs.Tensor, float]:
    """The Add of a scalar constant c that writes `tensor` for the Clip alone, the tensor it adds c to, and c;
    else (None, `tensor`, 0)."""
    add = tensor.inputs[0] if tensor.inputs else None
    if add is None or add.op != "Add" or len(add.inputs) != 2 or sole_consumer(tensor, outputs) is None:
        return None, tensor, 0.0
    for index in (0, 1):
        value, other = constant_array(add.inputs[index]), add.inputs[1 - index]
        if value is not None and value.size == 1 and value.dtype.kind == "f" and constant_array(other) is None:
            return add, add.inputs[1 - index], float(value.reshape(-1)[0])
    return None, tensor, 0.0


def _other(mul: gs.Node, tensor: gs.Tensor) -> gs.Tensor | None:
    """The Mul's other operand, a variable (the gated tensor), when `tensor` is one operand."""
    if len(mul.inputs) != 2 or sum(t is tensor for t in mul.inputs) != 1:
        return None
    other = mul.inputs[1] if mul.inputs[0] is tensor else mul.inputs[0]
    return other if isinstance(other, gs.Variable) else None


def _divides_by(node: gs.Node, tensor: gs.Tensor, high: float) -> bool:
    """Whether `node` is `tensor` / high or `tensor` * (1 / high), with a scalar constant."""
    if node.op not in ("Div", "Mul") or len(node.inputs) != 2 or tensor not in node.inputs:
        return False
    if node.op == "Div" and node.inputs[0] is not tensor:
        return False
    value = constant_array(node.inputs[1] if node.inputs[0] is tensor else node.inputs[0])
    if value is None or value.size != 1 or value.dtype.kind != "f":
        return False
    factor = float(value.reshape(-1)[0])
    return bool(np.isclose(factor, high if node.op == "Div" else 1.0 / high, rtol=1e-6, atol=0))


@graph_pass("rewrite_hard_swish", find_hard_sigmoid_chains)
def rewrite_hard_swish(graph: gs.Graph) -> list[HardSigmoidChain]:
    namer = Namer(graph)
    matches = find_hard_sigmoid_chains(graph)
    for match in matches:
        _rewrite(graph, match, namer)
    return matches


def _rewrite(graph: gs.Graph, match: HardSigmoidChain, namer: Namer) -> None:
    y, gated, out = match.source, match.gated, match.scale.outputs[0]
    for node in match.nodes:
        node.inputs.clear()
        node.outputs.clear()
    attrs = {"alpha": match.alpha, "beta": match.beta}
    name = str(match.clip.name)
    if gated is None:
        graph.nodes.append(gs.Node("HardSigmoid", name=namer.take(name), attrs=attrs, inputs=[y], outputs=[out]))
        return
    gate = gs.Variable(namer.take(f"{name}_gate"), dtype=y.dtype, shape=y.shape)
    mul = str(match.gate.name) if match.gate is not None else f"{name}_mul"
    graph.nodes += [gs.Node("HardSigmoid", name=namer.take(name), attrs=attrs, inputs=[y], outputs=[gate]),
                    gs.Node("Mul", name=namer.take(mul), inputs=[gated, gate], outputs=[out])]
