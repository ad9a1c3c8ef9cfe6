"""A CPU plan is never slower than the float model: keep the fastest plan that verifies (issue #45).

The build times its verified INT8 plan against the FP32 model (`trtopt.backend.cpu.speed`). Where the plan is not
the faster (its time ratio at least 1), INT8 does not pay somewhere, and the backend tries cheaper plans, each
built and verified as the first was and timed the same way:

1. the INT8 regions (`trtopt.backend.cpu.regions`) in float, one more at a time: first those that run no
   integer kernel (an INT8 conv read only by float layers runs in float behind its Q/DQ: `islands` of
   tests/test_cpu_choice.py at 64x64, built on avx2, took 1.70x FP32's time, and 1.14x with that conv float; in
   a run on a loaded machine 2.09x and 0.86x),
   then smallest first (a few small convs between float layers pay least for their Q/DQ), at most `MAX_TRIALS`
   of them and never all (the float plan computes that faster and without the weights' rounding); a region
   stays float only where the plan then runs faster by `PAYS` (ratios, each against FP32 timed in the same
   rounds, so a busy machine moves both sides);
2. where the best INT8 plan is still not the faster, timed once more to confirm (unless that timing finds it
   faster by more than `NOISE`), the float plan (the FP32 model as its own plan): INT8 cannot pay on this CPU for
   this model, and the summary says so and why. A plan as fast as FP32 within the noise of the timing gives way
   too: the float plan then costs nothing in speed and computes FP32's outputs exactly. (Until 2026-11-29 a plan
   within `NOISE` of FP32's time was kept; the real-export benchmark then measured kept INT8 plans at 0.97x FP32's
   speed, mp-hand-landmark, where the float plan would have been both faster and exact. And any second timing
   below FP32's kept the plan: an unseen DeepLabV3-MobileNetV3 (dynamo export, avx2) kept one timed at 1.05x
   FP32's time, which the real-export benchmark then measured at 0.92x FP32's speed at b1.)

Before any timing matters: a plan whose INT8 math has nothing in common with FP32's (its Q/DQ reference's worst
output at cosine below `USELESS_COSINE` with FP32's on the check samples, after the sensitivity search) gives way to
the float plan too, however fast it is, and the summary says why. Such a plan is no faster model, only a wrong one:
a MobileNetV3 with random weights (issue #45's corpus), whose logits are about 1e-9, ran 1.2x FP32's speed and
returned zeros (cosine 0.000) while activation thresholds had a floor of 127 * 2**-14 on every backend.

A plan faster than FP32 by less than that noise is timed once more before it is kept, and judged by the slower
of its two timings: a 1 ms model's single timing called its INT8 plan faster where the benchmark then measured
it at 0.91x / 0.95x FP32's speed (fer-emotion, issue #45; on an avx2 EPYC a rebuild of the same model timed
1.05x and 1.08x FP32's time and wrote the float plan).

Where the build also wrote the Q/DQ model with the thin layers in INT8 (`trtopt.quant.thin`), that model's plan is
built and verified first; where its Q/DQ reference is as close to FP32 (relative error within `THIN_SLACK`, plus
`THIN_FLOOR`) it is timed side by side with the plan (twice where the two are within `NOISE` of each other), and
taken as the plan to start from where it runs faster by `THIN_PAYS`. On the corpus's MobileNetV2s those layers
paid, on its MobileNetV3s and hand-landmark model they cost time, and on the demo they cost fidelity (see that
module).

The decision reads only the timings it is given (`keep_faster`), so tests inject them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import onnx

from trtopt.backend.base import SpeedChoice
from trtopt.backend.cpu.regions import Region, float_regions, int8_regions
from trtopt.backend.cpu.speed import NOISE, Speed
from trtopt.errors import TrtoptError
from trtopt.plan.verification import Verification
from trtopt.quant.thin import Wider

log = logging.getLogger(__name__)

USELESS_COSINE = 0.5  # below this, the INT8 reference's outputs are unrelated to FP32's: the float plan is written
PAYS = 1.03  # a cheaper plan replaces the kept one only when its time ratio is lower by this factor
MAX_TRIALS = 4  # regions tried in float (each trial: a build, a verification and a timing)
THIN_SLACK = 1.05  # thin layers in INT8: the reference's error to FP32 may be this multiple of the plan's ...
THIN_FLOOR = 2e-4  # ... plus this (two plans that both reproduce FP32 within rounding)
# ... and it must run faster by this factor, side by side: as faithful, a plan as fast either way costs nothing
# whichever is taken (the corpus's MobileNetV2s gained 2-7% at batch 8, their MobileNetV3s lost 12-25%)
THIN_PAYS = 1.01


@dataclass(frozen=True)
class Candidate:
    """A verified plan, its verification record, its time against FP32's, and the layers it keeps float that
    the first plan ran in INT8."""

    plan: Any
    verification: Any
    speed: Speed
    kept_float: tuple[str, ...] = ()
    float_plan: bool = False
    wider: Wider | None = None  # the Q/DQ model it was built from, where that has the thin layers in INT8


Build = Callable[[onnx.ModelProto], "tuple[Any, Any] | None"]  # model -> (plan, verification); None: no variant passed
Timer = Callable[[Any], "Speed | None"]  # plan -> its time against FP32's; None: the timing failed
Pair = Callable[[Any, Any], "tuple[Speed, Speed] | None"]  # two plans timed against FP32 in the same rounds
Timed = Callable[[Sequence[Any]], "list[Speed] | None"]  # plans -> each one's time against FP32's, side by side


def faster_plan(
    plan: Any, verification: Any, model: onnx.ModelProto, fp32: onnx.ModelProto,
    rebuild: Callable[[onnx.ModelProto], Any], timed: Timed, fallback: str = "auto", wider: Wider | None = None,
) -> SpeedChoice:  # fmt: skip
    """`Backend.faster` for the backends that run on this CPU (ONNX Runtime, OpenVINO): an INT8 `plan` timed with
    `timed`, and unless `fallback` is "off", the fastest of it and its cheaper forms (`keep_faster`), each built
    with `rebuild` (a form that does not verify is skipped, as a log line), and `wider`'s plan, where the build
    made that model, taken where it is the faster."""
    def timer(one: Any) -> Speed | None:
        found = timed([one])
        return found[0] if found else None

    def pair(one: Any, other: Any) -> tuple[Speed, Speed] | None:
        found = timed([one, other])
        return (found[0], found[1]) if found else None

    speed = timer(plan) if plan.metadata.int8 else None
    if speed is None or fallback == "off":
        return SpeedChoice(plan, verification, speed)

    def build(candidate: onnx.ModelProto) -> tuple[Any, Any] | None:
        try:
            return rebuild(candidate)  # type: ignore[no-any-return]
        except TrtoptError as exc:  # a cheaper form that does not verify is not a reason to fail the build
            log.info("a cheaper form of the plan was not kept: %s", exc.what)
            return None

    kept = keep_faster(Candidate(plan, verification, speed), model, fp32, build, timer, wider, pair)
    return SpeedChoice(kept.plan, kept.verification, kept.speed, kept.kept_float, kept.float_plan, kept.wider)


def keep_faster(
    first: Candidate, model: onnx.ModelProto, fp32: onnx.ModelProto, build: Build, timer: Timer,
    wider: Wider | None = None, pair: Pair | None = None,
) -> Candidate:  # fmt: skip
    """The fastest of `first` (built from the Q/DQ `model`) and its cheaper forms, and of `wider`'s plan where
    `pair` times the two side by side (see the module); its speed's `outcome` says what was chosen and why."""
    if _useless(first.verification):
        floated = build(fp32)
        if floated is not None:
            reason = _useless_reason(first.verification.reference_vs_fp32.cosine)
            return Candidate(*floated, speed=replace(first.speed, outcome=reason), float_plan=True)
    best = _confirmed(first, timer)
    if wider is not None and pair is not None:
        best = _thin_in_int8(best, wider, build, pair)
        model = wider.model if best.wider is not None else model
    if best.speed.ratio < 1.0:
        return best
    dropped, regions = list[Region](), int8_regions(model)
    for region in regions[: min(MAX_TRIALS, len(regions) - 1)]:  # all of them in float: the float plan does better
        trial = _attempt(float_regions(model, [*dropped, region]), build, timer)
        if trial is not None and trial.speed.ratio * PAYS < best.speed.ratio:
            best, dropped = trial, [*dropped, region]
            if best.speed.ratio < 1 / NOISE:
                break
    layers = tuple(name for region in dropped for name in region.layers)
    best = replace(best, kept_float=layers)
    if best.speed.ratio >= 1.0:
        again = timer(best.plan)
        if again is not None and again.ratio >= 1 / NOISE:  # not clearly faster the second time either
            floated = build(fp32)
            if floated is not None:
                return Candidate(*floated, speed=replace(best.speed, outcome=_float_reason(best.speed, again)),
                                 float_plan=True)  # fmt: skip
        if again is not None:  # clearly faster the second time: that timing is the plan's figure
            note = f"timed again at {again.ratio:.2f}x FP32's time after {best.speed.ratio:.2f}x"
            best = replace(best, speed=replace(again, outcome="; ".join(filter(None, (best.speed.outcome, note)))))
    if layers:
        outcome = "; ".join(filter(None, (best.speed.outcome, _region_reason(dropped, first.speed))))
        return replace(best, speed=replace(best.speed, outcome=outcome))
    return best


