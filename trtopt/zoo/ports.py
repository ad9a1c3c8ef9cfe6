"""Graphs as framework ports and old converters write them: NHWC kept by Transposes, no-op Casts, BatchNorm
spelt out in primitives, PRelu, MatMul + Add heads.

A TensorFlow or Caffe network run in PyTorch with its NHWC layout kept (or converted by keras2onnx, onnx-tf,
tflite converters) wraps every convolution in a Transpose pair, writes `Cast(float -> float)` wherever the
source had a dtype annotation, and BatchNorm as `(x - mean) * scale + beta` along the last axis. These
models are what the canonicalisation passes are tested on (issue #45).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from trtopt.zoo.builder import MODELS, GraphBuilder

TO_NCHW = [0, 3, 1, 2]
TO_NHWC = [0, 2, 3, 1]


def port_conv(b: GraphBuilder, x: str, cin: int, cout: int, kernel: int, *, stride: int = 1) -> str:
    """NHWC in, NHWC out: Transpose, Conv, Transpose, a no-op Cast, BN as Sub/Mul/Add on the last axis."""
    y = b.node("Transpose", [x], perm=TO_NCHW)
    y = b.conv(y, cin, cout, kernel, stride=stride, bias=False)
    y = b.node("Transpose", [y], perm=TO_NHWC)
    y = b.node("Cast", [y], to=TensorProto.FLOAT)
    mean = b.rng.uniform(-0.5, 0.5, cout).astype(np.float32)
    scale = b.rng.uniform(0.5, 1.5, cout).astype(np.float32)
    beta = b.rng.uniform(-0.3, 0.3, cout).astype(np.float32)
    y = b.node("Sub", [y, b.const("bn_mean", mean)])
    y = b.mul(y, b.const("bn_scale", scale))
    return b.add(y, b.const("bn_beta", beta))


def port_block(b: GraphBuilder, x: str, channels: int, *, prelu: bool = False) -> str:
    """Two port convs and an NHWC residual Add; Relu, or PRelu with a per-channel slope on the last axis."""
    y = _activation(b, port_conv(b, x, channels, channels, 3), channels, prelu)
    y = port_conv(b, y, channels, channels, 3)
    y = b.node("Cast", [b.add(y, x)], to=TensorProto.FLOAT)
    return _activation(b, y, channels, prelu)


def _activation(b: GraphBuilder, x: str, channels: int, prelu: bool) -> str:
    if not prelu:
        return b.relu(x)
    return b.node("PRelu", [x, b.const("prelu_slope", b.rng.uniform(0.05, 0.3, channels).astype(np.float32))])


def _port_classifier(name: str, batch: int, seed: int, opset: int, *, prelu: bool) -> onnx.ModelProto:
    b = GraphBuilder(name, seed=seed, opset=opset)
    x = b.input("input", [batch, 32, 32, 3])
    x = b.node("Identity", [b.node("Cast", [x], to=TensorProto.FLOAT)])
    y = _activation(b, port_conv(b, x, 3, 16, 3, stride=2), 16, prelu)
    y = port_block(b, y, 16, prelu=prelu)
    y = _activation(b, port_conv(b, y, 16, 32, 3, stride=2), 32, prelu)
    y = port_block(b, y, 32, prelu=prelu)
    pooled = b.node("ReduceMean", [y], axes=[1, 2], keepdims=0) if opset < 18 else b.node(
        "ReduceMean", [y, b.const("axes", np.array([1, 2], np.int64))], keepdims=0
    )
    return b.build([b.linear_matmul(pooled, 32, 10, out="output")])


@MODELS.register("nhwc_port")
def nhwc_port(batch: int, seed: int, opset: int) -> onnx.ModelProto:
    """A small ResNet as a framework port writes it (NHWC input, 32x32x3)::

        input ─ Cast ─ Identity ─ [T ─ Conv ─ T ─ Cast ─ Sub ─ Mul ─ Add] ─ Relu ─ block ─ [..] ─ Relu ─ block
          block: x ─ [T Conv T Cast Sub Mul Add] ─ Relu ─ [T Conv T Cast Sub Mul Add] ─ Add(x) ─ Cast ─ Relu
        ─ ReduceMean(axes 1, 2) ─ MatMul ─ Add ─ output
    """
    return _port_classifier("nhwc_port", batch, seed, opset, prelu=False)


@MODELS.register("nhwc_port_prelu")
def nhwc_port_prelu(batch: int, seed: int, opset: int) -> onnx.ModelProto:
    """`nhwc_port` with PRelu (per-channel slopes on the NHWC channel axis) where it has Relu, as TFLite
    face models are written."""
    return _port_classifier("nhwc_port_prelu", batch, seed, opset, prelu=True)
