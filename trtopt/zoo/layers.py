"""Single-feature models for pass edge cases: lone BatchNorms, explicit Pad, grouped conv, swish family."""

from __future__ import annotations

import numpy as np
import onnx

from trtopt.zoo.builder import MODELS, GraphBuilder


@MODELS.register("bn_standalone")
def bn_standalone(batch: int, seed: int, opset: int) -> onnx.ModelProto:
    """BatchNorms with no conv before them (nothing to fold into; they must stay or become Mul+Add)::

        input ─┬─ BN ─ Relu ─ Conv3x3 ─┐
               └────────────────────── Add ─ BN ─ output
    """
    b = GraphBuilder("bn_standalone", seed=seed, opset=opset)
    x = b.input("input", [batch, 16, 16, 16])
    y = b.conv(b.relu(b.batchnorm(x, 16)), 16, 16, 3)
    return b.build([b.batchnorm(b.add(y, x), 16, out="output")])


@MODELS.register("pad_conv")
def pad_conv(batch: int, seed: int, opset: int) -> onnx.ModelProto:
    """An explicit zero Pad before a conv (foldable into its pads) and a conv with asymmetric pads::

        input (8x16x16) ─ Pad [t1 l2 b1 r2] ─ Conv3x3 pads 0 ─ Relu ─ Conv3x3 pads [t0 l1 b2 r1] ─ output
    """
    b = GraphBuilder("pad_conv", seed=seed, opset=opset)
    x = b.input("input", [batch, 8, 16, 16])
    pads = b.const("pads", np.array([0, 0, 1, 2, 0, 0, 1, 2], np.int64))
    zero = b.const("pad_value", np.array(0.0, np.float32))
    y = b.node("Pad", [x, pads, zero], mode="constant")  # 8x18x20
    y = b.relu(b.conv(y, 8, 16, 3, pads=[0, 0, 0, 0]))  # 16x16x18
    return b.build([b.conv(y, 16, 16, 3, pads=[0, 1, 2, 1], out="output")])  # 16x16x18


@MODELS.register("grouped_conv")
def grouped_conv(batch: int, seed: int, opset: int) -> onnx.ModelProto:
    """A grouped conv (ResNeXt style) with BN and LeakyRelu::

        input (16ch) ─ Conv3x3 group=4 (16->32) ─ BN ─ LeakyRelu(0.1) ─ output
    """
    b = GraphBuilder("grouped_conv", seed=seed, opset=opset)
    x = b.input("input", [batch, 16, 16, 16])
    y = b.batchnorm(b.conv(x, 16, 32, 3, group=4, bias=False), 32)
    return b.build([b.node("LeakyRelu", [y], out="output", alpha=0.1)])


@MODELS.register("silu_block")
def silu_block(batch: int, seed: int, opset: int) -> onnx.ModelProto:
    """The swish family after convs (EfficientNet, MobileNetV3); below opset 14 HardSwish is written
    x * HardSigmoid(x)::

        input ─ Conv3x3 ─┬─ Sigmoid ─ Mul ─ Conv1x1 ─ HardSwish ─ Conv3x3 ─ HardSigmoid ─ output
                         └───────────┘
    """
    b = GraphBuilder("silu_block", seed=seed, opset=opset)
    x = b.input("input", [batch, 16, 16, 16])
    y = b.silu(b.conv(x, 16, 16, 3))
    y = b.hard_swish(b.conv(y, 16, 24, 1))
    return b.build([b.node("HardSigmoid", [b.conv(y, 24, 16, 3)], out="output", alpha=0.2, beta=0.5)])
