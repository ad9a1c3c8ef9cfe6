"""Device pointers from other libraries' GPU arrays, for zero-copy inputs. Pure: no CUDA needed.

Backend-neutral: `trtopt.Engine` reads every input's shape and dtype through `array_shape_and_dtype`
before any backend sees it, and a GPU runner binds the pointers `device_array_from` finds.

Two protocols describe a GPU buffer without copying it:

- ``__cuda_array_interface__`` (Numba's CUDA Array Interface, v3): a dict with ``data`` (pointer,
  read-only flag), ``shape``, ``typestr`` (numpy array-interface type string), ``strides`` (bytes, or
  None for C-contiguous), optional ``mask`` (must be None) and ``stream`` (the producer's stream, which
  the consumer must synchronise with before reading). PyTorch, CuPy, Numba and PyCUDA expose it.
- DLPack (``__dlpack__`` / ``__dlpack_device__``, Python array API standard): ``__dlpack__(stream=s)``
  returns a PyCapsule named "dltensor" holding a ``DLManagedTensor`` whose first member is a
  ``DLTensor {void* data; DLDevice device; int32 ndim; DLDataType dtype; int64* shape; int64* strides;
  uint64 byte_offset}`` (dlpack.h). Passing our stream makes the producer order its pending work
  before that stream, so no synchronisation is needed on our side.

The interface is preferred when both exist (no capsule to unpack). The capsule is not consumed (not
renamed "used_dltensor"): the caller's array owns the memory and outlives the call, and the capsule
is kept on the `DeviceArray` so its deleter runs only after we are done.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtopt.errors import DataError

# DLDeviceType values (dlpack.h).
DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_CUDA_MANAGED = 1, 2, 3, 13
_DL_GPU_TYPES = (DL_CUDA, DL_CUDA_MANAGED)
# DLDataTypeCode values (dlpack.h) -> numpy kind letter.
_DL_KIND = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}


@dataclass(frozen=True)
class DeviceArray:
    """A C-contiguous buffer in GPU memory, described by pointer, shape and dtype."""

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype
    stream: int | None = None  # producer stream to synchronise with (CUDA array interface v3)
    owner: Any = None  # keeps a DLPack capsule alive while the pointer is in use

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def device_array_from(obj: Any, stream: int | None = None) -> DeviceArray | None:
    """The GPU buffer behind `obj`, or None when `obj` lives in host memory (numpy, CPU tensors)."""
    interface = cuda_array_interface(obj)
    if interface is not None:
        return from_cuda_array_interface(interface)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        device_type = int(obj.__dlpack_device__()[0])
        if device_type in _DL_GPU_TYPES:
            return from_dlpack(obj, stream=stream)
    return None


def array_shape_and_dtype(value: Any) -> tuple[tuple[int, ...], str]:
    """Shape and numpy dtype name of a numpy array, a device array (CUDA array interface or DLPack: torch,
    CuPy) or anything numpy can convert, without copying device memory. `DataError` if the producer refuses
    to export itself (a torch tensor that requires grad)."""
    interface = cuda_array_interface(value)
    if interface is not None:
        return tuple(interface["shape"]), np.dtype(interface["typestr"]).name
    if isinstance(value, np.ndarray):
        return value.shape, value.dtype.name
    if hasattr(value, "__dlpack__") and hasattr(value, "shape"):
        dtype = str(getattr(value, "dtype", "")).replace("torch.", "")
        return tuple(value.shape), dtype
    array = np.asarray(value)
    return array.shape, array.dtype.name


def cuda_array_interface(obj: Any) -> dict[str, Any] | None:
    """`obj.__cuda_array_interface__`, or None for objects without one (host arrays, CPU tensors).

    Producers signal "not a GPU array" with AttributeError, but refuse some GPU arrays with other errors:
    PyTorch raises RuntimeError for a CUDA tensor that requires grad (seen with torch 2.11 on a GPU;
    its ``__dlpack__`` raises BufferError). That is the caller's to fix, so it becomes a `DataError` that
    carries the producer's reason, not an internal traceback.
    """
    try:
        return getattr(obj, "__cuda_array_interface__", None)
    except (RuntimeError, BufferError) as exc:
        raise _refused(obj, "__cuda_array_interface__", exc) from exc


def from_cuda_array_interface(cai: dict[str, Any]) -> DeviceArray:
    """Parse a CUDA Array Interface (v0-v3) dict; refuse masked or non-contiguous arrays."""
    shape = tuple(int(d) for d in cai["shape"])
    dtype = np.dtype(cai["typestr"])
    if dtype.kind not in "biufc":  # torch exports bfloat16 as '<V2': raw bytes, no arithmetic type
        raise DataError(
            f"A GPU input has element type {cai['typestr']!r}, which is not a number type numpy can describe "
            "(PyTorch exports bfloat16 as '<V2').",
            fix="Convert it to float32, float16, int8, int32 or int64 before inference.",
        )
    if cai.get("mask") is not None:
        raise DataError(
            "A GPU input has a mask (CUDA array interface 'mask'); masked arrays are not supported."
        )
    strides = cai.get("strides")
    if strides is not None and not _is_c_contiguous(shape, tuple(strides), dtype.itemsize):
        raise _not_contiguous(shape, tuple(strides))
    ptr = int(cai["data"][0])
    stream = cai.get("stream")
    return DeviceArray(ptr=ptr, shape=shape, dtype=dtype, stream=None if stream is None else int(stream))


def from_dlpack(obj: Any, stream: int | None = None) -> DeviceArray:
    """Read pointer, shape and dtype from `obj.__dlpack__()` without consuming the capsule."""
    try:
        capsule = obj.__dlpack__() if stream is None else obj.__dlpack__(stream=stream)
    except (RuntimeError, BufferError) as exc:  # e.g. torch: BufferError for a tensor that requires grad
        raise _refused(obj, "__dlpack__()", exc) from exc
    address = _capsule_pointer(capsule, b"dltensor")
    tensor = _DLTensor.from_address(address)
    shape = tuple(int(tensor.shape[i]) for i in range(tensor.ndim))
    dtype = _dtype_from_dl(tensor.dtype)
    if tensor.strides:
        strides = tuple(int(tensor.strides[i]) * dtype.itemsize for i in range(tensor.ndim))
        if not _is_c_contiguous(shape, strides, dtype.itemsize):
            raise _not_contiguous(shape, strides)
    ptr = int(tensor.data or 0) + int(tensor.byte_offset)
    return DeviceArray(ptr=ptr, shape=shape, dtype=dtype, owner=capsule)


def dlpack_device_type(obj: Any) -> int:
    return int(obj.__dlpack_device__()[0])


def _is_c_contiguous(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> bool:
    """Row-major check; a dimension of size 1 may carry any stride (PyTorch leaves them arbitrary)."""
    if any(d == 0 for d in shape):
        return True
    step = itemsize
    for dim, stride in zip(reversed(shape), reversed(strides), strict=True):
        if dim != 1 and stride != step:
            return False
        step *= dim
    return True


def _not_contiguous(shape: tuple[int, ...], strides: tuple[int, ...]) -> DataError:
    return DataError(
        f"A GPU input of shape {list(shape)} is not C-contiguous (byte strides {list(strides)}).",
        fix="Pass a contiguous array, e.g. tensor.contiguous() in PyTorch or cupy.ascontiguousarray(x).",
    )


def _refused(obj: Any, protocol: str, exc: BaseException) -> DataError:
    return DataError(
        f"A GPU input ({type(obj).__module__}.{type(obj).__qualname__}) refused to share its memory through "
        f"{protocol}: {type(exc).__name__}: {exc}",
        fix="Pass a plain device array: for a PyTorch tensor that requires grad, pass tensor.detach().",
    )


def _dtype_from_dl(dl: _DLDataType) -> np.dtype:
    kind = _DL_KIND.get(int(dl.code))
    if kind is None or int(dl.lanes) != 1:
        raise DataError(
            f"A DLPack input has a data type numpy cannot describe (code {dl.code}, {dl.bits} bits, "
            f"{dl.lanes} lanes).",
            fix="Convert it to float32, float16, int8, int32 or int64 before inference.",
        )
    if kind == "b":
        return np.dtype(np.bool_)
    return np.dtype(f"{kind}{int(dl.bits) // 8}")


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


# A private prototype, so we never change the shared `ctypes.pythonapi.PyCapsule_GetPointer.restype`.
_PyCapsule_GetPointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)


def _capsule_pointer(capsule: Any, name: bytes) -> int:
    try:
        address = _PyCapsule_GetPointer(capsule, name)
    except ValueError:
        raise DataError(
            "An input's __dlpack__() did not return a 'dltensor' capsule (already consumed, or a versioned "
            "DLPack 1.x capsule).",
            fix="Pass the array itself, not a capsule, or convert it with torch.as_tensor / cupy.asarray.",
        ) from None
    return int(address)
