"""Every plan checks itself: FP32, the Q/DQ reference and the backend's kernels on the same samples.

Three models see the same held-back samples:

- **FP32**: the optimised graph before quantisation;
- **reference**: the plan's Q/DQ ONNX run by ONNX Runtime with every graph optimisation off, so each
  QuantizeLinear / DequantizeLinear is executed as float math: exactly the INT8 result the plan means;
- **kernels**: the plan as its backend runs it (ONNX Runtime's fused integer kernels, or TensorRT).

`reference vs FP32` is what quantisation costs; `kernels vs reference` is whether the machine computes
what the plan says. The second must stay within `KERNEL_TOLERANCE` times the first and under `KERNEL_CAP`
(see there). A reference far from FP32 (`REFERENCE_MIN_COSINE`) is flagged with what to do. The record goes
into the plan header, and `Engine.verification` returns it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import onnx

from trtopt._version import __version__
from trtopt.data.samples import Checks
from trtopt.errors import TrtoptError
from trtopt.frontend import weightless
from trtopt.frontend.model_errors import plan_errors
from trtopt.metrics.agreement import Outputs, agreement, class_axes, unlabelled_cosine
from trtopt.metrics.compare import image_hw
from trtopt.metrics.labels import label_map_outputs
from trtopt.plan import Plan
from trtopt.plan.verification import REFERENCE_MIN_COSINE, Verification, kernel_tolerance
from trtopt.verify.failure import no_matching_variant
from trtopt.verify.selection import Selection, find_selection, judged_model, judging

if TYPE_CHECKING:
    from trtopt.backend import Backend
    from trtopt.plan import Plan, TensorSpec

log = logging.getLogger(__name__)

__all__ = ["VerifyConfig", "build_verified", "collect", "observed_outputs", "verify_plan"]
Settings = TypeVar("Settings")  # what the backend's `options` resolved
Feeds = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class VerifyConfig:
    """How a build checks its plan (always on). `samples` (--verify-samples): samples run through FP32, the
    INT8 reference and the kernels; held back from calibration when it has 8 times as many or more, else
    up to SHARED_CHECKS times as many shared with it; random inputs where the build has no data."""

    samples: int = 8
    write_failed: bool = False  # --write-failed: write a plan that fails, its failure recorded, to inspect it

    def __post_init__(self) -> None:
        from trtopt.config_checks import check_int

        check_int(self.samples, "--verify-samples", 1, 2**20, optional=False, example="8")


Runner = Callable[[Feeds], Outputs]


class ReferenceUnavailable(TrtoptError):
    """The plan is valid and ran, but ONNX Runtime cannot run its Q/DQ graph as float math to compare."""


def collect(run: Runner, batches: Sequence[tuple[Feeds, int | None]]) -> Outputs:
    """Run every batch and keep the first `n` rows of each output (fixed-batch models pad the last; None
    keeps all: a whole feed of a model without a batch dimension). A 0-d output stays 0-d from one batch
    (as the plan declares it), and stacks to one value per batch from several."""
    parts: dict[str, list[tuple[np.ndarray, int | None]]] = {}
    for feeds, n in batches:
        for name, value in run(feeds).items():
            parts.setdefault(name, []).append((value, n))
    from trtopt.metrics.arrays import joined_batches

    return {name: joined_batches(values) for name, values in parts.items()}


def reference_runner(model_bytes: bytes) -> Runner:
    """The plan's Q/DQ graph with ONNX Runtime's optimisations off: Q/DQ computed as float math."""
    from trtopt.execution import OrtSession

    session = OrtSession(onnx.load_from_string(model_bytes), opt_level="disable", threads=None)
    return lambda feeds: session.run(feeds)


def check_outputs(outputs: Outputs, expected: Iterable[TensorSpec]) -> None:
    """Every graph output is produced, with the plan's shape (-1: any size)."""
    for spec in expected:
        if spec.name not in outputs:
            raise TrtoptError(
                f"The built plan does not produce its graph output {spec.name!r}; nothing was written.",
                fix="This is a bug in trtopt's graph passes or quantisation: please report it with the model, "
                "and build with --passes '' (no optimisation) or without --int8 meanwhile.",
            )
        shape = outputs[spec.name].shape
        if len(shape) != len(spec.shape) or any(e not in (-1, s) for e, s in zip(spec.shape, shape, strict=True)):
            raise TrtoptError(
                f"The built plan's output {spec.name!r} has shape {list(shape)}; the model declares "
                f"{list(spec.shape)}. Nothing was written.",
                fix="This is a bug in trtopt: please report it with the model.",
            )


