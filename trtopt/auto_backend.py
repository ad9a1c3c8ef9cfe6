"""`--backend auto` where more than one CPU runtime is installed: build for each, keep the fastest that is as faithful.

Where a GPU and TensorRT answer, `auto` takes TensorRT as before (`trtopt.backend.select_backend`). Otherwise,
with the `openvino` extra installed, both CPU backends (`Backend.cpu_runtime`: ONNX Runtime's `cpu` and
`openvino`) can run the plan, and which is faster depends on the model and the CPU (issue #44: OpenVINO ran
trtopt's Q/DQ graphs up to 1.35x faster than ONNX Runtime on a VNNI Xeon, slower on others). So the build is
done for each (each verified as it always is), the verified plans are timed against each other, and the
fastest is kept, with the reason in the summary. Without the extra there is one CPU runtime and nothing here
runs; `TRTOPT_AUTO_BACKENDS=cpu` (`ENVIRONMENT`) keeps it to one build with the extra installed.

Fidelity comes first: the backends may quantise to different grids (OpenVINO on an AVX2 CPU needs coarser weight
grids to be exact, `trtopt.backend.openvino.pairs`), so a plan whose INT8 reference is further
from FP32 than `FIDELITY_SLACK` times the most faithful one's error (plus `FIDELITY_FLOOR`) is not a candidate,
however fast. Timing (`time_plans`): the plans alternate call by call, after `WARMUP` calls each, for `BUDGET_S`
seconds (at least `MIN_ROUNDS` rounds), medians, at the build's batch and, where the plan's batch is dynamic, at
batch 1 too (`timed_batches`), on one intra-op thread and on all cores (`timed_threads`): a plan is judged by the
geometric mean of its times in all of them. One batch alone chose badly: on the real-export corpus's Keras
MobileNetV2 (avx2 EPYC) OpenVINO's plan ran 4% faster than the CPU backend's at batch 8 and 25% slower at batch 1,
and `auto` timed only batch 8. One thread alone too: a YOLOv8n's CPU plan ran 6% faster than its OpenVINO plan on
one thread and 23% slower on both cores of an AVX-512 VNNI EPYC (tools/bench_cpu_runtimes.py, 1.66x against 2.15x
FP32's speed), and `trtopt run` and `Engine.load` use all cores unless told. A plan must be
faster by `PAYS` to displace one of lower `auto_rank` (the CPU backend), so noise does not flip the choice.
The choice (`choose`) reads only the figures it is given, so tests inject them. Each build loads and checks the same
model, so a warning the first build gave (an opset conversion, a guessed preprocessing) is not repeated by the next
(`trtopt.log_once`).
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from trtopt.backend import BACKENDS, Backend, RunOptions, create_runner, select_backend
from trtopt.data.inputs import random_array
from trtopt.errors import TrtoptError
from trtopt.log_once import each_warning_once

if TYPE_CHECKING:
    from trtopt.plan import Plan
    from trtopt.plan.verification import Verification
    from trtopt.quant import QuantConfig

log = logging.getLogger(__name__)

# The CPU runtimes `auto` may build and time, comma-separated (unset: every installed one); "cpu" restores the one
# build of the CPU backend (the test suite sets it, so its builds stay single and do not depend on timing).
ENVIRONMENT = "TRTOPT_AUTO_BACKENDS"
FIDELITY_SLACK = 1.25
FIDELITY_FLOOR = 0.005
PAYS = 1.03
BUDGET_S = 3.0
WARMUP = 2
MIN_ROUNDS = 5
MAX_ROUNDS = 30
DYNAMIC_SIZE = 16  # the size timed for a dynamic axis other than the batch


@dataclass(frozen=True)
class Candidate:
    """One backend's verified plan as `choose` sees it: its median milliseconds per call (over several batches:
    the geometric mean of each batch's, which are `each`) and its INT8 reference's relative error to FP32 on the
    verification samples (None for a plan that quantises nothing), in `auto_rank` order."""

    name: str
    ms: float
    error: float | None
    each: tuple[float, ...] = ()


def measured_backends() -> list[Backend[Any]]:
    """The installed CPU runtimes `auto` builds and times, in `auto_rank` order (those `ENVIRONMENT` names, where
    it is set), where `auto` would take a CPU runtime; else []."""
    first, _ = select_backend("auto")
    if not first.cpu_runtime:
        return []
    named = os.environ.get(ENVIRONMENT, "").replace(",", " ").split()
    ranked = sorted((BACKENDS.get(n) for n in BACKENDS), key=lambda b: b.auto_rank)
    return [b for b in ranked if b.cpu_runtime and (not named or b.name in named) and b.status().available]


def choose(candidates: Sequence[Candidate], batch: int | Sequence[int], threads: Sequence[int | None] = (1,)
           ) -> tuple[str, str]:  # fmt: skip
    """The backend to keep and why (see the module); `batch`: the batch (or batches) the candidates were timed at,
    on each of `threads` (intra-op threads, None: all cores) in turn: each candidate's `each` in that order."""
    if not candidates:
        raise TrtoptError("No CPU backend built a plan that verifies.", fix="Build with --backend cpu to see why.")
    best_error = _best_error(candidates)
    faithful = [c for c in candidates if _faithful(c, best_error)]
    kept = faithful[0]
    for other in faithful[1:]:
        if other.ms * PAYS < kept.ms:
            kept = other
    batches = (batch,) if isinstance(batch, int) else tuple(batch)
    mixed = any(c.error is None for c in candidates) and any(c.error is not None for c in candidates)
    times = ", ".join(f"{c.name}{' (float plan)' if mixed and c.error is None else ''} {_figures(c, len(batches))}"
                      for c in candidates)  # fmt: skip
    at = " and ".join(str(b) for b in batches)
    why = f"auto: timed at batch {at}, {_threads_text(threads)}: {times}"
    if len(batches) * len(threads) > 1:
        why += " (judged by the geometric mean)"
    left = [f"{c.name}'s INT8 error to FP32 {c.error:.3f} against {best_error:.3f}" for c in candidates
            if c not in faithful]  # fmt: skip
    if left:
        why += f"; not as faithful: {', '.join(left)}"
    if kept is faithful[0] and any(c.ms < kept.ms for c in faithful[1:]):  # faster, within the noise
        why += f"; kept {kept.name}: no other as faithful was {PAYS:.2f}x faster"
    else:
        why += f"; kept the fastest, {kept.name}" if len(faithful) > 1 else f"; kept {kept.name}"
    return kept.name, why


