"""Run an ONNX model (or gs.Graph) on ONNX Runtime's CPU provider, optionally exposing intermediate tensors.

Intermediate tensors are exposed by adding them as graph outputs of a copy of the model, so one run
returns the graph outputs and every requested activation together (what calibration needs).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort

from trtopt.errors import InputsRejected, ShapeError, TrtoptError
from trtopt.frontend.loader import onnx_from_graph, with_supported_ir
from trtopt.frontend.weightless import serialized_size
from trtopt.frontend.writer import PROTOBUF_LIMIT

OptLevel = Literal["disable", "basic", "extended", "all"]
_OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def session_options(
    *,
    threads: int | None = None,
    opt_level: OptLevel = "all",
    optimized_model_path: str | None = None,
    spin: bool = True,
    arena: bool = True,
) -> ort.SessionOptions:
    """SessionOptions with trtopt's defaults; `threads=None` lets ONNX Runtime choose.

    `spin=False` stops ONNX Runtime's intra-op threads from busy-waiting after each run: right for a
    caller that does its own CPU work between runs (calibration counts the activations), which the
    spinning threads would otherwise slow down. `arena=False` turns off ONNX Runtime's CPU memory arena,
    which keeps the peak of any run mapped for the session's life: right for a session whose runs return
    many large tensors (every tensor exposed), which would otherwise hold that much again once they are
    copied out. The arena changes where buffers live, not what the kernels compute.
    """
    options = ort.SessionOptions()
    options.enable_cpu_mem_arena = arena
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.graph_optimization_level = _OPT_LEVELS[opt_level]
    options.log_severity_level = 3
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    if optimized_model_path:
        options.optimized_model_filepath = optimized_model_path
    return options


class OrtSession:
    """One ONNX Runtime session over a model, with chosen intermediate tensors exposed as extra outputs.

    `run()` is thread-safe: ONNX Runtime allows concurrent `InferenceSession.run` calls on one session.
    """

    def __init__(
        self,
        model: onnx.ModelProto | gs.Graph,
        *,
        expose: Sequence[str] = (),
        threads: int | None = None,
        opt_level: OptLevel = "all",
        spin: bool = True,
        arena: bool = True,
        disabled_optimizers: Sequence[str] = (),
    ) -> None:
        proto = onnx_from_graph(model) if isinstance(model, gs.Graph) else with_supported_ir(model)
        if expose:
            proto = with_exposed_tensors(proto, expose)
        options = session_options(threads=threads, opt_level=opt_level, spin=spin, arena=arena)
        self.session = _make_session(proto, options, disabled_optimizers)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.exposed = list(expose)

    def run(
        self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        names = list(outputs) if outputs is not None else self.output_names
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise ShapeError(
                f"Missing input(s) {missing} for the model.", fix=f"The model takes {self.input_names}."
            )
        try:  # quiet: a failure is raised below with its message, not logged a second time in red
            values = self.session.run(names, {k: v for k, v in feeds.items() if k in self.input_names}, _QUIET)
        except (
            ort.capi.onnxruntime_pybind11_state.InvalidArgument,
            ort.capi.onnxruntime_pybind11_state.Fail,
        ) as e:
            first = str(e).splitlines()[0]
            raise InputsRejected(f"ONNX Runtime rejected the inputs: {first}", fix=_fix(str(e))) from None
        return dict(zip(names, values, strict=True))


def _fix(message: str) -> str:
    """What to check for ONNX Runtime's error `message`: values for an index out of range (a Gather's
    "indices element out of data bounds": token ids beyond a vocabulary), else shapes and dtypes."""
    if "out of data bounds" in message or "out of bounds" in message:
        return ("An input's values index a table in the model (token ids into an embedding, class ids, positions) "
                "and some lie outside it: check the data's values, e.g. that token ids are below the vocabulary "
                "size.")  # fmt: skip
    return "Check the input shapes and dtypes against `trtopt inspect`."


# A bound output of the wrong shape is expected (see ReusedOutputs): no ONNX Runtime error log for it.
_QUIET = ort.RunOptions()
_QUIET.log_severity_level = 4


class ReusedOutputs:
    """Runs of one `OrtSession` whose outputs land in preallocated arrays, reused every `depth` runs.

    `session.run` hands back fresh arrays each time; ONNX Runtime's arena reuses its memory, but with
    hundreds of MB of exposed tensors a batch it still maps and faults fresh pages (measured on
    EfficientNet-Lite0 at batch 8 with 60 exposed tensors: 450-950 page faults and 1.3-2.4 ms of system
    time an image, about a tenth of the inference; `tools/bench_calibration_profile.py`). Here each run
    writes through ONNX Runtime's IO binding into one of `depth` sets of arrays, allocated once per input
    shape, so after the first runs no page is faulted. The arrays returned by a run are overwritten
    `depth` runs later: a caller that keeps a batch's outputs while the next batch runs (calibration
    counts them) needs depth 2.

    A requested name that is a model input comes back as the fed array. The first run of each new input
    shape is a plain run (it learns the output shapes, and its arrays become the first set); a shape ONNX
    Runtime refuses to write into (outputs whose shape depends on the values) falls back to plain runs for
    that input shape. One caller at a time: unlike `OrtSession.run`, this is not thread-safe.
    """

    def __init__(self, session: OrtSession, outputs: Sequence[str], depth: int = 2) -> None:
        self.session = session
        self.names = list(outputs)
        self.depth = depth
        self._bound = [n for n in self.names if n not in session.input_names]
        self._sets: dict[tuple, list[tuple[ort.IOBinding, dict[str, np.ndarray]]] | None] = {}
        self._runs = 0

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        inputs = {n: np.ascontiguousarray(feeds[n]) for n in self.session.input_names if n in feeds}
        if len(inputs) != len(self.session.input_names) or not self._bound:
            return self._result(self.session.run(feeds, outputs=self._bound) if self._bound else {}, inputs)
        key = tuple((n, a.shape, a.dtype.str) for n, a in inputs.items())
        if key not in self._sets:
            values = self.session.run(feeds, outputs=self._bound)  # these arrays become the first set
            # Sets for the latest input shape only: memory stays at `depth` batches (a caller still holding
            # arrays of the previous shape keeps them alive until it lets go).
            self._sets = {key: [self._binding(values, reuse=k == 0) for k in range(self.depth)]}
            self._runs = 1
            return self._result(values, inputs)
        sets = self._sets[key]
        if sets is None:
            return self._result(self.session.run(feeds, outputs=self._bound), inputs)
        binding, arrays = sets[self._runs % self.depth]
        for name, value in inputs.items():
            binding.bind_cpu_input(name, value)
        try:
            self.session.session.run_with_iobinding(binding, _QUIET)
        except (ort.capi.onnxruntime_pybind11_state.Fail, RuntimeError):
            self._sets[key] = None  # the outputs' shapes depend on the values: plain runs for this shape
            return self._result(self.session.run(feeds, outputs=self._bound), inputs)
        self._runs += 1
        return self._result(arrays, inputs)

    def _result(self, values: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {n: values[n] if n in values else inputs[n] for n in self.names}

    def _binding(self, like: Mapping[str, np.ndarray], reuse: bool) -> tuple[ort.IOBinding, dict[str, np.ndarray]]:
        binding = self.session.session.io_binding()
        arrays = {n: like[n] if reuse and like[n].flags.c_contiguous and like[n].flags.writeable
                  else np.empty_like(like[n], order="C") for n in self._bound}
        for name, array in arrays.items():
            binding.bind_output(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)
        return binding, arrays


def run_model(
    model: onnx.ModelProto | gs.Graph,
    feeds: Mapping[str, np.ndarray],
    *,
    expose: Sequence[str] = (),
    opt_level: OptLevel = "all",
) -> dict[str, np.ndarray]:
    """One-shot convenience: build a session, run once, return graph outputs plus exposed tensors."""
    return OrtSession(model, expose=expose, opt_level=opt_level).run(feeds)


def with_exposed_tensors(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy of `model` whose graph also outputs the named intermediate tensors."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    known = {
        v.name: v for v in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output)
    }
    produced = {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.input}
    present = {o.name for o in exposed.graph.output}
    for name in names:
        if name in present:
            continue
        if name not in produced:
            raise TrtoptError(f"Cannot expose tensor {name!r}: no node produces it.")
        info = known.get(name)
        if info is not None:
            exposed.graph.output.append(info)
        else:
            exposed.graph.output.append(
                onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
            )
        present.add(name)
    return exposed


def _make_session(
    proto: onnx.ModelProto, options: ort.SessionOptions, disabled: Sequence[str] = ()
) -> ort.InferenceSession:
    state = ort.capi.onnxruntime_pybind11_state
    try:
        return _new_session(proto, options, disabled)
    except (state.Fail, state.InvalidGraph, state.InvalidArgument, state.NotImplemented) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TrtoptError(
            f"ONNX Runtime cannot run this model: {first}",
            fix="Check the model with `trtopt inspect`; ops ONNX Runtime has no kernel for cannot be built or "
            "calibrated on the CPU.",
        ) from None


def _new_session(
    proto: onnx.ModelProto, options: ort.SessionOptions, disabled: Sequence[str] = ()
) -> ort.InferenceSession:
    providers = ["CPUExecutionProvider"]
    if serialized_size(proto) < PROTOBUF_LIMIT:
        return ort.InferenceSession(proto.SerializeToString(), options, providers=providers,
                                    disabled_optimizers=list(disabled))  # fmt: skip
    # Over 2 GiB: ONNX Runtime must read the weights from files.
    # onnx.save_model moves the weights out of the message it is given: save a copy, not the caller's.
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    with tempfile.TemporaryDirectory(prefix="trtopt-ort-") as tmp:
        path = Path(tmp, "model.onnx")
        onnx.save_model(copy, path, save_as_external_data=True, location="model.data")
        return ort.InferenceSession(str(path), options, providers=providers, disabled_optimizers=list(disabled))
