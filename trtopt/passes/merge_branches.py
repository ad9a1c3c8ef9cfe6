"""Merge parallel branches that are summed into one conv: Add(Conv_a(x), Conv_b(x)) and Add(Conv(x), BN(x)).

Re-parameterisable networks train several branches over one input and add them: RepVGG's 3x3 conv + 1x1 conv +
identity BatchNorm per block (Ding et al. 2021, "RepVGG: Making VGG-style ConvNets Great Again", arXiv:2101.03697,
section 3.3), MobileOne's, ACNet's and DBB's branches. Their authors fold the branches into one conv for
deployment, but an export of the training-time module (timm's `repvgg_a0` without `reparameterize()`) keeps them:
44 convs, 17 BatchNormalizations and 39 Adds where 22 convs compute the same.

Convolution is linear in its kernel, so two convs on the same input with the same stride, dilation and groups,
whose outputs line up, add up to one conv with the kernels added: the smaller kernel zero-padded to the larger one,
centred, which lines up exactly when each of its pads plus dilation x half the size difference equals the
larger's pad. A BatchNormalization of the input is a conv too, where input and output channels are the same and
the larger conv keeps the size (stride 1, the centre tap over each output position): its kernel is the channel's
scale at the centre tap, its bias the shift (s = gamma / sqrt(var + eps), t = beta - mean * s, as
`trtopt.passes.fold_batchnorm` computes). Computed in float64, rounded once to the weights' dtype; the merged conv
writes the Add's output, and merging repeats, so three branches become one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trtopt.frontend.edit import Namer, new_constant
from trtopt.passes.base import Match, graph_pass
from trtopt.passes.fold_batchnorm import batchnorm_affine
from trtopt.passes.query import ConvGeometry, constant_array, conv_geometry, graph_output_names, is_missing, producer


@dataclass(frozen=True, eq=False)
class SummedBranches(Match):
    """`add` of `conv`'s output and `other`'s (a Conv or a BatchNormalization of the same input): one conv with
    `weight` and `bias`, `conv`'s geometry."""

    add: gs.Node
    conv: gs.Node
    other: gs.Node
    weight: np.ndarray
    bias: np.ndarray
    kind = "merge_branches"

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        return (self.conv, self.other, self.add)

    def describe(self) -> str:
        return f"{self.other.op} {self.other.name!r} + Conv {self.conv.name!r} ({self.add.name!r}) -> one Conv"


def find_summed_branches(graph: gs.Graph) -> list[SummedBranches]:
    outputs = graph_output_names(graph)
    found: list[SummedBranches] = []
    used: set[int] = set()
    for add in graph.nodes:
        if add.op != "Add" or len(add.inputs) != 2 or add.inputs[0] is add.inputs[1]:
            continue
        pair = [producer(t) for t in add.inputs]
        if any(p is None or id(p) in used or len(p.outputs) < 1 for p in pair):
            continue
        if any(len(t.outputs) != 1 or t.name in outputs for t in add.inputs):
            continue  # a branch someone else reads too stays
        first, second = pair[0], pair[1]
        assert first is not None and second is not None
        match = _merged(add, first, second) or _merged(add, second, first)
        if match is not None:
            found.append(match)
            used.update((id(first), id(second)))
    return found


def _merged(add: gs.Node, conv: gs.Node, other: gs.Node) -> SummedBranches | None:
    """`conv` (the larger kernel) and `other` on the same input as one conv, or None."""
    if conv.op != "Conv" or not conv.inputs or not other.inputs or other.inputs[0] is not conv.inputs[0]:
        return None
    geometry, weight, bias = conv_geometry(conv), constant_array(conv.inputs[1]), _bias(conv)
    if geometry is None or weight is None or bias is None:
        return None
    if other.op == "Conv":
        extra = _conv_kernel(other, geometry, weight.shape)
    elif other.op == "BatchNormalization" and len(other.outputs) >= 1:
        extra = _identity_kernel(other, geometry, weight.shape)
    else:
        return None
    if extra is None:
        return None
    kernel, shift = extra
    merged = (np.asarray(weight, np.float64) + kernel).astype(weight.dtype)
    return SummedBranches(add, conv, other, merged, (bias + shift).astype(weight.dtype))


def _bias(conv: gs.Node) -> np.ndarray | None:
    channels = constant_array(conv.inputs[1]).shape[0]  # type: ignore[union-attr]
    if len(conv.inputs) < 3 or is_missing(conv.inputs[2]):
        return np.zeros(channels, np.float64)
    value = constant_array(conv.inputs[2])
    return None if value is None or value.shape != (channels,) else np.asarray(value, np.float64)


def _conv_kernel(other: gs.Node, big: ConvGeometry, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray] | None:
    """The other conv's kernel zero-padded to `big`'s size, and its bias, where the two line up."""
    small, weight, bias = conv_geometry(other), constant_array(other.inputs[1]), _bias(other)
    if small is None or weight is None or bias is None or weight.shape[:2] != shape[:2]:
        return None
    if (small.strides, small.dilations, small.group) != (big.strides, big.dilations, big.group):
        return None
    rank = len(big.kernel)
    grow = [b - s for b, s in zip(big.kernel, small.kernel, strict=True)]
    if any(g < 0 or g % 2 for g in grow):
        return None
    for i in range(rank):  # the padded small kernel must start and end where the large one does
        shift = big.dilations[i] * grow[i] // 2
        if small.pads[i] + shift != big.pads[i] or small.pads[i + rank] + shift != big.pads[i + rank]:
            return None
    padding = [(0, 0), (0, 0), *((g // 2, g // 2) for g in grow)]
    return np.pad(np.asarray(weight, np.float64), padding), bias


def _identity_kernel(bn: gs.Node, big: ConvGeometry, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray] | None:
    """BatchNormalization of the conv's input as a conv of `big`'s size: scale at the centre tap, shift as bias;
    where its output lines up with the conv's (stride 1, centred pads) and the channels map one to one."""
    channels, per_group = shape[0], shape[1]
    affine = batchnorm_affine(bn, channels)
    rank = len(big.kernel)
    if affine is None or per_group * big.group != channels or any(s != 1 for s in big.strides):
        return None
    if any(k % 2 == 0 for k in big.kernel) or any(
        big.pads[i] != big.dilations[i] * (big.kernel[i] - 1) // 2 or big.pads[i + rank] != big.pads[i]
        for i in range(rank)
    ):
        return None
    kernel = np.zeros(shape, np.float64)
    centre = tuple(k // 2 for k in big.kernel)
    for c in range(channels):
        kernel[(c, c % per_group) + centre] = affine.scale[c]
    return kernel, affine.shift


@graph_pass("merge_branches", find_summed_branches)
def merge_branches(graph: gs.Graph) -> list[SummedBranches]:
    namer, done = Namer(graph), []
    while matches := find_summed_branches(graph):  # a third branch meets the merged conv in the next round
        for match in matches:
            weight = new_constant(namer, f"{match.conv.name}_merged_weight", match.weight)
            bias = new_constant(namer, f"{match.conv.name}_merged_bias", match.bias)
            output = match.add.outputs[0]
            for node in match.nodes:
                node.outputs.clear()
            name = namer.take(f"{match.conv.name}_merged")
            graph.nodes.append(gs.Node("Conv", name=name, attrs=dict(match.conv.attrs),
                                       inputs=[match.conv.inputs[0], weight, bias], outputs=[output]))
        graph.cleanup().toposort()
        done += matches
    return done
