"""What tools/bench_zoo.py does to one model: its data split, its INT8 variants and their fidelity and latency.

Not a benchmark itself. Each build runs in a fresh spawned process (`bench_setup.run_isolated`), so a
model's memory goes back after it and one failing build cannot take the others down.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.version_converter
from benchlib import shown_path

ROOT = Path(__file__).resolve().parents[1]
CALIB_DIR = ROOT / "calib_data"
HELDOUT_DIRS = (ROOT / "tests" / "data" / "heldout", ROOT / "tests" / "data" / "heldout_more")
HELDOUT_SEED = 1
MIN_PER_CHANNEL_OPSET = 13  # tools/make_text_calib.py renders the committed calibration set with seed 0


@dataclass(frozen=True)
class Subject:
    """One model to benchmark, as the zoo catalog describes it (or given on the command line)."""

    name: str
    path: Path | None  # None: not in the zoo cache
    task: str  # a zoo task: classify, orientation, detect-yolov8/-yolov5/-yolox, layout, text-detect, ctc, raw
    preprocess: tuple[str, ...]  # trtopt CLI preprocessing flags
    calib: Path  # a folder of images or an .npz
    input_shape: tuple[int, ...] | None
    input_name: str
    source: str  # package and version, or "given"
    more_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (input, shape) for models with several dynamic inputs

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every static shape to build with, by input name."""
        first = {self.input_name: tuple(self.input_shape)} if self.input_shape else {}
        return first | dict(self.more_shapes)


@dataclass(frozen=True)
class Data:
    calib_sources: tuple[str, ...]  # what trtopt build and ORT's reader both read
    calib_count: int
    eval_sources: tuple[str, ...]
    eval_count: int | None  # None: all
    eval_skip: int  # samples at the start of eval_sources that are calibration data (an .npz split)
    description: str


@dataclass
class Variant:
    name: str
    error: str = ""
    build_s: float = 0.0
    kernels: bytes = b""  # the model as it runs on this CPU
    reference: bytes = b""  # the same Q/DQ model; run with graph optimisations off it is float math
    note: str = ""
    scores: dict[str, Any] = field(default_factory=dict)  # "kernels" / "reference" -> OutputComparison
    excluded: dict[str, Any] = field(default_factory=dict)  # trtopt: its plan's sensitivity record (auto-exclude)


def build_config(subject: Subject, data: Data | None, method: str | None, *, int8: bool = True) -> Any:
    """The BuildConfig `trtopt build` gets from the subject's flags (`method` None: trtopt's default). A
    forced --method builds with `--no-auto-exclude`: that row shows what the calibration method alone gives
    (the sensitivity search costs minutes per model; the default row pays it)."""
    from trtopt.build import BuildConfig
    from trtopt.calib.config import CalibConfig
    from trtopt.cli.preprocess_args import add_preprocess_arguments, preprocess_config
    from trtopt.data.config import DataConfig
    from trtopt.passes.config import GraphConfig
    from trtopt.quant.config import QuantConfig

    parser = argparse.ArgumentParser(add_help=False)
    add_preprocess_arguments(parser, base="preset")
    flags = parser.parse_args(list(subject.preprocess))
    shapes = subject.shapes or None
    calib = CalibConfig(method=method) if method else CalibConfig()
    quant = QuantConfig(auto_exclude=method is None)
    data_config = DataConfig(sources=tuple(data.calib_sources), count=data.calib_count) if data else DataConfig()
    return BuildConfig(backend="cpu", int8=int8, graph=GraphConfig(shapes=shapes), preprocess=preprocess_config(flags),
                       data=data_config, calib=calib, quant=quant)  # fmt: skip


def load(subject: Subject, sources: tuple[str, ...], count: int | None) -> Any:
    """The samples in `sources` preprocessed as `trtopt build` does for this subject."""
    from trtopt.data import input_infos_from_graph, load_dataset
    from trtopt.data.samples import preprocess_spec_for
    from trtopt.passes.config import load_graph

    assert subject.path is not None
    config = build_config(subject, None, None, int8=False)
    graph = load_graph(subject.path, config.graph, int8=False, batch=config.data.batch)
    spec = preprocess_spec_for(subject.path, graph, config.preprocess)
    return load_dataset(list(sources) if len(sources) > 1 else sources[0], input_infos_from_graph(graph), spec,
                        count=count)  # fmt: skip


