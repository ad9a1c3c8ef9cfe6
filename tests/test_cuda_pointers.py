"""Zero-copy pointer extraction from __cuda_array_interface__ and DLPack, with fake GPU objects, plus
cuda-bindings error checking. Pure: no GPU, no CUDA."""

from __future__ import annotations

import ctypes
import enum
from typing import Any

import numpy as np
import pytest

from trtopt.backend.tensorrt import cuda
from trtopt.errors import DataError
from trtopt.execution.device_arrays import (
    DL_CPU,
    DL_CUDA,
    _DLTensor,
    device_array_from,
    dlpack_device_type,
    from_cuda_array_interface,
    from_dlpack,
)


class FakeCudaArray:
    """What torch/cupy/pycuda expose: the CUDA Array Interface v3 dict."""

    def __init__(
        self, shape: tuple[int, ...], typestr: str = "<f4", ptr: int = 0x7F00_0000, **extra: Any
    ) -> None:
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (ptr, False),
            "version": 3,
        }
        self.__cuda_array_interface__.update(extra)


def test_cuda_array_interface_pointer_shape_dtype_and_stream() -> None:
    view = device_array_from(FakeCudaArray((2, 3, 4), "<f2", ptr=0x1000, strides=None, stream=7))
    assert view is not None
    assert (view.ptr, view.shape, view.dtype, view.stream) == (0x1000, (2, 3, 4), np.dtype(np.float16), 7)
    assert view.nbytes == 2 * 3 * 4 * 2


def test_cuda_array_interface_explicit_contiguous_strides_are_fine() -> None:
    view = from_cuda_array_interface(FakeCudaArray((2, 1, 3), strides=(12, 999, 4)).__cuda_array_interface__)
    assert view.shape == (2, 1, 3)  # a size-1 dimension may carry any stride


def test_non_contiguous_and_masked_gpu_arrays_are_refused_with_a_fix() -> None:
    with pytest.raises(DataError, match=r"not C-contiguous.*contiguous\(\)"):
        from_cuda_array_interface(FakeCudaArray((3, 2), strides=(4, 12)).__cuda_array_interface__)
    with pytest.raises(DataError, match="mask"):
        from_cuda_array_interface(FakeCudaArray((3,), mask=object()).__cuda_array_interface__)


def test_host_arrays_are_not_device_arrays() -> None:
    assert device_array_from(np.zeros(3, np.float32)) is None
    assert device_array_from([1.0, 2.0]) is None


def test_dlpack_of_a_numpy_array_reads_the_same_buffer() -> None:
    array = np.arange(24, dtype=np.float32).reshape(2, 3, 4)[1:]  # offset into the buffer
    view = from_dlpack(array)
    assert view.ptr == array.ctypes.data and view.shape == (1, 3, 4) and view.dtype == np.float32
    assert dlpack_device_type(array) == DL_CPU


def test_dlpack_refuses_a_transposed_array() -> None:
    with pytest.raises(DataError, match="not C-contiguous"):
        from_dlpack(np.zeros((3, 2), np.float32).T)


# A handmade DLPack producer on a (fake) CUDA device: the capsule holds a DLManagedTensor whose data
# pointer is an arbitrary device address; trtopt must read it without touching the memory.
class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_PyCapsule_New = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi)
)


class FakeCudaDLPack:
    def __init__(self, shape: tuple[int, ...], code: int, bits: int, ptr: int, offset: int = 0) -> None:
        self._shape = (ctypes.c_int64 * len(shape))(*shape)
        self._managed = _DLManagedTensor()
        tensor = self._managed.dl_tensor
        tensor.data, tensor.byte_offset, tensor.ndim = ptr, offset, len(shape)
        tensor.device.device_type, tensor.device.device_id = DL_CUDA, 0
        tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes = code, bits, 1
        tensor.shape = ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64))
        self.streams: list[int | None] = []

    def __dlpack_device__(self) -> tuple[int, int]:
        return (DL_CUDA, 0)

    def __dlpack__(self, stream: int | None = None) -> Any:
        self.streams.append(stream)
        return _PyCapsule_New(ctypes.addressof(self._managed), b"dltensor", None)


