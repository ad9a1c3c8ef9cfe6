"""Test model zoo built in code: small ONNX graphs, one per pattern the passes and calibrator handle.

Every model has one float input named ``input`` with a static shape, realistic weights (He init,
non-zero biases, non-trivial BatchNorm statistics), and is deterministic for a seed::

    model = build_model("tiny_cnn", batch=4, seed=1, opset=13)
"""

from __future__ import annotations

import onnx

from trtopt.zoo import heads, inception, layers, mobilenet, ports, resnet, tiny_cnn  # noqa: F401  (registers)
from trtopt.zoo.builder import DEFAULT_OPSET, MAX_ZOO_OPSET, MIN_ZOO_OPSET, MODELS, GraphBuilder

NAMES: tuple[str, ...] = tuple(MODELS.names())


def build_model(name: str, *, batch: int = 1, seed: int = 0, opset: int = DEFAULT_OPSET) -> onnx.ModelProto:
    """Build zoo model `name`; an unknown name raises `UnknownNameError` listing the valid ones."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    return MODELS.get(name)(batch, seed, opset)


__all__ = [
    "DEFAULT_OPSET",
    "MAX_ZOO_OPSET",
    "MIN_ZOO_OPSET",
    "MODELS",
    "NAMES",
    "GraphBuilder",
    "build_model",
]
