"""The experimental ops of ONNX's first opsets, spelt with standard ones before anything else reads the model.

ONNX 1.5 (opset 10) dropped its experimental ops (onnx/onnx docs/Changelog.md). Models exported before then
still use some: `ImageScaler` is the preprocessing node of the old ONNX model zoo's Tiny YOLOv2 and of
WinMLTools/CNTK exports, and ONNX Runtime runs it up to opset 9. onnx's checker and version converter no longer
know it, so trtopt refused such a model as one with custom ops ("did you mean 'ImageDecoder'?"). Each op below is
replaced by its definition in standard ops that exist at every opset (TensorRT's ONNX parser imports
`ImageScaler` and `ScaledTanh` the same way):

    ImageScaler(x; scale, bias[C])    scale * x + bias per channel (axis 1)
    Scale(x; scale)                   scale * x
    Affine(x; alpha, beta)            alpha * x + beta
    ScaledTanh(x; alpha, beta)        alpha * tanh(beta * x)
    ParametricSoftplus(x; alpha, beta) alpha * softplus(beta * x)

The constants are initializers (listed as graph inputs too in IR 3 files); below opset 7 the products and
sums carry `broadcast=1` (and `axis=1` for the per-channel bias), which `trtopt.frontend.legacy_opsets` then
spells the numpy way. The other dropped ops (`Crop`, `ConstantFill`, `GivenTensorFill`, `DynamicSlice`,
`GRUUnit`, `ATen`) stay refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

EXPERIMENTAL = frozenset({"ImageScaler", "Scale", "Affine", "ScaledTanh", "ParametricSoftplus"})
DROPPED = frozenset({"Crop", "ConstantFill", "GivenTensorFill", "DynamicSlice", "GRUUnit", "ATen"})
DROPPED_HINT = " (an experimental op of ONNX's first opsets, dropped in opset 10, which trtopt does not spell out)"


def without_experimental_ops(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """`model` with every op of `EXPERIMENTAL` in the default domain spelt out (itself when it has none)."""
    if not any(n.op_type in EXPERIMENTAL and n.domain in ("", "ai.onnx") for n in model.graph.node):
        return model
    clone = onnx.ModelProto()
    clone.CopyFrom(model)
    nodes: list[onnx.NodeProto] = []
    for index, node in enumerate(clone.graph.node):
        if node.op_type not in EXPERIMENTAL or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        spelt = _Spelling(clone.graph, f"{node.name or node.op_type}_{index}", opset, clone.ir_version < 4)
        nodes += spelt.of(node)
    del clone.graph.node[:]
    clone.graph.node.extend(nodes)
    return clone


class _Spelling:
    """Builds the standard nodes for one experimental node, naming every new tensor after it."""

    def __init__(self, graph: onnx.GraphProto, prefix: str, opset: int, listed: bool) -> None:
        self.graph, self.prefix, self.legacy = graph, prefix, opset < 7
        self.listed = listed  # IR 3: every initializer is a graph input too
        self.nodes: list[onnx.NodeProto] = []

    def of(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        x, y = node.input[0], node.output[0]
        if node.op_type == "ImageScaler":
            scaled = self.binary("Mul", x, [attrs.get("scale", 1.0)])
            self.binary("Add", scaled, list(attrs.get("bias", [0.0])), out=y, per_channel=True)
        elif node.op_type == "Scale":
            self.binary("Mul", x, [attrs.get("scale", 1.0)], out=y)
        elif node.op_type == "Affine":
            self.binary("Add", self.binary("Mul", x, [attrs.get("alpha", 1.0)]), [attrs.get("beta", 0.0)], out=y)
        else:  # ScaledTanh, ParametricSoftplus: alpha * f(beta * x)
            inner = self.binary("Mul", x, [attrs.get("beta", 1.0)])
            applied = self.unary("Tanh" if node.op_type == "ScaledTanh" else "Softplus", inner)
            self.binary("Mul", applied, [attrs.get("alpha", 1.0)], out=y)
        return self.nodes

    def binary(self, op: str, x: str, values: list[float], *, out: str | None = None, per_channel: bool = False) -> str:
        """`op`(x, constant `values`): a scalar, or with `per_channel` one value per channel of axis 1."""
        out = out or self._name(op)
        constant = np.asarray(values, np.float32)
        if per_channel and not self.legacy:
            constant = constant.reshape(-1, 1, 1)  # [C, 1, 1] against [N, C, H, W]
        elif not per_channel:
            constant = constant.reshape(()) if not self.legacy else constant.reshape(1)
        name = self._name(f"{op}_constant")
        self.graph.initializer.append(numpy_helper.from_array(constant, name))
        if self.listed:
            self.graph.input.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, constant.shape))
        extra: dict[str, Any] = {} if not self.legacy else {"broadcast": 1, **({"axis": 1} if per_channel else {})}
        self.nodes.append(helper.make_node(op, [x, name], [out], name=self._name(op), **extra))
        return out

    def unary(self, op: str, x: str) -> str:
        out = self._name(op)
        self.nodes.append(helper.make_node(op, [x], [out], name=out))
        return out

    def _name(self, what: str) -> str:
        return f"{self.prefix}/{what}_{len(self.nodes)}"
