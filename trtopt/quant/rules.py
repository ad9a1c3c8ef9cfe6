"""Which inputs of which ops are quantised: a one-screen registry from op type to rule.

A rule looks at one node and returns the inputs to quantise as `Mark`s; it never edits the graph.
Facts from TensorRT's explicit-quantization guide as summarised in DESIGN.md: quantise the *inputs*
of Conv/Gemm/MatMul (activation per tensor, weight per output channel: Conv axis 0, ConvTranspose
axis 1), never their outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import onnx_graphsurgeon as gs

from trtopt.registry import Registry


@dataclass(frozen=True)
class Mark:
    """Quantise input `index` of a node: an activation (per tensor) or a weight (per channel on `axis`)."""

    index: int
    kind: str  # "activation" | "weight"
    axis: int = 0


Rule = Callable[[gs.Node], list[Mark]]
RULES: Registry[Rule] = Registry("quantisation rule")


def _weight_or_activation(node: gs.Node, index: int, axis: int) -> Mark:
    tensor = node.inputs[index]
    return Mark(index, "weight", axis) if isinstance(tensor, gs.Constant) else Mark(index, "activation")


@RULES.register("Conv")
def conv_rule(node: gs.Node) -> list[Mark]:
    return [Mark(0, "activation"), _weight_or_activation(node, 1, axis=0)]


@RULES.register("ConvTranspose")
def conv_transpose_rule(node: gs.Node) -> list[Mark]:
    return [Mark(0, "activation"), _weight_or_activation(node, 1, axis=1)]


@RULES.register("Gemm")
def gemm_rule(node: gs.Node) -> list[Mark]:
    if node.attrs.get("transA", 0):
        return []  # transposed activations: rare, and ONNX Runtime has no INT8 kernel for them
    # Output features run along B's axis 0 when transB=1, else axis 1.
    return [
        Mark(0, "activation"),
        _weight_or_activation(node, 1, axis=0 if node.attrs.get("transB", 0) else 1),
    ]


@RULES.register("MatMul")
def matmul_rule(node: gs.Node) -> list[Mark]:
    """Both inputs, activation x activation too (attention's Q.K^T and softmax.V), as NVIDIA Model Optimizer's
    ONNX quantiser does by default (`modelopt.onnx.quantization.quantize(disable_mha_qdq=False)`). Measured on
    PP-OCRv4-rec's SVTR neck (avx2, all-INT8 plan, 128 lines the build never saw, paired per-line cosine): its
    four activation x activation MatMuls kept float +0.0002 +- 0.0003, all 13 MatMuls float +0.0005 +- 0.0002,
    SmoothQuant-style input equalisation of the 9 weight MatMuls (alpha 0.5) +0.0005 +- 0.0004, against
    +0.011 for every Conv float: the MatMuls' INT8 inputs are not where that model loses accuracy."""
    return [Mark(0, "activation"), _weight_or_activation(node, 1, axis=-1)]