class Built(Protocol):
    """What `build_fastest` reads of a build (`trtopt.build.BuildResult` is one)."""

    plan: Plan
    verification: Verification | None
    backend_reason: str


Result = TypeVar("Result", bound=Built)


def build_fastest(build: Callable[..., Result], batch: int, quant: QuantConfig | None = None) -> Result:
    """`build(name)` (the model built for that backend: `trtopt.build.build_plan`) for each CPU runtime, and the
    result `choose` keeps at `batch`, its `backend_reason` saying why. A backend whose build fails is left out with
    a warning; where every build fails, the first failure is raised alone (a missing model file or unreadable
    calibration data fails each build the same way, and one message says it). It is handed the build as a
    function, so it stands below `trtopt.build`.

    `quant`: the build's placement settings, for a second build `build(name, quant)` where a plan was faster but
    not as faithful: that backend's build once more with layers narrower than `DEFAULT_MIN_CHANNELS` kept float,
    as the CPU backend keeps them (unless the user set `min_channels`), and the choice made again among all.
    OpenVINO quantises the 3-channel stem conv for speed (10% of a ResNet-18's time); on the demo EfficientNet-Lite0
    that moved its INT8 reference from 0.054 to 0.084 relative error to FP32 (AVX-512 VNNI EPYC), beyond the
    slack, where its plan ran 1.2x faster than the CPU plan at batch 8. With the stem float it is as faithful
    (0.054), and then timed against the CPU plan like any other."""
    results: dict[str, Result] = {}
    failures: list[tuple[str, TrtoptError]] = []
    with each_warning_once():
        for backend in measured_backends():
            try:
                results[backend.name] = build(backend.name)
            except TrtoptError as exc:
                failures.append((backend.name, exc))
    if not results:
        raise failures[0][1]
    for failed, error in failures:
        log.warning("--backend auto: the %s build was left out: %s", failed, error.what)
    if len(results) == 1:
        return next(iter(results.values()))
    name, why, refused = _pick_built(results, batch)
    narrow = _narrow_float(quant)
    if narrow is not None and refused:
        first = {n: _error(results[n]) for n in refused}
        with each_warning_once():
            for n in refused:
                try:
                    results[n] = build(n, narrow)
                except TrtoptError as exc:
                    log.warning("--backend auto: the %s build with narrow layers float failed: %s", n, exc.what)
        name, why, _ = _pick_built(results, batch)
        why += "".join(f"; {n} rebuilt with its layers narrower than the CPU backend's minimum float (its first "
                       f"plan, faster, had INT8 error {e:.3f})" for n, e in first.items())  # fmt: skip
    kept = results[name]
    kept.backend_reason = f"{name} ({why})"
    return kept


