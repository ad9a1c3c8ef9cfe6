"""Model summary: I/O, op histogram, parameter count and estimated MACs per layer.

MACs (multiply-accumulates) are counted for the layers that dominate inference time: Conv (with
groups), ConvTranspose, Gemm and MatMul. Every other op that computes is reported as *elementwise
ops*, one per output element (BatchNorm, activations, Add, pooling); ops that only move or relabel
data (Reshape, Concat, Transpose...) count zero. Where the batch dimension is dynamic the figures are
per sample; where another dimension is unknown the layer's cost is unknown and listed, so the user
can pass `--shapes`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_graphsurgeon as gs

from trtopt.passes.query import constant_tensor

if TYPE_CHECKING:
    from trtopt.analysis.fusions import FusionReport

Dim = int | str | None

MAC_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
# Ops that move, copy or relabel data without arithmetic.
MOVEMENT_OPS = frozenset(
    {
        *("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Shape", "Size", "Constant", "ConstantOfShape"),
        *("Identity", "Transpose", "Concat", "Split", "Slice", "Gather", "GatherElements", "Pad"),
        *("Expand", "Tile", "Cast", "DepthToSpace", "SpaceToDepth"),
    }
)
# Constant inputs that are shapes, axes, bounds or quantisation parameters, not learned weights.
NON_PARAM_INPUTS: dict[str, frozenset[int]] = {
    "Reshape": frozenset({1}),
    "Pad": frozenset({1, 2, 3}),
    "Clip": frozenset({1, 2}),
    "Slice": frozenset({1, 2, 3, 4}),
    "Resize": frozenset({1, 2, 3}),
    "Upsample": frozenset({1}),
    "Expand": frozenset({1}),
    "Tile": frozenset({1}),
    "Squeeze": frozenset({1}),
    "Unsqueeze": frozenset({1}),
    "Split": frozenset({1}),
    "Gather": frozenset({1}),
    "TopK": frozenset({1}),
    "ReduceMean": frozenset({1}),
    "ReduceSum": frozenset({1}),
    "ReduceMax": frozenset({1}),
    "QuantizeLinear": frozenset({1, 2}),
    "DequantizeLinear": frozenset({1, 2}),
}


@dataclass(frozen=True)
class TensorSummary:
    name: str
    shape: tuple[Dim, ...] | None
    dtype: str

    def to_dict(self) -> dict[str, Any]:
        shape = list(self.shape) if self.shape is not None else None
        return {"name": self.name, "shape": shape, "dtype": self.dtype}


@dataclass(frozen=True)
class LayerCost:
    """One node's cost; `None` where a shape it depends on is unknown."""

    name: str
    op: str
    output_shape: tuple[Dim, ...] | None
    macs: int | None
    elementwise: int | None
    params: int

    def to_dict(self) -> dict[str, Any]:
        shape = list(self.output_shape) if self.output_shape is not None else None
        return {
            "name": self.name,
            "op": self.op,
            "output_shape": shape,
            "macs": self.macs,
            "elementwise": self.elementwise,
            "params": self.params,
        }


@dataclass(frozen=True)
class ModelSummary:
    source: str | None
    opset: int | None
    inputs: tuple[TensorSummary, ...]
    outputs: tuple[TensorSummary, ...]
    op_histogram: dict[str, int]
    params: int
    macs: int
    elementwise: int
    layers: tuple[LayerCost, ...]
    fusions: FusionReport | None = None  # what `trtopt optimize` would do (`analysis.fusions`)

    @property
    def unknown_cost(self) -> tuple[str, ...]:
        """Layers whose MACs or elementwise count could not be computed (unknown shapes)."""
        return tuple(layer.name for layer in self.layers if layer.macs is None or layer.elementwise is None)

    def top_layers(self, count: int | None = None) -> list[LayerCost]:
        """Layers by descending MACs (unknown last), `count=None` for all."""
        ranked = sorted(self.layers, key=lambda layer: -(layer.macs or 0))
        return ranked if count is None else ranked[:count]

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "opset": self.opset,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "op_histogram": dict(self.op_histogram),
            "nodes": len(self.layers),
            "params": self.params,
            "macs": self.macs,
            "elementwise": self.elementwise,
            "unknown_cost": list(self.unknown_cost),
            "layers": [layer.to_dict() for layer in self.layers],
            "fusions": self.fusions.to_dict() if self.fusions is not None else None,
        }


