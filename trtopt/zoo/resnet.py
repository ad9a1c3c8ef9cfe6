"""ResNet blocks (He et al. 2016): the basic block and the bottleneck with a projection shortcut."""

from __future__ import annotations

import onnx

from trtopt.zoo.builder import MODELS, GraphBuilder


def basic_block(b: GraphBuilder, x: str, channels: int, *, out: str | None = None) -> str:
    """conv3x3-bn-relu-conv3x3-bn, + identity, relu."""
    y = b.conv_bn(x, channels, channels, 3)
    y = b.conv_bn(y, channels, channels, 3, act=None)
    return b.relu(b.add(y, x), out=out)


def bottleneck_block(
    b: GraphBuilder, x: str, cin: int, mid: int, cout: int, *, stride: int = 2, out: str | None = None
) -> str:
    """1x1-3x3(stride)-1x1 main path, conv1x1(stride)+bn projection shortcut, Add, Relu."""
    y = b.conv_bn(x, cin, mid, 1)
    y = b.conv_bn(y, mid, mid, 3, stride=stride)
    y = b.conv_bn(y, mid, cout, 1, act=None)
    shortcut = b.conv_bn(x, cin, cout, 1, stride=stride, act=None)
    return b.relu(b.add(y, shortcut), out=out)


@MODELS.register("resnet_basic")
def resnet_basic(batch: int, seed: int, opset: int) -> onnx.ModelProto:
    """ResNet basic block on a 16x16x16 feature map::

        input ──────────────────────────────────┐
          └─ Conv3x3 ─ BN ─ Relu ─ Conv3x3 ─ BN ─ Add ─ Relu ─ output
    """
    b = GraphBuilder("resnet_basic", seed=seed, opset=opset)
    x = b.input("input", [batch, 16, 16, 16])
    return b.build([basic_block(b, x, 16, out="output")])


@MODELS.register("resnet_bottleneck")
def resnet_bottleneck(batch: int, seed: int, opset: int) -> onnx.ModelProto:
    """Bottleneck block, 16 -> 32 channels, stride 2 (ResNet v1.5 puts the stride on the 3x3)::

        input ─┬─ Conv1x1 ─ BN ─ Relu ─ Conv3x3/2 ─ BN ─ Relu ─ Conv1x1 ─ BN ─┐
               └─ Conv1x1/2 ─ BN (projection shortcut) ─────────────────────── Add ─ Relu ─ output
    """
    b = GraphBuilder("resnet_bottleneck", seed=seed, opset=opset)
    x = b.input("input", [batch, 16, 16, 16])
    return b.build([bottleneck_block(b, x, 16, 8, 32, out="output")])
