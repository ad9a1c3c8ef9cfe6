"""Quantisation options. None / empty means default."""

from __future__ import annotations

from dataclasses import dataclass

from trtopt.errors import TrtoptError


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

    `float_leading_depthwise` keeps a depthwise conv float when its input comes from a float layer (or
    the graph input): INT8 would start at it, and on ONNX Runtime that buys nothing. MLAS's INT8
    depthwise kernel runs at FP32 speed (EfficientNet-Lite0's 16 depthwise convs: 0.6x to 1.8x each, 1.0x
    in total, 1 thread), the float -> INT8 conversion only moves one layer later onto a tensor no larger
    (a depthwise conv keeps the channel count), and a depthwise conv is the layer type INT8 weights hurt
    most (9 or 25 weights per channel, scaled up by BatchNorm folding). Measured on EfficientNet-Lite0's
    first block (bias correction on): 3-4 % lower latency at batch 1 and 8, and 1 - cosine to FP32 on
    held-out photos 0.00112 instead of 0.00154. `None` means the backend's default: `build_plan` turns it
    on for CPU plans and off for TensorRT (`plan_quantization` alone reads `None` as off).
    """

    exclude: tuple[str, ...] = ()
    keep_first_last: bool = False
    min_channels: int = 16
    quantize_residual: bool = True
    quantize_outputs: bool = False
    float_leading_depthwise: bool | None = None

    def __post_init__(self) -> None:
        channels = self.min_channels
        if isinstance(channels, bool) or not isinstance(channels, int) or not 0 <= channels <= 2**31 - 1:
            raise TrtoptError(
                f"--min-channels (QuantConfig.min_channels) is {channels!r}; expected a whole number of at least 0.",
                fix="Pass e.g. --min-channels 16 (the default), or 0 to quantise layers of every width.",
            )
        if isinstance(self.exclude, str) or not all(isinstance(e, str) for e in self.exclude):
            raise TrtoptError(
                f"--exclude (QuantConfig.exclude) is {self.exclude!r}; expected a tuple of node names or op types.",
                fix="Pass e.g. exclude=('Gemm', 'conv_12').",
            )