def split_data(subject: Subject, count: int, eval_count: int, workdir: Path) -> Data:
    """Calibration and held-out evaluation data, never the same files: photos are evaluated on the held-out
    photo folders, the text sets on a second rendering with another seed, an .npz on its last samples."""
    if subject.calib.suffix == ".npz":
        total = len(load(subject, (str(subject.calib),), None))
        held = min(eval_count, total // 4)
        calib = min(count, total - held)
        text = f"{calib} calibration and the last {held} samples of `{shown_path(subject.calib)}`"
        return Data((str(subject.calib),), calib, (str(subject.calib),), None, total - held, text)
    count = min(count, len(load(subject, (str(subject.calib),), None)))
    if subject.calib.resolve() == CALIB_DIR.resolve():
        eval_sources = tuple(str(d) for d in HELDOUT_DIRS)
        text = f"calibration: {count} photos of `calib_data/`; held-out: {eval_count} of `tests/data/heldout*`"
    else:
        eval_sources = (str(_rendered_heldout(subject.calib, eval_count, workdir)),)
        text = (f"calibration: {count} of `{shown_path(subject.calib)}`; held-out: {eval_count} rendered by "
                f"`tools/make_text_calib.py --seed {HELDOUT_SEED}`")  # fmt: skip
    data = Data((str(subject.calib),), count, eval_sources, eval_count, 0, text)
    _check_disjoint(data)
    return data


def _rendered_heldout(calib: Path, count: int, workdir: Path) -> Path:
    """A held-out copy of a text set (lines or pages) rendered with another seed, once per work folder."""
    out = workdir / f"heldout_text_{count}"
    if not (out / calib.name).is_dir():
        command = [sys.executable, str(ROOT / "tools" / "make_text_calib.py"), "--out", str(out),
                   "--lines", str(count), "--pages", str(count), "--seed", str(HELDOUT_SEED)]  # fmt: skip
        subprocess.run(command, check=True, capture_output=True, cwd=ROOT)
    return out / calib.name


def _check_disjoint(data: Data) -> None:
    def digests(sources: tuple[str, ...]) -> set[str]:
        files = [p for s in sources for p in (sorted(Path(s).iterdir()) if Path(s).is_dir() else [Path(s)])]
        return {hashlib.sha256(p.read_bytes()).hexdigest() for p in files if p.is_file()}

    shared = digests(data.calib_sources) & digests(data.eval_sources)
    if shared:
        raise SystemExit(f"{len(shared)} held-out files are also calibration files: the evaluation would not be fair")


def eval_feeds(subject: Subject, data: Data) -> list[tuple[dict[str, np.ndarray], int]]:
    """The held-out batches (feeds, real rows), read once and shared by every variant."""
    dataset = load(subject, data.eval_sources, data.eval_count)
    if data.eval_skip:
        dataset = dataset.split_tail(len(dataset) - data.eval_skip)[1]
    batches = []
    for batch in dataset.batches(8):
        rows = getattr(batch, "rows", len(batch))  # None: one whole feed without a batch dimension
        batches.append((batch.feeds, len(next(iter(batch.feeds.values()))) if rows is None else rows))
    return batches


# --- builds (each in a spawned process) ---------------------------------------------------------------


def trtopt_build(subject: Subject, data: Data, method: str | None) -> dict[str, Any]:
    from trtopt.backend.cpu.runner import model_for_this_cpu
    from trtopt.build import build_plan
    from trtopt.errors import TrtoptError

    assert subject.path is not None
    start = time.perf_counter()
    try:
        result = build_plan(subject.path, build_config(subject, data, method))
    except TrtoptError as exc:
        return {"error": str(exc).splitlines()[0]}
    plan = result.plan
    calibration = result.calibration
    used = getattr(calibration, "method", None) or method or "default"
    quant = plan.metadata.quant
    return {"seconds": time.perf_counter() - start, "kernels": model_for_this_cpu(plan),
            "reference": plan.sections["onnx"], "note": f"method {used}",
            "excluded": (quant.sensitivity or {}) if quant is not None else {}}  # fmt: skip


def ort_build(subject: Subject, data: Data, workdir: str, reduce_range: bool = False) -> dict[str, Any]:
    """quant_pre_process, then quantize_static (QDQ, per-channel QInt8 weights, QUInt8 activations, MinMax,
    ORT's default calibrator; `reduce_range`: 7-bit weights, ORT's remedy for CPUs whose u8s8 kernels saturate)
    on the calibration samples trtopt reads. Models with dynamic H/W get the static
    shape trtopt builds with first; if ORT's symbolic shape inference still fails, the pre-process runs
    without it, and if that fails too the model is quantised as it is (the table says which)."""
    from bench_setup import DatasetReader, even_batch, pre_process
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    assert subject.path is not None
    dataset = load(subject, data.calib_sources, data.calib_count)
    fixed = dataset.fixed_batch
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        source, note = _static_copy(subject, Path(tmp)), "after quant_pre_process"
        try:
            pre_process(source, Path(tmp, "pre.onnx"))
            source = Path(tmp, "pre.onnx")
        except Exception as exc:  # ORT's symbolic shape inference refuses some models: try without it
            try:
                pre_process(source, Path(tmp, "pre.onnx"), skip_symbolic_shape=True)
                source, note = Path(tmp, "pre.onnx"), f"quant_pre_process without symbolic shapes ({_why(exc)})"
            except Exception as again:  # then quantise the model as it is, and say so
                note = f"quant_pre_process failed ({_why(exc)}; {_why(again)}), model as is"
        out = Path(tmp, "qdq.onnx")
        try:
            quantize_static(str(source), str(out), DatasetReader(dataset, fixed or even_batch(len(dataset))),
                            quant_format=QuantFormat.QDQ, per_channel=True, activation_type=QuantType.QUInt8,
                            weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax,
                            reduce_range=reduce_range)  # fmt: skip
        except Exception as exc:  # report the failure in the table rather than stop the benchmark
            return {"error": f"quantize_static failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        model = out.read_bytes()
    return {"seconds": time.perf_counter() - start, "kernels": model, "reference": model, "note": note}


def _static_copy(subject: Subject, folder: Path) -> Path:
    """The model with its image input fixed to the shape trtopt builds with (ORT's shape inference needs it),
    at opset 13 at least (ORT writes per-channel Q/DQ, which older opsets lack, into an invalid model)."""
    assert subject.path is not None
    model = onnx.load(str(subject.path))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    if not subject.shapes and opset >= MIN_PER_CHANNEL_OPSET:
        return subject.path
    if opset < MIN_PER_CHANNEL_OPSET:  # per-channel DequantizeLinear needs opset 13; trtopt converts too
        model = onnx.version_converter.convert_version(model, MIN_PER_CHANNEL_OPSET)
    for tensor in model.graph.input:
        if tensor.name in subject.shapes:
            for dim, size in zip(tensor.type.tensor_type.shape.dim, subject.shapes[tensor.name], strict=True):
                dim.Clear()
                dim.dim_value = size
    path = folder / "static.onnx"
    onnx.save_model(model, str(path))
    return path


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}" if str(exc) else type(exc).__name__


def built(name: str, result: dict[str, Any]) -> Variant:
    if "error" in result:
        return Variant(name, error=result["error"])
    return Variant(name, build_s=result["seconds"], kernels=result["kernels"], reference=result["reference"],
                   note=result.get("note", ""), excluded=result.get("excluded", {}))  # fmt: skip


# --- fidelity and latency -------------------------------------------------------------------------------


def task_config(task: str, input_hw: tuple[int, int] | None = None) -> Any:
    """The metric of a zoo task; "layout" (PicoDet heads) decodes its boxes with tools/zoo_decoders.py, since
    its score maps' cosine says how far the scores moved, not whether the boxes a user gets are the same."""
    from trtopt.metrics import TaskConfig

    if task == "layout" and input_hw is not None:
        from zoo_decoders import picodet_decoder

        return TaskConfig(task="detect", decoder=picodet_decoder(input_hw), decoder_name="PicoDet GFL decoding")

    configs = {
        "classify": TaskConfig(task="classify"),
        "orientation": TaskConfig(task="classify"),
        "detect-yolov8": TaskConfig(task="detect", box_format="yolov8"),
        "detect-yolov5": TaskConfig(task="detect", box_format="yolov5"),
        "detect-yolox": TaskConfig(task="detect"),  # raw (grid decoding) or decoded: chosen from FP32's boxes
        "layout": TaskConfig(task="auto"),
        "text-detect": TaskConfig(task="text-detect"),
        "segment": TaskConfig(task="segment"),
        "ctc": TaskConfig(task="ctc"),
    }
    return configs.get(task, TaskConfig(task="raw"))


def session(
    model: bytes | Path, *, threads: int | None = None, reference: bool = False, engine: bool = False, spin: bool = True
) -> Any:
    """An ONNX Runtime session over `model`; `engine`: with the session settings `trtopt.Engine` runs a CPU plan
    with (`trtopt.backend.cpu.builder.DISABLED_OPTIMIZERS`), so that trtopt's kernels are timed and scored as
    they run; ONNX Runtime's own quantised models get its defaults. `spin=False`: intra-op threads sleep after
    each run (see `trtopt.Engine.load`), for timings where several multi-threaded sessions share a process."""
    from trtopt.backend.cpu.builder import DISABLED_OPTIMIZERS
    from trtopt.execution.ort_session import OrtSession

    proto = onnx.load(str(model)) if isinstance(model, Path) else onnx.load_from_string(model)
    return OrtSession(proto, threads=threads, opt_level="disable" if reference else "all", spin=spin,
                      disabled_optimizers=DISABLED_OPTIMIZERS if engine else ())  # fmt: skip


def score(fp32: Any, test: Any, batches: list[tuple[dict[str, np.ndarray], int]], task: str) -> Any:
    """The task metric and per-output statistics of `test` against `fp32` on the held-out batches."""
    from trtopt.metrics.compare import compare_outputs

    names = [n for n in fp32.output_names if n in test.output_names]
    triples = []
    for feeds, rows in batches:
        ref, out = fp32.run(feeds), test.run(feeds)
        triples.append(({k: v[:rows] for k, v in feeds.items()}, _rows(ref, rows, feeds), _rows(out, rows, feeds)))
    image = next((a for a in batches[0][0].values() if np.ndim(a) == 4), None) if batches else None
    hw = (int(image.shape[2]), int(image.shape[3])) if image is not None else None  # NCHW: the zoo's layouts
    return compare_outputs(triples, names, task_config(task, hw))


def _rows(outputs: dict[str, np.ndarray], rows: int, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    padded = len(next(iter(feeds.values())))
    return {k: v[:rows] if padded != rows and np.ndim(v) and len(v) == padded else v for k, v in outputs.items()}
