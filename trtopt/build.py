"""The whole build in one short function: load -> optimise -> calibrate -> quantise -> build -> plan.

    backend, _ = select_backend(config.backend)                  # backend: its options, checked up front
    graph = optimize(load_graph(path), backend.passes(...)).graph # frontend, passes (the backend's defaults)
    data, checks = calibration_and_checks(graph, spec, ...)      # data: calibration and verification samples
    amax = calibrate_graph(graph, fp32, tensors, config.calib)   # calib (or a cache)
    insert_qdq(graph, qplan, amax)                               # quant, after bias correction
    plan = build_verified(backend, model, options, fp32, checks) # backend variants until one verifies
    plan = backend.faster(plan, ...)                             # or a cheaper plan where it is slower than FP32

Every decision that depends on where the plan runs belongs to the backend object (`trtopt.backend.base`);
this module names none.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import onnx
import onnx_graphsurgeon as gs

from trtopt.backend import BackendOptions, BackendReport, Profile, get_backend, quantizable_tensors, select_backend
from trtopt.calib.config import CalibConfig
from trtopt.calib.stage import ProgressHook
from trtopt.config_checks import checked_backend_options
from trtopt.data.config import DataConfig, PreprocessConfig
from trtopt.errors import InputsRejected, TrtoptError
from trtopt.frontend import onnx_from_graph
from trtopt.frontend.config import GraphConfig, load_graph
from trtopt.plan import OptimizerRecord, Plan, PlanMetadata, QuantRecord, TensorSpec
from trtopt.quant import QdqReport, QuantConfig, insert_qdq, plan_quantization
from trtopt.quant.bias import BiasReport, correct_biases_for_build
from trtopt.quant.concat_ranges import float_unlike_concats
from trtopt.quant.float_types import float_precision
from trtopt.quant.sensitivity import Sensitivity, float_sensitive_layers
from trtopt.quant.seven_bit import SevenBit, seven_bit_for_build
from trtopt.verify import Checks, Verification, VerifyConfig, build_verified

if TYPE_CHECKING:
    from trtopt.calib import Calibration
    from trtopt.calib.equalization import EqualizationRecord
    from trtopt.data import Dataset, PreprocessSpec
    from trtopt.passes import OptimizeResult
    from trtopt.passes.check import OptimizeCheck

log = logging.getLogger(__name__)
Options = TypeVar("Options", bound=BackendOptions)


@dataclass(frozen=True)
class BuildConfig:
    """Everything `trtopt build` can be told, one config per stage. None means default.

    `int8` quantises (it needs `data.sources` or `calib.cache`); `fp16` runs the float regions in FP16
    where the backend can. `backend_options` holds each backend's own typed options (at most one per
    backend; a backend without an entry uses its defaults), so one config serves `backend="auto"`."""

    backend: str = "auto"
    int8: bool = True
    fp16: bool = False
    sparsity: bool = False  # record which layers' weights are 2:4, and let a backend with sparse kernels use them
    graph: GraphConfig = field(default_factory=GraphConfig)
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)
    data: DataConfig = field(default_factory=DataConfig)
    calib: CalibConfig = field(default_factory=CalibConfig)
    quant: QuantConfig = field(default_factory=QuantConfig)
    backend_options: tuple[BackendOptions, ...] = ()
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    labels: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        stages = {"graph": GraphConfig, "preprocess": PreprocessConfig, "data": DataConfig, "calib": CalibConfig,
                  "quant": QuantConfig, "verify": VerifyConfig}  # fmt: skip
        for name, kind in stages.items():
            if not isinstance(getattr(self, name), kind):
                raise TrtoptError(
                    f"BuildConfig.{name} is a {type(getattr(self, name)).__name__}; expected a {kind.__name__} "
                    "(configs nest by stage since trtopt 0.2).",
                    fix=f"Pass BuildConfig({name}={kind.__name__}(...)); README.md, 'Python API', shows where each "
                    "former BuildConfig field went.",
                )
        if self.backend != "auto":
            get_backend(self.backend)  # an unknown name lists the valid ones
        object.__setattr__(self, "backend_options", checked_backend_options(self.backend_options))
        if self.labels is not None:
            object.__setattr__(self, "labels", tuple(self.labels))

    def options_for(self, kind: type[Options]) -> Options:
        """This config's options of `kind` (one backend's `options_type`), or that backend's defaults."""
        return next((o for o in self.backend_options if isinstance(o, kind)), None) or kind()


