"""The TensorRT runner and `trtopt bench` on a real GPU with a stand-in engine instead of TensorRT.

Everything but TensorRT is real here: cuda-bindings allocations (device and pinned), copies, streams,
CUDA events, CUDA-graph capture and replay, per-thread contexts, zero-copy CuPy/PyTorch inputs and the
`trtopt bench` command. The stand-in `tensorrt` module has the API the runner calls; its engine computes
y = 2x + 1 with a CuPy kernel launched on the stream the runner passes to ``execute_async_v3`` (after an
optional busy-wait of a known duration, so CUDA-event timings can be checked against it).

What this cannot check is TensorRT itself: deserialisation, real I/O metadata, ``execute_async_v3``'s
own behaviour. tests/test_tensorrt_gpu.py does, where TensorRT is installed.

Marked ``gpu(tensorrt=False)``; also needs CuPy (skipped or, under TRTOPT_REQUIRE_GPU=1, failed).
"""

from __future__ import annotations

import json
import sys
import threading
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from gpu_helpers import cuda_torch, free_device_bytes, gpu_library
from trt_stand_in import StandInContext
from trt_stand_in import stand_in_tensorrt as trt_stand_in

import trtopt
from trtopt.backend import BackendStatus, RunOptions
from trtopt.backend.tensorrt import cuda, detect
from trtopt.backend.tensorrt.runner import TensorRTRunner, create_runner
from trtopt.cli.main import main
from trtopt.errors import DataError, ShapeError
from trtopt.plan import Plan, TensorSpec, write_plan

pytestmark = [
    pytest.mark.gpu(tensorrt=False),
    # CuPy 14 deprecates ExternalStream for Stream.from_external, which older CuPy lacks.
    pytest.mark.filterwarnings("ignore:ExternalStream is deprecated:DeprecationWarning"),
]
RNG = np.random.default_rng(0)

KERNELS = r"""
extern "C" __global__ void spin(long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < (unsigned long long)ns);
}
extern "C" __global__ void affine(const float* x, float* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = 2.0f * x[i] + 1.0f;
}
"""


@dataclass
class StandIn:
    """The stand-in engine's knobs and what it saw."""

    features: int = 1000
    max_batch: int = 16
    spin_ns: int = 0
    contexts: list[Any] = field(default_factory=list)
    launches: int = 0


