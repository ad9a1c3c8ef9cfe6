"""A stand-in `cuda.bindings.runtime`: host memory posing as device memory, for the runner's wiring tests
(tests/test_tensorrt_runner_wiring.py, tests/test_tensorrt_real_bindings.py). It verifies nothing about CUDA."""

from __future__ import annotations

import ctypes
import enum
import sys
import types
from collections.abc import Callable
from typing import Any

import pytest


class Err(enum.IntEnum):
    cudaSuccess = 0


class FakeCudart(types.ModuleType):
    """Host memory posing as device memory; captured work runs only when its graph is launched."""

    def __init__(self) -> None:
        super().__init__("cuda.bindings.runtime")
        self.buffers: dict[int, Any] = {}
        self.capturing: list[Callable[[], None]] | None = None
        self.calls: list[str] = []
        self.cudaMemcpyKind = types.SimpleNamespace(cudaMemcpyHostToDevice=1, cudaMemcpyDeviceToHost=2)
        self.cudaStreamCaptureMode = types.SimpleNamespace(cudaStreamCaptureModeThreadLocal=1)

    def _alloc(self, nbytes: int) -> tuple[Err, int]:
        buffer = ctypes.create_string_buffer(nbytes)
        self.buffers[ctypes.addressof(buffer)] = buffer
        return Err.cudaSuccess, ctypes.addressof(buffer)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        method = getattr(type(self), "_" + name, None)

        def call(*args: Any) -> tuple[Any, ...]:
            self.calls.append(name)
            return method(self, *args) if method else (Err.cudaSuccess,)

        return call

    def _cudaMalloc(self, n: int) -> tuple[Err, int]:
        return self._alloc(n)

    def _cudaMallocHost(self, n: int) -> tuple[Err, int]:
        return self._alloc(n)

    def _cudaFree(self, ptr: int) -> tuple[Err]:
        del self.buffers[ptr]
        return (Err.cudaSuccess,)

    _cudaFreeHost = _cudaFree

    def _cudaStreamCreate(self) -> tuple[Err, int]:
        return Err.cudaSuccess, 1000 + len(self.calls)

    def _cudaEventCreate(self) -> tuple[Err, object]:
        return Err.cudaSuccess, object()

    def _cudaEventElapsedTime(self, start: object, end: object) -> tuple[Err, float]:
        return Err.cudaSuccess, 1.5

    def _cudaMemcpyAsync(self, dst: int, src: int, n: int, kind: int, stream: int) -> tuple[Err]:
        ctypes.memmove(dst, src, n)
        return (Err.cudaSuccess,)

    def _cudaStreamBeginCapture(self, stream: int, mode: int) -> tuple[Err]:
        self.capturing = []
        return (Err.cudaSuccess,)

    def _cudaStreamEndCapture(self, stream: int) -> tuple[Err, list[Callable[[], None]]]:
        work, self.capturing = self.capturing, None
        return Err.cudaSuccess, work or []

    def _cudaGraphInstantiate(self, graph: list[Callable[[], None]], flags: int) -> tuple[Err, Any]:
        return Err.cudaSuccess, graph

    def _cudaGraphLaunch(self, graph: list[Callable[[], None]], stream: int) -> tuple[Err]:
        for work in graph:
            work()
        return (Err.cudaSuccess,)


def install_fake_cudart(monkeypatch: pytest.MonkeyPatch) -> FakeCudart:
    fake = FakeCudart()
    bindings = types.ModuleType("cuda.bindings")
    bindings.runtime = fake  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cuda", types.ModuleType("cuda"))
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", fake)
    return fake