def _pick_built(results: Mapping[str, Built], batch: int) -> tuple[str, str, list[str]]:
    """`pick` over built results: their plans and their INT8 references' errors."""
    return pick({n: r.plan for n, r in results.items()}, {n: _error(r) for n, r in results.items()}, batch)


def _narrow_float(quant: QuantConfig | None) -> QuantConfig | None:
    """`quant` with the CPU backend's width rule (`DEFAULT_MIN_CHANNELS`), where the user left the width unset."""
    from dataclasses import replace

    from trtopt.quant.config import DEFAULT_MIN_CHANNELS

    if quant is None or quant.min_channels is not None:
        return None
    return replace(quant, min_channels=DEFAULT_MIN_CHANNELS)


def pick(plans: Mapping[str, Plan], errors: Mapping[str, float | None], batch: int) -> tuple[str, str, list[str]]:
    """The backend to keep of verified `plans` (backend name -> plan, in `auto_rank` order) whose INT8 references
    have `errors` to FP32, timed at `timed_batches`, and why (`choose`); and the backends `refused_faster`."""
    batches, threads = timed_batches(next(iter(plans.values())), batch), timed_threads()
    times = [time_plans(plans, b, threads=t) for t in threads for b in batches]
    candidates = [Candidate(name, _geometric_mean([t[name] for t in times]), errors.get(name),
                            tuple(t[name] for t in times)) for name in plans]  # fmt: skip
    name, why = choose(candidates, batches, threads)
    return name, why, refused_faster(candidates, name)


def _figures(candidate: Candidate, per_setting: int) -> str:
    """"10.0 / 60.0 ms", and where it was timed on more than one thread count, "and 6.0 / 35.0 ms" for each next."""
    each = candidate.each or (candidate.ms,)
    groups = [each[i:i + per_setting] for i in range(0, len(each), per_setting)]
    return " and ".join(" / ".join(f"{ms:.1f}" for ms in group) + " ms" for group in groups)


def _threads_text(threads: Sequence[int | None]) -> str:
    cores = os.cpu_count() or 1
    return " then ".join(f"{t} thread{'s' if t != 1 else ''}" if t else f"all {cores} cores" for t in threads)


def timed_threads() -> tuple[int | None, ...]:
    """The intra-op threads `auto` times at (see the module): one, and all cores (None: what `trtopt.Engine.load`
    and `trtopt run` use unless told) where the machine has more than one."""
    return (1, None) if (os.cpu_count() or 1) > 1 else (1,)


def refused_faster(candidates: Sequence[Candidate], kept: str) -> list[str]:
    """The candidates `choose` left out as less faithful that ran faster (by `PAYS`) than the one it kept."""
    best_error = _best_error(candidates)
    kept_ms = next(c.ms for c in candidates if c.name == kept)
    return [c.name for c in candidates if not _faithful(c, best_error) and c.ms * PAYS < kept_ms]


def _best_error(candidates: Sequence[Candidate]) -> float:
    """The most faithful INT8 plan's error, the bar the others are held to. A float plan (a backend on which INT8
    did not pay writes one) does not set it: its error is 0 by definition, and against it every INT8 plan would
    be refused. On a MobileNetV3-Small (TorchScript, AVX-512 VNNI EPYC) OpenVINO's float plan (3.6 / 18.8 ms at
    batch 1 / 8) was kept over the CPU backend's verified INT8 plan (2.1 / 10.1 ms) that way."""
    return min((c.error for c in candidates if c.error is not None), default=0.0)


