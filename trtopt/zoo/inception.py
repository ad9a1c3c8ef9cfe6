"""Inception module (Szegedy et al. 2015): sibling 1x1 convs on one tensor, joined by a Concat."""

from __future__ import annotations

import onnx

from trtopt.zoo.builder import MODELS, GraphBuilder
from trtopt.zoo.resnet import basic_block


def inception_block(
    b: GraphBuilder, x: str, cin: int, widths: tuple[int, int, int, int, int, int], *, out: str | None = None
) -> str:
    """Four branches: 1x1 | 1x1 reduce -> 3x3 | 1x1 reduce -> 5x5 | maxpool3x3 -> 1x1.

    `widths` = (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool proj). The three 1x1 convs that read `x`
    share kernel, stride, pads, dilation and group: the horizontal-fusion case.
    """
    c1, r3, c3, r5, c5, cp = widths
    branch1 = b.relu(b.conv(x, cin, c1, 1))
    branch3 = b.relu(b.conv(b.relu(b.conv(x, cin, r3, 1)), r3, c3, 3))
    branch5 = b.relu(b.conv(b.relu(b.conv(x, cin, r5, 1)), r5, c5, 5))
    branch_pool = b.relu(b.conv(b.maxpool(x, 3, pad=1), cin, cp, 1))
    return b.concat([branch1, branch3, branch5, branch_pool], out=out)


@MODELS.register("inception")
def inception(batch: int, seed: int, opset: int) -> onnx.ModelProto:
    """Inception module on 16x16x16, plus a 3x3 sibling on the input that must *not* join the 1x1 group::

                 ┌─ Conv1x1 ─ Relu ──────────────────────┐
                 ├─ Conv1x1 ─ Relu ─ Conv3x3 ─ Relu ─────┤
        input ───┼─ Conv1x1 ─ Relu ─ Conv5x5 ─ Relu ─────┼─ Concat ─ output (32 ch)
                 ├─ MaxPool3x3 ─ Conv1x1 ─ Relu ─────────┘
                 └─ Conv3x3 ─ Relu ─ side (8 ch)
    """
    b = GraphBuilder("inception", seed=seed, opset=opset)
    x = b.input("input", [batch, 16, 16, 16])
    y = inception_block(b, x, 16, (8, 8, 12, 4, 6, 6), out="output")
    side = b.relu(b.conv(x, 16, 8, 3), out="side")
    return b.build([y, side])


@MODELS.register("inception_pool_net")
def inception_pool_net(batch: int, seed: int, opset: int) -> onnx.ModelProto:
    """A small classifier around an Inception block with a pooling branch, BatchNorm kept (not folded by
    the exporter) and ReLU6 written as Clip with `Constant`-node bounds (issue #13, failure 2: its INT8
    build lost every node after the Concat). Branch widths are >= 16 so the branch convs are INT8::

        input (3x16x16) ─ Conv3x3 ─ BN ─ Relu (32) ─┬─ Conv1x1 ─ BN ─ Relu (16) ──────────────────┐
                                                    ├─ Conv1x1 ─ BN ─ Relu ─ Conv3x3 ─ BN ─ Relu (24) ┼─ Concat (56)
                                                    └─ Conv1x1 ─ BN ─ Relu ─ MaxPool3x3/1 pad 1 (16) ─┘
          ─ DWConv3x3 (56) ─ BN ─ Clip(0,6) ─ Conv1x1 (56->32) ─ BN ─ Clip(0,6)    bounds from Constant nodes
          ─ basic block (identity Add) ─ GlobalAveragePool ─ Flatten ─ Gemm ─ logits (10)
    """
    b = GraphBuilder("inception_pool_net", seed=seed, opset=opset)
    x = b.input("input", [batch, 3, 16, 16])
    y = b.conv_bn(x, 3, 32, 3)
    branch1 = b.conv_bn(y, 32, 16, 1)
    branch3 = b.conv_bn(b.conv_bn(y, 32, 24, 1), 24, 24, 3)
    branch_pool = b.maxpool(b.conv_bn(y, 32, 16, 1), 3, pad=1)
    y = b.concat([branch1, branch3, branch_pool])
    y = b.conv_bn(y, 56, 56, 3, group=56, act="relu6_node")
    y = b.conv_bn(y, 56, 32, 1, act="relu6_node")
    y = basic_block(b, y, 32)
    return b.build([b.gemm(b.pool_flatten(y), 32, 10, out="logits")])
