"""Run a graph's fusion groups as ONNX Runtime's own fused kernel, to check numerically that each group
`find_fusion_groups` reports is a real fusion.

ONNX Runtime's contrib ops com.microsoft FusedConv, activation(Conv(X, W, B) + Z), and FusedGemm,
activation(Gemm(A, B, C)), run a layer and its epilogue as one kernel (onnxruntime
docs/ContribOperators.md; Z is the residual its ConvAddActivationFusion folds in). Replacing a group's
nodes by one such node gives the original outputs only if the group is what it claims: the tensors
inside it are read by nothing else, the activation is the one named, the residual is the Add's other
operand. Groups with activations those kernels lack (SiLU, HardSwish; Clip after a Gemm) and groups
headed by a ConvTranspose are left as they are.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from trtopt.frontend.edit import canonicalize
from trtopt.passes import FusionGroup, find_fusion_groups
from trtopt.passes.query import clip_bounds, is_missing

# trtopt's activation name -> FusedConv's `activation` attribute (MLAS activation kinds).
ORT_ACTIVATIONS = {
    "relu": "Relu", "relu6": "Clip", "clip": "Clip", "leaky_relu": "LeakyRelu",
    "sigmoid": "Sigmoid", "tanh": "Tanh", "hard_sigmoid": "HardSigmoid",
}  # fmt: skip
FLOAT_MAX = float(np.finfo(np.float32).max)


GEMM_ACTIVATIONS = ("relu", "leaky_relu", "sigmoid", "tanh", "hard_sigmoid")


def with_fused_kernels(graph: gs.Graph, groups: list[FusionGroup] | None = None) -> tuple[gs.Graph, Counter[str]]:
    """A copy of `graph` with each fusion group (default: `find_fusion_groups`) that ONNX Runtime has a
    fused kernel for replaced by that one node; returns the copy and the kinds replaced."""
    work = graph.copy()
    by_name = {n.name: n for n in work.nodes}
    tensors = work.tensors()
    replaced: Counter[str] = Counter()
    for group in find_fusion_groups(work) if groups is None else groups:
        nodes = [by_name[name] for name in group.nodes]
        activation = _activation(group)
        if nodes[0].op == "Conv" and activation in (None, *ORT_ACTIVATIONS):
            fused = _fused_conv(group, nodes, activation, tensors)
        elif nodes[0].op == "Gemm" and activation in GEMM_ACTIVATIONS:
            fused = _fused_gemm(group, nodes, activation, tensors)
        else:
            continue
        work.nodes.append(fused)
        for node in nodes:
            node.outputs.clear()
            node.inputs.clear()
        replaced[group.kind] += 1
    canonicalize(work)
    opset = int(work.opset) if work.opset else 13
    work.import_domains = [onnx.helper.make_opsetid("", opset), onnx.helper.make_opsetid("com.microsoft", 1)]
    return work, replaced


def _activation(group: FusionGroup) -> str | None:
    last = group.kind.split("+")[-1]
    return None if last in ("conv", "add") else last


def _fused_conv(
    group: FusionGroup, nodes: list[gs.Node], activation: str | None, tensors: dict[str, gs.Tensor]
) -> gs.Node:
    conv = nodes[0]
    attrs = dict(conv.attrs)
    if activation is not None:
        attrs["activation"] = ORT_ACTIVATIONS[activation]
        params = _activation_params(activation, nodes[-1])
        if params:
            attrs["activation_params"] = params
    channels = conv.inputs[1].shape[0]
    has_bias = len(conv.inputs) > 2 and not is_missing(conv.inputs[2])
    bias = conv.inputs[2] if has_bias else gs.Constant(f"{conv.name}/zero_bias", np.zeros(channels, np.float32))
    inputs = [conv.inputs[0], conv.inputs[1], bias]
    if group.residual is not None:
        inputs.append(tensors[group.residual])
    out = tensors[group.output]
    return gs.Node("FusedConv", f"{conv.name}/fused", attrs, inputs, [out], domain="com.microsoft")


def _fused_gemm(group: FusionGroup, nodes: list[gs.Node], activation: str, tensors: dict[str, gs.Tensor]) -> gs.Node:
    gemm = nodes[0]
    attrs = {**gemm.attrs, "activation": ORT_ACTIVATIONS[activation]}
    params = _activation_params(activation, nodes[-1])
    attrs.update(zip(("activation_alpha", "activation_beta")[: len(params)], params, strict=True))
    out = tensors[group.output]
    return gs.Node("FusedGemm", f"{gemm.name}/fused", attrs, list(gemm.inputs), [out], domain="com.microsoft")


def _activation_params(activation: str, node: gs.Node) -> list[float]:
    if activation in ("relu6", "clip"):
        low, high = clip_bounds(node)
        assert low is not None and high is not None, f"{node.name}: a fused Clip must have constant bounds"
        return [max(low, -FLOAT_MAX), min(high, FLOAT_MAX)]
    if activation == "leaky_relu":
        return [float(node.attrs.get("alpha", 0.01))]
    if activation == "hard_sigmoid":
        return [float(node.attrs.get("alpha", 0.2)), float(node.attrs.get("beta", 0.5))]
    return []