def _faithful(candidate: Candidate, best_error: float) -> bool:
    """A float plan, or an INT8 plan within the fidelity slack of the most faithful one's error (see the module)."""
    return candidate.error is None or candidate.error <= best_error * FIDELITY_SLACK + FIDELITY_FLOOR


def timed_batches(plan: Plan, batch: int) -> tuple[int, ...]:
    """The batches `auto` times (see the module): 1 and the build's `batch` where the plan's batch is dynamic, else
    the one a call holds (`_timed_batch`)."""
    return tuple(sorted({_timed_batch(plan, 1), _timed_batch(plan, batch)}))


def _geometric_mean(values: Sequence[float]) -> float:
    return float(np.exp(np.mean(np.log(values))))


def _error(result: Built) -> float | None:
    """The INT8 reference's error to FP32; None for a plan that quantises nothing (no --int8, or a float plan)."""
    if result.plan.metadata.quant is None:
        return None
    verification = result.verification
    return 0.0 if verification is None else float(verification.reference_vs_fp32.rel_error)


def time_plans(plans: Mapping[str, Plan], batch: int, threads: int | None = 1) -> dict[str, float]:
    """Milliseconds per call of each plan on the same made-up inputs, calls interleaved (see the module): the
    first plan's median, and each other's as that times the median over rounds of its time / the first's in the
    same round. Paired by round, as trtopt's benchmarks compare (`tools/benchlib.py`): drift that slows a whole
    round (another process, the clock) cancels, where a ratio of two medians carries it (two runs of
    tools/bench_cpu_runtimes.py on a 2-core avx2 EPYC kept a Keras MobileNetV2's CPU plan in one and its OpenVINO
    plan in the other, which the benchmark then timed 6% slower at batch 1 and 2% faster at batch 8). `threads`:
    each runner's intra-op threads (None: all cores), which do not spin between calls, so that one plan's
    waiting threads do not slow the next plan's call."""
    runners = {name: create_runner(plan, RunOptions(threads=threads, spin=False)) for name, plan in plans.items()}
    feeds = made_up_feeds(next(iter(plans.values())), batch)
    try:
        for runner in runners.values():
            for _ in range(WARMUP):
                runner.infer(feeds)
        times: dict[str, list[float]] = {name: [] for name in runners}
        start, rounds = time.perf_counter(), 0
        while rounds < MAX_ROUNDS and (rounds < MIN_ROUNDS or time.perf_counter() - start < BUDGET_S):
            order = list(runners) if rounds % 2 == 0 else list(reversed(runners))
            for name in order:
                began = time.perf_counter()
                runners[name].infer(feeds)
                times[name].append((time.perf_counter() - began) * 1e3)
            rounds += 1
        first = next(iter(times))
        base = statistics.median(times[first])
        return {name: base * statistics.median(t / f for t, f in zip(values, times[first], strict=True))
                for name, values in times.items()}  # fmt: skip
    finally:
        for runner in runners.values():
            runner.close()


def _timed_batch(plan: Plan, batch: int) -> int:
    """The samples one call of `made_up_feeds(plan, batch)` holds: `batch` for a dynamic batch, else the plan's
    own (1 for a whole feed: one [3, H, W] image, not a batch of 3)."""
    from trtopt.data.arrays import has_batch_axis
    from trtopt.data.inputs import InputInfo

    if not plan.inputs or not has_batch_axis([InputInfo(t.name, t.shape, "float32") for t in plan.inputs]):
        return 1
    first = plan.inputs[0].shape[0]
    return batch if first == -1 else int(first)


def made_up_feeds(plan: Plan, batch: int) -> dict[str, np.ndarray]:
    """Inputs of the plan's shapes (a dynamic batch: `batch`; another dynamic axis: `DYNAMIC_SIZE`): normal noise
    for float inputs, zeros for integer and boolean ones (token ids, masks). Values barely move a CPU's time."""
    rng = np.random.default_rng(0)
    feeds = {}
    for spec in plan.inputs:
        shape = [d if d > 0 else (batch if i == 0 else DYNAMIC_SIZE) for i, d in enumerate(spec.shape)]
        feeds[spec.name] = random_array(rng, shape, spec.dtype)
    return feeds