def observed_outputs(specs: Sequence[Any], fp32: Outputs) -> tuple[Any, ...]:
    """The output specs, with each shape the FP32 model itself contradicts made dynamic at the rank it has.

    Some exporters declare output shapes the model does not produce (ddddocr's recogniser declares
    [1, seqlen] and returns [T, 1, classes]); the plan must not be refused for the model's own mistake.
    Where only the batch axis differs (an export traced at batch 1, run on batches), that axis alone becomes
    dynamic, quietly: the batch is the build's, not a mistake of the model's."""
    fixed = []
    for spec in specs:
        value = fp32.get(spec.name)
        shape = tuple(spec.shape)
        if value is None:
            fixed.append(spec)
            continue
        differ = [i for i, (e, s) in enumerate(zip(shape, value.shape, strict=False)) if e not in (-1, s)]
        if len(value.shape) == len(shape) and differ == [0]:
            log.debug("output %r: declared batch %s, computed %s; recorded as dynamic", spec.name, shape[0],
                      value.shape[0])  # fmt: skip
            shape = (-1, *shape[1:])
        elif differ or len(value.shape) != len(shape):
            log.warning(
                "output %r: the model declares shape %s but computes %s; the plan records it as dynamic",
                spec.name,
                list(shape),
                list(value.shape),
            )
            shape = (-1,) * len(value.shape)
        fixed.append(replace(spec, shape=shape))
    return tuple(fixed)


def verify_plan(
    plan: Plan,
    fp32: Outputs,
    batches: Sequence[tuple[Feeds, int | None]],
    *,
    source: str,
    isa: str,
    variant: str,
    rejected: Sequence[dict[str, Any]] = (),
    samples: int | None = None,
    axes: dict[str, int] | None = None,
    label_maps: Sequence[str] = (),
    selection: Selection | None = None,
) -> Verification:
    """Check that `plan` is valid (ONNX checker, loads in its backend, produces every output with the right
    shape) and measure reference vs `fp32` and kernels vs reference on `batches` ((feeds, rows) pairs);
    `axes` (trtopt.metrics.agreement.class_axes) names the outputs of per-position class scores, `label_maps` those
    of ids.
    Outputs of a `selection` are judged by the tensors they select from (`trtopt.verify.selection`; `fp32` holds those):
    the reference computes them, and so do the kernels of a plan whose ONNX its backend runs (the CPU's); a
    TensorRT engine's kernels are compared on the outputs no selection computes.

    Raises TrtoptError for an invalid plan; a kernel mismatch is returned (`ok` False) for the caller to act.
    """
    kernels, reference = _runs(plan, batches, selection)
    axes = axes if axes is not None else {}  # {}: the distribution shift, no argmax agreement
    if selection is not None:
        fp32, reference = selection.compared(fp32), selection.compared(reference)
    shared = {k: v for k, v in reference.items() if k in kernels}  # a TensorRT engine computes no judged tensors
    samples = samples if samples is not None else sum(1 if n is None else n for _, n in batches)
    to_fp32, on = agreement(reference, fp32, axes, label_maps, samples), {k: a for k, a in axes.items() if k in shared}
    from_kernels = agreement(kernels, shared, on, [m for m in label_maps if m in shared], samples)
    return Verification(
        samples=samples,
        source=source,
        isa=isa,
        variant=variant,
        reference_vs_fp32=to_fp32,
        kernels_vs_reference=from_kernels,
        tolerance=kernel_tolerance(to_fp32),
        rejected=tuple(rejected),
        far_from_fp32=unlabelled_cosine(reference, fp32, label_maps) < REFERENCE_MIN_COSINE,
        judged=selection.describe() if selection is not None else None,
    )


def _runs(
    plan: Plan, batches: Sequence[tuple[Feeds, int | None]], selection: Selection | None
) -> tuple[Outputs, Outputs]:  # fmt: skip
    """(the kernels' outputs, the reference's) on `batches`, for `verify_plan`."""
    from trtopt.backend import RunOptions, create_runner, get_backend

    try:
        weightless.check_model(onnx.load_from_string(plan.sections["onnx"]))  # the checker, not re-encoding weights
        runner = create_runner(judging(plan, selection, get_backend(plan.backend).runner_section), RunOptions())
        try:
            check_outputs(runner.infer(batches[0][0]), plan.outputs)
            kernels = collect(runner.infer, batches)
        finally:
            runner.close()
    except plan_errors() as exc:
        raise TrtoptError(
            f"The built plan is not valid: {str(exc).strip().splitlines()[0]} Nothing was written.",
            fix="This is a bug in trtopt's passes, quantisation or lowering: please report it with the model. "
            "Meanwhile try --passes '' (no graph optimisation), --exclude the layer named above, or a build "
            "without --int8.",
        ) from None
    try:
        reference = collect(reference_runner(judging(plan, selection).sections["onnx"]), batches)
    except plan_errors() as exc:  # the plan ran; ONNX Runtime's CPU kernels cannot run its graph (FP16 ops)
        raise ReferenceUnavailable(
            f"ONNX Runtime cannot run this plan's ONNX as a reference: {str(exc).strip().splitlines()[0]}",
            fix="Report it with the model: trtopt's CPU plans must always have a reference.",
        ) from None
    return kernels, reference