@dataclass
class BuildResult:
    plan: Plan
    backend_reason: str
    stage_seconds: dict[str, float]
    optimizer: OptimizeResult
    calibration: Calibration | None = None
    bias: BiasReport | None = None
    qdq: QdqReport | None = None
    verification: Verification | None = None
    report: BackendReport | None = None  # what the backend made of the plan (kernels, profiles)
    equalization: str | None = None  # what activation equalisation did (or why not), for the summary
    speed: BackendReport | None = None  # the plan's time against FP32's where the backend can compare them
    graph_check: OptimizeCheck | None = None  # the graph before quantisation against the model file


def build_plan(model_path: str | Path, config: BuildConfig, *, progress: ProgressHook | None = None) -> BuildResult:
    """Build a plan in memory; the caller writes it (atomically) with `trtopt.plan.write_plan`."""
    from trtopt.data.samples import preprocess_spec_for, refused_random_inputs
    from trtopt.passes import optimize
    from trtopt.passes.check import random_ops

    path, times = Path(model_path), StageTimes()
    _require_thresholds(config)
    shaping = config.data.sources or config.data.verify_sources  # arrays there set the sizes left dynamic
    with times("load"):
        graph = load_graph(path, config.graph, int8=config.int8, batch=config.data.batch, data=shaping)
    backend, reason = select_backend(config.backend)
    with times("optimize"):  # the backend's default passes leave out those that cost on its kernels
        optimized = optimize(graph, backend.passes(config.graph.passes))
    graph = optimized.graph
    labels = _labels(graph, config.labels)  # everything up to `fp32` is checked before the slow work
    options = backend.options(config, graph)
    spec = preprocess_spec_for(path, graph, config.preprocess, config.data)
    data, checks = _samples(graph, spec, config)
    fp32 = onnx_from_graph(graph)
    with times("graph check"):  # loading and the passes against the model file (trtopt.passes.check)
        graph_check, config, (data, checks) = _checked_graph(path, fp32, graph, spec, config, (data, checks))
    quant = backend.quant_config(config.quant, options)  # what this backend's INT8 kernels need from placement
    measured = partial(backend.measured_form, options=options)  # the plan's form, as the sensitivity search measures
    quantized = _quantize(graph, fp32, quant, data, config, times, progress, measured) if config.int8 else Quantized()
    model = onnx_from_graph(graph) if config.int8 else fp32  # FP16 (--fp16) is written in by the backend's build
    with times("build"):
        drawn = random_ops(n.op for n in graph.nodes)  # no two runs agree: nothing to verify against
        build = partial(_unverified, drawn=drawn) if drawn else partial(build_verified, config=config.verify)
        try:
            plan, verification = build(backend, model, _io(graph), options, fp32, checks)
        except InputsRejected as exc:
            raise refused_random_inputs(exc, checks, graph) from None
    records = _records(graph, config, backend.name, backend.profiles(options), quantized)
    plan = replace(plan, metadata=_metadata(path, config, spec, labels, optimized, quantized, verification, records))
    speed = None
    if checks.batches and verification:  # a plan slower than FP32 may give way to a cheaper one (Backend.faster)
        with times("speed check"):
            rebuild = partial(build, backend, io=_io(graph), options=options, fp32=fp32, checks=checks)
            choice = backend.faster(plan, options, verification, model, fp32, checks.batches[0][0], rebuild)
        plan, verification, speed = choice.written(plan), choice.verification, choice.report
    if speed is None:
        times.seconds.pop("speed check", None)  # nothing measured: no stage
    return BuildResult(plan, reason, times.seconds, optimized, *quantized[:3], verification,
                       backend.report(plan, options), quantized.equalization, speed, graph_check)  # fmt: skip


