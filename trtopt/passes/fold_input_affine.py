"""Fold a per-channel affine chain that alone feeds a Conv into that Conv's weights and bias.

`fold_batchnorm` folds what follows a linear layer. What comes before one stays: input normalisation written
into the graph (`(x - mean) / std`, Keras' `x / 127.5 - 1`, Caffe's scale layers), and BatchNorm written out in
Mul/Add after an activation (pre-activation blocks, ports that put BN before the conv). For a Conv reading
y = s * x + t (s, t per input channel):

    Conv(y) = sum W[o, c] * (s[c] x[c] + t[c]) + b[o] = (W * s)(x) + (b[o] + sum_{c,k} W[o, c, k] t[c])

The scale part is exact for any Conv (a zero-padded x stays zero after scaling). The shift part is exact only
where nothing is padded: a padded border sees 0, not t. So a chain with a non-zero shift is folded only into a
Conv without padding; otherwise it stays. Folding is done in float64 and rounded once, into new constants.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trtopt.frontend.edit import Namer, new_constant
from trtopt.passes.base import Match, graph_pass
from trtopt.passes.fold_batchnorm import ChannelAffine, channel_vector
from trtopt.passes.query import constant_array, graph_output_names, is_missing, producer, sole_consumer

AFFINE_OPS = ("Mul", "Add", "Sub", "Div")


@dataclass(frozen=True, eq=False)
class InputAffineFold(Match):
    """The affine ops `chain` (first to last) that alone feed `conv`, and the map they apply."""

    conv: gs.Node
    chain: tuple[gs.Node, ...]
    affine: ChannelAffine
    kind = "fold_input_affine"

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        return (*self.chain, self.conv)

    def describe(self) -> str:
        ops = " ".join(n.op for n in self.chain)
        return f"{ops} before {self.conv.op} {self.conv.name!r} folded into its weights"


def find_input_affine_folds(graph: gs.Graph) -> list[InputAffineFold]:
    outputs = graph_output_names(graph)
    found = []
    for conv in graph.nodes:
        weight = constant_array(conv.inputs[1]) if conv.op == "Conv" and len(conv.inputs) > 1 else None
        if weight is None or weight.ndim < 3 or not np.issubdtype(weight.dtype, np.floating):
            continue
        if len(conv.inputs) > 2 and not is_missing(conv.inputs[2]) and constant_array(conv.inputs[2]) is None:
            continue
        chain, affine = _chain_before(conv, outputs, weight.shape[1] * int(conv.attrs.get("group", 1)))
        if chain and (not np.any(affine.shift) or not _pads(conv)):
            found.append(InputAffineFold(conv, tuple(chain), affine))
    return found


def _chain_before(conv: gs.Node, outputs: set[str], channels: int) -> tuple[list[gs.Node], ChannelAffine]:
    """The longest chain of constant affine ops ending at `conv`'s input, each read only by the next."""
    scale, shift = np.ones(channels), np.zeros(channels)
    chain: list[gs.Node] = []
    tensor = conv.inputs[0]
    rank = len(tensor.shape) if tensor.shape is not None else None
    while rank is not None and (node := producer(tensor)) is not None and node.op in AFFINE_OPS:
        if sole_consumer(tensor, outputs) is None or len(node.inputs) != 2:
            break
        step = _step(node, channels, rank)
        if step is None or _ends_a_gate(step[1]):
            break
        (a, b), data = step
        scale, shift = scale * a, scale * b + shift  # (scale, shift) after (a, b): s(a x + b) + t
        chain.insert(0, node)
        tensor = data
    return chain, ChannelAffine(scale, shift)


def _step(node: gs.Node, channels: int, rank: int) -> tuple[tuple[np.ndarray, np.ndarray], gs.Tensor] | None:
    """((a, b), x) when `node` computes a * x + b per channel from its one non-constant input x."""
    constants = [constant_array(t) for t in node.inputs]
    if sum(c is None for c in constants) != 1:
        return None
    mine = 0 if constants[0] is None else 1
    value = channel_vector(constants[1 - mine], channels, rank)
    if value is None:
        return None
    one, zero = np.ones(channels), np.zeros(channels)
    steps = {"Mul": (value, zero), "Add": (one, value), "Sub": (one, -value) if mine == 0 else (-one, value)}
    if node.op == "Div":
        if mine != 0 or not np.all(value != 0):
            return None  # a constant divided by x is not affine
        return (1.0 / value, zero), node.inputs[0]
    return steps[node.op], node.inputs[mine]


def _ends_a_gate(data: gs.Tensor) -> bool:
    """Whether `data` is a product of two computed tensors (x * gate): the affine op after it belongs to an
    activation written out (GELU's `x * (1 + erf(x / sqrt 2)) * 0.5`), which the CPU lowering runs as one fused
    kernel only while its last Mul is there. Not where the gate is a HardSigmoid: x * HardSigmoid(x) is a whole
    HardSwish (`rewrite_hard_swish` writes PaddleOCR's Clip spelling so), and the affine block after it
    (PP-LCNet's learnable scale and shift) folds into the conv as it did from the Clip spelling."""
    gate = producer(data)
    if gate is None or gate.op != "Mul" or any(constant_array(t) is not None for t in gate.inputs):
        return False
    return not any((source := producer(t)) is not None and source.op == "HardSigmoid" for t in gate.inputs)


def _pads(conv: gs.Node) -> bool:
    auto_pad = conv.attrs.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    return auto_pad in ("SAME_UPPER", "SAME_LOWER") or any(int(p) for p in conv.attrs.get("pads", []))


@graph_pass("fold_input_affine", find_input_affine_folds)
def fold_input_affine(graph: gs.Graph) -> list[InputAffineFold]:
    namer = Namer(graph)
    matches = find_input_affine_folds(graph)
    for match in matches:
        _fold(match, namer)
    return matches


def _fold(match: InputAffineFold, namer: Namer) -> None:
    conv = match.conv
    weight = constant_array(conv.inputs[1])
    assert weight is not None  # checked by the matcher
    w = weight.astype(np.float64)
    group = int(conv.attrs.get("group", 1))
    cout, per_group = w.shape[0], w.shape[1]
    # Output channel o reads input channels g * per_group ... (g + 1) * per_group - 1, g = o // (cout / group).
    index = (np.arange(cout)[:, None] // (cout // group)) * per_group + np.arange(per_group)[None, :]
    scale, shift = match.affine.scale[index], match.affine.shift[index]
    extent = (slice(None), slice(None)) + (None,) * (w.ndim - 2)
    new_weight = w * scale[extent]
    bias = constant_array(conv.inputs[2]) if len(conv.inputs) > 2 and not is_missing(conv.inputs[2]) else None
    new_bias = (np.zeros(cout) if bias is None else bias.astype(np.float64)) + (w * shift[extent]).reshape(
        cout, -1).sum(axis=1)
    conv.inputs[0] = match.chain[0].inputs[0] if constant_array(match.chain[0].inputs[1]) is not None else (
        match.chain[0].inputs[1])
    conv.inputs[1] = new_constant(namer, f"{conv.name}/weight", new_weight.astype(weight.dtype))
    bias_tensor = new_constant(namer, f"{conv.name}/bias", new_bias.astype(weight.dtype))
    if len(conv.inputs) > 2:
        conv.inputs[2] = bias_tensor
    else:
        conv.inputs.append(bias_tensor)