def _thin_in_int8(best: Candidate, wider: Wider, build: Build, pair: Pair) -> Candidate:
    """`wider`'s plan where it is as faithful as `best` and runs faster by `THIN_PAYS`, both timed side by side with
    `pair` (a gain of a few percent is near the noise of two separate timings), else `best` (see the module)."""
    built = build(wider.model)
    if built is None:
        return best
    errors = [_error(best.verification), _error(built[1])]
    if None in errors or errors[1] > errors[0] * THIN_SLACK + THIN_FLOOR:  # type: ignore[operator]
        log.info("%d thin layer(s) not in INT8: the INT8 reference's error to FP32 %s with them, %s without",
                 len(wider.layers), errors[1], errors[0])  # fmt: skip
        return best
    speeds = pair(best.plan, built[0])
    if speeds is None:
        return best
    ratios = (speeds[0].ratio, speeds[1].ratio)
    if 1 / NOISE < ratios[0] / ratios[1] < NOISE:  # close: timed again, the two timings summed
        again = pair(best.plan, built[0])
        ratios = (ratios[0] + again[0].ratio, ratios[1] + again[1].ratio) if again else (0.0, 1.0)
    if ratios[1] * THIN_PAYS >= ratios[0]:
        log.info("%d thin layer(s) not in INT8: they did not pay (%.3fx FP32's time with them float, %.3fx in INT8)",
                 len(wider.layers), speeds[0].ratio, speeds[1].ratio)  # fmt: skip
        return best
    reason = (f"{len(wider.layers)} thin layer(s) in INT8, where they paid on {best.speed.runtime}'s kernels "
              f"({speeds[0].ratio:.2f}x FP32's time with them float, side by side) at the same fidelity")  # fmt: skip
    return Candidate(built[0], built[1], replace(speeds[1], outcome=reason), wider=wider)