def _unverified(backend, model, io, options, fp32, checks, *, drawn):  # type: ignore[no-untyped-def]
    """The plan of a model that draws random numbers (Piper's VITS voices: RandomNormalLike): two runs of it differ
    whatever the kernels do, so the backend's first variant is built and the plan carries no verification."""
    from trtopt import __version__
    from trtopt.execution import OrtSession
    from trtopt.plan import Plan
    from trtopt.verify import collect, observed_outputs

    expected = collect(OrtSession(fp32).run, checks.batches[:1])
    _, variant = backend.variants(options)[0]
    sections, versions = backend.build(model, variant)
    log.warning("the plan is not verified: the model draws random numbers (%s), so no two runs of it agree; "
                "check it with your own inputs and metric", ", ".join(drawn))  # fmt: skip
    plan = Plan(backend.name, io[0], observed_outputs(io[1], expected), sections=sections,
                versions={"trtopt": __version__, **versions})  # fmt: skip
    return plan, None


def _checked_graph(
    path: Path, fp32: onnx.ModelProto, graph: gs.Graph, spec: PreprocessSpec | None, config: BuildConfig,
    samples: tuple[Dataset | None, Checks],
) -> tuple[OptimizeCheck | None, BuildConfig, tuple[Dataset | None, Checks]]:  # fmt: skip
    """The graph check (`check_against_file`), and the config and samples the build goes on with: those it
    had, or one sample per call where the model runs no more (its export wrote a batch of 1 into the graph)."""
    from trtopt.passes.check import OneSamplePerCall, check_against_file

    if not samples[1].batches:
        return None, config, samples
    try:
        return check_against_file(path, fp32, samples[1].batches[0][0], lifted=config.int8), config, samples
    except OneSamplePerCall as exc:
        log.warning("%s So the build calibrates and verifies one sample per call (as --calib-batch 1 does); "
                    "the plan runs the same way.", exc.what)  # fmt: skip
        config = replace(config, data=replace(config.data, batch=1))
        samples = _samples(graph, spec, config)
        return check_against_file(path, fp32, samples[1].batches[0][0], lifted=config.int8), config, samples


class Quantized(NamedTuple):
    """What the quantisation stage made (all None for an FP32 build)."""

    calibration: Calibration | None = None
    bias: BiasReport | None = None
    qdq: QdqReport | None = None
    sensitivity: Sensitivity | None = None  # the layers kept float because INT8 cost too much (auto-exclude)
    equalization: str | None = None  # what activation equalisation did, for the summary
    seven_bit: SevenBit | None = None  # the dense layers given 7-bit weights (trtopt.quant.seven_bit)


