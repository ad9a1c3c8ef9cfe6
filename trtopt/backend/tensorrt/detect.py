"""Is the TensorRT backend usable in this process, and if not, exactly what is missing?

TensorRT counts as present only when all of these hold (checked in this order, first failure wins):

1. ``import tensorrt`` works and is the real package: it has ``__version__`` and ``Builder``. The
   third-party ``tensorrt-stubs`` typing package installs an empty ``tensorrt`` namespace that imports
   fine but has neither, so it must not count.
2. Its major version is one trtopt was written for: 11 (the documented target: strongly typed
   networks only, explicit Q/DQ INT8) or 10 (same build path, with the STRONGLY_TYPED creation flag).
3. ``cuda.bindings.runtime`` (cuda-bindings, the CUDA Python low-level bindings) imports.
4. ``cudaGetDeviceCount()`` reports at least one device (it returns ``(err, count)``).

`cuda_status` checks 3 and 4 alone: the runtime's CUDA layer (``cuda.py``, ``trtopt/execution/device_arrays.py``, the
runner's buffers, streams, events and graphs) needs no TensorRT, and its GPU tests run wherever CUDA does.

The answers are cached per process: probing loads the TensorRT and CUDA libraries, which is slow, and
the answer cannot change while the process runs. `status.cache_clear()` resets it (tests).
"""

from __future__ import annotations

import functools
import importlib
import logging
from types import ModuleType

from trtopt.backend.base import BackendStatus
from trtopt.errors import BackendUnavailableError

log = logging.getLogger(__name__)

SUPPORTED_MAJORS = (10, 11)
INSTALL_HINT = "pip install 'trtopt[gpu]'"


@functools.cache
def status() -> BackendStatus:
    """Whether TensorRT + CUDA + a GPU are usable here; `reason` names what is missing and how to fix it."""
    trt, reason = _import_tensorrt()
    if trt is None:
        return BackendStatus(False, reason)
    cuda = _probe_cuda()
    return BackendStatus(True, f"TensorRT {trt.__version__}, {cuda.reason}") if cuda.available else cuda


# conftest.py and the CLI know it by this name.
tensorrt_status = status


@functools.cache
def cuda_status() -> BackendStatus:
    """Whether cuda-bindings and a GPU are usable here, TensorRT or not (see the module docstring)."""
    return _probe_cuda()


def _probe_cuda() -> BackendStatus:
    cudart, reason = _import_cudart()
    if cudart is None:
        return BackendStatus(False, reason)
    count, reason = _device_count(cudart)
    if count < 1:
        return BackendStatus(False, reason)
    return BackendStatus(True, f"{count} CUDA device(s)")


def tensorrt_major(trt: ModuleType) -> int:
    return int(str(trt.__version__).split(".")[0])


def require() -> ModuleType:
    """The `tensorrt` module, or `BackendUnavailableError` saying what is missing."""
    current = status()
    if not current.available:
        raise BackendUnavailableError(f"The TensorRT backend is not available here: {current.reason}.")
    return importlib.import_module("tensorrt")


def _import_tensorrt() -> tuple[ModuleType | None, str]:
    try:
        trt = importlib.import_module("tensorrt")
    except Exception as exc:  # a broken native library raises OSError/RuntimeError, not only ImportError
        return (
            None,
            f"the `tensorrt` Python package is not importable ({_first_line(exc)}); "
            f"install it with {INSTALL_HINT}",
        )
    if not hasattr(trt, "__version__") or not hasattr(trt, "Builder"):
        where = getattr(trt, "__file__", None) or list(getattr(trt, "__path__", []))
        return None, (
            f"the `tensorrt` module found at {where} is not TensorRT (no __version__ / Builder; "
            f"typically the "
            f"`tensorrt-stubs` typing package); install the real one with {INSTALL_HINT}"
        )
    try:
        major = tensorrt_major(trt)
    except ValueError:
        return (
            None,
            f"cannot read the TensorRT version {trt.__version__!r}; install a release with {INSTALL_HINT}",
        )
    if major not in SUPPORTED_MAJORS:
        supported = " or ".join(str(m) for m in SUPPORTED_MAJORS)
        return (
            None,
            f"TensorRT {trt.__version__} is installed, but trtopt supports TensorRT {supported}; "
            f"{INSTALL_HINT}",
        )
    return trt, ""


def _import_cudart() -> tuple[ModuleType | None, str]:
    try:
        return importlib.import_module("cuda.bindings.runtime"), ""
    except Exception as exc:
        return None, (
            f"the CUDA Python bindings (`cuda.bindings.runtime`, package cuda-bindings) are not importable "
            f"({_first_line(exc)}); install them with {INSTALL_HINT}"
        )


def _device_count(cudart: ModuleType) -> tuple[int, str]:
    try:
        result = cudart.cudaGetDeviceCount()
    except Exception as exc:
        return 0, f"cudaGetDeviceCount() raised {_first_line(exc)}; check the NVIDIA driver (`nvidia-smi`)"
    err, count = result[0], result[1]
    if int(err) != 0:
        name = getattr(err, "name", None) or f"error {int(err)}"
        return (
            0,
            f"CUDA reports no usable GPU (cudaGetDeviceCount: {name}); "
            "check the NVIDIA driver (`nvidia-smi`)",
        )
    if int(count) < 1:
        return 0, "CUDA reports 0 GPUs; this machine needs an NVIDIA GPU"
    return int(count), ""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