def stand_in_tensorrt(cp: Any, knobs: StandIn) -> types.ModuleType:
    """A `tensorrt` module with the calls the runner makes; execution is real GPU work on the given stream."""
    module = cp.RawModule(code=KERNELS)
    spin, affine = module.get_function("spin"), module.get_function("affine")

    def execute(context: StandInContext, stream_handle: int) -> bool:
        assert isinstance(stream_handle, int) and stream_handle != 0  # TensorRT's Python API takes an int
        n = int(np.prod(context.shape))
        with cp.cuda.ExternalStream(stream_handle):
            if knobs.spin_ns:
                spin((1,), (1,), (np.int64(knobs.spin_ns),))
            args = (np.uint64(context.addr["x"]), np.uint64(context.addr["y"]), np.int64(n))
            affine((min((n + 255) // 256, 1024),), (256,), args)
        knobs.launches += 1
        return True

    return trt_stand_in(
        features=knobs.features,
        max_batch=knobs.max_batch,
        execute=execute,
        contexts=knobs.contexts,
        engine_bytes=b"stand-in engine",
    )


@pytest.fixture
def cp() -> Any:
    return gpu_library("cupy")


@pytest.fixture
def knobs(cp: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIn]:
    """Installs the stand-in `tensorrt`; CUDA (cuda.bindings.runtime) stays the real one."""
    state = StandIn()
    trt = stand_in_tensorrt(cp, state)
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setattr(detect, "require", lambda: trt)
    monkeypatch.setattr(detect, "status", lambda: BackendStatus(True, "stand-in TensorRT on a real GPU"))
    yield state


def stand_in_plan(knobs: StandIn) -> Plan:
    return Plan(
        backend="tensorrt",
        inputs=(TensorSpec("x", (-1, knobs.features), "float32"),),
        outputs=(TensorSpec("y", (-1, knobs.features), "float32"),),
        sections={"engine": b"stand-in engine"},
        versions={"tensorrt": "11.0.0.1"},
    )


def runner_for(knobs: StandIn, **options: Any) -> TensorRTRunner:
    return create_runner(stand_in_plan(knobs), RunOptions(**options))


def batch(n: int, knobs: StandIn) -> np.ndarray:
    return RNG.standard_normal((n, knobs.features)).astype(np.float32)


class Count:
    """Wraps a `trtopt.backend.tensorrt.cuda` function and counts its calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.calls = 0
        original = getattr(cuda, name)

        def counted(*args: Any) -> Any:
            self.calls += 1
            return original(*args)

        monkeypatch.setattr(cuda, name, counted)


def test_host_batches_go_through_real_device_buffers_allocated_once(
    knobs: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    mallocs, pinned = Count(monkeypatch, "malloc"), Count(monkeypatch, "malloc_host")
    runner = runner_for(knobs)
    try:
        first_x = batch(3, knobs)
        first = runner.infer({"x": first_x})["y"]
        for n in (1, 16, 5, 16):
            x = batch(n, knobs)
            y = runner.infer({"x": x})["y"]
            assert y.shape == (n, knobs.features) and y.dtype == np.float32
            np.testing.assert_array_equal(y, 2 * x + 1)  # exact: 2x is exact, +1 rounds once either way
        np.testing.assert_array_equal(first, 2 * first_x + 1)  # a copy, not a view of the reused pinned buffer
        assert (mallocs.calls, pinned.calls) == (2, 2)  # x and y at the profile's max, for the one context
        assert knobs.contexts[-1].shape_sets == 5  # set on change only: 3, 1, 16, 5, 16
        with pytest.raises(ShapeError, match="up to"):
            runner.infer({"x": batch(17, knobs)})
    finally:
        runner.close()


def test_timed_infer_measures_the_gpu_work_with_cuda_events(knobs: StandIn) -> None:
    knobs.spin_ns = 3_000_000
    runner = runner_for(knobs)
    try:
        x = batch(8, knobs)
        runner.timed_infer({"x": x})  # first call: context, buffers
        before = time.perf_counter()
        outputs, ms = runner.timed_infer({"x": x})
        wall_ms = (time.perf_counter() - before) * 1e3
        np.testing.assert_array_equal(outputs["y"], 2 * x + 1)
        assert 3.0 <= ms <= wall_ms, f"event time {ms:.3f} ms, host wall {wall_ms:.3f} ms"
    finally:
        runner.close()


def test_cuda_graphs_capture_once_per_shape_then_replay_fresh_inputs(
    knobs: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    captures, launches = Count(monkeypatch, "begin_capture"), Count(monkeypatch, "graph_launch")
    runner = runner_for(knobs, cuda_graph=True)
    try:
        for n in (2, 2, 4, 2, 4):  # the small shape first: replaying its graph for 4 rows would leave 2 stale
            x = batch(n, knobs)  # new data each call: the graph must read the staged input, not a snapshot
            np.testing.assert_array_equal(runner.infer({"x": x})["y"], 2 * x + 1)
        assert (captures.calls, launches.calls) == (2, 5)
        knobs.spin_ns = 2_000_000  # a replayed graph is timed like a direct launch, but spins only if captured
        x = batch(3, knobs)
        outputs, ms = runner.timed_infer({"x": x})  # new shape: captured with the spin
        np.testing.assert_array_equal(outputs["y"], 2 * x + 1)
        outputs, ms = runner.timed_infer({"x": x})  # replay
        np.testing.assert_array_equal(outputs["y"], 2 * x + 1)
        assert ms >= 2.0
    finally:
        runner.close()


def test_cupy_input_is_bound_by_pointer_without_a_copy(
    cp: Any, knobs: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    copies_in = Count(monkeypatch, "memcpy_htod_async")
    runner = runner_for(knobs)
    try:
        x = batch(6, knobs)
        device_x = cp.asarray(x)
        np.testing.assert_array_equal(runner.infer({"x": device_x})["y"], 2 * x + 1)
        assert knobs.contexts[-1].addr["x"] == device_x.data.ptr and copies_in.calls == 0
    finally:
        runner.close()


def test_torch_input_is_bound_by_pointer_without_a_copy(knobs: StandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = cuda_torch()
    copies_in = Count(monkeypatch, "memcpy_htod_async")
    runner = runner_for(knobs)
    try:
        x = batch(2, knobs)
        device_x = torch.from_numpy(x).cuda()
        np.testing.assert_array_equal(runner.infer({"x": device_x})["y"], 2 * x + 1)
        assert knobs.contexts[-1].addr["x"] == device_x.data_ptr() and copies_in.calls == 0
    finally:
        runner.close()


def fill_after_a_wait(cp: Any, array: Any, side_handle: int) -> None:
    """Queue 50 ms of spinning, then ``array.fill(7)``, on the stream `side_handle` (non-blocking: the
    runner's stream does not wait for it by itself), and check that the work is still pending.

    Both kernels are loaded first: with CUDA's lazy loading a kernel's first launch can wait for the
    device to go idle, which would finish the producer's work early and hide a runner that never waits."""
    spin = cp.RawModule(code=KERNELS).get_function("spin")
    spin((1,), (1,), (np.int64(0),))
    array.fill(1)  # a fill kernel (CuPy fills 0 with a memset instead)
    cp.cuda.Device().synchronize()
    with cp.cuda.ExternalStream(side_handle):
        spin((1,), (1,), (np.int64(50_000_000),))
        array.fill(7)
    rt = cuda.cudart()
    assert rt.cudaStreamQuery(side_handle)[0] == rt.cudaError_t.cudaErrorNotReady


def test_zero_copy_input_waits_for_the_producers_stream_cuda_array_interface(cp: Any, knobs: StandIn) -> None:
    """Array interface v3: the producer exports its stream and leaves the waiting to the consumer.

    A hand-made export: CuPy's own also synchronises on export (CUPY_CUDA_ARRAY_INTERFACE_SYNC=1 by
    default), which would hide a runner that forgets to wait."""
    runner = runner_for(knobs)
    side = cp.cuda.Stream(non_blocking=True)
    try:
        runner.infer({"x": batch(4, knobs)})  # context ready, kernels loaded
        array = cp.empty((4, knobs.features), cp.float32)
        producer = types.SimpleNamespace(
            __cuda_array_interface__={
                "shape": array.shape,
                "typestr": "<f4",
                "data": (array.data.ptr, False),
                "strides": None,
                "stream": side.ptr,
                "version": 3,
            }
        )
        fill_after_a_wait(cp, array, side.ptr)
        y = runner.infer({"x": producer})["y"]
        assert (y == 15).all(), f"read before the producer finished: {np.unique(y)[:5]}"
    finally:
        runner.close()


def test_zero_copy_input_waits_for_the_producers_stream_dlpack(cp: Any, knobs: StandIn) -> None:
    """DLPack: the runner passes its stream to __dlpack__, and PyTorch makes that stream wait for its
    current one (a side stream here); with stream=-1 ("no synchronisation") it would not."""
    torch = cuda_torch()

    class DLPackOnly:
        def __init__(self, tensor: Any) -> None:
            self.tensor = tensor

        def __dlpack_device__(self) -> Any:
            return self.tensor.__dlpack_device__()

        def __dlpack__(self, stream: int | None = None) -> Any:
            return self.tensor.__dlpack__(stream=stream)

    runner = runner_for(knobs)
    side = torch.cuda.Stream()
    try:
        runner.infer({"x": batch(4, knobs)})
        array = cp.empty((4, knobs.features), cp.float32)
        tensor = torch.as_tensor(array, device="cuda")  # the same memory
        fill_after_a_wait(cp, array, side.cuda_stream)
        with torch.cuda.stream(side):
            y = runner.infer({"x": DLPackOnly(tensor)})["y"]
        assert (y == 15).all(), f"read before the producer finished: {np.unique(y)[:5]}"
    finally:
        runner.close()


def test_each_thread_gets_its_own_context_stream_and_buffers(
    knobs: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    streams = Count(monkeypatch, "stream_create")
    runner = runner_for(knobs)
    runner.infer({"x": batch(1, knobs)})  # kernels compiled once, in this thread
    inputs = [batch(n, knobs) for n in (1, 4, 9, 16)]
    results: dict[int, list[np.ndarray]] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            results[i] = [runner.infer({"x": inputs[i]})["y"] for _ in range(10)]
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors, errors
        assert streams.calls == 1 + len(inputs)
        for i, x in enumerate(inputs):
            for y in results[i]:
                np.testing.assert_array_equal(y, 2 * x + 1)
    finally:
        runner.close()


def test_close_gives_the_device_memory_back(knobs: StandIn) -> None:
    knobs.features, knobs.max_batch = 1 << 20, 64  # 256 MiB per buffer at the max shape
    runner = runner_for(knobs)
    runner.infer({"x": batch(1, knobs)})  # the context and its buffers exist from the first call
    with_buffers = free_device_bytes()
    runner.close()
    released = free_device_bytes() - with_buffers
    assert released >= 2 * (256 << 20) - (8 << 20), f"only {released >> 20} MiB came back"


def test_engine_api_with_device_inputs_and_user_errors(cp: Any, knobs: StandIn) -> None:
    with trtopt.Engine(stand_in_plan(knobs)) as engine:
        x = batch(2, knobs)
        np.testing.assert_array_equal(engine(cp.asarray(x)), 2 * x + 1)
        outputs, ms = engine.timed_infer({"x": x})
        np.testing.assert_array_equal(outputs["y"], 2 * x + 1)
        assert ms is not None and ms > 0
        with pytest.raises(ShapeError, match="dtype float64"):
            engine(cp.asarray(x, dtype=cp.float64))


def test_engine_refuses_a_torch_tensor_that_requires_grad_with_the_fix(knobs: StandIn) -> None:
    torch = cuda_torch()
    with trtopt.Engine(stand_in_plan(knobs)) as engine:
        tensor = torch.ones((2, knobs.features), device="cuda", requires_grad=True)
        with pytest.raises(DataError, match=r"detach\(\)"):
            engine(tensor)
        np.testing.assert_array_equal(engine(tensor.detach()), np.full((2, knobs.features), 3, np.float32))


def test_bench_command_times_with_cuda_events(
    knobs: StandIn, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    knobs.spin_ns = 2_000_000
    path = write_plan(stand_in_plan(knobs), tmp_path / "stand-in.engine")
    code = main(["bench", str(path), "--batch", "1,8", "--iterations", "20", "--warmup", "3", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["backend"] == "tensorrt" and report["timing"] == "cuda-events"
    for result in report["results"]:
        assert result["iterations"] == 20
        assert 2.0 <= result["min_ms"] <= result["p50_ms"] <= result["p99_ms"], result  # the spin is 2 ms at least
        # throughput is samples per host second, which includes the events' span and more: the host's time per
        # call bounds the events' mean (no bound on how slow a shared GPU may be)
        assert result["mean_ms"] <= result["batch"] / result["throughput"] * 1e3 * 1.01, result
