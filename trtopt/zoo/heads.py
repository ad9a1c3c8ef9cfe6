"""Classifier heads: global pooling and the two ways exporters write a linear layer."""

from __future__ import annotations

import onnx

from trtopt.zoo.builder import MODELS, GraphBuilder


@MODELS.register("classifier_head")
def classifier_head(batch: int, seed: int, opset: int) -> onnx.ModelProto:
    """A two-layer head on a 64x7x7 feature map::

        input ─ GlobalAveragePool ─ Flatten ─ Gemm (transB=1, 64->32) ─ Relu ─ MatMul (32->10) ─ Add ─ logits
    """
    b = GraphBuilder("classifier_head", seed=seed, opset=opset)
    x = b.input("input", [batch, 64, 7, 7])
    y = b.relu(b.gemm(b.pool_flatten(x), 64, 32))
    return b.build([b.linear_matmul(y, 32, 10, out="logits")])
