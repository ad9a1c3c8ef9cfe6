"""A small complete classifier: the model end-to-end tests calibrate, quantise and run."""

from __future__ import annotations

import onnx

from trtopt.zoo.builder import MODELS, GraphBuilder
from trtopt.zoo.inception import inception_block
from trtopt.zoo.resnet import basic_block, bottleneck_block


@MODELS.register("tiny_cnn")
def tiny_cnn(batch: int, seed: int, opset: int) -> onnx.ModelProto:
    """3x32x32 image -> 10 logits, every pattern the passes target in one network::

        input ─ Conv3x3 ─ BN ─ Relu                       stem, 16x32x32
              ─ basic block (identity Add)                16x32x32
              ─ bottleneck block /2 (projection Add)      32x16x16
              ─ inception block (1x1 siblings, Concat)    48x16x16
              ─ GlobalAveragePool ─ Flatten ─ Gemm ─ logits (10)
    """
    b = GraphBuilder("tiny_cnn", seed=seed, opset=opset)
    x = b.input("input", [batch, 3, 32, 32])
    y = b.conv_bn(x, 3, 16, 3)
    y = basic_block(b, y, 16)
    y = bottleneck_block(b, y, 16, 16, 32)
    y = inception_block(b, y, 32, (16, 12, 16, 4, 8, 8))
    return b.build([b.gemm(b.pool_flatten(y), 48, 10, out="logits")])
