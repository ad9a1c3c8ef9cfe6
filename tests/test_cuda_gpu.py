"""trtopt's CUDA layer on a real GPU, no TensorRT needed: `cuda.py` (cuda-bindings allocations, copies,
streams, events, graphs) and `trtopt/execution/device_arrays.py` on real CuPy arrays and PyTorch tensors,
each pointer checked by copying what it points to back to the host.

Marked ``gpu(tensorrt=False)``: skipped with the reason where cuda-bindings or a GPU is missing, failed
instead under TRTOPT_REQUIRE_GPU=1 (conftest.py). CuPy and PyTorch tests need those libraries too
(gpu_helpers.py)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from gpu_helpers import cuda_stream, cuda_torch, device_buffer, gpu_library, pinned_buffer, read_device

from trtopt.backend.tensorrt import cuda
from trtopt.errors import DataError
from trtopt.execution.device_arrays import DL_CUDA, device_array_from, dlpack_device_type, from_dlpack

pytestmark = pytest.mark.gpu(tensorrt=False)
RNG = np.random.default_rng(0)


def awkward_floats(n: int) -> np.ndarray:
    """float32 bit patterns a careless copy or cast would change: NaN payloads, -0.0, denormals, inf."""
    bits = RNG.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32)
    bits[:6] = [0x7FC0_1234, 0xFFBF_FFFF, 0x8000_0000, 0x0000_0001, 0x7F80_0000, 0xFF80_0000]
    return bits.view(np.float32)


# --- cuda.py -------------------------------------------------------------------------------------


def test_pinned_and_device_round_trip_is_bit_exact() -> None:
    source = awkward_floats(1_000_003)  # an odd size: no alignment luck
    with cuda_stream() as stream, pinned_buffer(source.nbytes) as up, pinned_buffer(source.nbytes) as down:
        with device_buffer(source.nbytes) as device:
            up[:] = source.view(np.uint8)
            cuda.memcpy_htod_async(device, up.ctypes.data, source.nbytes, stream)
            cuda.memcpy_dtoh_async(down.ctypes.data, device, source.nbytes, stream)
            cuda.stream_synchronize(stream)
        assert down.tobytes() == source.tobytes()


def test_allocations_are_the_memory_kinds_the_runner_relies_on() -> None:
    """malloc_host must be page-locked (else cudaMemcpyAsync is synchronous and graphs cannot capture it)."""
    rt = cuda.cudart()
    with pinned_buffer(4096) as host, device_buffer(4096) as device:
        host_kind = cuda.check(rt.cudaPointerGetAttributes(host.ctypes.data), "cudaPointerGetAttributes").type
        device_kind = cuda.check(rt.cudaPointerGetAttributes(device), "cudaPointerGetAttributes").type
    assert host_kind == rt.cudaMemoryType.cudaMemoryTypeHost
    assert device_kind == rt.cudaMemoryType.cudaMemoryTypeDevice


def test_pageable_numpy_memory_round_trips_too() -> None:
    source = RNG.integers(-128, 128, size=(7, 333), dtype=np.int8)
    with cuda_stream() as stream, device_buffer(source.nbytes) as device:
        cuda.memcpy_htod_async(device, source.ctypes.data, source.nbytes, stream)
        np.testing.assert_array_equal(read_device(device, source.shape, source.dtype, stream), source)


def test_events_time_a_copy_within_the_host_wall_time() -> None:
    nbytes = 256 << 20
    with cuda_stream() as stream, pinned_buffer(nbytes) as host, device_buffer(nbytes) as device:
        host[:] = 1
        start, end = cuda.event_create(), cuda.event_create()
        try:
            cuda.memcpy_htod_async(device, host.ctypes.data, nbytes, stream)  # warm the path once
            cuda.stream_synchronize(stream)
            before = time.perf_counter()
            cuda.event_record(start, stream)
            cuda.memcpy_htod_async(device, host.ctypes.data, nbytes, stream)
            cuda.event_record(end, stream)
            cuda.stream_synchronize(stream)
            wall_ms = (time.perf_counter() - before) * 1e3
            ms = cuda.event_elapsed_ms(start, end)
        finally:
            cuda.event_destroy(start)
            cuda.event_destroy(end)
    assert 0 < ms <= wall_ms
    gb_per_s = nbytes / ms / 1e6  # no lower bound: a shared or throttled link is slow, not wrong
    assert gb_per_s < 5000, f"{nbytes} bytes in {ms:.3f} ms"  # 5x any host link today: events that timed nothing


def test_a_captured_graph_replays_a_copy_with_fresh_host_data() -> None:
    """Graphs keep addresses, not contents: what the runner relies on for pinned staging buffers."""
    n = 4096
    with cuda_stream() as stream, pinned_buffer(n * 4) as host, device_buffer(n * 4) as device:
        cuda.begin_capture(stream)
        cuda.memcpy_htod_async(device, host.ctypes.data, n * 4, stream)
        graph = cuda.end_capture_and_instantiate(stream)
        try:
            for value in (3.0, -7.5):
                host.view(np.float32)[:] = value
                cuda.graph_launch(graph, stream)
                assert (read_device(device, (n,), np.float32, stream) == value).all()
        finally:
            cuda.graph_exec_destroy(graph)


def test_failed_calls_raise_cuda_error_naming_the_call_and_leave_cuda_usable() -> None:
    with pytest.raises(cuda.CudaError, match=r"cudaMalloc\(1125899906842624 bytes\) failed: cudaErrorMemoryAllocation"):
        cuda.malloc(1 << 50)
    with pytest.raises(cuda.CudaError, match=r"cudaSetDevice\(4096\) failed: cudaErrorInvalidDevice"):
        cuda.set_device(4096)
    with cuda_stream() as stream, device_buffer(16) as device:  # neither error was sticky
        cuda.memcpy_htod_async(device, np.arange(4, dtype=np.float32).ctypes.data, 16, stream)
        np.testing.assert_array_equal(read_device(device, (4,), np.float32, stream), np.arange(4))


def test_stream_handles_convert_to_distinct_nonzero_ints() -> None:
    """The runner passes int(stream) to TensorRT, DLPack producers and CUDA-array-interface checks."""
    with cuda_stream() as first, cuda_stream() as second:
        assert int(first) != 0 and int(second) != 0 and int(first) != int(second)


# --- device_arrays.py on CuPy -------------------------------------------------------------------------


@pytest.fixture
def cp() -> Any:
    return gpu_library("cupy")


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8, np.uint8, np.int64, np.bool_])
def test_cupy_array_interface_points_at_the_array(cp: Any, dtype: type) -> None:
    host = (np.arange(2 * 3 * 5) % 7).astype(dtype).reshape(2, 3, 5)
    array = cp.asarray(host)
    view = device_array_from(array)
    assert view is not None
    assert (view.ptr, view.shape, view.dtype) == (array.data.ptr, (2, 3, 5), np.dtype(dtype))
    with cuda_stream() as stream:
        np.testing.assert_array_equal(read_device(view.ptr, view.shape, view.dtype, stream), host)


def test_cupy_offset_slice_is_contiguous_and_points_past_the_offset(cp: Any) -> None:
    host = np.arange(40, dtype=np.float32).reshape(8, 5)
    array = cp.asarray(host)[3:]
    view = device_array_from(array)
    assert view is not None and view.ptr == array.data.ptr and view.shape == (5, 5)
    with cuda_stream() as stream:
        np.testing.assert_array_equal(read_device(view.ptr, view.shape, view.dtype, stream), host[3:])


def test_cupy_non_contiguous_arrays_are_refused_with_the_fix(cp: Any) -> None:
    array = cp.zeros((4, 6), cp.float32)
    for strided in (array.T, array[:, ::2]):
        with pytest.raises(DataError, match=r"not C-contiguous.*ascontiguousarray"):
            device_array_from(strided)
    assert device_array_from(cp.ascontiguousarray(array.T)) is not None


def test_cupy_exports_its_current_stream(cp: Any) -> None:
    """CUDA array interface v3: the producer's stream travels with the pointer (the runner waits on it)."""
    array = cp.zeros(8, cp.float32)
    side = cp.cuda.Stream(non_blocking=True)
    with side:
        view = device_array_from(array)
    assert view is not None and view.stream == side.ptr


