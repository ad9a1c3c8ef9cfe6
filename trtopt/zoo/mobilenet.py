"""MobileNetV2 inverted residual block (Sandler et al. 2018): expand, depthwise, project, residual."""

from __future__ import annotations

import onnx

from trtopt.zoo.builder import MODELS, GraphBuilder


@MODELS.register("mobilenetv2_block")
def mobilenetv2_block(batch: int, seed: int, opset: int) -> onnx.ModelProto:
    """Inverted residual, 16 channels, expansion 6; ReLU6 is Clip(0, 6) as PyTorch exports it::

        input ─┬─ Conv1x1 (16->96) ─ BN ─ Clip(0,6) ─ DWConv3x3 (group=96) ─ BN ─ Clip(0,6)
               │     ─ Conv1x1 (96->16) ─ BN ─┐
               └──────────────────────────── Add ─ output
    """
    b = GraphBuilder("mobilenetv2_block", seed=seed, opset=opset)
    x = b.input("input", [batch, 16, 16, 16])
    y = b.conv_bn(x, 16, 96, 1, act="relu6")
    y = b.conv_bn(y, 96, 96, 3, group=96, act="relu6")
    y = b.conv_bn(y, 96, 16, 1, act=None)
    return b.build([b.add(y, x, out="output")])
