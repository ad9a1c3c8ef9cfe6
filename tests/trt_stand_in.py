"""A stand-in `tensorrt` module with just the calls `TensorRTRunner` makes, for tests on machines without
TensorRT: an engine with one input "x" and one output "y", both (batch, features) float32 with a dynamic
batch. What `execute_async_v3` does is the test's own `execute(context, stream_handle)`: plain host
memory for the wiring tests, a real CUDA kernel for the GPU tests.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import numpy as np


class StandInContext:
    """An execution context: records the shape and addresses the runner sets (and how often)."""

    def __init__(self, features: int, execute: Callable[[StandInContext, int], bool]) -> None:
        self.shape: tuple[int, ...] = (1, features)
        self.addr: dict[str, int] = {}
        self.shape_sets = 0
        self._execute = execute

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        self.shape, self.shape_sets = tuple(shape), self.shape_sets + 1
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self.shape

    def set_tensor_address(self, name: str, memory: int) -> bool:
        self.addr[name] = memory
        return True

    def execute_async_v3(self, stream_handle: int) -> bool:
        return self._execute(self, stream_handle)


def stand_in_tensorrt(
    *,
    features: int,
    max_batch: int,
    execute: Callable[[StandInContext, int], bool],
    contexts: list[Any],
    engine_bytes: bytes | None = None,
) -> types.ModuleType:
    """The module; every context it creates is appended to `contexts`. With `engine_bytes`, deserialising
    anything else fails the test."""
    trt = types.ModuleType("tensorrt")
    trt.__version__ = "11.0.0.1"  # type: ignore[attr-defined]
    trt.Builder = object  # type: ignore[attr-defined]
    trt.TensorIOMode = types.SimpleNamespace(INPUT="in", OUTPUT="out")  # type: ignore[attr-defined]
    trt.nptype = lambda dtype: np.float32  # type: ignore[attr-defined]

    class Engine:
        num_io_tensors = 2

        def get_tensor_name(self, index: int) -> str:
            return ["x", "y"][index]

        def get_tensor_mode(self, name: str) -> str:
            return "in" if name == "x" else "out"

        def get_tensor_shape(self, name: str) -> tuple[int, ...]:
            return (-1, features)

        def get_tensor_dtype(self, name: str) -> str:
            return "float32"

        def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[tuple[int, ...]]:
            return [(1, features), (max_batch, features), (max_batch, features)]

        def create_execution_context(self) -> StandInContext:
            contexts.append(StandInContext(features, execute))
            return contexts[-1]

    class Runtime:
        def __init__(self, logger: object) -> None:
            pass

        def deserialize_cuda_engine(self, serialized_engine: bytes) -> Engine:
            assert engine_bytes is None or serialized_engine == engine_bytes
            return Engine()

    class ILogger:
        INTERNAL_ERROR, ERROR, WARNING = range(3)

        def __init__(self) -> None:
            pass

    trt.Runtime, trt.ILogger = Runtime, ILogger  # type: ignore[attr-defined]
    return trt