def test_cupy_dlpack_reads_the_same_pointer(cp: Any) -> None:
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    array = cp.asarray(host)
    assert dlpack_device_type(array) == DL_CUDA
    with cuda_stream() as stream:
        view = from_dlpack(array, stream=int(stream))
        assert view.ptr == array.data.ptr and view.shape == (3, 4) and view.dtype == np.float32
        np.testing.assert_array_equal(read_device(view.ptr, view.shape, view.dtype, stream), host)


# --- device_arrays.py on PyTorch ----------------------------------------------------------------------


def test_torch_cuda_tensor_pointer_shape_and_dtype() -> None:
    torch = cuda_torch()
    host = np.arange(24, dtype=np.float16).reshape(2, 3, 4)
    tensor = torch.from_numpy(host).cuda()
    view = device_array_from(tensor)
    assert view is not None
    assert (view.ptr, view.shape, view.dtype) == (tensor.data_ptr(), (2, 3, 4), np.dtype(np.float16))
    with cuda_stream() as stream:
        np.testing.assert_array_equal(read_device(view.ptr, view.shape, view.dtype, stream), host)
        sliced = tensor[1:]  # storage offset: data_ptr() already points past it
        view = device_array_from(sliced)
        assert view is not None and view.ptr == sliced.data_ptr()
        np.testing.assert_array_equal(read_device(view.ptr, view.shape, view.dtype, stream), host[1:])


