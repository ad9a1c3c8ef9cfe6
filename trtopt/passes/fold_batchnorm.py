"""Fold BatchNormalization and constant per-channel Mul/Add/Sub/Div into the Conv/ConvTranspose/Gemm
before it.

Inference BN is an affine map per output channel, y = s*x + t with s = gamma/sqrt(var + eps) and
t = beta - mean*s; applied to a linear layer's output it equals the layer with weights scaled by s
and bias b*s + t (Ioffe & Szegedy 2015; the "Conv+BN" fusion of the TensorRT developer guide).
Folding is done in float64 and rounded once to the weight dtype. The folded weights are new
constants: a weight shared with another node is never edited in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trtopt.frontend.edit import Namer, new_constant
from trtopt.passes.base import Match, graph_pass
from trtopt.passes.query import constant_array, graph_output_names, is_missing, output_channels, sole_consumer

LINEAR_OPS = ("Conv", "ConvTranspose", "Gemm")
AFFINE_OPS = ("BatchNormalization", "Mul", "Add", "Sub", "Div")


@dataclass(frozen=True)
class ChannelAffine:
    """y = scale * x + shift, per output channel (both 1-D of the layer's channel count)."""

    scale: np.ndarray
    shift: np.ndarray


@dataclass(frozen=True, eq=False)
class AffineFold(Match):
    """An affine op that alone reads `tensor`, the output of `layer` (directly or through folds before
    it in the same chain): folding it gives the layer weights scaled and a bias shifted by `affine`."""

    layer: gs.Node
    follower: gs.Node
    affine: ChannelAffine
    kind: str

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        return (self.layer, self.follower)

    def describe(self) -> str:
        return f"{self.follower.op} {self.follower.name!r} folded into {self.layer.op} {self.layer.name!r}"


def find_affine_folds(graph: gs.Graph, ops: tuple[str, ...] = AFFINE_OPS, kind: str | None = None) -> list[AffineFold]:
    """Every chain of `ops` nodes (each the sole reader of the one before) after a linear layer, in
    graph order; `kind` names the rewrite (default fold_bn, fold_mul, ... by op)."""
    outputs = graph_output_names(graph)
    found: list[AffineFold] = []
    for layer in graph.nodes:
        if layer.op not in LINEAR_OPS or not layer.outputs or not _bias_is_constant(layer):
            continue
        tensor = layer.outputs[0]
        while (follower := sole_consumer(tensor, outputs)) is not None and follower.op in ops:
            affine = _affine_after(layer, follower, tensor)
            if affine is None:
                break
            found.append(AffineFold(layer, follower, affine, kind or _kind(follower)))
            tensor = follower.outputs[0]
    return found


@graph_pass("fold_batchnorm", find_affine_folds)
def fold_batchnorm(graph: gs.Graph) -> list[AffineFold]:
    """Fold every chain of affine ops that alone reads a linear layer's output into that layer."""
    matches = find_affine_folds(graph)
    apply_affine_folds(graph, matches)
    return matches


def apply_affine_folds(graph: gs.Graph, matches: list[AffineFold]) -> None:
    """Fold each match, in chain order. The folded node's output tensor becomes the layer's output, so
    a graph output keeps its name."""
    namer = Namer(graph)
    for match in matches:
        layer, follower = match.layer, match.follower
        _fold(layer, match.affine, namer)
        layer.outputs[0] = follower.outputs[0]
        follower.outputs.clear()
        follower.inputs.clear()


def _kind(node: gs.Node) -> str:
    return "fold_bn" if node.op == "BatchNormalization" else f"fold_{node.op.lower()}"


def _affine_after(layer: gs.Node, node: gs.Node, tensor: gs.Tensor) -> ChannelAffine | None:
    """The per-channel affine map `node` applies to `tensor`, the output of `layer`, else None."""
    channels = output_channels(layer)
    weight = constant_array(layer.inputs[1])
    if channels is None or weight is None or not np.issubdtype(weight.dtype, np.floating):
        return None
    rank = 2 if layer.op == "Gemm" else weight.ndim
    if node.op == "BatchNormalization":
        return batchnorm_affine(node, channels)
    if node.op not in AFFINE_OPS[1:] or len(node.inputs) != 2:
        return None
    mine = 0 if node.inputs[0] is tensor else 1
    value = channel_vector(constant_array(node.inputs[1 - mine]), channels, rank)
    if value is None:
        return None
    one, zero = np.ones(channels), np.zeros(channels)
    if node.op == "Mul":
        return ChannelAffine(value, zero)
    if node.op == "Add":
        return ChannelAffine(one, value)
    if node.op == "Sub":
        return ChannelAffine(one, -value) if mine == 0 else ChannelAffine(-one, value)
    if mine == 0 and np.all(value != 0):  # Div by a constant; a constant divided by x is not affine
        return ChannelAffine(1.0 / value, zero)
    return None


def _bias_is_constant(layer: gs.Node) -> bool:
    return len(layer.inputs) < 3 or is_missing(layer.inputs[2]) or constant_array(layer.inputs[2]) is not None


def batchnorm_affine(bn: gs.Node, channels: int) -> ChannelAffine | None:
    """An inference BatchNormalization's per-channel affine map, where its `channels` parameters are constants."""
    if int(bn.attrs.get("training_mode", 0)) != 0 or any(t.outputs for t in bn.outputs[1:]):
        return None
    params = [constant_array(t) for t in bn.inputs[1:5]]
    if len(params) != 4 or any(p is None or p.shape != (channels,) for p in params):
        return None
    gamma, beta, mean, var = (np.asarray(p, np.float64) for p in params)
    scale = gamma / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
    return ChannelAffine(scale, beta - mean * scale)


def channel_vector(value: np.ndarray | None, channels: int, rank: int) -> np.ndarray | None:
    """The per-channel vector a constant broadcasts to along axis 1 of a rank-`rank` tensor, else None.

    A constant of shape (C,) broadcasts along the *last* axis, not the channel axis, so it only
    qualifies when the layer output is 2-D (Gemm) or it is a scalar.
    """
    if value is None or not np.issubdtype(value.dtype, np.floating) or value.ndim > rank:
        return None
    shape = (1,) * (rank - value.ndim) + value.shape
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(value.reshape(-1).astype(np.float64), (channels,)).copy()


def _fold(layer: gs.Node, affine: ChannelAffine, namer: Namer) -> None:
    weight = constant_array(layer.inputs[1])
    assert weight is not None  # checked by the matcher
    bias = (
        constant_array(layer.inputs[2]) if len(layer.inputs) > 2 and not is_missing(layer.inputs[2]) else None
    )
    if layer.op == "Gemm":
        new_weight, new_bias = _fold_gemm(layer, weight, bias, affine)
    else:
        new_weight = _scale_conv_weight(layer, weight.astype(np.float64), affine.scale)
        old_bias = np.zeros(affine.scale.shape) if bias is None else bias.astype(np.float64)
        new_bias = old_bias * affine.scale + affine.shift
    dtype = weight.dtype
    layer.inputs[1] = new_constant(namer, f"{layer.name}/weight", new_weight.astype(dtype))
    bias_tensor = new_constant(namer, f"{layer.name}/bias", new_bias.astype(dtype))
    if len(layer.inputs) > 2:
        layer.inputs[2] = bias_tensor
    else:
        layer.inputs.append(bias_tensor)


def _scale_conv_weight(layer: gs.Node, weight: np.ndarray, scale: np.ndarray) -> np.ndarray:
    if layer.op == "Conv":  # (Cout, Cin/g, k...)
        return weight * scale.reshape((-1,) + (1,) * (weight.ndim - 1))
    group = int(layer.attrs.get("group", 1))  # ConvTranspose: (Cin, Cout/g, k...), out channel = g*Cout/g + j
    cin, per_group = weight.shape[0], weight.shape[1]
    grouped = weight.reshape((group, cin // group, per_group) + weight.shape[2:])
    factor = scale.reshape((group, 1, per_group) + (1,) * (weight.ndim - 2))
    return (grouped * factor).reshape(weight.shape)


def _fold_gemm(
    layer: gs.Node, weight: np.ndarray, bias: np.ndarray | None, affine: ChannelAffine
) -> tuple[np.ndarray, np.ndarray]:
    """Y = alpha*A*B + beta*C: the scale goes into B's output columns, alpha and beta become 1."""
    alpha, beta = float(layer.attrs.get("alpha", 1.0)), float(layer.attrs.get("beta", 1.0))
    w = weight.astype(np.float64) * alpha
    w = w * affine.scale[:, None] if layer.attrs.get("transB", 0) else w * affine.scale[None, :]
    c = np.zeros(affine.scale.shape) if bias is None else bias.astype(np.float64) * beta
    layer.attrs["alpha"], layer.attrs["beta"] = 1.0, 1.0
    return w, c * affine.scale + affine.shift
