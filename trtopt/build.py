"""The whole build as one chain of stages: load -> optimise -> calibrate -> quantise -> build -> plan.

    graph = load_graph(path, config.graph, ...)                  # passes.config: the front end and its checks
    backend, _ = select_backend(config.backend)                  # backend: told only config.target()
    graph = optimize(graph, backend.passes(...)).graph           # passes (the backend's defaults)
    data, checks = calibration_and_checks(graph, spec, ...)      # data: calibration and verification samples
    quantized = quantize_graph(graph, fp32, quant, data, ...)    # quantize.py: calib, search, quant in order
    plan = build_verified(backend, model, options, fp32, checks) # verify: backend variants until one verifies
    plan = backend.faster(plan, ...)                             # or a cheaper plan where it is slower than FP32

This module holds `BuildConfig` (the stages' configs, nested) and the chain (`build_plan`); beside it on the same
floor, `trtopt.quantize` is the quantisation chain and `trtopt.plan_records` what the plan records besides its
sections.

Every decision that depends on where the plan runs belongs to the backend object (`trtopt.backend.base`);
this module names none.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trtopt.backend import (
    BackendOptions,
    BuildTarget,
    checked_backend_options,
    get_backend,
)
from trtopt.calib.config import CalibConfig
from trtopt.data.config import DataConfig, PreprocessConfig
from trtopt.errors import TrtoptError
from trtopt.passes.config import GraphConfig
from trtopt.quant import QuantConfig
from trtopt.verify import VerifyConfig

if TYPE_CHECKING:
    pass


from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import onnx
import onnx_graphsurgeon as gs

from trtopt.backend import (
    BackendReport,
    prequantized_keeps,
    select_backend,
)
from trtopt.calib.stage import ProgressHook
from trtopt.data.samples import Checks
from trtopt.errors import InputsRejected
from trtopt.frontend import onnx_from_graph
from trtopt.log_once import each_warning_once
from trtopt.passes.config import load_graph
from trtopt.plan import Plan
from trtopt.plan.verification import Verification
from trtopt.plan_records import io_specs, plan_metadata, plan_records
from trtopt.quant import QdqReport
from trtopt.quant.bias import BiasReport
from trtopt.quantize import Quantized, quantize_graph
from trtopt.verify import build_verified

if TYPE_CHECKING:
    from trtopt.calib import Calibration
    from trtopt.data import Dataset, PreprocessSpec
    from trtopt.passes import OptimizeResult
    from trtopt.passes.check import OptimizeCheck



import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)


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

    def target(self) -> BuildTarget:
        """What the backend is told of this config (`Backend.options`)."""
        return BuildTarget(self.int8, self.fp16, self.sparsity, self.graph.shapes, self.backend_options)


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
    """Build a plan in memory; the caller writes it (atomically) with `trtopt.plan.write_plan`. Each warning is
    said once (`trtopt.log_once`): the speed check verifies the forms it tries as the build verified the plan."""
    from trtopt import auto_backend as auto  # several installed runtimes of one machine: `auto` times their plans

    if config.backend == "auto" and len(auto.measured_backends()) > 1:
        return auto.build_fastest(  # each runtime's build; `quant`: a second build's placement, where auto asks
            lambda name, quant=None: build_plan(model_path, replace(config, backend=name, quant=quant or config.quant),
                                                progress=progress),
            config.data.batch, config.quant if config.int8 else None,
        )  # fmt: skip
    with each_warning_once():
        return _build_one(Path(model_path), config, progress)


def _build_one(path: Path, config: BuildConfig, progress: ProgressHook | None) -> BuildResult:
    """`build_plan` for one backend."""
    from trtopt.data.samples import preprocess_spec_for, refused_random_inputs
    from trtopt.passes import optimize
    from trtopt.passes.check import random_ops

    times = StageTimes(progress)
    _require_thresholds(config)
    shaping = config.data.sources or config.data.verify_sources  # arrays there set the sizes left dynamic
    with times("load"):
        graph = load_graph(path, config.graph, int8=config.int8, batch=config.data.batch, data=shaping,
                           keeps=prequantized_keeps())  # fmt: skip
    backend, reason = select_backend(config.backend)
    times.shown = _shown_stages(backend.name)
    with times("optimize"):  # the backend's default passes leave out those that cost on its kernels
        optimized = optimize(graph, backend.passes(config.graph.passes))
    graph = optimized.graph
    labels = _labels(graph, config.labels, path)  # everything up to `fp32` is checked before the slow work
    options = backend.options(config.target(), graph)
    spec = preprocess_spec_for(path, graph, config.preprocess, config.data)
    data, checks = _samples(graph, spec, config)
    fp32 = onnx_from_graph(graph)
    with times("graph check"):  # loading and the passes against the model file (trtopt.passes.check)
        graph_check, config, (data, checks) = _checked_graph(path, fp32, graph, spec, config, (data, checks))
    quant = backend.quant_config(config.quant, options)  # what this backend's INT8 kernels need from placement
    measured = partial(backend.measured_form, options=options)  # the plan's form, as the sensitivity search measures
    quantized = Quantized()
    if config.int8:
        quantized = quantize_graph(graph, fp32, quant, data, config.calib, config.data, times, progress, measured)
    model = onnx_from_graph(graph) if config.int8 else fp32  # FP16 (--fp16) is written in by the backend's build
    with times("build"):
        drawn = random_ops(n.op for n in graph.nodes)  # no two runs agree: nothing to verify against
        build = partial(_unverified, drawn=drawn) if drawn else partial(build_verified, config=config.verify)
        try:
            plan, verification = build(backend, model, io_specs(graph), options, fp32, checks)
        except InputsRejected as exc:
            raise refused_random_inputs(exc, checks, graph) from None
    records = plan_records(graph, config.target(), backend.name, backend.profiles(options), quantized)
    metadata = plan_metadata(path, config.target(), spec, labels, optimized, quantized, verification, records)
    plan = replace(plan, metadata=metadata)
    speed = None
    if checks.batches and verification:  # a plan slower than FP32 may give way to a cheaper one (Backend.faster)
        with times("speed check"):
            rebuild = partial(build_verified, backend, io=io_specs(graph), options=options, fp32=fp32, checks=checks,
                              config=config.verify, warn_constant=False)  # a verified plan's forms; warned once
            choice = backend.faster(plan, options, verification, model, fp32, checks.batches[0][0], rebuild,
                                    quantized.wider)  # fmt: skip
        plan, verification, speed = choice.written(plan), choice.verification, choice.report
    if speed is None:
        times.seconds.pop("speed check", None)  # nothing measured: no stage
    return BuildResult(plan, reason, times.seconds, optimized, *quantized[:3], verification,
                       backend.report(plan, options), quantized.equalization, speed, graph_check)  # fmt: skip


def _shown_stages(backend: str) -> dict[str, str]:
    """The build's stages after loading that report progress (`StageTimes`), in words; calibration and the
    sensitivity search report their own, finer, progress."""
    return {"graph check": "checking the optimised graph against the model file",
            "quantize": "placing Q/DQ (and searching for sensitive layers)",
            "build": f"building the {backend} plan and verifying it on held-back samples",
            "speed check": f"timing the {backend} plan against FP32's"}  # fmt: skip


def _unverified(backend, model, io, options, fp32, checks, *, drawn):  # type: ignore[no-untyped-def]
    """The plan of a model that draws random numbers (Piper's VITS voices: RandomNormalLike): two runs of it differ
    whatever the kernels do, so the backend's first variant is built and the plan carries no verification."""
    from trtopt._version import __version__
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


def _samples(graph: gs.Graph, spec: PreprocessSpec | None, config: BuildConfig) -> tuple[Dataset | None, Checks]:
    from trtopt.data.samples import calibration_and_checks

    from_cache = config.calib.cache is not None
    calibrating = config.int8 and not from_cache
    return calibration_and_checks(graph, spec, config.data, config.verify.samples, calibrating=calibrating,
                                  from_cache=from_cache)  # fmt: skip


def _require_thresholds(config: BuildConfig) -> None:
    if config.int8 and not (config.data.sources or config.calib.cache):
        raise TrtoptError(
            "--int8 needs calibration data or a calibration cache.",
            fix="Add --calib DIR (a folder of representative images), --calib FILE.npz (arrays named after the "
            "model's inputs, for token ids, audio or several inputs) or --calib-cache FILE.",
        )


def _labels(graph: gs.Graph, given: Sequence[str] | None, path: Path) -> list[str] | None:
    """--labels, checked against the model's class count; else the names its exporter wrote into the file
    (Ultralytics' `names`), else ImageNet's for a 1000-way classifier."""
    from trtopt.data.classes import check_labels, default_labels
    from trtopt.data.embedded_recipe import embedded_labels

    classes = _class_count(graph)
    if given is not None:
        check_labels(list(given), classes, "--labels")
        return list(given)
    embedded = embedded_labels(path)
    if embedded and (classes is None or len(embedded) >= classes):
        return embedded
    return default_labels(classes) if classes else None


def _class_count(graph: gs.Graph) -> int | None:
    """The classes of an onnx-graphsurgeon graph's first output: its last axis, or for a YOLO head over the image
    input's stride grid ([N, 4 + C, anchors], YOLOv8 / YOLO11; [N, anchors, 5 + C], YOLOv5 / YOLOX) its C, where
    the sizes are static. A YOLOv8n's [1, 84, 8400] head has 80 classes, not 8400."""
    from trtopt.metrics.compare import shape_hw
    from trtopt.metrics.yolo import head_classes

    shape = graph.outputs[0].shape if graph.outputs else None
    if not shape:
        return None
    image = next((t.shape for t in graph.inputs if t.shape is not None and len(t.shape) == 4), None)
    if image is not None and all(isinstance(d, int) for d in (*image[1:], *shape[1:])):
        yolo = head_classes(shape, shape_hw(image))
        if yolo is not None:
            return yolo
    return int(shape[-1]) if isinstance(shape[-1], int) else None  # a CTC [N, T, C] with T dynamic: C


class StageTimes:
    """Wall time per stage: `with times("load"): ...`; `seconds` maps stage -> seconds, in order. The stages
    `shown` names (stage -> what it does, in words) are reported to `progress` as they start and end
    (`trtopt.calib.collect.BUILD_STAGE`)."""

    def __init__(self, progress: ProgressHook | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self.progress = progress
        self.shown: dict[str, str] = {}

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        from trtopt.calib.collect import BUILD_STAGE, CalibProgress

        start, shown = time.perf_counter(), self.shown.get(stage) if self.progress else None
        if self.progress and shown:
            self.progress(CalibProgress(BUILD_STAGE + shown, 0, 0, 1))
        yield
        self.seconds[stage] = time.perf_counter() - start
        if self.progress and shown:
            self.progress(CalibProgress(BUILD_STAGE + shown, 1, 1, 1, self.seconds[stage]))
