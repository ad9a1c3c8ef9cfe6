"""TensorRT detection with stand-in modules in sys.modules (no TensorRT or GPU needed).

These tests check trtopt's decision logic only; they do not verify TensorRT itself.
"""

from __future__ import annotations

import enum
import sys
import types
from collections.abc import Iterator

import pytest

from trtopt.backend import select_backend
from trtopt.backend.tensorrt import detect


class CudaError(enum.IntEnum):
    cudaSuccess = 0
    cudaErrorNoDevice = 100


def fake_tensorrt(version: str | None = "11.0.0.1") -> types.ModuleType:
    module = types.ModuleType("tensorrt")
    if version is not None:
        module.__version__ = version  # type: ignore[attr-defined]
        module.Builder = object  # type: ignore[attr-defined]
    return module


def fake_cudart(count: int = 1, err: CudaError = CudaError.cudaSuccess) -> types.ModuleType:
    module = types.ModuleType("cuda.bindings.runtime")
    module.cudaGetDeviceCount = lambda: (err, count)  # type: ignore[attr-defined]
    return module


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    detect.status.cache_clear()
    detect.cuda_status.cache_clear()
    yield
    detect.status.cache_clear()
    detect.cuda_status.cache_clear()


def install(
    monkeypatch: pytest.MonkeyPatch, trt: types.ModuleType | None, cudart: types.ModuleType | None
) -> None:
    # None in sys.modules makes `import` raise ImportError, like a missing package.
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setitem(sys.modules, "cuda", types.ModuleType("cuda") if cudart else None)
    monkeypatch.setitem(sys.modules, "cuda.bindings", types.ModuleType("cuda.bindings") if cudart else None)
    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", cudart)


def test_missing_tensorrt_names_the_package_and_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, None, fake_cudart())
    status = detect.tensorrt_status()
    assert not status.available
    assert "`tensorrt` Python package is not importable" in status.reason
    assert "pip install 'trtopt[gpu]'" in status.reason


def test_tensorrt_stubs_namespace_is_not_tensorrt(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, fake_tensorrt(version=None), fake_cudart())
    status = detect.status()
    assert not status.available and "tensorrt-stubs" in status.reason


@pytest.mark.parametrize("version", ["8.6.1", "12.0.0"])
def test_unsupported_major_version(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    install(monkeypatch, fake_tensorrt(version), fake_cudart())
    status = detect.status()
    assert not status.available and f"TensorRT {version} is installed" in status.reason
    assert "TensorRT 10 or 11" in status.reason


def test_missing_cuda_bindings(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, fake_tensorrt(), None)
    status = detect.status()
    assert not status.available and "cuda-bindings" in status.reason and "trtopt[gpu]" in status.reason


def test_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, fake_tensorrt(), fake_cudart(count=0, err=CudaError.cudaErrorNoDevice))
    status = detect.status()
    assert not status.available and "cudaErrorNoDevice" in status.reason
    install(monkeypatch, fake_tensorrt(), fake_cudart(count=0))
    detect.status.cache_clear()
    assert "0 GPUs" in detect.status().reason


@pytest.mark.parametrize("version", ["10.13.0.35", "11.0.0.1"])
def test_available_with_tensorrt_cuda_and_a_gpu(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    install(monkeypatch, fake_tensorrt(version), fake_cudart(count=2))
    status = detect.status()
    assert status.available and status.reason == f"TensorRT {version}, 2 CUDA device(s)"
    assert select_backend("auto")[0].name == "tensorrt"


def test_result_is_cached_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, None, None)
    first = detect.status()
    install(monkeypatch, fake_tensorrt(), fake_cudart())
    assert detect.status() is first  # not probed again
    detect.status.cache_clear()
    assert detect.status().available


def test_auto_falls_back_to_cpu_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, None, None)
    backend, why = select_backend("auto")
    assert backend.name == "cpu" and "not importable" in why


def test_cuda_status_needs_no_tensorrt(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime's CUDA layer (and its `gpu(tensorrt=False)` tests) runs without TensorRT."""
    install(monkeypatch, None, fake_cudart(count=1))
    assert not detect.status().available
    assert detect.cuda_status() == detect.BackendStatus(True, "1 CUDA device(s)")


def test_cuda_status_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, fake_tensorrt(), None)
    assert "cuda-bindings" in detect.cuda_status().reason
    install(monkeypatch, fake_tensorrt(), fake_cudart(count=0, err=CudaError.cudaErrorNoDevice))
    detect.cuda_status.cache_clear()
    status = detect.cuda_status()
    assert not status.available and "cudaErrorNoDevice" in status.reason