def summarize(
    graph: gs.Graph,
    *,
    source: str | None = None,
    opset: int | None = None,
    fusions: FusionReport | None = None,
) -> ModelSummary:
    """Summarise a gs.Graph whose tensor shapes have been inferred (see `graph_from_onnx`); `fusions`
    (from `fusion_report`) is carried along for the report."""
    seen: set[int] = set()
    layers = tuple(_layer_cost(node, seen) for node in graph.nodes)
    histogram = Counter(node.op for node in graph.nodes)
    return ModelSummary(
        source=source,
        opset=opset,
        inputs=tuple(_tensor_summary(t) for t in graph.inputs),
        outputs=tuple(_tensor_summary(t) for t in graph.outputs),
        op_histogram=dict(sorted(histogram.items(), key=lambda kv: (-kv[1], kv[0]))),
        params=sum(layer.params for layer in layers),
        macs=sum(layer.macs or 0 for layer in layers),
        elementwise=sum(layer.elementwise or 0 for layer in layers),
        layers=layers,
        fusions=fusions,
    )


def node_label(node: gs.Node) -> str:
    """A readable name for a node, even an unnamed one."""
    if node.name:
        return str(node.name)
    first = node.outputs[0].name if node.outputs else "?"
    return f"{node.op}->{first}"


def _tensor_summary(tensor: gs.Tensor) -> TensorSummary:
    shape = None if tensor.shape is None else tuple(_dim(d) for d in tensor.shape)
    return TensorSummary(name=tensor.name, shape=shape, dtype=_dtype_name(tensor.dtype))


def _dim(d: object) -> Dim:
    if isinstance(d, (int, np.integer)):
        return int(d) if d >= 0 else None
    return str(d) if d else None


def _dtype_name(dtype: object) -> str:
    if dtype is None:
        return "unknown"
    try:
        return np.dtype(dtype).name  # type: ignore[call-overload]
    except TypeError:
        return str(dtype)


def _layer_cost(node: gs.Node, seen: set[int]) -> LayerCost:
    out = node.outputs[0] if node.outputs else None
    out_shape = _tensor_summary(out).shape if out is not None else None
    macs: int | None = 0
    elementwise: int | None = 0
    if node.op in MAC_OPS:
        macs = _macs(node)
    elif node.op not in MOVEMENT_OPS:
        elementwise = _numel(out.shape if out is not None else None)
    return LayerCost(node_label(node), node.op, out_shape, macs, elementwise, _params(node, seen))


def _numel(shape: Sequence[object] | None) -> int | None:
    """Element count; a dynamic leading (batch) dimension counts as 1, any other unknown gives None."""
    if shape is None:
        return None
    dims = [_dim(d) for d in shape]
    if dims and not isinstance(dims[0], int):
        dims[0] = 1
    return math.prod(dims) if all(isinstance(d, int) for d in dims) else None  # type: ignore[arg-type]


def _known(shape: Sequence[object] | None) -> tuple[int, ...] | None:
    """The trailing dims as ints (the leading batch dim may be dynamic), or None if any is unknown."""
    if shape is None:
        return None
    dims = [_dim(d) for d in shape]
    if dims and not isinstance(dims[0], int):
        dims[0] = 1
    return tuple(dims) if all(isinstance(d, int) for d in dims) else None  # type: ignore[arg-type]


def _macs(node: gs.Node) -> int | None:
    out = _numel(node.outputs[0].shape)
    weight = _known(node.inputs[1].shape) if len(node.inputs) > 1 else None
    data = _known(node.inputs[0].shape)
    if node.op == "Conv":  # each output element: Cin/group * prod(kernel) MACs
        return out * math.prod(weight[1:]) if out is not None and weight else None
    if node.op == "ConvTranspose":  # each input element scatters into Cout/group * prod(kernel)
        inp = _numel(node.inputs[0].shape)
        return inp * math.prod(weight[1:]) if inp is not None and weight else None
    if data is None or out is None or not data:
        return None
    if node.op == "Gemm":
        k = data[0] if node.attrs.get("transA", 0) else data[-1]
        return out * k
    return out * data[-1]  # MatMul: [..., M, K] x [..., K, N]


def _params(node: gs.Node, seen: set[int]) -> int:
    """Elements of constant inputs in weight slots, each constant counted once."""
    skip = NON_PARAM_INPUTS.get(node.op, frozenset())
    total = 0
    for i, tensor in enumerate(node.inputs):
        if i in skip or id(tensor) in seen:
            continue
        values = constant_tensor(tensor)
        if values is not None:
            seen.add(id(tensor))
            total += int(np.prod(values.shape))
    return total