def _error(verification: Any) -> float | None:
    """The verification's INT8 reference relative error to FP32 (None: no record to read)."""
    return verification.reference_vs_fp32.rel_error if isinstance(verification, Verification) else None


def _useless(verification: Any) -> bool:
    return isinstance(verification, Verification) and verification.reference_vs_fp32.cosine < USELESS_COSINE


def _useless_reason(cosine: float) -> str:
    return (f"the float plan was written instead of the INT8 plan, whose outputs have nothing in common with FP32's "
            f"(its Q/DQ reference's worst output: cosine {cosine:.3f} with FP32's, below {USELESS_COSINE}); "
            "calibrate on samples like the ones the model will see, or see `trtopt compare --per-layer`")  # fmt: skip


def _confirmed(first: Candidate, timer: Timer) -> Candidate:
    """`first` as it stands where it is clearly the faster or clearly not; a plan faster within the noise of its
    timing is timed again and judged by the slower of the two (see the module)."""
    if first.speed.ratio < 1 / NOISE or first.speed.ratio >= 1.0:
        return first
    again = timer(first.plan)
    return first if again is None or again.ratio <= first.speed.ratio else replace(first, speed=again)


def _attempt(model: onnx.ModelProto, build: Build, timer: Timer) -> Candidate | None:
    built = build(model)
    if built is None:
        return None
    speed = timer(built[0])
    return None if speed is None else Candidate(built[0], built[1], speed)


def _region_reason(dropped: list[Region], first: Speed) -> str:
    layers = sum(len(r.layers) for r in dropped)
    return (f"{layers} INT8 layer(s) in {len(dropped)} region(s) kept float, where INT8 did not pay on this CPU "
            f"(the all-INT8 plan took {first.ratio:.2f}x FP32's time)")  # fmt: skip


def _float_reason(best: Speed, again: Speed) -> str:
    why = (f"{best.runtime}'s INT8 kernels gain less than their Q/DQ conversions cost on a CPU without VNNI or AMX"
           if not best.int8_dot_products else
           "the float layers between its INT8 layers and their Q/DQ conversions cost more than INT8 saves")  # fmt: skip
    return (
        f"the float plan is the faster on {best.machine} and was written instead: the best INT8 plan took "
        f"{best.ratio:.2f}x and {again.ratio:.2f}x FP32's time in two timings; {why}"
    )
