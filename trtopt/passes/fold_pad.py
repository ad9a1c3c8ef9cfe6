"""Fold a zero Pad into the Conv that reads it: the Conv's own `pads` do the same for free.

Exporters of TensorFlow-style "SAME" padding (EfficientNet, MobileNet from TF or timm) write an
explicit Pad before every strided or depthwise conv. On its own it costs a full copy of the tensor;
in an INT8 graph it also sits between a DequantizeLinear and a QuantizeLinear, so ONNX Runtime runs
it in float with a quantise/dequantise pair around it (measured on EfficientNet-Lite0: 16 Pads, about
a third of the non-conv time). Folded when:
- mode is "constant" with value 0 (a Conv pads with zeros), all pads >= 0;
- only the spatial axes are padded (not batch or channels);
- every reader of the Pad output is a Conv (not ConvTranspose), reading it as its data input, with no auto_pad
  (Keras' NASNetMobile pads once for two separable-conv branches: each Conv takes the pads);
- the Pad output is not a graph output.
Asymmetric pads stay asymmetric: ONNX Conv has separate begin/end pads per axis.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trtopt.frontend.edit import replace_uses
from trtopt.passes.base import Match, graph_pass
from trtopt.passes.query import constant_array, graph_output_names, is_missing


@dataclass(frozen=True, eq=False)
class PadFold(Match):
    """A zero Pad whose only reader is a Conv; `spatial` is what it adds to the Conv's pads."""

    pad: gs.Node
    convs: tuple[gs.Node, ...]
    spatial: tuple[int, ...]
    kind = "fold_pad"

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        return (self.pad, *self.convs)

    def describe(self) -> str:
        return f"Pad {self.pad.name!r} -> pads of {', '.join(repr(c.name) for c in self.convs)}"


def find_pad_folds(graph: gs.Graph) -> list[PadFold]:
    outputs = graph_output_names(graph)
    found = []
    for pad in graph.nodes:
        if pad.op != "Pad" or not pad.outputs:
            continue
        tensor, spatial = pad.outputs[0], _spatial_pads(pad)
        readers = tuple(tensor.outputs)
        if tensor.name in outputs or not readers or spatial is None:
            continue
        if all(_foldable_conv(conv, tensor, len(spatial) // 2) for conv in readers):
            found.append(PadFold(pad, readers, tuple(spatial)))
    return found


@graph_pass("fold_pad", find_pad_folds)
def fold_pad(graph: gs.Graph) -> list[PadFold]:
    matches = find_pad_folds(graph)
    for match in matches:
        pad, rank = match.pad, len(match.spatial) // 2
        for conv in match.convs:
            old = list(conv.attrs.get("pads", [0] * (2 * rank)))
            conv.attrs["pads"] = [int(a + b) for a, b in zip(old, match.spatial, strict=True)]
        replace_uses(pad.outputs[0], pad.inputs[0], list(match.convs))
        pad.outputs.clear()
    return matches


def _spatial_pads(pad: gs.Node) -> list[int] | None:
    """The Pad's spatial pads as [begin..., end...] for the axes after batch and channels, or None."""
    if pad.attrs.get("mode", "constant") != "constant":
        return None
    data = pad.inputs[0]
    rank = len(data.shape) if data.shape is not None else None
    if "pads" in pad.attrs:  # opset < 11
        pads, value = list(pad.attrs["pads"]), float(pad.attrs.get("value", 0.0))
    else:
        raw = constant_array(pad.inputs[1]) if len(pad.inputs) > 1 else None
        if raw is None:
            return None
        pads = [int(p) for p in raw.reshape(-1)]
        fill = pad.inputs[2] if len(pad.inputs) > 2 and not is_missing(pad.inputs[2]) else None
        fill_value = constant_array(fill) if fill is not None else np.zeros(1)
        if fill_value is None:
            return None
        value = float(fill_value.reshape(-1)[0]) if fill_value.size else 0.0
        axes = pad.inputs[3] if len(pad.inputs) > 3 and not is_missing(pad.inputs[3]) else None
        if axes is not None:
            return None  # opset-18 axes form: rare in exported CNNs, left alone
    if rank is None or len(pads) != 2 * rank or rank < 3 or value != 0.0 or min(pads) < 0:
        return None
    begins, ends = pads[:rank], pads[rank:]
    if any(begins[:2]) or any(ends[:2]):
        return None
    return begins[2:] + ends[2:]


def _foldable_conv(conv: gs.Node, tensor: gs.Tensor, rank: int) -> bool:
    if conv.op != "Conv" or conv.inputs[0] is not tensor or any(t is tensor for t in conv.inputs[1:]):
        return False
    if conv.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        return False
    return len(conv.attrs.get("pads", [0] * (2 * rank))) == 2 * rank
