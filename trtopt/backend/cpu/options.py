"""The CPU backend's options: how ONNX Runtime's INT8 kernels get the plan's weights."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trtopt.backend.base import BackendOptions
from trtopt.backend.cpu.lowering import ENCODINGS
from trtopt.errors import TrtoptError, UnknownNameError

GEMM_CHOICES = ("auto", "on", "off")
FALLBACK_CHOICES = ("auto", "off")
ENCODING_CHOICES = ("auto", *ENCODINGS)


@dataclass(frozen=True)
class CpuOptions(BackendOptions):
    """`gemm` (--cpu-gemm): route dense INT8 convs with a long reduction to ONNX Runtime's GEMM kernel,
    which uses AMX: "auto" (where this CPU has AMX), "on" or "off"; the outputs are the same either way.
    `encoding` (--cpu-encoding): how INT8 weights are stored, a name in
    `trtopt.backend.cpu.lowering.ENCODINGS`, or "auto" (the fastest encoding known to be exact on this CPU,
    verified either way; `trtopt.backend.cpu.builder.candidate_encodings`).
    `fallback` (--cpu-fallback): "auto" keeps INT8 regions float, or writes the float plan, where the INT8 plan
    runs slower than FP32 on this CPU, and the float plan where its outputs have nothing in common with FP32's
    (`trtopt.backend.cpu.choice`); "off" writes the INT8 plan whatever its speed here (a plan built on one CPU to
    serve on a faster kind)."""

    backend: ClassVar[str] = "cpu"
    gemm: str = "auto"
    encoding: str = "auto"
    fallback: str = "auto"

    def __post_init__(self) -> None:
        if self.gemm not in GEMM_CHOICES:
            raise TrtoptError(
                f"cpu_gemm (--cpu-gemm) must be one of {', '.join(GEMM_CHOICES)}, got {self.gemm!r}.",
                fix="Pass --cpu-gemm auto (the default: on where this CPU has AMX), on or off.",
            )
        if self.fallback not in FALLBACK_CHOICES:
            raise UnknownNameError("CPU fallback", self.fallback, list(FALLBACK_CHOICES))
        if self.encoding not in ENCODING_CHOICES:
            raise UnknownNameError("CPU encoding", self.encoding, list(ENCODING_CHOICES))
