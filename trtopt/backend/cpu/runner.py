"""CPU runner: one ONNX Runtime session per plan, created once.

Thread safety: ONNX Runtime documents `InferenceSession.run` as safe to call concurrently on one
session, so every thread of a service shares this runner; intra-op threads are set per runner.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnxruntime as ort

from trtopt.backend import RunOptions
from trtopt.backend.cpu.builder import DISABLED_OPTIMIZERS
from trtopt.execution.ort_session import session_options
from trtopt.plan import Plan


class CpuRunner:
    def __init__(self, plan: Plan, options: RunOptions) -> None:
        self.session = ort.InferenceSession(
            plan.sections["onnx"],
            session_options(threads=options.threads),
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
