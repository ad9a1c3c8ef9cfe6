"""The whole build in one short function: load -> optimise -> calibrate -> quantise -> build -> plan.

graph = graph_from_onnx(path)              # frontend
optimized = optimize(graph, passes)        # passes
amax = calibrate(graph, data, tensors)     # calib (or a cache)
correct_biases(graph, plan, means)         # quant
insert_qdq(graph, plan, amax)              # quant
sections = build_sections(backend, model)  # backend, each variant until one verifies:
verify_plan(plan, fp32, held_back)         # verify: FP32 vs Q/DQ reference vs kernels
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx
import onnx_graphsurgeon as gs

from trtopt.backend import BuildOptions, select_backend
from trtopt.errors import ShapeError, TrtoptError
from trtopt.frontend import (
    MIN_OPSET,
    MIN_QDQ_OPSET,
    graph_from_onnx,
    load_model,
    onnx_from_graph,
    require_static_shapes,
)
from trtopt.frontend.shapes import Shape
from trtopt.memory import check_graph_memory
from trtopt.plan import Plan, TensorSpec
from trtopt.quant import QdqReport, QuantConfig, QuantPlan, insert_qdq, plan_quantization
from trtopt.quant.bias import BiasReport, correct_biases
from trtopt.quant.concat_ranges import float_unlike_concats
from trtopt.quant.sensitivity import float_sensitive_layers
from trtopt.verify import Checks, Verification, build_verified, random_checks

if TYPE_CHECKING:
    from trtopt.calib import CalibProgress
    from trtopt.data import PreprocessOverrides

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuildConfig:
    """Everything `trtopt build` can be told. None means default."""

    backend: str = "auto"
    int8: bool = True
    calib: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None
    calib_cache: Path | None = None
    save_cache: Path | None = None
    calib_count: int | None = None
    calib_batch: int = 8
    calib_method: str = "auto"
    workers: int | None = None  # threads decoding calibration images ahead (None: up to 4, at most the CPUs)
    bounded_max: bool = True
    bias_correction: bool = True
    preset: str | None = None
    preprocess: PreprocessOverrides | None = None  # fields over the preset or sidecar (--mean, --std, ...)
    shapes: dict[str, Shape] | None = None
    batch: int | None = None
    passes: tuple[str, ...] | None = None
    quant: QuantConfig = field(default_factory=QuantConfig)
    fp16: bool = False
    labels: list[str] | None = None
    workspace_mib: int | None = None
    timing_cache: Path | None = None
    optimization_level: int | None = None
    sparsity: bool = False
    threads: int | None = None
    cpu_gemm: str = "auto"
    cpu_encoding: str = "auto"
    verify_samples: int = 8
    auto_exclude: bool = True  # keep the most sensitive layers float when an output's cosine < 0.99

    def __post_init__(self) -> None:
        from trtopt.config_checks import check_build_config

        check_build_config(self)


@dataclass
class BuildResult:
    plan: Plan
    backend_reason: str
    stage_seconds: dict[str, float]
    qdq: QdqReport | None
    optimizer: Any
    calibration: Any
    kernels: Any = None
    bias: BiasReport | None = None
    verification: Verification | None = None


ProgressHook = Callable[["CalibProgress"], None]  # calibration progress, with the total filled in


def build_plan(model_path: str | Path, config: BuildConfig, *, progress: ProgressHook | None = None) -> BuildResult:
    """Build a plan in memory; the caller writes it (atomically) with `trtopt.plan.write_plan`."""
    from trtopt.passes import optimize

    if config.int8 and not (config.calib or config.calib_cache):
        raise TrtoptError(
            "--int8 needs calibration data or a calibration cache.",
            fix="Add --calib DIR (a folder of representative images) or --calib-cache FILE.",
        )
    times: dict[str, float] = {}
    with _timed(times, "load"):
        graph = load_graph(Path(model_path), config)
    with _timed(times, "optimize"):
        optimized = optimize(graph, config.passes)
        graph = optimized.graph
    labels = _labels(graph, config)  # checked before the slow work
    backend, reason = select_backend(config.backend)
    if config.fp16 and backend != "tensorrt":
        raise TrtoptError(
            f"--fp16 is for the TensorRT backend; this build uses {reason}.",
            fix="Drop --fp16 for CPU plans (ONNX Runtime's CPU kernels gain nothing from FP16), or build with "
            "--backend tensorrt on a GPU machine. `trtopt.precision.convert_to_fp16` converts an ONNX file alone.",
        )
    spec = preprocess_spec_for(Path(model_path), graph, config)
    calib_data, checks = _data_for(graph, config, spec)
    fp32 = onnx_from_graph(graph)
    calibration = qdq = bias = sensitivity = None
    if config.int8:
        qplan = plan_quantization(graph, quant := _backend_quant_config(config.quant, backend))
        with _timed(times, "calibrate"):
            calibration = calibrate_graph(graph, config, spec, progress, dataset=calib_data)
        with _timed(times, "quantize"):
            if config.auto_exclude and calib_data is not None:  # trtopt.quant.sensitivity
                qplan, sensitivity = float_sensitive_layers(graph, quant, qplan, calibration, calib_data, config)
            qplan = float_unlike_concats(graph, qplan, calibration.ranges)
            bias = _correct_biases(graph, qplan, calibration) if config.bias_correction else None
            qdq = insert_qdq(graph, qplan, calibration.amax)
    model = onnx_from_graph(graph)  # FP16 (--fp16) is written into the graph by the TensorRT builder
    metadata = _metadata(Path(model_path), config, spec, optimized, calibration, qdq, bias, labels)
    metadata |= {"sensitivity": sensitivity.to_dict()} if sensitivity is not None else {}
    with _timed(times, "build"):
        io = (_specs(graph.inputs), _specs(graph.outputs))
        plan, verification = build_verified(backend, model, io, _build_options(graph, config, backend), fp32, checks)
    plan = replace(plan, metadata={**metadata, **({"verification": verification.to_dict()} if verification else {})})
    kernels = _kernel_report(plan) if backend == "cpu" and config.int8 else None
    return BuildResult(plan, reason, times, qdq, optimized, calibration, kernels, bias, verification)


def _kernel_report(plan: Plan) -> Any:
    """Which kernels ONNX Runtime made of the plan (for the summary); the plan already verified, so a failure
    here is reported, not a traceback."""
    from trtopt.backend.cpu.builder import kernel_report
    from trtopt.verify import plan_errors

    try:
        return kernel_report(plan.sections["onnx"])
    except plan_errors() as exc:
        raise TrtoptError(
            f"ONNX Runtime could not optimise the built plan: {str(exc).strip().splitlines()[0]} Nothing was written.",
            fix="This is a bug in trtopt's CPU lowering: please report it with the model; meanwhile try --passes ''.",
        ) from None


def _data_for(graph: gs.Graph, config: BuildConfig, spec: Any) -> tuple[Any, Checks]:
    """(calibration data set or None, verification samples). A large enough calibration set gives its last
    `verify_samples` samples to verification; a small one shares them; without data, random inputs."""
    from trtopt.data import input_infos_from_graph, load_dataset

    count = config.verify_samples
    if count <= 0:
        raise TrtoptError(f"verify_samples must be at least 1, received {count}.", fix="Pass e.g. 8 (the default).")
    if not config.calib:
        return None, random_checks(graph, spec, count, config.calib_batch)
    raw = config.calib
    sources = [str(raw)] if isinstance(raw, (str, os.PathLike)) else [str(p) for p in raw]
    data = load_dataset(sources if len(sources) > 1 else sources[0], input_infos_from_graph(graph), spec,
                        count=config.calib_count)  # fmt: skip
    if config.int8 and not config.calib_cache and len(data) >= 8 * count:
        data, checks = data.split_tail(count)
        source = f"the last {count} calibration samples, held back from calibration"
    else:
        checks = load_dataset(sources if len(sources) > 1 else sources[0], data.inputs, data.spec, count=count)
        shared = "thresholds from the cache" if config.calib_cache else "too few to hold any back"
        source = f"{min(count, len(data))} of the {len(data)} calibration samples ({shared})"
    batches = [(b.feeds, len(b)) for b in checks.batches(config.calib_batch)]
    return data, Checks(batches, source)


def load_graph(path: Path, config: BuildConfig) -> gs.Graph:
    # INT8 needs per-axis Q/DQ (opset 13); the front end converts older models (trtopt.frontend.opset).
    model = load_model(path, min_opset=MIN_QDQ_OPSET if config.int8 else MIN_OPSET).model
    graph = graph_from_onnx(model, shapes=config.shapes)
    require_static_shapes(graph)
    check_graph_memory(graph, config.calib_batch)  # before anything runs: a message, not an OOM kill
    return graph


def calibrate_graph(
    graph: gs.Graph,
    config: BuildConfig,
    spec: Any,
    progress: ProgressHook | None = None,
    *,
    keep_histograms: bool | None = None,
    dataset: Any = None,
) -> Any:
    from trtopt.calib import (
        CalibConfig,
        calibrate,
        check_cache_matches,
        load_cache,
        model_fingerprint,
        save_cache,
    )
    from trtopt.calib.auto import scoring_split
    from trtopt.calib.cache import channel_counts
    from trtopt.data import input_infos_from_graph, load_dataset

    # Calibrate every tensor any backend or quantisation option may quantise, so one cache serves CPU
    # and TensorRT builds, with or without --exclude / --min-channels, alike.
    tensors = plan_quantization(graph, QuantConfig(min_channels=1, quantize_outputs=True)).activation_tensors
    model = onnx_from_graph(graph)
    if config.calib_cache:
        calibration = load_cache(config.calib_cache)
        check_cache_matches(calibration, tensors, fingerprint=model_fingerprint(model), channels=channel_counts(graph))
        return calibration
    raw = config.calib
    sources = [str(raw)] if isinstance(raw, (str, os.PathLike)) else [str(p) for p in raw or []]
    source = sources if len(sources) > 1 else sources[0]
    if dataset is None:
        dataset = load_dataset(source, input_infos_from_graph(graph), spec, count=config.calib_count)
    dataset, scoring = scoring_split(dataset, config.calib_batch) if config.calib_method == "auto" else (dataset, None)
    calibration = calibrate(
        model,
        lambda: (b.feeds for b in dataset.batches(config.calib_batch, workers=config.workers)),
        tensors,
        CalibConfig(method=config.calib_method, keep_histograms=keep_histograms, threads=config.threads),
        progress=(lambda p: progress(replace(p, total_samples=len(dataset)))) if progress else None,
        data_description=f"{len(dataset)} samples from {' '.join(sources)}",
        score_batches=scoring,
    )
    calibration = _bounded_at_max(graph, calibration) if config.bounded_max else calibration
    if config.save_cache:
        save_cache(config.save_cache, calibration)
    return calibration


def _backend_quant_config(quant: QuantConfig, backend: str) -> QuantConfig:
    """What the backend adds: ONNX Runtime needs quantised layer outputs, and CPU plans keep a depthwise
    conv fed by a float layer float unless the user said otherwise (see QuantConfig)."""
    cpu = backend == "cpu"
    leading = cpu if quant.float_leading_depthwise is None else quant.float_leading_depthwise
    return replace(quant, quantize_outputs=cpu, float_leading_depthwise=leading)


def _correct_biases(graph: gs.Graph, qplan: QuantPlan, calibration: Any) -> BiasReport | None:
    """Bias correction (trtopt.quant.bias) needs the FP32 channel means that trtopt's calibrator and
    cache record; TensorRT and ONNX Runtime caches have none, so those builds go without it."""
    if not calibration.channel_means:
        log.warning(
            "no bias correction: the calibration (%s) has no channel means; calibrate from data, or with "
            "a trtopt cache written by this version, to get it", calibration.source or calibration.method
        )
        return None
    report = correct_biases(graph, qplan, calibration.channel_means)
    log.info("bias correction: %d layers corrected, %d left as they are", len(report.corrected), len(report.skipped))
    return report


def _bounded_at_max(graph: gs.Graph, calibration: Any) -> Any:
    """Tensors with a hard activation bound keep their observed maximum (see trtopt.quant.ranges)."""
    from trtopt.quant.ranges import bounded_tensors

    histograms = calibration.histograms or {}
    amax = dict(calibration.amax)
    bounded = bounded_tensors(graph) & set(histograms)
    for name in bounded:
        amax[name] = max(amax[name], float(histograms[name].amax))
    choices = {**calibration.choices, **dict.fromkeys(bounded, "max")} if calibration.choices else None
    return replace(calibration, amax=amax, choices=choices)


def preprocess_spec_for(model_path: Path, graph: gs.Graph, config: BuildConfig) -> Any:
    """Preprocessing for image data: `--preset`, else the model's sidecar `<model>.json`, else ImageNet; then
    the fields given one by one (`config.preprocess`: --mean, --std, ...) over it."""
    from trtopt.data import PreprocessOverrides, PreprocessSpec, spec_for_input

    image_inputs = [t for t in graph.inputs if t.shape is not None and len(t.shape) == 4]
    if len(graph.inputs) != 1 or not image_inputs:
        return None
    tensor = image_inputs[0]
    overrides = config.preprocess or PreprocessOverrides()
    sidecar = model_path.with_suffix(".json")
    if config.preset is None and sidecar.is_file():
        described = json.loads(sidecar.read_text()).get("preprocess")
        if described:
            spec = PreprocessSpec.from_dict(described, where=str(sidecar))
            return overrides.apply(spec, name=tensor.name, input_shape=tuple(tensor.shape))
    try:
        return spec_for_input(tuple(tensor.shape), tensor.dtype, config.preset, name=tensor.name, overrides=overrides)
    except ShapeError:
        if config.preset is not None or overrides:
            raise
        return None  # not an image input: data must come as .npy/.npz, and the plan stores no preprocessing


def _labels(graph: gs.Graph, config: BuildConfig) -> list[str] | None:
    from trtopt.classify import check_labels, default_labels

    shape = graph.outputs[0].shape if graph.outputs else None
    classes = int(shape[-1]) if shape and isinstance(shape[-1], int) else None
    if config.labels is not None:
        check_labels(list(config.labels), classes, "--labels")
        return config.labels
    return default_labels(classes) if classes else None


def _specs(tensors: list[gs.Tensor]) -> tuple[TensorSpec, ...]:
    return tuple(
        TensorSpec(
            t.name,
            tuple(d if isinstance(d, int) and d > 0 else -1 for d in (t.shape or [])),
            str(onnx.helper.tensor_dtype_to_np_dtype(onnx.helper.np_dtype_to_tensor_dtype(t.dtype))),
        )
        for t in tensors
    )


def _build_options(graph: gs.Graph, config: BuildConfig, backend: str) -> BuildOptions:
    profiles = None
    if backend == "tensorrt":  # optimisation profiles are TensorRT's; ONNX Runtime takes any batch
        from trtopt.backend.tensorrt.builder import profiles_for

        profiles = profiles_for(graph.inputs, config.shapes, config.batch) or None
    return BuildOptions(
        profiles=profiles,
        workspace_mib=config.workspace_mib,
        timing_cache=config.timing_cache,
        optimization_level=config.optimization_level,
        sparsity=config.sparsity,
        fp16=config.fp16,
        threads=config.threads,
        cpu_gemm=config.cpu_gemm,
        cpu_encoding=config.cpu_encoding,
    )


def _metadata(
    model_path: Path,
    config: BuildConfig,
    spec: Any,
    optimized: Any,
    calibration: Any,
    qdq: QdqReport | None,
    bias: BiasReport | None,
    labels: list[str] | None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "source_model": model_path.name,
        "preprocess": spec.to_dict() if spec is not None else None,
        "labels": labels,
        "precision": ("int8" if config.int8 else "fp32") + ("+fp16" if config.fp16 else ""),
        "optimizer": _optimizer_report(optimized),
    }
    if calibration is not None and qdq is not None:
        meta["calibration"] = {"method": calibration.method, "samples": calibration.num_samples,
                               "methods": calibration.method_counts()}  # fmt: skip
        if calibration.choices:
            meta["threshold_methods"] = {t: calibration.choices.get(t, "") for t in qdq.thresholds}
        meta["thresholds"] = qdq.thresholds
        meta["int8_layers"] = list(qdq.quantized_layers)
        meta["float_layers"] = qdq.float_layers
        meta["bias_corrected_layers"] = list(bias.corrected) if bias is not None else []
    return meta


def _optimizer_report(optimized: Any) -> dict[str, Any]:
    """What the passes did, for the plan header (and `trtopt compare --per-layer`, which replays them)."""
    return {
        "passes": [r.name for r in optimized.reports],
        "changes": {r.name: r.counts() for r in optimized.reports},
        "nodes": [optimized.nodes_before, optimized.nodes_after],
        "launches_saved": optimized.launches_saved,
        "intermediate_bytes_saved": optimized.bytes_saved,
        "fusion_groups": len(optimized.fusion_groups),
    }


@contextmanager
def _timed(times: dict[str, float], stage: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    times[stage] = time.perf_counter() - start