class StageTimes:
    """Wall time per stage: `with times("load"): ...`; `seconds` maps stage -> seconds, in order."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.seconds[stage] = time.perf_counter() - start


def _samples(graph: gs.Graph, spec: PreprocessSpec | None, config: BuildConfig) -> tuple[Dataset | None, Checks]:
    from trtopt.data.samples import calibration_and_checks

    from_cache = config.calib.cache is not None
    calibrating = config.int8 and not from_cache
    return calibration_and_checks(graph, spec, config.data, config.verify.samples, calibrating=calibrating,
                                  from_cache=from_cache)  # fmt: skip


def _quantize(
    graph: gs.Graph,
    fp32: onnx.ModelProto,
    quant: QuantConfig,
    data: Dataset | None,
    config: BuildConfig,
    times: StageTimes,
    progress: ProgressHook | None,
    measured: Callable[[onnx.ModelProto], onnx.ModelProto],
) -> Quantized:
    """Place Q/DQ by `quant` (the backend's form), calibrate, correct biases, insert Q/DQ into `graph` (in place).

    Calibration covers every tensor any backend may quantise (`quantizable_tensors`), not only this plan's:
    one cache then serves every build of the graph, and the thresholds do not depend on the backend or on
    --exclude. (Measuring fewer tensors is not neutral: ONNX Runtime fuses differently around the tensors
    it exposes, so the FP32 activations, and with them thresholds and channel means, change by rounding.)"""
    from trtopt.calib.stage import calibrate_graph

    cache, record, note, fp32 = _equalize(graph, fp32, quant, data, config)  # trtopt.quant.equalize_cache
    qplan = plan_quantization(graph, quant)
    tensors = quantizable_tensors(graph)
    if not tensors:  # a tree ensemble, an elementwise graph: say so, not "No tensors to calibrate" from below
        ops = ", ".join(sorted({n.op for n in graph.nodes})) or "none"
        raise TrtoptError(
            f"Nothing in this model can run in INT8: it has no layer trtopt quantises (Conv, ConvTranspose, MatMul, "
            f"Gemm with activations to quantise); its ops: {ops}.",
            fix="Build it without --int8 (the float plan is what an INT8 build would give).",
        )
    with times("calibrate"):
        calibration = calibrate_graph(graph, fp32, tensors, config.calib, dataset=data, data=config.data,
                                      progress=progress, loaded=cache, equalization=record)  # fmt: skip
    with times("quantize"):
        sensitivity = None
        if quant.auto_exclude and data is not None:  # trtopt.quant.sensitivity
            qplan, sensitivity = float_sensitive_layers(graph, quant, qplan, calibration, data, config.data.batch,
                                                        progress, lower=measured)  # fmt: skip
        amax = sensitivity.amax(calibration.amax) if sensitivity else calibration.amax
        calibrated = replace(calibration, amax=amax)  # 7-bit weights where the backend asks (trtopt.quant.seven_bit):
        quant, seven = seven_bit_for_build(graph, quant, qplan, calibrated, data, config.data.batch, measured)
        qplan = float_unlike_concats(graph, qplan, calibration.ranges)  # trtopt.quant.concat_ranges
        bias = correct_biases_for_build(graph, qplan, calibration, quant.seven_bit_layers) if quant.bias_correction \
            else None
        qdq = insert_qdq(graph, qplan, amax, quant.seven_bit_layers)
    return Quantized(calibration, bias, qdq, sensitivity, note, seven)

def _equalize(
    graph: gs.Graph, fp32: onnx.ModelProto, quant: QuantConfig, data: Dataset | None, config: BuildConfig
) -> tuple[Calibration | None, EqualizationRecord | None, str | None, onnx.ModelProto]:
    """Activation equalisation before calibration (exact; `trtopt.quant.equalize`), in place: measured on the
    data and recorded for a cache, or redone from the cache's record. Returns (the cache read, or None; the
    record; the summary's note; `graph` as ONNX, rewritten or `fp32`)."""
    from trtopt.calib.cache import load_cache
    from trtopt.quant.equalize_cache import equalize_recorded, not_equalized, replay

    folds = quant.output_folds if quant.quantize_outputs else None
    if config.calib.cache is not None:
        cache = load_cache(config.calib.cache)
        note = replay(graph, fp32, cache, equalize=quant.equalize, folds=folds)
        rewritten = cache.equalization is not None and cache.equalization.applied and quant.equalize
        return cache, None, note, onnx_from_graph(graph) if rewritten else fp32
    if not quant.equalize or data is None:
        return None, not_equalized(fp32), None, fp32
    record, report = equalize_recorded(graph, fp32, data, config.data.batch, folds)
    note = f"{len(report.gains)} tensors rescaled" if report.gains else None
    return None, record, note, onnx_from_graph(graph)


def _require_thresholds(config: BuildConfig) -> None:
    if config.int8 and not (config.data.sources or config.calib.cache):
        raise TrtoptError(
            "--int8 needs calibration data or a calibration cache.",
            fix="Add --calib DIR (a folder of representative images), --calib FILE.npz (arrays named after the "
            "model's inputs, for token ids, audio or several inputs) or --calib-cache FILE.",
        )


def _labels(graph: gs.Graph, given: Sequence[str] | None) -> list[str] | None:
    from trtopt.classify import check_labels, default_labels

    shape = graph.outputs[0].shape if graph.outputs else None
    classes = int(shape[-1]) if shape and isinstance(shape[-1], int) else None
    if given is not None:
        check_labels(list(given), classes, "--labels")
        return list(given)
    return default_labels(classes) if classes else None


def _io(graph: gs.Graph) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    return _specs(graph.inputs), _specs(graph.outputs)


def _specs(tensors: list[gs.Tensor]) -> tuple[TensorSpec, ...]:
    return tuple(
        TensorSpec(
            t.name,
            tuple(d if isinstance(d, int) and d > 0 else -1 for d in (t.shape or [])),
            str(onnx.helper.tensor_dtype_to_np_dtype(onnx.helper.np_dtype_to_tensor_dtype(t.dtype))),
        )
        for t in tensors
    )


def _quant_record(quantized: Quantized) -> QuantRecord | None:
    calibration, bias, qdq, sensitivity = quantized[:4]
    if calibration is None or qdq is None:
        return None
    methods = {t: calibration.choices.get(t, "") for t in qdq.thresholds} if calibration.choices else {}
    for tensor in sensitivity.thresholds if sensitivity is not None else ():  # the search moved it (quant.widen)
        methods[tensor] = f"{methods.get(tensor) or calibration.method}, widened"
    return QuantRecord(
        method=calibration.method,
        samples=calibration.num_samples,
        method_counts=calibration.method_counts(),
        threshold_methods=methods,
        sensitivity=sensitivity.to_dict() if sensitivity is not None else None,
        thresholds=qdq.thresholds,
        int8_layers=tuple(qdq.quantized_layers),
        float_layers=qdq.float_layers,
        bias_corrected_layers=tuple(bias.corrected) if bias is not None else (),
    )


def _records(graph: gs.Graph, config: BuildConfig, backend: str, profiles: Mapping[str, Profile] | None,
             quantized: Quantized) -> dict[str, Any]:  # fmt: skip
    """The plan's optional records: the run-time shape profiles the backend fixed (`trtopt export --triton`
    reads the batch limit), and with --sparsity which layers' weights are 2:4 (trtopt.analysis.sparsity)."""
    records: dict[str, Any] = {}
    if profiles:
        records["profiles"] = {n: {"min": list(p.min), "opt": list(p.opt), "max": list(p.max)}
                               for n, p in profiles.items()}  # fmt: skip
    if config.sparsity:
        from trtopt.analysis.sparsity import sparsity_record

        layers = quantized.qdq.quantized_layers if quantized.qdq else ()
        records["sparsity"] = sparsity_record(graph, layers, config.fp16, backend)
    if quantized.seven_bit is not None:  # the dense layers given 7-bit weights (read back by `trtopt inspect`)
        records["extra"] = {"seven_bit_weights": quantized.seven_bit.to_dict()}
    return records


def _metadata(
    path: Path,
    config: BuildConfig,
    spec: PreprocessSpec | None,
    labels: list[str] | None,
    optimized: OptimizeResult,
    quantized: Quantized,
    verification: Verification | None,
    records: dict[str, Any],
) -> PlanMetadata:
    return PlanMetadata(
        **records,
        source_model=path.name,
        precision=("int8" if config.int8 else float_precision(optimized.graph)) + ("+fp16" if config.fp16 else ""),
        preprocess=spec.to_dict() if spec is not None else None,
        labels=tuple(labels) if labels is not None else None,
        optimizer=OptimizerRecord.from_result(optimized),
        quant=_quant_record(quantized),
        verification=verification,
    )
