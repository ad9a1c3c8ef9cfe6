"""How fast a CPU plan runs against its FP32 model on this CPU: a few interleaved calls at the end of a build.

INT8 does not pay everywhere. ONNX Runtime's exact INT8 kernels on a CPU without VNNI or AMX (u8u8 on avx2)
gain little over its float convs, and float ops between Q/DQ cost extra passes: PP-OCRv6's small text
detector's plan ran at 1.19x FP32's time on an avx2 EPYC (docs/holdout.md). The build says so instead of
leaving the user to assume a speed-up, and acts on it: a plan slower than FP32 gives way to a cheaper one
(`trtopt.backend.cpu.choice`). One call of each per round (FP32 model, plan), alternating which goes
first, on one intra-op thread (the figures BENCHMARKS.md gives), after `WARMUP` calls each; rounds until
`BUDGET_S` has passed, at least `MIN_ROUNDS` and at most `MAX_ROUNDS`; medians. A rough figure on a machine
that may be busy, and labelled as such; `tools/bench_latency.py` measures properly.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, ClassVar

import numpy as np
import onnx

PlanCall = Callable[[Mapping[str, np.ndarray]], object]
BUDGET_S = 2.0
WARMUP = 2  # calls each before timing: a fresh session's first calls allocate and fill caches
MIN_ROUNDS = 3
# was 10: a 5 ms model's rounds then took 0.1 s of the budget, and its ratio read below 1 in one build, 1.05 in the next
MAX_ROUNDS = 60
# A plan within this factor of FP32's time is "about as fast": a median of 3-60 rounds on a shared machine moves
# by a few percent between builds, so 1.004x must not read as "slower" (arabic-name-romanizer's encoder, whose
# GRUs stay float, measured 1.00x and was called slower; docs/holdout.md round 8).
NOISE = 1.05


@dataclass(frozen=True)
class Speed:
    """Median milliseconds per call of the FP32 model and of the plan, on one batch of the check samples (a
    `trtopt.backend.BackendReport`: the build summary's "speed" row and its `--json` key)."""

    key: ClassVar[str] = "speed"
    fp32_ms: float
    plan_ms: float
    rounds: int
    batch: int
    machine: str  # where it ran, for the text ("this avx2 CPU")
    threads: int = 1
    int8_dot_products: bool = False  # the CPU has VNNI or AMX (trtopt.backend.cpu.isa.EXACT_U8S8): its reason differs
    outcome: str = ""  # what the build did about it (trtopt.backend.cpu.choice): layers kept float, the float plan
    runtime: str = "ONNX Runtime"  # what ran the plan (FP32 always runs on ONNX Runtime)

    @property
    def ratio(self) -> float:
        """The plan's time as a multiple of FP32's (below 1: faster)."""
        return self.plan_ms / self.fp32_ms if self.fp32_ms > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ratio": self.ratio}

    def rows(self) -> list[tuple[str, str]]:
        return [("speed", self.text())]

    def text(self) -> str:
        what = (f"INT8 plan {self.ratio:.2f}x FP32's time on {self.machine} ({self.plan_ms:.1f} vs "
                f"{self.fp32_ms:.1f} ms, batch {self.batch}, {self.threads} thread, median of {self.rounds} "
                "interleaved calls; a rough figure: `trtopt bench` measures properly)")  # fmt: skip
        if self.outcome:
            return f"{what}: {self.outcome}"
        if self.ratio <= 1.0:
            return what
        if self.ratio < NOISE:
            return what + ": about as fast as FP32, within the noise of this rough figure"
        if not self.int8_dot_products:
            return what + (f". It is slower than FP32 here: {self.runtime}'s INT8 kernels gain little on CPUs "
                           "without VNNI or AMX, so on this machine the float model may serve better (build without "
                           "--int8), while CPUs with them run this plan faster")  # fmt: skip
        return what + (". It is slower than FP32 here, where INT8 kernels are fast: the float layers between its INT8 "
                       "ones and their Q/DQ likely cost more than INT8 saves; ONNX Runtime's profiler says where the "
                       "time goes, and the float model may serve better (build without --int8)")  # fmt: skip


def measure_speeds(
    fp32: onnx.ModelProto,
    plan_calls: Sequence[PlanCall],
    feeds: Mapping[str, np.ndarray],
    machine: str,
    int8_dot_products: bool = False,
    runtime: str = "ONNX Runtime",
) -> list[Speed]:
    """Time each of `plan_calls(feeds)` (plans on `runtime`) against the FP32 model on one thread (see the module),
    all in the same rounds (each calls the FP32 model and every plan once, in an order that rotates), for
    `BUDGET_S` per plan: plans compared side by side, as a choice between two plans whose times differ by a few
    percent needs (`trtopt.backend.cpu.choice`)."""
    from trtopt.data.arrays import samples_in
    from trtopt.execution import OrtSession

    session = OrtSession(fp32, threads=1, spin=False)
    calls: list[Callable[[], object]] = [lambda: session.run(dict(feeds))]
    calls += [partial(call, feeds) for call in plan_calls]
    for _ in range(WARMUP):
        for call in calls:
            call()
    times: list[list[float]] = [[] for _ in calls]
    start, budget = time.perf_counter(), BUDGET_S * len(plan_calls)
    while len(times[0]) < MAX_ROUNDS and (len(times[0]) < MIN_ROUNDS or time.perf_counter() - start < budget):
        first = len(times[0]) % len(calls)
        for index in [*range(first, len(calls)), *range(first)]:
            began = time.perf_counter()
            calls[index]()
            times[index].append((time.perf_counter() - began) * 1e3)
    batch = samples_in(feeds, fp32)  # a [3, H, W] image input takes one image per call, not a batch of 3
    fp32_ms = statistics.median(times[0])
    return [Speed(fp32_ms, statistics.median(t), len(t), batch, machine, int8_dot_products=int8_dot_products,
                  runtime=runtime) for t in times[1:]]  # fmt: skip
