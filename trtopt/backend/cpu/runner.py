"""CPU runner: one ONNX Runtime session per plan, created once.

Thread safety: ONNX Runtime documents `InferenceSession.run` as safe to call concurrently on one
session, so every thread of a service shares this runner; intra-op threads are set per runner.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from trtopt.backend.base import RunOptions
from trtopt.backend.cpu.builder import DISABLED_OPTIMIZERS
from trtopt.backend.cpu.isa import EXACT_U8S8, SATURATING_U8S8, cpu_isa
from trtopt.backend.cpu.lowering import store_unsigned_weights
from trtopt.execution.ort_session import session_options
from trtopt.plan import Plan

log = logging.getLogger(__name__)


def model_for_this_cpu(plan: Plan, isa: str | None = None) -> bytes:
    """The plan's ONNX, re-encoded where this CPU's kernels would not compute it exactly, with a one-line
    notice whenever the plan was verified on another kind of CPU (never silently).

    8-bit int8 weights (the u8s8 encoding) meet saturating 16-bit sums on AVX2 / AVX-512 without VNNI; storing
    them as uint8 (`store_unsigned_weights`: the same values) makes ONNX Runtime run exact u8u8 kernels. 7-bit
    weights (the u8s7 encoding's, `trtopt.search.seven_bit`) are exact in u8s8 kernels everywhere and stay int8, so
    a u8s7 plan runs as stored on every x86 CPU. Plans written before trtopt verified its plans carry no record
    and are handled the same way.
    """
    isa = isa or cpu_isa()
    data = plan.sections["onnx"]
    built_on = plan.metadata.verification.isa if plan.metadata.verification is not None else None
    if isa in SATURATING_U8S8:
        model = onnx.load_from_string(data)
        changed = store_unsigned_weights(model)
        if changed:
            verified = f"verified on an {built_on} CPU" if built_on else "u8s8 encoding"
            log.warning(
                "this plan stores int8 weights for VNNI/AMX kernels (%s), which saturate on this %s CPU: %d layers "
                "re-encoded as uint8 (same values, exact here, slower); rebuild here for a plan verified here.",
                verified, isa, changed,
            )  # fmt: skip
            return model.SerializeToString()
    if built_on and built_on != isa:
        exact = isa in EXACT_U8S8 or isa in SATURATING_U8S8
        log.warning(
            "this plan was verified on an %s CPU and runs on an %s CPU: %s", built_on, isa,
            "its encoding is exact here too" if exact else "not verified on this kind of CPU; rebuild here to check it",
        )  # fmt: skip
    return data


class CpuRunner:
    timing = "host"  # trtopt bench times calls with the host clock

    def __init__(self, plan: Plan, options: RunOptions) -> None:
        self.session = ort.InferenceSession(
            model_for_this_cpu(plan),
            session_options(threads=options.threads, spin=options.spin),
            providers=["CPUExecutionProvider"],
            disabled_optimizers=DISABLED_OPTIMIZERS,
        )
        self.output_names = [o.name for o in self.session.get_outputs()]

    def infer(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        values = self.session.run(self.output_names, dict(feeds))
        return dict(zip(self.output_names, values, strict=True))

    def close(self) -> None:
        del self.session


def create_runner(plan: Plan, options: RunOptions) -> CpuRunner:
    return CpuRunner(plan, options)
