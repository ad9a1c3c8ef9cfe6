"""Checked calls into cuda-bindings' runtime module (``from cuda.bindings import runtime as cudart``).

Every cuda-bindings runtime call returns a tuple ``(err, *values)`` instead of raising (cuda-python
docs, "cuda.bindings.runtime"). `check` turns a non-success code into a `CudaError` that names the call,
so a failure reads "cudaMalloc(33554432 bytes) failed: cudaErrorMemoryAllocation" rather than a later,
unrelated crash. Only the handful of calls the runner needs are wrapped; all imports are lazy.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from trtopt.errors import TrtoptError


class CudaError(TrtoptError):
    """A CUDA runtime call failed (out of memory, no device, driver too old...)."""

    exit_code = 3


def cudart() -> ModuleType:
    from cuda.bindings import runtime

    return runtime


def check(result: Any, call: str) -> Any:
    """Unpack a cuda-bindings result tuple, raising `CudaError` (naming `call`) unless it succeeded.

    Returns None for ``(err,)``, the value for ``(err, value)`` and a tuple for more values.
    """
    if not isinstance(result, tuple):
        result = (result,)
    err, values = result[0], result[1:]
    if int(err) != 0:
        name = getattr(err, "name", None) or f"error {int(err)}"
        raise CudaError(
            f"{call} failed: {name}.",
            fix="Check the GPU with `nvidia-smi` (driver loaded, memory free, device not in an error state).",
        )
    if not values:
        return None
    return values[0] if len(values) == 1 else values


# The calls the runner uses, each one line, so tracebacks and messages name them.


def set_device(device: int) -> None:
    check(cudart().cudaSetDevice(device), f"cudaSetDevice({device})")


def malloc(nbytes: int) -> int:
    return int(check(cudart().cudaMalloc(max(nbytes, 1)), f"cudaMalloc({nbytes} bytes)"))


def malloc_host(nbytes: int) -> int:
    """Page-locked host memory: the only kind cudaMemcpyAsync copies without staging."""
    return int(check(cudart().cudaMallocHost(max(nbytes, 1)), f"cudaMallocHost({nbytes} bytes)"))


def free(ptr: int) -> None:
    check(cudart().cudaFree(ptr), "cudaFree")


def free_host(ptr: int) -> None:
    check(cudart().cudaFreeHost(ptr), "cudaFreeHost")


def stream_create() -> Any:
    return check(cudart().cudaStreamCreate(), "cudaStreamCreate")


def stream_destroy(stream: Any) -> None:
    check(cudart().cudaStreamDestroy(stream), "cudaStreamDestroy")


def stream_synchronize(stream: Any) -> None:
    check(cudart().cudaStreamSynchronize(stream), "cudaStreamSynchronize")


def memcpy_htod_async(dst: int, src: int, nbytes: int, stream: Any) -> None:
    rt = cudart()
    kind = rt.cudaMemcpyKind.cudaMemcpyHostToDevice
    check(
        rt.cudaMemcpyAsync(dst, src, nbytes, kind, stream), f"cudaMemcpyAsync(host->device, {nbytes} bytes)"
    )


def memcpy_dtoh_async(dst: int, src: int, nbytes: int, stream: Any) -> None:
    rt = cudart()
    kind = rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
    check(
        rt.cudaMemcpyAsync(dst, src, nbytes, kind, stream), f"cudaMemcpyAsync(device->host, {nbytes} bytes)"
    )


def event_create() -> Any:
    return check(cudart().cudaEventCreate(), "cudaEventCreate")


def event_record(event: Any, stream: Any) -> None:
    check(cudart().cudaEventRecord(event, stream), "cudaEventRecord")


def event_elapsed_ms(start: Any, end: Any) -> float:
    return float(check(cudart().cudaEventElapsedTime(start, end), "cudaEventElapsedTime"))


def event_destroy(event: Any) -> None:
    check(cudart().cudaEventDestroy(event), "cudaEventDestroy")


def begin_capture(stream: Any) -> None:
    rt = cudart()
    mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
    check(rt.cudaStreamBeginCapture(stream, mode), "cudaStreamBeginCapture")


def end_capture_and_instantiate(stream: Any) -> Any:
    """End a capture and return an executable graph (CUDA 12+: cudaGraphInstantiate(graph, flags))."""
    rt = cudart()
    graph = check(rt.cudaStreamEndCapture(stream), "cudaStreamEndCapture")
    try:
        return check(rt.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")
    finally:
        check(rt.cudaGraphDestroy(graph), "cudaGraphDestroy")


def graph_launch(graph_exec: Any, stream: Any) -> None:
    check(cudart().cudaGraphLaunch(graph_exec, stream), "cudaGraphLaunch")


def graph_exec_destroy(graph_exec: Any) -> None:
    check(cudart().cudaGraphExecDestroy(graph_exec), "cudaGraphExecDestroy")
