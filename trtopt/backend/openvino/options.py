"""The OpenVINO backend's options: how the plan's Q/DQ graph is written for OpenVINO and how its runner executes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trtopt.backend.base import BackendOptions
from trtopt.backend.cpu.options import FALLBACK_CHOICES
from trtopt.config_checks import check_int
from trtopt.errors import UnknownNameError

SECTION_CONFIG = "openvino"  # the plan section of the runner's settings (streams), JSON

# The Q/DQ form written into the plan (trtopt.backend.openvino.builder.FORMS says what each is).
FORM_CHOICES = ("auto", "lowered", "lowered-pairs", "lowered-w7", "qdq")


@dataclass(frozen=True)
class OpenvinoOptions(BackendOptions):
    """`form` (--ov-form): the Q/DQ graph OpenVINO compiles, a name in `FORM_CHOICES` ("auto": the backend's
    measured default, `trtopt.backend.openvino.builder.DEFAULT_FORM`). `streams` (--ov-streams): OpenVINO CPU
    streams of the compiled model (None: one, for the lowest latency per call; more serve concurrent callers),
    recorded in the plan for its runner. `fallback` (--ov-fallback): as the CPU backend's --cpu-fallback
    (`trtopt.backend.cpu.options.CpuOptions`)."""

    backend: ClassVar[str] = "openvino"
    form: str = "auto"
    streams: int | None = None
    fallback: str = "auto"

    def __post_init__(self) -> None:
        if self.form not in FORM_CHOICES:
            raise UnknownNameError("OpenVINO form", self.form, list(FORM_CHOICES))
        check_int(self.streams, "--ov-streams", 1, 256, example="2")
        if self.fallback not in FALLBACK_CHOICES:
            raise UnknownNameError("OpenVINO fallback", self.fallback, list(FALLBACK_CHOICES))
