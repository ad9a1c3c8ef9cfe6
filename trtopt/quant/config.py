"""Quantisation options. None / empty means default."""

from __future__ import annotations

from dataclasses import dataclass, replace

TENSORRT_MIN_CHANNELS = 16


@dataclass(frozen=True)
class QuantConfig:
    """Where INT8 may go.

    `exclude` holds node names or op types to keep in floating point. `keep_first_last` keeps the first
    and the last quantisable layer in float (common for accuracy). Layers with fewer than
    `min_channels` input or output channels stay float. None means the backend's default: 16 for
    TensorRT, which gains nothing on such layers (DESIGN.md, "leave tiny layers in floating point"), and
    1 for ONNX Runtime, whose QLinearConv does run a 3-channel stem faster than its float conv
    (ONNX Runtime's own quantize_static quantises it too; see BENCHMARKS.md).

    `quantize_outputs` also puts Q/DQ on every consumer edge of a quantised layer's (fused) output. The
    TensorRT form leaves those to TensorRT; ONNX Runtime needs them, because it only turns a Conv into
    QLinearConv when the Conv's output is quantised too (DQ -> Conv -> Q). The CPU backend sets it.
    """

    exclude: tuple[str, ...] = ()
    keep_first_last: bool = False
    min_channels: int | None = None
    quantize_residual: bool = True
    quantize_outputs: bool = False

    def resolved(self, backend: str) -> QuantConfig:
        """This config with every None replaced by `backend`'s default."""
        if self.min_channels is not None:
            return self
        return replace(self, min_channels=1 if backend == "cpu" else TENSORRT_MIN_CHANNELS)
