"""Quantisation options. None / empty means default."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QuantConfig:
    """Where INT8 may go.

    `exclude` holds node names or op types to keep in floating point. `keep_first_last` keeps the first
    and the last quantisable layer in float (common for accuracy). Layers with fewer than
    `min_channels` input or output channels stay float: TensorRT gains nothing on them (DESIGN.md,
    "leave tiny layers in floating point") and their error is large relative to their cost. On the CPU
    backend too: quantising EfficientNet-Lite0's 3-channel stem bought no measurable speed and cost
    about two points of top-1 agreement with FP32 (measured with tools/bench_accuracy.py).

    `quantize_outputs` also puts Q/DQ on every consumer edge of a quantised layer's (fused) output. The
    TensorRT form leaves those to TensorRT; ONNX Runtime needs them, because it only turns a Conv into
    QLinearConv when the Conv's output is quantised too (DQ -> Conv -> Q). The CPU backend sets it.
    """

    exclude: tuple[str, ...] = ()
    keep_first_last: bool = False
    min_channels: int = 16
    quantize_residual: bool = True
    quantize_outputs: bool = False
