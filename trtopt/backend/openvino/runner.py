"""OpenVINO runner: the plan's Q/DQ ONNX compiled once for OpenVINO's CPU plugin, one infer request per thread.

Thread safety: an OpenVINO `CompiledModel` may be shared by threads, an `InferRequest` may not (OpenVINO's
"Inference Request" guide: one request runs one inference at a time), so each calling thread gets its own
request from the shared compiled model, created on its first call. With one stream (the plan's default) the
plugin runs them one after another; a plan built with --ov-streams N runs N at once.

Float layers run in f32 (`INFERENCE_PRECISION_HINT`): OpenVINO would otherwise pick bf16 on CPUs with AMX or
AVX-512 BF16 and fp16 on ARM, and the plan would no longer compute what its verification measured.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import openvino as ov

from trtopt.backend.base import RunOptions
from trtopt.backend.openvino.options import SECTION_CONFIG
from trtopt.plan import Plan

_core_lock = threading.Lock()
_core: ov.Core | None = None


def core() -> ov.Core:
    """One OpenVINO Core per process (creating one loads the plugins)."""
    global _core
    with _core_lock:
        if _core is None:
            _core = ov.Core()
        return _core


def compiled_model(plan: Plan, threads: int | None = None) -> ov.CompiledModel:
    """The plan's ONNX compiled for the CPU with its recorded streams and `threads` inference threads (None: all)."""
    raw = plan.sections.get(SECTION_CONFIG)
    settings = json.loads(raw) if raw else {}
    config: dict[str, Any] = {"NUM_STREAMS": int(settings.get("streams", 1)), "INFERENCE_PRECISION_HINT": "f32"}
    if threads is not None:
        config["INFERENCE_NUM_THREADS"] = threads
    return core().compile_model(core().read_model(compiled_graph(plan.sections["onnx"])), "CPU", config)


def compiled_graph(stored: bytes) -> bytes:
    """The ONNX OpenVINO compiles for a plan's stored Q/DQ graph: each conv's bias moved into the quantiser after
    it (`trtopt.backend.openvino.biases`), which the stored graph, ONNX Runtime's reference, cannot express."""
    from trtopt.backend.openvino.biases import fold_biases

    model = onnx.load_from_string(stored)
    return model.SerializeToString() if fold_biases(model) else stored


class OpenvinoRunner:
    timing = "host"  # trtopt bench times calls with the host clock

    def __init__(self, plan: Plan, options: RunOptions) -> None:
        self.compiled = compiled_model(plan, options.threads)
        names = [output.get_names() for output in self.compiled.outputs]
        self.output_names = [next((s.name for s in plan.outputs if s.name in n), min(n)) for n in names]
        self._local = threading.local()

    def infer(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self.compiled.create_infer_request()
        # the request reads the caller's arrays in place (a synchronous call; Engine checked their dtypes) instead
        # of copying them into its own tensors first (1-2% of a ResNet-18's call on an avx2 EPYC); set as tensors
        # directly, not through `infer(inputs, share_inputs=True)`, whose Python dispatch of the inputs cost ~0.9%
        # of the same call at batch 1 (AVX-512 VNNI EPYC, OpenVINO 2026.4.1, 300 interleaved calls)
        for name, value in feeds.items():
            array = np.ascontiguousarray(value)  # OpenVINO shares writeable memory only: a read-only array is copied
            request.set_tensor(name, ov.Tensor(array, shared_memory=bool(array.flags.writeable)))
        request.infer()
        return {name: np.array(request.get_output_tensor(i).data, copy=True)
                for i, name in enumerate(self.output_names)}  # fmt: skip

    def close(self) -> None:
        self._local = threading.local()
        del self.compiled


def create_runner(plan: Plan, options: RunOptions) -> OpenvinoRunner:
    return OpenvinoRunner(plan, options)
