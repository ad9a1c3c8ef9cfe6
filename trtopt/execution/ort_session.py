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

from trtopt.errors import ShapeError, TrtoptError
from trtopt.frontend.loader import onnx_from_graph, with_supported_ir
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
) -> ort.SessionOptions:
    """SessionOptions with trtopt's defaults; `threads=None` lets ONNX Runtime choose.

    `spin=False` stops ONNX Runtime's intra-op threads from busy-waiting after each run: right for a
    caller that does its own CPU work between runs (calibration counts the activations), which the
    spinning threads would otherwise slow down.
    """
    options = ort.SessionOptions()
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
    ) -> None:
        proto = onnx_from_graph(model) if isinstance(model, gs.Graph) else with_supported_ir(model)
        if expose:
            proto = with_exposed_tensors(proto, expose)
        options = session_options(threads=threads, opt_level=opt_level, spin=spin)
        self.session = _make_session(proto, options)
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
        try:
            values = self.session.run(names, {k: v for k, v in feeds.items() if k in self.input_names})
        except (
            ort.capi.onnxruntime_pybind11_state.InvalidArgument,
            ort.capi.onnxruntime_pybind11_state.Fail,
        ) as e:
            raise TrtoptError(
                f"ONNX Runtime rejected the inputs: {str(e).splitlines()[0]}",
                fix="Check the input shapes and dtypes against `trtopt inspect`.",
            ) from None
        return dict(zip(names, values, strict=True))


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


def _make_session(proto: onnx.ModelProto, options: ort.SessionOptions) -> ort.InferenceSession:
    state = ort.capi.onnxruntime_pybind11_state
    try:
        return _new_session(proto, options)
    except (state.Fail, state.InvalidGraph, state.InvalidArgument, state.NotImplemented) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TrtoptError(
            f"ONNX Runtime cannot run this model: {first}",
            fix="Check the model with `trtopt inspect`; ops ONNX Runtime has no kernel for cannot be built or "
            "calibrated on the CPU.",
        ) from None


def _new_session(proto: onnx.ModelProto, options: ort.SessionOptions) -> ort.InferenceSession:
    providers = ["CPUExecutionProvider"]
    if proto.ByteSize() < PROTOBUF_LIMIT:
        return ort.InferenceSession(proto.SerializeToString(), options, providers=providers)
    # Over 2 GiB: ONNX Runtime must read the weights from files.
    # onnx.save_model moves the weights out of the message it is given: save a copy, not the caller's.
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    with tempfile.TemporaryDirectory(prefix="trtopt-ort-") as tmp:
        path = Path(tmp, "model.onnx")
        onnx.save_model(copy, path, save_as_external_data=True, location="model.data")
        return ort.InferenceSession(str(path), options, providers=providers)
