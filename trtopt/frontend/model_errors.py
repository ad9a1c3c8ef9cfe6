"""The exception types ONNX and ONNX Runtime raise for a model they cannot take, so that a build, a check or a
plan load can turn them into a `TrtoptError` that says what to do. ONNX Runtime is imported on the first call
only: it is not needed to read a model."""

from __future__ import annotations

import onnx


def plan_errors() -> tuple[type[BaseException], ...]:
    """What ONNX's checker and ONNX Runtime raise for a model they cannot take (their own types)."""
    import onnxruntime as ort

    state = ort.capi.onnxruntime_pybind11_state
    return (onnx.checker.ValidationError, state.Fail, state.InvalidGraph, state.InvalidArgument,
            state.NotImplemented, state.RuntimeException)  # fmt: skip
