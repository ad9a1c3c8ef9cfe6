"""Wiring of the TensorRT runner against stand-in `tensorrt` and `cuda.bindings.runtime` modules.

These tests do NOT verify TensorRT or CUDA: "device" memory is host memory, the "engine" computes
y = 2x, and stream capture is simulated. They check trtopt's own logic - buffers sized once per max
shape, input shapes set only on change, zero-copy binding, CUDA-graph capture then replay, one context
per thread, cleanup - which would otherwise first run on a GPU machine.
"""

from __future__ import annotations

import ctypes
import threading
import types
from collections.abc import Iterator

import numpy as np
import pytest
from fake_cudart import FakeCudart, install_fake_cudart
from trt_stand_in import StandInContext, stand_in_tensorrt

from trtopt.backend import RunOptions
from trtopt.backend.tensorrt import detect
from trtopt.backend.tensorrt.runner import create_runner
from trtopt.errors import ShapeError


def fake_tensorrt(cudart: FakeCudart) -> types.ModuleType:
    """Executing doubles x into y on the host, or records that work while a CUDA graph is being captured."""

    def execute(context: StandInContext, stream: int) -> bool:
        n = int(np.prod(context.shape))
        src, dst = context.addr["x"], context.addr["y"]

        def work() -> None:
            x = np.ctypeslib.as_array((ctypes.c_float * n).from_address(src))
            np.ctypeslib.as_array((ctypes.c_float * n).from_address(dst))[:] = 2 * x

        if cudart.capturing is not None:
            cudart.capturing.append(work)
        else:
            work()
        return True

    return stand_in_tensorrt(features=4, max_batch=8, execute=execute, contexts=[])


@pytest.fixture
def cudart(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCudart]:
    fake = install_fake_cudart(monkeypatch)
    trt = fake_tensorrt(fake)
    monkeypatch.setattr(detect, "require", lambda: trt)
    yield fake


class Plan:
    sections = {"engine": b"ENGINE"}
    versions = {"tensorrt": "11.0.0.1"}


def test_wiring_host_inputs_dynamic_batch_and_cleanup(cudart: FakeCudart) -> None:
    runner = create_runner(Plan(), RunOptions())
    allocated = cudart.calls.count("cudaMalloc")
    for batch in (2, 8, 8):
        x = np.arange(batch * 4, dtype=np.float32).reshape(batch, 4)
        np.testing.assert_array_equal(runner.infer({"x": x})["y"], 2 * x)
    assert cudart.calls.count("cudaMalloc") == allocated + 2  # one context: x and y at max shape, once
    context = runner._context().context
    assert context.shape_sets == 2  # shapes set on change only (2 -> 8), not per call
    outputs, ms = runner.timed_infer({"x": np.ones((1, 4), np.float32)})
    assert ms == 1.5 and outputs["y"].shape == (1, 4)
    with pytest.raises(ShapeError, match="up to"):
        runner.infer({"x": np.ones((9, 4), np.float32)})
    runner.close()
    assert cudart.buffers == {}  # every device and pinned buffer freed


def test_wiring_cuda_graph_captured_once_then_replayed(cudart: FakeCudart) -> None:
    runner = create_runner(Plan(), RunOptions(cuda_graph=True))
    x = np.full((3, 4), 1.5, np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(runner.infer({"x": x})["y"], 2 * x)
    assert cudart.calls.count("cudaStreamBeginCapture") == 1
    assert cudart.calls.count("cudaGraphLaunch") == 3
    runner.close()


def test_wiring_device_array_input_is_bound_without_a_copy(cudart: FakeCudart) -> None:
    runner = create_runner(Plan(), RunOptions())
    x = np.arange(8, dtype=np.float32).reshape(2, 4)

    class GpuArray:  # a CUDA-array-interface producer whose "device" memory is x's buffer
        __cuda_array_interface__ = {
            "shape": (2, 4),
            "typestr": "<f4",
            "data": (x.ctypes.data, False),
            "version": 3,
        }

    copies = cudart.calls.count("cudaMemcpyAsync")
    np.testing.assert_array_equal(runner.infer({"x": GpuArray()})["y"], 2 * x)
    assert cudart.calls.count("cudaMemcpyAsync") == copies + 1  # only the output comes back
    assert runner._context().context.addr["x"] == x.ctypes.data
    runner.close()


def test_wiring_each_thread_gets_its_own_context(cudart: FakeCudart) -> None:
    runner = create_runner(Plan(), RunOptions())
    contexts = []

    def work() -> None:
        runner.infer({"x": np.ones((1, 4), np.float32)})
        contexts.append(runner._context())

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(c) for c in contexts}) == 3
    runner.close()
