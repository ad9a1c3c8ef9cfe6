"""Precision written into the graph (TensorRT 11 is strongly typed: the ONNX's types are the engine's)."""

from trtopt.precision.fp16 import DEFAULT_KEEP_OPS, convert_to_fp16

__all__ = ["DEFAULT_KEEP_OPS", "convert_to_fp16"]
