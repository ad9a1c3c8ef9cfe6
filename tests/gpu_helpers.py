"""What the `gpu(tensorrt=False)` tests share: optional GPU libraries (CuPy, PyTorch) and pinned or device
buffers made with trtopt's own `cuda` wrappers.

A missing library skips the test with the reason, or fails it under TRTOPT_REQUIRE_GPU=1, as the
`gpu` marker does (conftest.py): a GPU CI must not pass by skipping."""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from trtopt.backend.tensorrt import cuda


def skip_or_fail(reason: str) -> None:
    if os.environ.get("TRTOPT_REQUIRE_GPU") == "1":
        pytest.fail(f"TRTOPT_REQUIRE_GPU=1 but the GPU test cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


def gpu_library(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        skip_or_fail(f"needs {name} for this GPU test ({exc})")
        raise  # unreachable: skip_or_fail raises


def cuda_torch() -> ModuleType:
    torch = gpu_library("torch")
    if not torch.cuda.is_available():
        skip_or_fail(f"torch {torch.__version__} sees no CUDA device")
    return torch


@contextlib.contextmanager
def pinned_buffer(nbytes: int) -> Iterator[np.ndarray]:
    """Page-locked host memory as a flat uint8 numpy array."""
    ptr = cuda.malloc_host(nbytes)
    try:
        yield np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))
    finally:
        cuda.free_host(ptr)


@contextlib.contextmanager
def device_buffer(nbytes: int) -> Iterator[int]:
    ptr = cuda.malloc(nbytes)
    try:
        yield ptr
    finally:
        cuda.free(ptr)


@contextlib.contextmanager
def cuda_stream() -> Iterator[Any]:
    cuda.set_device(0)
    stream = cuda.stream_create()
    try:
        yield stream
    finally:
        cuda.stream_destroy(stream)


def read_device(ptr: int, shape: tuple[int, ...], dtype: Any, stream: Any) -> np.ndarray:
    """Copy device memory at `ptr` back to a new host array (what a device pointer really holds)."""
    host = np.empty(shape, dtype)
    cuda.memcpy_dtoh_async(host.ctypes.data, ptr, host.nbytes, stream)
    cuda.stream_synchronize(stream)
    return host


def free_device_bytes() -> int:
    free, _total = cuda.check(cuda.cudart().cudaMemGetInfo(), "cudaMemGetInfo")
    return int(free)
