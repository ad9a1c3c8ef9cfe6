"""Run a TensorRT plan: deserialise once, one execution context per thread, buffers allocated once.

Runtime API, as documented for TensorRT 10/11 (Python API reference, "Runtime", "ICudaEngine",
"IExecutionContext"; the 10.x->11.x migration guide removes none of these)::

    engine = trt.Runtime(logger).deserialize_cuda_engine(plan_bytes)
    engine.num_io_tensors, engine.get_tensor_name(i), get_tensor_mode / get_tensor_dtype / get_tensor_shape,
    engine.get_tensor_profile_shape(name, 0) -> [min, opt, max]
    context = engine.create_execution_context()
    context.set_input_shape(name, shape); context.set_tensor_address(name, ptr)
    context.execute_async_v3(stream_handle)

Per context (= per thread, since an IExecutionContext must not run two inferences at once): one CUDA
stream, device buffers and pinned host buffers sized for the profile's *max* shapes (so no allocation
happens per call), and optionally CUDA graphs, one per input-shape signature. Inputs that already live
on the GPU (``__cuda_array_interface__`` or DLPack: torch, CuPy, PyCUDA) are bound by pointer, with no
copy. Outputs come back as numpy arrays, so every I/O tensor needs a numpy dtype: ``trt.nptype`` has none
for BF16, FP8, INT4, FP4 or E8M0 (it raises ``TypeError``), and such an engine is refused with the tensor's
name. ``set_input_shape`` and ``set_tensor_address`` report failure by returning ``False``; both are checked.
Every TensorRT call here is held against the real 11 and 10 bindings on each CI run
(tests/test_tensorrt_real_bindings.py).

CUDA graphs: TensorRT's developer guide ("CUDA Graphs") asks for one ``enqueueV3`` outside the capture
after the input shapes change, before capturing; graphs replay fixed addresses, so they are used only
when every input comes from host memory (our own device buffers), and only for small batches
(``GRAPH_MAX_BATCH``), where launch overhead matters.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtopt.backend.base import RunOptions
from trtopt.backend.tensorrt import cuda
from trtopt.errors import PlanError, ShapeError
from trtopt.execution.device_arrays import DeviceArray, device_array_from

log = logging.getLogger(__name__)

GRAPH_MAX_BATCH = 32  # capture CUDA graphs only up to this leading dimension
GRAPH_CACHE_SIZE = 8  # distinct input-shape signatures with a captured graph, per context


@dataclass(frozen=True)
class IOTensor:
    name: str
    is_input: bool
    dtype: np.dtype
    shape: tuple[int, ...]  # as built; -1 = dynamic
    max_shape: tuple[int, ...]  # inputs: the profile's max; outputs: their shape at max inputs


def create_runner(plan: Any, options: RunOptions) -> TensorRTRunner:
    return TensorRTRunner(plan, options)


class TensorRTRunner:
    """Executes one engine from several threads; each thread gets its own context, stream and buffers."""

    timing = "cuda-events"  # `timed_infer` measures the GPU work between CUDA events

    def __init__(self, plan: Any, options: RunOptions) -> None:
        from trtopt.backend.tensorrt.builder import _make_logger
        from trtopt.backend.tensorrt.detect import require

        trt = require()
        self._trt, self._options = trt, options
        cuda.set_device(options.device)
        self._logger = _make_logger(trt)
        self._runtime = trt.Runtime(self._logger)
        self._engine = self._runtime.deserialize_cuda_engine(plan.sections["engine"])
        if self._engine is None:
            built = plan.versions.get("tensorrt", "an unknown version")
            raise PlanError(
                f"TensorRT {trt.__version__} could not deserialise this plan's engine (built with TensorRT "
                f"{built}):\n{self._logger.errors_text()}",
                fix="Engines are tied to the TensorRT version and GPU that built them: rebuild the plan here "
                "with `trtopt build`.",
            )
        self.io = self._describe_io()
        self._local = threading.local()
        self._contexts: list[_Context] = []
        self._lock = threading.Lock()

    def infer(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        outputs, _ = self._context().run(feeds, timed=False)
        return outputs

    def timed_infer(self, feeds: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], float]:
        """Like `infer`, plus the GPU time in ms between CUDA events around copies and execution."""
        return self._context().run(feeds, timed=True)

    def close(self) -> None:
        with self._lock:
            for context in self._contexts:
                context.close()
            self._contexts.clear()
        self._local = threading.local()

    def _context(self) -> _Context:
        context = getattr(self._local, "context", None)
        if context is None:
            cuda.set_device(self._options.device)  # the current device is per host thread
            context = _Context(self._engine, self.io, self._options.cuda_graph, self._logger)
            self._local.context = context
            with self._lock:
                self._contexts.append(context)
        return context

    def _describe_io(self) -> list[IOTensor]:
        trt, engine = self._trt, self._engine
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        probe = _checked_context(engine, self._logger)
        specs = []
        for name in names:
            is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
            shape = tuple(engine.get_tensor_shape(name))
            if is_input and -1 in shape:
                shape_max = tuple(engine.get_tensor_profile_shape(name, 0)[2])
                _set_input_shape(probe, name, shape_max, self._logger)
            specs.append((name, is_input, self._numpy_dtype(name, engine.get_tensor_dtype(name)), shape))
        io = []
        for name, is_input, dtype, shape in specs:
            max_shape = tuple(probe.get_tensor_shape(name))
            if any(d < 0 for d in max_shape):
                raise PlanError(
                    f"Output {name!r} has a data-dependent shape {list(max_shape)}; trtopt's runner needs "
                    f"output sizes known from the input shapes.",
                    fix="Rebuild from a model whose outputs are sized by its inputs (no NonZero-style ops).",
                )
            io.append(IOTensor(name, is_input, dtype, shape, max_shape))
        del probe
        return io

    def _numpy_dtype(self, name: str, dtype: Any) -> np.dtype:
        from trtopt.backend.tensorrt.builder import enum_name

        try:
            return np.dtype(self._trt.nptype(dtype))
        except TypeError:  # trt.nptype: "Could not resolve TensorRT datatype to an equivalent numpy datatype."
            raise PlanError(
                f"Tensor {name!r} of this engine is {enum_name(dtype)}, which has no numpy type; trtopt's "
                f"runner passes inputs and outputs as numpy arrays.",
                fix="Keep the model's inputs and outputs FP32, FP16, INT8, INT32, INT64, UINT8 or BOOL (cast to "
                "BF16/FP8/INT4/FP4 inside the graph), then rebuild the plan.",
            ) from None


class _Context:
    """One execution context with its stream and buffers; used by one thread only."""

    def __init__(self, engine: Any, io: list[IOTensor], cuda_graph: bool, logger: Any) -> None:
        self.io, self.logger = io, logger
        self.context = _checked_context(engine, logger)
        self.stream = cuda.stream_create()
        self.device: dict[str, int] = {}
        self.host: dict[str, np.ndarray] = {}  # pinned, flat uint8 views
        self._host_ptrs: list[int] = []
        for tensor in io:
            nbytes = int(np.prod(tensor.max_shape, dtype=np.int64)) * tensor.dtype.itemsize
            self.device[tensor.name] = cuda.malloc(nbytes)
            ptr = cuda.malloc_host(nbytes)
            self._host_ptrs.append(ptr)
            self.host[tensor.name] = np.ctypeslib.as_array(
                (ctypes.c_uint8 * max(nbytes, 1)).from_address(ptr)
            )
        self.events = (cuda.event_create(), cuda.event_create())
        self.use_graphs = cuda_graph
        self.graphs: dict[tuple[tuple[int, ...], ...], Any] = {}
        self._shapes: tuple[tuple[int, ...], ...] | None = None

    def run(self, feeds: Mapping[str, Any], *, timed: bool) -> tuple[dict[str, np.ndarray], float]:
        inputs = [t for t in self.io if t.is_input]
        views = {t.name: device_array_from(feeds[t.name], int(self.stream)) for t in inputs}
        shapes = tuple(_shape_of(views[t.name], feeds[t.name]) for t in inputs)
        shape_changed = shapes != self._shapes
        if shape_changed:
            for tensor, shape in zip(inputs, shapes, strict=True):
                _check_fits(tensor, shape)
                if -1 in tensor.shape:
                    _set_input_shape(self.context, tensor.name, shape, self.logger)
            self._shapes = shapes
        if timed:
            cuda.event_record(self.events[0], self.stream)
        all_host = all(v is None for v in views.values())
        for tensor in inputs:
            self._bind_input(tensor, feeds[tensor.name], views[tensor.name])
        out_shapes = {t.name: tuple(self.context.get_tensor_shape(t.name)) for t in self.io if not t.is_input}
        for name in out_shapes:
            self._set_address(name, self.device[name])
        self._execute(shapes, all_host, shape_changed)
        outputs = {name: self._copy_out(name, shape) for name, shape in out_shapes.items()}
        if timed:
            cuda.event_record(self.events[1], self.stream)
        cuda.stream_synchronize(self.stream)
        ms = cuda.event_elapsed_ms(*self.events) if timed else 0.0
        return {name: out() for name, out in outputs.items()}, ms

    def _bind_input(self, tensor: IOTensor, value: Any, view: DeviceArray | None) -> None:
        if view is not None:  # zero copy: TensorRT reads the caller's GPU buffer
            if view.dtype != tensor.dtype:
                raise ShapeError(
                    f"GPU input {tensor.name!r} is {view.dtype}, but the engine takes {tensor.dtype}.",
                    fix=f"Convert it on the GPU first, e.g. x.to(torch.{tensor.dtype}) or "
                    f"x.astype('{tensor.dtype}').",
                )
            if view.stream not in (None, int(self.stream)):
                cuda.stream_synchronize(view.stream)  # CUDA array interface v3: wait for the producer
            self._set_address(tensor.name, view.ptr)
            return
        array = np.ascontiguousarray(value, dtype=tensor.dtype)
        staging = self.host[tensor.name][: array.nbytes]
        staging[:] = array.reshape(-1).view(np.uint8)
        cuda.memcpy_htod_async(self.device[tensor.name], staging.ctypes.data, array.nbytes, self.stream)
        self._set_address(tensor.name, self.device[tensor.name])

    def _set_address(self, name: str, ptr: int) -> None:
        if not self.context.set_tensor_address(name, ptr):
            raise PlanError(
                f"TensorRT refused the device address {ptr:#x} for tensor {name!r}:\n{self.logger.errors_text()}",
                fix="Pass a GPU array allocated by CUDA (cudaMalloc, torch, CuPy) whose start is aligned to its "
                "element size, or a host array.",
            )

    def _execute(self, shapes: tuple[tuple[int, ...], ...], all_host: bool, shape_changed: bool) -> None:
        small = all(not s or s[0] <= GRAPH_MAX_BATCH for s in shapes)
        if not (self.use_graphs and all_host and small):
            self._enqueue()
            return
        graph = self.graphs.get(shapes)
        if graph is None and len(self.graphs) < GRAPH_CACHE_SIZE:
            if shape_changed:
                self._enqueue()  # flush shape-dependent setup outside the capture (TensorRT guide)
            cuda.begin_capture(self.stream)
            try:
                self._enqueue()
            finally:
                graph = cuda.end_capture_and_instantiate(self.stream)
            self.graphs[shapes] = graph
        if graph is None:
            self._enqueue()
        else:
            cuda.graph_launch(graph, self.stream)

    def _enqueue(self) -> None:
        if not self.context.execute_async_v3(int(self.stream)):
            raise PlanError(
                "TensorRT's execute_async_v3 failed.", fix="Rerun with -vv to see TensorRT's log."
            )

    def _copy_out(self, name: str, shape: tuple[int, ...]) -> Any:
        dtype = next(t.dtype for t in self.io if t.name == name)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        staging = self.host[name][:nbytes]
        cuda.memcpy_dtoh_async(staging.ctypes.data, self.device[name], nbytes, self.stream)
        # Copy out of the pinned buffer after the stream syncs: the next call reuses it.
        return lambda: staging.view(dtype).reshape(shape).copy()

    def close(self) -> None:
        for graph in self.graphs.values():
            cuda.graph_exec_destroy(graph)
        self.graphs.clear()
        for event in self.events:
            cuda.event_destroy(event)
        for ptr in self.device.values():
            cuda.free(ptr)
        for ptr in self._host_ptrs:
            cuda.free_host(ptr)
        self.device.clear()
        self._host_ptrs.clear()
        cuda.stream_destroy(self.stream)
        del self.context


def _checked_context(engine: Any, logger: Any) -> Any:
    context = engine.create_execution_context()
    if context is None:  # TensorRT returns nullptr (None) when it cannot, e.g. out of device memory
        raise PlanError(
            f"TensorRT could not create an execution context:\n{logger.errors_text()}",
            fix="Free GPU memory (other processes, fewer runner threads) and retry.",
        )
    return context


def _set_input_shape(context: Any, name: str, shape: tuple[int, ...], logger: Any) -> None:
    if not context.set_input_shape(name, shape):
        raise ShapeError(
            f"TensorRT refused shape {list(shape)} for input {name!r}:\n{logger.errors_text()}",
            fix="Use a shape within the engine's optimisation profile, or rebuild with --batch / --shapes "
            "covering it.",
        )


def _shape_of(view: DeviceArray | None, value: Any) -> tuple[int, ...]:
    return view.shape if view is not None else tuple(int(d) for d in np.shape(value))


def _check_fits(tensor: IOTensor, shape: tuple[int, ...]) -> None:
    """Inputs arrive validated by `trtopt.Engine`; this guards the max-size buffers all the same."""
    fits = len(shape) == len(tensor.max_shape) and all(
        (want == -1 and 1 <= got <= top) or want == got
        for want, got, top in zip(tensor.shape, shape, tensor.max_shape, strict=True)
    )
    if not fits:
        raise ShapeError(
            f"Input {tensor.name!r} has shape {list(shape)}; this engine takes {list(tensor.shape)} "
            f"with dynamic dimensions up to {list(tensor.max_shape)}.",
            fix="Split the batch, or rebuild with a larger --batch.",
        )