def build_verified(
    backend: Backend[Settings],
    model: onnx.ModelProto,
    io: tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]],
    options: Settings,
    fp32: onnx.ModelProto,
    checks: Checks,
    config: VerifyConfig | None = None,
    warn_constant: bool = True,
) -> tuple[Plan, Verification | None]:
    """Build each of the backend's variants in turn until one computes what its Q/DQ graph says. None: a
    lenient backend (`Backend.strict_verification`) whose graph ONNX Runtime cannot run as a reference.
    `options` are what `backend.options` resolved; with `config.write_failed`, a plan no variant of which
    passes is returned (the last variant's, its record saying it failed) instead of refused. `warn_constant`:
    warn where FP32's outputs hold one value (`_warn_constant`; off for the build's later forms of one plan)."""
    from trtopt.backend.cpu.isa import cpu_isa
    from trtopt.execution import OrtSession

    selection = find_selection(fp32)  # outputs after TopK / NMS: judged by what they select from (FP32 runs those)
    judged = collect(OrtSession(judged_model(fp32, selection) if selection else fp32).run, checks.batches)
    if warn_constant:
        _warn_constant(judged)
    io, hw = (io[0], observed_outputs(io[1], judged)), image_hw(checks.batches[0][0]) if checks.batches else None
    compared = selection.compared(judged) if selection else judged
    axes, label_maps = class_axes(compared, hw), label_map_outputs(compared, hw)
    rejected: list[dict[str, Any]] = []
    for label, variant in backend.variants(options):
        sections, versions = backend.build(model, variant)
        plan = Plan(backend.name, *io, sections=sections, versions={"trtopt": __version__, **versions})
        try:
            result = verify_plan(plan, judged, checks.batches, source=checks.source, isa=cpu_isa(),
                                 variant=label, rejected=rejected, samples=checks.samples, axes=axes,
                                 label_maps=label_maps, selection=selection)  # fmt: skip
        except ReferenceUnavailable as exc:
            if backend.strict_verification:
                raise
            log.warning("the %s plan is valid but not compared with a reference: %s", backend.name, exc.what)
            return plan, None
        except TrtoptError as exc:  # not valid: for a model another tool quantised, that is the likely reason
            from trtopt.frontend.prequantized import prequantized_build_error

            ops = (n.op_type for n in fp32.graph.node)
            instead = prequantized_build_error(ops, backend.name, backend.prequantized_keeps, exc)
            if instead is None:
                raise
            raise instead from None
        if not backend.strict_verification and not result.ok:  # written with its record, which says it failed
            return plan, _warned(result)
        if result.ok:
            if rejected:
                log.warning("%s kernels did not match the plan on this CPU; built %s", rejected[0]["variant"], label)
            return plan, _warned(result)
        log.info("variant %s: kernels vs reference %s (tolerance %.4f)", label, result.kernels_vs_reference.describe(),
                 result.tolerance)  # fmt: skip
        rejected.append({"variant": label, "rel_error": result.kernels_vs_reference.rel_error})
    if config is None or not config.write_failed:
        raise no_matching_variant(backend, result, rejected)
    what = no_matching_variant(backend, result, rejected).what
    log.warning("%s", what.replace("Nothing was written.", "Written as --write-failed asks, with that record."))
    return plan, _warned(result)


def _warn_constant(outputs: Mapping[str, Any]) -> None:
    """A warning where every float output of the FP32 model holds one value (zeros, most often) or none that is
    finite on the check samples: each fidelity figure then compares constants, and "the plan matches FP32" says
    nothing (the sweep of issue #45: an FP16 MobileNetV2 export whose FP32 outputs were all zero built and
    verified "exactly")."""
    arrays = [np.asarray(v) for v in outputs.values()]
    floats = [a for a in arrays if np.issubdtype(a.dtype, np.floating) and a.size > 1]
    if not floats or any(np.isfinite(a).any() and np.ptp(a[np.isfinite(a)]) > 0 for a in floats):
        return
    values = sorted({f"{a[np.isfinite(a)].flat[0]:g}" if np.isfinite(a).any() else "NaN/inf" for a in floats})
    log.warning("the model's FP32 outputs hold one value (%s) on every check sample: each figure comparing the "
                "plan with FP32 compares constants. Check the inputs' preprocessing (--preprocess, or a sidecar "
                "JSON) and the model itself (an FP16 export can overflow to zeros or NaN)", ", ".join(values))


def _warned(result: Verification) -> Verification:
    for warning in result.warnings:
        log.warning(warning)
    return result