def test_torch_size_one_dimensions_with_odd_strides_are_contiguous() -> None:
    torch = cuda_torch()
    tensor = torch.arange(6, dtype=torch.float32, device="cuda").reshape(2, 3)[:, None, :]  # (2, 1, 3)
    view = device_array_from(tensor)
    assert view is not None and view.shape == (2, 1, 3)


def test_torch_non_contiguous_and_cpu_tensors() -> None:
    torch = cuda_torch()
    tensor = torch.zeros((4, 6), device="cuda")
    with pytest.raises(DataError, match=r"not C-contiguous.*contiguous\(\)"):
        device_array_from(tensor.t())
    with pytest.raises(DataError, match="not C-contiguous"):
        from_dlpack(tensor.t())
    assert device_array_from(tensor.cpu()) is None  # host data: the runner stages it


class DLPackOnly:
    """A producer with DLPack alone (JAX-style), wrapping a torch tensor; records the stream it gets."""

    def __init__(self, tensor: Any) -> None:
        self.tensor, self.streams = tensor, []

    def __dlpack_device__(self) -> tuple[int, int]:
        device_type, device_id = self.tensor.__dlpack_device__()
        return int(device_type), int(device_id)

    def __dlpack__(self, stream: int | None = None) -> Any:
        self.streams.append(stream)
        return self.tensor.__dlpack__(stream=stream)


def test_torch_through_dlpack_gets_our_stream_and_the_same_pointer() -> None:
    torch = cuda_torch()
    host = np.arange(10, dtype=np.int64).reshape(2, 5)
    producer = DLPackOnly(torch.from_numpy(host).cuda())
    with cuda_stream() as stream:
        view = device_array_from(producer, stream=int(stream))
        assert view is not None and producer.streams == [int(stream)]
        assert view.ptr == producer.tensor.data_ptr() and view.dtype == np.int64
        np.testing.assert_array_equal(read_device(view.ptr, view.shape, view.dtype, stream), host)


def test_torch_tensor_that_requires_grad_is_a_user_error_with_the_fix() -> None:
    """torch refuses both protocols for such a tensor with RuntimeError; the user must see how to fix it."""
    torch = cuda_torch()
    tensor = torch.ones((2, 3), device="cuda", requires_grad=True)
    with pytest.raises(DataError, match=r"detach\(\)"):
        device_array_from(tensor)
    with pytest.raises(DataError, match=r"detach\(\)"):
        device_array_from(DLPackOnly(tensor), stream=2)
    assert device_array_from(tensor.detach()) is not None


def test_torch_bfloat16_is_refused_rather_than_read_as_raw_bytes() -> None:
    """torch exports bfloat16 as typestr '<V2' (raw 2-byte void), which numpy cannot compute with."""
    torch = cuda_torch()
    tensor = torch.ones(4, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(DataError, match=r"Convert it"):
        device_array_from(tensor)
    with pytest.raises(DataError, match=r"Convert it"):
        from_dlpack(tensor)