def test_dlpack_on_cuda_gives_pointer_plus_offset_and_passes_our_stream() -> None:
    producer = FakeCudaDLPack((4, 3, 2, 2), code=2, bits=16, ptr=0xDEAD_0000, offset=256)
    view = device_array_from(producer, stream=1234)
    assert view is not None
    assert view.ptr == 0xDEAD_0000 + 256 and view.shape == (4, 3, 2, 2) and view.dtype == np.float16
    assert producer.streams == [1234]  # the producer orders its work before our stream
    assert view.owner is not None  # the capsule stays alive with the view


@pytest.mark.parametrize(
    ("code", "bits", "dtype"), [(0, 8, np.int8), (1, 8, np.uint8), (0, 64, np.int64), (6, 8, np.bool_)]
)
def test_dlpack_dtype_codes(code: int, bits: int, dtype: type) -> None:
    assert from_dlpack(FakeCudaDLPack((2,), code=code, bits=bits, ptr=0x10)).dtype == np.dtype(dtype)


def test_dlpack_bfloat16_is_refused_with_a_fix() -> None:
    with pytest.raises(DataError, match="Convert it"):
        from_dlpack(FakeCudaDLPack((2,), code=4, bits=16, ptr=0x10))


def test_torch_cpu_tensor_dlpack_if_available() -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed (not a trtopt dependency)")
    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert device_array_from(tensor) is None  # CPU tensor: host path
    view = from_dlpack(tensor)
    assert view.ptr == tensor.data_ptr() and view.shape == (2, 3)


class CudaErr(enum.IntEnum):
    cudaSuccess = 0
    cudaErrorMemoryAllocation = 2


def test_check_unpacks_results_and_names_the_failed_call() -> None:
    assert cuda.check((CudaErr.cudaSuccess,), "cudaFree") is None
    assert cuda.check((CudaErr.cudaSuccess, 42), "cudaMalloc") == 42
    assert cuda.check((CudaErr.cudaSuccess, 1, 2), "x") == (1, 2)
    with pytest.raises(cuda.CudaError, match=r"cudaMalloc\(64 bytes\) failed: cudaErrorMemoryAllocation"):
        cuda.check((CudaErr.cudaErrorMemoryAllocation, None), "cudaMalloc(64 bytes)")


class RefusingDLPack:
    """What PyTorch does for a CUDA tensor that requires grad: both protocols raise, not AttributeError
    (seen on torch 2.11: BufferError from __dlpack__, RuntimeError from the array interface)."""

    def __dlpack_device__(self) -> tuple[int, int]:
        return (DL_CUDA, 0)

    def __dlpack__(self, stream: int | None = None) -> Any:
        raise BufferError("Can't export tensors that require gradient, use tensor.detach()")


class RefusingProducer(RefusingDLPack):
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad. Use var.detach().")


def test_a_producer_refusing_its_buffer_is_a_user_error_with_its_reason() -> None:
    with pytest.raises(DataError, match=r"RuntimeError.*requires grad.*detach\(\)"):
        device_array_from(RefusingProducer())
    with pytest.raises(DataError, match=r"BufferError.*require gradient.*detach\(\)"):
        device_array_from(RefusingDLPack(), stream=5)


def test_engine_validation_reports_a_refusing_producer_as_a_user_error() -> None:
    """`Engine` reads every input through the backend-neutral `array_shape_and_dtype` before any runner."""
    from trtopt.execution.device_arrays import array_shape_and_dtype

    with pytest.raises(DataError, match=r"detach\(\)"):
        array_shape_and_dtype(RefusingProducer())
    assert array_shape_and_dtype(FakeCudaArray((4, 2), "<f4")) == ((4, 2), "float32")


def test_raw_byte_typestr_bfloat16_from_torch_is_refused_with_a_fix() -> None:
    """torch exports bfloat16 in the array interface as '<V2' (2 raw bytes), numpy's np.void."""
    with pytest.raises(DataError, match=r"'<V2'.*Convert it"):
        from_cuda_array_interface(FakeCudaArray((4,), "<V2").__cuda_array_interface__)
