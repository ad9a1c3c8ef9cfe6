"""Backends turn a quantised ONNX graph into plan sections (build) and run a plan (runner).

Every backend has the same file roles, so `ls trtopt/backend/*` shows the architecture:
``builder.py`` (ONNX -> plan sections) and ``runner.py`` (plan -> outputs); TensorRT adds
``detect.py``. Backends are imported lazily: the CPU one needs only ONNX Runtime, the TensorRT one
needs `tensorrt` and `cuda-bindings` (``pip install trtopt[gpu]``).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx

from trtopt.errors import BackendUnavailableError, UnknownNameError

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Profile:
    """The shapes one input may take at run time (TensorRT optimisation profile; CPU ignores it)."""

    min: Shape
    opt: Shape
    max: Shape


@dataclass(frozen=True)
class BuildOptions:
    """What a backend build may be told. None means the backend's default."""

    profiles: Mapping[str, Profile] | None = None
    workspace_mib: int | None = None
    timing_cache: Path | None = None
    optimization_level: int | None = None
    sparsity: bool = False
    fp16: bool = False
    threads: int | None = None
    cpu_gemm: str = "auto"  # CPU: route long-reduction INT8 convs to the GEMM kernel: auto (where AMX), on, off
    cpu_encoding: str = "auto"  # CPU: how INT8 weights are stored (trtopt.backend.cpu.lowering.ENCODINGS)


@dataclass(frozen=True)
class RunOptions:
    """How a runner executes. None means the backend's default."""

    threads: int | None = None
    cuda_graph: bool = False
    device: int = 0


@dataclass(frozen=True)
class BackendStatus:
    available: bool
    reason: str = ""


class Runner(Protocol):
    """Executes one plan. Inputs arrive validated (names, shapes, dtypes) by `trtopt.Engine`."""

    def infer(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class BackendInfo:
    name: str
    builder: str  # module with build(model, options) -> (sections, versions)
    runner: str  # module with create_runner(plan, options) -> Runner
    detect: str  # module with status() -> BackendStatus


BACKENDS: dict[str, BackendInfo] = {
    "cpu": BackendInfo(
        "cpu", "trtopt.backend.cpu.builder", "trtopt.backend.cpu.runner", "trtopt.backend.cpu.builder"
    ),
    "tensorrt": BackendInfo(
        "tensorrt",
        "trtopt.backend.tensorrt.builder",
        "trtopt.backend.tensorrt.runner",
        "trtopt.backend.tensorrt.detect",
    ),
}


def backend_info(name: str) -> BackendInfo:
    if name not in BACKENDS:
        raise UnknownNameError("backend", name, ["auto", *BACKENDS])
    return BACKENDS[name]


def backend_status(name: str) -> BackendStatus:
    status: BackendStatus = importlib.import_module(backend_info(name).detect).status()
    return status


def select_backend(name: str = "auto") -> tuple[str, str]:
    """Resolve 'auto' (TensorRT when a GPU and TensorRT answer, else CPU). Returns (name, why)."""
    if name != "auto":
        status = backend_status(name)
        if not status.available:
            raise BackendUnavailableError(
                f"Backend {name!r} is not available here: {status.reason}", fix=_hint(name)
            )
        return name, f"{name} (asked for)"
    trt = backend_status("tensorrt")
    if trt.available:
        return "tensorrt", "tensorrt (GPU and TensorRT found)"
    return "cpu", f"cpu (TensorRT not used: {trt.reason})"


def build_sections(
    name: str, model: onnx.ModelProto, options: BuildOptions
) -> tuple[dict[str, bytes], dict[str, str]]:
    """Run a backend's builder: (plan sections, versions of the libraries that built it)."""
    module = importlib.import_module(backend_info(name).builder)
    sections, versions = module.build(model, options)
    return sections, versions


def build_variants(name: str, options: BuildOptions) -> list[tuple[str, BuildOptions]]:
    """The backend's ways to build this plan, to try in order until one verifies (trtopt.verify):
    (label, options) pairs. The CPU backend offers its INT8 encodings, fastest first; others have one."""
    module = importlib.import_module(backend_info(name).builder)
    variants = getattr(module, "variants", None)
    return list(variants(options)) if variants is not None else [(name, options)]


def strict_verification(name: str) -> bool:
    """Whether a plan whose kernels miss the verification tolerance is refused (True) or written with a
    warning. A backend module says so with STRICT_VERIFICATION; the default is strict."""
    return bool(getattr(importlib.import_module(backend_info(name).builder), "STRICT_VERIFICATION", True))


def create_runner(plan: Any, options: RunOptions) -> Runner:
    info = backend_info(plan.backend)
    status = backend_status(plan.backend)
    if not status.available:
        raise BackendUnavailableError(
            f"This plan was built for the {plan.backend!r} backend, which is not available here: {status.reason}",
            fix=_hint(plan.backend) + " Or build a CPU plan with `trtopt build ... --backend cpu`.",
        )
    runner: Runner = importlib.import_module(info.runner).create_runner(plan, options)
    return runner


def _hint(name: str) -> str:
    if name == "tensorrt":
        return "Install TensorRT 11 and CUDA bindings on a machine with an NVIDIA GPU: pip install 'trtopt[gpu]'."
    return ""
