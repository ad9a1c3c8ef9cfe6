"""Prune Conv / Gemm / MatMul weights to 2:4 by magnitude: a pure numpy pass on the weights of an ONNX model.

In every group of four weights along the reduction (input-channel) axis the two of smallest magnitude become
zero (`trtopt.analysis.sparsity` says which axis and which layers, and cites NVIDIA for both). This is the
first step of NVIDIA's ASP workflow ("Automatic SParsity", NVIDIA/apex apex/contrib/sparsity: prune a trained
model by magnitude, then fine-tune it with the mask fixed): the fine-tuning, which recovers the accuracy,
happens in the training framework, not here.

Only the weight values change: nodes, names, other initializers and metadata stay as they were, so the
pruned model goes through `trtopt build` like the original. A weight read by more than one node is left
alone (pruning it for one layer would change the other).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import numpy_helper

from trtopt.analysis.sparsity import SPARSE_OPS, WeightSite, prune_24, weight_site
from trtopt.errors import TrtoptError


@dataclass(frozen=True)
class PrunedLayer:
    """What pruning one layer removed: shares of its weights' L1 norm (sum |w|) and L2 norm (sqrt sum w^2)."""

    name: str
    op: str
    weight: str
    shape: tuple[int, ...]
    axis: int
    l1_removed: float
    l2_removed: float
    macs: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "op": self.op,
            "weight": self.weight,
            "shape": list(self.shape),
            "axis": self.axis,
            "l1_removed": self.l1_removed,
            "l2_removed": self.l2_removed,
            "macs": self.macs,
        }


@dataclass(frozen=True)
class PruneReport:
    pruned: tuple[PrunedLayer, ...]
    not_eligible: dict[str, str] = field(default_factory=dict)  # layer -> why it cannot run 2:4 sparse

    def to_dict(self) -> dict[str, Any]:
        return {"pruned": [p.to_dict() for p in self.pruned], "not_eligible": dict(self.not_eligible)}


def layer_label(node: gs.Node) -> str:
    """The name a layer goes by in reports and `--layers`: the node's name, else op and first output."""
    return node.name or f"{node.op}({node.outputs[0].name if node.outputs else '?'})"


def prunable_layers(graph: gs.Graph) -> tuple[dict[str, WeightSite], dict[str, str]]:
    """({layer: its weight site} for the layers that can be pruned, {layer: reason} for the others), over the
    Conv, ConvTranspose, Gemm and MatMul nodes of `graph`, in graph order."""
    sites: dict[str, WeightSite] = {}
    reasons: dict[str, str] = {}
    for node in graph.nodes:
        if node.op not in (*SPARSE_OPS, "ConvTranspose"):
            continue
        label = layer_label(node)
        site = weight_site(node)
        if isinstance(site, str):
            reasons[label] = site
        elif site.constant is None:
            reasons[label] = "weights are stored quantised: prune the float model, then quantise it"
        elif _readers(node.inputs[1]) > 1:
            reasons[label] = f"its weight {site.name!r} is shared with another node"
        else:
            sites[label] = site
    return sites, reasons


def select_layers(
    sites: Mapping[str, WeightSite], reasons: Mapping[str, str], layers: Iterable[str] | None
) -> list[str]:
    """The layers to prune: every prunable one, or those named (each must exist and be prunable)."""
    if layers is None:
        return list(sites)
    wanted = list(dict.fromkeys(layers))
    unknown = [name for name in wanted if name not in sites and name not in reasons]
    if unknown:
        raise TrtoptError(
            f"--layers names {len(unknown)} layer(s) the model has no Conv, Gemm or MatMul by: "
            f"{', '.join(repr(n) for n in unknown[:5])}{' ...' if len(unknown) > 5 else ''}.",
            fix="Use the names `trtopt inspect MODEL` lists in its 2:4 sparsity table.",
        )
    refused = [f"{name!r} ({reasons[name]})" for name in wanted if name not in sites]
    if refused:
        raise TrtoptError(
            f"--layers names layer(s) that cannot be pruned to 2:4: {'; '.join(refused[:5])}.",
            fix="Drop them from --layers; `trtopt inspect MODEL` lists the eligible layers.",
        )
    return wanted


def pruned_weights(sites: Mapping[str, WeightSite], layers: Iterable[str]) -> dict[str, np.ndarray]:
    """{weight name: the weight pruned to 2:4} for the chosen layers (pure numpy; nothing is modified)."""
    return {sites[name].name: prune_24(sites[name].values, sites[name].axis) for name in layers}


def prune_report(
    sites: Mapping[str, WeightSite],
    layers: Iterable[str],
    reasons: Mapping[str, str],
    ops: Mapping[str, str],
    macs: Mapping[str, int | None] | None = None,
) -> PruneReport:
    """Per chosen layer, the share of its weights' L1 and L2 norm that 2:4 pruning removes."""
    pruned = []
    for name in layers:
        site = sites[name]
        dense = site.values.astype(np.float64)
        removed = dense - prune_24(dense, site.axis)
        l1, l2 = np.abs(dense).sum(), np.sqrt((dense**2).sum())
        l1_share = float(np.abs(removed).sum() / l1) if l1 else 0.0
        l2_share = float(np.sqrt((removed**2).sum()) / l2) if l2 else 0.0
        shape = tuple(int(d) for d in dense.shape)
        layer_macs = (macs or {}).get(name)
        op = ops.get(name, "?")
        pruned.append(PrunedLayer(name, op, site.name, shape, site.axis, l1_share, l2_share, layer_macs))
    return PruneReport(tuple(pruned), dict(reasons))


def with_weights(model: onnx.ModelProto, weights: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of `model` whose initializers (or Constant nodes) named in `weights` hold the new values;
    everything else is as it was."""
    result = onnx.ModelProto()
    result.CopyFrom(model)
    left = dict(weights)
    for index, tensor in enumerate(result.graph.initializer):
        if tensor.name in left:
            result.graph.initializer[index].CopyFrom(_tensor(left.pop(tensor.name), tensor))
    for node in result.graph.node:
        if node.op_type == "Constant" and node.output[0] in left:
            for attribute in node.attribute:
                if attribute.name == "value":
                    attribute.t.CopyFrom(_tensor(left.pop(node.output[0]), attribute.t))
    if left:
        raise ValueError(f"no initializer or Constant node holds {sorted(left)[:3]}")
    return result


def _tensor(values: np.ndarray, like: onnx.TensorProto) -> onnx.TensorProto:
    dtype = onnx.helper.tensor_dtype_to_np_dtype(like.data_type) if like.data_type else values.dtype
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), like.name)


def _readers(tensor: gs.Tensor) -> int:
    """How many nodes read the weight (through a Constant node's output, or the constant itself)."""
    return len(tensor.outputs)
