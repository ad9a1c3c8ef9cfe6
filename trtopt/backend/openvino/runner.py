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
    model = core().read_model(plan.sections["onnx"])
    return core().compile_model(model, "CPU", config)


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
        # share_inputs: the request reads the caller's arrays in place (a synchronous call; Engine checked their
        # dtypes) instead of copying them into its own tensors first (1-2% of a ResNet-18's call on an avx2 EPYC)
        request.infer({name: np.ascontiguousarray(value) for name, value in feeds.items()}, share_inputs=True)
        return {name: np.array(request.get_output_tensor(i).data, copy=True)
                for i, name in enumerate(self.output_names)}  # fmt: skip

    def close(self) -> None:
        self._local = threading.local()
        del self.compiled


def create_runner(plan: Plan, options: RunOptions) -> OpenvinoRunner:
    return OpenvinoRunner(plan, options)
